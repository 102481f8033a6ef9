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
import time

import pytest
from safetensors.torch import load_file, save_file
from support.comfyui import PACK_ROOT
from support.workflow_api import int2_jensen
from test_workflows import Graph, validate
from workflow_specs import LINGBOT_PATH, LINGBOT_UNET, LINGBOT_WORKFLOWS, START_IMAGE, TEXT_ENCODER, VAE

WORKFLOW_DIR = PACK_ROOT / "example_workflows"
NAME = LINGBOT_WORKFLOWS[0]["name"]
TINY_FILE = "jensen_kv_tiny_lingbot.safetensors"


def graph() -> Graph:
    return Graph(json.loads((WORKFLOW_DIR / f"{NAME}.json").read_text()))


def only(g: Graph, node_type: str) -> dict:
    (node,) = g.of_type(node_type)
    return node


def test_the_lingbot_workflow_is_shipped_and_wires_int2_jensen_into_its_sampler():
    g = graph()
    sampler = only(g, "JensenKVLingBotARSampler")
    assert g.model_chain(sampler) == ["JensenKVBiasCorrection", "JensenKVQuantizeKVCache", "JensenKVLoadLingBot"]
    assert only(g, "JensenKVLoadLingBot")["widgets_values"] == [LINGBOT_UNET, "default"]
    assert only(g, "JensenKVQuantizeKVCache")["widgets_values"][:4] == ["2", "2", "32", "hadamard"]
    assert only(g, "JensenKVBiasCorrection")["widgets_values"] == ["taylor", 1]
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


@pytest.fixture(scope="module")
def server(comfy_server):
    from workflow_specs import write_placeholder_files

    write_placeholder_files(comfy_server.base_dir)
    comfy_server.object_info = comfy_server.get("/object_info")
    return comfy_server


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
    for node_id, (model, prefix) in zip(("12", "13"), arms.items()):
        prompt[node_id] = {
            "class_type": "JensenKVLingBotARSampler",
            "inputs": {
                "model": [model, 0],
                "positive": ["9", 0],
                "latent": ["9", 2],
                "camera": ["8", 0],
                "seed": 3,
                "local_attn_size": 10,
                "sink_size": 2,
                "chunk_frames": 4,
                "timestep_indices": "0,250,500,750",
                "shift": 10.0,
            },
        }
        prompt[str(int(node_id) + 10)] = {
            "class_type": "SaveLatent",
            "inputs": {"samples": [node_id, 0], "filename_prefix": f"jensen_kv/{prefix}"},
        }
    return prompt


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
    prompt = _tiny_prompt({"3": "lingbot_tiny_int2_jensen", "1": "lingbot_tiny_full"})
    t0 = time.monotonic()
    entry = server.run_prompt(prompt, timeout=600)
    reports = {k: o["jensen_kv_report"][0] for k, o in entry["outputs"].items() if "jensen_kv_report" in o}
    int2, full = reports["12"], reports["13"]
    assert (int2["key_bits"], int2["value_bits"], int2["correction"]) == (2, 2, "taylor")
    assert (full["key_bits"], full["correction"]) == ("off", "off")
    for rep in (int2, full):
        assert rep["sampler"] == "LingBot-World AR Sampler" and rep["chunks"] == 3
        assert rep["cache_bytes"] == rep["planned_bytes"] > 0
        assert (rep["cache_entry_frames"], rep["sink_chunks"], rep["window_chunks"]) == (2, 1, 2)
        assert rep["timesteps"] == [999, 967, 908, 768]
    assert int2["cache_bytes"] * 3 < full["cache_bytes"]
    out = server.base_dir / "output" / "jensen_kv"
    (a,) = out.glob("lingbot_tiny_int2_jensen_*.latent")
    (b,) = out.glob("lingbot_tiny_full_*.latent")
    la, lb = load_file(str(a))["latent_tensor"], load_file(str(b))["latent_tensor"]
    assert la.shape == lb.shape == (1, 16, 12, 8, 8)
    assert float((la - lb).abs().max()) > 1e-4
    print(f"\ntiny LingBot-World workflow, INT2 + Jensen and full precision: {time.monotonic() - t0:.1f} s")
