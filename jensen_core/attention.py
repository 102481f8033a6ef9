"""Attention of the current chunk over [cached quantized chunks, current chunk], bias-corrected.

The fast path folds the Taylor correction (Eq. 15) into one SDPA call. The bias is low rank,
``b = nu W^T`` with ``nu_mj = ||q_mj||^2`` and ``W_ij = Delta_ij^2 / (24 d)``, so appending
``G = d / g`` channels,

    q' = [q, -sqrt(d) * lambda * nu],   k' = [k_hat, W] (cached),   k' = [k, 0] (current),

makes any SDPA kernel with scale ``1/sqrt(d)`` compute ``q.k/sqrt(d) - lambda * b`` with no bias
matrix. Values are zero-padded to the same width (a multiple of 8) so the fused kernel runs.
The cached K/V are dequantized straight into these per-call buffers: the only transient is one
layer's window in the compute dtype, never a full-precision copy of the whole cache.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from .bias import _exact_bias, check_mode, query_group_norms, taylor_weights
from .hadamard import rotate, unrotate
from .quant import QuantizedTensor


@dataclass(eq=False)
class CacheEntry:
    """One finished chunk: its keys and values, each quantized or kept in full precision."""

    k: QuantizedTensor | Tensor
    v: QuantizedTensor | Tensor

    @property
    def tokens(self) -> int:
        return self.k.shape[-2]

    @property
    def nbytes(self) -> int:
        return sum(_nbytes(t) for t in (self.k, self.v))

    @property
    def numel(self) -> int:
        return sum(math.prod(t.shape) for t in (self.k, self.v))


def _nbytes(t: QuantizedTensor | Tensor) -> int:
    return t.nbytes if isinstance(t, QuantizedTensor) else t.numel() * t.element_size()


def _fill(dst: Tensor, src: QuantizedTensor | Tensor) -> None:
    if isinstance(src, QuantizedTensor):
        src.dequantize(rotated=True, out=dst)
    else:
        dst.copy_(src)


def _rotation_seed(t: QuantizedTensor | Tensor) -> int | None:
    if isinstance(t, QuantizedTensor) and t.spec.rotation == "hadamard":
        return t.spec.seed
    return None


def _check_inputs(q: Tensor, k_cur: Tensor, v_cur: Tensor, entries: Sequence[CacheEntry], strength: float) -> None:
    for name, t in (("q", q), ("k_cur", k_cur), ("v_cur", v_cur)):
        if not isinstance(t, Tensor) or t.dim() != 4:
            raise ValueError(f"{name} must be a (batch, heads, tokens, head_dim) tensor, got {getattr(t, 'shape', type(t))}")
        if not t.is_floating_point():
            raise ValueError(f"{name} must be floating point, got {t.dtype}")
    if k_cur.shape != v_cur.shape:
        raise ValueError(f"k_cur {tuple(k_cur.shape)} and v_cur {tuple(v_cur.shape)} must have the same shape")
    if q.shape[:2] != k_cur.shape[:2] or q.shape[-1] != k_cur.shape[-1]:
        raise ValueError(
            f"q {tuple(q.shape)} and k_cur {tuple(k_cur.shape)} disagree on batch, heads or head_dim"
        )
    if k_cur.shape[-2] == 0 or q.shape[-2] == 0:
        raise ValueError("the current chunk is empty: q and k_cur need at least one token")
    if not (q.dtype == k_cur.dtype == v_cur.dtype):
        raise ValueError(f"q, k_cur and v_cur must share a dtype, got {q.dtype}, {k_cur.dtype}, {v_cur.dtype}")
    if not (q.device == k_cur.device == v_cur.device):
        raise ValueError(f"q, k_cur and v_cur must be on one device, got {q.device}, {k_cur.device}, {v_cur.device}")
    if not math.isfinite(float(strength)):
        raise ValueError(f"strength={strength!r} must be a finite number (1.0 applies the full correction)")
    if not entries:
        return
    first = entries[0]
    for e in entries:
        for name, t in (("keys", e.k), ("values", e.v)):
            if tuple(t.shape[:2]) != tuple(q.shape[:2]) or t.shape[-1] != q.shape[-1]:
                raise ValueError(
                    f"cached {name} of shape {tuple(t.shape)} do not match the query's batch, heads and "
                    f"head_dim {tuple(q.shape[:2]) + (q.shape[-1],)}"
                )
            if t.device != q.device:
                raise ValueError(f"cached {name} live on {t.device} but the query on {q.device}; keep them on one device")
        if type(e.k) is not type(first.k) or type(e.v) is not type(first.v) or (
            isinstance(e.k, QuantizedTensor) and e.k.spec != first.k.spec
        ) or (isinstance(e.v, QuantizedTensor) and e.v.spec != first.v.spec):
            raise ValueError("all cached chunks must be stored with the same quantization spec")


def cached_attention(
    q: Tensor,
    k_cur: Tensor,
    v_cur: Tensor,
    cache_entries: Sequence[CacheEntry],
    correction: str = "taylor",
    strength: float = 1.0,
) -> Tensor:
    """Attention of the current chunk's queries over the cached chunks and the current chunk.

    Shapes follow SDPA: ``q`` (batch, heads, M, d), ``k_cur``/``v_cur`` (batch, heads, T, d), every
    cache entry (batch, heads, T_i, d). Returns (batch, heads, M, d) in ``q.dtype``.

    ``correction``: ``taylor`` and ``per_channel`` run the fused fast path (no bias matrix);
    ``exact`` (Eq. 12) materialises the score matrix head by head and is much slower - meant for
    diagnostics and ablations; ``none`` is plain attention. The correction is scaled by
    ``strength`` and touches cached keys only; it is skipped when the keys are not quantized.
    """
    check_mode(correction)
    entries = list(cache_entries)
    _check_inputs(q, k_cur, v_cur, entries, strength)
    if not entries:
        return F.scaled_dot_product_attention(q, k_cur, v_cur)

    B, H, M, D = q.shape
    dtype = q.dtype
    kseed, vseed = _rotation_seed(entries[0].k), _rotation_seed(entries[0].v)
    qr = rotate(q, kseed) if kseed is not None else q
    kcr = rotate(k_cur, kseed) if kseed is not None else k_cur
    vcr = rotate(v_cur, vseed) if vseed is not None else v_cur

    keys_quantized = isinstance(entries[0].k, QuantizedTensor)
    if not keys_quantized or strength == 0:
        correction = "none"
    if correction == "exact":
        out = _exact_attention(qr, kcr, vcr, entries, float(strength))
        return unrotate(out, vseed) if vseed is not None else out

    n_cached = sum(e.tokens for e in entries)
    N = n_cached + k_cur.shape[-2]
    G = D // entries[0].k.spec.group_size if correction != "none" else 0
    Dp = D if G == 0 else -(-(D + G) // 8) * 8

    kbuf = torch.empty(B, H, N, Dp, dtype=dtype, device=q.device)
    vbuf = torch.empty(B, H, N, Dp, dtype=dtype, device=q.device)
    s = 0
    for e in entries:
        t = e.tokens
        _fill(kbuf[:, :, s : s + t, :D], e.k)
        _fill(vbuf[:, :, s : s + t, :D], e.v)
        if G and correction == "taylor":
            kbuf[:, :, s : s + t, D : D + G] = taylor_weights(e.k.step_sizes(), D)
        s += t
    kbuf[:, :, n_cached:, :D] = kcr
    vbuf[:, :, n_cached:, :D] = vcr
    if Dp > D:
        vbuf[..., D:] = 0
        kbuf[:, :, n_cached:, D:] = 0
        kbuf[:, :, :n_cached, D + G :] = 0
        if correction == "per_channel":
            # App. E: one shared bias per query, from the token-averaged Delta^2 of each group
            w_sum = sum(taylor_weights(e.k.step_sizes(), D).sum(-2, keepdim=True) for e in entries)
            kbuf[:, :, :n_cached, D : D + G] = (w_sum / n_cached).to(dtype)
        qbuf = torch.empty(B, H, M, Dp, dtype=dtype, device=q.device)
        qbuf[..., :D] = qr
        qbuf[..., D : D + G] = query_group_norms(qr, D // G) * (-math.sqrt(D) * float(strength))
        qbuf[..., D + G :] = 0
    else:
        qbuf = qr
    out = F.scaled_dot_product_attention(qbuf, kbuf, vbuf, scale=1.0 / math.sqrt(D))
    if Dp > D:
        out = out[..., :D]
    return unrotate(out, vseed) if vseed is not None else out.contiguous()


def _exact_attention(qr: Tensor, kcr: Tensor, vcr: Tensor, entries: list[CacheEntry], strength: float) -> Tensor:
    """Materialised attention with the exact bias (Eq. 12), one (batch, head) at a time."""
    B, H, M, D = qr.shape
    g = entries[0].k.spec.group_size
    dtype = qr.dtype
    k_hat = torch.cat([e.k.dequantize(dtype=torch.float32, rotated=True) for e in entries], dim=-2)
    v_hat = torch.cat(
        [e.v.dequantize(dtype=torch.float32, rotated=True) if isinstance(e.v, QuantizedTensor) else e.v.float() for e in entries],
        dim=-2,
    )
    steps = torch.cat([e.k.step_sizes() for e in entries], dim=-2)
    n_cached = k_hat.shape[-2]
    out = torch.empty(B, H, M, D, dtype=dtype, device=qr.device)
    scale = 1.0 / math.sqrt(D)
    for b in range(B):
        for h in range(H):
            qf = qr[b, h].float()
            s_cached = (qf @ k_hat[b, h].T) * scale - strength * _exact_bias(qf, steps[b, h], D, g)
            s_cur = (qf @ kcr[b, h].float().T) * scale
            p = torch.softmax(torch.cat([s_cached, s_cur], dim=-1), dim=-1)
            out[b, h] = (p[:, :n_cached] @ v_hat[b, h] + p[:, n_cached:] @ vcr[b, h].float()).to(dtype)
    return out
