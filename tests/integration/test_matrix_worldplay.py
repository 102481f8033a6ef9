"""The combination matrix for HY-WorldPlay (issue 43): what its sampler refuses, and the running cells.

Refusals: every schedule or option HY-WorldPlay's sampler refuses is refused before any model call (the DiT's
``forward`` and ComfyUI's ``sample_custom`` are counted), with a message that names the value; one test each.

Running cells (``tests/support/matrix.py``'s HY-WorldPlay row, 7 chunks: chunk 6 is the first to select its
context): each checked against a computation that does not use the pack's output of the same run - every chunk's
context by the reference's rule written here (:func:`reference_context`: its own points after
``torch.manual_seed(seed)``, its own view test, frames h and h + 2, ties to the oldest), the planner's bytes counted
by hand from those contexts and each chunk's bits, the raw K/V of the re-encode quantized at the chunk's bits, and in
full precision the model's own calls with the reference's full-precision memory over the test's contexts
(``jensen_testing.worldplay_tiny.plain_rollout(contexts=...)``). Two camera paths are built so that a wrong rule
shows: one revisits chunk 6's view at a candidate's frame h + 2 and another's h + 3, one makes two candidates tie in
expectation so that the seed's points decide; :func:`test_the_paths_reach_the_rule_where_a_bug_would_show` checks
that power on the rule itself.
"""

from __future__ import annotations

import pytest
import torch
from support.comfyui import pack_module

from jensen_testing import worldplay_tiny as wt

pytestmark = pytest.mark.hunyuan15


@pytest.fixture(scope="module")
def model(pack):
    return wt.build_patcher(0)


@pytest.fixture
def calls(model, monkeypatch):
    """Every forward of the HY-WorldPlay DiT and every sampler call in this test."""
    import comfy.sample

    seen: list[str] = []
    dm_cls = type(model.model.diffusion_model)
    forward, sample_custom = dm_cls.forward, comfy.sample.sample_custom

    def counting_forward(self, *a, **k):
        seen.append("forward")
        return forward(self, *a, **k)

    def counting_sample(*a, **k):
        seen.append("sample_custom")
        return sample_custom(*a, **k)

    monkeypatch.setattr(dm_cls, "forward", counting_forward)
    monkeypatch.setattr(comfy.sample, "sample_custom", counting_sample)
    return seen


def request(worldplay, model, frames=8, *, path=None, positive=None, latent=None, sigmas=None, seed=0, **options):
    import comfy.samplers

    return worldplay.WorldPlayRequest.from_options(
        model,
        positive or wt.conditioning(1, max(frames, 4)),
        latent or wt.latent(frames),
        wt.trajectory(path or max(frames, 4)),
        seed,
        comfy.samplers.sampler_object("euler"),
        wt.worldplay_sigmas() if sigmas is None else sigmas,
        progress=False,
        **options,
    )


# ------------------------------------------------------------------------------------------------ refusals
#: (id, request keywords, a regex naming the value)
REFUSALS = [
    ("window_chunks", dict(window_chunks=3), r"window_chunks=3.*set both to 0"),
    ("sink_chunks", dict(sink_chunks=2), r"sink_chunks=2.*set both to 0"),
    ("negative_window", dict(window_chunks=-1), r"window_chunks=-1"),
    ("cfg_2", dict(cfg=2.0), r"cfg=2\.0"),
    ("chunk_frames_2", dict(chunk_frames=2), r"chunk_frames=2"),
    ("first_chunk_frames", dict(first_chunk_frames=1), r"first_chunk_frames=1"),
    ("keep_state", dict(keep_state=True), r"no cache to hand on"),
    ("prefix", dict(prefix={"samples": torch.zeros(1, 32, 4, 4, 6)}), r"prefix clip"),
    ("frames_not_whole_chunks", dict(frames=6, path=8), r"latent has 6 latent frames.*multiple of 4"),
    ("zero_frames", dict(frames=0, path=4), r"latent has 0 latent frames"),
    ("video_longer_than_its_path", dict(frames=12, path=8), r"12 latent frames but the trajectory only 8 poses"),
    ("video_one_chunk_longer_than_its_path", dict(frames=8, path=4), r"8 latent frames but the trajectory only 4"),
    ("one_sigma", dict(sigmas=torch.tensor([1.0])), r"SIGMAS must be a 1-D schedule"),
    ("nan_sigmas", dict(sigmas=torch.tensor([1.0, float("nan"), 0.0])), r"NaN or Inf.*nan"),
    ("noise_of_another_shape", dict(noise=torch.zeros(1, 32, 4, 4, 6)), r"noise \(1, 32, 4, 4, 6\)"),
    ("noise_mask", dict(latent={"samples": torch.zeros(1, 32, 8, 4, 6), "noise_mask": torch.ones(1)}), "noise_mask"),
    ("a_prompt_schedule", dict(positive=wt.conditioning(1, 8) + wt.conditioning(2, 8)), r"has 2 entries"),
]


@pytest.mark.parametrize("kw,match", [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS])
def test_a_refused_option_names_its_value_before_any_model_call(worldplay, model, calls, kw, match):
    with pytest.raises(ValueError, match=match):
        worldplay.run(request(worldplay, model, **kw))
    assert calls == [], "refused after the model ran"


def test_the_counters_count_a_run_that_is_not_refused(worldplay, model, calls):
    """The positive control: the same counters see a run that goes (2 chunks: 2 x 4 steps and one re-encode)."""
    worldplay.run(request(worldplay, model, 8))
    assert calls.count("sample_custom") == 3 and calls.count("forward") >= 9


# ------------------------------------------------------------------------------------------------ running cells
import functools  # noqa: E402
import math  # noqa: E402
from dataclasses import replace  # noqa: E402

from support import matrix as mx  # noqa: E402

TABLE = mx.WORLDPLAY
SEVEN = 28  # 7 chunks of 4 latent frames: chunk 6 (frames 24-27) is the first whose context is selected
AWAY = 180.0  # a yaw that sees nothing of chunk 6's view (yaw 0)
#: camera paths: the yaw of every latent frame in degrees (None: the tiny path), and the run's seed
PATHS = {
    "tiny": (None, 5),
    # chunk 1's frame 6 (its h + 2) and chunk 2's frame 11 (its h + 3) look where chunk 6 looks: the rule takes chunk 1
    "revisit": ([0.0] * 4 + [AWAY, AWAY, 0.0, AWAY] + [AWAY, AWAY, AWAY, 0.0] + [AWAY] * 12 + [0.0] * 4, 3),
    # chunk 1's frame 6 at +20 degrees, chunk 2's frame 10 at -20: mirror images, the seed's points decide (seed 0's
    # take chunk 2, seed 7's chunk 1)
    "tie": ([0.0] * 4 + [AWAY, AWAY, 20.0, AWAY] + [AWAY, AWAY, -20.0, AWAY] + [AWAY] * 12 + [0.0] * 4, 7),
}
INT2 = ("2", "2", "16", "none", "fp8_e4m3", 0)
QUAROT = ("2", "2", "16", "hadamard", "fp8_e4m3", 0)
#: column -> (quantize node args or None, correction, tiers, latent height x width, camera path)
COLUMNS = {
    "fp": (None, None, False, wt.LATENT_HW, "tiny"),
    "rtn": (INT2, ("taylor", 1.0), False, wt.LATENT_HW, "tiny"),
    "quarot": (QUAROT, ("chunk_mean", 0.5), False, wt.LATENT_HW, "tiny"),
    "qvg": (QUAROT + ("qvg", 1, 16), ("exact", 1.0), False, wt.LATENT_HW, "tiny"),
    "qvg_auto": (QUAROT + ("qvg", 1, 0), ("per_channel", 1.0), False, wt.LATENT_HW, "tiny"),
    "tiers": (QUAROT, ("taylor", 1.0), True, wt.LATENT_HW, "tiny"),
    "odd_size": (INT2, ("taylor", 0.5), False, (5, 7), "tiny"),
    "revisit": (QUAROT, ("taylor", 1.0), True, wt.LATENT_HW, "revisit"),
    "tie": (None, None, False, wt.LATENT_HW, "tie"),
    "window_sink": (None, None, False, wt.LATENT_HW, "tiny"),
}
TIERS = dict(recent_chunks_bits="4", recent_chunks=1, sink_bits="8", recent_chunks_key_bits="8")


def yaw_path(yaws):
    """A camera path that only turns (yaw in degrees per latent frame), through the pack's pose checks."""
    trajectory = pack_module("runtime.families.worldplay.model.trajectory")
    c2w = torch.eye(4, dtype=torch.float64).repeat(len(yaws), 1, 1)
    for i, deg in enumerate(yaws):
        a = math.radians(deg)
        c2w[i, 0, 0], c2w[i, 0, 2], c2w[i, 2, 0], c2w[i, 2, 2] = math.cos(a), math.sin(a), -math.sin(a), math.cos(a)
    k = torch.tensor(trajectory.DEFAULT_K, dtype=torch.float64).expand(len(yaws), 3, 3)
    return trajectory.trajectory_from_poses(c2w, k, "matrix path")


def path_of(name):
    yaws, _ = PATHS[name]
    return wt.trajectory(SEVEN) if yaws is None else yaw_path(yaws)


# ---- the reference's context rule, written here (select_aligned_memory_frames; docs/worldplay.md)
def reference_points(seed: int, n: int = 50_000, radius: float = 8.0) -> torch.Tensor:
    """The reference's 50,000 points after ``torch.manual_seed(seed)``: radius 8 u^(1/3), azimuth 2 pi u', polar angle
    acos(1 - 2 u''), drawn from torch's global generator in that order (restored afterwards)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        r = radius * torch.rand(n) ** (1 / 3)
        phi = 2 * math.pi * torch.rand(n)
        theta = torch.acos(1 - 2 * torch.rand(n))
    xyz = (r * torch.sin(theta) * torch.cos(phi), r * torch.sin(theta) * torch.sin(phi), r * torch.cos(theta))
    return torch.stack(xyz, 1).double()


def _angles(v):
    x, y, z = v[..., 0], v[..., 1], v[..., 2]
    return torch.rad2deg(torch.atan2(x, z)), torch.rad2deg(torch.atan2(y, torch.sqrt(x * x + z * z)))


def _sees(points, center, forward):
    """A 60 x 35 degree view: azimuth and elevation from the camera within 30 / 17.5 degrees of its axis'."""
    az, el = _angles(points - center)
    yaw, pitch = _angles(forward)
    return ((az - yaw + 180) % 360 - 180).abs().lt(30) & ((el - pitch + 180) % 360 - 180).abs().lt(17.5)


@functools.lru_cache(maxsize=16)
def path_contexts(name: str) -> tuple[tuple[int, ...], ...]:
    """Every chunk's context frames of path ``name`` at its seed, by :func:`reference_context` (once per path)."""
    path, seed = path_of(name), PATHS[name][1]
    return tuple(tuple(reference_context(path.c2w, c, seed)) for c in range(SEVEN // 4))


def reference_context(c2w: torch.Tensor, chunk: int, seed: int) -> list[int]:
    """Chunk ``chunk``'s context frames by the reference's rule: every earlier frame while they are at most 20; else
    chunk 0, the last 12 frames, and the older chunk h (4, 8, ... before them) with the lowest mean over the new
    chunk's frames q of (2 - overlap(q, h) - overlap(q, h + 2)) / 2 (ties: the oldest). overlap(q, f): the share of
    the points around camera q in its view that camera f (in q's frame) sees within 8 units."""
    start = 4 * chunk
    if start <= 20:
        return list(range(start))
    points = reference_points(seed)
    zero, axis = torch.zeros(3, dtype=torch.float64), torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64)
    mine = {}
    for q in range(start, start + 4):
        mine[q] = points[_sees(points, zero, axis)]  # the points are offsets in camera q's own frame
    candidates = list(range(4, start - 12, 4))

    def overlap(q, f):
        rel = torch.linalg.inv(c2w[q]) @ c2w[f]  # camera f's camera-to-world, with camera q as the world
        center, forward = rel[:3, 3], rel[:3, 2]
        seen = _sees(mine[q], center, forward) & ((mine[q] - center).norm(dim=-1) < 8)
        return float(seen.sum()) / max(1, len(mine[q]))

    score = {h: sum(2 - overlap(q, h) - overlap(q, h + 2) for q in mine) / 8 for h in candidates}
    best = min(candidates, key=lambda h: (score[h], h))
    return sorted(set(range(4)) | set(range(best, best + 4)) | set(range(start - 12, start)))


def test_the_paths_reach_the_rule_where_a_bug_would_show():
    """The paths' power, on the rule written above: the revisit path's choice is chunk 1 by frame h + 2 (chunk 2 by
    h + 3), and the tie path's choice depends on the seed (seed 7's points take chunk 1, seed 0's chunk 2)."""
    revisit, tie = yaw_path(PATHS["revisit"][0]).c2w, yaw_path(PATHS["tie"][0]).c2w
    assert reference_context(revisit, 6, 3)[4:8] == [4, 5, 6, 7]
    assert reference_context(tie, 6, 7)[4:8] == [4, 5, 6, 7]
    assert reference_context(tie, 6, 0)[4:8] == [8, 9, 10, 11]


#: older chunks that see none of chunk 6's view: every candidate scores 1, an exact tie (the oldest wins)
BLIND = [0.0] * 4 + [AWAY] * 20 + [0.0] * 4


@pytest.mark.parametrize("name,seed", [("tiny", 5), ("revisit", 3), ("tie", 7), ("tie", 0), ("blind", 0)])
def test_the_family_selection_is_the_reference_rule(name, seed):
    """Without a run: the family's selection (the context module the recipe calls) on each path == the rule written
    here, chunk by chunk; the blind path ties exactly and takes the oldest candidate."""
    context = pack_module("runtime.families.worldplay.model.context")
    path = yaw_path(BLIND) if name == "blind" else path_of(name)
    points = context.sphere_points(seed=seed)
    got = [list(context.plan_chunk(path.w2c, c, points).context_frames) for c in range(SEVEN // 4)]
    want = [reference_context(path.c2w, c, seed) for c in range(SEVEN // 4)]
    assert got == want, (name, seed, got[-1], want[-1])
    if name == "blind":
        assert want[-1][4:8] == [4, 5, 6, 7]


class Spy:
    """Cache layers 0 and 1 (block 0's two streams): the raw K/V of the last re-encode (by context chunk) and the
    entries the last read of the run saw."""

    def __init__(self):
        self.writes: dict[int, dict[int, tuple[torch.Tensor, torch.Tensor]]] = {0: {}, 1: {}}
        self.entries: dict[int, list] = {0: [], 1: []}

    def wants(self, layer, chunk, phase, step):
        return layer in (0, 1)

    def __call__(self, e):
        if e.phase == "write":
            if e.frame_offset == 0:  # a new context: the cache was emptied before this re-encode
                self.writes[e.layer] = {}
            self.writes[e.layer][e.chunk] = (e.k.detach().clone(), e.v.detach().clone())
        elif e.cache is not None:
            self.entries[e.layer] = list(e.cache.entries)


def _bits(held: int, base: int, newest: int) -> list[int]:
    return [newest if i == held - 1 else base for i in range(held)]


@pytest.mark.parametrize("cell", [pytest.param(c, id=c.id) for c in TABLE.cells()])
def test_worldplay_cell(cell, worldplay, model, nodes, jk, memory_requests):
    quant, correction, tiers, hw, name = COLUMNS[cell.column]
    path, seed = path_of(name), PATHS[name][1]
    if cell.status == "refused":
        with pytest.raises(ValueError, match=cell.detail):
            wt.sample(model, SEVEN, seed=seed, path=path, progress=False, window_chunks=2, sink_chunks=1)
        return
    m = model
    if quant is not None:
        m = nodes.JensenKVQuantizeKVCache.execute(m, *quant, **(TIERS if tiers else {})).args[0]
        m = nodes.JensenKVBiasCorrection.execute(m, *correction).args[0]
    spy = Spy()
    noise = wt.video_noise(SEVEN, 11, hw=hw)
    result = wt.sample(m, SEVEN, seed=seed, noise=noise, path=path, hw=hw, progress=False, observer=spy)
    rep = result.report
    # the context of every chunk, by the reference's rule written here (the run's seed, frames h and h + 2)
    contexts = [list(f) for f in path_contexts(name)]
    assert [list(p.context_frames) for p in result.plans] == contexts, cell.id
    # the planner's bytes by hand: the largest context (in chunks of 4 frames), each chunk at its bits, 4 layers
    config = pack_module("runtime.config").get_config(m.model_options)
    spec_k = None if config is None else config.spec_k
    spec_v = None if config is None else config.spec_v
    held = max(len(f) for f in contexts) // 4
    if tiers:
        bits_k, bits_v = _bits(held, 2, 8), _bits(held, 2, 4)
    else:
        bits_k = bits_v = [None if spec_k is None else spec_k.bits] * held

    def at(spec, bits):
        return None if spec is None else replace(spec, bits=bits)

    tokens = 4 * hw[0] * hw[1]
    cache = pack_module("jensen_core.cache")
    one_layer = sum(
        cache.chunk_bytes(at(spec_k, bk), at(spec_v, bv), wt.TINY.heads, tokens, wt.TINY.head_dim, full_bytes=4)
        for bk, bv in zip(bits_k, bits_v)
    )
    assert held == 5 and rep["planned_bytes"] == 2 * wt.TINY.depth * one_layer, (rep["planned_bytes"], one_layer)
    # the session's request comes first (then ComfyUI's own per sample_custom, for the model's inference)
    assert memory_requests[0] == rep["planned_bytes"], memory_requests
    assert rep["memory_request"]["bytes"] == rep["planned_bytes"] == rep["cache_bytes"] > 0
    if quant is None:  # the samples against the model's own calls with full-precision memory over those contexts
        want = wt.plain_rollout(model, SEVEN, noise, seed=seed, path=path, contexts=contexts)
        err = float((result.samples - want).norm() / want.norm())
        assert err < 2e-6, (cell.id, err)  # measured 2e-7 on the tiny path
        return
    assert rep["correction"] == correction[0]
    last = contexts[-1]
    for layer in (0, 1):  # both streams of block 0
        entries, writes = spy.entries[layer], spy.writes[layer]
        assert sorted(writes) == sorted({f // 4 for f in last}) and len(entries) == held, (layer, sorted(writes))
        assert [e.k.spec.bits for e in entries] == bits_k and [e.v.spec.bits for e in entries] == bits_v
        for entry, c in zip(entries, sorted(writes)):
            first = (8, 4) if tiers else None
            _check_stored(jk, entry, writes[c], spec_k, cell.column, first)


def _check_stored(jk, entry, raw, spec, column, first_bits):
    """A held chunk against its raw K/V: quantized at its bits bit for bit (QVG: within its residual's Delta/2;
    a tier demoted from its first bits: within both forms' Delta/2)."""
    g = spec.group_size
    for i, (stored, x) in enumerate(((entry.k, raw[0]), (entry.v, raw[1]))):
        s = replace(spec, bits=stored.spec.bits)
        if column.startswith("qvg"):
            err = (stored.dequantize(dtype=torch.float32, rotated=True) - jk.rotate(x.float(), spec.seed)).abs()
            assert bool((err <= stored.step_sizes().repeat_interleave(g, -1) / 2 * 1.001 + 1e-5).all()), column
            continue
        exact = jk.quantize(x, s)
        if first_bits is None or stored.spec.bits == first_bits[i]:  # never demoted: bit for bit
            assert torch.equal(stored.packed, exact.packed), (column, i)
            assert torch.equal(stored.scale, exact.scale) and torch.equal(stored.minimum, exact.minimum)
        else:
            first = jk.quantize(x, replace(spec, bits=first_bits[i]))
            err = (stored.dequantize(dtype=torch.float32, rotated=True) - jk.rotate(x.float(), spec.seed)).abs()
            steps = stored.step_sizes().repeat_interleave(g, -1) + first.step_sizes().repeat_interleave(g, -1)
            assert bool((err <= steps / 2 * 1.001 + 1e-5).all()), (column, i)
