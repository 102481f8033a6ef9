"""How the MAGI-1 DiT's self-attention reaches keys: one plan per forward, one injectable callable per call.

The reference (``FullyParallelAttention`` in ``inference/model/dit/dit_module.py``) attends per chunk. A
forward carries ``current`` chunks (the in-flight window, possibly a clean chunk in front and, for the
distilled model, a copy of the oldest in-flight chunk at the end); finished chunks before them live in a
K/V buffer. The key sequence of a forward is ``[stored chunks 0 .. cached-1] + [current chunks]``, and
query chunk ``j`` attends to the slice ``key_ranges[j] = (start, end)`` of it, counted in chunks (the
reference's ``kv_range`` divided by the tokens of a chunk). After the forward, the chunks named in
``store`` are written to the buffer at their absolute chunk index (the clean chunk, in the reference's
``_full_adjust_key_and_value``).

Every self-attention call of the DiT goes through one callable, ``attention(layer, q, k, v, plan)``:

- ``q`` (batch, query heads, tokens, head_dim), ``k``/``v`` (batch, K/V heads, tokens, head_dim): the
  current chunks' post-QK-norm, post-RoPE projections (the keys a cache stores), in the compute dtype;
- ``plan``: a :class:`ChunkPlan`;
- returns (batch, query heads, tokens, head_dim).

:class:`FullPrecisionKV` is the reference's behaviour (every written chunk kept in full precision). A
quantized cache is another object with the same ``__call__`` (the pack's: ``runtime/families/magi1/family.py``), so the DiT
never changes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor


def _probe_gqa() -> bool:
    """Whether this torch's SDPA takes ``enable_gqa`` (torch >= 2.5)."""
    q = torch.zeros(1, 2, 1, 8)
    k = torch.zeros(1, 1, 1, 8)
    try:
        F.scaled_dot_product_attention(q, k, k, enable_gqa=True)
    except (TypeError, RuntimeError):
        return False
    return True


_SDPA_GQA = _probe_gqa()


def sdpa(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Non-causal SDPA with scale 1/sqrt(head_dim); K/V heads fewer than query heads are grouped as flash-attn
    groups them (query head ``h`` reads K/V head ``h // (Hq / Hkv)``)."""
    hq, hkv = q.shape[1], k.shape[1]
    if hq != hkv:
        if hq % hkv:
            raise ValueError(f"{hq} query heads cannot be grouped over {hkv} K/V heads")
        if _SDPA_GQA:
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        k = k.repeat_interleave(hq // hkv, dim=1)
        v = v.repeat_interleave(hq // hkv, dim=1)
    return F.scaled_dot_product_attention(q, k, v)


@dataclass(frozen=True)
class ChunkPlan:
    """Which keys each query chunk of one forward reads, and which chunks the forward writes.

    ``chunk_tokens``: tokens of one chunk; ``cached``: finished chunks 0 .. cached-1 read from the store
    (the reference's ``slice_point``); ``key_ranges``: per current chunk, ``(start, end)`` in chunks over
    ``[cached] + [current]``; ``store``: ``(current index, absolute chunk index)`` of the chunks whose K/V
    this forward writes (empty when it writes none: the reference's ``update_kv_cache = False``)."""

    chunk_tokens: int
    cached: int
    key_ranges: tuple[tuple[int, int], ...]
    store: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        if self.chunk_tokens < 1 or self.cached < 0:
            raise ValueError(f"chunk_tokens {self.chunk_tokens} / cached {self.cached} out of range")
        total = self.cached + len(self.key_ranges)
        for j, (s, e) in enumerate(self.key_ranges):
            if not 0 <= s < e <= total:
                raise ValueError(f"key range {(s, e)} of chunk {j} is outside the {total} chunks of this forward")
        for cur, absolute in self.store:
            if not 0 <= cur < len(self.key_ranges) or absolute < 0:
                raise ValueError(f"store entry {(cur, absolute)} names no current chunk")

    @property
    def current(self) -> int:
        return len(self.key_ranges)

    @classmethod
    def self_only(cls, chunk_tokens: int, chunks: int) -> ChunkPlan:
        """Every chunk attends to itself alone, nothing cached or written (the cfg-3 unconditional pass)."""
        return cls(chunk_tokens, 0, tuple((j, j + 1) for j in range(chunks)))

    @classmethod
    def block_causal(cls, chunk_tokens: int, chunks: int) -> ChunkPlan:
        """Every chunk attends to itself and all earlier chunks of the forward; nothing cached or written."""
        return cls(chunk_tokens, 0, tuple((0, j + 1) for j in range(chunks)))


def attend_ranges(q: Tensor, k_all: Tensor, v_all: Tensor, plan: ChunkPlan, offset: int = 0) -> Tensor:
    """The reference's per-chunk attention: query chunk ``j`` over keys ``key_ranges[j]`` of ``k_all``
    (``offset`` chunks of ``k_all`` precede chunk 0 of ``[cached] + [current]``; 0 when all are there)."""
    n = plan.chunk_tokens
    out = []
    for j, (s, e) in enumerate(plan.key_ranges):
        ks, ke = (s - offset) * n, (e - offset) * n
        if ks < 0:
            raise ValueError(f"chunk {j} reads keys from chunk {s}, before what this attention holds")
        out.append(sdpa(q[:, :, j * n : (j + 1) * n], k_all[:, :, ks:ke], v_all[:, :, ks:ke]))
    return torch.cat(out, dim=2)


@dataclass
class FullPrecisionKV:
    """The reference's K/V buffer: every chunk a forward writes is kept, per layer, in full precision (as the
    reference's pinned host buffer holds every chunk of the video); forwards read chunks ``0 .. cached-1``.

    ``device``: where stored chunks live (None: where they were computed); ``keep``: store at most this
    many of the most recent chunks per layer (None: all, the reference)."""

    device: torch.device | str | None = None
    keep: int | None = None
    chunks: dict[int, dict[int, tuple[Tensor, Tensor]]] = field(default_factory=dict)

    def __call__(self, layer: int, q: Tensor, k: Tensor, v: Tensor, plan: ChunkPlan) -> Tensor:
        n = plan.chunk_tokens
        stored = self.chunks.setdefault(layer, {})
        lowest = min((s for s, _ in plan.key_ranges), default=plan.cached)
        first = min(lowest, plan.cached)
        if plan.cached > first:
            missing = [c for c in range(first, plan.cached) if c not in stored]
            if missing:
                raise ValueError(f"layer {layer}: the plan reads finished chunks {missing} that were never written")
            past_k = torch.cat([stored[c][0].to(k.device) for c in range(first, plan.cached)], dim=2)
            past_v = torch.cat([stored[c][1].to(v.device) for c in range(first, plan.cached)], dim=2)
            k_all, v_all = torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2)
        else:
            k_all, v_all = k, v
        out = attend_ranges(q, k_all, v_all, plan, offset=first)
        for cur, absolute in plan.store:
            dev = self.device if self.device is not None else k.device
            stored[absolute] = (
                k[:, :, cur * n : (cur + 1) * n].detach().to(dev).clone(),
                v[:, :, cur * n : (cur + 1) * n].detach().to(dev).clone(),
            )
        if self.keep is not None:
            for c in sorted(stored)[: max(0, len(stored) - self.keep)]:
                del stored[c]
        return out

    def clear(self) -> None:
        self.chunks.clear()

    @property
    def nbytes(self) -> int:
        return sum(
            k.numel() * k.element_size() + v.numel() * v.element_size()
            for d in self.chunks.values()
            for k, v in d.values()
        )


def no_cache(layer: int, q: Tensor, k: Tensor, v: Tensor, plan: ChunkPlan) -> Tensor:
    """Attention without a K/V buffer: the plan may read only the current chunks."""
    if plan.cached:
        raise ValueError(f"the plan reads {plan.cached} finished chunks but no K/V buffer was given")
    return attend_ranges(q, k, v, plan)
