"""The RTN stored format: group-wise per-token asymmetric round-to-nearest with real bit-packing (paper Eq. 1).

Storage per group: a step size ``delta`` (``scale_format``, FP8 E4M3 by default) and the grid
origin ``m`` (``zero_format``, BF16 by default), the group's minimum rounded down; a value is
reconstructed as ``m + code * delta``. Storing the origin ``m = -z * delta`` is the same 16 bits as
storing the integer zero-point ``z``; :attr:`QuantizedTensor.minimum` holds ``m``, not ``z``.

The metadata is chosen so that the stored grid always covers the group's ``[min, max]`` and the
round-trip error is at most ``delta / 2`` for every element, with ``delta`` the *stored* step:

1. ``m`` = the largest value of ``zero_format`` at or below the group minimum (rounded down, so
   BF16 rounding of the zero-point can never push the grid above the minimum);
2. ``delta`` = ``(max - m) / (2**bits - 1)`` rounded *up* to ``scale_format`` (an FP8 scale rounded
   down would clip the top of the range; a tiny range rounds up to the smallest subnormal instead
   of underflowing to 0); a constant group that ``m`` represents exactly gets ``delta = 0``;
3. FP8 E4M3 saturates at 448: a tensor whose steps exceed it falls back to BF16 scales, logged.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from .hadamard import unrotate
from .packing import interleaved_supported, pack_codes, unpack_codes, unpack_codes_interleaved
from .spec import FLOAT_FORMATS, QuantSpec
from .stored import StoredTensor

logger = logging.getLogger("jensen_kv")

FP8_MAX = 448.0
#: rows (tokens x leading dims) dequantized per float32 block when the target is a half type: the
#: block stays in cache and the half-precision arithmetic (slow on CPUs) is avoided
_HALF_BLOCK_ELEMENTS = 1 << 19
_INT_VIEW = {1: torch.int8, 2: torch.int16, 4: torch.int32}


def _step(c: Tensor, up: bool) -> Tensor:
    """Move each value of a floating tensor one representable step toward +inf (up) or -inf."""
    bits = c.view(_INT_VIEW[c.element_size()])
    itype = bits.dtype
    info = torch.iinfo(itype)
    sign_bit = info.min  # 0x80.. as a signed integer
    is_zero = (bits == 0) | (bits == sign_bit)
    negative = bits < 0
    one = torch.ones((), dtype=itype, device=c.device)
    # sign-magnitude layout: for positives the integer grows with the value, for negatives it shrinks
    if up:
        moved = torch.where(negative, bits - one, bits + one)
    else:
        moved = torch.where(negative, bits + one, bits - one)
    smallest = torch.full_like(bits, 1 if up else sign_bit + 1)
    return torch.where(is_zero, smallest, moved).view(c.dtype)


def round_to_format(v: Tensor, dtype: torch.dtype, up: bool) -> Tensor:
    """Round float64 ``v`` to ``dtype``, toward +inf (``up``) or -inf, exactly (no double rounding)."""
    c = v.to(dtype)
    wrong = c.to(torch.float64) < v if up else c.to(torch.float64) > v
    if bool(wrong.any()):
        c = torch.where(wrong, _step(c, up), c)
    return c


@dataclass(eq=False)
class QuantizedTensor(StoredTensor):
    """An RTN-quantized (``method="rtn"``), packed tensor of shape ``(..., tokens, head_dim)``.

    ``packed`` holds the codes bit-packed along ``head_dim``; ``scale`` holds one step size and
    ``minimum`` one grid origin per group (the group's minimum rounded down to ``zero_format``:
    code 0 reconstructs it), shape ``(..., tokens, head_dim // group_size)``. With
    ``spec.rotation == "hadamard"`` the codes describe the *rotated* tensor.
    """

    packed: Tensor
    scale: Tensor
    minimum: Tensor
    spec: QuantSpec
    shape: torch.Size
    dtype: torch.dtype
    scale_format: str

    @property
    def device(self) -> torch.device:
        return self.packed.device

    def to(self, device: str | torch.device) -> QuantizedTensor:
        """The same stored bytes on ``device`` (a new object; codes, steps and minima are not re-quantized)."""
        return replace(
            self, packed=self.packed.to(device), scale=self.scale.to(device), minimum=self.minimum.to(device)
        )

    @property
    def nbytes(self) -> int:
        """Bytes really stored: packed codes plus scales plus grid origins (minima)."""
        return sum(t.numel() * t.element_size() for t in (self.packed, self.scale, self.minimum))

    def __getitem__(self, idx) -> QuantizedTensor:
        """Index the dimensions before ``head_dim`` (batch, heads, tokens); ``head_dim`` stays whole."""
        if not isinstance(idx, tuple):
            idx = (idx,)
        if any(i is Ellipsis or i is None for i in idx) or len(idx) > len(self.shape) - 1:
            raise IndexError("QuantizedTensor indexes only the dimensions before head_dim, without ... or None")
        packed = self.packed[idx]
        return QuantizedTensor(
            packed=packed,
            scale=self.scale[idx],
            minimum=self.minimum[idx],
            spec=self.spec,
            shape=torch.Size((*packed.shape[:-1], self.head_dim)),
            dtype=self.dtype,
            scale_format=self.scale_format,
        )

    def flatten_leading(self) -> QuantizedTensor:
        """View with the dimensions before (tokens, head_dim) flattened into one."""
        lead = (-1, *self.shape[-2:-1])
        return QuantizedTensor(
            packed=self.packed.reshape(*lead, self.packed.shape[-1]),
            scale=self.scale.reshape(*lead, self.scale.shape[-1]),
            minimum=self.minimum.reshape(*lead, self.minimum.shape[-1]),
            spec=self.spec,
            shape=torch.Size((math.prod(self.shape[:-2]), *self.shape[-2:])),
            dtype=self.dtype,
            scale_format=self.scale_format,
        )

    def step_sizes(self) -> Tensor:
        """Stored step size per group, float32, shape ``(..., tokens, head_dim // group_size)``."""
        return self.scale.to(torch.float32)

    def codes(self) -> Tensor:
        """The unpacked integer codes, uint8, shape ``(..., tokens, head_dim)``."""
        return unpack_codes(self.packed, self.spec.bits, self.head_dim)

    def dequantize(self, dtype: torch.dtype | None = None, rotated: bool = False, out: Tensor | None = None) -> Tensor:
        """Reconstruct ``m + code * delta``.

        ``rotated=True`` returns the tensor in the rotated space the codes live in (what attention
        uses, with the query rotated too); the default un-rotates to the original space.
        ``out`` (a view of shape ``(..., tokens, head_dim)``, e.g. a slice of a larger buffer) is
        written in place, avoiding a temporary copy.
        """
        dtype = dtype or (out.dtype if out is not None else self.dtype)
        g = self.spec.group_size
        grouped = (*self.shape[:-1], self.head_dim // g, g)
        codes = unpack_codes(self.packed, self.spec.bits, self.head_dim).view(grouped).to(dtype)
        minimum = self.minimum.to(dtype).unsqueeze(-1)
        scale = self.scale.to(dtype).unsqueeze(-1)
        need_unrotate = self.spec.rotation == "hadamard" and not rotated
        if out is not None and not need_unrotate:
            torch.addcmul(minimum, codes, scale, out=out.view(grouped))
            return out
        x = torch.addcmul(minimum, codes, scale).view(self.shape)
        if need_unrotate:
            x = unrotate(x, self.spec.seed)
        if out is not None:
            out.copy_(x)
            return out
        return x

    @property
    def interleaved(self) -> bool:
        """Whether :meth:`dequantize_interleaved` applies (INT2 / INT4 RTN codes)."""
        return interleaved_supported(self.spec.bits, self.spec.group_size)

    def dequantize_interleaved(self, out: Tensor) -> Tensor:
        """Reconstruct into ``out`` (..., tokens, head_dim) in the rotated space, channels in group-interleaved order.

        The fast path of attention (:mod:`jensen_core.packing` explains the order; the query or the
        output is reordered to match, once per call). Word-wise unpacking, then ``m + code * delta``
        in float32 - straight into ``out`` when it is float32, else block by block through a small
        float32 buffer, so that no half-precision arithmetic and no full-size temporary is needed.
        """
        if not self.interleaved:
            raise ValueError(
                f"no interleaved dequantization for {self.spec.bits}-bit codes in groups of {self.spec.group_size}"
            )
        g = self.spec.group_size
        G = self.head_dim // g
        rows = math.prod(self.shape[:-1])
        codes = unpack_codes_interleaved(self.packed, self.spec.bits, self.head_dim, g).view(rows, G, g)
        minimum = self.minimum.reshape(rows, G, 1).to(torch.float32)
        scale = self.scale.reshape(rows, G, 1).to(torch.float32)
        dst = out.view(rows, G, g)
        if out.dtype == torch.float32:
            torch.addcmul(minimum, codes, scale, out=dst)
            return out
        block = max(1, _HALF_BLOCK_ELEMENTS // self.head_dim)
        tmp = torch.empty(min(block, rows), G, g, dtype=torch.float32, device=out.device)
        for a in range(0, rows, block):
            b = min(a + block, rows)
            t = tmp[: b - a]
            torch.addcmul(minimum[a:b], codes[a:b], scale[a:b], out=t)
            dst[a:b].copy_(t)
        return out


def quantize_rotated(xf: Tensor, spec: QuantSpec, dtype: torch.dtype) -> QuantizedTensor:
    """Group-wise RTN of a float32 tensor that is already in the space the codes live in (rotated if any).

    The result reports ``dtype`` as its original dtype and ``spec`` as its spec (so a rotated spec
    un-rotates on :meth:`QuantizedTensor.dequantize`).
    """
    shape = xf.shape
    head_dim = shape[-1]
    g = spec.group_size
    G = head_dim // g
    xg = xf.reshape(*shape[:-1], G, g)
    mn, mx = torch.aminmax(xg, dim=-1)
    mn64, mx64 = mn.to(torch.float64), mx.to(torch.float64)

    minimum = round_to_format(mn64, FLOAT_FORMATS[spec.zero_format][0], up=False)
    minimum64 = minimum.to(torch.float64)
    if not bool(torch.isfinite(minimum64).all()):
        raise ValueError(
            f"values down to {float(mn64.min()):.4g} do not fit zero_format {spec.zero_format!r}; "
            "use zero_format 'bf16' or 'fp32'"
        )
    qmax = spec.levels - 1
    need = (mx64 - minimum64) / qmax

    scale_format = spec.scale_format
    if scale_format == "fp8_e4m3" and float(need.max()) > FP8_MAX:
        logger.warning(
            "jensen_kv: a step size of %.4g exceeds FP8 E4M3's maximum %.0f; storing this tensor's "
            "scales as bf16 instead (range too large for fp8 scales at %d bits)",
            float(need.max()),
            FP8_MAX,
            spec.bits,
        )
        scale_format = "bf16"
    scale = round_to_format(need, FLOAT_FORMATS[scale_format][0], up=True)
    scale32 = scale.to(torch.float32)
    if not bool(torch.isfinite(scale32).all()) or not bool(torch.isfinite(minimum + scale32 * qmax).all()):
        raise ValueError(
            f"the value range {float(mn64.min()):.4g}..{float(mx64.max()):.4g} is too large to quantize; "
            "rescale the tensor or keep this cache in full precision"
        )

    minimum32 = minimum.to(torch.float32).unsqueeze(-1)
    safe = torch.where(scale32 > 0, scale32, torch.ones_like(scale32)).unsqueeze(-1)
    codes = torch.round((xg - minimum32) / safe).clamp_(0, qmax)
    codes = torch.where((scale32 > 0).unsqueeze(-1), codes, torch.zeros_like(codes))
    packed = pack_codes(codes.to(torch.uint8).reshape(shape), spec.bits)
    return QuantizedTensor(
        packed=packed, scale=scale, minimum=minimum, spec=spec, shape=shape, dtype=dtype, scale_format=scale_format
    )


def check_cat_compatible(parts) -> None:
    """Quantized tensors concatenate along tokens only with one spec, scale format and leading shape."""
    first = parts[0]
    for p in parts[1:]:
        if (
            p.spec != first.spec
            or p.scale_format != first.scale_format
            or p.shape[:-2] != first.shape[:-2]
            or p.head_dim != first.head_dim
        ):
            raise ValueError("cat_quantized: tensors differ in spec, scale format or leading shape")


def cat_rtn(parts: list[QuantizedTensor]) -> QuantizedTensor:
    """Concatenate RTN tensors along the token axis (same spec and scale format)."""
    first = parts[0]
    check_cat_compatible(parts)
    if len(parts) == 1:
        return first
    packed = torch.cat([p.packed for p in parts], dim=-2)
    return QuantizedTensor(
        packed=packed,
        scale=torch.cat([p.scale for p in parts], dim=-2),
        minimum=torch.cat([p.minimum for p in parts], dim=-2),
        spec=first.spec,
        shape=torch.Size((*packed.shape[:-1], first.head_dim)),
        dtype=first.dtype,
        scale_format=first.scale_format,
    )
