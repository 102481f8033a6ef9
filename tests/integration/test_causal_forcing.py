"""Causal Forcing, frame-wise, on a tiny Wan (thu-ml/Causal-Forcing, ``num_frame_per_block: 1``).

- ``chunk_frames`` 1: every chunk is one latent frame, the window counts frames, the cache holds one frame's
  tokens per chunk, and every model call equals one block-causal full forward with blocks of one frame;
- Causal Forcing++ 2-step / 1-step: the first block takes its own 4-step list (``denoising_step_list_first_chunk``),
  the others the preset's (``first_chunk_sigmas``); a continued run's first chunk is not the video's;
- a first block of another length (``independent_first_frame``: blocks of 1, k, k, ...): ``first_chunk_frames``,
  against the same reference, continued from a saved cache as one long run, and what is refused.
"""

from __future__ import annotations

import importlib

import pytest
import torch
from support import reference, wan_tiny

TOKENS_PER_FRAME = 16  # the tiny latent is 8 x 8: (8 / 2) x (8 / 2) patches per latent frame
PER_FRAME_BYTES = 2 * 2 * 2 * TOKENS_PER_FRAME * 32 * 4  # layers x (k, v) x heads x tokens x head_dim x fp32


@pytest.fixture(scope="module")
def sched(pack):
    return importlib.import_module("comfyui_jensen_kv.runtime.schedules")


@pytest.fixture(scope="module")
def lcm(comfy):
    import comfy.samplers

    return comfy.samplers.sampler_object("lcm")  # predict x0, re-noise with fresh noise: the reference's step


class CacheShapes:
    """An observer: the token count of every cached chunk each chunk's first denoising step read (layer 0)."""

    def __init__(self):
        self.seen: dict[int, list[int]] = {}

    def wants(self, layer, chunk, phase, step):
        return layer == 0 and phase == "denoise" and step == 0

    def __call__(self, e):
        self.seen[e.chunk] = [entry.tokens for entry in e.cache.entries] if e.cache is not None else []


def _run(loop, model, frames, sigmas, sampler, **kw):
    pos, neg = wan_tiny.conditioning(1, 13, 32), wan_tiny.conditioning(2, 13, 32)
    return loop.run_chunked_ar(
        model, pos, neg, wan_tiny.video_latent(frames), seed=7, cfg=1.0, sampler=sampler, sigmas=sigmas, **kw
    )


def _recorded(tiny):
    import comfy.patcher_extension

    rec = reference.DiffusionModelRecorder()
    m = tiny.clone()
    m.add_wrapper_with_key(comfy.patcher_extension.WrappersMP.DIFFUSION_MODEL, "test_recorder", rec)
    return m, rec


def _check_against_block_causal(dm, calls, steps_per_chunk, window=None):
    """Walk the recorded calls (each chunk: its denoising calls, then its cache write unless it is the last) and
    compare every denoising call with one block-causal forward over the written chunks plus the current one."""
    writes, i, worst = [], 0, 0.0
    for c, steps in enumerate(steps_per_chunk):
        for call in calls[i : i + steps]:
            frames = [w["x"] for w in writes] + [call["x"]]
            ts = [torch.zeros_like(call["t"]) for _ in writes] + [call["t"]]
            ref = reference.block_causal_forward(dm, frames, ts, call["context"], window=window)
            start = sum(f.shape[2] for f in frames[:-1])
            torch.testing.assert_close(call["out"], ref[:, :, start:], atol=1e-5, rtol=1e-5)
            worst = max(worst, float((call["out"] - ref[:, :, start:]).abs().max()))
        i += steps
        if c < len(steps_per_chunk) - 1:
            writes.append(calls[i])
            i += 1
    assert i == len(calls), "every recorded call was a denoising step or a cache write"
    return writes


# ------------------------------------------------------------------------------------------------ frame-wise
def test_framewise_run_matches_block_causal_forward_with_one_frame_blocks(loop, tiny, lcm, sched):
    """Causal Forcing++ 2-step, frame-wise: chunk_frames 1, a window of 2 chunks (= 2 frames), the first frame on the
    4-step list. Every model call equals the reference's block-causal forward; the cache holds one frame per chunk."""
    m, rec = _recorded(tiny)
    shapes = CacheShapes()
    first = sched.first_chunk_sigmas("causal_forcing_framewise_2step")
    res = _run(
        loop,
        m,
        5,
        sched.ar_sigmas("causal_forcing_framewise_2step"),
        lcm,
        chunk_frames=1,
        window_chunks=2,
        first_chunk_sigmas=first,
        observer=shapes,
        progress=False,
    )
    assert res.report["chunks"] == 5
    # the first frame takes the 4-step list, the others 2 steps, at the reference's timesteps (t = 1000 sigma)
    steps = [4, 2, 2, 2, 2]
    assert len(rec.calls) == sum(steps) + 4  # + one cache write per chunk but the last
    ts = [round(float(call["t"][0]), 1) for call in rec.calls]
    assert ts[:5] == [1000.0, 937.5, 833.3, 625.0, 0.0]  # frame 0's four steps, then its cache write at t = 0
    assert ts[5:8] == [1000.0, 833.3, 0.0]  # frame 1: two steps, then its write
    writes = _check_against_block_causal(tiny.model.diffusion_model, rec.calls, steps, window=2)
    assert all(w["x"].shape[2] == 1 for w in writes)  # every cache write is one latent frame
    # the cache holds one frame's tokens per chunk, at most window_chunks of them
    assert shapes.seen == {
        0: [],
        1: [TOKENS_PER_FRAME],
        2: [TOKENS_PER_FRAME] * 2,
        3: [TOKENS_PER_FRAME] * 2,
        4: [TOKENS_PER_FRAME] * 2,
    }
    # the planner's projection for chunk_frames 1 is what the run held: 2 chunks of one frame
    assert res.report["cache_bytes"] == 2 * PER_FRAME_BYTES == res.report["planned_bytes"]


def test_the_block_causal_check_sees_a_wrong_window(loop, tiny, euler, sched):
    """Negative control: the same comparison against a window of 3 frames fails (the window is in frames here)."""
    m, rec = _recorded(tiny)
    _run(loop, m, 5, sched.ar_sigmas("causal_forcing_framewise_1step"), euler, chunk_frames=1, window_chunks=2)
    with pytest.raises(AssertionError):
        _check_against_block_causal(tiny.model.diffusion_model, rec.calls, [1] * 5, window=3)


def test_first_chunk_sigmas_only_shape_the_first_chunk_of_a_video(loop, tiny, lcm, sched):
    """Continuing a saved frame-wise run equals one long run: its first chunk is the video's frame 2, not frame 0,
    so it takes the preset's steps, not the first frame's."""
    sigmas = sched.ar_sigmas("causal_forcing_framewise_1step")
    first = sched.first_chunk_sigmas("causal_forcing_framewise_1step")
    opts = dict(chunk_frames=1, window_chunks=2, first_chunk_sigmas=first, progress=False)
    whole = _run(loop, tiny, 4, sigmas, lcm, **opts).samples
    head = _run(loop, tiny, 2, sigmas, lcm, keep_state=True, **opts)
    m, rec = _recorded(tiny)
    tail = _run(loop, m, 2, sigmas, lcm, resume=head.state, **opts)
    assert torch.equal(head.samples, whole[:, :, :2]) and torch.equal(tail.samples, whole[:, :, 2:])
    assert len(rec.calls) == 1 + 1 + 1  # frame 2: one step + its write, frame 3: one step
    # and the first chunk's schedule does reach the sampler: without it frame 0 differs (sigmas.clone() drops the
    # schedule the preset carries); with the preset's SIGMAS alone it is the same
    plain = _run(loop, tiny, 2, sigmas.clone(), lcm, chunk_frames=1, window_chunks=2, progress=False).samples
    assert (plain[:, :, :1] - whole[:, :, :1]).abs().max() > 1e-3
    carried = _run(loop, tiny, 2, sigmas, lcm, chunk_frames=1, window_chunks=2, progress=False).samples
    assert torch.equal(carried, whole[:, :, :2])


# ------------------------------------------------------------------------------------------------ first block length
def test_independent_first_frame_layout_matches_block_causal_forward(loop, tiny, euler):
    """first_chunk_frames 1 with chunk_frames 2 on 5 frames: blocks of 1, 2, 2, as Self-Forcing's
    independent_first_frame gives (pipeline/causal_inference.py: ``all_num_frames = [1] + all_num_frames``)."""
    import comfy.samplers

    m, rec = _recorded(tiny)
    shapes = CacheShapes()
    sigmas = comfy.samplers.calculate_sigmas(tiny.get_model_object("model_sampling"), "simple", 2)
    res = _run(loop, m, 5, sigmas, euler, chunk_frames=2, first_chunk_frames=1, observer=shapes, progress=False)
    assert res.report["chunks"] == 3
    writes = _check_against_block_causal(tiny.model.diffusion_model, rec.calls, [2, 2, 2])
    assert [w["x"].shape[2] for w in writes] == [1, 2]
    assert shapes.seen == {0: [], 1: [TOKENS_PER_FRAME], 2: [TOKENS_PER_FRAME, 2 * TOKENS_PER_FRAME]}
    assert res.report["cache_bytes"] == 3 * PER_FRAME_BYTES <= res.report["planned_bytes"]  # the plan is a bound
    # blocks of 1, 2, 1: three chunks where chunks of 2 make two; the plan still bounds what the run holds
    res = _run(loop, tiny, 4, sigmas, euler, chunk_frames=2, first_chunk_frames=1, progress=False)
    assert res.report["chunks"] == 3 and res.report["cache_bytes"] == 3 * PER_FRAME_BYTES <= res.report["planned_bytes"]


def test_independent_first_frame_continues_and_extends_as_one_long_run(loop, tiny, euler):
    import comfy.samplers

    sigmas = comfy.samplers.calculate_sigmas(tiny.get_model_object("model_sampling"), "simple", 2)
    opts = dict(chunk_frames=2, first_chunk_frames=1, window_chunks=2, progress=False)
    whole = _run(loop, tiny, 7, sigmas, euler, **opts).samples  # blocks 1, 2, 2, 2
    head = _run(loop, tiny, 3, sigmas, euler, keep_state=True, **opts)  # blocks 1, 2
    assert (head.state.next_chunk, head.state.next_frame) == (2, 3)
    tail = _run(loop, tiny, 4, sigmas, euler, resume=head.state, **opts)  # blocks 2, 2 (the first one is done)
    assert torch.equal(head.samples, whole[:, :, :3]) and torch.equal(tail.samples, whole[:, :, 3:])
    # a prefix clip is cut the same way (1, 2), so extending the first 3 frames writes the cache the run had
    ext = _run(loop, tiny, 4, sigmas, euler, prefix={"samples": whole[:, :, :3]}, include_prefix=False, **opts)
    torch.testing.assert_close(ext.samples, whole[:, :, 3:], atol=1e-5, rtol=1e-5)
    # the layout matters: blocks of 2, 2, 2, 1 give another video
    other = _run(loop, tiny, 7, sigmas, euler, chunk_frames=2, window_chunks=2, progress=False).samples
    assert (other - whole).abs().max() > 1e-3


def test_chunk_plan_bounds(loop):
    plan = loop.ChunkPlan(7, 3, first_chunk_frames=1)
    assert plan.bounds() == [(0, 1), (1, 4), (4, 7)] and plan.chunks == 3
    assert loop.ChunkPlan(21, 1).bounds() == [(f, f + 1) for f in range(21)]  # frame-wise: 21 blocks of 1
    assert loop.ChunkPlan(8, 3).bounds() == [(0, 3), (3, 6), (6, 8)]  # unchanged without it
    assert loop.ChunkPlan(1, 3, first_chunk_frames=1).bounds() == [(0, 1)]
    assert loop.ChunkPlan(2, 3, first_chunk_frames=2).chunks == 1


def test_bad_first_chunk_options_are_refused_with_the_fix(loop, tiny, euler, sched):
    sigmas = sched.ar_sigmas("causal_forcing_framewise_4step")
    with pytest.raises(ValueError, match="first_chunk_frames=4 is longer than chunk_frames=3.*independent first"):
        _run(loop, tiny, 6, sigmas, euler, chunk_frames=3, first_chunk_frames=4, progress=False)
    with pytest.raises(ValueError, match="first_chunk_frames=-1 must be 0"):
        _run(loop, tiny, 6, sigmas, euler, chunk_frames=3, first_chunk_frames=-1, progress=False)
    with pytest.raises(ValueError, match="first_chunk_sigmas must be a 1-D schedule.*leave it unconnected"):
        _run(loop, tiny, 2, sigmas, euler, chunk_frames=1, first_chunk_sigmas=torch.tensor([1.0]), progress=False)
    with pytest.raises(ValueError, match="first_chunk_sigmas.*nan"):
        _run(loop, tiny, 2, sigmas, euler, chunk_frames=1, first_chunk_sigmas=torch.tensor([float("nan"), 0.0]))


# ------------------------------------------------------------------------------------------------ nodes
def test_schedule_and_sampler_nodes_carry_the_first_chunk_options(loop, nodes, tiny, lcm):
    """AR Video Schedule's causal_forcing_framewise_2step + a causal_forcing_framewise_4step schedule on the sampler's
    first_chunk_sigmas, first_chunk_frames on the sampler: the node runs what the loop runs with them."""
    sched_out = nodes.JensenKVARSchedule.execute("causal_forcing_framewise_2step")
    sigmas = sched_out.args[0]
    text = sched_out.ui.as_dict()["text"][0]
    assert "first_chunk_sigmas" in text and "4 steps" in text
    first = nodes.JensenKVARSchedule.execute("causal_forcing_framewise_4step").args[0]
    inputs = dict(
        positive=wan_tiny.conditioning(1, 13, 32),
        negative=wan_tiny.conditioning(2, 13, 32),
        latent=wan_tiny.video_latent(3),
        seed=7,
        cfg=1.0,
        sampler=lcm,
        sigmas=sigmas,
        chunk_frames=1,
        window_chunks=2,
        context_noise=0.0,
    )
    got = nodes.JensenKVChunkedARSampler.execute(tiny, **inputs, first_chunk_sigmas=first).args[0]["samples"]
    want = _run(loop, tiny, 3, sigmas, lcm, chunk_frames=1, window_chunks=2, first_chunk_sigmas=first, progress=False)
    assert torch.equal(got, want.samples)
    # first_chunk_sigmas unconnected: the 2-step preset's SIGMAS carry the first frame's 4 steps (the old default
    # ran the first frame on 2 steps, silently)
    carried, report = nodes.JensenKVChunkedARSampler.execute(tiny, **inputs).args[:2]
    assert torch.equal(carried["samples"], got)
    assert "4 steps, carried by the SIGMAS' preset" in loop.report_text(report)
    # the same values without it (SplitSigmas, a manual list, a copy): the first frame on 2 steps, said loudly
    lost = {**inputs, "sigmas": sigmas.clone()}
    plain, report = nodes.JensenKVChunkedARSampler.execute(tiny, **lost).args[:2]
    assert (plain["samples"] - got).abs().max() > 1e-3
    assert "WARNING" in loop.report_text(report) and "causal_forcing_framewise_2step" in report["recipe_notes"][0]
    inputs.update(chunk_frames=2)
    got = nodes.JensenKVChunkedARSampler.execute(tiny, **inputs, first_chunk_frames=1).args[1]
    assert got["chunks"] == 2  # blocks of 1 and 2
    schema = {i.id: i for i in nodes.JensenKVChunkedARSampler.define_schema().inputs}
    assert schema["first_chunk_sigmas"].optional and schema["first_chunk_frames"].optional
    assert schema["first_chunk_frames"].default == 0 and schema["first_chunk_frames"].as_dict()["advanced"] is True


def test_quantized_framewise_run_with_diagnostics_and_a_longer_first_schedule(loop, nodes, tiny, lcm, sched):
    """INT2 + Jensen on frame-wise chunks (16 tokens each), KV Cache Diagnostics over every step: the first frame's
    4 steps are all sampled though the other frames take 1."""
    m = nodes.JensenKVQuantizeKVCache.execute(tiny, "2", "2", "16", "hadamard", "fp8_e4m3", 0).args[0]
    m = nodes.JensenKVBiasCorrection.execute(m, "taylor", 1.0).args[0]
    m = nodes.JensenKVDiagnostics.execute(m, "all", "all", "all", 1).args[0]
    sigmas = sched.ar_sigmas("causal_forcing_framewise_1step")
    first = sched.first_chunk_sigmas("causal_forcing_framewise_1step")
    res = _run(loop, m, 4, sigmas, lcm, chunk_frames=1, first_chunk_sigmas=first, progress=False)
    assert torch.isfinite(res.samples).all() and res.report["chunks"] == 4
    diag = res.report["diagnostics"]
    assert diag["steps"] == [0, 1, 2, 3] and diag["calls"] > 0


def test_the_ksampler_node_takes_the_first_chunk_steps_and_frames(loop, nodes, tiny):
    """The KSampler-style node could not give Causal Forcing++'s first frame its own schedule: first_chunk_steps
    runs the video's first chunk on KSampler's sigmas for that many steps (4 with lcm, simple and shift 5 are the
    reference's t = 1000, 937.5, 833.3, 625), first_chunk_frames cuts it as on the plain sampler."""
    import comfy.samplers

    ks = importlib.import_module("comfyui_jensen_kv.nodes.chunked_ar_ksampler")
    inputs = dict(
        positive=wan_tiny.conditioning(1, 13, 32),
        negative=wan_tiny.conditioning(2, 13, 32),
        latent=wan_tiny.video_latent(3),
        seed=7,
        steps=2,
        cfg=1.0,
        sampler_name="lcm",
        scheduler="simple",
        chunk_frames=1,
        window_chunks=0,
        context_noise=0.0,
    )
    got = nodes.JensenKVChunkedARKSampler.execute(tiny, **inputs, first_chunk_steps=4).args[0]["samples"]
    two, four = (ks.ksampler_sigmas(tiny, n, "lcm", "simple") for n in (2, 4))
    want = _run(
        loop, tiny, 3, two, comfy.samplers.sampler_object("lcm"), chunk_frames=1, first_chunk_sigmas=four,
        progress=False,
    ).samples  # fmt: skip
    assert torch.equal(got, want)
    plain = nodes.JensenKVChunkedARKSampler.execute(tiny, **inputs).args[0]["samples"]
    assert (plain[:, :, :1] - got[:, :, :1]).abs().max() > 1e-3  # without it the first frame takes 2 steps
    report = nodes.JensenKVChunkedARKSampler.execute(tiny, **{**inputs, "chunk_frames": 2}, first_chunk_frames=1).args[
        1
    ]
    assert report["chunks"] == 2  # blocks of 1 and 2
