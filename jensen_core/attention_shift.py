"""Attention diagnostics: how much a quantized (and corrected) cache moves attention.

For the current chunk's queries over [cached chunks, current chunk]:
- ``delta_ps``: shift of the attention mass on the cached block, ``P_S_hat - P_S`` (paper Eq. 9),
  per query; positive = cached keys steal attention from the current chunk;
- ``jsd``: Jensen-Shannon divergence (nats) between the quantized and reference attention rows;
- ``output_mse``: mean squared error of the attention output against the reference.
The reference is full-precision (fp32) attention over the unquantized keys and values.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from .bias import check_mode, chunk_spans, guard_scales, jensen_bias
from .quant import StoredTensor


def quantile(sorted_values: Tensor, q: float) -> float:
    """Linearly interpolated ``q``-quantile of an ascending 1-D tensor (numpy's default; any size)."""
    n = sorted_values.numel()
    if n == 0:
        raise ValueError("quantile of an empty set of samples")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q={q} must be between 0 and 1")
    pos = q * (n - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, n - 1)
    a, b = float(sorted_values[lo]), float(sorted_values[hi])
    return a + (b - a) * (pos - lo)


@dataclass
class ShiftStats:
    """Per-query ``delta_ps`` and ``jsd`` (flattened over batch, heads, queries) and the output MSE."""

    delta_ps: Tensor
    jsd: Tensor
    output_mse: float

    @property
    def median_delta_ps(self) -> float:
        return quantile(self.delta_ps.sort().values, 0.5)

    @property
    def mean_jsd(self) -> float:
        return float(self.jsd.mean())

    def summary(self) -> dict:
        d = self.delta_ps.sort().values
        return {
            "median_delta_ps": quantile(d, 0.5),
            "q25_delta_ps": quantile(d, 0.25),
            "q75_delta_ps": quantile(d, 0.75),
            "mean_jsd": self.mean_jsd,
            "output_mse": self.output_mse,
        }


def _dequant(t: StoredTensor | Tensor) -> Tensor:
    return t.dequantize(dtype=torch.float32) if isinstance(t, StoredTensor) else t.to(torch.float32)


def attention_shift(
    q: Tensor,
    k_cached: Tensor,
    v_cached: Tensor,
    k_cur: Tensor,
    v_cur: Tensor,
    k_quant: StoredTensor | Tensor | None,
    v_quant: StoredTensor | Tensor | None = None,
    correction: str = "off",
    strength: float = 1.0,
    query_stride: int = 1,
    chunk_tokens: Sequence[int] | None = None,
    guard: bool = False,
) -> ShiftStats:
    """Compare attention over a quantized cache (optionally corrected) with the full-precision one.

    ``q`` (..., M, d) are the current chunk's queries, ``k_cached``/``v_cached`` (..., N, d) the
    unquantized cached keys/values (the reference), ``k_quant``/``v_quant`` their quantized forms
    (``None`` = not quantized; a plain tensor = a lossy copy, e.g. BF16, that gets no correction), ``k_cur``/``v_cur`` the current chunk. ``query_stride`` evaluates
    every n-th query only (diagnostics on long chunks). ``chunk_tokens`` lists the tokens of each
    cached chunk concatenated in ``k_quant`` (the ``chunk_mean`` correction is per chunk; see
    :func:`jensen_core.bias.jensen_bias`). Materialises one (M, N) score matrix per
    (batch, head): meant for sampled layers and heads, not for the sampling loop.

    Grouped-query attention: ``q`` (..., H_q, M, d) over K/V of (..., H_kv, N, d), ``H_q = groups * H_kv``;
    query head ``h`` attends K/V head ``h // groups``. The per-query statistics come in the query's
    order (batch, query head, query) either way.

    ``guard`` (as in :func:`jensen_core.attention.cached_attention`): each cached chunk's correction
    scaled by its guard factor (:func:`jensen_core.bias.guard_scales`, from all of ``q``'s rows as attention
    sees them, before ``query_stride``).
    """
    correction = check_mode(correction)
    if isinstance(k_quant, StoredTensor) and correction != "off":
        chunk_spans(k_quant, chunk_tokens)  # a chunk layout that does not fit the keys fails before any work
    if query_stride < 1:
        raise ValueError(f"query_stride={query_stride} must be at least 1")
    factors = None
    if guard and isinstance(k_quant, StoredTensor) and correction != "off" and strength != 0:
        spans = chunk_spans(k_quant, chunk_tokens)
        factors = guard_scales(q, k_quant, correction, strength, [b - a for a, b in spans])
        factors = torch.cat(
            [f.unsqueeze(-1).expand(*f.shape, b - a) for f, (a, b) in zip(factors.unbind(-1), spans)], -1
        )
        factors = factors.reshape(-1, 1, factors.shape[-1])  # (batch * K/V heads, 1, cached keys)
    q = q[..., ::query_stride, :]
    groups = _query_groups(q, k_cached)
    if groups > 1:  # the query heads of a group become rows of their K/V head (same order when flattened)
        q = q.reshape(*q.shape[:-3], q.shape[-3] // groups, groups * q.shape[-2], q.shape[-1])
    d = q.shape[-1]
    scale = 1.0 / math.sqrt(d)
    k_hat = _dequant(k_quant) if k_quant is not None else k_cached.to(torch.float32)
    v_hat = _dequant(v_quant) if v_quant is not None else v_cached.to(torch.float32)
    qf = q.to(torch.float32).reshape(-1, *q.shape[-2:])
    flat = lambda t: t.to(torch.float32).reshape(-1, *t.shape[-2:])  # noqa: E731
    kc, vc, kr, vr, kh, vh = map(flat, (k_cached, v_cached, k_cur, v_cur, k_hat, v_hat))
    kq = k_quant.flatten_leading() if isinstance(k_quant, StoredTensor) and correction != "off" else None
    n_cached = kc.shape[-2]
    dps, jsd = [], []
    sq_err, count = 0.0, 0
    for i in range(qf.shape[0]):
        qi = qf[i]
        s_cur = (qi @ kr[i].T) * scale
        p_ref = torch.softmax(torch.cat([(qi @ kc[i].T) * scale, s_cur], dim=-1), dim=-1)
        s_hat = (qi @ kh[i].T) * scale
        if kq is not None:
            b = jensen_bias(qi, kq[i], correction, chunk_tokens)
            s_hat = s_hat - strength * (b if factors is None else b * factors[i])
        p_hat = torch.softmax(torch.cat([s_hat, s_cur], dim=-1), dim=-1)
        dps.append(p_hat[:, :n_cached].sum(-1) - p_ref[:, :n_cached].sum(-1))
        mid = 0.5 * (p_ref + p_hat)
        jsd.append(0.5 * _kl(p_ref, mid) + 0.5 * _kl(p_hat, mid))
        o_ref = p_ref[:, :n_cached] @ vc[i] + p_ref[:, n_cached:] @ vr[i]
        o_hat = p_hat[:, :n_cached] @ vh[i] + p_hat[:, n_cached:] @ vr[i]
        sq_err += float((o_hat - o_ref).square().sum())
        count += o_ref.numel()
    return ShiftStats(delta_ps=torch.cat(dps), jsd=torch.cat(jsd), output_mse=sq_err / max(count, 1))


def _query_groups(q: Tensor, k: Tensor) -> int:
    """Query heads per K/V head (heads: the dimension before (tokens, head_dim)); the other leading ones equal."""
    if q.shape[:-2] == k.shape[:-2]:
        return 1
    if q.dim() == k.dim() >= 3 and q.shape[:-3] == k.shape[:-3] and q.shape[-3] % k.shape[-3] == 0:
        return q.shape[-3] // k.shape[-3]
    raise ValueError(
        f"q {tuple(q.shape)} does not fit the cached keys {tuple(k.shape)}: the same leading dimensions, or the "
        "query's heads a multiple of the K/V heads (grouped-query attention)"
    )


def _kl(a: Tensor, b: Tensor) -> Tensor:
    """KL(a || b) along the last axis, in nats; 0 log 0 = 0."""
    return torch.where(
        a > 0, a * (torch.log(a.clamp_min(1e-38)) - torch.log(b.clamp_min(1e-38))), torch.zeros_like(a)
    ).sum(-1)
