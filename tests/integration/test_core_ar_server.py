"""The pack on core's AR path in a live ComfyUI v0.27 server, as a user wires it.

UNETLoader (a tiny causal Wan file whose safetensors metadata marks it ``causal_ar``, so core loads
WAN21_CausalAR) -> ModelSamplingSD3 -> [Quantize KV Cache -> Jensen Bias Correction -> AR Cache
Window] -> BasicGuider -> SamplerCustomAdvanced with SamplerARVideo and the AR Video Schedule ->
SaveLatent, and KV Cache Report on the sampler's output. The reference is the same prompt without
the pack's nodes: core's own sampler and cache.
"""

from __future__ import annotations

import json
import uuid

import pytest
import torch
from support import comfyui as support_comfyui
from support import wan_tiny

pytestmark = [pytest.mark.comfyui, pytest.mark.server, pytest.mark.core_ar]

UNET = "jensen_kv_tiny_causal_wan.safetensors"
FP32_ATOL = 2e-5  # see test_core_ar_path.py: same arithmetic in another summation order


@pytest.fixture(scope="module")
def server(comfy_server):
    """The session's shared server, with the tiny causal Wan file written for this module."""
    support_comfyui.setup_inprocess_comfyui()
    wan_tiny.write_file(comfy_server.base_dir / "models" / "diffusion_models" / UNET, causal=True)
    return comfy_server


def prompt(*, bits=None, mode="taylor", window=None, diagnostics=False, block=1, frames=13, cfg=None) -> dict:
    p = {
        "1": {"class_type": "UNETLoader", "inputs": {"unet_name": UNET, "weight_dtype": "default"}},
        "2": {"class_type": "ModelSamplingSD3", "inputs": {"model": ["1", 0], "shift": 5.0}},
        "5": {"class_type": "JensenKVTestConditioning", "inputs": {"seed": 1, "tokens": 16, "width": 4096}},
        "6": {"class_type": "JensenKVTestConditioning", "inputs": {"seed": 2, "tokens": 16, "width": 4096}},
        "7": {
            "class_type": "EmptyARVideoLatent",
            "inputs": {"width": 32, "height": 32, "length": frames, "batch_size": 1},
        },
        "8": {"class_type": "SamplerARVideo", "inputs": {"num_frame_per_block": block}},
        "9": {
            "class_type": "JensenKVARSchedule",
            "inputs": {"preset": "self_forcing_4step", "steps": 4, "shift": 5.0, "manual": ""},
        },
        "11": {"class_type": "RandomNoise", "inputs": {"noise_seed": 7}},
        "13": {
            "class_type": "SaveLatent",
            "inputs": {"samples": ["12", 0], "filename_prefix": f"jensen_kv/{uuid.uuid4().hex[:8]}"},
        },
    }
    model = ["2", 0]
    if bits is not None:
        p["3"] = {
            "class_type": "JensenKVQuantizeKVCache",
            "inputs": {
                "model": model,
                "key_bits": bits,
                "value_bits": bits,
                "group_size": "32",
                "rotation": "hadamard",
                "scale_format": "fp8_e4m3",
                "rotation_seed": 0,
            },
        }
        p["4"] = {"class_type": "JensenKVBiasCorrection", "inputs": {"model": ["3", 0], "mode": mode, "strength": 1.0}}
        model = ["4", 0] if bits != "off" else ["3", 0]
    if window is not None:
        p["15"] = {
            "class_type": "JensenKVARCacheWindow",
            "inputs": {"model": model, "window_chunks": window[0], "sink_chunks": window[1]},
        }
        model = ["15", 0]
    if diagnostics:
        p["16"] = {
            "class_type": "JensenKVDiagnostics",
            "inputs": {"model": model, "layers": "all", "heads": "all", "steps": "all", "query_stride": 1},
        }
        model = ["16", 0]
    if cfg is None:
        p["10"] = {"class_type": "BasicGuider", "inputs": {"model": model, "conditioning": ["5", 0]}}
    else:
        p["10"] = {
            "class_type": "CFGGuider",
            "inputs": {"model": model, "positive": ["5", 0], "negative": ["6", 0], "cfg": cfg},
        }
    p["12"] = {
        "class_type": "SamplerCustomAdvanced",
        "inputs": {
            "noise": ["11", 0],
            "guider": ["10", 0],
            "sampler": ["8", 0],
            "sigmas": ["9", 0],
            "latent_image": ["7", 0],
        },
    }
    if bits is not None or window is not None or diagnostics:
        p["14"] = {"class_type": "JensenKVCacheReport", "inputs": {"model": model, "samples": ["12", 0]}}
    return p


def run(server, p, timeout=300) -> tuple[torch.Tensor, dict]:
    from safetensors.torch import load_file

    entry = server.run_prompt(p, timeout=timeout)
    saved = entry["outputs"]["13"]["latents"][0]
    latent = load_file(str(server.base_dir / "output" / saved["subfolder"] / saved["filename"]))["latent_tensor"]
    return latent, entry["outputs"]


def psnr(a, ref):
    return float(10 * torch.log10(ref.pow(2).max() / (a - ref).pow(2).mean().clamp_min(1e-30)))


def test_the_pack_serves_core_sampler_equal_when_off_and_effective_when_quantized(server):
    info = server.get("/object_info")
    for node in ("SamplerARVideo", "EmptyARVideoLatent", "JensenKVARCacheWindow", "JensenKVCacheReport"):
        assert node in info, node
    core, _ = run(server, prompt())
    assert tuple(core.shape) == (1, 16, 4, 4, 4) and bool(core.isfinite().all()) and core.abs().sum() > 0
    off, out_off = run(server, prompt(bits="off"))
    torch.testing.assert_close(off, core, atol=FP32_ATOL, rtol=0)
    rep_off = out_off["14"]["jensen_kv_report"][0]
    assert rep_off["sampler"] == "core sample_ar_video" and rep_off["key_bits"] == "off"
    assert rep_off["cache_bytes"] == rep_off["planned_bytes"] > 0
    int8, _ = run(server, prompt(bits="8"))
    int2, out2 = run(server, prompt(bits="2"))
    p8, p2 = psnr(int8, core), psnr(int2, core)
    assert p8 > 60 and p2 < p8 - 15, (p8, p2)
    rep2 = out2["14"]["jensen_kv_report"][0]
    assert rep2["key_bits"] == 2 and rep2["correction"] == "taylor" and rep2["effective_bits"] == pytest.approx(2.75)
    assert rep2["cache_bytes"] == rep2["planned_bytes"] and rep2["cache_bytes"] * 5 < rep_off["cache_bytes"]
    assert "MiB" in out2["14"]["text"][0]


def test_window_sink_diagnostics_and_cfg_on_core_path(server):
    core, _ = run(server, prompt(frames=21))  # 6 latent frames, blocks of 1
    _, out = run(server, prompt(bits="2", window=(2, 1), diagnostics=True, frames=21))
    rep = out["14"]["jensen_kv_report"][0]
    assert (rep["window_chunks"], rep["sink_chunks"]) == (2, 1)
    assert rep["cache_bytes"] == rep["planned_bytes"]
    d = rep["diagnostics"]
    none, fixed = d["stats"]["off"], d["stats"]["taylor"]
    assert d["calls"] > 0 and none["median_delta_ps"] > 0
    assert abs(fixed["median_delta_ps"]) < none["median_delta_ps"], (none, fixed)
    # cfg > 1: core's own cache is allocated for the latent's batch and fails on the batched cond/uncond pair;
    # the pack keeps one cache per branch
    latent, out = run(server, prompt(bits="4", cfg=3.0, block=2))
    assert bool(latent.isfinite().all()) and out["14"]["jensen_kv_report"][0]["cfg_branches"] == 2


def test_a_plain_sampler_with_the_pack_settings_fails_with_what_to_use(server):
    p = prompt(bits="2")
    p["8"] = {"class_type": "KSamplerSelect", "inputs": {"sampler_name": "euler"}}
    entry = server.run_prompt(p, timeout=120, status="error")
    msg = json.dumps(entry["status"]["messages"])
    assert "UnusedSettingsError" in msg and "SamplerARVideo" in msg and "Chunked AR Video Sampler" in msg
