"""LingBot-World's window and sink (latent frames, the reference's ``--local_attn_size`` / ``--sink_size``) on a cache
that keeps and evicts whole entries, and the reference's own full-precision rolling cache.

The reference (robbyant/lingbot-world-v2 ``wan/modules/model_fast.py`` 80-167) keeps per layer a rolling buffer of
``local_attn_size`` latent frames of post-RoPE keys and values: the first ``sink_size`` frames for good, then the
newest frames, **the chunk being generated included**; every query of a chunk attends the whole buffer (no mask).
So while chunk ``c`` (frames ``f0 .. f0 + n - 1``) is made, it attends the sink and the
``local_attn_size - sink_size - n`` frames before it.

The pack's chunk cache keeps whole entries under one retention rule (sink entries for good, a window of the newest
entries). With the CLI's chunk of 4 and sink of 6 the sink is 1.5 chunks, so here a chunk is written as
``chunk / e`` entries of ``e`` frames, ``e = gcd(chunk, sink, local - sink - chunk)`` (2 for 4 / 6 / 18): a sink of
``sink / e`` entries and a window of ``(local - sink - chunk) / e`` entries keep exactly the frames the reference
attends (checked against :class:`ReferenceKV` in the tests). Nothing is re-quantized: an entry is quantized once,
when its chunk is written.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

#: the official run's ``--local_attn_size 18 --sink_size 6`` and ``--chunk_size`` 4
DEFAULT_LOCAL_ATTN = 18
DEFAULT_SINK = 6
DEFAULT_CHUNK = 4
#: the reference's RoPE table has 1024 time positions: no latent frame can be placed past it
MAX_LATENT_FRAMES = 1024


class CacheRule(NamedTuple):
    """What the pack's cache keeps for a window and sink in latent frames: entries of ``entry_frames`` frames, a
    ``window`` of the newest entries (0: every entry, the reference's global cache) and ``sink`` entries for good."""

    entry_frames: int
    window: int
    sink: int


def cache_rule(chunk_frames: int, local_attn_size: int, sink_size: int) -> CacheRule:
    """The entries, window and sink that hold what the reference attends. ``local_attn_size`` -1: the global cache
    (every frame, no sink). ValueError naming the value and the fix otherwise."""
    for name, v in (("chunk_frames", chunk_frames), ("local_attn_size", local_attn_size), ("sink_size", sink_size)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"{name}={v!r} must be a whole number of latent frames")
    if chunk_frames < 1:
        raise ValueError(f"chunk_frames={chunk_frames} must be at least 1 (the reference's {DEFAULT_CHUNK})")
    if local_attn_size == -1:
        if sink_size:
            raise ValueError(f"sink_size={sink_size} with local_attn_size -1 (every frame kept): set sink_size to 0")
        return CacheRule(chunk_frames, 0, 0)
    if sink_size < 0:
        raise ValueError(f"sink_size={sink_size} must be 0 or more latent frames (the reference's {DEFAULT_SINK})")
    rolling = local_attn_size - sink_size - chunk_frames
    if rolling < 1:
        raise ValueError(
            f"local_attn_size={local_attn_size} holds the sink ({sink_size}) and the chunk being made ({chunk_frames}) "
            f"but no earlier frame: give at least {sink_size + chunk_frames + 1} (the reference's {DEFAULT_LOCAL_ATTN}), "
            "or -1 to keep every frame"
        )
    entry = math.gcd(math.gcd(chunk_frames, sink_size), rolling)
    return CacheRule(entry, rolling // entry, sink_size // entry)


def attended_frames(chunk_start: int, chunk_frames: int, local_attn_size: int, sink_size: int) -> list[int]:
    """The earlier latent frames the reference's chunk starting at ``chunk_start`` attends (its own besides)."""
    if local_attn_size == -1:
        return list(range(chunk_start))
    first_rolling = chunk_start + chunk_frames - (local_attn_size - sink_size)
    return [j for j in range(chunk_start) if j < sink_size or j >= first_rolling]


class ReferenceKV:
    """The reference's rolling cache in full precision, as an attention callable ``(layer, q, k, v) -> out`` over
    ``(B, H, L, D)`` post-RoPE tensors: a call attends the earlier frames :func:`attended_frames` names and its own
    tokens (no mask); with :attr:`writing` its frames are kept (by frame, so the rule is the reference's own, not the
    pack's entries). Set :attr:`frame_offset` and :attr:`writing` before each call."""

    def __init__(self, local_attn_size: int, sink_size: int, tokens_per_frame: int):
        self.local, self.sink, self.per = int(local_attn_size), int(sink_size), int(tokens_per_frame)
        self.frame_offset = 0
        self.writing = False
        self.kv: dict[int, dict[int, tuple[Tensor, Tensor]]] = {}

    def clear(self) -> None:
        self.kv.clear()

    def __call__(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        frames = k.shape[2] // self.per
        held = self.kv.setdefault(layer, {})
        earlier = [j for j in attended_frames(self.frame_offset, frames, self.local, self.sink) if j in held]
        keys = torch.cat([held[j][0] for j in earlier] + [k], dim=2)
        values = torch.cat([held[j][1] for j in earlier] + [v], dim=2)
        out = F.scaled_dot_product_attention(q, keys, values)
        if self.writing:
            for i in range(frames):
                sl = slice(i * self.per, (i + 1) * self.per)
                held[self.frame_offset + i] = (k[:, :, sl].clone(), v[:, :, sl].clone())
        return out


__all__ = [
    "DEFAULT_CHUNK",
    "DEFAULT_LOCAL_ATTN",
    "DEFAULT_SINK",
    "MAX_LATENT_FRAMES",
    "CacheRule",
    "ReferenceKV",
    "attended_frames",
    "cache_rule",
]
