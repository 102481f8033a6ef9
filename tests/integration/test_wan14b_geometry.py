"""Wan 2.1 14B's attention geometry (dim 5120 = 40 heads x 128) on a random model with 2 layers.

The pack is never run on the real 14B here (28 GB of weights); its self-attention is the same shape at
every layer, so a 2-layer random Wan with the 14B's dim, heads and head_dim (BF16 weights, a small
feed-forward and text width; about 1.3 GB) exercises everything that depends on the head geometry:
the family adapter's reading of it, the cache the loop stores against the planner's figure, the
report, and continue-later, bit for bit against one long run.
"""

from __future__ import annotations

import importlib

import pytest
import torch
from support import wan_tiny

#: Wan 2.1 14B's self-attention: dim 5120 = 40 heads x 128 (its 40 layers cut to 2, the rest small)
WAN14B = dict(dim=5120, ffn_dim=256, num_heads=40, num_layers=2, text_dim=32, text_len=16)
LAYERS, HEADS, HEAD_DIM = 2, 40, 128
FRAMES, CHUNK, STEPS, LATENT = 8, 2, 2, 4  # 4 chunks of 2 latent frames, 4 x 4 latent pixels = 4 tokens a frame
TOKENS = (LATENT // 2) ** 2
WINDOW, SINK = 1, 1


def wan_family():
    """The Wan family's module (its class, presets and geometry)."""
    return importlib.import_module("comfyui_jensen_kv.runtime.families.wan.family")


@pytest.fixture(scope="module")
def big(comfy):
    return wan_tiny.build_patcher(seed=0, dtype=torch.bfloat16, **WAN14B)


@pytest.fixture(scope="module")
def fam(pack):
    return importlib.import_module("comfyui_jensen_kv.runtime.families")


@pytest.fixture(scope="module")
def int2(nodes, big):
    m = nodes.JensenKVQuantizeKVCache.execute(big, "2", "2", "32", "hadamard", "fp8_e4m3", 0).args[0]
    return nodes.JensenKVBiasCorrection.execute(m, "taylor", 1.0).args[0]


@pytest.fixture(scope="module")
def whole(loop, int2):
    """One run of all 4 chunks (the report's figures, and what continue-later must equal)."""
    return _run(loop, int2, FRAMES)


def _run(loop, model, frames, **kw):
    import comfy.samplers

    sigmas = comfy.samplers.calculate_sigmas(model.get_model_object("model_sampling"), "simple", STEPS)
    return loop.run_chunked_ar(
        model,
        wan_tiny.conditioning(1, 13, WAN14B["text_dim"]),
        wan_tiny.conditioning(2, 13, WAN14B["text_dim"]),
        wan_tiny.video_latent(frames, LATENT, LATENT),
        seed=5,
        cfg=1.0,
        sampler=comfy.samplers.sampler_object("euler"),
        sigmas=sigmas,
        chunk_frames=CHUNK,
        window_chunks=WINDOW,
        sink_chunks=SINK,
        progress=False,
        **kw,
    )


def test_the_model_has_wan14b_attention_geometry(big):
    dm = big.model.diffusion_model
    assert dm.dim == 5120 and len(dm.blocks) == LAYERS
    attn = dm.blocks[0].self_attn
    assert (attn.num_heads, attn.head_dim, attn.q.weight.shape) == (HEADS, HEAD_DIM, (5120, 5120))
    assert attn.q.weight.dtype == torch.bfloat16


def test_the_adapter_reads_40_heads_of_128(fam, big):
    adapter = fam.detect(big)
    assert isinstance(adapter, wan_family().WanFamily)
    assert (adapter.num_layers, adapter.heads, adapter.head_dim) == (LAYERS, HEADS, HEAD_DIM)
    assert tuple(wan_family().WanFamily.attention_shape(big)) == (LAYERS, HEADS, HEAD_DIM)
    # the preset the planner uses for the real 14B has the same heads and head_dim, with its 40 layers
    assert wan_family().PRESETS["wan2.1-14b"] == (40, HEADS, HEAD_DIM)


def test_cache_bytes_and_report_equal_the_planner(fam, int2, whole):
    from comfyui_jensen_kv.jensen_core.planner import CachePrecision, CacheShape, plan_cache
    from comfyui_jensen_kv.runtime.config import get_config

    rep = whole.report
    config = get_config(int2.model_options)
    plan = plan_cache(
        latent_frames=FRAMES,
        latent_height=LATENT,
        latent_width=LATENT,
        chunk_frames=CHUNK,
        window_chunks=WINDOW,
        sink_chunks=SINK,
        shape=CacheShape(
            layers=LAYERS, heads=HEADS, head_dim=HEAD_DIM, geometry=wan_family().GEOMETRY, cfg_branches=1, full_bytes=2
        ),
        precision=CachePrecision(spec_k=config.spec_k, spec_v=config.spec_v),
    )
    assert plan.runnable and not plan.warnings
    # 4 chunks, the last not written (no state kept): 3 written, sink 1 + window 1 -> 2 held at the peak
    assert (plan.tokens_per_latent_frame, plan.chunks, plan.cached_chunks_peak) == (TOKENS, 4, 2)
    assert plan.cached_tokens_peak == 2 * CHUNK * TOKENS
    # BF16 keys and values of the held tokens, every layer and head, counted by hand
    assert plan.bf16_bytes == 2 * (2 * CHUNK * TOKENS) * HEADS * HEAD_DIM * LAYERS * 2 == 655_360
    assert rep["cache_bytes"] == rep["planned_bytes"] == plan.quantized_bytes
    assert plan.bf16_bytes / 8 < plan.quantized_bytes < plan.bf16_bytes / 4  # INT2 g32 + scales: 2-4 bits
    assert rep["bf16_bytes"] == plan.bf16_bytes
    assert (rep["layers"], rep["heads"], rep["head_dim"]) == (LAYERS, HEADS, HEAD_DIM)
    assert (rep["key_bits"], rep["value_bits"], rep["group_size"], rep["correction"]) == (2, 2, 32, "taylor")
    assert (rep["chunks"], rep["window_chunks"], rep["sink_chunks"], rep["tokens_per_frame"]) == (4, 1, 1, TOKENS)
    assert rep["effective_bits"] == pytest.approx(plan.effective_bits)


def test_continue_later_equals_one_long_run_bit_for_bit(loop, int2, whole, tmp_path):
    rs = importlib.import_module("comfyui_jensen_kv.runtime.saved_run")
    whole = whole.samples
    first = _run(loop, int2, FRAMES // 2, keep_state=True)
    path = str(tmp_path / "wan14b.safetensors")
    first.state.save(path)
    state = rs.load_saved_run(path)
    assert (state.next_chunk, state.next_frame) == (2, FRAMES // 2)
    assert (state.fingerprint["heads"], state.fingerprint["head_dim"]) == (HEADS, HEAD_DIM)
    assert state.fingerprint["layers"] == LAYERS
    second = _run(loop, int2, FRAMES // 2, resume=state)
    assert torch.isfinite(whole).all() and whole.abs().sum() > 0
    assert torch.equal(first.samples, whole[:, :, : FRAMES // 2])
    assert torch.equal(second.samples, whole[:, :, FRAMES // 2 :])
    assert second.report["first_chunk"] == 2 and second.report["resumed"]
    assert (second.report["heads"], second.report["head_dim"]) == (HEADS, HEAD_DIM)
