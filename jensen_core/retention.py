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
