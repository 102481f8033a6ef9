"""The pack inside ComfyUI's own AR video path (v0.27+): SamplerARVideo -> sample_ar_video over CausalWanModel.

In-process, with a tiny random causal Wan (jensen_testing/causal_wan.py) and core's own sampler
(``comfy.samplers.ksampler("ar_video", ...)`` as SamplerARVideo returns it, through SamplerCustom's
``comfy.sample.sample_custom``). The reference is core's own run of the same model, noise and sigmas
without the pack's nodes. The live-server version is tests/integration/test_core_ar_server.py.
"""

from __future__ import annotations

import importlib

import pytest
import torch
from support import causal_wan as cw
from support import comfyui as support_comfyui
from support import wan_tiny

pytestmark = [pytest.mark.core_ar]

# fp32 throughout: the pack attends with SDPA over [cache, block] (two pieces merged by log-sum-exp once
# anything is cached) where core attends over one concatenated K/V, so the sums run in another order:
# equal to ~1e-6 relative, not bit for bit (measured max |diff| 9.5e-7 on outputs of magnitude ~7)
FP32_ATOL = 2e-5


@pytest.fixture(scope="module")
def core_ar(pack):
    return importlib.import_module(f"{support_comfyui.PACK_MODULE}.runtime.core_ar")


@pytest.fixture(scope="module")
def diag_nodes(pack):
    return importlib.import_module(f"{support_comfyui.PACK_MODULE}.nodes.kv_cache_diagnostics")


@pytest.fixture
def causal(comfy):
    return cw.build_causal_patcher(seed=0)


def quantized(nodes, model, bits="2", rotation="none", mode=None, strength=1.0):
    m = nodes.JensenKVQuantizeKVCache.execute(model, bits, bits, "32", rotation).args[0]
    if mode is not None:
        m = nodes.JensenKVBiasCorrection.execute(m, mode, strength).args[0]
    return m


def psnr(a, ref):
    return float(10 * torch.log10(ref.pow(2).max() / (a - ref).pow(2).mean().clamp_min(1e-30)))


SIGMAS = cw.self_forcing_sigmas()


@pytest.mark.parametrize("block,frames,batch", [(2, 6, 1), (1, 4, 2), (3, 7, 1)])
def test_full_precision_cache_gives_core_result(nodes, causal, block, frames, batch):
    """Quantization off, no window: the pack's cache on core's path gives core's own video (fp32 tolerance)."""
    lat = torch.zeros(batch, 16, frames, 8, 8)
    ref = cw.sample_core(causal, lat, SIGMAS, num_frame_per_block=block, seed=3)
    out = cw.sample_core(quantized(nodes, causal, "off"), lat, SIGMAS, num_frame_per_block=block, seed=3)
    torch.testing.assert_close(out, ref, atol=FP32_ATOL, rtol=0)
    # and the pack really served it (its caches were used), while core's own run is unchanged afterwards
    again = cw.sample_core(causal, lat, SIGMAS, num_frame_per_block=block, seed=3)
    assert torch.equal(again, ref)


def test_int8_stays_close_and_int2_moves_away(nodes, core_ar, causal):
    lat = torch.zeros(1, 16, 6, 8, 8)
    ref = cw.sample_core(causal, lat, SIGMAS, num_frame_per_block=2, seed=3)
    q8, q2 = quantized(nodes, causal, "8"), quantized(nodes, causal, "2")
    p8 = psnr(cw.sample_core(q8, lat, SIGMAS, num_frame_per_block=2, seed=3), ref)
    p2 = psnr(cw.sample_core(q2, lat, SIGMAS, num_frame_per_block=2, seed=3), ref)
    # measured: INT8 ~100 dB, INT2 ~62 dB on this tiny random model
    assert p8 > 80, p8
    assert p2 < p8 - 20, (p8, p2)
    r8, r2 = core_ar.last_report(q8), core_ar.last_report(q2)
    assert r8["key_bits"] == 8 and r2["key_bits"] == 2 and r2["cache_bytes"] < r8["cache_bytes"]
    assert r2["sampler"] == "core sample_ar_video"


@pytest.mark.parametrize("window,sink", [(0, 0), (2, 0), (1, 1)])
def test_peak_cache_equals_the_planner_and_the_window_bounds_it(nodes, core_ar, causal, window, sink):
    lat = torch.zeros(1, 16, 6, 8, 8)
    m = quantized(nodes, causal, "2", mode="taylor")
    if window or sink:
        m = nodes.JensenKVARCacheWindow.execute(m, window, sink).args[0]
    cw.sample_core(m, lat, SIGMAS, num_frame_per_block=1, seed=1)
    rep = core_ar.last_report(m)
    assert rep["cache_bytes"] == rep["planned_bytes"] > 0
    assert rep["window_chunks"] == window and rep["sink_chunks"] == sink
    per_chunk = rep["cache_bytes"] // (min(5, window + sink) if window else 5)
    assert rep["cache_bytes"] == per_chunk * (min(5, window + sink) if window else 5)


def test_window_changes_the_video_as_a_bounded_cache_must(nodes, causal):
    lat = torch.zeros(1, 16, 5, 8, 8)
    full = cw.sample_core(quantized(nodes, causal, "off"), lat, SIGMAS, num_frame_per_block=1, seed=2)
    m = nodes.JensenKVARCacheWindow.execute(quantized(nodes, causal, "off"), 1, 0).args[0]
    windowed = cw.sample_core(m, lat, SIGMAS, num_frame_per_block=1, seed=2)
    torch.testing.assert_close(windowed[:, :, :2], full[:, :, :2], atol=FP32_ATOL, rtol=0)  # cache holds <= 1 chunk
    assert (windowed[:, :, 2:] - full[:, :, 2:]).abs().max() > 1e-3


def test_correction_gives_attention_back_on_core_path(nodes, diag_nodes, core_ar, causal):
    """KV Cache Diagnostics on core's path: INT2 keys steal attention (ΔP_S > 0) and Taylor gives most of it back."""
    m = quantized(nodes, causal, "2", mode="taylor")
    m = diag_nodes.JensenKVDiagnostics.execute(m, "all", "all", "all", 1).args[0]
    cw.sample_core(m, torch.zeros(1, 16, 4, 8, 8), SIGMAS, num_frame_per_block=1, seed=0)
    d = core_ar.last_report(m)["diagnostics"]
    assert d["modes"] == ["off", "taylor"] and d["applied"] == "taylor"
    assert d["chunks"] == [1, 2, 3] and d["steps"] == [0, 1, 2, 3]
    assert d["calls"] == 2 * 4 * 3  # layers x steps x blocks 1-3 (the clean passes are not measured)
    none, fixed = d["stats"]["off"], d["stats"]["taylor"]
    assert none["median_delta_ps"] > 0.005
    assert abs(fixed["median_delta_ps"]) < 0.5 * none["median_delta_ps"], (none, fixed)


def test_i2v_start_latent_seeds_the_pack_cache(nodes, core_ar, causal):
    """ARVideoI2V's initial_latent: core writes it with one sigma-0 pass; the pack caches it like any chunk."""
    g = torch.Generator().manual_seed(7)
    initial = torch.randn(1, 16, 1, 8, 8, generator=g)

    def with_start(model):
        m = model.clone()
        m.model_options.setdefault("transformer_options", {}).setdefault("ar_config", {})["initial_latent"] = initial
        return m

    lat = torch.zeros(1, 16, 5, 8, 8)
    ref = cw.sample_core(with_start(causal), lat, SIGMAS, num_frame_per_block=2, seed=4)
    q = with_start(quantized(nodes, causal, "off"))
    out = cw.sample_core(q, lat, SIGMAS, num_frame_per_block=2, seed=4)
    torch.testing.assert_close(out, ref, atol=FP32_ATOL, rtol=0)
    rep = core_ar.last_report(q)
    assert rep["prefix_frames"] == 1
    # the planner counts the 1-frame start chunk as a full 2-frame chunk: an upper bound by less than one chunk
    one_frame = rep["cache_bytes"] // 3  # start frame + one 2-frame block are cached (the last block never is)
    assert rep["cache_bytes"] == 3 * one_frame and rep["planned_bytes"] == rep["cache_bytes"] + one_frame


def test_cfg_batched_and_split_agree_and_cache_both_branches(nodes, core_ar, causal, monkeypatch):
    """cfg > 1: cond and uncond get their own caches whether ComfyUI batches them or runs them one by one."""
    import comfy.model_patcher

    lat = torch.zeros(1, 16, 4, 8, 8)
    m = quantized(nodes, causal, "4", mode="taylor")
    batched = cw.sample_core(m, lat, SIGMAS, num_frame_per_block=2, seed=5, cfg=3.0)
    assert core_ar.last_report(m)["cfg_branches"] == 2
    monkeypatch.setattr(comfy.model_patcher.ModelPatcher, "get_free_memory", lambda self, *a, **k: 0)
    split = cw.sample_core(m, lat, SIGMAS, num_frame_per_block=2, seed=5, cfg=3.0)
    torch.testing.assert_close(split, batched, atol=FP32_ATOL, rtol=0)
    single = cw.sample_core(m, lat, SIGMAS, num_frame_per_block=2, seed=5, cfg=1.0)
    assert (single - batched).abs().max() > 1e-3


# ------------------------------------------------------------------------------------------- never silent
def test_plain_sampler_on_a_model_with_pack_settings_is_refused(nodes, core_ar, tiny, causal):
    import comfy.sample

    pos = wan_tiny.conditioning(1, 16, 32)
    for model in (tiny, causal):
        m = quantized(nodes, model, "2", mode="taylor")
        lat = torch.zeros(1, 16, 3, 8, 8)
        with pytest.raises(core_ar.UnusedSettingsError, match="Chunked AR Video Sampler.*SamplerARVideo") as err:
            comfy.sample.sample(
                m, torch.zeros_like(lat), 2, 1.0, "euler", "simple", pos, pos, lat, seed=0, disable_pbar=True
            )
        # named as the user picked it (KSampler's sampler_name), not as k-diffusion's internal sample_euler
        assert "the sampler 'euler' denoises the whole video" in str(err.value)
        assert "sample_" not in str(err.value)


def test_sampler_ar_video_on_a_bidirectional_wan_is_refused(nodes, core_ar, tiny):
    m = quantized(nodes, tiny, "2")
    with pytest.raises(core_ar.UnusedSettingsError, match="causal-AR model.*--causal"):
        cw.sample_core(m, torch.zeros(1, 16, 2, 8, 8), SIGMAS)


def test_another_packs_object_patch_on_the_attention_is_refused(nodes, causal):
    other = causal.clone()
    other.add_object_patch("diffusion_model.blocks.1.self_attn.forward", lambda *a, **k: None)
    with pytest.raises(ValueError, match="blocks.1.self_attn.forward.*another node pack"):
        quantized(nodes, other, "2")


def test_a_patch_put_on_the_module_itself_is_refused_not_dropped(nodes, core_ar, causal):
    """Raylight-style: types.MethodType on the attention module instance. The pack must not silently replace it."""
    import types

    m = quantized(nodes, causal, "2")
    attn = causal.model.diffusion_model.blocks[0].self_attn

    def sequence_parallel_forward(self, x, freqs, kv_cache=None, transformer_options=None):
        raise AssertionError("never reached")

    attn.forward = types.MethodType(sequence_parallel_forward, attn)
    try:
        with pytest.raises(core_ar.UnusedSettingsError, match="sequence_parallel_forward"):
            cw.sample_core(m, torch.zeros(1, 16, 2, 8, 8), SIGMAS)
    finally:
        del attn.forward


def test_pack_sampler_refuses_a_conflicting_ar_cache_window(nodes, loop, tiny, euler):
    m = nodes.JensenKVARCacheWindow.execute(quantized(nodes, tiny, "2"), 2, 1).args[0]
    pos = wan_tiny.conditioning(1, 16, 32)
    with pytest.raises(ValueError, match="AR Cache Window .*window 2 chunk.*sink 1.*window_chunks=0"):
        wan_tiny.run(
            loop, m, pos, pos, 4, euler, torch.tensor([1.0, 0.5, 0.0]), chunk_frames=2, window_chunks=0, progress=False
        )
    # the same window on both is fine
    out = wan_tiny.run(
        loop,
        m,
        pos,
        pos,
        4,
        euler,
        torch.tensor([1.0, 0.5, 0.0]),
        chunk_frames=1,
        window_chunks=2,
        sink_chunks=1,
        progress=False,
    )
    assert out.report["window_chunks"] == 2 and out.report["sink_chunks"] == 1


def test_an_interrupt_mid_run_leaves_nothing_behind(nodes, core_ar, causal):
    """An interrupt in the middle of core's loop: the session ends, the next run (pack or core) is as before."""
    import comfy.model_management
    import comfy.sample
    import comfy.utils

    lat = torch.zeros(1, 16, 4, 8, 8)
    m = quantized(nodes, causal, "2", mode="taylor")
    ref = cw.sample_core(m, lat, SIGMAS, num_frame_per_block=1, seed=9)
    calls = []

    def interrupt_at_block_2(step, x0, x, total):
        calls.append(step)
        if len(calls) == 6:  # second block, second step
            raise comfy.model_management.InterruptProcessingException()

    pos = wan_tiny.conditioning(1, 16, 32)
    noise = comfy.sample.prepare_noise(lat, 9)
    with pytest.raises(comfy.model_management.InterruptProcessingException):
        comfy.sample.sample_custom(
            m,
            noise,
            1.0,
            cw.ar_sampler(1),
            SIGMAS,
            pos,
            pos,
            lat,
            callback=interrupt_at_block_2,
            disable_pbar=True,
            seed=9,
        )
    assert core_ar.patches._ACTIVE.get() is None
    assert torch.equal(cw.sample_core(m, lat, SIGMAS, num_frame_per_block=1, seed=9), ref)
    core_ref = cw.sample_core(causal, lat, SIGMAS, num_frame_per_block=1, seed=9)
    assert (core_ref - ref).abs().max() > 1e-4  # INT2 differs from core's own, so the pack did engage above


def test_age_tiers_on_the_core_path_count_to_the_byte(nodes, core_ar, causal):
    """Precision by age on SamplerARVideo: the peak is the planner's, the held block is planned at its bits."""
    lat = torch.zeros(1, 16, 6, 8, 8)
    m = nodes.JensenKVQuantizeKVCache.execute(
        causal, "2", "2", "16", "none", "fp8_e4m3", 0, "rtn", 1, 256, 2, "4", 1, "8"
    ).args[0]
    m = nodes.JensenKVBiasCorrection.execute(m, "taylor", 1.0).args[0]
    m = nodes.JensenKVARCacheWindow.execute(m, 2, 1).args[0]
    cw.sample_core(m, lat, SIGMAS, num_frame_per_block=1, seed=1)
    rep = core_ar.last_report(m)
    assert rep["tiers"] == "recent1@4+sink@8" and rep["chunks_demoted"] > 0
    assert rep["cache_bytes"] == rep["planned_bytes"] > 0
    assert rep["in_flight_bytes"] == rep["planned_in_flight_bytes"] > 0
