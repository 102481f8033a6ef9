"""LingBot-World 2.0 (runtime/families/lingbot) against the reference's own outputs on the same tiny weights
(tests/data/lingbot/, see its README): the schedule, the camera map, one forward with camera, and two 3-chunk
causal-fast rollouts (window 18 / sink 6, and 10 / 2, which evicts and keeps half a chunk as its sink), the pack's
full-precision path through its recipe and its cache.

Error model (docs/testing.md, "Stored numbers"): the reference ran in float32 on another CPU, with float64 where it
chose it (RoPE in complex128, the time sinusoid, x0); the pack runs float32 with core's float32 RoPE. The bound is
``jensen_testing.lingbot_tiny.reference_bound()``: ``rounding_bound(4, 1536, sinusoid=(1000, 256))`` (2 blocks plus the
camera MLP and the text embedding, reductions up to the camera embedding's 1536 inputs, the 256-wide sinusoid of
t <= 999), 4.8e-5 relative L2; measured 3.7e-7 (rollouts) and 4.3e-7 (forward) on the machine that made the data.
The camera poses and map are float64 here and float32 in the reference: ``rounding_bound(2, 64)`` (a chain of 4 x 4
products over the path), measured 1.1e-7 and 1.7e-7.
"""

from __future__ import annotations

import importlib
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from support import comfyui as support_comfyui

from jensen_testing import lingbot_tiny as lt
from jensen_testing.numerics import U32, assert_within_rounding, relative_error, rounding_bound

pytestmark = pytest.mark.numerics

DATA = Path(__file__).resolve().parents[1] / "data" / "lingbot" / "reference.safetensors"
FRAMES = 12


def pack_module(name: str):
    return importlib.import_module(f"{support_comfyui.PACK_MODULE}.{name}")


@pytest.fixture(scope="module")
def ref():
    return load_file(DATA)


@pytest.fixture(scope="module")
def model(pack):
    return lt.build_patcher(0)


def test_the_tiny_weights_are_those_the_reference_ran(ref):
    """The seeded weights (their first 4 values per tensor) equal the reference run's within 64 u of the largest."""
    sd = lt.tiny_state_dict()
    got = torch.cat([sd[k].flatten()[:4] for k in sorted(sd)])
    want = ref["weights_sample"]
    assert float((got - want).abs().max()) <= 64 * U32 * float(want.abs().max())


def test_the_inputs_and_the_schedule_are_the_reference_ones(pack, ref):
    poses, k = lt.pose_arrays(4 * (FRAMES - 1) + 1)
    assert torch.equal(poses, ref["poses"]) and torch.equal(k[:1], ref["intrinsics"])
    sched = pack_module("runtime.families.lingbot.model.schedule").dmd_schedule()
    assert list(sched.timesteps) == ref["timesteps"].tolist() == [999, 967, 908, 768]


def test_the_camera_map_is_the_reference_one(pack, ref):
    cam = pack_module("runtime.families.lingbot.model.camera")
    cmap = cam.CameraMap(lt.camera_path(FRAMES), FRAMES, *lt.LATENT_HW)
    bound = rounding_bound(2, 64)
    assert_within_rounding(cmap.poses, ref["latent_poses"].double(), bound, "latent poses")
    want = ref["camera_map_frames_1_11"]  # (1, 384, 2, 8, 8) -> the pack's token features of those frames
    for i, f in enumerate((1, 11)):
        m = want[0, :, i]  # (384, 8, 8)
        tokens = m.reshape(384, 4, 2, 4, 2).permute(1, 3, 0, 2, 4).reshape(16, 1536)
        assert_within_rounding(cmap.tokens(f, f + 1)[0], tokens, bound, f"camera features of frame {f}")


def test_a_forward_with_camera_is_the_reference_one(pack, model, ref):
    cm = pack_module("runtime.families.lingbot.comfy_model")
    window = pack_module("runtime.families.lingbot.model.window")
    cam = pack_module("runtime.families.lingbot.model.camera")
    cmap = cam.CameraMap(lt.camera_path(FRAMES), FRAMES, *lt.LATENT_HW)
    call = cm.LingBotCall(attention=window.ReferenceKV(18, 6, 16), frame_offset=0, camera=cmap.tokens(0, 4))
    x = torch.cat([ref["x_forward"], ref["y"][:, :, :4]], dim=1)
    with torch.no_grad():
        v = model.model.diffusion_model.forward_lingbot(x, torch.tensor([999.0]), ref["text"], call)
    assert_within_rounding(v[0], ref["forward_999"], lt.reference_bound(), "forward at t = 999 with camera")


@pytest.mark.parametrize("local,sink", [(18, 6), (10, 2)])
def test_the_rollout_through_the_pack_cache_is_the_reference_one(pack, model, ref, local, sink):
    """The recipe in full precision (no Quantize KV Cache: the cache stores the K/V as they are) over 3 chunks, its
    window and sink as 2-frame cache entries, equals the reference's whole run (its noise stream, re-noise, t = 0
    cache pass, rolling window)."""
    got = lt.sample(model, FRAMES, seed=7, progress=False, local_attn_size=local, sink_size=sink)
    assert got.report["cache_entry_frames"] == 2
    want = model.model.process_latent_out(ref[f"rollout_{local}_{sink}"][None])
    assert_within_rounding(got.samples, want, lt.reference_bound(), f"rollout window {local} sink {sink}")
    # the model-space latents too (the reference's own space)
    assert_within_rounding(
        model.model.process_latent_in(got.samples), ref[f"rollout_{local}_{sink}"][None], lt.reference_bound()
    )


def test_the_bound_tells_the_windows_apart(pack, model, ref):
    """The two stored rollouts differ far beyond the bound (the window decides the last chunk), and a sink of 0 in
    place of 2 misses the reference: the comparison sees what a wrong retention rule changes."""
    bound = lt.reference_bound().value
    assert relative_error(ref["rollout_10_2"], ref["rollout_18_6"]) > 100 * bound
    wrong = lt.sample(model, FRAMES, seed=7, progress=False, local_attn_size=10, sink_size=0)
    err = relative_error(model.model.process_latent_in(wrong.samples), ref["rollout_10_2"][None])
    assert err > 10 * bound and math.isfinite(err)
