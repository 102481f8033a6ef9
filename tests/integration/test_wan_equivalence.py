"""The chunked run with a KV cache against one block-causal full forward, on a tiny Wan (fp32, CPU).

Every model call of the chunk loop is recorded at the diffusion-model level (inputs and output); each
is recomputed as one forward over [finished chunks, clean, t = 0; current chunk] with a block-causal
mask and compared. Then INT2 caches: attention mass stolen by quantized keys, and what the Jensen
correction gives back; and the report's bytes against the planner.
"""

from __future__ import annotations

import pytest
import torch
from support import reference, wan_tiny

STEPS = 3
CHUNK = 2
FRAMES = 7  # chunks of 2, 2, 2, 1: the last chunk is shorter
COND_TOKENS = 13  # never a multiple of the 16 tokens per frame: self- and cross-attention differ in length


def _sigmas(model, steps=STEPS):
    import comfy.samplers

    return comfy.samplers.calculate_sigmas(model.get_model_object("model_sampling"), "simple", steps)


def _conds():
    return wan_tiny.conditioning(1, COND_TOKENS, 32), wan_tiny.conditioning(2, COND_TOKENS, 32)


def _recorded_run(
    loop, model, euler, *, cfg, window=0, frames=FRAMES, chunk=CHUNK, observer=None, context_noise=0.0, **kw
):
    import comfy.patcher_extension

    rec = reference.DiffusionModelRecorder()
    m = model.clone()
    m.add_wrapper_with_key(comfy.patcher_extension.WrappersMP.DIFFUSION_MODEL, "test_recorder", rec)
    pos, neg = _conds()
    result = loop.run_chunked_ar(
        m,
        pos,
        neg,
        wan_tiny.video_latent(frames),
        seed=7,
        cfg=cfg,
        sampler=euler,
        sigmas=_sigmas(model),
        chunk_frames=chunk,
        window_chunks=window,
        context_noise=context_noise,
        observer=observer,
        progress=False,
        **kw,
    )
    return rec, result


def _split_calls(rec, chunks):
    """Euler calls the model once per step; a write pass follows every chunk but the last."""
    per_chunk = []
    i = 0
    for c in range(chunks):
        denoise = rec.calls[i : i + STEPS]
        i += STEPS
        write = None
        if c < chunks - 1:
            write = rec.calls[i]
            i += 1
        per_chunk.append((denoise, write))
    assert i == len(rec.calls), f"expected {i} model calls, recorded {len(rec.calls)}"
    return per_chunk


def _max_rel(a, b):
    return float((a - b).abs().max() / b.abs().max())


@pytest.mark.parametrize("cfg,window", [(3.0, 0), (1.0, 0), (3.0, 1)], ids=["cfg3-all", "cfg1-all", "cfg3-window1"])
def test_every_chunk_matches_block_causal_full_forward(loop, tiny, euler, cfg, window):
    rec, result = _recorded_run(loop, tiny, euler, cfg=cfg, window=window)
    dm = tiny.model.diffusion_model
    chunks = result.report["chunks"]
    assert chunks == 4
    per_chunk = _split_calls(rec, chunks)
    expect_batch = 2 if cfg > 1 else 1
    assert all(call["x"].shape[0] == expect_batch for call in rec.calls)

    worst = 0.0
    for c, (denoise, write) in enumerate(per_chunk):
        prev = [per_chunk[j][1] for j in range(c)]
        for call in denoise + ([write] if write is not None else []):
            assert all(p["cond_or_uncond"] == call["cond_or_uncond"] for p in prev)
            frames = [p["x"] for p in prev] + [call["x"]]
            ts = [torch.zeros_like(call["t"]) for _ in prev] + [call["t"]]
            ref = reference.block_causal_forward(dm, frames, ts, call["context"], window=window or None)
            f0 = sum(p["x"].shape[2] for p in prev)
            ref_c = ref[:, :, f0:]
            err = float((call["out"] - ref_c).abs().max())
            worst = max(worst, err)
            torch.testing.assert_close(call["out"], ref_c, atol=1e-5, rtol=1e-5)
    assert worst < 1e-5
    assert result.samples.shape == (1, 16, FRAMES, 8, 8)


def test_the_reference_would_catch_a_missing_cache_or_wrong_rope(loop, tiny, euler):
    """Negative controls: the comparison above is sensitive to both things the adapter must get right."""
    rec, result = _recorded_run(loop, tiny, euler, cfg=1.0)
    dm = tiny.model.diffusion_model
    per_chunk = _split_calls(rec, result.report["chunks"])
    call = per_chunk[2][0][0]  # chunk 2, first step
    prev = [per_chunk[0][1]["x"], per_chunk[1][1]["x"]]
    ts = [torch.zeros_like(call["t"])] * 2 + [call["t"]]
    good = reference.block_causal_forward(dm, prev + [call["x"]], ts, call["context"])[:, :, 4:]
    no_rope_offset = reference.block_causal_forward(dm, prev + [call["x"]], ts, call["context"], rope_offsets=False)[
        :, :, 4:
    ]
    no_cache = reference.block_causal_forward(dm, [call["x"]], [call["t"]], call["context"])
    assert _max_rel(call["out"], good) < 1e-5
    assert _max_rel(no_rope_offset, good) > 1e-3
    assert _max_rel(no_cache, good) > 1e-3


def test_write_pass_at_context_noise_uses_noised_clean_chunk(loop, tiny, euler):
    """context_noise = s, SkyReels' mode: the chunk's cache-writing forward sees s*noise + (1-s)*clean at timestep
    s*1000 (the default, relabel, and SkyReels' per-step redraws: tests/integration/test_context_noise.py)."""
    import comfy.sample

    rec, result = _recorded_run(loop, tiny, euler, cfg=1.0, context_noise=0.25, context_noise_mode="skyreels")
    per_chunk = _split_calls(rec, result.report["chunks"])
    latent_format = tiny.model.latent_format
    for c, (_, write) in enumerate(per_chunk[:-1]):
        sl = slice(c * CHUNK, (c + 1) * CHUNK)
        # the context noise of chunk c is its own stream, derived from the seed (7) and the chunk index
        ctx_noise = comfy.sample.prepare_noise(
            torch.zeros(1, 16, CHUNK, 8, 8), loop.chunk_seed(7, c, loop.CONTEXT_STREAM)
        )
        assert torch.allclose(write["t"], torch.full_like(write["t"], 250.0))
        clean = latent_format.process_in(result.samples[:, :, sl])
        torch.testing.assert_close(write["x"], 0.25 * ctx_noise + 0.75 * clean, atol=1e-5, rtol=1e-5)
        assert float((write["x"] - clean).abs().mean()) > 0.05


# ---------------------------------------------------------------------------------------- INT2 + Jensen
def _core(name):
    import importlib

    return importlib.import_module(f"comfyui_jensen_kv.jensen_core.{name}")


class MassObserver:
    """Collects, per denoising call of chunks >= 1, the queries, the current chunk and the cache read;
    the write-phase calls give the same run's unquantized keys and values (the reference)."""

    def __init__(self, layer=None):
        self.layer = layer
        self.fp: dict[tuple[int, int, int], tuple[torch.Tensor, torch.Tensor]] = {}
        self.events = []

    def wants(self, layer, chunk, phase, step):
        return self.layer is None or layer == self.layer

    def __call__(self, e):
        if e.phase == "write":
            self.fp[(e.layer, e.branch, e.chunk)] = (e.k.detach().clone(), e.v.detach().clone())
            return
        if e.chunk == 0:
            return
        prev = [self.fp[(e.layer, e.branch, j)] for j in range(e.chunk)]
        self.events.append(
            dict(
                layer=e.layer,
                chunk=e.chunk,
                step=e.step,
                q=e.q.detach().clone(),
                k_cur=e.k.detach().clone(),
                v_cur=e.v.detach().clone(),
                out=e.out.detach().clone(),
                k_fp=torch.cat([k for k, _ in prev], dim=-2),
                v_fp=torch.cat([v for _, v in prev], dim=-2),
                entries=[(en.k, en.v) for en in e.cache.entries],
                correction=e.correction,
                strength=e.strength,
            )
        )


def _shift(ev, k_ref, v_ref):
    """jensen_core's attention_shift of one event's cache (as the run read it) against reference K/V."""
    ks, vs = [k for k, _ in ev["entries"]], [v for _, v in ev["entries"]]
    if not isinstance(ks[0], torch.Tensor):
        ks, vs = _core("quant").cat_quantized(ks), _core("quant").cat_quantized(vs)
    else:
        ks, vs = torch.cat(ks, dim=-2), torch.cat(vs, dim=-2)
    mode = ev["correction"]
    return _core("attention_shift").attention_shift(
        ev["q"], k_ref, v_ref, ev["k_cur"], ev["v_cur"], ks, vs, correction=mode, strength=ev["strength"]
    )


def _quantized(nodes_mod, model, correction=None, strength=1.0, key_bits="2", value_bits="2", group="16"):
    qnode = nodes_mod.JensenKVQuantizeKVCache
    m = qnode.execute(model, key_bits, value_bits, group, "hadamard", "fp8_e4m3", 0).args[0]
    if correction is not None:
        m = nodes_mod.JensenKVBiasCorrection.execute(m, correction, strength).args[0]
    return m


@pytest.mark.parametrize("mode", ["taylor", "chunk_mean"])
def test_int2_keys_steal_attention_and_the_correction_gives_it_back(loop, nodes, tiny, euler, mode):
    """ΔP_S over every layer, chunk >= 1 and step: each run's queries against its own unquantized keys."""
    shifts = {}
    for name, corr in (("int2", None), ("int2_taylor", mode)):
        obs = MassObserver()
        _recorded_run(loop, _quantized(nodes, tiny, corr), euler, cfg=1.0, observer=obs)
        assert len(obs.events) == 3 * STEPS * 2  # chunks 1-3 x steps x layers
        shifts[name] = torch.cat([_shift(ev, ev["k_fp"], ev["v_fp"]).delta_ps for ev in obs.events])
    n = shifts["int2"].numel()
    raw, fixed = shifts["int2"].mean().item(), shifts["int2_taylor"].mean().item()
    se = shifts["int2"].std().item() / n**0.5
    # quantized keys steal attention: the cached mass grows, far beyond its standard error
    assert raw > 0 and raw > 10 * se, (raw, se)
    # the correction moves the mass back toward the unquantized attention
    assert abs(fixed) < 0.5 * raw, (raw, fixed)


@pytest.mark.parametrize("mode", ["taylor", "chunk_mean"])
def test_attention_mass_against_the_full_precision_run(loop, nodes, tiny, euler, mode):
    """Layer 0 of chunk 1, first step: the same queries and pre-quantization keys in every run, so the
    INT2 runs' attention is compared with the full-precision run's own cache."""

    def layer0_chunk1(model):
        obs = MassObserver(layer=0)
        _recorded_run(loop, model, euler, cfg=1.0, observer=obs)
        return next(e for e in obs.events if e["chunk"] == 1 and e["step"] == 0)

    fp = layer0_chunk1(tiny)
    k_fp_run, v_fp_run = fp["entries"][0]  # what the full-precision run cached
    shifts = {}
    for name, corr in (("int2", None), ("int2_taylor", mode)):
        ev = layer0_chunk1(_quantized(nodes, tiny, corr))
        torch.testing.assert_close(ev["q"], fp["q"])  # same queries as the FP run
        torch.testing.assert_close(ev["k_fp"], k_fp_run)  # it quantized the keys the FP run kept
        shifts[name] = _shift(ev, k_fp_run, v_fp_run)
        # and the adapter's attention output is exactly this (corrected) softmax over [cache, current chunk]
        k, v = ev["entries"][0]
        k_hat, v_hat = k.dequantize(dtype=torch.float32), v.dequantize(dtype=torch.float32)
        d = ev["q"].shape[-1]
        bias = _core("bias").jensen_bias(ev["q"], k, mode=mode) if corr else 0
        scores = torch.cat(
            [ev["q"] @ k_hat.transpose(-1, -2) / d**0.5 - bias, ev["q"] @ ev["k_cur"].transpose(-1, -2) / d**0.5],
            dim=-1,
        )
        out_ref = torch.softmax(scores, -1) @ torch.cat([v_hat, ev["v_cur"]], dim=-2)
        torch.testing.assert_close(ev["out"], out_ref, atol=2e-5, rtol=1e-4)
    d_raw = shifts["int2"].delta_ps.mean().item()
    d_fix = shifts["int2_taylor"].delta_ps.mean().item()
    assert d_raw > 0
    assert abs(d_fix) < 0.5 * d_raw, (d_raw, d_fix)
    assert shifts["int2_taylor"].mean_jsd < shifts["int2"].mean_jsd


@pytest.mark.parametrize(
    "key_bits,value_bits,group,window,cfg",
    [
        ("2", "2", "32", 0, 1.0),
        ("3", "4", "16", 2, 3.0),
        ("8", "2", "8", 1, 3.0),
    ],
)
def test_report_cache_bytes_equal_the_planner(loop, nodes, tiny, euler, key_bits, value_bits, group, window, cfg):
    import importlib

    planner = importlib.import_module("comfyui_jensen_kv.jensen_core.planner")
    model = _quantized(nodes, tiny, "taylor", key_bits=key_bits, value_bits=value_bits, group=group)
    _, result = _recorded_run(loop, model, euler, cfg=cfg, window=window)
    rep = result.report
    config = model.model_options["transformer_options"]["jensen_kv"]
    plan = planner.plan_cache(
        latent_frames=FRAMES,
        latent_height=8,
        latent_width=8,
        chunk_frames=CHUNK,
        window_chunks=window,
        shape=planner.CacheShape(
            layers=rep["layers"],
            heads=rep["heads"],
            head_dim=rep["head_dim"],
            geometry=importlib.import_module("comfyui_jensen_kv.runtime.families.wan.family").GEOMETRY,
            cfg_branches=rep["cfg_branches"],
        ),
        precision=planner.CachePrecision(spec_k=config.spec_k, spec_v=config.spec_v),
    )
    assert rep["cfg_branches"] == (2 if cfg > 1 else 1)
    assert rep["cache_bytes"] == plan.quantized_bytes
    assert rep["bf16_bytes"] == plan.bf16_bytes
    assert rep["effective_bits"] == pytest.approx(plan.effective_bits, rel=1e-9)
    assert rep["tokens_per_frame"] == plan.tokens_per_latent_frame == 16
    assert rep["key_bits"] == int(key_bits) and rep["value_bits"] == int(value_bits)
    assert rep["group_size"] == int(group) and rep["rotation"] == "hadamard" and rep["correction"] == "taylor"
