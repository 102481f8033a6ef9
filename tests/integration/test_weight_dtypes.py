"""Low-precision weights in-process: what a GPU user's fp8 / bf16 / fp16 Wan does to the cache's inputs.

On the CPU, UNETLoader's fp8_e4m3fn computes in float32 (``test_gguf_fp8_server.py`` runs that in a
server). On a GPU, ComfyUI keeps fp8 weights and computes in bf16 or fp16 (manual cast), or loads
bf16 / fp16 weights and computes in them. Here the tiny Wan is built with those inference dtypes
(``set_inference_dtype(weights, manual_cast)``) and sampled with INT2 + Jensen: the cache must
receive plain floating q, k, v in the compute dtype, and the result must stay close to float32.
"""

from __future__ import annotations

import importlib

import pytest
import torch
from support import comfyui as support_comfyui
from support import wan_tiny


def build(weight_dtype, compute_dtype):
    import comfy.model_patcher
    import comfy.supported_models

    ref = wan_tiny.build_base_model(seed=0).diffusion_model.state_dict()
    config = comfy.supported_models.WAN21_T2V(wan_tiny.unet_config(**wan_tiny.TINY))
    config.set_inference_dtype(weight_dtype, compute_dtype)
    model = config.get_model({})
    model.diffusion_model.load_state_dict(ref)
    cpu = torch.device("cpu")
    return comfy.model_patcher.ModelPatcher(model.eval(), load_device=cpu, offload_device=cpu)


def sample(nodes, model):
    q = nodes.JensenKVQuantizeKVCache.execute(model, "2", "2", "16", "hadamard", "fp8_e4m3", 0).args[0]
    j = nodes.JensenKVBiasCorrection.execute(q, "taylor", 1.0).args[0]
    out = nodes.JensenKVChunkedARKSampler.execute(
        j,
        wan_tiny.conditioning(1, 16, 32),
        wan_tiny.conditioning(2, 16, 32),
        wan_tiny.video_latent(4, 4, 4),
        3,
        2,
        2.0,
        "euler",
        "simple",
        2,
        0,
        0.0,
    )
    return out.args[0]["samples"]


@pytest.mark.parametrize(
    "weight_dtype,compute_dtype",
    [
        (torch.bfloat16, None),
        (torch.float16, None),
        (torch.float8_e4m3fn, torch.bfloat16),
        (torch.float8_e4m3fn, torch.float16),
    ],
    ids=["bf16", "fp16", "fp8-bf16", "fp8-fp16"],
)
def test_low_precision_weights_feed_the_cache_in_the_compute_dtype(nodes, monkeypatch, weight_dtype, compute_dtype):
    run_caches = importlib.import_module(f"{support_comfyui.PACK_MODULE}.runtime.run_caches")
    seen = set()
    original = run_caches.RunCaches.attend

    def spy(self, layer, q, k, v, transformer_options):
        seen.update((type(t), t.dtype) for t in (q, k, v))
        return original(self, layer, q, k, v, transformer_options)

    reference = sample(nodes, build(torch.float32, None))
    monkeypatch.setattr(run_caches.RunCaches, "attend", spy)
    model = build(weight_dtype, compute_dtype)
    assert model.model.diffusion_model.blocks[0].self_attn.k.weight.dtype == weight_dtype
    out = sample(nodes, model)
    assert seen == {(torch.Tensor, compute_dtype or weight_dtype)}
    assert bool(out.isfinite().all())
    rel = float((out.float() - reference).norm() / reference.norm())
    assert rel < 0.05, rel
