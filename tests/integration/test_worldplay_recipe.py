"""HY-WorldPlay with the pack's cache (runtime/families/worldplay: the family and its recipe) on a tiny random WorldPlay
built from ComfyUI's HunyuanVideo 1.5 classes:

- full precision (no patch node on the MODEL) equals the reference's own AR rollout (tests/data/worldplay, made by
  the reference's code on the same weights) and the family's plain forward with the full-precision memory over 7
  chunks, where the view-overlap context selection picks an older chunk;
- INT2 moves the video away, and the Jensen correction gives back the attention mass the quantized context steals,
  on both vision streams (the RoPE stream and the PRoPE camera stream);
- the planner equals the bytes the run cached, and the text prefix stays out of the cache;
- the context selection is seeded, the text prefix is computed once per prompt, the MODEL is left as it was given
  (after an interrupt too), and what the recipe cannot do is refused by name.

Needs ComfyUI's HunyuanVideo 1.5 (v0.27+): marked ``hunyuan15``, deselected on v0.3.64 (never skipped).
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from support import comfyui as support_comfyui
from support.comfyui import pack_module

from jensen_testing import worldplay_tiny as wt
from jensen_testing.numerics import assert_within_rounding

pytestmark = pytest.mark.hunyuan15

DATA = Path(__file__).resolve().parents[1] / "data" / "worldplay"
SEVEN = 28  # latent frames: 7 chunks, the last one's context chosen by view overlap (20 frames)


@pytest.fixture(scope="module")
def model(pack):
    return wt.build_patcher(0)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).abs().max() / b.abs().max())


def quantized(nodes, model, correction=None, bits="2", group="16"):
    m = nodes.JensenKVQuantizeKVCache.execute(model, bits, bits, group, "hadamard", "fp8_e4m3", 0).args[0]
    if correction is not None:
        m = nodes.JensenKVBiasCorrection.execute(m, correction, 1.0).args[0]
    return m


def _patch_state(model):
    wrappers = model.model_options.get("transformer_options", {}).get("wrappers", {})
    return (dict(model.object_patches), {k: dict(v) for k, v in wrappers.items()}, dict(model.object_patches_backup))


# ------------------------------------------------------------------------------------------------ full precision
@pytest.mark.numerics
def test_a_full_precision_run_equals_the_references_ar_rollout(model, worldplay):
    """The reference's _ar_rollout_inner (2 chunks, 4 Euler steps at shift 5, cfg 1; tests/data/worldplay/README.md)
    from its own inputs: the prompt, ByT5 and SigLIP features and the image condition as a conditioning, its noise,
    its path; through ComfyUI's sampler (Euler, AR Video Schedule worldplay_4step)."""
    import comfy.samplers

    ref_in = load_file(DATA / "forward.safetensors")
    ref = load_file(DATA / "ar_rollout.safetensors")
    base = model.model
    image = base.process_latent_out(ref_in["cond"][:, :32])  # concat_cond takes it back in (process_latent_in)
    positive = [
        [
            ref_in["text"],
            {
                "conditioning_byt5small": ref_in["byt5"],
                "clip_vision_output": wt.VisionOutput(ref_in["vision"]),
                "concat_latent_image": image,
                "concat_mask": 1.0 - ref_in["cond"][:, 32:33],  # core's concat_cond stores 1 - mask
                "pooled_output": None,
            },
        ]
    ]
    path = pack_module("runtime.families.worldplay.model.trajectory").parse_trajectory("w-3, right-4")
    request = worldplay.WorldPlayRequest.from_options(
        model,
        positive,
        {"samples": torch.zeros_like(ref_in["noise"])},
        path,
        0,
        comfy.samplers.sampler_object("euler"),
        wt.worldplay_sigmas(),
        noise=ref_in["noise"],
        progress=False,
    )
    result = worldplay.run(request)
    got = base.process_latent_in(result.samples)
    assert_within_rounding(got, ref["final"], wt.reference_bound(), "AR rollout")
    assert [p.context_frames for p in result.plans] == [(), (0, 1, 2, 3)]
    assert result.report["key_bits"] == "off" and result.report["cache_bytes"] > 0  # a full-precision cache


def test_a_full_precision_run_equals_the_plain_forward_over_seven_chunks(model):
    """7 chunks: the context grows to 20 frames (chunks 0-4 before chunk 5), then chunk 6's is chunk 0, the older chunk
    whose views overlap most (1 or 2), and chunks 3-5, re-encoded with RoPE 0..19 while chunk 6 sits at 20..23.
    Against the model's own calls with the full-precision memory (ContextKV), the same noise and context points."""
    noise = wt.video_noise(SEVEN, 11)
    result = wt.sample(model, SEVEN, seed=5, noise=noise, progress=False)
    contexts = [p.context_frames for p in result.plans]
    assert contexts[:6] == [tuple(range(4 * c)) for c in range(6)][:5] + [tuple(range(20))]
    last = contexts[6]
    assert len(last) == 20 and last[:4] == (0, 1, 2, 3) and last[-12:] == tuple(range(12, 24))
    assert last[4:8] in ((4, 5, 6, 7), (8, 9, 10, 11))
    assert result.plans[6].chunk_positions == (20, 21, 22, 23)
    want = wt.plain_rollout(model, SEVEN, noise, seed=5)
    err = rel_err(result.samples, want)
    assert err < 2e-6, err  # measured 2e-7
    assert result.report["context_frames"] == [list(c) for c in contexts]


# ------------------------------------------------------------------------------------------------ INT2 + Jensen
class _StreamShift:
    """Per denoising call: the queries, the context chunks' full-precision K/V (from this chunk's re-encode) and
    their stored (quantized) entries, for attention_shift; keyed by cache layer (2 block + stream)."""

    def __init__(self):
        self.fp: dict[int, list] = {}
        self.events = []

    def __call__(self, e):
        if e.phase == "write":
            if e.frame_offset == 0:  # the first context chunk of a re-encode: a new context
                self.fp[e.layer] = []
            self.fp[e.layer].append((e.k.detach().clone(), e.v.detach().clone()))
            return
        if e.cache is None or not e.cache.entries:
            return
        held = list(e.cache.entries)
        fp = self.fp[e.layer]
        assert len(fp) == len(held)
        self.events.append(
            (
                e.layer,
                e.q.detach().clone(),
                e.k.detach().clone(),
                e.v.detach().clone(),
                torch.cat([k for k, _ in fp], dim=-2),
                torch.cat([v for _, v in fp], dim=-2),
                [en.k for en in held],
                [en.v for en in held],
                e.correction,
            )
        )


def _stream_shifts(jk, obs: _StreamShift, text) -> dict[str, torch.Tensor]:
    """ΔP_S per stream: the attention mass on the cached context with the quantized (and corrected) keys minus with
    full-precision keys; the text prefix and the chunk's own tokens are the uncached rest (full precision)."""
    shift = importlib.import_module(f"{jk.__name__}.attention_shift").attention_shift
    cat = importlib.import_module(f"{jk.__name__}.quant").cat_quantized
    out = {"img": [], "prope": []}
    for layer, q, k, v, kf, vf, ks, vs, mode in obs.events:
        tk, tv = text.layer(layer // 2)
        kc, vc = torch.cat([tk, k], dim=-2), torch.cat([tv, v], dim=-2)
        d = shift(q, kf, vf, kc, vc, cat(ks), cat(vs), correction=mode).delta_ps
        out[("img", "prope")[layer % 2]].append(d.flatten())
    return {s: torch.cat(d) for s, d in out.items()}


@pytest.fixture(scope="module")
def text_prefix(model):
    ((text, opts),) = wt.conditioning(1, SEVEN)
    return model.model.diffusion_model.text_prefix(
        text, None, opts["conditioning_byt5small"], opts["clip_vision_output"].last_hidden_state
    )


@pytest.mark.parametrize("mode", ["taylor", "chunk_mean"])
def test_int2_moves_away_and_the_correction_gives_attention_back_at_both_streams(model, nodes, jk, text_prefix, mode):
    noise = wt.video_noise(SEVEN, 11)
    fp = wt.sample(model, SEVEN, seed=5, noise=noise, progress=False).samples
    shifts, videos = {}, {}
    for name, corr in (("int2", None), ("jensen", mode)):
        obs = _StreamShift()
        r = wt.sample(quantized(nodes, model, corr), SEVEN, seed=5, noise=noise, progress=False, observer=obs)
        assert {e[0] for e in obs.events} == set(range(4)), "both streams of both blocks read the cache"
        shifts[name], videos[name] = _stream_shifts(jk, obs, text_prefix), r.samples
        assert r.report["correction"] == (corr or "off") and r.report["key_bits"] == 2
    rel = rel_err(videos["int2"], fp)
    assert rel > 1e-4, rel  # INT2 moves the video away from full precision
    for stream in ("img", "prope"):
        raw, fixed = shifts["int2"][stream].mean().item(), shifts["jensen"][stream].mean().item()
        se = shifts["int2"][stream].std().item() / shifts["int2"][stream].numel() ** 0.5
        print(f"\n{stream} ({mode}): mean ΔP_S INT2 {raw:.3e} (se {se:.1e}), INT2 + correction {fixed:.3e}")
        assert raw > 0 and raw > 10 * se, (stream, raw, se)  # quantized keys steal attention, on this stream too
        assert abs(fixed) < 0.5 * raw, (stream, raw, fixed)  # the correction gives most of it back


# ------------------------------------------------------------------------------------------------ bytes
@pytest.mark.parametrize("bits", ["2", "4", "off"])
def test_the_planner_equals_the_bytes_the_run_cached_and_the_text_stays_out(model, nodes, bits):
    planner = importlib.import_module(f"{support_comfyui.PACK_MODULE}.jensen_core.planner")
    m = quantized(nodes, model, "taylor", bits=bits) if bits != "off" else model
    r = wt.sample(m, SEVEN, seed=5, progress=False)
    rep = r.report
    config = pack_module("runtime.config").get_config(m.model_options)
    plan = planner.plan_cache(
        latent_frames=SEVEN,
        latent_height=wt.LATENT_HW[0],
        latent_width=wt.LATENT_HW[1],
        chunk_frames=4,
        window_chunks=5,
        shape=planner.CacheShape(
            layers=2 * wt.TINY.depth,
            heads=wt.TINY.heads,
            head_dim=wt.TINY.head_dim,
            geometry=pack_module("runtime.families.worldplay.family").WorldPlayFamily.geometry,
            full_bytes=4,
        ),
        precision=planner.CachePrecision(
            spec_k=None if config is None else config.spec_k, spec_v=None if config is None else config.spec_v
        ),
    )
    assert plan.cached_chunks_peak == 5
    assert rep["cache_bytes"] == rep["planned_bytes"] == plan.quantized_bytes > 0
    assert rep["bf16_bytes"] == plan.bf16_bytes
    assert (rep["layers"], rep["blocks"], rep["streams"], rep["window_chunks"]) == (4, 2, 2, 5)
    # the text prefix (SigLIP 5 + ByT5 3 + LLM 7 tokens, K and V per block, float32) is reported apart
    assert rep["text_prefix_tokens"] == 15
    assert rep["text_prefix_bytes"] == 2 * wt.TINY.depth * 15 * wt.TINY.hidden_size * 4
    peak_tokens = 5 * 4 * wt.LATENT_HW[0] * wt.LATENT_HW[1]
    assert plan.cached_tokens_peak == peak_tokens  # 20 frames, not 20 frames + the prompt


# ------------------------------------------------------------------------------------------------ behaviour
def test_the_context_points_are_seeded_and_the_text_runs_once_per_prompt(model, monkeypatch):
    """Two runs with one seed choose the same context and give the same video; the prompt's K/V are computed once per
    run (the reference draws its view-overlap points from torch's global generator, unseeded)."""
    dm = model.model.diffusion_model
    calls = []
    original = type(dm).text_prefix

    def counting(self, *a, **k):
        calls.append(1)
        return original(self, *a, **k)

    monkeypatch.setattr(type(dm), "text_prefix", counting)
    torch.manual_seed(0)
    a = wt.sample(model, SEVEN, seed=5, progress=False)
    assert len(calls) == 1  # 7 chunks x 4 steps + 6 re-encodes, one text forward
    torch.manual_seed(123)  # the global generator does not reach the selection
    b = wt.sample(model, SEVEN, seed=5, progress=False)
    assert [p.context_frames for p in a.plans] == [p.context_frames for p in b.plans]
    assert torch.equal(a.samples, b.samples)
    c = wt.sample(model, SEVEN, seed=6, progress=False)
    assert not torch.equal(a.samples, c.samples)  # the seed reaches the noise


def test_a_run_leaves_the_model_as_given_even_after_an_interrupt(model, nodes):
    import comfy.model_management

    m = quantized(nodes, model, "taylor")
    before = _patch_state(m)
    wt.sample(m, 8, progress=False)
    assert _patch_state(m) == before

    def interrupt(chunk, step, steps):
        if chunk == 1 and step == 1:
            comfy.model_management.interrupt_current_processing(True)

    with pytest.raises(comfy.model_management.InterruptProcessingException):
        wt.sample(m, 8, progress=False, step_callback=interrupt)
    comfy.model_management.interrupt_current_processing(False)
    assert _patch_state(m) == before
    dm = m.model.diffusion_model
    assert "_forward" not in vars(dm) or not type(vars(dm)["_forward"]).__name__.startswith("WorldPlay")


@pytest.mark.parametrize(
    "options,words",
    [
        ({"window_chunks": 2}, ("window_chunks=2", "view overlap", "set both to 0")),
        ({"sink_chunks": 1}, ("sink_chunks=1", "set both to 0")),
        ({"cfg": 3.0}, ("cfg=3.0", "cfg 1")),
        ({"keep_state": True}, ("no cache to hand on",)),
    ],
)
def test_what_the_recipe_cannot_do_is_refused_by_name(model, options, words):
    with pytest.raises(ValueError) as e:
        wt.sample(model, 8, progress=False, **options)
    for w in words:
        assert w in str(e.value), (w, str(e.value))


def test_latents_and_paths_that_do_not_fit_are_refused(model, worldplay):
    import comfy.samplers

    def request(frames, path_latents, positive=None):
        return worldplay.WorldPlayRequest.from_options(
            model,
            positive or wt.conditioning(1, frames),
            wt.latent(frames),
            wt.trajectory(path_latents),
            0,
            comfy.samplers.sampler_object("euler"),
            wt.worldplay_sigmas(),
        )

    with pytest.raises(ValueError, match="multiple of 4"):
        worldplay.run(request(6, 8))
    with pytest.raises(ValueError, match="trajectory only 8 poses"):
        worldplay.run(request(12, 8))
    two = wt.conditioning(1, 8) + wt.conditioning(2, 8)
    with pytest.raises(ValueError, match="one text prefix per video"):
        worldplay.run(request(8, 8, two))


def test_plain_hunyuanvideo_15_and_wan_are_refused_naming_load_hy_worldplay(worldplay):
    import comfy.model_patcher
    import comfy.samplers
    import comfy.supported_models

    from jensen_testing import wan_tiny

    config = comfy.supported_models.HunyuanVideo15(wt.TINY.core_config())
    config.set_inference_dtype(torch.float32, None)
    plain = comfy.model_patcher.ModelPatcher(config.get_model({}), torch.device("cpu"), torch.device("cpu"))
    wan = wan_tiny.build_patcher(seed=0)
    for m, words in (
        (plain, ("plain HunyuanVideo 1.5", "Load HY-WorldPlay", "HY-WorldPlay AR Sampler supports")),
        (wan, ("is not HY-WorldPlay", "Chunked AR Video Sampler")),
    ):
        request = worldplay.WorldPlayRequest.from_options(
            m,
            wt.conditioning(1, 8),
            wt.latent(8),
            wt.trajectory(8),
            0,
            comfy.samplers.sampler_object("euler"),
            wt.worldplay_sigmas(),
        )
        with pytest.raises(worldplay.UnsupportedModelError) as e:
            worldplay.run(request)
        for w in words:
            assert w in str(e.value), (w, str(e.value))


def test_the_chunked_ar_video_sampler_on_worldplay_says_which_sampler_to_use(model, loop, euler):
    """The Wan loop detects the family but cannot drive its re-encoded context: the run is refused before any model
    call, naming HY-WorldPlay AR Sampler, and the MODEL keeps no patch."""
    before = _patch_state(model)
    for frames in (8, 4):
        with pytest.raises(ValueError, match="is sampled by HY-WorldPlay AR Sampler: its recipe owns the chunk loop"):
            loop.run_chunked_ar(
                model,
                wt.conditioning(1, frames),
                wt.conditioning(1, frames),
                wt.latent(frames),
                seed=0,
                cfg=1.0,
                sampler=euler,
                sigmas=wt.worldplay_sigmas(),
                chunk_frames=4,
                progress=False,
            )
        assert _patch_state(model) == before
