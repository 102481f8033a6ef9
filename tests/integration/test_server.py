"""The pack inside a live ComfyUI server: loading, /object_info, a full API prompt, validation, /interrupt.

The session's shared server (``comfy_server`` in tests/conftest.py: ``main.py --cpu`` on a free loopback port,
this pack and the test-only node pack in ``custom_nodes``), with a tiny random Wan checkpoint written for this
module that ComfyUI's own detection loads as wan2.1 through UNETLoader.
"""

from __future__ import annotations

import time
import uuid

import pytest
from support import comfyui as support_comfyui
from support import wan_tiny
from support.workflow_api import wan_t2v_head

pytestmark = [
    pytest.mark.comfyui,
    pytest.mark.server,
    pytest.mark.skipif(support_comfyui.find_comfyui() is None, reason=support_comfyui.SKIP_REASON),
]

UNET = "jensen_kv_tiny_wan.safetensors"
OUR_NODES = (
    "JensenKVQuantizeKVCache",
    "JensenKVBiasCorrection",
    "JensenKVChunkedARSampler",
    "JensenKVChunkedARSamplerSimple",
)


@pytest.fixture(scope="module")
def server(comfy_server):
    # the checkpoint is built in this process from ComfyUI's own Wan classes
    support_comfyui.setup_inprocess_comfyui()
    wan_tiny.write_file(comfy_server.base_dir / "models" / "diffusion_models" / UNET)
    return comfy_server


def workflow(
    *, seed=0, frames=13, chunk=2, steps=2, cfg=2.0, group="32", window=0, prefix="jensen_kv/run", simple=False
) -> dict:
    """An API-format prompt: UNETLoader -> Quantize -> Jensen -> Chunked AR sampler -> SaveLatent."""
    p = {
        **wan_t2v_head(UNET, group_size=group),
        "6": {
            "class_type": "EmptyHunyuanLatentVideo",
            "inputs": {"width": 32, "height": 32, "length": frames, "batch_size": 1},
        },
        "10": {"class_type": "SaveLatent", "inputs": {"samples": ["9", 0], "filename_prefix": prefix}},
    }
    common = {
        "model": ["3", 0],
        "positive": ["4", 0],
        "negative": ["5", 0],
        "latent": ["6", 0],
        "seed": seed,
        "cfg": cfg,
        "chunk_frames": chunk,
        "window_chunks": window,
        "context_noise": 0.0,
    }
    if simple:
        p["9"] = {
            "class_type": "JensenKVChunkedARSamplerSimple",
            "inputs": {**common, "steps": steps, "sampler_name": "euler", "scheduler": "simple"},
        }
    else:
        p["7"] = {"class_type": "KSamplerSelect", "inputs": {"sampler_name": "euler"}}
        p["8"] = {
            "class_type": "BasicScheduler",
            "inputs": {"model": ["1", 0], "scheduler": "simple", "steps": steps, "denoise": 1.0},
        }
        p["9"] = {
            "class_type": "JensenKVChunkedARSampler",
            "inputs": {**common, "sampler": ["7", 0], "sigmas": ["8", 0]},
        }
    return p


def probe_workflow() -> dict:
    return {
        "1": {"class_type": "UNETLoader", "inputs": {"unet_name": UNET, "weight_dtype": "default"}},
        "2": {"class_type": "JensenKVTestPatchProbe", "inputs": {"model": ["1", 0]}},
    }


def submit(server, prompt) -> str:
    status, body = server.post("/prompt", {"prompt": prompt, "client_id": "jensen-kv-tests"})
    assert status == 200, body
    assert body["node_errors"] == {}
    return body["prompt_id"]


def run(server, prompt, timeout=300) -> dict:
    return server.run_prompt(prompt, timeout=timeout)


def test_pack_loads_and_nodes_appear_in_object_info(server):
    info = server.get("/object_info")
    for node_id in OUR_NODES:
        assert node_id in info, f"{node_id} missing; server log:\n{server.log_tail()}"
        node = info[node_id]
        assert node["category"] == "jensen_kv"
        for name, spec in node["input"]["required"].items():
            assert spec[1].get("tooltip"), f"{node_id}.{name} has no tooltip in /object_info"
    q = info["JensenKVQuantizeKVCache"]
    assert q["display_name"] == "Quantize KV Cache"
    req = q["input"]["required"]
    assert req["group_size"][0] == ["8", "16", "32", "64", "128", "256"] or req["group_size"][1]["options"] == [
        "8",
        "16",
        "32",
        "64",
        "128",
        "256",
    ]
    assert req["scale_format"][1]["advanced"] is True and req["rotation_seed"][1]["advanced"] is True
    assert q["output"] == ["MODEL"]
    s = info["JensenKVChunkedARSampler"]
    assert s["display_name"] == "Chunked AR Video Sampler"
    assert s["output"] == ["LATENT", "JENSEN_KV_REPORT", "JENSEN_KV_CACHE"]
    assert list(s["input"]["required"]) == [
        "model",
        "positive",
        "negative",
        "latent",
        "seed",
        "cfg",
        "sampler",
        "sigmas",
        "chunk_frames",
        "window_chunks",
        "context_noise",
    ]
    assert list(s["input"]["optional"]) == [
        "sink_chunks",
        "prefix",
        "include_prefix",
        "kv_cache",
        "recache_on_switch",
        "recompute_frames",
        "kv_cache_attention_bias",
        "vae",
        "recache_mode",
        "context_noise_mode",
        "first_chunk_sigmas",
        "first_chunk_frames",
    ]
    assert s["input"]["required"]["sampler"][0] == "SAMPLER" and s["input"]["required"]["sigmas"][0] == "SIGMAS"
    k = info["JensenKVChunkedARSamplerSimple"]["input"]["required"]
    assert "euler" in (
        k["sampler_name"][0] if isinstance(k["sampler_name"][0], list) else k["sampler_name"][1]["options"]
    )
    assert info["JensenKVBiasCorrection"]["display_name"] == "Jensen Bias Correction"
    assert "JensenKVTestConditioning" in info
    for line in server.log_path.read_text().splitlines():
        if "IMPORT FAILED" in line or "Cannot import" in line:
            assert support_comfyui.PACK_DIRNAME not in line and "comfy_test_nodes" not in line, line


@pytest.mark.parametrize("simple", [False, True], ids=["sigmas", "ksampler"])
def test_api_prompt_runs_to_a_latent_file(server, simple):
    from safetensors.torch import load_file
    from support.pack import load_pack_module

    import jensen_core
    from jensen_core.planner import CachePrecision, CacheShape, plan_cache

    prefix = f"jensen_kv/{uuid.uuid4().hex[:8]}"
    entry = run(server, workflow(prefix=prefix, simple=simple, frames=13, chunk=2))  # 4 latent frames, 2 chunks
    saved = entry["outputs"]["10"]["latents"][0]
    path = server.base_dir / "output" / saved["subfolder"] / saved["filename"]
    latent = load_file(str(path))["latent_tensor"]
    assert tuple(latent.shape) == (1, 16, 4, 4, 4)
    assert latent.abs().sum() > 0 and bool(latent.isfinite().all())

    ui = entry["outputs"]["9"]
    report = ui["jensen_kv_report"][0]
    assert "MiB" in ui["text"][0]
    spec = jensen_core.QuantSpec(bits=2, group_size=32, rotation="hadamard")
    plan = plan_cache(
        latent_frames=4,
        latent_height=4,
        latent_width=4,
        chunk_frames=2,
        window_chunks=0,
        shape=CacheShape(
            layers=2,
            heads=1,
            head_dim=128,
            geometry=load_pack_module("runtime.families.wan.family").GEOMETRY,
            cfg_branches=2,
        ),
        precision=CachePrecision(spec_k=spec, spec_v=spec),
    )
    assert (report["layers"], report["heads"], report["head_dim"], report["cfg_branches"]) == (2, 1, 128, 2)
    assert report["cache_bytes"] == plan.quantized_bytes and report["bf16_bytes"] == plan.bf16_bytes
    assert report["effective_bits"] == pytest.approx(2.75)
    assert report["chunks"] == 2 and report["correction"] == "taylor"
    # nothing left patched on the model the server keeps loaded
    probe = run(server, probe_workflow())
    assert probe["outputs"]["2"]["text"] == ["unpatched"]


def test_bad_widget_value_is_a_validation_error(server):
    status, body = server.post("/prompt", {"prompt": workflow(group="48")})
    assert status == 400, body
    errors = body["node_errors"]["2"]["errors"]
    # ComfyUI's own check, on every version (v0.3.64 gets the pack's combos as V1 lists, which it checks)
    assert any(
        e["type"] == "value_not_in_list" and "group_size" in e["details"] and "48" in e["details"] for e in errors
    ), errors
    assert body["error"]["type"] == "prompt_outputs_failed_validation"


def test_interrupt_stops_a_long_run_and_the_next_prompt_runs(server):
    # 40 latent frames in chunks of 1 with 300 steps each: minutes of work unless interrupted
    long_id = submit(server, workflow(seed=5, frames=157, chunk=1, steps=300, prefix="jensen_kv/long"))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        running = server.get("/queue")["queue_running"]
        if any(item[1] == long_id for item in running):
            break
        time.sleep(0.2)
    else:
        pytest.fail(f"the long prompt never started:\n{server.log_tail()}")
    time.sleep(2.0)  # let it get well into the chunk loop
    t0 = time.monotonic()
    status, _ = server.post("/interrupt", {"prompt_id": long_id})
    assert status == 200
    entry = server.wait_for_prompt(long_id, timeout=120)
    stopped_after = time.monotonic() - t0
    assert entry["status"]["status_str"] == "error"
    assert any(m[0] == "execution_interrupted" for m in entry["status"]["messages"]), entry["status"]["messages"]
    assert stopped_after < 30, f"took {stopped_after:.1f} s to stop"
    assert "10" not in entry.get("outputs", {})  # no latent was written
    # nothing left patched, and the server runs the next prompt normally
    probe = run(server, probe_workflow())
    assert probe["outputs"]["2"]["text"] == ["unpatched"]
    entry = run(server, workflow(seed=6, prefix="jensen_kv/after_interrupt"))
    assert entry["outputs"]["9"]["jensen_kv_report"][0]["chunks"] == 2


def test_the_help_pages_are_served_where_the_front_end_asks_and_the_sampler_hides_its_expert_knobs(server):
    """The node library's help: ``/extensions/<pack>/docs/<node id>.md`` (web/docs/); and the sampler's rarely
    changed inputs reach the front end as advanced ones."""
    import urllib.request

    for node_id, title in (
        ("JensenKVQuantizeKVCache", "Quantize KV Cache"),
        ("JensenKVBiasCorrection", "Jensen Bias Correction"),
        ("JensenKVChunkedARSampler", "Chunked AR Video Sampler"),
    ):
        url = f"{server.url}/extensions/{support_comfyui.PACK_DIRNAME}/docs/{node_id}.md"
        with urllib.request.urlopen(url, timeout=30) as r:
            assert r.status == 200 and r.read().decode("utf-8").startswith(f"# {title}\n")
    s = server.get("/object_info/JensenKVChunkedARSampler")["JensenKVChunkedARSampler"]["input"]
    specs = {**s["required"], **s["optional"]}
    assert specs["recompute_frames"][1]["advanced"] is True and specs["kv_cache_attention_bias"][1]["advanced"]
    assert not specs["window_chunks"][1].get("advanced") and not specs["sink_chunks"][1].get("advanced")
