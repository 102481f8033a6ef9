"""Attention of the current chunk over [cached quantized chunks, current chunk], bias-corrected.

The fast path folds the Taylor correction (Eq. 15) into the SDPA kernel. The bias is low rank,
``b = nu W^T`` with ``nu_mj = ||q_mj||^2`` and ``W_ij = Delta_ij^2 / (24 d)``, so appending
``G = d / g`` channels,

    q' = [q, -sqrt(d) * lambda * nu],   k' = [k_hat, W] (cached),   k' = [k, 0] (current),

makes any SDPA kernel with scale ``1/sqrt(d)`` compute ``q.k/sqrt(d) - lambda * b`` with no bias
matrix. Values are zero-padded to the same width (a multiple of 8) so the fused kernel runs.

Memory: cached chunks are dequantized one at a time straight into a chunk-sized buffer and
attended with a kernel that also returns the log-sum-exp; the partial results are merged exactly.
The transient is about one chunk's K/V in the compute dtype - never a full-precision copy of the
cache, nor even of one layer's window. (Where no kernel reports its log-sum-exp, one buffer holds
the layer's window instead.)
"""
from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from .bias import _exact_bias, check_mode, query_group_norms, taylor_weights
from .hadamard import rotate, unrotate
from .quant import QuantizedTensor

logger = logging.getLogger("jensen_kv")


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

    Where the SDPA kernel reports its log-sum-exp (CPU, CUDA), the cached chunks are streamed one
    at a time and the partial results merged, so the transient memory is about one chunk's K/V
    rather than the whole window; elsewhere one buffer holds the window.
    """
    check_mode(correction)
    entries = list(cache_entries)
    _check_inputs(q, k_cur, v_cur, entries, strength)
    if not entries:
        return F.scaled_dot_product_attention(q, k_cur, v_cur)

    D = q.shape[-1]
    kseed, vseed = _rotation_seed(entries[0].k), _rotation_seed(entries[0].v)
    qr = rotate(q, kseed) if kseed is not None else q
    kcr = rotate(k_cur, kseed) if kseed is not None else k_cur
    vcr = rotate(v_cur, vseed) if vseed is not None else v_cur

    keys_quantized = isinstance(entries[0].k, QuantizedTensor)
    if not keys_quantized or strength == 0:
        correction = "none"
    if correction == "exact":
        out = _exact_attention(qr, kcr, vcr, entries, float(strength))
    else:
        G = D // entries[0].k.spec.group_size if correction != "none" else 0
        plan = _Plan(D=D, G=G, Dp=D if G == 0 else -(-(D + G) // 8) * 8, correction=correction)
        qbuf = _extended_query(qr, plan, float(strength))
        if lse_supported(q.device, q.dtype, plan.Dp) and lse_supported(q.device, q.dtype, D):
            out = _streamed(qr, qbuf, kcr, vcr, entries, plan)
        else:
            out = _concatenated(qbuf, kcr, vcr, entries, plan)
    return unrotate(out, vseed) if vseed is not None else out


@dataclass(frozen=True)
class _Plan:
    D: int  # head_dim
    G: int  # appended correction channels (d / g, or 0)
    Dp: int  # padded width: D + G rounded up to a multiple of 8
    correction: str


def _extended_query(qr: Tensor, plan: _Plan, strength: float) -> Tensor:
    """q' = [q, -sqrt(d) * lambda * nu, 0...] (just q without correction)."""
    if plan.G == 0:
        return qr
    D, G = plan.D, plan.G
    qbuf = qr.new_empty(*qr.shape[:-1], plan.Dp)
    qbuf[..., :D] = qr
    qbuf[..., D : D + G] = query_group_norms(qr, D // G) * (-math.sqrt(D) * strength)
    qbuf[..., D + G :] = 0
    return qbuf


def _key_weights(entries: list[CacheEntry], plan: _Plan) -> list[Tensor | None]:
    """W per entry: Delta^2/(24 d) (taylor), or the window's token mean of it (per_channel, App. E)."""
    if plan.G == 0:
        return [None] * len(entries)
    ws = [taylor_weights(e.k.step_sizes(), plan.D) for e in entries]
    if plan.correction == "per_channel":
        mean = sum(w.sum(-2, keepdim=True) for w in ws) / sum(e.tokens for e in entries)
        ws = [mean.expand_as(w) for w in ws]
    return ws


def _streamed(qr: Tensor, qbuf: Tensor, kcr: Tensor, vcr: Tensor, entries: list[CacheEntry], plan: _Plan) -> Tensor:
    """One SDPA call per cached chunk and one for the current chunk, merged by log-sum-exp."""
    D, G, Dp = plan.D, plan.G, plan.Dp
    B, H = qbuf.shape[:2]
    scale = 1.0 / math.sqrt(D)
    acc = lse = None
    bufs: dict[int, tuple[Tensor, Tensor]] = {}
    for e, w in zip(entries, _key_weights(entries, plan)):
        t = e.tokens
        if t not in bufs:  # chunks usually share one size: the buffers are reused
            kb = qbuf.new_empty(B, H, t, Dp)
            vb = qbuf.new_empty(B, H, t, Dp)
            if Dp > D:
                kb[..., D + G :] = 0
                vb[..., D:] = 0
            bufs[t] = (kb, vb)
        kb, vb = bufs[t]
        _fill(kb[..., :D], e.k)
        _fill(vb[..., :D], e.v)
        if w is not None:
            kb[..., D : D + G] = w
        acc, lse = _merge(acc, lse, *sdpa_with_lse(qbuf, kb, vb, scale), D)
    bufs.clear()
    acc, lse = _merge(acc, lse, *sdpa_with_lse(qr, kcr, vcr, scale), D)  # the current chunk: never corrected
    return acc.to(qbuf.dtype)


def _merge(acc: Tensor | None, lse: Tensor | None, out: Tensor, out_lse: Tensor, D: int) -> tuple[Tensor, Tensor]:
    """Fold one softmax-normalised partial attention over a disjoint key set into ``acc`` (float32, in place)."""
    out = out[..., :D]
    if acc is None:
        return out.to(torch.float32), out_lse
    new = torch.logaddexp(lse, out_lse)
    acc.mul_(torch.exp(lse - new).unsqueeze(-1)).addcmul_(out, torch.exp(out_lse - new).unsqueeze(-1))
    return acc, new


def _concatenated(qbuf: Tensor, kcr: Tensor, vcr: Tensor, entries: list[CacheEntry], plan: _Plan) -> Tensor:
    """One SDPA call over a buffer holding the whole window (where no kernel reports its LSE)."""
    D, G, Dp = plan.D, plan.G, plan.Dp
    B, H = qbuf.shape[:2]
    n_cached = sum(e.tokens for e in entries)
    N = n_cached + kcr.shape[-2]
    kbuf = qbuf.new_empty(B, H, N, Dp)
    vbuf = qbuf.new_empty(B, H, N, Dp)
    s = 0
    for e, w in zip(entries, _key_weights(entries, plan)):
        t = e.tokens
        _fill(kbuf[:, :, s : s + t, :D], e.k)
        _fill(vbuf[:, :, s : s + t, :D], e.v)
        if w is not None:
            kbuf[:, :, s : s + t, D : D + G] = w
        s += t
    kbuf[:, :, n_cached:, :D] = kcr
    vbuf[:, :, n_cached:, :D] = vcr
    if Dp > D:
        vbuf[..., D:] = 0
        kbuf[:, :, n_cached:, D:] = 0
        kbuf[:, :, :n_cached, D + G :] = 0
    out = F.scaled_dot_product_attention(qbuf, kbuf, vbuf, scale=1.0 / math.sqrt(D))
    return out[..., :D] if Dp > D else out


# --------------------------------------------------------------------------- SDPA with log-sum-exp
_LSE_OK: dict[tuple[str, torch.dtype, int], bool] = {}
_FORCE_CONCAT = False  # tests flip this to exercise the single-buffer path


def _sdpa_lse_raw(q: Tensor, k: Tensor, v: Tensor, scale: float) -> tuple[Tensor, Tensor]:
    if q.device.type == "cpu":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, False, scale=scale)
        return out, lse
    if q.device.type == "cuda":
        if q.dtype in (torch.float16, torch.bfloat16):
            try:
                r = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, False, False, scale=scale)
                return r[0], r[1]
            except RuntimeError:
                pass
        r = torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0, False, scale=scale)
        return r[0], r[1][..., : q.shape[-2]]
    raise NotImplementedError(q.device.type)


def sdpa_with_lse(q: Tensor, k: Tensor, v: Tensor, scale: float) -> tuple[Tensor, Tensor]:
    """SDPA that also returns the fp32 log-sum-exp of each query's scores, ``(..., M)``."""
    out, lse = _sdpa_lse_raw(q, k, v, scale)
    return out, lse.to(torch.float32)


def lse_supported(device: torch.device, dtype: torch.dtype, width: int) -> bool:
    """Whether :func:`sdpa_with_lse` works here; checked once per (device, dtype, width) on a tiny problem.

    The kernels that report the log-sum-exp are private PyTorch ops, so they are verified against
    a plain computation before use; on any mismatch or error the single-buffer path is used.
    """
    if _FORCE_CONCAT:
        return False
    key = (str(device), dtype, width)
    ok = _LSE_OK.get(key)
    if ok is None:
        try:
            gen = torch.Generator().manual_seed(0)
            q, k, v = (torch.randn(1, 2, n, width, generator=gen).to(device=device, dtype=dtype) for n in (5, 11, 11))
            out, lse = sdpa_with_lse(q, k, v, 0.3)
            s = (q.float() @ k.float().transpose(-1, -2)) * 0.3
            tol = 1e-4 if dtype == torch.float32 else 5e-2
            ok = bool(
                out.shape == q.shape and lse.shape == q.shape[:-1]
                and torch.allclose(lse, torch.logsumexp(s, -1), atol=tol, rtol=tol)
                and torch.allclose(out.float(), torch.softmax(s, -1) @ v.float(), atol=tol, rtol=tol)
            )
        except Exception:  # noqa: BLE001 - any failure means: don't use it
            ok = False
        if not ok:
            logger.info("jensen_kv: SDPA with log-sum-exp unavailable on %s/%s (width %d): one buffer per window", device, dtype, width)
        _LSE_OK[key] = ok
    return ok


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
