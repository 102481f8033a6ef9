"""Quantize a KV tensor with any method, and join stored tensors: the entry points the rest of the pack calls.

The method is decided once, by the spec's method object (:func:`jensen_core.methods.method_of`); the
stored formats live in :mod:`jensen_core.rtn` (``method="rtn"``) and :mod:`jensen_core.qvg`
(``method="qvg"``), both :class:`~jensen_core.stored.StoredTensor`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .hadamard import rotate
from .methods import method_of
from .rtn import FP8_MAX, QuantizedTensor, quantize_rotated, round_to_format
from .spec import QuantSpec
from .stored import StoredTensor

__all__ = [
    "FP8_MAX",
    "QuantizedTensor",
    "StoredTensor",
    "cat_quantized",
    "check_finite",
    "quantize",
    "quantize_rotated",
    "round_to_format",
]


def check_finite(name: str, x: Tensor) -> None:
    if not bool(torch.isfinite(x).all()):
        bad = int((~torch.isfinite(x)).sum())
        raise ValueError(
            f"{name} contains {bad} NaN or Inf value(s); the model produced non-finite activations "
            "(check the model dtype, e.g. fp16 overflow, and the inputs) - nothing was cached"
        )


def quantize(x: Tensor, spec: QuantSpec, *, head_offset: int = 0) -> StoredTensor:
    """Quantize ``x`` of shape ``(..., tokens, head_dim)`` with ``spec``'s method.

    RTN (paper Eq. 1) returns a :class:`~jensen_core.rtn.QuantizedTensor`; QVG a
    :class:`~jensen_core.qvg.QVGTensor` (k-means smoothing and progressive residual quantization,
    then RTN of the residual). The rotation, if any, comes first.

    Everything is per head (the dimension before tokens): RTN's groups and the Hadamard rotation (one
    seeded rotation, the same for every head) never look at another head, and QVG's k-means starts
    from (seed, global head index, stage). ``head_offset`` is the global index of ``x``'s first head,
    so that quantizing heads ``[h0, h0 + n)`` with ``head_offset=h0`` (a sequence-parallel rank)
    equals slicing the quantization of all heads.
    """
    if not isinstance(spec, QuantSpec):
        raise TypeError(f"spec must be a QuantSpec, got {type(spec).__name__}")
    if isinstance(head_offset, bool) or not isinstance(head_offset, int) or head_offset < 0:
        raise ValueError(
            f"head_offset={head_offset!r} must be a whole number >= 0 (the global index of x's first head)"
        )
    if not isinstance(x, Tensor) or not x.is_floating_point():
        raise ValueError(f"quantize expects a floating-point tensor, got {getattr(x, 'dtype', type(x))}")
    if x.dim() < 2:
        raise ValueError(f"quantize expects (..., tokens, head_dim), got shape {tuple(x.shape)}")
    if x.numel() == 0:
        raise ValueError(f"cannot quantize an empty tensor of shape {tuple(x.shape)}")
    spec.check_head_dim(x.shape[-1])
    check_finite("tensor to quantize", x)

    xf = x.to(torch.float32)
    if spec.rotation == "hadamard":
        xf = rotate(xf, spec.seed)
    return method_of(spec).quantize(xf, spec, x.dtype, head_offset)


def cat_quantized(parts: list[StoredTensor]) -> StoredTensor:
    """Concatenate stored tensors of one spec along the token axis (the first part's method joins them).

    QVG tensors concatenate too (each chunk keeps its own centroid table: see ``QVGTensor``). Parts whose
    specs differ in bits only (age tiers) join as a :class:`~jensen_core.tiers.TieredTensor`.
    """
    if not parts:
        raise ValueError("cat_quantized needs at least one tensor")
    join = getattr(parts[0], "cat_tokens", None)
    if join is not None:  # a format made of stored parts (precision by head) joins them part by part
        return join(parts)
    if any(p.spec.bits != parts[0].spec.bits for p in parts):  # age tiers: each chunk keeps its own bits
        from .tiers import TieredTensor

        return TieredTensor(parts)
    return method_of(parts[0].spec).concatenate(parts)
