"""Long videos in a live ComfyUI: AR Video Schedule, Prompt Schedule, Save / Load KV Cache.

Continue-later through real files: prompt 1 makes 4 chunks in one go; prompt 2 makes the first 2 and
saves its KV cache; prompt 3 loads that file and makes 2 more. The latents of 3 equal the last two
chunks of 1, bit for bit. A cache loaded into a run it does not fit stops with the reason.
"""

from __future__ import annotations

import glob
import os
import uuid

import pytest
from support import comfyui as support_comfyui
from support import wan_tiny
from support.workflow_api import chunked_sampler, wan_t2v_head

pytestmark = [pytest.mark.comfyui, pytest.mark.server]

UNET = "jensen_kv_tiny_wan.safetensors"


@pytest.fixture(scope="module")
def server(comfy_server):
    """The session's shared server, with a tiny random Wan checkpoint written for this module."""
    support_comfyui.setup_inprocess_comfyui()
    wan_tiny.write_file(comfy_server.base_dir / "models" / "diffusion_models" / UNET)
    return comfy_server


def _graph(*, frames, prefix, kv_in=None, save_kv=None, chunk=2, schedule=False, preset="self_forcing_4step"):
    p = {
        **wan_t2v_head(UNET),
        "6": {
            "class_type": "EmptyHunyuanLatentVideo",
            "inputs": {"width": 32, "height": 32, "length": (frames - 1) * 4 + 1, "batch_size": 1},
        },
        "7": {"class_type": "KSamplerSelect", "inputs": {"sampler_name": "lcm"}},
        "8": {
            "class_type": "JensenKVARSchedule",
            "inputs": {"preset": preset, "steps": 30, "shift": 8.0, "manual": "1, 0.5"},
        },
        "9": chunked_sampler(["3", 0], seed=3, chunk_frames=chunk, window_chunks=1, sink_chunks=1),
        "10": {"class_type": "SaveLatent", "inputs": {"samples": ["9", 0], "filename_prefix": prefix}},
    }
    if schedule:
        p["11"] = {
            "class_type": "JensenKVPromptSchedule",
            "inputs": {"conditioning": ["4", 0], "start_chunk": 0, "label": "calm"},
        }
        p["12"] = {
            "class_type": "JensenKVPromptSchedule",
            "inputs": {"conditioning": ["5", 0], "start_chunk": 1, "label": "storm", "schedule": ["11", 0]},
        }
        p["9"]["inputs"]["positive"] = ["12", 0]
    if kv_in is not None:
        p["13"] = {"class_type": "JensenKVLoadKVCache", "inputs": {"cache_file": kv_in}}
        p["9"]["inputs"]["kv_cache"] = ["13", 0]
    if save_kv is not None:
        p["14"] = {"class_type": "JensenKVSaveKVCache", "inputs": {"kv_cache": ["9", 2], "filename_prefix": save_kv}}
    return p


def _run(server, prompt, expect_ok=True):
    return server.run_prompt(prompt, timeout=300, status="success" if expect_ok else "error")


def _latent(server, prefix):
    from safetensors.torch import load_file

    (path,) = glob.glob(str(server.base_dir / "output" / f"{prefix}_*.latent"))
    return load_file(path)["latent_tensor"]


def test_continue_later_through_files_equals_one_run(server):
    tag = uuid.uuid4().hex[:6]
    _run(server, _graph(frames=8, prefix=f"jensen_kv/{tag}_whole"))
    entry = _run(server, _graph(frames=4, prefix=f"jensen_kv/{tag}_first", save_kv=f"jensen_kv/{tag}_kv"))
    texts = [t for out in entry["outputs"].values() for t in out.get("text", [])]
    assert any("saved" in t and ".safetensors" in t for t in texts), texts
    files = glob.glob(str(server.base_dir / "output" / "jensen_kv" / f"{tag}_kv_*.safetensors"))
    assert len(files) == 1
    name = "output/" + os.path.relpath(files[0], server.base_dir / "output")[: -len(".safetensors")]
    info = server.get("/object_info/JensenKVLoadKVCache")["JensenKVLoadKVCache"]
    assert name in info["input"]["required"]["cache_file"][1]["options"]  # listed for the user (no extension)
    _run(server, _graph(frames=4, prefix=f"jensen_kv/{tag}_second", kv_in=name))
    whole, first, second = (_latent(server, f"jensen_kv/{tag}_{k}") for k in ("whole", "first", "second"))
    assert whole.shape[2] == 8 and first.shape[2] == 4 and second.shape[2] == 4
    assert (first == whole[:, :, :4]).all() and (second == whole[:, :, 4:]).all()
    # the same file into a run with another chunk length: refused, with the reason
    bad = _run(server, _graph(frames=4, prefix=f"jensen_kv/{tag}_bad", kv_in=name, chunk=1), expect_ok=False)
    msg = str(bad["status"]["messages"])
    assert "chunk_frames 2, but this run has 1" in msg, msg


def test_prompt_schedule_and_schedule_presets_run_and_report(server):
    tag = uuid.uuid4().hex[:6]
    entry = _run(server, _graph(frames=6, prefix=f"jensen_kv/{tag}_story", schedule=True, preset="causvid_3step"))
    report = next(out["jensen_kv_report"][0] for out in entry["outputs"].values() if "jensen_kv_report" in out)
    assert [(p["label"], p["start_chunk"]) for p in report["prompts"]] == [("calm", 0), ("storm", 1)]
    assert report["prompts"][1]["recached_chunks"] == 1  # the sink (chunk 0) is re-cached under "storm"
    assert report["sink_chunks"] == 1 and report["memory_request"]["bytes"] == report["planned_bytes"]
    sched_text = next(out["text"][0] for nid, out in entry["outputs"].items() if nid == "8")
    assert sched_text == "causvid_3step: 3 steps; the model sees t = 1000, 757, 522"
    status, body = server.post(
        "/prompt",
        {
            "prompt": {
                **_graph(frames=2, prefix="x"),
                "8": {
                    "class_type": "JensenKVARSchedule",
                    "inputs": {"preset": "warp9", "steps": 30, "shift": 8.0, "manual": ""},
                },
            }
        },
    )
    assert status == 400 and "warp9" in str(body)
