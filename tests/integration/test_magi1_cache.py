"""MAGI-1 on the pack's cache (runtime/families/magi1: the family and its recipe; the MAGI-1 AR Sampler node).

The family conformance suite (tests/families/) runs MAGI-1 through the checks every family passes (probe, patches,
full precision against its own reference at cfg 1 and 3, INT2 and the correction's ΔP_S, planner bytes, the refusal
to continue). Here: what is MAGI-1's own - the reference's stored outputs through the pack's cache, the window the
key ranges need, grouped-query bytes, window + sink against an independent full-precision implementation, prompt
schedules, refusals, progress and interrupts, and the node.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from support.comfyui import pack_module

from jensen_core.retention import Retention
from jensen_testing import magi1_tiny
from jensen_testing.families import MAGI1_QK_GAIN
from jensen_testing.magi1_tiny import dit_bound
from jensen_testing.numerics import assert_within_rounding
from runtime.families.magi1.model import pipeline as P
from runtime.families.magi1.model.attention import ChunkPlan, sdpa
from runtime.families.magi1.model.caption import chunk_captions
from runtime.families.magi1.model.config import TINY, MagiConfig
from runtime.families.magi1.model.sampler import MagiSettings, sample

DATA = Path(__file__).resolve().parents[1] / "data" / "magi1" / "expected.safetensors"
SCALE = 0.18215


@pytest.fixture(scope="module")
def expected():
    return load_file(str(DATA))


def _cond(caption: torch.Tensor) -> list:
    return [[caption[None].float(), {"magi1_caption": True}]]


def _request(magi1, model, positive, frames, *, cw=1, hw=8, **kw):
    return magi1.Magi1Request.from_options(
        model, positive, latent_frames=frames, latent_height=hw, latent_width=hw, chunk_frames=cw,
        **{"num_steps": 8, "progress": False, **kw},
    )  # fmt: skip


def _quantized(nodes, model, correction=None, group="16"):
    m = nodes.JensenKVQuantizeKVCache.execute(model, "2", "2", group, "hadamard", "fp8_e4m3", 0).args[0]
    return m if correction is None else nodes.JensenKVBiasCorrection.execute(m, correction, 1.0).args[0]


# ------------------------------------------------------------------------------------------ the reference
@pytest.mark.numerics
@pytest.mark.parametrize("name", ["distill_w4", "distill_w2_12steps", "base_w2", "distill_w1"])
def test_a_full_precision_pack_run_gives_the_references_own_outputs(magi1, expected, name):
    """The reference's stored runs (tests/data/magi1), made again through the family's patch, the pack's cache and
    the recipe: the same weights, special tokens, caption, seed 1234 and settings."""
    distill, cfg_number, steps, window, chunks = (int(v) for v in expected[f"sampler.{name}.settings"].tolist())
    special = {k.split(".", 1)[1]: v for k, v in expected.items() if k.startswith("special.")}
    model = magi1_tiny.build_patcher(replace(TINY, distill=bool(distill)), special=special)
    caption = expected["sampler.caption_valid"]
    req = _request(
        magi1, model, _cond(caption), 2 * chunks, cw=2, seed=1234, num_steps=steps, window_size=window,
        cfg_number=cfg_number,
    )  # fmt: skip
    result = magi1.run(req)
    # as tests/test_magi1_model.py compares the pure sampler with the reference: within float32 rounding
    assert_within_rounding(result.samples * SCALE, expected[f"sampler.{name}.chunks"], dit_bound(bool(distill)), name)
    # and the pure-torch sampler with the reference's whole-history buffer, on the same model
    dm = model.model.diffusion_model
    captions = chunk_captions(caption, chunks, {k: v.float() for k, v in dm.special_tokens.items()})
    noise = torch.randn(1, 16, 2 * chunks, 8, 8, generator=torch.Generator().manual_seed(1234))
    settings = MagiSettings(
        num_steps=steps, window_size=window, chunk_width=2, cfg_number=cfg_number, distill=bool(distill)
    )
    pure = sample(dm, noise, captions, settings)
    assert float((result.samples * SCALE - pure).abs().max()) <= 1e-5 * float(pure.abs().max())
    assert result.report["cache_bytes"] > 0 and result.report["key_bits"] == "off"


# ------------------------------------------------------------------------------------------ the window's warning
@pytest.mark.parametrize("window_chunks,warns", [(1, True), (2, True), (3, False), (5, False)])
def test_a_window_short_of_what_the_key_ranges_reach_is_said(magi1, window_chunks, warns):
    """At window_size 2 the key ranges reach 3 finished chunks: a window of 2 (one short) or 1 keeps fewer than the
    reference reads, and the run says so (log and report); a window of 3 or more keeps them all and says nothing."""
    model = magi1_tiny.build_patcher(qk_gain=MAGI1_QK_GAIN)
    request = _request(magi1, model, magi1_tiny.conditioning(0), 7, window_size=2, window_chunks=window_chunks)
    recipe = magi1.Magi1Recipe(request)  # what it checks and warns about, before any model call
    assert recipe.reached == 3
    said = [w for w in recipe.warnings if "keeps fewer finished chunks than the key ranges reach" in w]
    assert bool(said) is warns, recipe.warnings
    if warns:
        assert f"window_chunks {window_chunks} " in said[0] and "(3 at window_size 2" in said[0], said[0]


# ------------------------------------------------------------------------------------------ memory
@pytest.mark.parametrize("window_size,reach", [(4, 1), (2, 3), (1, 4)])
def test_the_cache_holds_what_the_key_ranges_reach(magi1, window_size, reach):
    """At window_size 4 every query reads one finished chunk, so the cache keeps one per layer; at 2 three, at 1 four."""
    model = magi1_tiny.build_patcher(qk_gain=MAGI1_QK_GAIN)
    frames = 7
    result = magi1.run(_request(magi1, model, magi1_tiny.conditioning(0), frames, window_size=window_size))
    rep = result.report
    assert rep["finished_chunks_read"] == reach == P.finished_chunks_reached(window_size)
    assert rep["window_chunks"] == reach and rep["kv_heads"] == 2 and rep["heads"] == 4
    one_chunk = TINY.num_layers * 2 * TINY.num_query_groups * 16 * TINY.kv_channels * 4  # fp32, 16 tokens
    assert rep["cache_bytes"] == reach * one_chunk == rep["planned_bytes"]
    assert rep["reference_buffer_bytes"] == frames * one_chunk // 2  # every chunk, in BF16
    assert "reference's whole-video buffer" in magi1.report_text(rep)


def test_the_planner_counts_the_kv_heads_not_the_query_heads(magi1, nodes, pack):
    """A MAGI-1 with 24 query heads over 8 K/V heads (the 4.5B's grouping): the cache holds 8, the planner counts 8."""
    planner = pack_module("jensen_core.planner")
    cfg = MagiConfig(
        num_layers=1, hidden_size=384, ffn_hidden_size=256, num_attention_heads=24, num_query_groups=8, kv_channels=16,
        caption_channels=32, caption_max_length=800,
    )  # fmt: skip
    model = _quantized(nodes, magi1_tiny.build_patcher(cfg), "taylor")
    rep = magi1.run(_request(magi1, model, magi1_tiny.conditioning(0), 5, window_chunks=2)).report
    assert (rep["heads"], rep["kv_heads"]) == (24, 8)
    config = model.model_options["transformer_options"]["jensen_kv"]

    def plan(kv_heads):
        return planner.plan_cache(
            latent_frames=5, latent_height=8, latent_width=8, chunk_frames=1, window_chunks=2,
            shape=planner.CacheShape(1, 24, 16, magi1.Magi1Family.geometry, kv_heads=kv_heads),
            precision=planner.CachePrecision(config.spec_k, config.spec_v),
        )  # fmt: skip

    assert rep["cache_bytes"] == plan(8).quantized_bytes == rep["planned_bytes"] > 0
    assert plan(None).quantized_bytes == 3 * rep["cache_bytes"]  # counting 24 heads would say three times as much
    assert rep["bf16_bytes"] == plan(8).bf16_bytes


def _retained_reference(window: int, sink: int):
    """Full-precision attention with the cache's window + sink rule, written here independently: query chunk j of
    range (s, e) reads the retained finished chunks in [s, cached) and the forward's chunks in range up to itself."""
    stored: dict[int, dict[int, tuple]] = {}
    rule = Retention(window, sink)

    def attention(layer, q, k, v, plan: ChunkPlan):
        n, cached = plan.chunk_tokens, plan.cached
        mine = stored.setdefault(layer, {})
        held = rule.indices(len(mine))
        out = []
        for j, (s, _) in enumerate(plan.key_ranges):
            old = [mine[c] for c in held if s <= c < cached]
            first = max(s, cached) - cached
            ks = [t[0] for t in old] + [k[:, :, first * n : (j + 1) * n]]
            vs = [t[1] for t in old] + [v[:, :, first * n : (j + 1) * n]]
            out.append(sdpa(q[:, :, j * n : (j + 1) * n], torch.cat(ks, 2), torch.cat(vs, 2)))
        for cur, absolute in plan.store:
            assert absolute == len(mine)
            mine[absolute] = (k[:, :, cur * n : (cur + 1) * n].clone(), v[:, :, cur * n : (cur + 1) * n].clone())
        return torch.cat(out, 2)

    return attention


def test_window_and_sink_on_an_unbounded_key_range(magi1):
    """kv_ranges 'all' (every chunk reads every earlier one) bounded by a window of 2 and a sink of 1: the first
    chunk and the last two stay; the run equals that rule written independently, and differs from keeping all."""
    model = magi1_tiny.build_patcher(qk_gain=MAGI1_QK_GAIN)
    cond = magi1_tiny.conditioning(2)
    kw = dict(window_size=1, kv_ranges=(), cfg_number=1, seed=3)
    bounded = magi1.run(_request(magi1, model, cond, 6, window_chunks=2, sink_chunks=1, **kw))
    everything = magi1.run(_request(magi1, model, cond, 6, **kw))
    assert bounded.report["window_chunks"] == 2 and everything.report["window_chunks"] == 0
    assert bounded.report["finished_chunks_read"] == 5 and bounded.report["warnings"]  # it reads fewer than 5
    assert bounded.report["cache_bytes"] * 5 == everything.report["cache_bytes"] * 3  # 1 + 2 chunks against 5
    dm = model.model.diffusion_model
    captions = chunk_captions(cond[0][0][0], 6, {k: v.float() for k, v in dm.special_tokens.items()})
    noise = torch.randn(1, 16, 6, 8, 8, generator=torch.Generator().manual_seed(3))
    settings = MagiSettings(
        num_steps=8, window_size=1, chunk_width=1, noise2clean_kvrange=(), cfg_number=1, distill=False
    )
    want = sample(dm, noise, captions, settings, attention=_retained_reference(2, 1))
    torch.testing.assert_close(bounded.samples * SCALE, want, atol=1e-5 * float(want.abs().max()), rtol=0)
    # the window changed what chunks 4 and 5 read (chunk 4 is the first whose range holds an evicted chunk: 1)
    diff = (bounded.samples - everything.samples).abs().amax(dim=(0, 1, 3, 4))
    assert float(diff[:4].max()) == 0 and float(diff[4:].min()) > 1e-4


# ------------------------------------------------------------------------------------------ INT2 and the correction
class _Events:
    """From the run's attention events: per call that read cached chunks, attention_shift's arguments (queries, the
    attended chunks' full-precision K/V from their write events, the call's own and context K/V, the stored K/V)."""

    def __init__(self):
        self.fp, self.reads = {}, []

    def __call__(self, e):
        if e.phase == "write":
            self.fp[(e.layer, e.chunk)] = (e.k.clone(), e.v.clone())
            return
        n = e.last_chunks
        if not n:
            return
        held = e.cache.entries[-n:]
        chunks = sorted(c for (layer, c) in self.fp if layer == e.layer and c < e.chunk)[-n:]
        k, v = e.k, e.v
        if e.context is not None:
            k, v = torch.cat([e.context[0], k], -2), torch.cat([e.context[1], v], -2)
        cat = pack_module("jensen_core.quant").cat_quantized
        kf = torch.cat([self.fp[(e.layer, c)][0] for c in chunks], -2)
        vf = torch.cat([self.fp[(e.layer, c)][1] for c in chunks], -2)
        self.reads.append(
            (e.q.clone(), kf, vf, k.clone(), v.clone(), cat([h.k for h in held]), cat([h.v for h in held]))
        )


def test_int2_and_the_correction_where_the_second_order_term_overshoots(magi1, nodes, jk):
    """The tiny MAGI-1 at its seeded q/k scale (qk_gain 1: scores with a standard deviation of ~4, INT2's noise in
    them ~1.4): quantized keys steal attention, and the unguarded correction, Taylor or exact, removes more than
    they stole (measured ΔP_S 0.071 -> -0.042 taylor, -0.041 exact; guarded +0.004). At qk_gain 0.5 (the conformance suite's) it
    returns 96% of it. Both modes agree: it is the noise model, not the code. The guard (on by default) sees the
    chunks' attention held by a few keys of 16 and scales the correction down: it no longer overshoots past zero."""
    shift = pack_module("jensen_core.attention_shift").attention_shift
    model = magi1_tiny.build_patcher()
    cond = magi1_tiny.conditioning(1)
    fp = magi1.run(_request(magi1, model, cond, 7, cfg_number=1, seed=7)).samples
    events = _Events()
    int2 = magi1.run(_request(magi1, _quantized(nodes, model), cond, 7, cfg_number=1, seed=7, observer=events))
    assert float((int2.samples - fp).abs().max() / fp.abs().max()) > 1e-2
    assert len(events.reads) > 20
    means = {}
    for mode in ("off", "taylor", "exact", "chunk_mean"):
        for guard in (False, True):
            d = [shift(*e, correction=mode, guard=guard).delta_ps.flatten() for e in events.reads]
            means[mode, guard] = float(torch.cat(d).mean())
    off = means["off", False]
    assert off > 0.05 and means["off", True] == off
    assert -off < means["taylor", False] < 0 and -off < means["exact", False] < 0
    assert abs(means["taylor", False] - means["exact", False]) < 0.1 * off
    for mode in ("taylor", "exact", "chunk_mean"):  # guarded: no overshoot past zero, and still a correction
        assert 0 <= means[mode, True] < 0.5 * off, mode


# ------------------------------------------------------------------------------------------ prompts
def test_a_prompt_schedule_changes_the_chunks_from_its_switch_on(magi1, pack):
    """A chunk's caption reaches its own queries only (key ranges look back), and the cache is written under the
    null caption: the chunks before the switch are exactly those of the one-prompt run."""
    schedule = pack_module("runtime.prompt_schedule")
    model = magi1_tiny.build_patcher(qk_gain=MAGI1_QK_GAIN)
    a, b = magi1_tiny.conditioning(0), magi1_tiny.conditioning(5, tokens=9)
    both = schedule.add_to_schedule(schedule.add_to_schedule(None, a, 0, "a"), b, 3, "b")
    one = magi1.run(_request(magi1, model, a, 6)).samples
    two = magi1.run(_request(magi1, model, both, 6))
    diff = (two.samples - one).abs().amax(dim=(0, 1, 3, 4))
    assert float(diff[:3].max()) == 0 and float(diff[3:].min()) > 1e-3
    assert [p["label"] for p in two.report["prompts"]] == ["a", "b"]


# ------------------------------------------------------------------------------------------ refusals
def test_what_the_recipe_refuses_names_the_fix(magi1, window, tiny):
    model = magi1_tiny.build_patcher()
    cond = magi1_tiny.conditioning(0)
    with pytest.raises(ValueError, match="not MAGI-1: load one with Load MAGI-1 Model"):
        magi1.run(_request(magi1, tiny, cond, 2))
    with pytest.raises(ValueError, match="does not save or continue"):
        magi1.run(_request(magi1, model, cond, 2, keep_state=True))
    with pytest.raises(ValueError, match="not made by MAGI-1 Text Encode"):
        magi1.run(_request(magi1, model, [[cond[0][0], {}]], 2))
    with pytest.raises(ValueError, match=r"\(1, tokens, 32\)"):
        magi1.run(_request(magi1, model, [[torch.zeros(1, 5, 64), {"magi1_caption": True}]], 2))
    with pytest.raises(ValueError, match="multiple of window_size 3"):
        _request(magi1, model, cond, 2, num_steps=16, window_size=3)
    with pytest.raises(ValueError, match="must be even"):
        _request(magi1, model, cond, 2, hw=9)
    with pytest.raises(ValueError, match="whole number of 6-frame chunks"):
        _request(magi1, model, cond, 8, cw=6)
    with pytest.raises(ValueError, match="'all'"):
        window.parse_kv_ranges("5,x")
    for zero in ("5,0", "0", "5,4,-1"):  # a range of 0 chunks (a chunk that does not read itself) is no range
        with pytest.raises(ValueError, match=r"kv_ranges=.*whole chunk counts >= 1"):
            window.parse_kv_ranges(zero)
    assert window.parse_kv_ranges(" 8, 8 ") == (8, 8) and window.parse_kv_ranges("all") == ()


def test_another_sampler_on_the_patched_model_is_refused_and_the_model_stays_unpatched(magi1, loop, euler):
    """The Chunked AR Video Sampler finds the MAGI-1 family but cannot run MAGI-1's pipeline: it says which sampler
    to use before any model call, and the model carries no patch afterwards."""
    model = magi1_tiny.build_patcher()
    cond = magi1_tiny.conditioning(0)
    with pytest.raises(ValueError, match="its recipe owns the chunk loop.*sample MAGI-1 with MAGI-1 AR Sampler"):
        loop.run_chunked_ar(
            model, cond, cond, {"samples": torch.zeros(1, 16, 2, 8, 8)}, seed=0, cfg=1.0, sampler=euler,
            sigmas=torch.tensor([1.0, 0.0]), chunk_frames=1, progress=False,
        )  # fmt: skip
    dm = model.model.diffusion_model
    assert "forward_chunks" not in vars(dm) or not getattr(vars(dm)["forward_chunks"], "jensen_kv_patch", False)
    assert magi1.run(_request(magi1, model, cond, 2)).samples.shape == (1, 16, 2, 8, 8)  # and it runs again


# ------------------------------------------------------------------------------------------ progress, interrupt
def test_progress_per_forward_and_an_interrupt_leaves_nothing_behind(magi1):
    import comfy.model_management
    from support.progress import record_progress

    model = magi1_tiny.build_patcher()
    cond = magi1_tiny.conditioning(0)
    with record_progress() as progress:
        magi1.run(_request(magi1, model, cond, 3, progress=True))
    updates = [(value, total) for value, total, _ in progress.sent]
    forwards = len(P.steps_of(8, 4, 3))
    assert updates == [(i + 1, forwards) for i in range(forwards)]

    def stop(i, total):
        if i == 4:
            comfy.model_management.interrupt_current_processing(True)

    with pytest.raises(comfy.model_management.InterruptProcessingException):
        magi1.run(_request(magi1, model, cond, 3, step_callback=stop))
    comfy.model_management.interrupt_current_processing(False)
    dm = model.model.diffusion_model
    assert not getattr(vars(dm).get("forward_chunks"), "jensen_kv_patch", False)
    assert magi1.run(_request(magi1, model, cond, 3)).report["chunks"] == 3  # the next run starts afresh


# ------------------------------------------------------------------------------------------ the node
def test_the_node_samples_a_latent_and_reports(magi1, nodes):
    node = nodes.magi1.JensenKVMagi1ARSampler
    schema = node.define_schema()
    assert all(inp.tooltip for inp in schema.inputs)
    model = magi1_tiny.build_patcher(qk_gain=MAGI1_QK_GAIN)
    q = _quantized(nodes, model, "taylor")
    out = node.execute(q, magi1_tiny.conditioning(0), 64, 64, 44, 1234, 4, 4, "1", "5,4,3,2", 0, 0, True)
    latent, report = out.args
    # 44 frames -> 11 latent frames -> 2 chunks of 6; 64 px -> 8 latent pixels
    assert latent["samples"].shape == (1, 16, 12, 8, 8) and report["chunks"] == 2
    assert report["key_bits"] == 2 and report["correction"] == "taylor" and report["kv_heads"] == 2
    assert "query heads over 2 K/V heads" in out.ui["text"][0]
    # which variant ran and what said so (the tiny file's magi1_config metadata)
    assert report["distill"] is False and report["variant_from"] == "file metadata"
    assert "MAGI-1 base (from the file metadata)" in out.ui["text"][0]
    assert "window_size 0 is outside 1 to 4" in node.validate_inputs(steps=16, window_size=0)  # no ZeroDivisionError
    assert "multiple of window_size" in node.validate_inputs(steps=10, window_size=4)
    assert "stages of kv_ranges" in node.validate_inputs(steps=6, window_size=2, kv_ranges="5,4,3,2")
    assert node.validate_inputs(steps=16, window_size=4, kv_ranges="all") is True


def test_the_node_refuses_a_model_that_is_not_magi1(nodes, tiny):
    with pytest.raises(ValueError, match="MAGI-1 AR Sampler samples MAGI-1"):
        nodes.magi1.JensenKVMagi1ARSampler.execute(tiny, magi1_tiny.conditioning(0), 64, 64, 24, 0, 4, 4, "auto")


def test_the_default_steps_split_over_every_window(window):
    steps = window.DEFAULT_STEPS
    assert all(steps % w == 0 for w in window.WINDOW_SIZES if w != 3) and steps % 4 == 0
    assert math.isclose(P.distill_dt(steps, 1), steps / 2)
