"""The HY-WorldPlay nodes: Load HY-WorldPlay (a tiny checkpoint in models/diffusion_models; hunyuan15), HY-WorldPlay
Trajectory and its preview (any ComfyUI), HY-WorldPlay AR Sampler (hunyuan15)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from jensen_testing.worldplay_tiny import TINY, tiny_state_dict

EXPECTED = {
    "JensenKVLoadWorldPlay": ("Load HY-WorldPlay", ["unet_name", "weight_dtype"], ["MODEL"]),
    "JensenKVWorldPlayTrajectory": (
        "HY-WorldPlay Trajectory",
        ["pose", "latents"],
        ["WORLDPLAY_TRAJECTORY", "INT", "STRING"],
    ),
    "JensenKVWorldPlayTrajectoryPreview": ("HY-WorldPlay Trajectory Preview", ["trajectory", "size"], ["IMAGE"]),
    "JensenKVWorldPlayARSampler": (
        "HY-WorldPlay AR Sampler",
        ["model", "positive", "latent", "trajectory", "seed", "sampler", "sigmas"],
        ["LATENT", "JENSEN_KV_REPORT"],
    ),
}


def _schema(node_cls):
    s = node_cls.define_schema()
    s.finalize()
    return s


def test_the_worldplay_nodes_are_registered_with_tooltips(nodes):
    found = {n.define_schema().node_id: n for n in nodes.FAMILY_NODES["worldplay"]}
    assert set(found) == set(EXPECTED)
    for node_id, (display, inputs, outputs) in EXPECTED.items():
        s = _schema(found[node_id])
        assert s.display_name == display and s.category == "jensen_kv"
        assert [i.id for i in s.inputs] == inputs and [o.io_type for o in s.outputs] == outputs
        assert all(i.tooltip and len(i.tooltip) > 20 for i in s.inputs), node_id
    listed = {n.define_schema().node_id for n in _all_nodes(nodes)}
    assert set(EXPECTED) <= listed


def _all_nodes(nodes):
    import asyncio

    return asyncio.run(nodes.JensenKVExtension().get_node_list())


def test_trajectory_node_checks_the_path_and_gives_its_length(nodes):
    node = nodes.worldplay.JensenKVWorldPlayTrajectory
    out = node.execute("w-31, right-8", 0)
    trajectory, length, info = out.args
    assert (trajectory.latents, length) == (40, 157) and "40 latent frames (157 video frames" in info
    assert trajectory.actions[:2].tolist() == [0, 9] and trajectory.actions[-1] == 1
    msg = node.validate_inputs(pose="w-30", latents=0)
    assert isinstance(msg, str) and "32 (125 frames: add 1)" in msg
    assert node.validate_inputs(pose=None, latents=0) is True  # linked: checked at run time
    poses = {
        str(i): {
            "extrinsic": [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0.08 * i], [0, 0, 0, 1]],
            "K": [[969.7, 0, 960], [0, 969.7, 540], [0, 0, 1]],
        }
        for i in range(33)
    }
    assert "set latents to 32" in node.validate_inputs(pose=json.dumps(poses), latents=0)
    assert node.execute(json.dumps(poses), 32).args[1] == 125


def test_preview_node_gives_an_image(nodes):
    trajectory = nodes.worldplay.JensenKVWorldPlayTrajectory.execute("w-15, right-16", 0).args[0]
    out = nodes.worldplay.JensenKVWorldPlayTrajectoryPreview.execute(trajectory, 192)
    (image,) = out.args
    assert image.shape == (1, 192, 192, 3) and float(image.max()) <= 1.0
    with pytest.raises(ValueError, match="must come from HY-WorldPlay Trajectory"):
        nodes.worldplay.JensenKVWorldPlayTrajectoryPreview.execute("w-3", 192)


@pytest.mark.hunyuan15
def test_load_node_loads_a_checkpoint_from_diffusion_models(nodes, tmp_path):
    import folder_paths

    folder = tmp_path / "diffusion_models"
    folder.mkdir()
    path = folder / "hy_worldplay_tiny.safetensors"
    save_file(tiny_state_dict(TINY), str(path))
    folder_paths.add_model_folder_path("diffusion_models", str(folder))
    node = nodes.worldplay.JensenKVLoadWorldPlay
    assert "hy_worldplay_tiny.safetensors" in _schema(node).inputs[0].options
    before = node.fingerprint_inputs("hy_worldplay_tiny.safetensors", "default")
    out = node.execute("hy_worldplay_tiny.safetensors", "default")
    (model,) = out.args
    assert len(model.model.diffusion_model.double_blocks) == 2
    assert model.model.model_config.sampling_settings["shift"] == 5.0
    save_file(tiny_state_dict(TINY, seed=1), str(path))
    assert node.fingerprint_inputs("hy_worldplay_tiny.safetensors", "default") != before
    assert "diffusion_models" in node.validate_inputs(unet_name="(no file in models/diffusion_models)")
    assert "'x' is not in ComfyUI's models/diffusion_models" in node.validate_inputs(unet_name="x")
    assert node.validate_inputs(unet_name="hy_worldplay_tiny.safetensors") is True
    bad = folder / "plain.safetensors"
    save_file({"blocks.0.self_attn.q.weight": torch.zeros(2, 2)}, str(bad))
    with pytest.raises(ValueError, match="not a HunyuanVideo 1.5 / HY-WorldPlay transformer"):
        node.execute("plain.safetensors", "default")


@pytest.mark.hunyuan15
def test_sampler_node_runs_int2_jensen_and_without_patch_nodes_full_precision(nodes):
    """HY-WorldPlay AR Sampler on the tiny model, from the Trajectory node's path: a LATENT of the video's shape, the
    report on the output and in the UI; with Quantize KV Cache + Jensen the cache is INT2 and corrected, without them
    full precision (the A/B baseline), and the two videos differ."""
    import comfy.samplers

    from jensen_testing import worldplay_tiny as wt

    model = wt.build_patcher(0)
    trajectory, length, _ = nodes.worldplay.JensenKVWorldPlayTrajectory.execute("w-3, right-4", 0).args
    assert length == 29
    positive = wt.conditioning(1, 8)
    latent = {**wt.latent(8), "downscale_ratio_spacial": 16}
    sampler = comfy.samplers.sampler_object("euler")
    sigmas = nodes.JensenKVARSchedule.execute("worldplay_4step").args[0]
    int2 = nodes.JensenKVQuantizeKVCache.execute(model, "2", "2", "16", "hadamard", "fp8_e4m3", 0).args[0]
    int2 = nodes.JensenKVBiasCorrection.execute(int2, "taylor", 1.0).args[0]
    runs = {}
    for name, m in (("fp", model), ("int2", int2)):
        out = nodes.worldplay.JensenKVWorldPlayARSampler.execute(m, positive, latent, trajectory, 3, sampler, sigmas)
        lat, report = out.args
        assert lat["samples"].shape == (1, 32, 8, 4, 6) and "downscale_ratio_spacial" not in lat
        assert out.ui["jensen_kv_report"] == [report] and "Context rebuilt before every chunk" in out.ui["text"][0]
        runs[name] = (lat["samples"], report)
    assert runs["fp"][1]["key_bits"] == "off" and runs["fp"][1]["correction"] == "off"
    assert runs["int2"][1]["key_bits"] == 2 and runs["int2"][1]["correction"] == "taylor"
    assert runs["int2"][1]["cache_bytes"] * 5 < runs["fp"][1]["cache_bytes"]
    assert float((runs["int2"][0] - runs["fp"][0]).abs().max()) > 1e-4
