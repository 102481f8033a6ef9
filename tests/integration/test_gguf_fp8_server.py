"""The pack on Wan weights loaded the low-VRAM ways, in a live ComfyUI: ComfyUI-GGUF's UnetLoaderGGUF and fp8 UNETLoader.

The session's shared server (``comfy_server``), which has this pack, the test-only nodes and ComfyUI-GGUF in
custom_nodes (where the gguf package is installed: otherwise this module skips).
One tiny random Wan (``wan_tiny.state_dict_for_file``, rounded to float16) is written twice:

- as a GGUF file the way ComfyUI-GGUF's converter writes Wan (arch ``wan``; F16, F32 for 1-D and
  modulation tensors, and one Q8_0 self-attention weight that GGMLOps dequantizes on the fly);
- as a float16 safetensors file with exactly the weights ComfyUI-GGUF computes with.

One prompt runs the same INT2 + Jensen chunked AR sampling from three loaders: UnetLoaderGGUF,
UNETLoader on the float16 file, and UNETLoader with ``weight_dtype`` fp8_e4m3fn on it. The GGUF
run must match the float16 run tightly (same weights, same float32 compute on the CPU); the fp8 run
loosely (its weights are rounded to 3 mantissa bits), and must differ (fp8 was really used).
"""

from __future__ import annotations

import uuid

import pytest
from support import comfyui as support_comfyui
from support import gguf_wan, wan_tiny
from support.workflow_api import int2_jensen

pytestmark = [
    pytest.mark.comfyui,
    pytest.mark.server,
    pytest.mark.slow,
    pytest.mark.skipif(support_comfyui.find_comfyui() is None, reason=support_comfyui.SKIP_REASON),
]

GGUF_FILE = "jensen_kv_tiny_wan-Q8_0-F16.gguf"
FP16_FILE = "jensen_kv_tiny_wan_fp16.safetensors"
Q8_TENSORS = ("blocks.0.self_attn.q.weight",)
LOADERS = {
    "gguf": {"class_type": "UnetLoaderGGUF", "inputs": {"unet_name": GGUF_FILE}},
    "fp16": {"class_type": "UNETLoader", "inputs": {"unet_name": FP16_FILE, "weight_dtype": "default"}},
    "fp8": {"class_type": "UNETLoader", "inputs": {"unet_name": FP16_FILE, "weight_dtype": "fp8_e4m3fn"}},
}


@pytest.fixture(scope="module")
def server(comfy_server):
    import torch
    from safetensors.torch import save_file

    reason = gguf_wan.gguf_skip_reason()
    if reason:
        pytest.skip(reason)
    support_comfyui.setup_inprocess_comfyui()
    sd = {k: v.to(torch.float16).to(torch.float32) for k, v in wan_tiny.state_dict_for_file(seed=0).items()}
    models = comfy_server.base_dir / "models" / "diffusion_models"
    exact = gguf_wan.write_wan_gguf(sd, models / GGUF_FILE, quantize=Q8_TENSORS)
    fp16 = {k: v.to(torch.float16) for k, v in exact.items()}
    assert all(torch.equal(fp16[k].float(), exact[k]) for k in exact), "the GGUF weights must be float16-exact"
    save_file(fp16, str(models / FP16_FILE))
    return comfy_server


def prompt(prefix: str) -> dict:
    """Each loader -> Quantize KV Cache (INT2, g32, QuaRot) -> Jensen (taylor) -> Chunked AR sampler -> SaveLatent."""
    p = {
        "c+": {"class_type": "JensenKVTestConditioning", "inputs": {"seed": 1, "tokens": 16, "width": 4096}},
        "c-": {"class_type": "JensenKVTestConditioning", "inputs": {"seed": 2, "tokens": 16, "width": 4096}},
        "lat": {
            "class_type": "EmptyHunyuanLatentVideo",
            "inputs": {"width": 32, "height": 32, "length": 13, "batch_size": 1},
        },
    }
    for name, loader in LOADERS.items():
        p[f"{name}_load"] = loader
        p.update(int2_jensen([f"{name}_load", 0], quant=f"{name}_quant", jensen=f"{name}_jensen"))
        p[f"{name}_sample"] = {
            "class_type": "JensenKVChunkedARSamplerSimple",
            "inputs": {
                "model": [f"{name}_jensen", 0],
                "positive": ["c+", 0],
                "negative": ["c-", 0],
                "latent": ["lat", 0],
                "seed": 3,
                "steps": 2,
                "cfg": 2.0,
                "sampler_name": "euler",
                "scheduler": "simple",
                "chunk_frames": 2,
                "window_chunks": 0,
                "context_noise": 0.0,
            },
        }
        p[f"{name}_save"] = {
            "class_type": "SaveLatent",
            "inputs": {"samples": [f"{name}_sample", 0], "filename_prefix": f"{prefix}/{name}"},
        }
    return p


def run(server, p: dict, timeout: float = 600) -> dict:
    entry = server.run_prompt(p, timeout=timeout, client_id="jensen-kv-gguf-tests")
    return entry


@pytest.fixture(scope="module")
def results(server):
    from safetensors.torch import load_file

    entry = run(server, prompt(f"jensen_kv_gguf/{uuid.uuid4().hex[:8]}"))
    latents, reports = {}, {}
    for name in LOADERS:
        saved = entry["outputs"][f"{name}_save"]["latents"][0]
        latents[name] = load_file(str(server.base_dir / "output" / saved["subfolder"] / saved["filename"]))[
            "latent_tensor"
        ]
        reports[name] = entry["outputs"][f"{name}_sample"]["jensen_kv_report"][0]
    return latents, reports


def test_the_gguf_file_loads_through_comfyui_gguf_with_its_q8_tensor(server, results):
    info = server.get("/object_info/UnetLoaderGGUF")["UnetLoaderGGUF"]
    assert GGUF_FILE in info["input"]["required"]["unet_name"][0]
    log = server.log_path.read_text()
    assert "gguf qtypes: " in log and "Q8_0 (1)" in log, server.log_tail()


def test_gguf_matches_the_same_weights_through_unetloader(results):
    import torch

    latents, reports = results
    g, ref = latents["gguf"], latents["fp16"]
    assert tuple(g.shape) == (1, 16, 4, 4, 4) and bool(g.isfinite().all())
    assert ref.abs().mean() > 0.1
    torch.testing.assert_close(g, ref, rtol=0, atol=1e-5)  # measured: identical
    for key in ("cache_bytes", "bf16_bytes", "effective_bits", "chunks", "layers", "heads", "head_dim", "cfg_branches"):
        assert reports["gguf"][key] == reports["fp16"][key], key
    assert reports["gguf"]["effective_bits"] == pytest.approx(2.75) and reports["gguf"]["cfg_branches"] == 2


def test_fp8_weights_run_and_stay_close(results):
    latents, reports = results
    f8, ref = latents["fp8"], latents["fp16"]
    assert tuple(f8.shape) == tuple(ref.shape) and bool(f8.isfinite().all())
    rel = float((f8 - ref).norm() / ref.norm())
    assert 1e-4 < rel < 0.05, rel  # fp8 rounding shows (measured 0.012), but it is the same video
    assert reports["fp8"]["cache_bytes"] == reports["fp16"]["cache_bytes"]


def test_no_patch_is_left_on_the_gguf_model(server, results):
    entry = run(
        server, {"g": LOADERS["gguf"], "probe": {"class_type": "JensenKVTestPatchProbe", "inputs": {"model": ["g", 0]}}}
    )
    assert entry["outputs"]["probe"]["text"] == ["unpatched"]
