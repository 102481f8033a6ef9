"""Attention of the current chunk over [cached quantized chunks, context tokens, current chunk], bias-corrected.

The Taylor correction (Eq. 15) is low rank, ``b = nu W^T`` with ``nu_mj = ||q_mj||^2`` and
``W_ij = Delta_ij^2 / (24 d)``. The fast path never materialises it:

- ``taylor`` (per score): appended channels, ``q' = [q, -sqrt(d) lambda nu]``, ``k' = [k_hat, W]``
  (cached), so that a kernel with scale ``1/sqrt(d)`` computes ``q.k/sqrt(d) - lambda b``; or, where
  it is faster (CUDA), FlexAttention with the bias as a ``score_mod``. The layout is chosen per
  device and dtype at first use (:mod:`jensen_core.correction_layouts`).
- ``chunk_mean`` / ``per_channel`` (constant over a cached chunk's keys, per query): cached and
  current chunks are attended separately and merged through their log-sum-exp, so such a bias is
  an offset of the chunk's log-sum-exp - no extra channel, any kernel, no cost.

Memory: cached chunks are dequantized one at a time straight into a chunk-sized buffer and
attended with a kernel that also returns the log-sum-exp; the partial results are merged exactly.
The transient is about one chunk's K/V in the compute dtype - never a full-precision copy of the
cache, nor even of one layer's window. (Where no kernel reports its log-sum-exp, one buffer holds
the layer's window instead, every correction folded in as appended channels.)

Grouped-query attention (fewer K/V heads than query heads) folds each group's query heads into its
K/V head's query rows, so nothing here sees more than one head per K/V head; context tokens (attended,
never stored or corrected) are one more full-precision part of the merge. See :func:`cached_attention`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor

from . import hadamard
from .bias import _exact_bias, check_mode, guard_rows, guard_scale, query_group_norms, taylor_weights
from .correction_layouts import Layout, layout_attend, layout_query, round_up, taylor_layout
from .hadamard import rotate, unrotate
from .packing import from_interleaved, to_interleaved
from .quant import StoredTensor
from .sdpa_lse import lse_supported, sdpa_with_lse
from .triton_kernel import triton_attend_chunk, unsupported_reason

logger = logging.getLogger("jensen_kv")

_FORCE_CONCAT = False  # tests flip this to exercise the single-buffer path
# benchmarks flip this: the channel-order dequantization and rotations of the first release, side by side
_LEGACY = False


@dataclass(eq=False)
class CacheEntry:
    """One finished chunk: its keys and values, each quantized or kept in full precision."""

    k: StoredTensor | Tensor
    v: StoredTensor | Tensor

    @property
    def tokens(self) -> int:
        return self.k.shape[-2]

    @property
    def nbytes(self) -> int:
        return sum(_nbytes(t) for t in (self.k, self.v))

    @property
    def numel(self) -> int:
        return sum(math.prod(t.shape) for t in (self.k, self.v))


def _nbytes(t: StoredTensor | Tensor) -> int:
    return t.nbytes if isinstance(t, StoredTensor) else t.numel() * t.element_size()


def _rotation_seed(t: StoredTensor | Tensor) -> int | None:
    if isinstance(t, StoredTensor) and t.spec.rotation == "hadamard":
        return t.spec.seed
    return None


def _check_inputs(
    q: Tensor,
    k_cur: Tensor,
    v_cur: Tensor,
    entries: Sequence[CacheEntry],
    strength: float,
    k_ctx: Tensor | None = None,
    v_ctx: Tensor | None = None,
) -> None:
    for name, t in (("q", q), ("k_cur", k_cur), ("v_cur", v_cur)):
        if not isinstance(t, Tensor) or t.dim() != 4:
            raise ValueError(
                f"{name} must be a (batch, heads, tokens, head_dim) tensor, got {getattr(t, 'shape', type(t))}"
            )
        if not t.is_floating_point():
            raise ValueError(f"{name} must be floating point, got {t.dtype}")
    if k_cur.shape != v_cur.shape:
        raise ValueError(f"k_cur {tuple(k_cur.shape)} and v_cur {tuple(v_cur.shape)} must have the same shape")
    if (
        not k_cur.shape[1]
        or q.shape[0] != k_cur.shape[0]
        or q.shape[-1] != k_cur.shape[-1]
        or q.shape[1] % k_cur.shape[1]
    ):
        raise ValueError(
            f"q {tuple(q.shape)} and k_cur {tuple(k_cur.shape)} disagree on batch, heads or head_dim (grouped-query "
            f"attention: the query's heads must be a multiple of the K/V heads, {k_cur.shape[1]} here)"
        )
    if k_cur.shape[-2] == 0 or q.shape[-2] == 0:
        raise ValueError("the current chunk is empty: q and k_cur need at least one token")
    if not (q.dtype == k_cur.dtype == v_cur.dtype):
        raise ValueError(f"q, k_cur and v_cur must share a dtype, got {q.dtype}, {k_cur.dtype}, {v_cur.dtype}")
    if not (q.device == k_cur.device == v_cur.device):
        raise ValueError(f"q, k_cur and v_cur must be on one device, got {q.device}, {k_cur.device}, {v_cur.device}")
    if not math.isfinite(float(strength)):
        raise ValueError(f"strength={strength!r} must be a finite number (1.0 applies the full correction)")
    if (k_ctx is None) != (v_ctx is None):
        raise ValueError("give the context tokens' keys and values together: k_ctx and v_ctx, or neither")
    if k_ctx is not None:
        for name, t in (("k_ctx", k_ctx), ("v_ctx", v_ctx)):
            if not isinstance(t, Tensor) or t.dim() != 4:
                raise ValueError(
                    f"{name} must be a (batch, K/V heads, tokens, head_dim) tensor, got {getattr(t, 'shape', type(t))}"
                )
        if k_ctx.shape != v_ctx.shape:
            raise ValueError(f"k_ctx {tuple(k_ctx.shape)} and v_ctx {tuple(v_ctx.shape)} must have the same shape")
        if k_ctx.shape[:2] != k_cur.shape[:2] or k_ctx.shape[-1] != k_cur.shape[-1]:
            raise ValueError(
                f"context tokens k_ctx {tuple(k_ctx.shape)} do not match the current chunk's batch, K/V heads and "
                f"head_dim {tuple(k_cur.shape[:2]) + (k_cur.shape[-1],)}"
            )
        if not (k_ctx.dtype == v_ctx.dtype == q.dtype) or not (k_ctx.device == v_ctx.device == q.device):
            raise ValueError(
                f"k_ctx and v_ctx must share q's dtype and device ({q.dtype} on {q.device}), got "
                f"{k_ctx.dtype}/{v_ctx.dtype} on {k_ctx.device}/{v_ctx.device}"
            )
    if not entries:
        return
    first = entries[0]
    want = (k_cur.shape[0], k_cur.shape[1], k_cur.shape[-1])
    for e in entries:
        for name, t in (("keys", e.k), ("values", e.v)):
            if len(t.shape) != 4 or (t.shape[0], t.shape[1], t.shape[-1]) != want:
                raise ValueError(
                    f"cached {name} of shape {tuple(t.shape)} do not match the query's batch, heads and "
                    f"head_dim {want} (K/V heads: those of k_cur)"
                )
            if t.device != q.device:
                raise ValueError(
                    f"cached {name} live on {t.device} but the query on {q.device}; keep them on one device"
                )
        if (
            type(e.k) is not type(first.k)
            or type(e.v) is not type(first.v)
            or (isinstance(e.k, StoredTensor) and not _same_but_bits(e.k.spec, first.k.spec))
            or (isinstance(e.v, StoredTensor) and not _same_but_bits(e.v.spec, first.v.spec))
        ):
            raise ValueError("all cached chunks must be stored with the same quantization spec (bits aside)")


def _same_but_bits(a, b) -> bool:
    """Whether two chunks' specs differ in bits at most (age tiers: each chunk's own bits and step sizes)."""
    return a == b or replace(a, bits=b.bits) == b


def cached_attention(
    q: Tensor,
    k_cur: Tensor,
    v_cur: Tensor,
    cache_entries: Sequence[CacheEntry],
    correction: str = "taylor",
    strength: float = 1.0,
    key_log_offsets: Sequence[float | Sequence[tuple[int, float]] | None] | None = None,
    *,
    k_ctx: Tensor | None = None,
    v_ctx: Tensor | None = None,
    guard: bool = False,
) -> Tensor:
    """Attention of the current chunk's queries over the cached chunks, any context tokens and the current chunk.

    Shapes follow SDPA: ``q`` (batch, H_q, M, d), ``k_cur``/``v_cur`` (batch, H_kv, T, d), every
    cache entry (batch, H_kv, T_i, d). Returns (batch, H_q, M, d) in ``q.dtype``.

    Grouped-query attention: ``H_q = groups * H_kv``, query head ``h`` attends K/V head
    ``h // groups`` (SDPA's ``enable_gqa`` convention). The query heads of a group are folded into
    that K/V head's query rows (``(batch, H_kv, groups * M, d)``, a view or one query-sized copy), so
    every kernel, layout and correction below runs unchanged and K/V are never repeated. The correction
    is per query row and per K/V head's step sizes, so it stays exact: the bias of query head ``h``
    uses that query's group norms against K/V head ``h // groups``'s steps. ``H_q == H_kv`` takes the
    same path as before GQA.

    Context tokens (optional ``k_ctx``/``v_ctx``, (batch, H_kv, C, d), the query's dtype): tokens that
    are attended in full precision but are neither cached nor corrected (a joint-attention model's
    text tokens, MAGI-1's chunks still being denoised). They are one more part of the streaming
    log-sum-exp merge, like the current chunk, so the result is softmax over [cached (corrected),
    context, current]. A caller whose query groups see different cached chunks (MAGI-1's per-chunk
    key range) calls once per group with the entries that group sees (a suffix of the cache:
    ``ChunkCache.attend(..., last_chunks=n)``).

    ``correction``: ``taylor`` runs the per-score correction through the kernel layout chosen for
    this device and dtype (:func:`jensen_core.correction_layouts.taylor_layout`; no bias matrix);
    ``chunk_mean`` and ``per_channel`` subtract a bias that is constant over each cached chunk
    (per query): an offset of that chunk's log-sum-exp before the merge, free with any kernel;
    ``exact`` (Eq. 12) materialises the score matrix head by head and is much slower - meant for
    diagnostics and ablations; ``off`` is plain attention. The correction is scaled by
    ``strength`` and touches cached keys only; it is skipped when the keys are not quantized.

    Where the SDPA kernel reports its log-sum-exp (CPU, CUDA), the cached chunks are streamed one
    at a time and the partial results merged, so the transient memory is about one chunk's K/V
    rather than the whole window; elsewhere one buffer holds the window.

    ``key_log_offsets`` (optional, one item per cached chunk): a constant added to the scores of that
    chunk's keys - a float for all of them, or ``(tokens, offset)`` pieces covering its keys in order
    (None or 0: nothing). Krea's ``kv_cache_attention_bias`` is ``log(bias)`` on every cached key
    but the window's first frame (:func:`jensen_core.bias.attention_bias_offsets`). A constant over a
    run of keys is an offset of their log-sum-exp before the merge, so it composes with every
    correction and layout in the same pass, with no bias matrix and no extra channel (a chunk split
    into runs takes one kernel call per run; the one-buffer path folds the offsets into one more
    channel); the current chunk and the context tokens never get one.

    ``guard`` (the pack's runs turn it on: ``JensenKVConfig.guard``; off here, where the correction is the paper's
    formula): per (batch, K/V head, cached chunk), the correction is scaled down where it would
    shift the chunk's log-partition by more than :data:`jensen_core.bias.GUARD_TOLERANCE` times the bias the
    noise is predicted to have caused there (:func:`jensen_core.bias.guard_scale`, from at most
    :data:`jensen_core.bias.GUARD_QUERIES` sampled queries' scores, the step sizes and the query): one dominant
    cached key, or noise past the second-order regime. Where the prediction agrees with the correction the
    factor is exactly 1 and the result is that of ``guard=False``.
    """
    correction = check_mode(correction)
    entries = list(cache_entries)
    _check_inputs(q, k_cur, v_cur, entries, strength, k_ctx, v_ctx)
    if k_ctx is not None and k_ctx.shape[-2] == 0:
        k_ctx = v_ctx = None  # no context tokens
    pieces = _offset_pieces(key_log_offsets, entries)
    groups = q.shape[1] // k_cur.shape[1]
    if groups == 1:
        return _attend(q, k_cur, v_cur, entries, correction, strength, pieces, k_ctx, v_ctx, bool(guard))
    B, Hq, M, D = q.shape
    folded = q.reshape(B, k_cur.shape[1], groups * M, D)  # query heads of a group = rows of its K/V head
    out = _attend(folded, k_cur, v_cur, entries, correction, strength, pieces, k_ctx, v_ctx, bool(guard))
    return out.reshape(B, Hq, M, D)


def _attend(
    q: Tensor,
    k_cur: Tensor,
    v_cur: Tensor,
    entries: list[CacheEntry],
    correction: str,
    strength: float,
    pieces: Pieces,
    k_ctx: Tensor | None,
    v_ctx: Tensor | None,
    guard: bool = False,
) -> Tensor:
    """:func:`cached_attention` once ``q`` has as many heads as the K/V (inputs checked)."""
    if not entries:
        return _full_precision_attention(q, k_cur, v_cur, k_ctx, v_ctx)

    D = q.shape[-1]
    kseed, vseed = _rotation_seed(entries[0].k), _rotation_seed(entries[0].v)
    keys_quantized = isinstance(entries[0].k, StoredTensor)
    if not keys_quantized or strength == 0:
        correction = "off"
    strength = float(strength)
    if correction == "exact":
        k_cur, v_cur = _with_context(k_cur, v_cur, k_ctx, v_ctx)
        qr, kcr, vcr = _rotated(q, k_cur, v_cur, kseed, vseed)
        out = _exact_attention(qr, kcr, vcr, entries, strength, pieces, guard)
        return unrotate(out, vseed) if vseed is not None else out
    G = D // entries[0].k.spec.group_size if correction != "off" else 0
    streamed = not _FORCE_CONCAT and lse_supported(q.device, q.dtype, D)
    if correction == "head_mean":  # its values carry G more channels
        streamed = streamed and lse_supported(q.device, q.dtype, round_up(D + G, 8))
    layout = None
    if correction == "taylor" and streamed:
        layout = taylor_layout(q.device, q.dtype, D, G, (q.shape[1], q.shape[2], entries[0].tokens))
        streamed = layout is not None
    if streamed:
        return _streamed(
            q, k_cur, v_cur, entries, correction, strength, layout, kseed, vseed, pieces, k_ctx, v_ctx, guard
        )
    k_cur, v_cur = _with_context(k_cur, v_cur, k_ctx, v_ctx)
    qr, kcr, vcr = _rotated(q, k_cur, v_cur, kseed, vseed)
    out = _concatenated(qr, kcr, vcr, entries, correction, strength, G, pieces, guard)
    return unrotate(out, vseed) if vseed is not None else out


def _with_context(k_cur: Tensor, v_cur: Tensor, k_ctx: Tensor | None, v_ctx: Tensor | None) -> tuple[Tensor, Tensor]:
    """The one-buffer and exact paths: context and current tokens as one uncorrected block (a copy of both)."""
    if k_ctx is None:
        return k_cur, v_cur
    return torch.cat([k_ctx, k_cur], dim=-2), torch.cat([v_ctx, v_cur], dim=-2)


def _full_precision_attention(
    q: Tensor, k_cur: Tensor, v_cur: Tensor, k_ctx: Tensor | None, v_ctx: Tensor | None
) -> Tensor:
    """Attention over the current chunk and any context tokens only (nothing cached): nothing to correct."""
    if k_ctx is None:
        return F.scaled_dot_product_attention(q, k_cur, v_cur)
    D = q.shape[-1]
    if _FORCE_CONCAT or not lse_supported(q.device, q.dtype, D):
        return F.scaled_dot_product_attention(q, torch.cat([k_ctx, k_cur], -2), torch.cat([v_ctx, v_cur], -2))
    scale = 1.0 / math.sqrt(D)
    acc, lse = _merge(None, None, *sdpa_with_lse(q, k_ctx, v_ctx, scale), D)
    acc, _ = _merge(acc, lse, *sdpa_with_lse(q, k_cur, v_cur, scale), D)
    return acc.to(q.dtype)


#: per cached chunk, ``(start, end, log-offset)`` runs of its keys (None: no offsets anywhere)
Pieces = list[list[tuple[int, int, float]]] | None


def _offset_pieces(offsets, entries: list[CacheEntry]) -> Pieces:
    """``key_log_offsets`` checked against the chunks and turned into runs of keys; None when every offset is 0."""
    if offsets is None:
        return None
    offsets = list(offsets)
    if len(offsets) != len(entries):
        raise ValueError(
            f"key_log_offsets has {len(offsets)} items but the cache holds {len(entries)} chunks; give one per chunk"
        )
    out, any_offset = [], False
    for i, (spec, e) in enumerate(zip(offsets, entries)):
        t = e.tokens
        if spec is None:
            spec = ((t, 0.0),)
        elif isinstance(spec, (int, float)) and not isinstance(spec, bool):
            spec = ((t, float(spec)),)
        runs, start = [], 0
        for piece in spec:
            n, off = piece
            if isinstance(n, bool) or not isinstance(n, int) or n < 0 or not math.isfinite(float(off)):
                raise ValueError(
                    f"key_log_offsets[{i}] has the piece {piece!r}; a piece is (tokens >= 0, finite log-offset)"
                )
            if n:
                runs.append((start, start + n, float(off)))
                any_offset |= float(off) != 0.0
            start += n
        if start != t:
            raise ValueError(
                f"key_log_offsets[{i}] covers {start} keys but cached chunk {i} holds {t}; its pieces must add up to {t}"
            )
        out.append(runs)
    return out if any_offset else None


def _rotated(
    q: Tensor, k_cur: Tensor, v_cur: Tensor, kseed: int | None, vseed: int | None
) -> tuple[Tensor, Tensor, Tensor]:
    """The query and the current chunk in the space the cached codes live in."""
    if kseed is not None:
        q, k_cur = rotate(q, kseed), rotate(k_cur, kseed)
    return q, k_cur, rotate(v_cur, vseed) if vseed is not None else v_cur


def _guard(qs: Tensor, nu_s: Tensor, k_hat: Tensor, w: Tensor, applied: Tensor | None, strength: float) -> Tensor:
    """The guard's factor ``(batch, heads)`` for one cached chunk (:func:`jensen_core.bias.guard_scale`).

    ``qs`` / ``nu_s``: the sampled queries and their group norms, in the keys' space and channel order; ``k_hat``
    the chunk's dequantized keys; ``w`` its Taylor weights (the prediction); ``applied`` ``(batch, heads, m)``:
    a chunk-constant correction's bias per sampled query (None: Taylor's per-key bias times ``strength``).
    """
    scores = (qs.to(torch.float32) @ k_hat.to(torch.float32).transpose(-1, -2)) / math.sqrt(qs.shape[-1])
    predicted = nu_s @ w.transpose(-1, -2)
    return guard_scale(scores, predicted, strength * predicted if applied is None else applied.unsqueeze(-1))


def _taylor_weights(entries: list[CacheEntry], D: int) -> list[Tensor]:
    return [taylor_weights(e.k.step_sizes(), D) for e in entries]


def _constant_weights(entries: list[CacheEntry], correction: str, D: int) -> list[Tensor]:
    """Per entry, the ``W`` shared by all its keys, ``(..., 1, G)``: its chunk's mean (chunk_mean) or the window's (per_channel, App. E)."""
    ws = _taylor_weights(entries, D)
    if correction == "chunk_mean":
        return [w.mean(-2, keepdim=True) for w in ws]
    mean = sum(w.sum(-2, keepdim=True) for w in ws) / sum(e.tokens for e in entries)
    return [mean] * len(entries)


def _interleave(t: StoredTensor | Tensor) -> tuple[int, int] | None:
    """(bits, group size) when a cached side is dequantized in group-interleaved channel order."""
    if _LEGACY or not isinstance(t, StoredTensor) or not t.interleaved:
        return None
    return t.spec.bits, t.spec.group_size


def _common_interleave(entries: list[CacheEntry], side: str) -> tuple[int, int] | None:
    """The interleaved order every cached chunk of a side shares; None (channel order) when their bits differ."""
    il = _interleave(getattr(entries[0], side))
    return il if all(_interleave(getattr(e, side)) == il for e in entries[1:]) else None


def _fill(dst: Tensor, src: StoredTensor | Tensor, interleaved: bool) -> None:
    if not isinstance(src, StoredTensor):
        dst.copy_(src)
    elif interleaved:
        src.dequantize_interleaved(dst)
    else:
        src.dequantize(rotated=True, out=dst)


_CODE_MATRICES: dict[tuple, Tensor] = {}


def _code_matrix(
    n: int, seed: int, il: tuple[int, int], device: torch.device, dtype: torch.dtype, inverse: bool
) -> Tensor:
    """The rotation with the group-interleaved channel order folded in: columns (forward) or rows (inverse) reordered."""
    key = (n, seed, il, str(device), dtype, inverse)
    m = _CODE_MATRICES.get(key)
    if m is None:
        r = hadamard._matrix(n, seed, device, dtype, inverse)
        m = (to_interleaved(r.T, *il).T if inverse else to_interleaved(r, *il)).contiguous()
        if len(_CODE_MATRICES) > 64:
            _CODE_MATRICES.clear()
        _CODE_MATRICES[key] = m
    return m


def _to_codes_space(x: Tensor, seed: int | None, il: tuple[int, int] | None) -> Tensor:
    """``x`` rotated as the cached codes are and in their channel order: one new tensor at most (a matmul or a copy)."""
    if seed is None:
        return to_interleaved(x, *il) if il else x
    if il is None or x.shape[-1] > hadamard.MATMUL_MAX_DIM:
        r = rotate(x, seed)
        return to_interleaved(r, *il) if il else r
    cdt = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
    return (x.to(cdt) @ _code_matrix(x.shape[-1], seed, il, x.device, cdt, False)).to(x.dtype)


def _to_model_space(x: Tensor, seed: int | None, il: tuple[int, int] | None) -> Tensor:
    """Inverse of :func:`_to_codes_space` (for the merged output of the cached chunks)."""
    if seed is None:
        return from_interleaved(x, *il) if il else x
    if il is None or x.shape[-1] > hadamard.MATMUL_MAX_DIM:
        return unrotate(from_interleaved(x, *il) if il else x, seed)
    cdt = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
    return (x.to(cdt) @ _code_matrix(x.shape[-1], seed, il, x.device, cdt, True)).to(x.dtype)


def _streamed(
    q: Tensor,
    k_cur: Tensor,
    v_cur: Tensor,
    entries: list[CacheEntry],
    correction: str,
    strength: float,
    layout: Layout | None,
    kseed: int | None,
    vseed: int | None,
    pieces: Pieces = None,
    k_ctx: Tensor | None = None,
    v_ctx: Tensor | None = None,
    guard: bool = False,
) -> Tensor:
    """One kernel call per cached chunk, one for the context tokens (if any) and one for the current chunk, merged
    by log-sum-exp.

    With ``pieces``, a chunk whose keys carry different log-offsets is attended as one call per run of
    keys (views of its dequantized buffer), each run's log-sum-exp shifted by its offset before the merge.

    The cached chunks are attended in their codes' space (rotated query; channels in the order the
    codes unpack fastest, the query reordered to match - one matmul or one copy); their merged output
    is brought back to the model's space once, and the current chunk is attended in the model's
    space directly (a rotation preserves its scores), so it costs no rotations. ``_LEGACY`` restores
    the first release's path (channel-order dequantization, the current chunk rotated) for
    side-by-side benchmarks.

    ``guard``: each chunk's correction scaled by its factor (:func:`_guard`), from the sampled queries' scores
    over the chunk's dequantized keys; the fused Triton kernel takes one strength, so a guarded Taylor
    correction runs the padded layout there.
    """
    D = q.shape[-1]
    B, H = q.shape[:2]
    guard = guard and correction != "off"
    scale = 1.0 / math.sqrt(D)
    k0 = entries[0].k
    fused = layout is not None and layout.kind == "triton"
    runs_of = pieces if pieces is not None else [[(0, e.tokens, 0.0)] for e in entries]
    # QVG keys, or a chunk split into runs of different offsets (Krea's spared first frame): a padded buffer instead
    if fused and (
        guard or any(unsupported_reason(e.k, e.v) for e in entries) or any(len(runs) > 1 for runs in runs_of)
    ):
        layout, fused = Layout("pad", round_up(D + k0.head_dim // k0.spec.group_size, 8)), False
    # the fused kernel reads channel order
    kil, vil = (None, None) if fused else (_common_interleave(entries, "k"), _common_interleave(entries, "v"))
    if _LEGACY:
        qr = rotate(q, kseed) if kseed is not None else q
        qk = qr
    else:
        qk = _to_codes_space(q, kseed, kil)  # group norms do not see the order of a group's channels
    nu = query_group_norms(qk, k0.spec.group_size) if correction != "off" else None
    offsets = (
        [strength * (nu @ w.transpose(-1, -2)).squeeze(-1) for w in _constant_weights(entries, correction, D)]
        if correction in ("chunk_mean", "per_channel")
        else [None] * len(entries)
    )
    head_mean = correction == "head_mean"
    wanted = (layout is not None and not fused) or guard or head_mean
    weights = _taylor_weights(entries, D) if wanted else [None] * len(entries)
    if guard:  # the guard's sampled queries, kept in the codes' space
        rows = guard_rows(q.shape[-2], q.device)
        qs, nu_s = qk[..., rows, :], nu[..., rows, :]
        seen: list[tuple[Tensor, Tensor]] = []  # head_mean: the sampled scores and biases of every chunk
    qin = layout_query(layout, qk, nu, strength) if layout is not None else qk
    kw = layout.width if layout is not None else D
    vw = layout.value_width(D) if layout is not None else D
    if head_mean:  # W rides in the values' extra channels: the merge returns sum_i p_i W_i over the cache
        kw = vw = round_up(D + weights[0].shape[-1], 8)
        qin = q.new_zeros(*qk.shape[:-1], kw)
        qin[..., :D] = qk
    if qin is not qk and not _LEGACY:
        del qk
    acc = lse = kb = vb = None
    bufs: dict[int, tuple[Tensor, Tensor]] = {}
    for e, w, off, runs in zip(entries, weights, offsets, runs_of):
        if fused:  # straight from the packed codes, Taylor-corrected in registers: no buffer
            out, out_lse = triton_attend_chunk(qin, e.k, e.v, "taylor", strength, scale, codes_space=True)
            if runs[0][2]:  # one run over the whole chunk: Krea's bias is an offset of its log-sum-exp
                out_lse = out_lse + runs[0][2]
            acc, lse = _merge(acc, lse, out, out_lse, D)
            continue
        t = e.tokens
        if t not in bufs:  # chunks usually share one size: the buffers are reused
            kb, vb = q.new_empty(B, H, t, kw), q.new_empty(B, H, t, vw)
            if kw > D:
                kb[..., D:] = 0
            if vw > D:
                vb[..., D:] = 0
            bufs[t] = (kb, vb)
        kb, vb = bufs[t]
        _fill(kb[..., :D], e.k, kil is not None)
        _fill(vb[..., :D], e.v, vil is not None)
        if head_mean:
            vb[..., D : D + w.shape[-1]] = w
            if guard:
                scores = (qs.to(torch.float32) @ kb[..., :D].to(torch.float32).transpose(-1, -2)) * scale
                seen.append((scores, nu_s @ w.transpose(-1, -2)))
        elif guard:
            factor = _guard(qs, nu_s, kb[..., :D], w, None if off is None else off[..., rows], strength)
            if off is not None:
                off = off * factor.unsqueeze(-1)
            elif bool((factor < 1).any()):
                w = w * factor[..., None, None]
        if layout is not None and layout.kind != "flex":
            kb[..., D : D + w.shape[-1]] = w
        for a, b, log_offset in runs:
            ka, va = (kb, vb) if (a, b) == (0, t) else (kb[:, :, a:b], vb[:, :, a:b])
            if layout is None:
                out, out_lse = sdpa_with_lse(qin, ka, va, scale)
            else:
                wa = w if (a, b) == (0, t) else w[..., a:b, :]
                out, out_lse = layout_attend(layout, qin, ka, va, nu, wa, strength, scale)
            if off is not None:  # a bias constant over the chunk's keys: an offset of its log-sum-exp
                out_lse = out_lse - off
            if log_offset:  # a constant added to these keys' scores (Krea's attention bias)
                out_lse = out_lse + log_offset
            acc, lse = _merge(acc, lse, out, out_lse, vw if head_mean else D)
            del out
    bufs.clear()
    del qin, kb, vb
    if head_mean:  # one bias per query and head: the attention-weighted Taylor bias, an offset of the cache's LSE
        b = strength * (nu * acc[..., D : D + nu.shape[-1]]).sum(-1)
        if guard:
            scores, predicted = (torch.cat(t, dim=-1) for t in zip(*seen))
            b = b * guard_scale(scores, predicted, b[..., rows].unsqueeze(-1)).unsqueeze(-1)
        lse = lse - b
        acc = acc[..., :D].contiguous()
    if guard:
        del qs, nu_s
    if _LEGACY:  # the current chunk rotated into the codes' space, everything un-rotated at the end
        for kx, vx in ((k_ctx, v_ctx), (k_cur, v_cur)):
            if kx is not None:
                _, kxr, vxr = _rotated(q, kx, vx, kseed, vseed)
                acc, lse = _merge(acc, lse, *sdpa_with_lse(qr, kxr, vxr, scale), D)
        out = acc.to(q.dtype)
        return unrotate(out, vseed) if vseed is not None else out
    acc = _to_model_space(acc, vseed, vil)
    if k_ctx is not None:  # context tokens: full precision, never corrected
        acc, lse = _merge(acc, lse, *sdpa_with_lse(q, k_ctx, v_ctx, scale), D)
    acc, lse = _merge(acc, lse, *sdpa_with_lse(q, k_cur, v_cur, scale), D)  # the current chunk: never corrected
    return acc.to(q.dtype)


def _merge(acc: Tensor | None, lse: Tensor | None, out: Tensor, out_lse: Tensor, D: int) -> tuple[Tensor, Tensor]:
    """Fold one softmax-normalised partial attention over a disjoint key set into ``acc`` (float32, in place)."""
    out = out[..., :D]
    if acc is None:
        return out.to(torch.float32), out_lse
    new = torch.logaddexp(lse, out_lse)
    acc.mul_(torch.exp(lse - new).unsqueeze(-1)).addcmul_(out, torch.exp(out_lse - new).unsqueeze(-1))
    return acc, new


def _concatenated(
    qr: Tensor,
    kcr: Tensor,
    vcr: Tensor,
    entries: list[CacheEntry],
    correction: str,
    strength: float,
    G: int,
    pieces: Pieces = None,
    guard: bool = False,
) -> Tensor:
    """One SDPA call over a buffer holding the whole window (where no kernel reports its LSE).

    Every correction is folded in as G appended channels (q' = [q, -sqrt(d) lambda nu], k' = [k_hat, W]
    for cached keys, [k, 0] for current keys), with W shared over each chunk's keys for the
    chunk-constant modes; q, k and v padded to one width so that the fused kernel runs. Key
    log-offsets (``pieces``) take one more channel: sqrt(d) in the query, the offset in the keys.
    ``head_mean`` takes one channel too: -sqrt(d) b_m in the query, 1 in the cached keys, b_m from the query's
    attention over the cached keys (materialised here, (M, cached keys) per head).
    """
    if correction == "head_mean":
        return _concatenated_head_mean(qr, kcr, vcr, entries, strength, pieces, guard)
    D = qr.shape[-1]
    O = 1 if pieces is not None else 0  # noqa: E741 - the offset channel
    Dp = D if G + O == 0 else round_up(D + G + O, 8)
    B, H = qr.shape[:2]
    n_cached = sum(e.tokens for e in entries)
    N = n_cached + kcr.shape[-2]
    qbuf = qr
    ws: list[Tensor | None] = [None] * len(entries)
    if G:
        nu = query_group_norms(qr, D // G)
        qbuf = layout_query(Layout("pad", Dp), qr, nu, strength)
        ws = _taylor_weights(entries, D) if correction == "taylor" else _constant_weights(entries, correction, D)
        if guard:
            rows = guard_rows(qr.shape[-2], qr.device)
            qs, nu_s = qr[..., rows, :], nu[..., rows, :]
    elif O:
        qbuf = qr.new_zeros(B, H, qr.shape[-2], Dp)
        qbuf[..., :D] = qr
    if O:
        qbuf[..., D + G] = math.sqrt(D)
    kbuf = qr.new_empty(B, H, N, Dp)
    vbuf = qr.new_empty(B, H, N, Dp)
    s = 0
    for e, w in zip(entries, ws):
        t = e.tokens
        _fill(kbuf[:, :, s : s + t, :D], e.k, False)
        _fill(vbuf[:, :, s : s + t, :D], e.v, False)
        if w is not None and guard:
            wt = taylor_weights(e.k.step_sizes(), D)
            applied = None if correction == "taylor" else strength * (nu_s @ w.transpose(-1, -2)).squeeze(-1)
            w = w * _guard(qs, nu_s, kbuf[:, :, s : s + t, :D], wt, applied, strength)[..., None, None]
        if w is not None:
            kbuf[:, :, s : s + t, D : D + G] = w
        s += t
    kbuf[:, :, n_cached:, :D] = kcr
    vbuf[:, :, n_cached:, :D] = vcr
    if Dp > D:
        vbuf[..., D:] = 0
        kbuf[:, :, n_cached:, D:] = 0
        kbuf[:, :, :n_cached, D + G :] = 0
    if O:
        s = 0
        for e, runs in zip(entries, pieces):
            for a, b, log_offset in runs:
                kbuf[:, :, s + a : s + b, D + G] = log_offset
            s += e.tokens
    out = F.scaled_dot_product_attention(qbuf, kbuf, vbuf, scale=1.0 / math.sqrt(D))
    return out[..., :D] if Dp > D else out


def _concatenated_head_mean(
    qr: Tensor, kcr: Tensor, vcr: Tensor, entries: list[CacheEntry], strength: float, pieces: Pieces, guard: bool
) -> Tensor:
    """:func:`_concatenated` for ``head_mean``: one window buffer, the bias as one channel (and Krea's offsets as
    another)."""
    D = qr.shape[-1]
    B, H, M = qr.shape[:3]
    n_cached = sum(e.tokens for e in entries)
    N = n_cached + kcr.shape[-2]
    Dp = round_up(D + 2, 8)
    kbuf = qr.new_zeros(B, H, N, Dp)
    vbuf = qr.new_zeros(B, H, N, Dp)
    s = 0
    for e in entries:
        _fill(kbuf[:, :, s : s + e.tokens, :D], e.k, False)
        _fill(vbuf[:, :, s : s + e.tokens, :D], e.v, False)
        s += e.tokens
    kbuf[:, :, n_cached:, :D] = kcr
    vbuf[:, :, n_cached:, :D] = vcr
    kbuf[:, :, :n_cached, D] = 1.0
    s = 0
    for e, runs in zip(entries, pieces or [[] for _ in entries]):
        for a, b, log_offset in runs:
            kbuf[:, :, s + a : s + b, D + 1] = log_offset
        s += e.tokens
    w = torch.cat(_taylor_weights(entries, D), dim=-2)  # (B, H, cached keys, G)
    nu = query_group_norms(qr, D // w.shape[-1])
    scores = (qr.to(torch.float32) @ kbuf[:, :, :n_cached, :D].to(torch.float32).transpose(-1, -2)) / math.sqrt(D)
    scores = scores + kbuf[:, :, :n_cached, D + 1].to(torch.float32).unsqueeze(-2)
    b = strength * (nu * (torch.softmax(scores, -1) @ w)).sum(-1)  # (B, H, M)
    if guard:
        rows = guard_rows(M, qr.device)
        predicted = nu[..., rows, :] @ w.transpose(-1, -2)
        b = b * guard_scale(scores[..., rows, :], predicted, b[..., rows].unsqueeze(-1)).unsqueeze(-1)
    qbuf = qr.new_zeros(B, H, M, Dp)
    qbuf[..., :D] = qr
    qbuf[..., D] = -math.sqrt(D) * b
    qbuf[..., D + 1] = math.sqrt(D)
    return F.scaled_dot_product_attention(qbuf, kbuf, vbuf, scale=1.0 / math.sqrt(D))[..., :D]


def _exact_attention(
    qr: Tensor,
    kcr: Tensor,
    vcr: Tensor,
    entries: list[CacheEntry],
    strength: float,
    pieces: Pieces = None,
    guard: bool = False,
) -> Tensor:
    """Materialised attention with the exact bias (Eq. 12) and any key log-offsets, one (batch, head) at a time.

    ``guard``: each chunk's exact bias scaled by its guard factor, predicted from the exact bias itself."""
    B, H, M, D = qr.shape
    g = entries[0].k.spec.group_size
    dtype = qr.dtype
    k_hat = torch.cat([e.k.dequantize(dtype=torch.float32, rotated=True) for e in entries], dim=-2)
    v_hat = torch.cat(
        [
            e.v.dequantize(dtype=torch.float32, rotated=True) if isinstance(e.v, StoredTensor) else e.v.float()
            for e in entries
        ],
        dim=-2,
    )
    steps = torch.cat([e.k.step_sizes() for e in entries], dim=-2)
    n_cached = k_hat.shape[-2]
    key_offsets = torch.zeros(n_cached, dtype=torch.float32, device=qr.device)
    s0 = 0
    for e, runs in zip(entries, pieces or []):
        for a, b, log_offset in runs:
            key_offsets[s0 + a : s0 + b] = log_offset
        s0 += e.tokens
    out = torch.empty(B, H, M, D, dtype=dtype, device=qr.device)
    scale = 1.0 / math.sqrt(D)
    rows = guard_rows(M, qr.device)
    for b in range(B):
        for h in range(H):
            qf = qr[b, h].float()
            s_hat = (qf @ k_hat[b, h].T) * scale
            bias = _exact_bias(qf, steps[b, h], D, g)
            if guard and strength:
                s0 = 0
                for e in entries:
                    span = slice(s0, s0 + e.tokens)
                    sb = bias[rows, span]
                    bias[:, span] *= guard_scale(s_hat[rows, span], sb, strength * sb)
                    s0 += e.tokens
            s_cached = s_hat - strength * bias + key_offsets
            s_cur = (qf @ kcr[b, h].float().T) * scale
            p = torch.softmax(torch.cat([s_cached, s_cur], dim=-1), dim=-1)
            out[b, h] = (p[:, :n_cached] @ v_hat[b, h] + p[:, n_cached:] @ vcr[b, h].float()).to(dtype)
    return out
