"""LingBot-World's nodes and loader in ComfyUI (runtime/families/lingbot, nodes/lingbot.py): registration and tooltips,
the checkpoint's keys (what ComfyUI's own loader drops), the loader's refusals, the camera node's paths and errors,
the sampler's refusal of the same file loaded as plain Wan 2.1, a model call outside the sampler, and a run that fails
half-way leaving the MODEL as it was. Wan 2.1's classes are in every supported ComfyUI: these run on all three."""

from __future__ import annotations

import asyncio
import importlib

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from support import comfyui as support_comfyui

from jensen_testing import lingbot_tiny as lt

CPU = torch.device("cpu")


def pack_module(name: str):
    return importlib.import_module(f"{support_comfyui.PACK_MODULE}.{name}")


def test_the_lingbot_nodes_are_registered_with_a_tooltip_on_every_input(pack, nodes):
    ext = asyncio.run(pack.comfy_entrypoint())
    ids = {n.define_schema().node_id for n in asyncio.run(ext.get_node_list())}
    assert {"JensenKVLoadLingBot", "JensenKVLingBotCamera", "JensenKVLingBotARSampler"} <= ids
    for cls in nodes.FAMILY_NODES["lingbot"]:
        assert all(inp.tooltip for inp in cls.define_schema().inputs), cls


def test_the_released_checkpoints_camera_keys_are_what_comfyui_drops(pack):
    keys = pack_module("runtime.families.lingbot.model.keys")
    for name, count, params in (("lingbot-world-1.3b", 246, 0.29e9), ("lingbot-world-14b", 326, 4.26e9)):
        shapes = keys.official_shapes(keys.RELEASED[name])
        dropped = keys.dropped_by_comfyui(shapes)
        assert (
            sorted(dropped) == sorted(keys.camera_key_names(keys.RELEASED[name].num_layers)) and len(dropped) == count
        )
        n = sum(int(np.prod(shapes[k])) for k in dropped)
        assert abs(n - params) < 0.01e9, (name, n)


def test_the_loader_reads_heads_from_the_file_and_refuses_a_missing_camera_key(pack, tmp_path):
    loader = pack_module("runtime.families.lingbot.loader")
    keys = pack_module("runtime.families.lingbot.model.keys")
    sd = lt.tiny_state_dict()
    path = tmp_path / "tiny.safetensors"
    save_file(sd, str(path), metadata={"num_heads": "4", "text_len": "16"})
    m = loader.load_lingbot(str(path), "fp32", load_device=CPU, offload_device=CPU)
    dm = m.model.diffusion_model
    assert (dm.num_heads, dm.text_len, dm.camera_in) == (4, 16, 1536)
    assert torch.equal(dm.blocks[1].cam_scale_layer.weight, sd["blocks.1.cam_scale_layer.weight"])
    broken = {k: v for k, v in sd.items() if k != "blocks.0.cam_shift_layer.bias"}
    with pytest.raises(keys.CheckpointError, match="blocks.0.cam_shift_layer.bias"):
        loader.lingbot_from_state_dict(broken, "fp32", num_heads=4, load_device=CPU, offload_device=CPU)
    plain_wan = {k: v for k, v in sd.items() if k not in keys.dropped_by_comfyui(sd)}
    with pytest.raises(keys.CheckpointError, match="patch_embedding_wancamctrl"):
        loader.lingbot_from_state_dict(plain_wan, "fp32", num_heads=4, load_device=CPU, offload_device=CPU)


def test_the_camera_node_reads_typed_paths_and_pose_folders_and_names_bad_values(pack, tmp_path):
    ln = pack_module("nodes.lingbot")
    cam, length, info = ln.JensenKVLingBotCamera.execute("w-7, w+right-8").args
    assert cam.c2w.shape == (16, 4, 4) and length == 61 and "16 latents" in info
    assert ln.JensenKVLingBotCamera.validate_inputs("w-3, jump-4", "").startswith("camera path token 'jump-4'")
    assert "w-8 or w+right-4" in ln.JensenKVLingBotCamera.validate_inputs("w", "")
    assert "has no poses.npy" in ln.JensenKVLingBotCamera.validate_inputs("w-3", str(tmp_path))
    poses, k = lt.pose_arrays(45)
    np.save(tmp_path / "poses.npy", poses.numpy())
    np.save(tmp_path / "intrinsics.npy", k.numpy())
    cam, length, _ = ln.JensenKVLingBotCamera.execute("w-3", str(tmp_path)).args
    assert cam.per == "video" and cam.latents_available() == 12 and length == 45
    assert cam.intrinsics == pytest.approx(lt.EXAMPLE_K, rel=1e-6)


def _plain_wan(sd):
    """The tiny LingBot file as UNETLoader would load it: core's WAN21 with 36 input channels, camera layers dropped."""
    import comfy.model_patcher
    import comfy.supported_models

    keys = pack_module("runtime.families.lingbot.model.keys")
    shape = lt.TINY
    config = comfy.supported_models.WAN21_T2V(
        {**{k: v for k, v in shape.unet_config().items() if k != "camera_in"}, "image_model": "wan2.1"}
    )
    config.set_inference_dtype(torch.float32, None)
    model = config.get_model({})
    model.diffusion_model.load_state_dict({k: v for k, v in sd.items() if k not in keys.dropped_by_comfyui(sd)})
    return comfy.model_patcher.ModelPatcher(model, load_device=CPU, offload_device=CPU)


def test_the_file_loaded_as_plain_wan_is_refused_naming_the_loader_and_what_it_dropped(pack):
    recipe = pack_module("runtime.families.lingbot.recipe")
    families = pack_module("runtime.families")
    plain = _plain_wan(lt.tiny_state_dict())
    assert not families.FAMILIES[0].probe(plain).supported  # the Wan 2.1 family refuses 36 input channels too
    assert not pack_module("runtime.families.lingbot.family").LingBotFamily.probe(plain).applies
    with pytest.raises(families.UnsupportedModelError) as e:
        lt.sample(plain, 4, progress=False)
    msg = str(e.value)
    for words in ("UNETLoader", "Load LingBot-World", "cam_scale_layer", "patch_embedding_wancamctrl", "36 input"):
        assert words in msg, (words, msg)
    assert recipe.detect(lt.build_patcher(0)).key == "lingbot"


def test_a_model_call_outside_the_sampler_names_the_sampler(pack):
    cm = pack_module("runtime.families.lingbot.comfy_model")
    dm = lt.build_patcher(0).model.diffusion_model
    with pytest.raises(cm.LingBotInputError, match="LingBot-World AR Sampler"):
        dm(torch.zeros(1, 36, 4, 8, 8), torch.tensor([999.0]), torch.zeros(1, 7, 32))


def test_a_run_that_fails_half_way_leaves_the_model_as_it_was_and_the_next_run_equals_a_fresh_one(pack, nodes):
    model = lt.build_patcher(0)
    q = nodes.JensenKVQuantizeKVCache.execute(model, "2", "2", "16", "hadamard", "fp8_e4m3", 0).args[0]
    before = dict(q.object_patches)

    def stop(chunk, step, steps):
        if chunk == 1 and step == 2:
            raise RuntimeError("stopped by the test")

    with pytest.raises(RuntimeError, match="stopped by the test"):
        lt.sample(q, 12, progress=False, step_callback=stop)
    assert dict(q.object_patches) == before
    assert not any(k.endswith("_forward") for k in q.object_patches)
    again = lt.sample(q, 12, progress=False)
    fresh = lt.sample(nodes.JensenKVQuantizeKVCache.execute(lt.build_patcher(0), "2", "2", "16", "hadamard",
                                                             "fp8_e4m3", 0).args[0], 12, progress=False)  # fmt: skip
    assert torch.equal(again.samples, fresh.samples)
    assert again.report["cache_bytes"] == again.report["planned_bytes"] > 0
