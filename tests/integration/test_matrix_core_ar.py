"""The combination matrix on ComfyUI core's own AR sampler (SamplerARVideo's ``sample_ar_video``, v0.27+).

The cells are ``tests/support/matrix.py``'s for the ``core`` path: the recipes core's sampler has (its
schedule: ``plain`` one step from sigma 1, ``self_forcing`` Self-Forcing's four) crossed with the options it
takes (ARVideoI2V's initial latent as the prefix, batch 2, cfg, tiers, QVG, AR Cache Window's window + sink,
odd latent sizes). Each running cell is checked against an independent computation: core's own run of the
same model with quantization off (the pack's cache must then give core's video), an equivalence (batch 2
== batch 1; cond and uncond split == batched; one step of core's sampler == one step of the pack's own
loop given the same noise, with the same quantized cache: both must store and read the same chunks), the
planner's bytes (cache and block in flight), or a plain count of the chunks that left the recent tier.

Tiny causal Wan (``support.causal_wan``: 2 layers x 2 heads x 32, fp32, CPU), 8 x 8 latents, 6 frames.
"""

from __future__ import annotations

import importlib

import pytest
import torch
from support import causal_wan as cw
from support import matrix as mx
from support import wan_tiny

pytestmark = [pytest.mark.core_ar]

SEED, FRAMES, LAYERS, HEADS, HEAD_DIM = 4, 6, 2, 2, 32
POS, NEG = wan_tiny.conditioning(1, 16, 32), wan_tiny.conditioning(2, 16, 32)
FP32_ATOL = 2e-5
#: (block frames, sigmas) of each core row
ROWS = {"plain": (2, torch.tensor([1.0, 0.0])), "self_forcing": (1, cw.self_forcing_sigmas())}


def cells(column):
    return pytest.mark.parametrize("cell", mx.cells("core", column, "runs"), ids=lambda c: c.id)


def _runs(cell):
    assert cell.status == "runs", cell


@pytest.fixture(scope="module")
def core_ar(pack):
    return importlib.import_module("comfyui_jensen_kv.runtime.core_ar")


@pytest.fixture
def causal(comfy):
    return cw.build_causal_patcher(seed=0)


def with_start(model, initial):
    """``model`` with ARVideoI2V's initial latent (a clone: what that node returns)."""
    m = model.clone()
    m.model_options.setdefault("transformer_options", {}).setdefault("ar_config", {})["initial_latent"] = initial
    return m


def core(model, latent, row, *, cfg=1.0, noise=None, batch_index=None):
    """SamplerCustom + SamplerARVideo over ``model``: core's own noise from SEED (or ``noise``)."""
    import comfy.sample

    block, sigmas = ROWS[row]
    if noise is None:
        noise = comfy.sample.prepare_noise(latent, SEED, batch_index)
    return comfy.sample.sample_custom(
        model, noise, cfg, cw.ar_sampler(block), sigmas, POS, NEG, latent, disable_pbar=True, seed=SEED
    )


def quantized(nodes, model, bits="2", window=None, **tiers):
    m = nodes.JensenKVQuantizeKVCache.execute(model, bits, bits, "16", "hadamard", "fp8_e4m3", 0, **tiers).args[0]
    if bits != "off":
        m = nodes.JensenKVBiasCorrection.execute(m, "taylor", 1.0).args[0]
    if window is not None:
        m = nodes.JensenKVARCacheWindow.execute(m, *window).args[0]
    return m


def pack_loop_equals_core(loop, model, latent, *, cfg=1.0, window=(0, 0)):
    """One step from sigma 1 of the pack's own loop == core's sampler given the pack's per-chunk noise: both
    denoise each chunk against the same quantized cache of the earlier clean chunks written at sigma 0."""
    import comfy.sample
    import comfy.samplers

    block, sigmas = ROWS["plain"]
    frames = latent.shape[2]
    noise = torch.cat(
        [
            comfy.sample.prepare_noise(latent[:, :, f0 : f0 + block], loop.chunk_seed(SEED, c, loop.NOISE_STREAM))
            for c, f0 in enumerate(range(0, frames, block))
        ],
        dim=2,
    )
    ours = loop.run_chunked_ar(
        model,
        POS,
        NEG,
        {"samples": latent},
        seed=SEED,
        cfg=cfg,
        sampler=comfy.samplers.sampler_object("euler"),
        sigmas=sigmas,
        chunk_frames=block,
        window_chunks=window[0],
        sink_chunks=window[1],
        progress=False,
    ).samples
    theirs = core(model, latent, "plain", cfg=cfg, noise=noise)
    torch.testing.assert_close(theirs, ours, atol=1e-5, rtol=1e-5)


def _position_bits(n, sink_held, base, recent, sink_bits):
    return [max(base, sink_bits if i < sink_held else 0, recent if i == n - 1 else 0) for i in range(n)]


def expected_demotions(commits, window, sink):
    """Chunks requantized as they left the recent tier of one cache (keys 2/8/8, values 2/4/8 for old / newest /
    sink, one recent chunk), counted plainly: each committed block is stored at the newest chunk's bits (the
    sink's while the sink fills) and lowered to its position's bits on every later commit."""
    held, sink_held, count = [], 0, 0
    for _ in range(commits):
        in_sink = sink_held < sink
        held.append([8, 8 if in_sink else 4])
        if in_sink:
            sink_held += 1
        while window and len(held) - sink_held > window:
            del held[sink_held]
        pk, pv = _position_bits(len(held), sink_held, 2, 8, 8), _position_bits(len(held), sink_held, 2, 4, 8)
        for e, bk, bv in zip(held, pk, pv):
            if e[0] > bk or e[1] > bv:
                e[0], e[1] = min(e[0], bk), min(e[1], bv)
                count += 1
    return count


TIERS = dict(recent_chunks_bits="4", recent_chunks=1, sink_bits="8", recent_chunks_key_bits="8")
VALUES_ONLY = dict(recent_chunks_bits="4", recent_chunks=1, recent_chunks_key_bits="off")


# ---------------------------------------------------------------------------------------------- columns
@cells("prefix")
def test_prefix(cell, nodes, core_ar, causal):
    """ARVideoI2V's initial latent (one block of frames): the pack's full-precision cache gives core's own video;
    INT2 stores the planner's bytes with the prefix counted."""
    _runs(cell)
    block = ROWS[cell.recipe][0]
    initial = torch.randn(1, 16, block, 8, 8, generator=torch.Generator().manual_seed(7))
    lat = torch.zeros(1, 16, FRAMES, 8, 8)
    ref = core(with_start(causal, initial), lat, cell.recipe)
    off = core(with_start(quantized(nodes, causal, "off"), initial), lat, cell.recipe)
    torch.testing.assert_close(off, ref, atol=FP32_ATOL, rtol=0)
    m = with_start(quantized(nodes, causal, "2"), initial)
    core(m, lat, cell.recipe)
    rep = core_ar.last_report(m)
    assert rep["prefix_frames"] == block and rep["cache_bytes"] == rep["planned_bytes"] > 0


@cells("batch2")
def test_batch2(cell, nodes, causal):
    """Each item of a batch of 2 == the batch-1 run of its batch_index (INT2); with more than one step core redraws
    its step noise for the whole batch, so there item 0 only."""
    _runs(cell)
    m = quantized(nodes, causal, "2")
    both = core(m, torch.zeros(2, 16, FRAMES, 8, 8), cell.recipe, batch_index=[0, 1])
    assert (both[0] - both[1]).abs().max() > 1e-3
    for b in (0, 1) if cell.recipe == "plain" else (0,):
        one = core(m, torch.zeros(1, 16, FRAMES, 8, 8), cell.recipe, batch_index=[b])
        torch.testing.assert_close(both[b : b + 1], one, atol=1e-5, rtol=0)


@cells("cfg")
def test_cfg(cell, nodes, loop, core_ar, causal, monkeypatch):
    """cfg 3 (core's own sampler cannot batch cond and uncond over its caches: only the pack's path runs it): INT2
    reports both branches and one step == the pack's own loop; cond and uncond as separate calls (ComfyUI's
    low-memory path) == batched.

    Split and batched calls round differently (other matrix shapes), so they agree to float32 rounding only, which
    INT4 shows (2e-7 relative, FP32_ATOL element-wise). INT2 cannot: Self-Forcing's 4 steps at cfg 3 amplify a
    rounding difference chunk after chunk (keys near a code boundary take the other code, which moves the next
    chunk's keys), and after 5 one-frame chunks the runs differ by about 4e-4 relative, as two CPUs' kernels do
    (6e-4), and as much as cfg 1 against cfg 3 (3e-4 to 8e-4 on this random-weight model)."""
    _runs(cell)
    lat = torch.zeros(1, 16, FRAMES, 8, 8)
    m = quantized(nodes, causal, "2")
    core(m, lat, cell.recipe, cfg=3.0)
    assert core_ar.last_report(m)["cfg_branches"] == 2
    if cell.recipe == "plain":
        pack_loop_equals_core(loop, m, lat, cfg=3.0)
    m4 = quantized(nodes, causal, "4")
    batched = core(m4, lat, cell.recipe, cfg=3.0)
    monkeypatch.setattr(causal.model, "memory_required", lambda *a, **k: 1e30)  # nothing fits: one branch per call
    split = core(m4, lat, cell.recipe, cfg=3.0)
    torch.testing.assert_close(split, batched, atol=FP32_ATOL, rtol=0)
    assert (core(m4, lat, cell.recipe, cfg=1.0) - batched).abs().max() > 1e-3


@cells("tiers")
def test_tiers(cell, nodes, loop, core_ar, causal):
    """Tiers per side (keys 2/8/8, values 2/4/8) under window 2 + sink 1: the chunks demoted are a plain count's,
    the cache the planner's bytes; one step == the pack's own loop. A values-only tier: the block in flight is
    what the planner projects for each side."""
    _runs(cell)
    block = ROWS[cell.recipe][0]
    lat = torch.zeros(1, 16, FRAMES, 8, 8)
    m = quantized(nodes, causal, "2", window=(2, 1), **TIERS)
    core(m, lat, cell.recipe)
    rep = core_ar.last_report(m)
    commits = FRAMES // block - 1  # the last block is never committed
    assert rep["chunks_demoted"] == LAYERS * expected_demotions(commits, 2, 1)
    assert rep["cache_bytes"] == rep["planned_bytes"] > 0
    assert rep["in_flight_bytes"] == rep["planned_in_flight_bytes"]
    if cell.recipe == "plain":
        pack_loop_equals_core(loop, m, lat, window=(2, 1))
    v = quantized(nodes, causal, "2", **VALUES_ONLY)
    core(v, lat, cell.recipe)
    rep = core_ar.last_report(v)
    assert rep["in_flight_bytes"] == rep["planned_in_flight_bytes"] > 0
    assert rep["cache_bytes"] == rep["planned_bytes"]


@pytest.mark.parametrize("recipe", list(ROWS))
def test_precision_by_head(recipe, nodes, loop, core_ar, causal):
    """head_bits 4 on half the heads (not a matrix column: one option of Quantize KV Cache): the cache and the block
    in flight hold the planner's bytes, each layer keeps one promoted head; one step == the pack's own loop (the block
    core commits was prepared from its sigma-0 pass, whose queries choose the heads as the pack's write pass does)."""
    lat = torch.zeros(1, 16, FRAMES, 8, 8)
    m = quantized(nodes, causal, "2", head_bits="4", head_fraction=0.5)
    core(m, lat, recipe)
    rep = core_ar.last_report(m)
    assert (
        rep["cache_bytes"]
        == rep["planned_bytes"]
        > core_ar.last_report(_ran(nodes, causal, lat, recipe))["cache_bytes"]
    )
    assert rep["in_flight_bytes"] == rep["planned_in_flight_bytes"] > 0
    assert rep["head_bits"] == 4 and [len(p) for p in rep["promoted_heads"]] == [1] * LAYERS
    if recipe == "plain":
        pack_loop_equals_core(loop, m, lat)


def _ran(nodes, causal, lat, recipe):
    m = quantized(nodes, causal, "2")
    core(m, lat, recipe)
    return m


@cells("qvg")
def test_qvg(cell, nodes, loop, core_ar, causal):
    """QVG: the cache holds the planner's bytes; the block in flight waits in the model's dtype, as planned (its
    k-means runs once, at commit); one step == the pack's own loop."""
    _runs(cell)
    lat = torch.zeros(1, 16, FRAMES, 8, 8)
    m = nodes.JensenKVQuantizeKVCache.execute(causal, "2", "2", "16", "hadamard", "fp8_e4m3", 0, "qvg").args[0]
    core(m, lat, cell.recipe)
    rep = core_ar.last_report(m)
    assert rep["cache_bytes"] == rep["planned_bytes"] > 0
    block = ROWS[cell.recipe][0]
    raw_block = LAYERS * 2 * HEADS * block * 16 * HEAD_DIM * 4  # layers x (k, v) x heads x tokens x head_dim x fp32
    assert rep["in_flight_bytes"] == rep["planned_in_flight_bytes"] == raw_block
    if cell.recipe == "plain":
        pack_loop_equals_core(loop, m, lat)


@cells("window_sink")
def test_window_sink(cell, nodes, loop, core_ar, causal):
    """AR Cache Window 2 + sink 1 (INT2): the cache holds sink + window chunks, the planner's bytes; one step ==
    the pack's own loop with the same window and sink."""
    _runs(cell)
    lat = torch.zeros(1, 16, FRAMES, 8, 8)
    m = quantized(nodes, causal, "2", window=(2, 1))
    core(m, lat, cell.recipe)
    rep = core_ar.last_report(m)
    block = ROWS[cell.recipe][0]
    cache_mod = importlib.import_module("comfyui_jensen_kv.jensen_core.cache")
    spec = m.model_options["transformer_options"]["jensen_kv"].spec_k
    per_chunk = LAYERS * cache_mod.chunk_bytes(spec, spec, HEADS, block * 16, HEAD_DIM)
    assert rep["cache_bytes"] == rep["planned_bytes"] == min(3, FRAMES // block - 1) * per_chunk
    if cell.recipe == "plain":
        pack_loop_equals_core(loop, m, lat, window=(2, 1))


@cells("odd_tokens")
def test_odd_tokens(cell, nodes, loop, core_ar, causal):
    """A 6 x 10 latent (15 tokens per frame): the pack's full-precision cache gives core's own video; INT2 holds the
    planner's bytes; one step == the pack's own loop."""
    _runs(cell)
    lat = torch.zeros(1, 16, FRAMES, 6, 10)
    ref = core(causal, lat, cell.recipe)
    torch.testing.assert_close(core(quantized(nodes, causal, "off"), lat, cell.recipe), ref, atol=FP32_ATOL, rtol=0)
    m = quantized(nodes, causal, "2")
    core(m, lat, cell.recipe)
    rep = core_ar.last_report(m)
    assert rep["tokens_per_frame"] == 15 and rep["cache_bytes"] == rep["planned_bytes"] > 0
    if cell.recipe == "plain":
        pack_loop_equals_core(loop, m, lat)


def test_odd_size_is_refused_with_the_familys_error(nodes, causal):
    """A 7 x 10 latent: core's causal Wan pads a partial patch and never crops it, so core's own sampler fails deep
    inside (a shape mismatch in its noise scaling); with the pack's settings the run is refused first, naming the
    fix. Quantization off: the pack's settings are there, so the same refusal."""
    for cell in mx.cells("core", "odd_size", "refused"):
        for bits in ("2", "off"):
            with pytest.raises(ValueError, match=cell.detail):
                core(quantized(nodes, causal, bits), torch.zeros(1, 16, FRAMES, 7, 10), cell.recipe)


def test_the_table_lists_every_cell_of_core():
    """Core's path has the plain and Self-Forcing rows; resume and prompt switch are absent there, with why."""
    runs = mx.cells("core", status="runs")
    assert {c.recipe for c in runs} == set(ROWS)
    assert {c.column for c in mx.cells("core", status="absent") if c.recipe in ROWS} == {"resume", "prompt_switch"}
    assert {c.column for c in mx.cells("core", status="refused")} == {"odd_size"}
