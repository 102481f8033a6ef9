"""Which finished chunks a cache keeps: the first ``sink_chunks`` for good, the last ``window_chunks`` rolling.

One rule for everything that follows a cache: :class:`~jensen_core.cache.ChunkCache` (its quantized
K/V), the chunk loop's clean latents of the retained chunks, the diagnostics' full-precision shadow
of the cached K/V, the planner's projected sizes and the checks of a saved run state.

Chunks are counted in the order they were appended, from 0. After ``n`` appends the cache holds
chunks ``0 .. min(sink, n) - 1`` (the attention sink, as Self-Forcing's ``sink_size`` and
LongLive's frame sink) and, of the rest, the last ``window_chunks`` (every one without a window),
oldest first: at most ``sink + window`` chunks. Eviction drops whole chunks, the oldest of the
window first; a sink chunk is never evicted.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, MutableSequence
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Retention:
    """The sink + window rule: ``window_chunks`` None or 0 keeps every chunk (stored as None);
    ``sink_chunks`` (0 = no sink) matters only with a window."""

    window_chunks: int | None = None
    sink_chunks: int = 0

    def __post_init__(self) -> None:
        w, s = self.window_chunks, self.sink_chunks
        if w is not None and (isinstance(w, bool) or not isinstance(w, int) or w < 0):
            raise ValueError(f"window_chunks={w!r} must be a non-negative integer (0 or None keeps every chunk)")
        if isinstance(s, bool) or not isinstance(s, int) or s < 0:
            raise ValueError(f"sink_chunks={s!r} must be a non-negative integer (0 = no attention sink)")
        object.__setattr__(self, "window_chunks", w or None)

    @classmethod
    def from_local_attention(cls, local_attn_size: int, sink_size: int, chunk_frames: int) -> Retention:
        """The rule that keeps what LongLive's / Self-Forcing's ``local_attn_size`` and ``sink_size`` (latent frames)
        let a block of ``chunk_frames`` frames attend to; ``local_attn_size`` -1 (global attention) keeps every chunk.

        LongLive (NVlabs/LongLive 2462895) sizes the KV cache ``local_attn_size`` frames
        (``pipeline/causal_inference.py`` 110-118) and its attention ``max_attention_size = local_attn_size *
        frame_seqlen`` (``wan/modules/causal_model.py`` 88, ``pipeline/causal_inference.py`` 285-295); a block
        attends to the first ``sink_size`` frames plus the last ``max_attention_size - sink_tokens`` tokens up to
        and including its own (``causal_model.py`` 321-336), and the rolling cache evicts the oldest frames after
        the sink (231-257). So ``local_attn_size`` counts the sink and the current block:
        ``local_attn_size = (sink_chunks + window_chunks + 1) * chunk_frames``, ``sink_size = sink_chunks *
        chunk_frames``. LongLive 1.0 (``configs/longlive_inference.yaml``: 12, 3, ``num_frame_per_block`` 3) is
        ``Retention(window_chunks=2, sink_chunks=1)``.

        Refused (ValueError): sizes that are not whole chunks, and a ``local_attn_size`` that leaves no earlier
        chunk besides the sink (a window of 0 here means no window)."""
        for name, v in (("local_attn_size", local_attn_size), ("sink_size", sink_size), ("chunk_frames", chunk_frames)):
            if isinstance(v, bool) or not isinstance(v, int):
                raise ValueError(f"{name}={v!r} must be an integer number of latent frames")
        if chunk_frames < 1:
            raise ValueError(f"chunk_frames={chunk_frames} must be at least 1")
        if local_attn_size == -1:
            return cls()
        for name, v in (("local_attn_size", local_attn_size), ("sink_size", sink_size)):
            if v < 0 or v % chunk_frames:
                raise ValueError(
                    f"{name}={v} latent frames is not a whole number of {chunk_frames}-frame chunks; the cache "
                    "keeps and evicts whole chunks"
                )
        window = (local_attn_size - sink_size) // chunk_frames - 1
        if window < 1:
            raise ValueError(
                f"local_attn_size={local_attn_size} leaves no earlier chunk besides the sink ({sink_size} frames) and "
                f"the current {chunk_frames}-frame chunk: it must be at least sink_size + 2 x chunk_frames = "
                f"{sink_size + 2 * chunk_frames}"
            )
        return cls(window_chunks=window, sink_chunks=sink_size // chunk_frames)

    @property
    def bounded(self) -> bool:
        """Whether chunks are ever evicted (a window is set)."""
        return self.window_chunks is not None

    @property
    def capacity(self) -> int | None:
        """The most chunks ever held (``sink + window``), or None without a window."""
        return None if self.window_chunks is None else self.sink_chunks + self.window_chunks

    def sink_held(self, appended: int) -> int:
        """How many sink chunks are held after ``appended`` appends."""
        return min(self.sink_chunks, _count(appended))

    def count(self, appended: int) -> int:
        """How many chunks are held after ``appended`` appends (never fewer after more appends)."""
        sink = self.sink_held(appended)
        rest = appended - sink
        return sink + (rest if self.window_chunks is None else min(rest, self.window_chunks))

    def indices(self, appended: int) -> list[int]:
        """The chunks held after ``appended`` appends (chunk 0 appended first), oldest first."""
        sink = self.sink_held(appended)
        kept = self.count(appended) - sink
        return list(range(sink)) + list(range(appended - kept, appended))

    def push(self, items: MutableSequence[T], item: T, sink_held: int) -> tuple[int, int]:
        """Append ``item`` to ``items`` (oldest first, its first ``sink_held`` the sink) and evict what the rule drops.

        Returns ``(sink_held, evicted)``: how many of ``items`` are sink chunks now, and how many
        were dropped (the oldest chunks of the window, never the sink).
        """
        items.append(item)
        if sink_held < self.sink_chunks:
            return sink_held + 1, 0
        evicted = 0
        while self.window_chunks is not None and len(items) - sink_held > self.window_chunks:
            del items[sink_held]
            evicted += 1
        return sink_held, evicted


def _count(appended: int) -> int:
    if isinstance(appended, bool) or not isinstance(appended, int) or appended < 0:
        raise ValueError(f"appended={appended!r} must be a non-negative number of chunks")
    return appended


class Retained(Generic[T]):
    """One item per retained chunk (latents, K/V copies, ...), oldest first, kept under a :class:`Retention`.

    ``items`` given at construction are what an earlier run retained; ``sink_held`` says how many
    of them are sink chunks (all of them up to ``sink_chunks`` when not given).
    """

    def __init__(self, rule: Retention, items: Iterable[T] = (), sink_held: int | None = None):
        if not isinstance(rule, Retention):
            raise TypeError(f"rule must be a Retention, got {type(rule).__name__}")
        self.rule = rule
        self.items: list[T] = list(items)
        held = min(rule.sink_chunks, len(self.items)) if sink_held is None else sink_held
        if (
            isinstance(held, bool)
            or not isinstance(held, int)
            or not 0 <= held <= min(rule.sink_chunks, len(self.items))
        ):
            raise ValueError(
                f"sink_held={held!r} must be from 0 to {min(rule.sink_chunks, len(self.items))} "
                f"({len(self.items)} items under sink_chunks={rule.sink_chunks})"
            )
        self.sink_held = held

    def add(self, item: T) -> int:
        """Keep ``item`` as the newest chunk; returns how many chunks the rule evicted."""
        self.sink_held, evicted = self.rule.push(self.items, item, self.sink_held)
        return evicted

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self) -> Iterator[T]:
        return iter(self.items)
