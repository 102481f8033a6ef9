"""Context selection and RoPE renumbering (runtime/families/worldplay/model/context.py): hand-worked cases, and the reference's own
selection on a hand-made loop (tests/data/worldplay/context.json: HY-WorldPlay's ``select_aligned_memory_frames``
and ``calculate_fov_overlap_similarity`` with its points drawn after ``torch.manual_seed(1234)``)."""

from __future__ import annotations

import math

import pytest
import torch
from support.stored import stored_json

from runtime.families.worldplay.model.context import (
    CONTEXT_TIMESTEP,
    chunk_distance,
    fov_overlap,
    plan_chunk,
    select_context_frames,
    sphere_points,
)
from runtime.families.worldplay.model.trajectory import trajectory_from_json

REF = stored_json("worldplay", "context.json")


@pytest.fixture(scope="module")
def ref_points():
    return sphere_points(seed=REF["seed"])


@pytest.fixture(scope="module")
def loop():
    return trajectory_from_json(REF["pose_json"]).w2c


def test_seeded_points_are_the_references_draw(ref_points):
    """The same uniforms in the same order; sin / cos / pow may differ by a float32 ulp with the thread count
    (vectorised and scalar paths), so the sum over 150,000 coordinates agrees to 1e-4."""
    assert ref_points.shape == (50_000, 3) and ref_points.dtype == torch.float32
    torch.testing.assert_close(ref_points[:3], torch.tensor(REF["points_first"]), rtol=0, atol=1e-6)
    assert math.isclose(float(ref_points.double().sum()), REF["points_sum"], rel_tol=0, abs_tol=1e-4)
    assert torch.equal(sphere_points(seed=REF["seed"]), ref_points)
    assert not torch.equal(sphere_points(seed=REF["seed"] + 1), ref_points)


def test_points_fill_the_ball_uniformly(ref_points):
    """Uniform in a ball of radius 8: |p| <= 8, P(|p| < 8 / 2^(1/3)) = 1/2 (50,000 draws: 4.5 sigma = 0.01)."""
    r = ref_points.double().norm(dim=1)
    assert float(r.max()) <= 8.0
    assert abs(float((r < 8 / 2 ** (1 / 3)).double().mean()) - 0.5) < 0.01
    assert float(ref_points.double().mean(0).abs().max()) < 0.06


@pytest.mark.parametrize("pair", sorted(REF["overlaps"]))
def test_view_overlaps_match_the_reference(loop, ref_points, pair):
    a, b = (int(x) for x in pair.split(","))
    assert fov_overlap(loop[a], loop[b], ref_points) == pytest.approx(REF["overlaps"][pair], abs=1e-7)


def test_selections_match_the_reference_on_a_loop(loop, ref_points):
    """Every chunk of a 48-latent path that goes out, turns round twice and comes back: the best older chunk
    changes (chunks 6-10 take 4..7, chunk 11 takes 8..11)."""
    assert loop.shape[0] == REF["latents"] == 48
    got = {str(c): list(plan_chunk(loop, c, ref_points).context_frames) for c in range(1, 12)}
    assert got == REF["selections"]
    assert got["11"][4:8] == [8, 9, 10, 11] and got["10"][4:8] == [4, 5, 6, 7]


def eye_path(n: int) -> torch.Tensor:
    return torch.eye(4, dtype=torch.float64).expand(n, 4, 4).clone()


def test_overlap_hand_worked_cases():
    pts = sphere_points(n=20_000, seed=0)
    cam = torch.eye(4, dtype=torch.float64)
    assert fov_overlap(cam, cam, pts) == 1.0
    back = cam.clone()
    back[:3, :3] = torch.diag(torch.tensor([-1.0, 1.0, -1.0], dtype=torch.float64))  # facing -z, same place
    assert fov_overlap(cam, back, pts) == 0.0
    far = cam.clone()
    far[2, 3] = -20.0  # world-to-camera: this camera sits 20 units ahead along +z; it sees nothing of the ball
    assert fov_overlap(cam, far, pts) == 0.0
    # a camera 4 units behind, looking the same way, sees the whole view cone of the first (within 8 units)...
    behind = cam.clone()
    behind[2, 3] = 4.0
    ov = fov_overlap(cam, behind, pts)
    assert 0.0 < ov < 1.0
    # ...and the score is not symmetric: the share is of the first camera's view
    assert fov_overlap(behind, cam, pts) != ov


def test_early_chunks_take_every_earlier_frame():
    path = eye_path(40)
    pts = sphere_points(n=2_000, seed=0)
    for start in (4, 8, 16, 20):
        assert select_context_frames(path, start, pts) == list(range(start))


def test_a_late_chunk_takes_20_frames_and_ties_go_to_the_oldest_chunk():
    """All cameras identical: every older chunk overlaps fully (score 0); the first candidate, 4..7, wins."""
    path = eye_path(48)
    pts = sphere_points(n=2_000, seed=0)
    sel = select_context_frames(path, 36, pts)
    assert sel == [0, 1, 2, 3, 4, 5, 6, 7, *range(24, 36)]
    assert len(sel) == 20
    assert chunk_distance(path, [36, 37, 38, 39], 8, pts) == 0.0


def test_plans_renumber_rope_positions():
    path = eye_path(48)
    pts = sphere_points(n=2_000, seed=0)
    first = plan_chunk(path, 0, pts)
    assert first.context_frames == () and first.chunk_frames == (0, 1, 2, 3) and first.chunk_positions == (0, 1, 2, 3)
    second = plan_chunk(path, 2, pts)
    assert second.context_frames == tuple(range(8)) and second.context_positions == tuple(range(8))
    assert second.chunk_positions == (8, 9, 10, 11)
    late = plan_chunk(path, 9, pts)  # frames 0..7 and 24..35 sit at 0..19; the chunk (36..39) at 20..23
    assert late.context_frames == (0, 1, 2, 3, 4, 5, 6, 7, *range(24, 36))
    assert late.context_positions == tuple(range(20)) and late.chunk_positions == (20, 21, 22, 23)
    assert late.context_timestep == CONTEXT_TIMESTEP == 14.0


@pytest.mark.parametrize("n, chunk, match", [(46, 1, "chunks of 4"), (48, 12, "outside"), (48, -1, "outside")])
def test_bad_plans_are_named(n, chunk, match):
    with pytest.raises(ValueError, match=match):
        plan_chunk(eye_path(n), chunk, sphere_points(n=10, seed=0))


def test_bad_starts_and_counts_are_named():
    with pytest.raises(ValueError, match="outside the trajectory"):
        select_context_frames(eye_path(8), 8, sphere_points(n=10))
    with pytest.raises(ValueError, match="positive number of points"):
        sphere_points(n=0)


def _overlap_over_all_points(query, other, points):
    """The overlap as the reference computes it: both cameras tested on all the points."""
    from runtime.families.worldplay.model.context import VIEW_DISTANCE, _in_view, _pose_in

    q, o = query.double(), other.double()
    cq, fq = _pose_in(q, q)
    co, fo = _pose_in(q, o)
    pts = points.double() + cq
    seen_q = _in_view(pts, cq, fq, 60.0, 35.0)
    seen_o = _in_view(pts, co, fo, 60.0, 35.0) & (torch.linalg.norm(pts - co, dim=-1) < VIEW_DISTANCE)
    return 0.0 if int(seen_q.sum()) == 0 else float((seen_q & seen_o).sum()) / int(seen_q.sum())


def test_scoring_every_older_chunk_at_once_equals_the_references_pairwise_overlaps(loop, ref_points):
    """fov_overlaps tests each other camera on the query's in-view points only, for all of them at once; it equals
    the reference's pair by pair over all the points, and chunk_distances equals chunk_distance per chunk."""
    from runtime.families.worldplay.model.context import chunk_distances, fov_overlaps

    n = loop.shape[0]
    others = [loop[i] for i in range(0, n, 3)]
    for q in (n - 1, n // 2):
        got = fov_overlaps(loop[q], others, ref_points)
        want = [_overlap_over_all_points(loop[q], o, ref_points) for o in others]
        assert got == want
        assert any(0 < w < 1 for w in want), "a partial overlap among the pairs"
    queries, starts = list(range(n - 4, n)), list(range(4, n - 12, 4))
    assert starts, n

    def score(h):  # the reference's chunk distance, pair by pair over all the points
        pair = [
            (
                _overlap_over_all_points(loop[q], loop[h], ref_points),
                _overlap_over_all_points(loop[q], loop[h + 2], ref_points),
            )
            for q in queries
        ]
        return sum(((1.0 - a) + (1.0 - b)) / 2.0 for a, b in pair) / len(queries)

    assert chunk_distances(loop, queries, starts, ref_points) == [score(h) for h in starts]
