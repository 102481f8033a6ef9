"""Attention observer hook: what the Wan adapter shows diagnostics at every self-attention call.

An observer is any callable taking an :class:`AttentionEvent`. It runs inside the forward pass,
so it must be cheap and must ``clone()`` whatever tensors it keeps; it must not modify them.
``wants`` (optional) filters calls before an event is built: ``wants(layer, chunk, phase, step)``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from torch import Tensor

from ..jensen_core import ChunkCache

PHASE_DENOISE = "denoise"
PHASE_WRITE = "write"
BRANCH_NAMES = {0: "cond", 1: "uncond"}


@dataclass(frozen=True, eq=False)
class AttentionEvent:
    """One self-attention call of one layer for one CFG branch.

    ``q``, ``k``, ``v``: the current chunk's post-RoPE queries, keys and values, shape
    (batch, heads, tokens, head_dim), in the model's dtype. ``cache``: the branch's cache of this
    layer as the call read it (during the write phase the current chunk is appended *after* this
    event). ``out``: the attention output (before the output projection). ``last_chunks``: the call read
    only the newest n held chunks of ``cache`` (a per-chunk key range: MAGI-1), None: all of them.
    ``context``: (k_ctx, v_ctx), the tokens besides its own that the call attended in full precision
    (MAGI-1's chunks in flight), or None.
    """

    layer: int
    branch: int
    chunk: int
    frame_offset: int
    phase: str
    step: int
    q: Tensor
    k: Tensor
    v: Tensor
    cache: ChunkCache | None
    out: Tensor
    correction: str
    strength: float
    last_chunks: int | None = None
    context: tuple[Tensor, Tensor] | None = None


class AttentionObserver(Protocol):
    def __call__(self, event: AttentionEvent) -> None: ...


WantsFn = Callable[[int, int, str, int], bool]
