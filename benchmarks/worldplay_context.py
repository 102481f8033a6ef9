"""HY-WorldPlay's context selection per chunk as the video grows: the pack's (each query camera's in-view points
found once, every older chunk tested on those) against the reference's pair by pair over all 50,000 points.

    python benchmarks/worldplay_context.py            # chunks at latent frames 32 .. 252 (about 30 s)

A chunk of 4 latent frames starting at latent frame ``c > 20`` scores every older chunk before the last 3 (the
reference's ``select_aligned_memory_frames``): 2 overlaps per candidate and query frame, so the work grows with the
video in both; what changes is the cost of one. The trajectory is a seeded random walk of 256 latent frames (about
1,000 video frames). Process CPU time, one torch thread, the median of 3 rounds; both give the same frames (checked).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

import torch  # noqa: E402

from runtime.families.worldplay.model import context as ctx  # noqa: E402


def walk(n: int = 256, seed: int = 0) -> torch.Tensor:
    """``n`` world-to-camera matrices of a camera turning slowly while it moves forward and sideways."""
    g = torch.Generator().manual_seed(seed)
    yaw = torch.cumsum(torch.randn(n, generator=g, dtype=torch.float64) * 0.1, 0)
    w2c = torch.eye(4, dtype=torch.float64).repeat(n, 1, 1)
    w2c[:, 0, 0], w2c[:, 0, 2], w2c[:, 2, 0], w2c[:, 2, 2] = yaw.cos(), -yaw.sin(), yaw.sin(), yaw.cos()
    w2c[:, 0, 3], w2c[:, 2, 3] = 0.05 * torch.arange(n), 0.1 * torch.arange(n)
    return w2c


def pairwise_overlap(query, other, points) -> float:
    """The reference's overlap: both cameras tested on all the points."""
    q, o = query.double(), other.double()
    cq, fq = ctx._pose_in(q, q)
    co, fo = ctx._pose_in(q, o)
    pts = points.double() + cq
    seen_q = ctx._in_view(pts, cq, fq, ctx.FOV_H_DEG, ctx.FOV_V_DEG)
    seen_o = ctx._in_view(pts, co, fo, ctx.FOV_H_DEG, ctx.FOV_V_DEG) & (
        torch.linalg.norm(pts - co, dim=-1) < ctx.VIEW_DISTANCE
    )
    count = int(seen_q.sum())
    return 0.0 if count == 0 else float((seen_q & seen_o).sum()) / count


def pairwise_scores(w2c, start, points) -> list[float]:
    queries = range(start, start + ctx.CHUNK_LATENTS)
    return [
        sum(
            ((1 - pairwise_overlap(w2c[q], w2c[h], points)) + (1 - pairwise_overlap(w2c[q], w2c[h + 2], points))) / 2
            for q in queries
        )
        / ctx.CHUNK_LATENTS
        for h in range(ctx.CHUNK_LATENTS, start - ctx.RECENT_FRAMES, ctx.CHUNK_LATENTS)
    ]


def main() -> int:
    torch.set_num_threads(1)
    w2c, points = walk(), ctx.sphere_points(seed=0)
    print("| chunk starts at latent frame | older chunks scored | pack ms | pairwise ms | pairwise / pack |")
    print("|---|---|---|---|---|")
    for start in (32, 64, 128, 192, 252):
        queries = list(range(start, start + ctx.CHUNK_LATENTS))
        starts = list(range(ctx.CHUNK_LATENTS, start - ctx.RECENT_FRAMES, ctx.CHUNK_LATENTS))
        pack, pair = [], []
        for _ in range(3):
            t0 = time.process_time()
            got = ctx.chunk_distances(w2c, queries, starts, points)
            t1 = time.process_time()
            want = pairwise_scores(w2c, start, points)
            t2 = time.process_time()
            pack.append(t1 - t0)
            pair.append(t2 - t1)
        assert got == want, "the two paths must score every chunk the same"
        a, b = statistics.median(pack), statistics.median(pair)
        print(f"| {start} | {len(starts)} | {1000 * a:.0f} | {1000 * b:.0f} | {b / a:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
