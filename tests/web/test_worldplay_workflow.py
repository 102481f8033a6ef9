"""The shipped HY-WorldPlay workflow (``workflow_specs.WORLDPLAY_WORKFLOWS``: 480p image to video along a camera path,
INT2 + Jensen) and a tiny HY-WorldPlay run from a workflow in a live ComfyUI:

- offline: the workflow wires what its Note promises (Load HY-WorldPlay -> Quantize KV Cache INT2 g32 -> Jensen
  taylor -> HY-WorldPlay AR Sampler; HunyuanVideo15ImageToVideo with the start image, SigLIP features and the
  trajectory's length; Euler and worldplay_4step) and names every model file where ComfyUI reads it;
- in the session's live server: it is valid against ``/object_info`` (test_workflows.py's validator, with the
  model names as placeholder files), and a tiny workflow - a tiny random HY-WorldPlay file, a start image through
  a VAE stand-in, a random prompt, a camera path, INT2 + Jensen beside full precision - runs to the end.

How the ComfyUI versions are handled: HY-WorldPlay is built on ComfyUI's HunyuanVideo 1.5 (HunyuanVideo15ImageToVideo,
DualCLIPLoader's ``hunyuan_video_15``: v0.27 on). Every test here is marked ``hunyuan15``: against v0.27 and 0.33 they
run; against v0.3.64, which has no HunyuanVideo 1.5 and on which the workflow cannot load, they are deselected
(``-m "not hunyuan15"``, as ``.ci/run`` does), never skipped, and so are the shared per-file tests of this workflow
(tests/web/conftest.py).
"""

from __future__ import annotations

import json
import time

import pytest
from safetensors.torch import load_file, save_file
from support.comfyui import PACK_ROOT
from support.workflow_api import int2_jensen
from test_workflows import Graph, validate
from workflow_specs import (
    HY15_BYT5,
    HY15_QWEN,
    HY15_VAE,
    SIGCLIP,
    START_IMAGE,
    WORLDPLAY_POSE,
    WORLDPLAY_UNET,
    WORLDPLAY_WORKFLOWS,
    write_placeholder_files,
)

pytestmark = pytest.mark.hunyuan15

WORKFLOW_DIR = PACK_ROOT / "example_workflows"
NAME = WORLDPLAY_WORKFLOWS[0]["name"]
TINY_FILE = "jensen_kv_tiny_worldplay.safetensors"


def graph() -> Graph:
    return Graph(json.loads((WORKFLOW_DIR / f"{NAME}.json").read_text()))


def only(g: Graph, node_type: str) -> dict:
    (node,) = g.of_type(node_type)
    return node


# ------------------------------------------------------------------------------------------------ offline
def test_the_worldplay_workflow_is_shipped_and_wires_int2_jensen_into_its_sampler():
    g = graph()
    sampler = only(g, "JensenKVWorldPlayARSampler")
    assert g.model_chain(sampler) == ["JensenKVBiasCorrection", "JensenKVQuantizeKVCache", "JensenKVLoadWorldPlay"]
    assert only(g, "JensenKVLoadWorldPlay")["widgets_values"] == [WORLDPLAY_UNET, "default"]
    assert only(g, "JensenKVQuantizeKVCache")["widgets_values"][:4] == ["2", "2", "32", "hadamard"]
    assert only(g, "JensenKVBiasCorrection")["widgets_values"] == ["taylor", 1]
    assert sampler["widgets_values"] == [42, "fixed"]
    assert g.upstream(sampler, "sampler")["widgets_values"] == ["euler"]
    sched = g.upstream(sampler, "sigmas")
    assert sched["type"] == "JensenKVARSchedule" and sched["widgets_values"][0] == "worldplay_4step"
    i2v = g.upstream(sampler, "positive")
    assert i2v["type"] == "HunyuanVideo15ImageToVideo" and g.upstream(sampler, "latent")["id"] == i2v["id"]
    assert i2v["widgets_values"][:2] == [832, 480]
    path = g.upstream(sampler, "trajectory")
    assert path["type"] == "JensenKVWorldPlayTrajectory" and path["widgets_values"][0] == WORLDPLAY_POSE
    assert g.upstream(i2v, "length")["id"] == path["id"], "the video's length is the trajectory's"
    assert g.upstream(i2v, "start_image")["type"] == "LoadImage"
    assert g.upstream(i2v, "start_image")["widgets_values"][0] == START_IMAGE
    assert g.upstream(g.upstream(i2v, "clip_vision_output"), "clip_vision")["widgets_values"] == [SIGCLIP]
    clip = only(g, "DualCLIPLoader")
    assert clip["widgets_values"][:3] == [HY15_QWEN, HY15_BYT5, "hunyuan_video_15"]
    assert only(g, "VAELoader")["widgets_values"] == [HY15_VAE]
    assert g.upstream(only(g, "VAEDecode"), "samples")["id"] == sampler["id"]
    assert g.of_type("SaveAnimatedWEBP") and g.of_type("JensenKVWorldPlayTrajectoryPreview")
    note = " ".join(g.note_text().split())
    for fact in (
        f"models/diffusion_models/{WORLDPLAY_UNET}",
        f"models/text_encoders/{HY15_QWEN}",
        f"models/text_encoders/{HY15_BYT5}",
        f"models/vae/{HY15_VAE}",
        f"models/clip_vision/{SIGCLIP}",
        "ar_distilled_action_model/model.safetensors",
        "v0.27",
        "t = 1000, 937.5, 833.3, 625",
        "27.6 GB",
        "4.74 GB",
        "up to 20 context frames",
        "t = 14",
    ):
        assert fact in note, fact


# ------------------------------------------------------------------------------------------------ live server
@pytest.fixture(scope="module")
def server(comfy_server):
    write_placeholder_files(comfy_server.base_dir)
    comfy_server.object_info = comfy_server.get("/object_info")
    return comfy_server


@pytest.mark.comfyui
@pytest.mark.server
def test_the_worldplay_workflow_is_valid_against_live_object_info(server):
    info = server.object_info
    for node in ("HunyuanVideo15ImageToVideo", "JensenKVWorldPlayARSampler", "JensenKVLoadWorldPlay"):
        assert node in info, f"{node} is not on the server"
    assert "hunyuan_video_15" in info["DualCLIPLoader"]["input"]["required"]["type"][0]
    problems = validate(json.loads((WORKFLOW_DIR / f"{NAME}.json").read_text()), info)
    assert not problems, "\n".join(problems)


def _tiny_prompt(arms: dict[str, str]) -> dict:
    """The API prompt of the tiny workflow: one Load HY-WorldPlay, INT2 + Jensen and full precision side by side."""
    prompt = {
        "1": {"class_type": "JensenKVLoadWorldPlay", "inputs": {"unet_name": TINY_FILE, "weight_dtype": "default"}},
        **int2_jensen(["1", 0]),
        "4": {"class_type": "JensenKVTestWorldPlayPrompt", "inputs": {"seed": 1, "tokens": 7, "width": 32}},
        "5": {"class_type": "JensenKVTestWorldPlayPrompt", "inputs": {"seed": 2, "tokens": 7, "width": 32}},
        "6": {"class_type": "JensenKVTestTinyVAE", "inputs": {"seed": 0}},
        "7": {"class_type": "LoadImage", "inputs": {"image": START_IMAGE}},
        "8": {"class_type": "JensenKVWorldPlayTrajectory", "inputs": {"pose": "w-3, right-4", "latents": 0}},
        "9": {
            "class_type": "HunyuanVideo15ImageToVideo",
            "inputs": {
                "positive": ["4", 0],
                "negative": ["5", 0],
                "vae": ["6", 0],
                "width": 96,
                "height": 64,
                "length": ["8", 1],
                "batch_size": 1,
                "start_image": ["7", 0],
            },
        },
        "10": {"class_type": "KSamplerSelect", "inputs": {"sampler_name": "euler"}},
        "11": {
            "class_type": "JensenKVARSchedule",
            "inputs": {"preset": "worldplay_4step", "steps": 30, "shift": 8.0, "manual": ""},
        },
    }
    for node_id, (model, prefix) in zip(("12", "13"), arms.items()):
        prompt[node_id] = {
            "class_type": "JensenKVWorldPlayARSampler",
            "inputs": {
                "model": [model, 0],
                "positive": ["9", 0],
                "latent": ["9", 2],
                "trajectory": ["8", 0],
                "seed": 3,
                "sampler": ["10", 0],
                "sigmas": ["11", 0],
            },
        }
        prompt[str(int(node_id) + 10)] = {
            "class_type": "SaveLatent",
            "inputs": {"samples": [node_id, 0], "filename_prefix": f"jensen_kv/{prefix}"},
        }
    return prompt


@pytest.mark.comfyui
@pytest.mark.server
def test_a_tiny_worldplay_runs_from_a_workflow_with_image_prompt_and_path_through_int2_jensen(server):
    """Image (Load Image -> HunyuanVideo15ImageToVideo through a VAE stand-in), prompt (a random one) and camera path
    (HY-WorldPlay Trajectory, its length into the video's): INT2 + Jensen beside full precision, queued as the front
    end would. Both finish; the reports say INT2 + taylor and full precision, the measured peak equals the planner's,
    and INT2 moves the video."""
    from jensen_testing.worldplay_tiny import TINY, tiny_state_dict

    folder = server.base_dir / "models" / "diffusion_models"
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tiny_state_dict(TINY), str(folder / TINY_FILE))
    prompt = _tiny_prompt({"3": "worldplay_tiny_int2_jensen", "1": "worldplay_tiny_full"})
    t0 = time.monotonic()
    entry = server.run_prompt(prompt, timeout=600)
    reports = {k: o["jensen_kv_report"][0] for k, o in entry["outputs"].items() if "jensen_kv_report" in o}
    int2, full = reports["12"], reports["13"]
    assert (int2["key_bits"], int2["value_bits"], int2["correction"]) == (2, 2, "taylor")
    assert (full["key_bits"], full["correction"]) == ("off", "off")
    for rep in (int2, full):
        assert rep["sampler"] == "HY-WorldPlay AR Sampler" and rep["chunks"] == 2
        assert rep["cache_bytes"] == rep["planned_bytes"] > 0
        assert rep["context_frames"] == [[], [0, 1, 2, 3]] and rep["streams"] == 2
        assert rep["text_prefix_tokens"] == 3 + 7  # ByT5 + LLM (no SigLIP features in this prompt)
    assert int2["cache_bytes"] * 5 < full["cache_bytes"]
    out = server.base_dir / "output" / "jensen_kv"
    (a,) = out.glob("worldplay_tiny_int2_jensen_*.latent")
    (b,) = out.glob("worldplay_tiny_full_*.latent")
    la, lb = load_file(str(a))["latent_tensor"], load_file(str(b))["latent_tensor"]
    assert la.shape == lb.shape == (1, 32, 8, 4, 6)
    assert float((la - lb).abs().max()) > 1e-4
    print(f"\ntiny HY-WorldPlay workflow, INT2 + Jensen and full precision: {time.monotonic() - t0:.1f} s")
