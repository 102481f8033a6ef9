"""The family conformance suite: every family in ``runtime.families.FAMILIES``, with its tiny model from
``jensen_testing.families.TINY``, through the same checks. A new family passes by adding its room and its tiny
model, nothing else.

For every family:
- the probe finds it (and no other family's probe applies), and the refusal of a variant it does not support names
  what is supported and what the probe found;
- installing and removing its patches on a clone leaves that clone's object patches and wrappers exactly as found,
  and a run leaves the MODEL it was given untouched;
- a full-precision cached run equals the family's own block-causal forward, call by call (a family whose recipe owns
  its loop: its own full-precision reference, whole runs at cfg 1 and, unless it refuses cfg > 1, cfg 3);
- INT2 moves the video away from it, and the correction (taylor, chunk_mean) gives back attention mass (ΔP_S);
- the planner equals the bytes the run really cached;
- save, load and continue give the same video as one run, bit for bit;
- on core's AR path, where the family has one, the pack with quantization off gives core's own result.

A family whose recipe owns its loop (``TinyFamily.sample``) runs through that loop and is checked against its own
full-precision reference (``TinyFamily.reference``); where a check needs an option its loop refuses
(``TinyFamily.refused_options``: a window, cfg > 1, a saved cache), the check is that refusal, naming the option.
A family's ``marks`` go on its tests (``hunyuan15``: deselected on a ComfyUI without HunyuanVideo 1.5, never skipped).
"""

from __future__ import annotations

import importlib
import sys

import pytest
import torch
from support import comfyui as support_comfyui

from jensen_testing import reference
from jensen_testing.families import TINY


def _families():
    from support.pack import load_pack_module

    return load_pack_module("runtime.families").FAMILIES


FAMILY_KEYS = [f.key for f in _families()]


def _family_param(key: str):
    """The family's key, with the markers its tiny model asks for (a family on a newer ComfyUI part is deselected
    where that part is missing, e.g. ``-m "not hunyuan15"`` on v0.3.64)."""
    tiny = TINY.get(key)
    return pytest.param(key, marks=[getattr(pytest.mark, m) for m in (tiny.marks if tiny else ())], id=key)


def test_every_family_has_a_tiny_model():
    """The suite runs every family: one without a tiny model would pass by not being tested."""
    assert set(FAMILY_KEYS) == set(TINY), (
        f"tiny models in jensen_testing.families.TINY for {set(FAMILY_KEYS) - set(TINY)}"
    )


@pytest.fixture(params=[_family_param(k) for k in FAMILY_KEYS])
def fam(request, pack):
    families = importlib.import_module(f"{support_comfyui.PACK_MODULE}.runtime.families")
    family = next(f for f in families.FAMILIES if f.key == request.param)
    return family, TINY[request.param], families


def _quantized(nodes, model, correction=None, bits="2"):
    m = nodes.JensenKVQuantizeKVCache.execute(model, bits, bits, "16", "hadamard", "fp8_e4m3", 0).args[0]
    if correction is not None:
        m = nodes.JensenKVBiasCorrection.execute(m, correction, 1.0).args[0]
    return m


#: the defaults of the options a family's own loop may refuse (any other value is refused, by name)
OPTION_DEFAULTS = {"window_chunks": 0, "sink_chunks": 0, "cfg": 1.0, "keep_state": False, "resume": None}


def _refused(tiny, **options) -> list[str]:
    """The options (set away from their defaults) that this family's own loop refuses."""
    return [n for n, v in options.items() if n in tiny.refused_options and v != OPTION_DEFAULTS.get(n, v)]


def _check_refusal(loop, tiny, model, euler, refused: list[str], **kw) -> None:
    """The family's loop refuses these options with a ValueError naming one of them (its words)."""
    with pytest.raises(ValueError) as e:
        _run(loop, tiny, model, euler, **kw)
    msg = str(e.value)
    assert any(all(w in msg for w in tiny.refused_options[n]) for n in refused), (refused, msg)


def _run(loop, tiny, model, euler, frames=7, recorder=None, observer=None, cfg=1.0, **kw):
    import comfy.patcher_extension

    if tiny.sample is not None:  # the family's recipe owns its loop
        assert recorder is None, "a family with its own loop is checked against its own reference, not a recorder"
        schedule = {} if tiny.sigmas is None else {"sampler": euler, "sigmas": tiny.sigmas(model)}
        return tiny.sample(
            model,
            tiny.conditioning(1),
            tiny.latent(frames, 1),
            seed=7,
            cfg=cfg,
            observer=observer,
            progress=False,
            **schedule,
            **{**tiny.run_options, **kw},
        )
    m = model
    if recorder is not None:
        m = model.clone()
        m.add_wrapper_with_key(comfy.patcher_extension.WrappersMP.DIFFUSION_MODEL, "test_recorder", recorder)
    return loop.run_chunked_ar(
        m,
        tiny.conditioning(1),
        tiny.conditioning(2),
        tiny.latent(frames, 1),
        seed=7,
        cfg=cfg,
        sampler=euler,
        sigmas=tiny.sigmas(model),
        chunk_frames=tiny.chunk_frames,
        observer=observer,
        progress=False,
        **{**tiny.run_options, **kw},
    )


# ------------------------------------------------------------------------------------------------ probe
def test_the_probe_finds_the_family_and_no_other(fam):
    family, tiny, families = fam
    model = tiny.build(0)
    assert isinstance(families.detect(model), family)
    others = [f.name for f in families.FAMILIES if f is not family and f.probe(model).applies]
    assert others == []
    shape = families.attention_shape(model)
    assert shape is not None and shape.layers >= 1 and shape.heads >= 1 and shape.head_dim >= 1


def test_a_refused_variant_names_what_is_supported_and_what_the_probe_found(fam):
    family, tiny, families = fam
    with pytest.raises(families.UnsupportedModelError) as e:
        families.detect(tiny.refused())
    msg = str(e.value)
    assert family.supported in msg
    for word in tiny.refusal_words:
        assert word in msg, (word, msg)


# ------------------------------------------------------------------------------------------------ patches
def _patch_state(model):
    wrappers = model.model_options.get("transformer_options", {}).get("wrappers", {})
    return (
        dict(model.object_patches),
        {k: {kk: list(vv) for kk, vv in v.items()} for k, v in wrappers.items()},
        dict(getattr(model, "object_patches_backup", {}) or {}),
    )


def test_install_and_remove_leave_the_patches_exactly_as_found(fam, pack):
    family, tiny, families = fam
    run_caches = importlib.import_module(f"{support_comfyui.PACK_MODULE}.runtime.run_caches")
    config = importlib.import_module(f"{support_comfyui.PACK_MODULE}.runtime.config")
    model = tiny.build(0)
    work = model.clone()
    before = _patch_state(work)
    adapter = families.detect(work)
    run = run_caches.RunCaches(config.JensenKVConfig(), 0, adapter.num_layers)
    adapter.install(work, run)
    assert _patch_state(work) != before, "install changed nothing"
    assert any(family.is_loop_patch(p) for p in work.object_patches.values())
    assert families.is_pack_loop(work) and not families.is_pack_loop(model)
    adapter.remove(work)
    assert _patch_state(work) == before


def test_a_run_leaves_the_model_it_was_given_untouched(fam, loop, nodes, euler):
    family, tiny, _ = fam
    model = _quantized(nodes, tiny.build(0), "taylor")
    before = _patch_state(model)
    _run(loop, tiny, model, euler, frames=4)
    assert _patch_state(model) == before


# ------------------------------------------------------------------------------------------------ the run
def test_a_full_precision_cached_run_equals_the_family_block_causal_forward(fam, loop, euler):
    family, tiny, _ = fam
    model = tiny.build(0)
    frames = 3 * tiny.chunk_frames + 1  # the last chunk is shorter
    if tiny.reference is not None:  # the family's own loop against its own full-precision forward, whole runs
        ran = 0
        for cfg in (1.0, 3.0):
            if _refused(tiny, cfg=cfg):
                continue
            result = _run(loop, tiny, model, euler, frames=frames, cfg=cfg)
            assert result.report["chunks"] == 4 and result.report["cache_bytes"] > 0
            assert float((result.samples - tiny.latent(frames, 1)["samples"]).abs().max()) > 0.1  # it sampled
            want = tiny.reference(model, frames, cfg)
            tol = tiny.reference_tolerance * float(want.abs().max())  # relative to the largest value
            torch.testing.assert_close(result.samples, want, atol=tol, rtol=0)
            ran += 1
        assert ran >= 1
        return
    rec = reference.DiffusionModelRecorder()
    result = _run(loop, tiny, model, euler, frames=frames, recorder=rec)
    steps = tiny.sigmas(model).numel() - 1
    chunks = result.report["chunks"]
    assert chunks == 4
    i, written, worst = 0, [], 0.0
    for c in range(chunks):
        calls = rec.calls[i : i + steps + (1 if c < chunks - 1 else 0)]
        i += len(calls)
        for call in calls:
            want = tiny.block_causal(model, written, call)
            worst = max(worst, float((call["out"] - want).abs().max()))
            torch.testing.assert_close(call["out"], want, atol=1e-5, rtol=1e-5)
        if c < chunks - 1:
            written.append(calls[-1])  # the write pass of chunk c
    assert i == len(rec.calls)
    assert worst < 1e-5


class _Mass:
    """The cached chunks' full-precision K/V from write events; per denoising call, what attention_shift needs."""

    def __init__(self):
        self.fp, self.events = {}, []

    def __call__(self, e):
        if e.phase == "write":
            self.fp[(e.layer, e.branch, e.chunk)] = (e.k.detach().clone(), e.v.detach().clone())
            return
        if e.cache is None or not e.cache.entries:
            return
        held = e.cache.entries
        if e.last_chunks is not None:  # a call that read only the newest n chunks (a per-chunk key range)
            held = held[len(held) - e.last_chunks :] if e.last_chunks else []
        if not held:
            return
        chunks = sorted(c for (layer, b, c) in self.fp if layer == e.layer and b == e.branch and c < e.chunk)
        chunks = chunks[len(chunks) - len(held) :]
        k_cur, v_cur = e.k, e.v
        if e.context is not None:  # tokens attended in full precision besides the call's own: current, uncorrected
            k_cur, v_cur = torch.cat([e.context[0], k_cur], dim=-2), torch.cat([e.context[1], v_cur], dim=-2)
        self.events.append(
            (
                e.q.detach().clone(),
                k_cur.detach().clone(),
                v_cur.detach().clone(),
                torch.cat([self.fp[(e.layer, e.branch, c)][0] for c in chunks], dim=-2),
                torch.cat([self.fp[(e.layer, e.branch, c)][1] for c in chunks], dim=-2),
                [en.k for en in held],
                [en.v for en in held],
                e.correction,
                e.strength,
            )
        )


def _delta_ps(jk, events) -> torch.Tensor:
    shift = importlib.import_module(f"{jk.__name__}.attention_shift").attention_shift
    cat = importlib.import_module(f"{jk.__name__}.quant").cat_quantized
    out = []
    for q, kc, vc, kf, vf, ks, vs, mode, strength in events:
        out.append(shift(q, kf, vf, kc, vc, cat(ks), cat(vs), correction=mode, strength=strength).delta_ps)
    return torch.cat([d.flatten() for d in out])


@pytest.mark.parametrize("mode", ["taylor", "chunk_mean"])
def test_int2_moves_away_and_the_correction_gives_attention_back(fam, loop, nodes, jk, euler, mode):
    family, tiny, _ = fam
    model = tiny.build(0)
    fp = _run(loop, tiny, model, euler).samples
    shifts, videos = {}, {}
    for name, corr in (("int2", None), ("int2_corrected", mode)):
        obs = _Mass()
        r = _run(loop, tiny, _quantized(nodes, model, corr), euler, observer=obs)
        assert obs.events, "no denoising call read a cached chunk"
        shifts[name], videos[name] = _delta_ps(jk, obs.events), r.samples
    # INT2 moves the video away from full precision (measured ~1e-2 relative on the tiny Wan)
    rel = float((videos["int2"] - fp).abs().max() / fp.abs().max())
    assert rel > 1e-4, rel
    raw, fixed = shifts["int2"].mean().item(), shifts["int2_corrected"].mean().item()
    se = shifts["int2"].std().item() / shifts["int2"].numel() ** 0.5
    assert raw > 0 and raw > 10 * se, (raw, se)  # quantized keys steal attention
    assert abs(fixed) < 0.5 * raw, (raw, fixed)  # the correction gives most of it back


@pytest.mark.parametrize("window,cfg", [(0, 1.0), (2, 3.0)])
def test_the_planner_equals_the_bytes_the_run_cached(fam, loop, nodes, euler, window, cfg):
    family, tiny, _ = fam
    planner = importlib.import_module(f"{support_comfyui.PACK_MODULE}.jensen_core.planner")
    model = _quantized(nodes, tiny.build(0), "taylor")
    frames = 4 * tiny.chunk_frames
    refused = _refused(tiny, window_chunks=window, cfg=cfg)
    if refused:
        _check_refusal(loop, tiny, model, euler, refused, frames=frames, window_chunks=window, cfg=cfg)
        return
    rep = _run(loop, tiny, model, euler, frames=frames, window_chunks=window, cfg=cfg).report
    assert rep["window_chunks"] == window or (window == 0 and tiny.sample is not None)  # 0: the recipe's own choice
    latent = tiny.latent(frames, 1)["samples"]
    config = model.model_options["transformer_options"]["jensen_kv"]
    plan = planner.plan_cache(
        latent_frames=frames,
        latent_height=latent.shape[-2],
        latent_width=latent.shape[-1],
        chunk_frames=tiny.chunk_frames,
        window_chunks=rep["window_chunks"],
        shape=planner.CacheShape(
            layers=rep["layers"],
            heads=rep["heads"],
            head_dim=rep["head_dim"],
            geometry=family.geometry,
            kv_heads=rep.get("kv_heads", rep["heads"]),
            cfg_branches=rep["cfg_branches"],
        ),
        precision=planner.CachePrecision(spec_k=config.spec_k, spec_v=config.spec_v),
    )
    assert rep["cache_bytes"] == plan.quantized_bytes > 0
    assert rep["bf16_bytes"] == plan.bf16_bytes


def test_save_load_and_continue_equal_one_run(fam, loop, nodes, euler, tmp_path):
    family, tiny, _ = fam
    saved_run = importlib.import_module(f"{support_comfyui.PACK_MODULE}.runtime.saved_run")
    model = _quantized(nodes, tiny.build(0), "taylor")
    n = 2 * tiny.chunk_frames
    refused = _refused(tiny, window_chunks=2, sink_chunks=1, keep_state=True)
    # what the family tells the planner (no Save KV Cache file to size) is what its loop does
    assert family.saves_runs == ("keep_state" not in tiny.refused_options and "resume" not in tiny.refused_options)
    if refused:
        _check_refusal(loop, tiny, model, euler, refused, frames=n, window_chunks=2, sink_chunks=1, keep_state=True)
        return
    whole = _run(loop, tiny, model, euler, frames=2 * n, window_chunks=2, sink_chunks=1).samples
    first = _run(loop, tiny, model, euler, frames=n, window_chunks=2, sink_chunks=1, keep_state=True)
    path = str(tmp_path / "state.safetensors")
    first.state.save(path)
    second = _run(
        loop, tiny, model, euler, frames=n, window_chunks=2, sink_chunks=1, resume=saved_run.load_saved_run(path)
    )
    assert torch.equal(first.samples, whole[:, :, :n])
    assert torch.equal(second.samples, whole[:, :, n:])


# ------------------------------------------------------------------------------------------------ core's path
@pytest.mark.core_ar
def test_the_families_with_a_core_path_say_so(fam):
    family, tiny, families = fam
    if tiny.build_causal is None:
        assert families.core_ar_family(tiny.build(0)) is None
        return
    causal = tiny.build_causal(0)
    assert families.core_ar_family(causal) is family
    assert family.core_ar_model(causal) is not None
    # a plain (not causal) model of the family has no core path
    assert families.core_ar_family(tiny.build(0)) is None


@pytest.mark.core_ar
def test_on_core_path_the_pack_with_quantization_off_gives_core_result(fam, nodes):
    family, tiny, _ = fam
    if tiny.build_causal is None and tiny.sample is not None:
        # a family whose recipe owns its loop serves no core path, and says so
        assert family.core_ar_model(tiny.build(0)) is None
        return
    if tiny.build_causal is None:
        pytest.fail(f"{family.name} has no core AR path: its tiny model sets none (deselect core_ar only for v<0.27)")
    causal = tiny.build_causal(0)
    sigmas = tiny.core_sigmas()
    lat = tiny.latent(3 * tiny.chunk_frames, 1)["samples"]
    ref = tiny.sample_core(causal, lat, sigmas, num_frame_per_block=tiny.chunk_frames, seed=3)
    off = nodes.JensenKVQuantizeKVCache.execute(causal, "off", "off", "32", "none").args[0]
    out = tiny.sample_core(off, lat, sigmas, num_frame_per_block=tiny.chunk_frames, seed=3)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=0)
    int2 = tiny.sample_core(_quantized(nodes, causal), lat, sigmas, num_frame_per_block=tiny.chunk_frames, seed=3)
    assert float((int2 - ref).abs().max()) > 1e-4


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a CPU run's peak is read from Linux's /proc")
def test_the_report_gives_the_runs_measured_peak_beside_the_planned_cache(fam, loop, nodes, euler):
    """Every family's report carries ``peak_memory``: the cache's peak and plan as the report has them, and the run's
    measured peak, which covers the whole run (64 MiB an observer maps and writes during one attention call shows).
    The 64 MiB are fresh pages of an anonymous map of the test's own: a tensor could be served from memory a long test
    process's allocator already holds resident and add nothing to the resident set (seen in CI on v0.27)."""
    import mmap

    family, tiny, _ = fam
    held = []
    size = 64 * 2**20

    def observer(e):
        if not held:
            big = mmap.mmap(-1, size)
            for at in range(0, size, mmap.PAGESIZE):
                big[at] = 1  # every page resident for the rest of the run
            held.append(big)

    try:
        rep = _run(
            loop, tiny, _quantized(nodes, tiny.build(0), "taylor"), euler, frames=4 * tiny.chunk_frames,
            observer=observer,
        ).report  # fmt: skip
    finally:
        for big in held:
            big.close()
    assert held, "no attention call was observed"
    peak = rep["peak_memory"]
    assert peak["cache_bytes"] == rep["cache_bytes"] > 0
    assert peak["planned_cache_bytes"] == rep["planned_bytes"]
    assert peak["peak_bytes"] >= 60 * 2**20, peak
    assert peak["above_cache_bytes"] == peak["peak_bytes"] - rep["cache_bytes"]
    report_text = importlib.import_module(f"{support_comfyui.PACK_MODULE}.runtime.report").report_text
    assert "Peak memory of the run (process)" in report_text(rep)
