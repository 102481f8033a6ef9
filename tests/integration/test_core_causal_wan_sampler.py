"""The pack's Chunked AR sampler on ComfyUI v0.27's own causal Wan (``WAN21_CausalAR`` / ``CausalWanModel``).

A tiny causal Wan is built from core's classes (``supported_models.WAN21_CausalAR_T2V``, random weights as
``support.wan_tiny`` draws them, fp32); the same weights are loaded into a plain ``WAN21`` / ``WanModel``.
``runtime.chunk_loop.run_chunked_ar`` must give both the same video (fp32 tolerance; measured: bit-identical),
in full precision and with an INT2 + Jensen cache, and leave nothing of the run behind: the input patchers
unchanged, core's self-attention core's own, no pack wrapper, and core's own AR sampler (``SamplerARVideo``'s
``ar_video``) and plain forward giving bit-identical results before and after. (The Quantize / Jensen nodes'
core-path object patches, runtime/core_ar, stay applied while ComfyUI keeps that MODEL loaded, as any node's
object patches do; unloading restores core's methods.)
Core's ``CausalWanSelfAttention.forward(x, freqs, kv_cache=None, transformer_options={})`` is called by
``CausalWanAttentionBlock`` with ``kv_cache=None`` outside core's AR sampler, which the pack's patch accepts.

One more cross-check: with one sampling step the two AR samplers compute the same thing (denoise a chunk
from pure noise against the clean cache, then cache the clean chunk at sigma 0), so the pack's sampler and
core's ``ar_video`` agree when core is given the pack's per-chunk noise.

Needs v0.27's core AR path: ``core_ar`` (deselected on ComfyUI without it).
"""

from __future__ import annotations

import pytest
import torch
from support import causal_wan, wan_tiny

pytestmark = pytest.mark.core_ar

FRAMES = 6
CHUNK = 2
COND_TOKENS = 13


def plain_with_weights_of(causal):
    """A plain WAN21 / WanModel ModelPatcher holding exactly ``causal``'s weights."""
    plain = wan_tiny.build_patcher(seed=1)  # other random weights, overwritten
    missing = plain.model.diffusion_model.load_state_dict(causal.model.diffusion_model.state_dict(), strict=True)
    assert not missing.missing_keys and not missing.unexpected_keys
    return plain


def snapshot(patcher) -> dict:
    """What a run could leave behind on a ModelPatcher: object patches, wrappers, transformer options."""
    return {
        "object_patches": dict(patcher.object_patches),
        "wrappers": {k: {kk: list(vv) for kk, vv in v.items()} for k, v in patcher.wrappers.items()},
        "transformer_options": sorted(patcher.model_options.get("transformer_options", {})),
    }


def assert_core_forwards(patcher, *, init_too: bool = True):
    """Every block's self_attn.forward is core's CausalWanSelfAttention.forward bound to that block (ComfyUI's own
    unpatching leaves that bound method in the instance dict, as for any object patch); with ``init_too``, core's
    cache initialisers are core's own as well."""
    from comfy.ldm.wan.ar_model import CausalWanModel, CausalWanSelfAttention

    dm = patcher.model.diffusion_model
    assert type(patcher.model).__name__ == "WAN21_CausalAR" and type(dm) is CausalWanModel
    for i, blk in enumerate(dm.blocks):
        fwd = blk.self_attn.forward
        assert type(blk.self_attn) is CausalWanSelfAttention
        assert getattr(fwd, "__func__", None) is CausalWanSelfAttention.forward, f"block {i}: {fwd!r} still patched"
        assert fwd.__self__ is blk.self_attn
    if init_too:
        for name in ("init_kv_caches", "init_crossattn_caches"):
            fn = getattr(dm, name)
            assert getattr(fn, "__func__", None) is getattr(CausalWanModel, name), f"{name}: {fn!r} still patched"
    assert not any(k.endswith("self_attn.forward") for k in patcher.object_patches_backup)


def sigmas(model, steps: int):
    import comfy.samplers

    return comfy.samplers.calculate_sigmas(model.get_model_object("model_sampling"), "simple", steps)


def conds():
    return wan_tiny.conditioning(1, COND_TOKENS, 32), wan_tiny.conditioning(2, COND_TOKENS, 32)


def run_pack(loop, model, sampler, sig, *, cfg, window=0, seed=7):
    pos, neg = conds()
    return wan_tiny.run(
        loop,
        model,
        pos,
        neg,
        FRAMES,
        sampler,
        sig,
        seed=seed,
        cfg=cfg,
        chunk_frames=CHUNK,
        window_chunks=window,
        progress=False,
    )


def run_core_ar(model, sig, noise, *, seed=7):
    """Core's own AR sampler (what SamplerCustom + SamplerARVideo run), cfg 1, CHUNK frames per block."""
    import comfy.sample
    import comfy.samplers

    pos, neg = conds()
    sampler = comfy.samplers.ksampler("ar_video", {"num_frame_per_block": CHUNK})
    return comfy.sample.sample_custom(
        model, noise, 1.0, sampler, sig, pos, neg, torch.zeros_like(noise), disable_pbar=True, seed=seed
    )


def quantized(nodes, model):
    m = nodes.JensenKVQuantizeKVCache.execute(model, "2", "2", "16", "hadamard", "fp8_e4m3", 0).args[0]
    return nodes.JensenKVBiasCorrection.execute(m, "taylor", 1.0).args[0]


@pytest.fixture
def causal(comfy):
    import comfy.supported_models

    assert hasattr(comfy.supported_models, "WAN21_CausalAR_T2V"), "this ComfyUI has no core AR path (v0.27+)"
    return causal_wan.build_causal_patcher(seed=0)


@pytest.mark.parametrize("cache", ["full", "int2_jensen"])
@pytest.mark.parametrize("cfg,window", [(1.0, 0), (3.0, 0), (3.0, 1)], ids=["cfg1", "cfg3", "cfg3-window1"])
def test_core_causal_wan_samples_like_the_same_weights_as_plain_wan21(loop, nodes, causal, euler, cfg, window, cache):
    import comfy.model_management

    plain = plain_with_weights_of(causal)
    sig = sigmas(plain, 3)  # one schedule for both: core's causal config defaults to shift 5, Wan 2.1 to 8
    assert float(causal.model.model_sampling.sigma_max) == float(plain.model.model_sampling.sigma_max) == 1.0
    c_in, p_in = (quantized(nodes, causal), quantized(nodes, plain)) if cache == "int2_jensen" else (causal, plain)
    before = {"causal": snapshot(causal), "input": snapshot(c_in)}
    got = run_pack(loop, c_in, euler, sig, cfg=cfg, window=window)
    ref = run_pack(loop, p_in, euler, sig, cfg=cfg, window=window)
    assert loop.detect(c_in).model_class == "WAN21_CausalAR/CausalWanModel"  # the Wan family took core's model
    assert loop.detect(p_in).model_class == "WAN21/WanModel"
    assert got.report["chunks"] == ref.report["chunks"] == FRAMES // CHUNK
    assert got.report["cache_bytes"] == ref.report["cache_bytes"] > 0
    assert torch.isfinite(got.samples).all() and float(got.samples.abs().mean()) > 0.1
    torch.testing.assert_close(got.samples, ref.samples, atol=1e-5, rtol=1e-5)
    # nothing of the run stays: the input patchers are as they were, core's self-attention is core's own
    assert {"causal": snapshot(causal), "input": snapshot(c_in)} == before
    assert not any(k.endswith("self_attn.forward") for k in causal.object_patches)
    assert not any("jensen_kv_rope_offset" in str(k) for v in c_in.wrappers.values() for k in v)
    # the pack's nodes put core-path patches on c_in (runtime/core_ar): ComfyUI keeps the last loaded
    # patcher's object patches applied until it unloads it, as for any node's object patch
    assert_core_forwards(causal, init_too=c_in is causal)
    comfy.model_management.unload_all_models()
    assert_core_forwards(causal)


def test_core_forward_and_core_ar_sampler_are_unchanged_by_a_pack_run(loop, nodes, causal, euler):
    """Before and after a (quantized) pack run on the same patcher: core's plain forward and core's ar_video
    sampler give bit-identical results, so nothing of the pack is left in core's path."""
    import comfy.sample

    dm = causal.model.diffusion_model
    g = torch.Generator().manual_seed(3)
    x, ctx = torch.randn(1, 16, 2, 8, 8, generator=g), torch.randn(1, COND_TOKENS, 32, generator=g)
    t = torch.full((1,), 500.0)
    sig = sigmas(causal, 2)
    noise = comfy.sample.prepare_noise(torch.zeros(1, 16, FRAMES, 8, 8), 11)
    with torch.no_grad():
        fwd_before = dm(x, t, ctx)
    ar_before = run_core_ar(causal, sig, noise)
    run_pack(loop, quantized(nodes, causal), euler, sig, cfg=3.0)
    run_pack(loop, causal, euler, sig, cfg=1.0)
    assert_core_forwards(causal)
    with torch.no_grad():
        assert torch.equal(dm(x, t, ctx), fwd_before)
    assert torch.equal(run_core_ar(causal, sig, noise), ar_before)


def test_one_step_pack_sampler_equals_cores_ar_video_given_the_same_noise(loop, causal, euler):
    """One step from sigma 1: both samplers take the model's denoised chunk against a cache of the clean
    earlier chunks written at sigma 0 (core: per-frame timesteps in forward_block, its own caches; the pack:
    its cache and RoPE offset). Core gets the pack's per-chunk initial noise, concatenated."""
    import comfy.sample

    sig = torch.tensor([1.0, 0.0])
    seed = 7
    latent = wan_tiny.video_latent(FRAMES)["samples"]
    noise = torch.cat(
        [
            comfy.sample.prepare_noise(latent[:, :, f0 : f0 + CHUNK], loop.chunk_seed(seed, c, loop.NOISE_STREAM))
            for c, f0 in enumerate(range(0, FRAMES, CHUNK))
        ],
        dim=2,
    )
    ours = run_pack(loop, causal, euler, sig, cfg=1.0, seed=seed).samples
    core = run_core_ar(causal, sig, noise, seed=seed)
    assert float(core.abs().mean()) > 0.1
    torch.testing.assert_close(ours, core, atol=1e-5, rtol=1e-5)
    # the cache matters: chunk 1 of a run without earlier chunks would differ
    alone = run_core_ar(causal, sig, noise[:, :, CHUNK : 2 * CHUNK])
    assert float((alone - core[:, :, CHUNK : 2 * CHUNK]).abs().max()) > 1e-3
