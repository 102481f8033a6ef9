"""The Jensen bias b of quantized cached keys (paper Eqs. 12, 15, 22-23, 25), materialised.

``jensen_bias`` returns the full ``(..., q_tokens, k_tokens)`` bias matrix: it is the reference for
tests and diagnostics. Attention itself uses the low-rank fast path in :mod:`jensen_core.attention`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from .hadamard import rotate
from .quant import StoredTensor

#: "off" applies no correction (plain attention over the cached keys); new modes go at the end (saved workflows
#: keep their values and indices)
MODES = ("taylor", "chunk_mean", "exact", "per_channel", "off", "head_mean")
#: the name "off" had before it was shared with the UI; still read wherever a mode is read
OLD_NAMES = {"none": "off"}
#: Krea Realtime 14B's ``kv_cache_attention_bias`` (daydreamlive/scope ``krea_realtime_video/pipeline.py``
#: ``DEFAULT_KV_CACHE_ATTENTION_BIAS = 0.3``); 1.0 turns it off
KREA_ATTENTION_BIAS = 0.3
#: the range scope's API accepts for ``kv_cache_attention_bias`` (``server/schema.py``: ge=0.01, le=1.0)
ATTENTION_BIAS_RANGE = (0.01, 1.0)
_TABLE_MAX_VALUES = 1024  # distinct step sizes up to which the exact bias uses a lookup table
_QUERY_BLOCK = 256
#: the guard's sample: at most this many of a call's query rows (evenly spaced) predict each chunk's bias
GUARD_QUERIES = 32
#: the guard scales a chunk's correction down once it shifts the chunk's log-partition by more than this times
#: the predicted bias (so a guarded correction overshoots by at most a quarter of the bias it removes)
GUARD_TOLERANCE = 1.25


def check_mode(mode: str) -> str:
    """``mode`` as one of :data:`MODES` (an old name such as "none" read as "off"); else a ValueError naming it."""
    mode = OLD_NAMES.get(mode, mode) if isinstance(mode, str) else mode
    if mode not in MODES:
        raise ValueError(f"correction mode {mode!r} is not supported; use one of {MODES}")
    return mode


def log_sinhc(alpha: Tensor) -> Tensor:
    """``log(sinh(a) / a)``, stable for every ``a`` (even in ``a``; 0 at ``a = 0``).

    Small ``|a|`` (< 0.1): the series ``a^2/6 - a^4/180 + a^6/2835 - a^8/37800``; otherwise
    ``|a| + log1p(-exp(-2|a|)) - log 2 - log|a|``, which never overflows.
    Evaluate in float64 where precision matters: the second form cancels for small ``|a|``.
    """
    a = alpha.abs()
    small = a < 0.1
    a2 = a * a
    a4 = a2 * a2
    series = a2 / 6 - a4 / 180 + a4 * a2 / 2835 - a4 * a4 / 37800
    a_big = torch.where(small, torch.ones_like(a), a)
    big = a_big + torch.log1p(-torch.exp(-2 * a_big)) - math.log(2.0) - torch.log(a_big)
    return torch.where(small, series, big)


def query_group_norms(q: Tensor, group_size: int) -> Tensor:
    """nu: squared norm of each query group, float32, shape ``(..., q_tokens, head_dim // group_size)``.

    A reduction kernel (accumulating in float32 even for half inputs), so no query-sized temporary.
    """
    groups = q.reshape(*q.shape[:-1], q.shape[-1] // group_size, group_size)
    return torch.linalg.vector_norm(groups, dim=-1).to(torch.float32).square()


def taylor_weights(step: Tensor, head_dim: int) -> Tensor:
    """W = Delta^2 / (24 d): the key side of the rank-G Taylor bias ``b = nu @ W^T`` (Eq. 15)."""
    return step.square() / (24.0 * head_dim)


def chunk_spans(k_quant: StoredTensor, chunk_tokens: Sequence[int] | None = None) -> list[tuple[int, int]]:
    """``(start, end)`` token spans of the cached chunks that ``k_quant`` holds, in token order.

    ``chunk_tokens`` lists the tokens of each chunk (they must add up to ``k_quant.tokens``); without
    it a QVG tensor answers its own segments and any other tensor is one chunk.
    """
    n = k_quant.tokens
    if chunk_tokens is None:
        segments = getattr(k_quant, "segments", None)
        chunk_tokens = [t for t, _ in segments] if segments else [n]
    sizes = list(chunk_tokens)
    if not sizes or any(isinstance(t, bool) or not isinstance(t, int) or t < 1 for t in sizes):
        raise ValueError(
            f"chunk_tokens={chunk_tokens!r} must list each cached chunk's token count (whole numbers >= 1)"
        )
    if sum(sizes) != n:
        raise ValueError(
            f"chunk_tokens={sizes} add up to {sum(sizes)} tokens, but the cached keys hold {n}; "
            "list the tokens of every chunk the keys were concatenated from"
        )
    spans, start = [], 0
    for t in sizes:
        spans.append((start, start + t))
        start += t
    return spans


def chunk_mean_weights(w: Tensor, spans: Sequence[tuple[int, int]]) -> Tensor:
    """Each key's ``W`` replaced by the mean of ``W`` over its chunk's keys: ``(..., N, G)`` -> same shape."""
    return torch.cat(
        [w[..., a:b, :].mean(-2, keepdim=True).expand(*w.shape[:-2], b - a, w.shape[-1]) for a, b in spans], dim=-2
    )


def _rotated_query(q: Tensor, k_quant: StoredTensor) -> Tensor:
    if k_quant.spec.rotation == "hadamard":
        return rotate(q.to(torch.float32), k_quant.spec.seed)
    return q


def _exact_bias(q: Tensor, step: Tensor, head_dim: int, group_size: int) -> Tensor:
    """Eq. 12 with per-group steps. ``q`` (..., M, D), ``step`` (..., N, G) -> (..., M, N) float32.

    Steps take few distinct values (FP8 E4M3 has 127 positive ones), so for each query and group
    ``F(a) = sum_c log_sinhc(q_c * a)`` is tabulated at the distinct ``a = Delta / (2 sqrt d)`` and
    gathered: O(M d V + M N G) instead of O(M N d). With many distinct steps it evaluates directly.
    """
    lead = q.shape[:-2]
    M, N, G = q.shape[-2], step.shape[-2], step.shape[-1]
    qg = q.to(torch.float64).reshape(*lead, M, G, group_size)
    a = step.to(torch.float64) / (2.0 * math.sqrt(head_dim))
    values, inverse = torch.unique(a, return_inverse=True)
    out = torch.empty(*lead, M, N, dtype=torch.float32, device=q.device)
    for m0 in range(0, M, _QUERY_BLOCK):
        qb = qg[..., m0 : m0 + _QUERY_BLOCK, :, :]  # (..., mb, G, g)
        if values.numel() <= _TABLE_MAX_VALUES:
            # table (..., mb, G, V), then b[m, i] = sum_j table[m, j, inverse[i, j]]
            table = log_sinhc(qb.unsqueeze(-1) * values).sum(-2)
            mb = qb.shape[-3]
            acc = torch.zeros(*lead, mb, N, dtype=torch.float64, device=q.device)
            for j in range(G):
                t_j = table[..., j, :]  # (..., mb, V)
                idx = inverse[..., j].unsqueeze(-2).expand(*lead, mb, N)
                acc += torch.gather(t_j, -1, idx)
        else:
            # direct: (..., mb, 1, G, g) * (..., 1, N, G, 1)
            acc = log_sinhc(qb.unsqueeze(-4) * a.unsqueeze(-3).unsqueeze(-1)).sum((-1, -2))
        out[..., m0 : m0 + _QUERY_BLOCK, :] = acc.to(torch.float32)
    return out


def guard_rows(m: int, device: torch.device | None = None) -> Tensor:
    """The query rows the guard samples from ``m`` rows: all of them up to :data:`GUARD_QUERIES`, else that many
    evenly spaced (the first and the last included)."""
    if m <= GUARD_QUERIES:
        return torch.arange(m, device=device)
    return torch.linspace(0, m - 1, GUARD_QUERIES, device=device).round().long()


def predicted_log_bias(scores: Tensor, bias: Tensor) -> Tensor:
    """The expected shift of a cached chunk's log-partition that quantization noise causes, ``(...,)`` per query.

    ``scores`` (..., T): the query's scores over the chunk's T keys; ``bias`` (..., T): each key's Jensen bias
    ``b_i`` (half the variance of its score noise; Eq. 15, or Eq. 12's exact form). With ``p`` the softmax of
    the scores over the chunk, ``E[log sum_i p_i e^(delta_i)]`` is, to second order, ``sum_i p_i (1 - p_i) b_i``:
    the whole bias when the chunk's attention is spread over many keys, nothing when one key holds it (one key's
    noise is zero-mean in the log). Out of that expansion's regime (noise variance ``2 b`` above ``2 log n``,
    ``n = 1 / sum p^2`` the keys that count) a sum of ``n`` exponentials of noisy scores is led by its largest
    term, and its log grows like ``sigma sqrt(2 log n) - log n`` instead of ``sigma^2 / 2`` (the random energy
    model's free energy): the prediction is the smaller of the two. ``p`` comes from the quantized scores, which
    noise makes more concentrated than the true ones: the prediction errs low (toward less correction).
    """
    s = scores.to(torch.float32)
    b = bias.to(torch.float32)
    p = torch.softmax(s, dim=-1)
    second = (p * (1 - p) * b).sum(-1)
    var = 2 * (p * b).sum(-1)  # the attention-weighted noise variance
    log_n = -torch.log((p * p).sum(-1).clamp_min(1e-30))
    rem = torch.where(var <= 2 * log_n, var / 2, torch.sqrt(2 * var * log_n) - log_n)
    return torch.minimum(second, rem).clamp_min(0)


def guard_scale(scores: Tensor, predicted: Tensor, applied: Tensor) -> Tensor:
    """The guard's factor in [0, 1] for one cached chunk, per leading index (batch, head): ``(..., m, T) -> (...)``.

    ``scores`` (..., m, T): the guard's sampled queries over the chunk's keys (quantized keys, no correction);
    ``predicted`` (..., m, T): the per-key bias that predicts the noise's effect (Taylor, or exact in ``exact``
    mode); ``applied`` (..., m, T or 1): what the correction subtracts (its mode's bias times strength). The
    correction shifts the chunk's log-partition by ``C = -log sum_i p_i e^(-applied_i)``; noise shifted it by
    about ``beta`` (:func:`predicted_log_bias`). Over the sampled queries, where ``sum C`` exceeds
    :data:`GUARD_TOLERANCE` times ``sum beta`` the correction is scaled to that bound, so a guarded correction
    never moves the chunk's mass further past the truth than no correction leaves it (an overshoot past ``2 beta``
    would); elsewhere the factor is exactly 1.
    """
    s = scores.to(torch.float32)
    c = torch.logsumexp(s, -1) - torch.logsumexp(s - applied.to(torch.float32), -1)
    shift = c.sum(-1)
    allowed = GUARD_TOLERANCE * predicted_log_bias(s, predicted).sum(-1)
    return torch.where(shift > allowed, allowed / shift.clamp_min(1e-30), torch.ones_like(shift)).clamp(0, 1)


def guard_scales(
    q: Tensor, k_quant: StoredTensor, mode: str = "taylor", strength: float = 1.0, chunk_tokens=None
) -> Tensor:
    """The guard's factor per cached chunk, ``(..., chunks)`` (the materialised reference of the fast path's).

    ``q`` (..., M, d) the call's queries (all of them: the guard samples :func:`guard_rows`), ``k_quant`` the
    cached chunks concatenated (``chunk_tokens`` as in :func:`jensen_bias`). Factors are 1 for ``off``.
    """
    mode = check_mode(mode)
    groups = query_groups(q.shape[:-2], tuple(k_quant.shape[:-2]))
    if groups > 1:  # the query heads of a group are rows of their K/V head, as attention folds them
        q = q.reshape(*q.shape[:-3], q.shape[-3] // groups, groups * q.shape[-2], q.shape[-1])
    spans = chunk_spans(k_quant, chunk_tokens)
    lead = torch.broadcast_shapes(q.shape[:-2], k_quant.shape[:-2])
    if mode == "off" or strength == 0:
        return torch.ones(*lead, len(spans), dtype=torch.float32, device=q.device)
    n_chunks = len(spans)
    if mode == "head_mean":  # one offset over the whole cache: one factor, for every chunk
        spans = [(0, k_quant.tokens)]
    qs = q[..., guard_rows(q.shape[-2], q.device), :].to(torch.float32)
    scores = (qs @ k_quant.dequantize(dtype=torch.float32).transpose(-1, -2)) / math.sqrt(q.shape[-1])
    applied = strength * jensen_bias(qs, k_quant, mode, list(b - a for a, b in spans))
    predicted = applied / strength if mode == "exact" else jensen_bias(qs, k_quant, "taylor")
    out = torch.stack([guard_scale(scores[..., a:b], predicted[..., a:b], applied[..., a:b]) for a, b in spans], dim=-1)
    return out.expand(*out.shape[:-1], n_chunks) if mode == "head_mean" else out


def query_groups(q_lead: Sequence[int], kv_lead: Sequence[int]) -> int:
    """Query heads per K/V head: 1 when the leading dimensions (batch, heads) broadcast, else ``H_q / H_kv``.

    The heads are the last leading dimension. Grouped-query attention needs ``H_q`` a multiple of
    ``H_kv`` and the other leading dimensions broadcasting; anything else is a ValueError naming both.
    """
    q_lead, kv_lead = tuple(q_lead), tuple(kv_lead)
    try:
        torch.broadcast_shapes(q_lead, kv_lead)
        return 1
    except RuntimeError:
        pass
    if q_lead and kv_lead and kv_lead[-1] >= 1 and q_lead[-1] % kv_lead[-1] == 0:
        try:
            torch.broadcast_shapes((*q_lead[:-1], kv_lead[-1]), kv_lead)
            return q_lead[-1] // kv_lead[-1]
        except RuntimeError:
            pass
    raise ValueError(
        f"the query's leading dimensions {q_lead} do not fit the keys' {kv_lead}: they must broadcast, or the "
        "query's heads (the last of them) must be a multiple of the K/V heads (grouped-query attention)"
    )


def jensen_bias(
    q: Tensor, k_quant: StoredTensor, mode: str = "taylor", chunk_tokens: Sequence[int] | None = None
) -> Tensor:
    """The bias ``b`` to subtract from the scores of quantized cached keys, float32, ``(..., M, N)``.

    ``q`` is the query in the model's (unrotated) space, shape ``(..., M, head_dim)``; ``k_quant``
    the quantized cached keys ``(..., N, head_dim)``. With a Hadamard-rotated cache the rotated
    query's group norms are used (App. F).

    modes: ``taylor`` (Eq. 15), ``chunk_mean`` (per query, the mean of the Taylor bias over each
    cached chunk's keys, shared by that chunk's keys: a constant offset of the chunk's log-sum-exp),
    ``exact`` (Eq. 12, numerically stable), ``per_channel`` (App. E: one shared ``b`` per query from
    the token-averaged ``Delta^2`` of each group over all the keys, Taylor form), ``off`` (zeros), ``head_mean``
    (one bias per query and head over all the cached keys: the Taylor bias averaged with the query's attention
    over the cached keys, uncorrected, ``sum_i p_i b_i``; it moves the whole cache's log-partition by what the
    per-key bias moves it to first order, and needs the scores: ``k_quant`` is dequantized).

    ``chunk_tokens`` (``chunk_mean``): the tokens of each cached chunk concatenated in ``k_quant``
    (see :func:`chunk_spans`; by default a QVG tensor's segments, else one chunk).

    Grouped-query attention: ``q`` (..., H_q, M, d) over keys (..., H_kv, N, d) with
    ``H_q = groups * H_kv`` (where the leading dimensions do not simply broadcast): query head ``h``
    is biased against K/V head ``h // groups``'s steps with its own group norms; the result is
    (..., H_q, M, N).
    """
    mode = check_mode(mode)
    if q.shape[-1] != k_quant.head_dim:
        raise ValueError(f"query head_dim {q.shape[-1]} does not match the keys' head_dim {k_quant.head_dim}")
    groups = query_groups(q.shape[:-2], tuple(k_quant.shape[:-2]))
    if groups > 1:  # the query heads of a group become rows of their K/V head
        Hq, M = q.shape[-3], q.shape[-2]
        b = jensen_bias(q.reshape(*q.shape[:-3], Hq // groups, groups * M, q.shape[-1]), k_quant, mode, chunk_tokens)
        return b.reshape(*b.shape[:-3], Hq, M, b.shape[-1])
    d, g = k_quant.head_dim, k_quant.spec.group_size
    lead = torch.broadcast_shapes(q.shape[:-2], k_quant.shape[:-2])
    M, N = q.shape[-2], k_quant.tokens
    spans = chunk_spans(k_quant, chunk_tokens) if chunk_tokens is not None or mode == "chunk_mean" else None
    if mode == "off":
        return torch.zeros(*lead, M, N, dtype=torch.float32, device=q.device)
    qr = _rotated_query(q, k_quant)
    step = k_quant.step_sizes()
    if mode == "exact":
        return _exact_bias(qr, step, d, g)
    nu = query_group_norms(qr, g)
    w = taylor_weights(step, d)
    if mode == "per_channel":
        w_mean = w.mean(dim=-2, keepdim=True)  # (..., 1, G)
        return (nu @ w_mean.transpose(-1, -2)).expand(*lead, M, N)
    if mode == "chunk_mean":
        w = chunk_mean_weights(w, spans)
    b = nu @ w.transpose(-1, -2)
    if mode == "head_mean":  # rotation keeps the scores: the model's space on both sides
        k_hat = k_quant.dequantize(dtype=torch.float32)
        p = torch.softmax((q.to(torch.float32) @ k_hat.transpose(-1, -2)) / math.sqrt(d), dim=-1)
        return (p * b).sum(-1, keepdim=True).expand(*lead, M, N)
    return b


def check_attention_bias(bias: float) -> float:
    """``bias`` as a float in :data:`ATTENTION_BIAS_RANGE`; else a ValueError naming it and the range."""
    lo, hi = ATTENTION_BIAS_RANGE
    ok = not isinstance(bias, bool) and isinstance(bias, (int, float)) and math.isfinite(bias)
    if not ok or not lo <= bias <= hi:
        raise ValueError(
            f"kv_cache_attention_bias={bias!r} must be a number from {lo:g} to {hi:g} (1.0 = off; Krea's default is "
            f"{KREA_ATTENTION_BIAS:g})"
        )
    return float(bias)


def attention_bias_offsets(
    entry_tokens: Sequence[int], bias: float, exempt_tokens: int
) -> list[tuple[tuple[int, float], ...]] | None:
    """Krea's ``kv_cache_attention_bias`` as log-offsets of the cached chunks' keys, for :func:`cached_attention`.

    Krea adds ``log(bias)`` to the score of every key in its attended window except the window's first
    frame and the current block (scope ``causal_model.py``: ``score_mod`` adds ``log_scale`` where
    ``frame_seqlen <= kv_idx < cache_current_block_start``). Here the current chunk is never among the
    cached chunks, so only the first ``exempt_tokens`` cached keys (one frame's tokens) are exempt.
    Per cached chunk (``entry_tokens``, in window order): ``(tokens, log-offset)`` pieces covering its keys.
    ``None`` when ``bias`` is 1 (nothing to add).
    """
    bias = check_attention_bias(bias)
    if bias == 1.0:
        return None
    log_b = math.log(bias)
    left = max(0, int(exempt_tokens))
    out = []
    for t in entry_tokens:
        free = min(left, t)
        left -= free
        pieces = ((free, 0.0),) if free else ()
        out.append(pieces + (((t - free, log_b),) if t > free else ()))
    return out
