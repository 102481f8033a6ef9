"""Which past latent frames HY-WorldPlay re-encodes as context before each chunk, and where RoPE puts them.

WorldPlay's "reconstituted context memory" (the reference's ``select_aligned_memory_frames``, called
by its AR rollout before every chunk but the first), for chunks of 4 latent frames starting at
latent frame ``c``:

- ``c <= 20``: every earlier frame, ``0 .. c - 1``;
- otherwise 20 frames: the last 12 (``c - 12 .. c - 1``, the last 3 chunks), the first chunk
  (``0 .. 3``) and the one older chunk whose cameras overlap the new chunk's views most. A candidate
  chunk starting at ``h`` (``h = 4, 8, ...`` before ``c - 12``) is scored by the mean, over the new
  chunk's frames ``q``, of ``1 - overlap(q, h)`` and ``1 - overlap(q, h + 2)`` averaged; the lowest
  score wins (ties: the oldest).

``overlap(q, h)`` is the share of sample points inside camera ``q``'s view that camera ``h`` also sees
(its view and within 8 units of it), Monte Carlo over points drawn uniformly in a ball of radius 8
around camera ``q``. A camera "sees" a point when the point's azimuth and elevation from the camera,
``atan2(x, z)`` and ``atan2(y, sqrt(x^2 + z^2))``, lie within 30 and 17.5 degrees (a 60 x 35 degree
view) of the camera's forward axis' own azimuth and elevation; everything is measured in camera
``q``'s frame. The reference draws its 50,000 points once per video from torch's global random
generator, unseeded; here :func:`sphere_points` draws them from a seeded generator (the same draw
as the reference's after ``torch.manual_seed(seed)``), so a selection is reproducible.

The selected frames are re-encoded in one forward at ``t = 14`` (of 1000) with their RoPE time
positions renumbered ``0 .. N - 1`` in frame order, and the chunk being generated sits at
``N .. N + 3`` (:class:`ContextPlan`). Pure torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

CHUNK_LATENTS = 4
#: latent frames of context at most, and how many of them are the most recent
MEMORY_FRAMES = 20
RECENT_FRAMES = 12
#: the Monte Carlo points of the view overlap: how many, in a ball of which radius
SPHERE_POINTS = 50_000
SPHERE_RADIUS = 8.0
#: the view of the overlap score (degrees, full angles) and how far a camera sees
FOV_H_DEG = 60.0
FOV_V_DEG = 35.0
VIEW_DISTANCE = 8.0
#: the timestep (of 1000) the context is re-encoded at (the reference's ``stabilization_level - 1``)
CONTEXT_TIMESTEP = 14.0

_DEG = 180 / math.pi


def sphere_points(n: int = SPHERE_POINTS, radius: float = SPHERE_RADIUS, seed: int = 0) -> Tensor:
    """``n`` points uniform in a ball of ``radius`` around the origin, ``(n, 3)`` float32, from ``seed``.

    Radius ``radius * u^(1/3)``, azimuth ``2 pi u'``, polar angle ``acos(1 - 2 u'')`` with ``u``, ``u'``,
    ``u''`` uniform, drawn in that order (the reference's order, so its points after
    ``torch.manual_seed(seed)`` are these)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n={n!r} must be a positive number of points")
    g = torch.Generator(device="cpu").manual_seed(int(seed))
    r = radius * torch.pow(torch.rand(n, generator=g), 1 / 3)
    phi = 2 * math.pi * torch.rand(n, generator=g)
    theta = torch.acos(1 - 2 * torch.rand(n, generator=g))
    return torch.stack(
        (r * torch.sin(theta) * torch.cos(phi), r * torch.sin(theta) * torch.sin(phi), r * torch.cos(theta)), 1
    )


def _angles(v: Tensor) -> tuple[Tensor, Tensor]:
    """(azimuth, elevation) in degrees of directions ``(..., 3)``: ``atan2(x, z)``, ``atan2(y, sqrt(x^2 + z^2))``."""
    x, y, z = v[..., 0], v[..., 1], v[..., 2]
    return torch.atan2(x, z) * _DEG, torch.atan2(y, torch.sqrt(x**2 + z**2)) * _DEG


def _wrap(deg: Tensor) -> Tensor:
    return torch.remainder(deg + 180, 360) - 180


def _in_view(points: Tensor, center: Tensor, forward: Tensor, fov_h: float, fov_v: float) -> Tensor:
    az, el = _angles(points - center)
    yaw, pitch = _angles(forward)
    return (_wrap(az - yaw).abs() < fov_h / 2) & (_wrap(el - pitch).abs() < fov_v / 2)


def _pose_in(frame_w2c: Tensor, w2c: Tensor) -> tuple[Tensor, Tensor]:
    """Center and forward axis of the camera ``w2c`` in the camera frame of ``frame_w2c``."""
    rel = torch.linalg.inv(frame_w2c @ torch.linalg.inv(w2c))  # world-to-camera with the frame camera as world
    r, t = rel[:3, :3], rel[:3, 3]
    return -r.T @ t, r.T[:, 2]


def fov_overlaps(
    w2c_query: Tensor,
    w2c_others: Sequence[Tensor],
    points: Tensor,
    fov_h: float = FOV_H_DEG,
    fov_v: float = FOV_V_DEG,
    distance: float = VIEW_DISTANCE,
) -> list[float]:
    """:func:`fov_overlap` of camera ``query`` with each of ``others``: the query camera's points in view found once,
    and each other camera tested on those points only (the share counts nothing else), so scoring every older chunk
    costs a small fraction of testing all the points against every camera."""
    q = torch.as_tensor(w2c_query, dtype=torch.float64)
    cq, fq = _pose_in(q, q)
    pts = points.to(torch.float64) + cq
    seen_q = _in_view(pts, cq, fq, fov_h, fov_v)
    count = int(seen_q.sum())
    if count == 0:
        return [0.0] * len(w2c_others)
    mine = pts[seen_q]
    out = []
    for other in w2c_others:
        co, fo = _pose_in(q, torch.as_tensor(other, dtype=torch.float64))
        seen_o = _in_view(mine, co, fo, fov_h, fov_v) & (torch.linalg.norm(mine - co, dim=-1) < distance)
        out.append(float(seen_o.sum()) / count)
    return out


def fov_overlap(
    w2c_query: Tensor,
    w2c_other: Tensor,
    points: Tensor,
    fov_h: float = FOV_H_DEG,
    fov_v: float = FOV_V_DEG,
    distance: float = VIEW_DISTANCE,
) -> float:
    """Share of the points in camera ``query``'s view that camera ``other`` sees too (0 when none is in view).

    ``points`` ``(n, 3)`` are offsets around the query camera, in its frame."""
    return fov_overlaps(w2c_query, [w2c_other], points, fov_h, fov_v, distance)[0]


def chunk_distances(w2c: Tensor, query_frames: Sequence[int], starts: Sequence[int], points: Tensor) -> list[float]:
    """The reference's score (:func:`chunk_distance`) of each older chunk starting at ``starts``: each query frame's
    view found once for all of them."""
    totals = [0.0] * len(starts)
    for q in query_frames:
        both = fov_overlaps(w2c[q], [w2c[f] for h in starts for f in (h, h + 2)], points)
        for i in range(len(starts)):
            totals[i] += ((1.0 - both[2 * i]) + (1.0 - both[2 * i + 1])) / 2.0
    return [total / len(query_frames) for total in totals]


def chunk_distance(w2c: Tensor, query_frames: Sequence[int], start: int, points: Tensor) -> float:
    """The reference's score of the older chunk starting at ``start`` for the new chunk's ``query_frames``: the mean
    over the query frames of ``1 - overlap`` with the chunk's frames ``start`` and ``start + 2``, averaged."""
    return chunk_distances(w2c, query_frames, [start], points)[0]


def select_context_frames(
    w2c: Tensor,
    start: int,
    points: Tensor,
    memory_frames: int = MEMORY_FRAMES,
    recent_frames: int = RECENT_FRAMES,
) -> list[int]:
    """The context frames (sorted) for the chunk whose first latent frame is ``start``; ``w2c`` ``(n, 4, 4)``."""
    n = w2c.shape[0]
    if start < 0 or start >= n:
        raise ValueError(f"chunk start {start} lies outside the trajectory's {n} latent frames")
    if start <= memory_frames:
        return list(range(start))
    recent = list(range(max(0, start - recent_frames), start))
    queries = list(range(start, min(start + CHUNK_LATENTS, n)))
    candidates = list(range(CHUNK_LATENTS, start - recent_frames, CHUNK_LATENTS))
    scored = list(zip(candidates, chunk_distances(w2c, queries, candidates, points)))
    scored.sort(key=lambda item: item[1])  # stable: equal scores keep the older chunk first
    memory = list(range(CHUNK_LATENTS))
    for h, _ in scored:
        if len(memory) >= memory_frames - recent_frames:
            break
        if h not in memory:
            memory.extend(range(h, h + CHUNK_LATENTS))
    return sorted(set(recent) | set(memory))


@dataclass(frozen=True)
class ContextPlan:
    """What one chunk's call sees: ``context_frames`` (absolute latent indices, sorted) re-encoded at RoPE time
    positions ``0 .. N - 1``, then the chunk's own ``chunk_frames`` at ``N .. N + 3``."""

    chunk_index: int
    chunk_frames: tuple[int, ...]
    context_frames: tuple[int, ...]

    @property
    def context_positions(self) -> tuple[int, ...]:
        return tuple(range(len(self.context_frames)))

    @property
    def chunk_positions(self) -> tuple[int, ...]:
        n = len(self.context_frames)
        return tuple(range(n, n + len(self.chunk_frames)))

    @property
    def context_timestep(self) -> float:
        return CONTEXT_TIMESTEP


def plan_chunk(w2c: Tensor, chunk_index: int, points: Tensor) -> ContextPlan:
    """The :class:`ContextPlan` of chunk ``chunk_index`` (chunks of 4 latent frames) of the trajectory ``w2c``."""
    n = w2c.shape[0]
    if n % CHUNK_LATENTS:
        raise ValueError(f"a trajectory of {n} latent frames does not split into chunks of {CHUNK_LATENTS}")
    if not 0 <= chunk_index < n // CHUNK_LATENTS:
        raise ValueError(f"chunk_index {chunk_index} lies outside the trajectory's {n // CHUNK_LATENTS} chunks")
    start = chunk_index * CHUNK_LATENTS
    own = tuple(range(start, start + CHUNK_LATENTS))
    frames = select_context_frames(w2c, start, points) if chunk_index else []
    return ContextPlan(chunk_index, own, tuple(f for f in frames if f not in own))


__all__ = [
    "CONTEXT_TIMESTEP",
    "ContextPlan",
    "MEMORY_FRAMES",
    "RECENT_FRAMES",
    "chunk_distance",
    "chunk_distances",
    "fov_overlap",
    "fov_overlaps",
    "plan_chunk",
    "select_context_frames",
    "sphere_points",
]
