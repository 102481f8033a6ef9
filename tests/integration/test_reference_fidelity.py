"""What a user with real weights would see against the reference samplers, on a tiny Wan.

- every chunk draws its own noise (initial and per-step), black-box: with a model whose output is
  zero, the LCM outputs of different chunks are uncorrelated (and the test catches the old bug);
- an attention sink: a run with window + sink equals one block-causal forward whose mask keeps the
  first chunks visible;
- the correction's strength reaches the attention (0.5 against a reference with 0.5 x the bias);
- newer ComfyUI's Causal Forcing classes (subclasses of WAN21 / WanModel) are accepted when their
  self-attention has what the patch uses, and variants with extra latent inputs are refused.
"""

from __future__ import annotations

import pytest
import torch
from support import reference, wan_tiny

SF_SIGMAS = [1.0, 0.9375, 0.8333, 0.625, 0.0]  # Self-Forcing's 4 steps (shift 5): what the model sees as t / 1000


def _zero_output_model(seed=0):
    """A tiny Wan whose diffusion model outputs exactly zero (its head is zero); its blocks still run."""
    patcher = wan_tiny.build_patcher(seed=seed)
    head = patcher.model.diffusion_model.head.head
    with torch.no_grad():
        head.weight.zero_()
        head.bias.zero_()
    return patcher


def _chunk_correlations(loop, model, seed, frames=8, chunk=2):
    import comfy.samplers

    pos, neg = wan_tiny.conditioning(1, 13, 32), wan_tiny.conditioning(2, 13, 32)
    res = wan_tiny.run(
        loop,
        model,
        pos,
        neg,
        frames,
        comfy.samplers.sampler_object("lcm"),
        torch.tensor(SF_SIGMAS),
        seed=seed,
        chunk_frames=chunk,
        progress=False,
    )
    x = model.model.latent_format.process_in(res.samples)  # model space: no per-channel offsets shared by chunks
    chunks = [x[:, :, f : f + chunk].flatten() for f in range(0, frames, chunk)]
    r = torch.corrcoef(torch.stack(chunks))
    off = r[~torch.eye(len(chunks), dtype=torch.bool)]
    return off.abs().max().item(), res.samples


def test_every_chunk_draws_fresh_noise_under_lcm(loop, comfy):
    model = _zero_output_model()
    worst, samples = _chunk_correlations(loop, model, seed=11)
    n = 16 * 2 * 8 * 8  # elements per chunk
    assert worst < 5 / n**0.5, worst  # ~ independent chunks (|r| of independent normals ~ 1/sqrt(n))
    _, again = _chunk_correlations(loop, model, seed=11)
    assert torch.equal(samples, again)  # still reproducible from the seed


def test_the_noise_test_catches_shared_per_step_noise(loop, comfy, monkeypatch):
    """Positive control: re-seeding every chunk's sampler identically (the old bug) correlates the chunks."""
    real = loop.chunk_seed
    monkeypatch.setattr(
        loop,
        "chunk_seed",
        lambda seed, chunk, stream: (
            real(seed, 0, stream) if stream == loop.SAMPLER_STREAM else real(seed, chunk, stream)
        ),
    )
    worst, _ = _chunk_correlations(loop, _zero_output_model(), seed=11)
    assert worst > 0.5, worst


def test_chunk_seeds_are_distinct_and_stable(loop, comfy):
    seeds = {loop.chunk_seed(5, c, s) for c in range(200) for s in range(3)}
    assert len(seeds) == 600 and all(0 <= x < 2**63 for x in seeds)
    assert loop.chunk_seed(5, 3, 1) == loop.chunk_seed(5, 3, 1) != loop.chunk_seed(6, 3, 1)


# ------------------------------------------------------------------------------------------------ sink
@pytest.mark.parametrize("window,sink", [(1, 1), (1, 2)])
def test_window_with_sink_matches_block_causal_forward(loop, tiny, euler, window, sink):
    import comfy.patcher_extension
    import comfy.samplers

    rec = reference.DiffusionModelRecorder()
    m = tiny.clone()
    m.add_wrapper_with_key(comfy.patcher_extension.WrappersMP.DIFFUSION_MODEL, "test_recorder", rec)
    pos, neg = wan_tiny.conditioning(1, 13, 32), wan_tiny.conditioning(2, 13, 32)
    sigmas = comfy.samplers.calculate_sigmas(tiny.get_model_object("model_sampling"), "simple", 2)
    res = wan_tiny.run(
        loop,
        m,
        pos,
        neg,
        10,
        euler,
        sigmas,
        seed=3,
        chunk_frames=2,
        window_chunks=window,
        sink_chunks=sink,
        progress=False,
    )
    assert res.report["sink_chunks"] == sink
    dm = tiny.model.diffusion_model
    writes, i = [], 0
    for c in range(5):
        denoise = rec.calls[i : i + 2]
        i += 2
        for call in denoise:
            frames = [w["x"] for w in writes] + [call["x"]]
            ts = [torch.zeros_like(call["t"]) for _ in writes] + [call["t"]]
            ref = reference.block_causal_forward(dm, frames, ts, call["context"], window=window, sink=sink)
            torch.testing.assert_close(call["out"], ref[:, :, 2 * c :], atol=1e-5, rtol=1e-5)
        if c < 4:
            writes.append(rec.calls[i])
            i += 1
    # without the sink the last chunk sees something else: the comparison is sensitive to it
    call = rec.calls[-1]
    frames = [w["x"] for w in writes] + [call["x"]]
    ts = [torch.zeros_like(call["t"]) for _ in writes] + [call["t"]]
    no_sink = reference.block_causal_forward(dm, frames, ts, call["context"], window=window, sink=0)[:, :, 8:]
    assert (no_sink - call["out"]).abs().max() > 1e-3
    # the cache held sink + window chunks at its peak, as the planner projects
    per_chunk_bytes = 2 * 2 * 2 * 32 * 32 * 4  # layers x (k, v) x heads x tokens x head_dim x fp32
    assert res.report["cache_bytes"] == (sink + window) * per_chunk_bytes == res.report["planned_bytes"]


# ------------------------------------------------------------------------------------------------ strength
def test_strength_scales_the_correction_inside_a_run(loop, nodes, tiny, euler):
    """A run at strength 0.5 attends with exactly 0.5 x the Taylor bias (not 0, not 1)."""
    import importlib

    bias_mod = importlib.import_module("comfyui_jensen_kv.jensen_core.bias")
    events = []

    class Grab:
        def wants(self, layer, chunk, phase, step):
            return layer == 0 and chunk == 1 and phase == "denoise" and step == 0

        def __call__(self, e):
            events.append((e, list(e.cache.entries)))  # the run frees its cache when it ends

    m = nodes.JensenKVQuantizeKVCache.execute(tiny, "2", "2", "16", "hadamard", "fp8_e4m3", 0).args[0]
    m = nodes.JensenKVBiasCorrection.execute(m, "taylor", 0.5).args[0]
    pos, neg = wan_tiny.conditioning(1, 13, 32), wan_tiny.conditioning(2, 13, 32)
    import comfy.samplers

    sigmas = comfy.samplers.calculate_sigmas(tiny.get_model_object("model_sampling"), "simple", 2)
    wan_tiny.run(loop, m, pos, neg, 4, euler, sigmas, seed=1, chunk_frames=2, observer=Grab(), progress=False)
    ((e, entries),) = events
    assert e.strength == 0.5
    (entry,) = entries
    k_hat, v_hat = entry.k.dequantize(dtype=torch.float32), entry.v.dequantize(dtype=torch.float32)
    d = e.q.shape[-1]
    bias = bias_mod.jensen_bias(e.q, entry.k, mode="taylor")
    assert bias.abs().max() > 1e-3  # the bias is not negligible here, so 0.5 vs 1.0 is visible

    def ref(lam):
        scores = torch.cat(
            [e.q @ k_hat.transpose(-1, -2) / d**0.5 - lam * bias, e.q @ e.k.transpose(-1, -2) / d**0.5], dim=-1
        )
        return torch.softmax(scores, -1) @ torch.cat([v_hat, e.v], dim=-2)

    torch.testing.assert_close(e.out, ref(0.5), atol=2e-5, rtol=1e-4)
    assert (e.out - ref(1.0)).abs().max() > 10 * (e.out - ref(0.5)).abs().max()
    assert (e.out - ref(0.0)).abs().max() > 10 * (e.out - ref(0.5)).abs().max()


# ------------------------------------------------------------------------------------------------ model classes
def _causal_like(seed=0, drop_attr=None, extra_conds=False):
    """The tiny Wan re-classed as subclasses, as newer ComfyUI's WAN21_CausalAR / CausalWanModel are."""
    import comfy.model_base
    from comfy.ldm.wan.model import WanModel, WanSelfAttention

    class CausalSelfAttentionLike(WanSelfAttention):
        def forward(self, x, freqs, kv_cache=None, transformer_options=None):
            return super().forward(x, freqs, transformer_options=transformer_options or {})

    class CausalWanModelLike(WanModel):
        pass

    class WAN21CausalARLike(comfy.model_base.WAN21):
        pass

    class WAN21WithContextLatents(comfy.model_base.WAN21):
        def extra_conds(self, **kwargs):
            out = super().extra_conds(**kwargs)
            return out  # stands in for a variant that adds context latents to the conds

    patcher = wan_tiny.build_patcher(seed=seed)
    base = patcher.model
    base.__class__ = WAN21WithContextLatents if extra_conds else WAN21CausalARLike
    base.diffusion_model.__class__ = CausalWanModelLike
    for blk in base.diffusion_model.blocks:
        blk.self_attn.__class__ = CausalSelfAttentionLike
        if drop_attr:
            delattr(blk.self_attn, drop_attr)
    return patcher


def test_subclasses_with_the_same_attention_are_accepted_and_equal(loop, tiny, euler):
    import comfy.samplers

    pos, neg = wan_tiny.conditioning(1, 13, 32), wan_tiny.conditioning(2, 13, 32)
    sigmas = comfy.samplers.calculate_sigmas(tiny.get_model_object("model_sampling"), "simple", 2)
    kw = dict(seed=4, cfg=1.0, sampler=euler, sigmas=sigmas, chunk_frames=2, progress=False)
    plain = loop.run_chunked_ar(wan_tiny.build_patcher(seed=0), pos, neg, wan_tiny.video_latent(6), **kw)
    causal = loop.run_chunked_ar(_causal_like(seed=0), pos, neg, wan_tiny.video_latent(6), **kw)
    assert torch.equal(plain.samples, causal.samples)


def test_patched_attention_takes_the_kv_cache_keyword_of_causal_blocks(pack, comfy):
    """CausalWanModel's blocks call self_attn(x, freqs, kv_cache=None, transformer_options=...)."""
    import importlib

    wan = importlib.import_module("comfyui_jensen_kv.runtime.families.wan.family")
    calls = []

    class Run:
        def attend(self, layer, q, k, v, transformer_options):
            calls.append(q.shape)
            return torch.nn.functional.scaled_dot_product_attention(q, k, v)

    patcher = wan_tiny.build_patcher()
    dm = patcher.model.diffusion_model
    attn = dm.blocks[0].self_attn
    x = torch.randn(1, 16, 64)
    freqs = dm.rope_encode(1, 8, 8, device=x.device, dtype=torch.float32)
    patched = wan.CachedSelfAttention(Run(), 0, attn)
    torch.testing.assert_close(
        patched(x, freqs, kv_cache=None, transformer_options={}), attn(x, freqs), atol=1e-5, rtol=1e-5
    )
    assert calls == [(1, 2, 16, 32)]
    with pytest.raises(ValueError, match="its own kv_cache"):
        patched(x, freqs, kv_cache={"k": torch.zeros(1)}, transformer_options={})


def _run_two_frames(loop, euler, model):
    """The Chunked AR loop on ``model``: one two-frame chunk of a four-frame latent, one Euler step."""
    pos, neg = wan_tiny.conditioning(1, 13, 32), wan_tiny.conditioning(2, 13, 32)
    return wan_tiny.run(loop, model, pos, neg, 4, euler, torch.tensor([1.0, 0.0]), chunk_frames=2, progress=False)


def test_subclass_without_what_the_patch_uses_is_refused_with_the_finding(loop, comfy, euler):
    with pytest.raises(ValueError, match=r"without \['norm_k'\].*probed CausalWanModelLike"):
        _run_two_frames(loop, euler, _causal_like(drop_attr="norm_k"))


def test_variants_with_extra_latent_inputs_are_refused(loop, comfy, euler, pack):
    import importlib

    with pytest.raises(ValueError, match=r"adds conditioning inputs of its own \(WAN21WithContextLatents"):
        _run_two_frames(loop, euler, _causal_like(extra_conds=True))
    # newer ComfyUI passes Bernini's context_latents (and reference latents) as model kwargs: refused at run time
    wan = importlib.import_module("comfyui_jensen_kv.runtime.families.wan.family")

    class Run:
        frame_offset = 0

    class Executor:
        class_obj = wan_tiny.build_patcher().model.diffusion_model

    wrapper = wan.make_rope_offset_wrapper(Run())
    x = torch.zeros(1, 16, 2, 8, 8)
    for name in ("context_latents", "reference_latent"):
        with pytest.raises(ValueError, match=f"extra latent inputs \\({name}\\)"):
            wrapper(
                Executor(),
                x,
                torch.zeros(1),
                torch.zeros(1, 13, 32),
                transformer_options={},
                **{name: [torch.zeros(1, 16, 1, 8, 8)]},
            )


def test_a_model_missing_norm_k_only_in_its_last_block_is_refused_before_the_run(pack, comfy):
    """The probe reads every block's self-attention, not only the first."""
    import importlib

    families = importlib.import_module("comfyui_jensen_kv.runtime.families")
    patcher = wan_tiny.build_patcher()
    del patcher.model.diffusion_model.blocks[-1].self_attn.norm_k
    with pytest.raises(families.UnsupportedModelError, match=r"block 1\) without \['norm_k'\]"):
        families.detect(patcher)


def test_a_t2v_subclass_with_its_own_forward_orig_is_refused(pack, comfy):
    """A WanModel subclass that overrides forward_orig (VACE, camera, audio ...) feeds inputs a chunk cache cannot hold."""
    import importlib

    from comfy.ldm.wan.model import WanModel

    families = importlib.import_module("comfyui_jensen_kv.runtime.families")

    class WanWithExtraInputs(WanModel):
        def forward_orig(self, *args, **kwargs):
            return super().forward_orig(*args, **kwargs)

    patcher = wan_tiny.build_patcher()
    patcher.model.diffusion_model.__class__ = WanWithExtraInputs
    with pytest.raises(families.UnsupportedModelError, match="own forward_orig.*WanWithExtraInputs"):
        families.detect(patcher)
