"""A fused Triton kernel: attention of a query block over one cached chunk, straight from its packed codes.

:func:`triton_attend_chunk` reads a cached chunk exactly as the cache stores it - the RTN format of
:mod:`jensen_core.rtn`: codes bit-packed along ``head_dim`` (:mod:`jensen_core.packing`: code ``c`` of a
row at bit ``c * bits``, little-endian, so INT2/INT3/INT4/INT8 share one reader), one step per group of
``group_size`` channels (FP8 E4M3 decoded from its bits in registers, or BF16 / FP16 / FP32 where the
quantizer fell back) and one grid origin per group (BF16 / FP16 / FP32) - and, flash-attention style,
loops over key tiles with an online softmax:

- keys and values are dequantized in registers (``m + code * delta``), tile by tile: no dequantized
  copy of the chunk is ever written to memory;
- ``taylor`` subtracts the per-score Taylor bias ``lambda * sum_g nu_g W_g`` (Eq. 15, as
  :func:`jensen_core.bias.jensen_bias` computes it: ``nu_g`` the squared norm of the rotated query's
  group ``g``, ``W_g = delta_g^2 / (24 d)`` the key's step), in registers, as
  ``lambda / (24 d) * sum_c q_c^2 delta_{g(c)}^2``; ``chunk_mean`` subtracts the chunk's mean of that
  bias over its keys, a per-query constant, i.e. an offset of the chunk's log-sum-exp (the key loop
  sums ``delta^2`` on the way); ``off`` neither;
- it returns the chunk's softmax-normalised output and its fp32 log-sum-exp, the convention of
  :func:`jensen_core.sdpa_lse.sdpa_with_lse`, for the chunk merge of :mod:`jensen_core.attention`.

With a Hadamard-rotated cache the query is rotated beforehand (the codes live in the rotated space)
and the output un-rotated afterwards, unless the caller works in the codes' space already
(``codes_space=True``, what the streamed attention path does). Values may also be kept in full
precision (a plain tensor).

Triton is imported lazily: the pack imports without it. On a CPU the kernel runs only under Triton's
interpreter (``TRITON_INTERPRET=1``, set before the first call), which is what the tests do
(``tests/test_triton_kernel.py``); on CUDA it is one more candidate of the Taylor layout choice
(:func:`jensen_core.correction_layouts.candidate_layouts`), used only after its float64 check.
**Its speed is unmeasured**: no GPU has been available to time it.
"""

from __future__ import annotations

import importlib.util
import math
import os
from functools import lru_cache
from pathlib import Path

import torch
from torch import Tensor

from .hadamard import rotate, unrotate
from .rtn import QuantizedTensor
from .stored import StoredTensor

#: the corrections the kernel applies (``per_channel`` and ``exact`` are not fused)
CORRECTIONS = ("taylor", "chunk_mean", "off")
_CORR_CODE = {"off": 0, "taylor": 1, "chunk_mean": 2}
#: how a step or grid origin is read: FP8 E4M3 from its bits, else a native float load
_FMT_CODE = {"fp8_e4m3": 0, "bf16": 1, "fp16": 1, "fp32": 1}
_DOT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_IMPLS: dict[bool, object] = {}


def interpreter() -> bool:
    """Whether Triton's interpreter is on (``TRITON_INTERPRET``), which runs kernels on CPU tensors."""
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "on", "yes")


@lru_cache(maxsize=1)
def _triton_importable() -> bool:
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception:  # noqa: BLE001 - any import failure means no kernel
        return False
    return True


def available(device: torch.device | str | None = None) -> bool:
    """Whether the kernel can run on ``device``: Triton imports, and the device is CUDA or the interpreter is on.

    Without ``device``: on any device at all (a CUDA device present, or the interpreter on).
    """
    if not _triton_importable():
        return False
    if device is None:
        return interpreter() or torch.cuda.is_available()
    dev = torch.device(device)
    if dev.type == "cpu":
        return interpreter()
    return dev.type == "cuda" and not interpreter() and torch.cuda.is_available()


def unsupported_reason(k: object, v: object) -> str | None:
    """Why the kernel cannot read these cached keys and values (None when it can).

    Keys: an RTN :class:`~jensen_core.rtn.QuantizedTensor` (any bits, group size, rotation, step and
    zero-point format). Values: the same, or a full-precision tensor.
    """
    if not isinstance(k, QuantizedTensor):
        kind = type(k).__name__ if isinstance(k, StoredTensor) else "full-precision keys"
        return f"the fused kernel reads RTN-quantized keys only, not {kind}"
    if isinstance(v, StoredTensor) and not isinstance(v, QuantizedTensor):
        return f"the fused kernel reads RTN-quantized or full-precision values, not {type(v).__name__}"
    if not isinstance(v, (Tensor, QuantizedTensor)):
        return f"values must be a tensor or an RTN-quantized tensor, got {type(v).__name__}"
    if k.head_dim < 16:
        return f"the fused kernel needs head_dim >= 16, got {k.head_dim}"
    return None


def _load_impl():
    """The kernel module, loaded once per interpreter mode (``TRITON_INTERPRET`` is read when kernels are decorated)."""
    key = interpreter()
    if key not in _IMPLS:
        name = f"{__package__}._triton_impl_{'interpreted' if key else 'compiled'}"
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("_triton_impl.py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _IMPLS[key] = module
    return _IMPLS[key]


def _side(t: QuantizedTensor | Tensor) -> tuple:
    """Pointers' tensors, (b, h, t) strides of each and the constexprs of one cached side."""
    if isinstance(t, QuantizedTensor):
        parts = [t.packed, t.scale, t.minimum]
        for p in parts:
            if p.stride(-1) != 1:
                raise ValueError("the stored codes, steps and grid origins must be contiguous along their last axis")
        parts = [p.view(torch.uint8) if p.dtype == torch.float8_e4m3fn else p for p in parts]
        strides = [s for p in parts for s in p.stride()[:3]]
        consts = (t.spec.bits, t.spec.group_size, _FMT_CODE[t.scale_format], _FMT_CODE[t.spec.zero_format])
        return parts, strides, consts
    if t.stride(-1) != 1:
        t = t.contiguous()
    return [t, t, t], list(t.stride()[:3]) * 3, (0, 8, 1, 1)


def triton_attend_chunk(
    q: Tensor,
    k: QuantizedTensor,
    v: QuantizedTensor | Tensor,
    correction: str = "taylor",
    strength: float = 1.0,
    scale: float | None = None,
    *,
    codes_space: bool = False,
    block_m: int | None = None,
    block_n: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Attention of ``q`` over one cached chunk read from its packed codes; ``(out, lse)``.

    ``q`` (batch, heads, M, d) float16 / bfloat16 / float32; ``k`` the chunk's RTN-quantized keys
    (batch, heads, N, d); ``v`` its values, RTN-quantized or full precision. ``correction``:
    ``taylor`` (per score), ``chunk_mean`` (the chunk's mean of it: an offset of the log-sum-exp) or
    ``off``, scaled by ``strength``. ``scale`` defaults to ``1 / sqrt(d)``.

    Returns ``out`` (batch, heads, M, d) in ``q.dtype``, softmax-normalised over the chunk's keys, and
    ``lse`` (batch, heads, M) float32, the natural log-sum-exp of the (corrected, scaled) scores: what
    :func:`jensen_core.sdpa_lse.sdpa_with_lse` returns, for the chunk merge.

    ``codes_space=False``: ``q`` and ``out`` in the model's space (``q`` is rotated with the keys'
    rotation, ``out`` un-rotated with the values'). ``codes_space=True``: ``q`` already rotated as the
    keys are, ``out`` left in the values' rotated space (the streamed attention path un-rotates the
    merged output once).
    """
    if correction not in CORRECTIONS:
        raise ValueError(f"correction={correction!r} is not fused; use one of {CORRECTIONS}")
    reason = unsupported_reason(k, v)
    if reason:
        raise ValueError(reason)
    if not isinstance(q, Tensor) or q.dim() != 4 or q.dtype not in _DOT_DTYPES:
        raise ValueError(
            f"q must be a (batch, heads, tokens, head_dim) float16/bfloat16/float32 tensor, got "
            f"{getattr(q, 'dtype', type(q))} {tuple(getattr(q, 'shape', ()))}"
        )
    B, H, M, D = q.shape
    for name, t in (("keys", k), ("values", v)):
        if tuple(t.shape) != (B, H, k.tokens, D):
            raise ValueError(
                f"cached {name} of shape {tuple(t.shape)} do not match the query's (batch, heads, head_dim) "
                f"{(B, H, D)} and the chunk's {k.tokens} tokens"
            )
        if t.device != q.device:
            raise ValueError(f"cached {name} live on {t.device} but the query on {q.device}; keep them on one device")
    if not available(q.device):
        raise RuntimeError(
            f"the fused Triton kernel cannot run on {q.device}: it needs triton and a CUDA device, or "
            "TRITON_INTERPRET=1 (set before the first call) for CPU tensors"
        )
    if not math.isfinite(float(strength)):
        raise ValueError(f"strength={strength!r} must be a finite number (1.0 applies the full correction)")
    N = k.tokens
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    if not codes_space and k.spec.rotation == "hadamard":
        q = rotate(q, k.spec.seed)
    if q.stride(-1) != 1:
        q = q.contiguous()
    kparts, kstrides, kconsts = _side(k)
    vparts, vstrides, vconsts = _side(v)
    out = torch.empty(B, H, M, D, dtype=q.dtype, device=q.device)
    lse = torch.empty(B, H, M, dtype=torch.float32, device=q.device)
    DP = max(16, 1 << (D - 1).bit_length())
    bm = block_m or (16 if q.device.type == "cpu" else 64)
    bn = block_n or (32 if q.device.type == "cpu" else 64)
    grid = (-(-M // bm), B * H)
    # float32 queries: exact float32 dots; else in q's half dtype, as flash attention does (the interpreter's
    # bfloat16 dot is wrong - 1e10 off in triton 3.8 - so under the interpreter bfloat16 runs float32 dots)
    f32_dots = q.dtype == torch.float32 or (q.dtype == torch.bfloat16 and interpreter())
    _load_impl().attend_chunk_kernel[grid](
        q, *kparts, *vparts, out, lse,
        *q.stride()[:3], *kstrides, *vstrides, *out.stride()[:3],
        H, M, N, scale, float(strength) / (24.0 * D),
        D=D, DP=DP,
        KBITS=kconsts[0], KGS=kconsts[1], KSF=kconsts[2], KZF=kconsts[3],
        VBITS=vconsts[0], VGS=vconsts[1], VSF=vconsts[2], VZF=vconsts[3],
        CORR=_CORR_CODE[correction], F32_DOTS=f32_dots, BLOCK_M=bm, BLOCK_N=bn,
    )  # fmt: skip
    if not codes_space and isinstance(v, QuantizedTensor) and v.spec.rotation == "hadamard":
        out = unrotate(out, v.spec.seed)
    return out, lse


# ------------------------------------------------------------------------------ the layout choice's hooks
#: the bit widths the layout check runs the kernel at (the pack's INT2 and INT4 caches)
CHECK_BITS = (2, 4)


def _check_problem(device, dtype, D: int, G: int, bits: int, M: int = 5, N: int = 11, H: int = 2, seed: int = 0):
    """A tiny quantized problem: ``q`` in ``dtype``, RTN keys and values with groups of ``D // G``."""
    from .quant import quantize
    from .spec import QuantSpec

    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, H, M, D, generator=gen)
    k = torch.randn(1, H, N, D, generator=gen) * 2
    v = torch.randn(1, H, N, D, generator=gen)
    spec = QuantSpec(bits=bits, group_size=D // G)
    return q.to(device=device, dtype=dtype), quantize(k.to(device), spec), quantize(v.to(device), spec)


def layout_check(device: torch.device, dtype: torch.dtype, head_dim: int, G: int) -> bool:
    """The fused kernel's Taylor-corrected output and log-sum-exp against float64, at INT2 and INT4 (tiny problems).

    The reference: ``softmax(q k_hat^T / sqrt(d) - lambda nu W^T) v_hat`` with ``k_hat``, ``v_hat``
    dequantized in float64 and ``nu``, ``W`` as :func:`jensen_core.bias.jensen_bias` defines them.
    """
    from .bias import query_group_norms, taylor_weights
    from .sdpa_lse import check_tolerance

    g = head_dim // G if G else 0
    if g < 8 or g * G != head_dim or g & (g - 1) or head_dim < 16 or not available(device):
        return False
    strength, scale = 0.7, 1.0 / math.sqrt(head_dim)
    tol = check_tolerance(dtype)
    for bits in CHECK_BITS:
        q, k, v = _check_problem(device, dtype, head_dim, G, bits)
        out, lse = triton_attend_chunk(q, k, v, "taylor", strength, scale)
        qd, kd, vd = q.double(), k.dequantize(torch.float64), v.dequantize(torch.float64)
        b = query_group_norms(qd, g).double() @ taylor_weights(k.step_sizes().double(), head_dim).transpose(-1, -2)
        s = (qd @ kd.transpose(-1, -2)) * scale - strength * b
        if not (
            out.shape == q.shape
            and lse.shape == q.shape[:-1]
            and torch.allclose(lse.double(), torch.logsumexp(s, -1), atol=tol, rtol=tol)
            and torch.allclose(out.double(), torch.softmax(s, -1) @ vd, atol=tol, rtol=tol)
        ):
            return False
    return True


def timing_call(device: torch.device, dtype: torch.dtype, head_dim: int, G: int, shape: tuple[int, int, int]):
    """A call of the kernel on one INT2 cached chunk of the first call's shape (heads, queries, tokens), for timing.

    It includes the dequantization (in registers): the other layouts are timed on keys and values
    already dequantized into their buffer.
    """
    H, M, T = shape
    q, k, v = _check_problem(device, dtype, head_dim, G, 2, min(M, 2048), min(T, 2048), min(H, 16), seed=1)
    return lambda: triton_attend_chunk(q, k, v, "taylor", 1.0, codes_space=True)
