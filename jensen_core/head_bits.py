"""Precision by head: the keys of the heads whose predicted bias is largest at more bits, the rest at the cache's.

The Jensen correction removes the *mean* of the softmax bias that key noise causes; where that bias is
large (a head whose queries have large group norms, or whose keys have wide groups), what is left after the
correction is large too. :class:`HeadBits` keeps the keys of the ``count(kv_heads)`` K/V heads of a layer
with the largest predicted bias at ``bits`` (3, 4 or 8) instead of relying on the correction there.

Which heads (:func:`predicted_head_bias`, :func:`choose_heads`): at the first chunk a layer's cache stores,
each K/V head's predicted bias is the Taylor bias (paper Eq. 15) averaged over that chunk's own queries and
its keys quantized at the cache's bits:

    mean over (batch, query heads of the K/V head, queries m, keys i) of  sum_j ||q_mj||^2 Delta_ij^2 / (24 d)

(the query's group norms in the rotated space the codes live in). The ``count`` heads with the largest value
are promoted (ties: the lower head index), for the rest of the run: every later chunk of that cache stores
the same heads' keys at ``bits``. The count is fixed by ``fraction`` and the number of K/V heads alone, so
the planner counts the bytes exactly before anything runs. A chunk stored without its queries (a seam that
has none) scores with unit query norms: the step sizes alone.

Only keys are promoted (the bias is the keys' noise); values keep the cache's spec. A promoted head is an
ordinary RTN tensor at ``bits`` with its own step sizes, and the correction applies to it with them (tiny, but
consistent); the other heads are corrected as before. Grouped-query attention: promotion is per K/V head.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from .bias import query_group_norms, taylor_weights
from .hadamard import rotate
from .methods import method_of
from .quant import cat_quantized, quantize
from .spec import QuantSpec
from .stored import JoinedTensor, StoredTensor

#: bits a promoted head's keys may be stored at (0 = precision by head off, in the node's terms "off")
HEAD_BITS = (3, 4, 8)
#: which heads a :class:`HeadBits` promotes: those with the largest predicted bias, or (a control) the smallest
PICKS = ("largest", "smallest")


@dataclass(frozen=True)
class HeadBits:
    """Keep the keys of ``fraction`` of each layer's K/V heads (those with the largest predicted bias) at ``bits``.

    ``bits``: 3, 4 or 8 (above the keys' own bits). ``fraction``: a number in (0, 1]; a layer of ``H`` K/V heads
    promotes ``ceil(fraction * H)`` of them (at least one), :meth:`count`.
    """

    bits: int = 4
    fraction: float = 0.25
    #: which heads: "largest" predicted bias (the option); "smallest" is a control for benchmarks (not a node input)
    pick: str = "largest"

    def __post_init__(self) -> None:
        if self.pick not in PICKS:
            raise ValueError(f"pick={self.pick!r} is not supported; use one of {PICKS}")
        b = self.bits
        if isinstance(b, bool) or not isinstance(b, int) or b not in HEAD_BITS:
            raise ValueError(f"head_bits={b!r} is not supported; use 3, 4 or 8 (or off)")
        f = self.fraction
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not math.isfinite(f) or not 0 < f <= 1:
            raise ValueError(
                f"head_fraction={f!r} must be a number above 0 and at most 1 (the share of each layer's heads whose "
                "keys are kept at head_bits, e.g. 0.25)"
            )
        object.__setattr__(self, "fraction", float(f))

    def count(self, kv_heads: int) -> int:
        """How many of a cache's ``kv_heads`` K/V heads are promoted: ``ceil(fraction * kv_heads)``, at least 1."""
        if isinstance(kv_heads, bool) or not isinstance(kv_heads, int) or kv_heads < 1:
            raise ValueError(f"kv_heads={kv_heads!r} must be a whole number >= 1")
        return min(kv_heads, max(1, math.ceil(self.fraction * kv_heads - 1e-9)))

    def spec_for(self, spec: QuantSpec) -> QuantSpec:
        """The promoted heads' key spec: ``spec`` at :attr:`bits`."""
        return replace(spec, bits=self.bits)

    def check_spec(self, spec_k: QuantSpec | None) -> None:
        """ValueError naming the fix when these keys cannot be promoted."""
        if spec_k is None:
            raise ValueError("head_bits keeps some heads' keys at more bits, but key_bits is off; quantize the keys")
        if spec_k.bits >= self.bits:
            raise ValueError(
                f"head_bits={self.bits} is not above key_bits={spec_k.bits}: no head would be stored sharper; use "
                "head_bits above key_bits (e.g. key_bits 2 with head_bits 4) or set it off"
            )
        if spec_k.method != "rtn":
            raise ValueError(f"head_bits works with method 'rtn' only, not {spec_k.method!r}; use rtn or head_bits off")

    def key_bits_mean(self, spec_k: QuantSpec, kv_heads: int, head_dim: int, chunk_tokens: int) -> float:
        """The keys' stored bits per element averaged over the heads (promoted and not)."""
        n = self.count(kv_heads)
        lo = method_of(spec_k).effective_bits_for(spec_k, head_dim, chunk_tokens)
        hi = method_of(spec_k).effective_bits_for(self.spec_for(spec_k), head_dim, chunk_tokens)
        return (n * hi + (kv_heads - n) * lo) / kv_heads

    def choose(self, score: Tensor, kv_heads: int) -> tuple[int, ...]:
        """The heads to promote of ``kv_heads`` with predicted biases ``score`` (:func:`choose_heads`)."""
        return choose_heads(score if self.pick == "largest" else -score, self.count(kv_heads))

    def __str__(self) -> str:
        return f"{self.fraction:g}@{self.bits}" + ("" if self.pick == "largest" else f"@{self.pick}")

    def describe(self) -> str:
        return f"keys of the {self.fraction:g} of heads with the largest predicted bias at {self.bits} bits"

    def to_dict(self) -> dict:
        return {"bits": self.bits, "fraction": self.fraction, **({} if self.pick == "largest" else {"pick": self.pick})}


def predicted_head_bias(k_low: StoredTensor, q: Tensor | None = None) -> Tensor:
    """Each K/V head's predicted Taylor bias, float32 ``(H_kv,)``: mean over batch, the query heads of the K/V head,
    queries and keys of ``sum_j nu_mj W_ij`` (``nu`` the query's group norms squared in the codes' space, ``W`` =
    Delta^2 / (24 d) of ``k_low``). ``q`` (batch, H_q, M, d) with ``H_q`` a multiple of ``H_kv``; None: unit
    ``nu``."""
    B, H, _, D = k_low.shape
    w = taylor_weights(k_low.step_sizes(), D).mean(-2)  # (B, H, G): mean over keys
    if q is None:
        nu = torch.ones_like(w)
    else:
        if q.dim() != 4 or q.shape[0] != B or q.shape[1] % H or q.shape[-1] != D:
            raise ValueError(
                f"queries of shape {tuple(q.shape)} do not fit keys of shape {tuple(k_low.shape)}: need (batch, a "
                "multiple of the K/V heads, tokens, head_dim)"
            )
        qr = rotate(q.to(torch.float32), k_low.spec.seed) if k_low.spec.rotation == "hadamard" else q
        nu = query_group_norms(qr, k_low.spec.group_size).mean(-2)  # (B, H_q, G): mean over queries
        nu = nu.reshape(B, H, q.shape[1] // H, -1).mean(2)
    return (nu * w).sum(-1).mean(0)


def choose_heads(score: Tensor, count: int) -> tuple[int, ...]:
    """The ``count`` heads with the largest ``score`` (ties: the lower index), ascending."""
    order = torch.sort(-score.to(torch.float64).cpu(), stable=True).indices
    return tuple(sorted(int(i) for i in order[:count]))


class HeadBitsTensor(JoinedTensor):
    """Stored keys whose heads (dimension -3) are split: ``high`` holds the promoted heads at more bits, ``low`` the
    others at the cache's spec; ``promoted`` (bool, one per head) says which is which. Every part is an ordinary
    stored tensor with its own step sizes; :meth:`step_sizes` and :meth:`dequantize` put the heads back in order.
    ``spec`` is ``low``'s (``high``'s when every head is promoted): group size, rotation and seed are both's."""

    __slots__ = ("low", "high", "promoted")

    def __init__(self, low: StoredTensor | None, high: StoredTensor, promoted: Tensor):
        if low is not None and (
            replace(high.spec, bits=low.spec.bits) != low.spec or low.shape[-2:] != high.shape[-2:]
        ):
            raise ValueError("HeadBitsTensor joins stored heads whose specs differ in bits only, of one token layout")
        n = int(promoted.sum())
        if high.shape[-3] != n or (low.shape[-3] if low is not None else 0) != promoted.numel() - n:
            raise ValueError(f"promoted marks {n} of {promoted.numel()} heads, which the parts' heads do not match")
        self.low, self.high, self.promoted = low, high, promoted.to(torch.bool).cpu()

    @classmethod
    def quantize(cls, x: Tensor, spec: QuantSpec, high_spec: QuantSpec, heads: tuple[int, ...]) -> HeadBitsTensor:
        """``x`` (..., H, tokens, d), heads ``heads`` at ``high_spec``, the others at ``spec`` (RTN is per head, so
        each part equals those heads of the whole tensor quantized at its spec)."""
        mask = torch.zeros(x.shape[-3], dtype=torch.bool)
        mask[list(heads)] = True
        dev = mask.to(x.device)
        low = quantize(x[..., ~dev, :, :], spec) if not bool(mask.all()) else None
        return cls(low, quantize(x[..., dev, :, :], high_spec), mask)

    @property
    def parts(self) -> list[StoredTensor]:
        return [p for p in (self.low, self.high) if p is not None]

    @property
    def shape(self) -> torch.Size:
        s = self.high.shape
        return torch.Size((*s[:-3], self.promoted.numel(), *s[-2:]))

    @property
    def heads(self) -> tuple[int, ...]:
        """The promoted heads' indices, ascending."""
        return tuple(int(i) for i in torch.nonzero(self.promoted).flatten())

    def to(self, device) -> HeadBitsTensor:
        return HeadBitsTensor(None if self.low is None else self.low.to(device), self.high.to(device), self.promoted)

    def __getitem__(self, idx) -> HeadBitsTensor:
        """Index the batch only (``t[b]`` or ``t[a:b]``): the heads stay whole."""
        if isinstance(idx, tuple):
            if len(idx) != 1:
                raise IndexError("HeadBitsTensor indexes the batch dimension only")
            idx = idx[0]
        if len(self.shape) != 4 or not isinstance(idx, slice):
            raise IndexError(
                "HeadBitsTensor indexes the batch dimension of a (batch, heads, tokens, d) tensor by slice"
            )
        return HeadBitsTensor(None if self.low is None else self.low[idx], self.high[idx], self.promoted)

    def flatten_leading(self) -> HeadBitsTensor:
        lead = math.prod(self.shape[:-3])
        return HeadBitsTensor(
            None if self.low is None else self.low.flatten_leading(),
            self.high.flatten_leading(),
            self.promoted.repeat(lead),
        )

    @staticmethod
    def cat_tokens(parts: list[HeadBitsTensor]) -> HeadBitsTensor:
        """Chunks of one cache joined along the token axis (:func:`jensen_core.quant.cat_quantized` calls it)."""
        return cat_head_bits(parts)

    def _join(self, low: Tensor | None, high: Tensor, out: Tensor | None = None) -> Tensor:
        if out is None:
            out = high.new_empty((*self.shape[:-3], self.promoted.numel(), *high.shape[-2:]))
        mask = self.promoted.to(high.device)
        out[..., mask, :, :] = high.to(out.dtype)
        if low is not None:
            out[..., ~mask, :, :] = low.to(out.dtype)
        return out

    def step_sizes(self) -> Tensor:
        return self._join(None if self.low is None else self.low.step_sizes(), self.high.step_sizes())

    def dequantize(self, dtype=None, rotated: bool = False, out=None) -> Tensor:
        dt = dtype or self.dtype
        low = None if self.low is None else self.low.dequantize(dtype=dt, rotated=rotated)
        return self._join(low, self.high.dequantize(dtype=dt, rotated=rotated), out)


def cat_head_bits(parts: list[HeadBitsTensor]) -> HeadBitsTensor:
    """Join :class:`HeadBitsTensor` chunks of one cache (the same promoted heads) along the token axis."""
    first = parts[0]
    if any(not isinstance(p, HeadBitsTensor) or not torch.equal(p.promoted, first.promoted) for p in parts):
        raise ValueError("cat_head_bits joins chunks with the same promoted heads only")
    low = None if first.low is None else cat_quantized([p.low for p in parts])
    return HeadBitsTensor(low, cat_quantized([p.high for p in parts]), first.promoted)


def head_bits_key_bytes(
    spec_k: QuantSpec, head_bits: HeadBits, batch: int, kv_heads: int, tokens: int, head_dim: int
) -> int:
    """Exact stored bytes of one chunk's keys, ``batch`` x ``kv_heads`` heads of ``tokens`` x ``head_dim``, with
    ``head_bits.count(kv_heads)`` heads at ``head_bits.bits``."""
    n = head_bits.count(kv_heads)
    m = method_of(spec_k)
    return m.chunk_nbytes(head_bits.spec_for(spec_k), batch * n, tokens, head_dim) + m.chunk_nbytes(
        spec_k, batch * (kv_heads - n), tokens, head_dim
    ) * (kv_heads > n)
