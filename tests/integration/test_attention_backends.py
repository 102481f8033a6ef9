"""The pack's self-attention under every attention backend ComfyUI offers on a CPU (0.33's Model Attention Backend
node, or another pack's ``optimized_attention_override``), on the pack's sampler and on core's AR path.

The pack replaces every Wan self-attention with its own cached attention, which never calls ComfyUI's attention
function: an override must then serve cross-attention only (never a self-attention call), the quantized cache
must be used exactly as without it, and the run says so in the log. Each registered backend ("pytorch",
"sub_quad", "split": the ones a CPU has) is installed as ComfyUI 0.33's ``set_model_optimized_attention`` does,
wrapped to record the key length of every call it serves.
"""

from __future__ import annotations

import logging

import pytest
import torch
from support import causal_wan as cw
from support import wan_tiny

COND_TOKENS = 13  # never the 16 tokens per frame of an 8x8 latent: self- and cross-attention keys differ in length
CPU_BACKENDS = ("pytorch", "sub_quad", "split")


def with_backend(model, name: str, seen: list[int]):
    """A clone of ``model`` whose attention is ``name``, as ComfyUI 0.33's Model Attention Backend node sets it
    (``ModelPatcher.set_model_optimized_attention``; written out so v0.27 and v0.3.64, without that method, run
    it the same way); ``seen`` gets the key length of every call the backend serves."""
    import comfy.ldm.modules.attention as attention

    fn = attention.get_attention_function(name, None)
    if fn is None:
        pytest.fail(f"ComfyUI registers no {name!r} attention on this CPU")

    def override(_, q, k, v, *args, **kwargs):
        seen.append(int(k.shape[-2] if kwargs.get("skip_reshape") else k.shape[1]))
        return fn(q, k, v, *args, **kwargs)

    m = model.clone()
    m.model_options.setdefault("transformer_options", {})["optimized_attention_override"] = override
    return m


def int2_jensen(nodes, model):
    m = nodes.JensenKVQuantizeKVCache.execute(model, "2", "2", "32", "hadamard").args[0]
    return nodes.JensenKVBiasCorrection.execute(m, "taylor", 1.0).args[0]


def run_pack(loop, model, euler, cfg=2.0):
    import comfy.samplers

    sigmas = comfy.samplers.calculate_sigmas(model.get_model_object("model_sampling"), "simple", 2)
    pos, neg = wan_tiny.conditioning(1, COND_TOKENS, 32), wan_tiny.conditioning(2, COND_TOKENS, 32)
    return wan_tiny.run(
        loop, model, pos, neg, 5, euler, sigmas, seed=7, cfg=cfg, chunk_frames=2, window_chunks=0, progress=False
    )


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_the_pack_sampler_keeps_its_cache_and_leaves_the_backend_cross_attention(
    nodes, loop, tiny, euler, backend, caplog
):
    plain = run_pack(loop, int2_jensen(nodes, tiny), euler)
    seen: list[int] = []
    with caplog.at_level(logging.WARNING, logger="jensen_kv"):
        out = run_pack(loop, int2_jensen(nodes, with_backend(tiny, backend, seen)), euler)
    # the backend served cross-attention (text keys) in every layer of every call, and never a self-attention
    assert seen and set(seen) == {COND_TOKENS}, sorted(set(seen))
    # the quantized cache was used exactly as without the backend; cross-attention differs by the backend's
    # arithmetic only
    assert out.report["cache_bytes"] == plain.report["cache_bytes"] > 0
    assert out.report["key_bits"] == 2
    # (ComfyUI's default CPU attention need not be the registered "pytorch" one: measured 1.4e-6 apart)
    torch.testing.assert_close(out.samples, plain.samples, atol=1e-5, rtol=0)
    assert any("attention backend override" in r.getMessage() for r in caplog.records), caplog.text


@pytest.mark.core_ar
@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_core_ar_path_keeps_the_cache_under_every_backend(nodes, backend, caplog):
    causal = cw.build_causal_patcher(seed=0)
    lat = torch.zeros(1, 16, 4, 8, 8)
    sigmas = cw.self_forcing_sigmas()
    pos = wan_tiny.conditioning(1, COND_TOKENS, 32)
    neg = wan_tiny.conditioning(2, COND_TOKENS, 32)
    plain = cw.sample_core(int2_jensen(nodes, causal), lat, sigmas, num_frame_per_block=2, positive=pos, negative=neg)
    seen: list[int] = []
    with caplog.at_level(logging.WARNING, logger="jensen_kv"):
        out = cw.sample_core(
            int2_jensen(nodes, with_backend(causal, backend, seen)),
            lat,
            sigmas,
            num_frame_per_block=2,
            positive=pos,
            negative=neg,
        )
    assert set(seen) <= {COND_TOKENS}, sorted(set(seen))  # core caches the text K/V: cross-attention may not call it
    torch.testing.assert_close(out, plain, atol=1e-5, rtol=0)
    assert any("attention backend override" in r.getMessage() for r in caplog.records), caplog.text


def test_the_model_attention_backend_node_is_noticed_where_comfyui_has_it(nodes, tiny):
    """On 0.33 the real node: its MODEL carries the override the notice names; older versions lack the node."""
    import importlib

    import comfy_extras.nodes_model_advanced as adv

    families = importlib.import_module(f"{nodes.__name__.rsplit('.', 1)[0]}.runtime.families")
    assert families.attention_override_notice(tiny.model_options) is None
    node = getattr(adv, "ModelAttentionBackend", None)
    if node is None:
        assert not hasattr(tiny, "set_model_optimized_attention")
        return
    (m,) = node().patch(tiny, "pytorch attention")
    notice = families.attention_override_notice(m.model_options)
    assert notice is not None and "cross-attention only" in notice


def test_the_tiny_wan_is_built_from_the_running_comfyuis_own_classes(tiny):
    """Every integration test's tiny Wan comes from ComfyUI's classes, so on 0.33 it has 0.33's WanFeedForward
    (the FFN became a module of its own there) and the equivalence tests run against it."""
    import comfy.ldm.wan.model as wan

    ffn = tiny.model.diffusion_model.blocks[0].ffn
    ffn_class = getattr(wan, "WanFeedForward", None)
    if ffn_class is not None:  # 0.33
        assert type(ffn) is ffn_class
    else:
        assert type(ffn) is torch.nn.Sequential
