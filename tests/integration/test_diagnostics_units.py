"""Unit tests of the attention diagnostics: selections, statistics, the observer on synthetic events, the Pillow plot.

These need no ComfyUI (the modules are imported through ``support.pack``), but live next to the
diagnostics' integration tests.
"""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
import torch
from support.pack import load_pack_module

obs_mod = load_pack_module("runtime.shift_observer")
plot_mod = load_pack_module("runtime.shift_histogram")
events = load_pack_module("runtime.observer")
core = load_pack_module("jensen_core")
diagnostics = load_pack_module("jensen_core.attention_shift")
summ = load_pack_module("jensen_core.shift_summary")
quant = load_pack_module("jensen_core.quant")
workload = load_pack_module("jensen_core.workload")


# ------------------------------------------------------------------------------------------- selections
@pytest.mark.parametrize(
    "text,count,expected",
    [
        ("all", 4, [0, 1, 2, 3]),
        ("every 8", 30, [0, 8, 16, 24]),
        ("Every 8th", 9, [0, 8]),
        ("first", 5, [0]),
        ("last", 5, [4]),
        ("0, 4, 8-11", 12, [0, 4, 8, 9, 10, 11]),
        ("3,1,1", 4, [1, 3]),
        (" 2 - 3 ", 4, [2, 3]),
    ],
)
def test_selections_resolve(text, count, expected):
    assert obs_mod.resolve_selection(text, count, "layers") == expected


@pytest.mark.parametrize(
    "text,count,match",
    [
        ("every 0", 4, r"every 0.*N >= 1"),
        ("3-1", 4, r"runs backwards; write it as '1-3'"),
        ("40", 30, r"index 40, but this run has 30 layers \(0-29\)"),
        ("0-31", 30, r"index 31"),
        ("half", 4, r"'half' is not a selection; use 'all', 'every N'"),
        ("", 4, r"is not a selection"),
    ],
)
def test_bad_selections_name_the_value_and_the_fix(text, count, match):
    with pytest.raises(ValueError, match=match):
        obs_mod.resolve_selection(text, count, "layers")


def test_request_validates_itself_and_normalises():
    r = obs_mod.DiagnosticsRequest(layers=" Every  4 ", heads="0,2", steps="LAST", query_stride=2)
    assert (r.layers, r.heads, r.steps) == ("every 4", "0, 2", "last")
    assert "every 2th query" in r.describe() or "every 2" in r.describe()
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="query_stride"):
            obs_mod.DiagnosticsRequest(query_stride=bad)
    with pytest.raises(ValueError, match="heads='x'"):
        obs_mod.DiagnosticsRequest(heads="x")


def test_request_lives_on_model_options():
    class FakePatcher:
        model_options: dict = {}

    p = FakePatcher()
    p.model_options = {"transformer_options": {}}
    assert obs_mod.get_request(p.model_options) is None
    assert (
        obs_mod.make_diagnostics(
            p.model_options,
            num_layers=2,
            heads=2,
            steps=2,
            window_chunks=0,
            correction="taylor",
            strength=1.0,
            keys_quantized=True,
        )
        is None
    )
    obs_mod.set_request(p, obs_mod.DiagnosticsRequest(layers="1"))
    made = obs_mod.make_diagnostics(
        p.model_options,
        num_layers=2,
        heads=2,
        steps=2,
        window_chunks=0,
        correction="taylor",
        strength=1.0,
        keys_quantized=True,
    )
    assert made.layers == [1] and made.modes == ["off", "taylor"]
    p.model_options["transformer_options"][obs_mod.REQUEST_KEY] = {"layers": "all"}
    with pytest.raises(TypeError, match="not a DiagnosticsRequest"):
        obs_mod.get_request(p.model_options)


# ------------------------------------------------------------------------------------------- statistics
def test_quantile_matches_torch_and_accumulator_weights_the_mse():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1001, generator=g)
    s = x.sort().values
    for q in (0.0, 0.1, 0.25, 0.5, 0.75, 1.0):
        assert summ.quantile(s, q) == pytest.approx(float(torch.quantile(x.double(), q)), abs=1e-6)
    acc = summ.ShiftAccumulator()
    a = diagnostics.ShiftStats(delta_ps=torch.tensor([0.1, 0.3]), jsd=torch.tensor([1.0, 3.0]), output_mse=2.0)
    b = diagnostics.ShiftStats(delta_ps=torch.tensor([0.2]), jsd=torch.tensor([5.0]), output_mse=8.0)
    acc.add(a, 10)
    acc.add(b, 30)
    out = acc.summary()
    assert out["median_delta_ps"] == pytest.approx(0.2) and out["samples"] == 3 and out["calls"] == 2
    assert out["mean_jsd"] == pytest.approx(3.0)
    assert out["output_mse"] == pytest.approx((2.0 * 10 + 8.0 * 30) / 40)  # element-weighted, not (2 + 8) / 2
    assert out["iqr_delta_ps"] == pytest.approx(out["q75_delta_ps"] - out["q25_delta_ps"])
    empty = summ.ShiftAccumulator().summary()
    assert empty["median_delta_ps"] is None and empty["samples"] == 0
    json.dumps(empty, allow_nan=False)


def test_common_histogram_counts_everything_on_shared_edges():
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(5000, generator=g) * 0.01 + 0.02, torch.randn(5000, generator=g) * 0.01
    h = summ.common_histogram({"off": a, "taylor": b}, bins=40)
    assert len(h["edges"]) == 41 and all(len(c) == 40 for c in h["counts"].values())
    assert sum(h["counts"]["off"]) == 5000 and sum(h["counts"]["taylor"]) == 5000
    assert h["edges"][0] <= 0 <= h["edges"][-1]
    assert 0 < h["clamped"]["off"] < 100  # only the 0.5 % tails go to the edge bins
    peak_a = max(range(40), key=h["counts"]["off"].__getitem__)
    peak_b = max(range(40), key=h["counts"]["taylor"].__getitem__)
    assert h["edges"][peak_a] > h["edges"][peak_b]  # the shifted distribution peaks further right
    flat = summ.common_histogram({"x": torch.zeros(7)}, bins=5)
    assert sum(flat["counts"]["x"]) == 7


# ------------------------------------------------------------------------------------------- the observer
def _event(phase, chunk, step, q, k, v, cache, layer=0, branch=0, correction="taylor"):
    return events.AttentionEvent(
        layer=layer,
        branch=branch,
        chunk=chunk,
        frame_offset=chunk,
        phase=phase,
        step=step,
        q=q,
        k=k,
        v=v,
        cache=cache,
        out=torch.zeros_like(q),
        correction=correction,
        strength=1.0,
    )


def _chunks(n, heads=3, tokens=48, d=64, seed=0):
    w = workload.make_workload(seed=seed, heads=heads, head_dim=d, chunk_tokens=tokens, cached_chunks=n)
    return w


def _drive(obs, w, spec, window=None, steps=2, layer=0):
    """Write every cached chunk of ``w`` through the observer and a ChunkCache, then denoise with w.q."""
    cache = core.ChunkCache(spec, spec, window)
    for c, (k, v) in enumerate(zip(w.k_cached, w.v_cached)):
        for s in range(steps):
            obs(_event("denoise", c, s, w.q, k, v, cache if c else None, layer=layer))
        obs(_event("write", c, 0, w.q, k, v, cache, layer=layer))
        cache.append(k, v)
    n = len(w.k_cached)
    for s in range(steps):
        if obs.wants(layer, n, "denoise", s):
            obs(_event("denoise", n, s, w.q, w.k_cur, w.v_cur, cache, layer=layer))
    return cache


def _observer(layers="all", heads="all", steps="all", query_stride=1, n_heads=3, **kw):
    req = obs_mod.DiagnosticsRequest(layers=layers, heads=heads, steps=steps, query_stride=query_stride)
    args = dict(
        num_layers=2, heads=n_heads, steps=2, window_chunks=0, correction="taylor", strength=1.0, keys_quantized=True
    )
    args.update(kw)
    return obs_mod.DiagnosticsObserver(req, **args)


def test_observer_equals_attention_shift_on_the_window_and_the_sampled_heads():
    w = _chunks(3)
    spec = core.QuantSpec(bits=2, group_size=16, rotation="hadamard")
    obs = _observer(heads="0,2", steps="last", window_chunks=2, query_stride=2)
    cache = _drive(obs, w, spec, window=2)
    assert cache.num_chunks == 2
    # the reference, call by call: chunks 1-3 at their last step, each over the window (at most the two
    # previous chunks) of heads 0 and 2, with the chunk's own K/V as the current block
    hi = [0, 2]
    ks, vs = [*w.k_cached, w.k_cur], [*w.v_cached, w.v_cur]
    for mode in ("off", "taylor"):
        deltas, jsd, sq, n = [], [], 0.0, 0
        for c in (1, 2, 3):
            window = range(max(0, c - 2), c)
            kq = quant.cat_quantized([core.quantize(ks[j], spec) for j in window])[:, hi]
            vq = quant.cat_quantized([core.quantize(vs[j], spec) for j in window])[:, hi]
            k_ref = torch.cat([ks[j] for j in window], dim=-2)[:, hi]
            v_ref = torch.cat([vs[j] for j in window], dim=-2)[:, hi]
            ref = diagnostics.attention_shift(
                w.q[:, hi], k_ref, v_ref, ks[c][:, hi], vs[c][:, hi], kq, vq, correction=mode, query_stride=2
            )
            deltas.append(ref.delta_ps)
            jsd.append(ref.jsd)
            elements = w.q[:, hi, ::2].numel()
            sq += ref.output_mse * elements
            n += elements
        got = obs.acc[mode]
        torch.testing.assert_close(got.delta_ps(), torch.cat(deltas))
        assert got.summary()["mean_jsd"] == pytest.approx(float(torch.cat(jsd).mean()), rel=1e-5)
        assert got.summary()["output_mse"] == pytest.approx(sq / n, rel=1e-6)
        assert got.calls == 3  # the last of 2 steps of chunks 1, 2 and 3
    summary = obs.summary()
    assert summary["chunks"] == [1, 2, 3] and summary["calls"] == 3 and summary["heads"] == hi
    obs.free()
    assert not obs._shadow


def test_observer_gives_chunk_mean_each_cached_chunk_its_own_mean():
    """chunk_mean in the diagnostics: the bias of each cached chunk is that chunk's mean, as in the fast path;
    a window-wide mean (what the concatenated K would give without the chunk layout) is a different number."""
    w = _chunks(3, seed=4)
    scaled = dataclasses.replace(w, k_cached=[k * (1 + 2 * i) for i, k in enumerate(w.k_cached)])
    spec = core.QuantSpec(bits=2, group_size=16)
    obs = _observer(steps="last", correction="chunk_mean")
    cache = _drive(obs, scaled, spec)
    assert obs.modes == ["off", "chunk_mean"]
    kq = quant.cat_quantized([e.k for e in cache.entries])
    vq = quant.cat_quantized([e.v for e in cache.entries])
    args = (
        scaled.q,
        torch.cat(scaled.k_cached, -2),
        torch.cat(scaled.v_cached, -2),
        scaled.k_cur,
        scaled.v_cur,
        kq,
        vq,
    )
    # the observer measures the run's attention, guarded as runs are by default (the scaled keys are where it acts)
    ref = diagnostics.attention_shift(*args, correction="chunk_mean", chunk_tokens=[48, 48, 48], guard=obs.guard)
    last = obs.acc["chunk_mean"].delta_ps()[-ref.delta_ps.numel() :]  # the call that read all three chunks
    torch.testing.assert_close(last, ref.delta_ps)
    window_mean = diagnostics.attention_shift(*args, correction="per_channel")
    assert (last - window_mean.delta_ps).abs().max() > 1e-3
    # and the run's own attention, through the fast path, matches the diagnostics' materialised one
    out = cache.attend(scaled.q, scaled.k_cur, scaled.v_cur, correction="chunk_mean", guard=obs.guard)
    full = core.ChunkCache(None, None)
    for k, v in zip(scaled.k_cached, scaled.v_cached):
        full.append(k, v)
    mse = (out - full.attend(scaled.q, scaled.k_cur, scaled.v_cur)).square().mean().item()
    assert mse == pytest.approx(ref.output_mse, rel=1e-3)


def test_observer_wants_only_sampled_layers_and_steps():
    obs = _observer(layers="1", steps="0", num_layers=3)
    assert obs.wants(1, 0, "write", 0) and obs.wants(1, 2, "denoise", 0)
    assert not obs.wants(0, 2, "denoise", 0) and not obs.wants(2, 0, "write", 0)
    assert not obs.wants(1, 2, "denoise", 1)  # unsampled step
    assert not obs.wants(1, 0, "denoise", 0)  # chunk 0 reads no cache


def test_int2_steals_attention_and_the_observer_sees_the_correction_give_it_back():
    w = _chunks(4, heads=4, tokens=128, d=128, seed=3)
    obs = _observer(n_heads=4)
    _drive(obs, w, core.QuantSpec(bits=2, group_size=32))
    s = obs.summary()["stats"]
    assert s["off"]["median_delta_ps"] > 0.01
    assert abs(s["taylor"]["median_delta_ps"]) < 0.5 * s["off"]["median_delta_ps"]
    assert s["taylor"]["mean_jsd"] < s["off"]["mean_jsd"] and s["taylor"]["output_mse"] < s["off"]["output_mse"]


def test_what_if_and_unquantized_keys():
    w = _chunks(2)
    off = _observer(correction="off")
    _drive(off, w, core.QuantSpec(bits=2, group_size=16))
    s = off.summary()
    assert s["modes"] == ["off", "taylor"] and s["what_if"] is True and s["applied"] == "off"
    assert "what-if" in plot_mod.diagnostics_text(s)
    # a Jensen node at strength 0 applies nothing: the what-if is still the full correction, not a copy of "off"
    zero = _observer(correction="off", strength=0.0)
    _drive(zero, w, core.QuantSpec(bits=2, group_size=16))
    z = zero.summary()
    assert z["what_if"] and z["strength"] == 1.0
    assert z["stats"]["taylor"]["median_delta_ps"] == pytest.approx(s["stats"]["taylor"]["median_delta_ps"])
    assert z["stats"]["taylor"]["median_delta_ps"] != z["stats"]["off"]["median_delta_ps"]
    full = _observer(correction="off", keys_quantized=False)
    _drive(full, w, None)
    s = full.summary()
    assert s["modes"] == ["off"] and s["stats"]["off"]["median_delta_ps"] == 0.0
    assert s["stats"]["off"]["output_mse"] == 0.0
    assert "not quantized" in plot_mod.diagnostics_text(s)


def test_observer_refuses_a_cache_it_did_not_see_written():
    w = _chunks(2)
    obs = _observer()
    cache = core.ChunkCache(core.QuantSpec(bits=2, group_size=16), None)
    cache.append(w.k_cached[0], w.v_cached[0])  # written behind the observer's back
    with pytest.raises(RuntimeError, match="lost track of the cache of layer 0"):
        obs(_event("denoise", 1, 0, w.q, w.k_cur, w.v_cur, cache))


def test_tee_observer_routes_by_each_wants():
    seen_a, seen_b = [], []

    class A:
        def wants(self, layer, chunk, phase, step):
            return layer == 0

        def __call__(self, e):
            seen_a.append(e.layer)

    def b(e):
        seen_b.append(e.layer)

    assert obs_mod.combine_observers(None, b) is b and obs_mod.combine_observers(b, None) is b
    tee = obs_mod.combine_observers(A(), b)
    assert tee.wants(1, 0, "write", 0)  # b (no wants) takes everything
    q = torch.zeros(1, 1, 2, 8)
    for layer in (0, 1):
        tee(_event("write", 0, 0, q, q, q, None, layer=layer))
    assert seen_a == [0] and seen_b == [0, 1]


# ------------------------------------------------------------------------------------------- plot and text
@pytest.fixture(scope="module")
def summary():
    w = _chunks(3, heads=2, tokens=96, d=64, seed=5)
    obs = _observer(n_heads=2)
    _drive(obs, w, core.QuantSpec(bits=2, group_size=16, rotation="hadamard"))
    return obs.summary()


def test_summary_is_json_ready(summary):
    text = json.dumps(summary, allow_nan=False)
    assert json.loads(text) == summary


def test_histogram_image_has_the_right_shape_and_is_not_blank(summary):
    img = plot_mod.render_histogram(summary, 800, 450)
    assert img.size == (800, 450) and img.mode == "RGB"
    t = plot_mod.image_tensor(img)
    assert t.shape == (1, 450, 800, 3) and t.dtype == torch.float32
    assert 0.0 <= float(t.min()) and float(t.max()) <= 1.0
    colors = {c for _, c in img.getcolors(maxcolors=1 << 20)}
    assert len(colors) > 50  # bars, blends, anti-aliased text
    assert plot_mod.BEFORE in colors and plot_mod.AFTER in colors  # the legend swatches
    px = t[0].reshape(-1, 3)
    white = (px > 0.98).all(-1).float().mean()
    assert 0.3 < float(white) < 0.97  # mostly background, but a lot drawn
    # the bars: purple-ish and orange-ish blends inside the plot area
    purple = ((px[:, 2] > px[:, 1] + 0.1) & (px[:, 0] > px[:, 1])).float().sum()
    orange = ((px[:, 0] > px[:, 2] + 0.2) & (px[:, 1] > px[:, 2])).float().sum()
    assert purple > 500 and orange > 500, (purple, orange)


def test_plot_refuses_tiny_sizes_and_draws_a_note_without_data():
    with pytest.raises(ValueError, match="at least 320 x 240"):
        plot_mod.render_histogram({"calls": 0}, 100, 100)
    empty = _observer().summary()
    img = plot_mod.render_histogram(empty)
    assert img.size == (960, 540) and len(img.getcolors(maxcolors=1 << 20)) > 2
    assert "at least two chunks" in plot_mod.diagnostics_text(empty)


def test_text_numbers_match_the_stats(summary):
    text = plot_mod.diagnostics_text(summary)
    lines = text.splitlines()
    for mode in summary["modes"]:
        line = next(ln for ln in lines if ln.startswith(plot_mod.mode_label(summary, mode)))
        st = summary["stats"][mode]
        nums = [float(x) for x in re.findall(r"[-+]?\d+\.\d+(?:e[-+]\d+)?", line)]
        median, iqr, q25, q75, jsd, mse = nums
        assert median == pytest.approx(st["median_delta_ps"], abs=6e-6)
        assert iqr == pytest.approx(st["iqr_delta_ps"], abs=6e-6)
        assert (q25, q75) == (pytest.approx(st["q25_delta_ps"], abs=6e-6), pytest.approx(st["q75_delta_ps"], abs=6e-6))
        assert jsd == pytest.approx(st["mean_jsd"], rel=1e-3) and mse == pytest.approx(st["output_mse"], rel=1e-3)
    assert f"{summary['stats']['off']['samples']} queries from {summary['calls']} attention calls" in text


def test_ascii_fallback_for_fonts_without_greek():
    assert plot_mod._t("ΔP_S −0.1 → x", False) == "dP_S -0.1 -> x"
    assert plot_mod._t("ΔP_S", True) == "ΔP_S"
    assert plot_mod._short([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
