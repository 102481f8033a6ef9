"""The shipped LingBot-World 2.0 workflow (``workflow_specs.LINGBOT_WORKFLOWS``: 480p image to video along a camera
path, INT2 + Jensen) and a tiny LingBot-World run from a workflow in a live ComfyUI:

- offline: the workflow wires what its Note promises (Load LingBot-World -> Quantize KV Cache INT2 g32 -> Jensen
  taylor -> LingBot-World AR Sampler with the reference's window 18 / sink 6 and timesteps; WanImageToVideo with the
  start image and the camera's length);
- in the session's live server: it is valid against ``/object_info`` (test_workflows.py's validator), and a tiny
  workflow - a tiny random LingBot-World file, a start image through a Wan-shaped VAE stand-in, a random prompt, a
  typed camera path, INT2 + Jensen beside full precision - runs to the end.

The family is built on Wan 2.1's classes, which every supported ComfyUI has: these tests run on v0.3.64, v0.27 and 0.33.
"""

from __future__ import annotations

import json

import pytest
from family_workflows import WORKFLOW_DIR, add_arms, int2_jensen_sampler, only, run_arms, shipped
from safetensors.torch import save_file
from support.workflow_api import int2_jensen
from test_workflows import validate
from workflow_specs import LINGBOT_PATH, LINGBOT_UNET, LINGBOT_WORKFLOWS, START_IMAGE, TEXT_ENCODER, VAE

NAME = LINGBOT_WORKFLOWS[0]["name"]
TINY_FILE = "jensen_kv_tiny_lingbot.safetensors"


def test_the_lingbot_workflow_is_shipped_and_wires_int2_jensen_into_its_sampler():
    g = shipped(NAME)
    sampler = int2_jensen_sampler(g, "JensenKVLingBotARSampler", "JensenKVLoadLingBot", LINGBOT_UNET)
    assert sampler["widgets_values"] == [42, "fixed", 18, 6, 4, "0,250,500,750", 10]
    i2v = g.upstream(sampler, "positive")
    assert i2v["type"] == "WanImageToVideo" and g.upstream(sampler, "latent")["id"] == i2v["id"]
    assert i2v["widgets_values"][:2] == [832, 480]
    camera = g.upstream(sampler, "camera")
    assert camera["type"] == "JensenKVLingBotCamera" and camera["widgets_values"][0] == LINGBOT_PATH
    assert g.upstream(i2v, "length")["id"] == camera["id"], "the video's length is the camera path's"
    assert g.upstream(i2v, "start_image")["widgets_values"][0] == START_IMAGE
    assert only(g, "CLIPLoader")["widgets_values"][:2] == [TEXT_ENCODER, "wan"]
    assert only(g, "VAELoader")["widgets_values"] == [VAE]
    assert g.upstream(only(g, "VAEDecode"), "samples")["id"] == sampler["id"]
    note = " ".join(g.note_text().split())
    for fact in (
        f"models/diffusion_models/{LINGBOT_UNET}",
        "t = 999, 967, 908, 768",
        "18 latent frames with a sink of 6",
        "cam_injector_layer1",
        "no action labels",
        "4.03 GB",
        "0.69 GB",
    ):
        assert fact in note, fact


@pytest.mark.comfyui
@pytest.mark.server
def test_the_lingbot_workflow_is_valid_against_live_object_info(server):
    info = server.object_info
    for node in ("WanImageToVideo", "JensenKVLingBotARSampler", "JensenKVLoadLingBot", "JensenKVLingBotCamera"):
        assert node in info, f"{node} is not on the server"
    problems = validate(json.loads((WORKFLOW_DIR / f"{NAME}.json").read_text()), info)
    assert not problems, "\n".join(problems)


def _tiny_prompt(arms: dict[str, str]) -> dict:
    """The API prompt of the tiny workflow: one Load LingBot-World, INT2 + Jensen and full precision side by side."""
    prompt = {
        "1": {"class_type": "JensenKVLoadLingBot", "inputs": {"unet_name": TINY_FILE, "weight_dtype": "default"}},
        **int2_jensen(["1", 0], group_size="16"),  # the tiny model's head_dim is 16
        "4": {"class_type": "JensenKVTestConditioning", "inputs": {"seed": 1, "tokens": 7, "width": 32}},
        "5": {"class_type": "JensenKVTestConditioning", "inputs": {"seed": 2, "tokens": 7, "width": 32}},
        "6": {"class_type": "JensenKVTestTinyWanVAE", "inputs": {"seed": 0}},
        "7": {"class_type": "LoadImage", "inputs": {"image": START_IMAGE}},
        "8": {"class_type": "JensenKVLingBotCamera", "inputs": {"path": "w-3, w+right-8", "pose_folder": ""}},
        "9": {
            "class_type": "WanImageToVideo",
            "inputs": {
                "positive": ["4", 0],
                "negative": ["5", 0],
                "vae": ["6", 0],
                "width": 64,
                "height": 64,
                "length": ["8", 1],
                "batch_size": 1,
                "start_image": ["7", 0],
            },
        },
    }
    inputs = {"positive": ["9", 0], "latent": ["9", 2], "camera": ["8", 0], "seed": 3, "local_attn_size": 10}
    inputs |= {"sink_size": 2, "chunk_frames": 4, "timestep_indices": "0,250,500,750", "shift": 10.0}
    return add_arms(prompt, "JensenKVLingBotARSampler", inputs, arms)


@pytest.mark.comfyui
@pytest.mark.server
def test_a_tiny_lingbot_runs_from_a_workflow_with_image_prompt_and_camera_through_int2_jensen(server):
    """Image (Load Image -> WanImageToVideo through a Wan-shaped VAE stand-in), prompt (a random one) and camera
    path (LingBot-World Camera, its length into the video's), window 10 / sink 2 (so entries are evicted): INT2 +
    Jensen beside full precision, queued as the front end would. Both finish; the reports say INT2 + taylor and full
    precision, the measured peak equals the planner's, and INT2 moves the video."""
    from jensen_testing.lingbot_tiny import TINY, tiny_state_dict

    folder = server.base_dir / "models" / "diffusion_models"
    folder.mkdir(parents=True, exist_ok=True)
    meta = {"num_heads": str(TINY.num_heads), "text_len": str(TINY.text_len)}
    save_file(tiny_state_dict(TINY), str(folder / TINY_FILE), metadata=meta)
    arms = {"3": "lingbot_tiny_int2_jensen", "1": "lingbot_tiny_full"}
    int2, full = run_arms(server, _tiny_prompt(arms), arms, "LingBot-World AR Sampler", 3, (1, 16, 12, 8, 8))
    for rep in (int2, full):
        assert (rep["cache_entry_frames"], rep["sink_chunks"], rep["window_chunks"]) == (2, 1, 2)
        assert rep["timesteps"] == [999, 967, 908, 768]
    assert int2["cache_bytes"] * 3 < full["cache_bytes"]
