"""The four nodes called as ComfyUI calls them (V3 ``execute``), in-process on a tiny Wan."""

from __future__ import annotations

import dataclasses
import logging

import pytest
import torch
from support import wan_tiny

REPORT_KEYS = {
    "recipe",
    "recache_mode",
    "cache_bytes",
    "bf16_bytes",
    "cache_mib",
    "bf16_mib",
    "effective_bits",
    "chunks",
    "chunk_frames",
    "window_chunks",
    "seconds_per_chunk",
    "key_bits",
    "value_bits",
    "group_size",
    "rotation",
    "correction",
    "strength",
    "layers",
    "heads",
    "kv_heads",
    "head_dim",
    "cfg_branches",
    "tokens_per_frame",
    "method",
    "qvg_stages",
    "qvg_centroids",
    # long videos: sink, prefix, continue-later, prompt schedule, ComfyUI memory request
    "sink_chunks",
    "first_chunk",
    "prefix_chunks",
    "resumed",
    "prompts",
    "memory_request",
    "planned_bytes",
    "state_file_bytes",
    "state_file_mib",
    # precision by age
    "tiers",
    "recent_chunks_bits",
    "recent_chunks",
    "sink_bits",
    "recent_chunks_key_bits",
    "chunks_demoted",
    # precision by head
    "head_bits",
    "head_fraction",
    "promoted_heads",
    # each chunk's latent frames (a shorter last or first one), what the run warned of
    "chunk_lengths",
    "warnings",
    # the run's measured peak memory beside the cache (runtime/peak_memory.py)
    "peak_memory",
    # whether the correction was guarded (on by default)
    "guard",
}


def _schema(node_cls):
    s = node_cls.define_schema()
    s.finalize()
    return s


#: added after v0.1, all optional and after the old inputs (saved workflows and API prompts keep working)
NEW_SAMPLER_INPUTS = [
    "sink_chunks",
    "prefix",
    "include_prefix",
    "kv_cache",
    "recache_on_switch",
    "recompute_frames",
    "kv_cache_attention_bias",
    "vae",
    "recache_mode",
    "context_noise_mode",
]
SAMPLER_OUTPUTS = ["LATENT", "JENSEN_KV_REPORT", "JENSEN_KV_CACHE"]


def test_schemas_follow_the_contract(nodes):
    expected = {
        "JensenKVQuantizeKVCache": (
            "Quantize KV Cache",
            [
                "model",
                "key_bits",
                "value_bits",
                "group_size",
                "rotation",
                "scale_format",
                "rotation_seed",
                "method",
                "qvg_stages",
                "qvg_centroids",
                "qvg_iters",
                "recent_chunks_bits",
                "recent_chunks",
                "sink_bits",
                "recent_chunks_key_bits",
                "head_bits",
                "head_fraction",
            ],
            ["MODEL"],
        ),
        "JensenKVBiasCorrection": ("Jensen Bias Correction", ["model", "mode", "strength", "guard"], ["MODEL"]),
        "JensenKVChunkedARSampler": (
            "Chunked AR Video Sampler",
            [
                "model",
                "positive",
                "negative",
                "latent",
                "seed",
                "cfg",
                "sampler",
                "sigmas",
                "chunk_frames",
                "window_chunks",
                "context_noise",
                *NEW_SAMPLER_INPUTS,
                "first_chunk_sigmas",
                "first_chunk_frames",
            ],
            SAMPLER_OUTPUTS,
        ),
        "JensenKVChunkedARSamplerSimple": (
            "Chunked AR Video Sampler (KSampler)",
            [
                "model",
                "positive",
                "negative",
                "latent",
                "seed",
                "steps",
                "cfg",
                "sampler_name",
                "scheduler",
                "chunk_frames",
                "window_chunks",
                "context_noise",
                *NEW_SAMPLER_INPUTS,
                "first_chunk_steps",
                "first_chunk_frames",
            ],
            SAMPLER_OUTPUTS,
        ),
    }
    assert {n.define_schema().node_id for n in nodes.NODES} == set(expected)
    for node_cls in nodes.NODES:
        s = _schema(node_cls)
        display, inputs, outputs = expected[s.node_id]
        assert s.display_name == display and s.category == "jensen_kv"
        assert [i.id for i in s.inputs] == inputs
        assert [o.io_type for o in s.outputs] == outputs
        for i in s.inputs:
            assert i.tooltip and len(i.tooltip) > 20, f"{s.node_id}.{i.id} needs a tooltip"
    q = {i.id: i for i in _schema(nodes.JensenKVQuantizeKVCache).inputs}
    assert q["key_bits"].options == ["2", "3", "4", "8", "off"] and q["key_bits"].default == "2"
    assert q["group_size"].options == ["8", "16", "32", "64", "128", "256"] and q["group_size"].default == "32"
    assert q["rotation"].default == "hadamard" and q["scale_format"].default == "fp8_e4m3"
    assert q["scale_format"].as_dict()["advanced"] is True and q["rotation_seed"].as_dict()["advanced"] is True
    assert "advanced" not in q["key_bits"].as_dict()
    # added after the existing inputs (saved workflows keep their widget order); QVG knobs are expert knobs
    assert (
        q["method"].options == ["rtn", "qvg"]
        and q["method"].default == "rtn"
        and "advanced" not in q["method"].as_dict()
    )
    for name, (default, lo, hi) in {
        "qvg_stages": (1, 1, 8),
        "qvg_centroids": (0, 0, 256),  # 0 = auto
        "qvg_iters": (2, 1, 1000),
    }.items():
        assert (q[name].default, q[name].min, q[name].max) == (default, lo, hi)
        assert q[name].as_dict()["advanced"] is True and q[name].optional
    assert q["method"].optional  # an API-format prompt saved before QVG (no such keys) still validates
    j = {i.id: i for i in _schema(nodes.JensenKVBiasCorrection).inputs}
    assert (
        j["mode"].options == ["taylor", "chunk_mean", "exact", "per_channel", "off", "head_mean"]
        and j["mode"].default == "taylor"
    )
    assert (j["strength"].default, j["strength"].min, j["strength"].max, j["strength"].step) == (1.0, 0.0, 4.0, 0.05)
    c = {i.id: i for i in _schema(nodes.JensenKVChunkedARSampler).inputs}
    assert c["chunk_frames"].default == 3 and c["window_chunks"].default == 0 and c["cfg"].default == 1.0
    assert c["context_noise"].default == 0.0 and c["context_noise"].as_dict()["advanced"] is True


def test_quantize_returns_a_clone_with_a_frozen_config(nodes, tiny):
    out = nodes.JensenKVQuantizeKVCache.execute(tiny, "2", "4", "16", "hadamard", "fp8_e4m3", 5).args[0]
    assert out is not tiny and "jensen_kv" not in tiny.model_options["transformer_options"]
    cfg = out.model_options["transformer_options"]["jensen_kv"]
    assert type(cfg).__name__ == "JensenKVConfig"
    assert (cfg.spec_k.bits, cfg.spec_v.bits, cfg.spec_k.group_size, cfg.spec_k.seed) == (2, 4, 16, 5)
    assert cfg.correction == "off"
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.strength = 2.0
    off = nodes.JensenKVQuantizeKVCache.execute(tiny, "off", "3", "8", "none", "bf16", 0).args[0]
    c2 = off.model_options["transformer_options"]["jensen_kv"]
    assert c2.spec_k is None and c2.spec_v.bits == 3 and c2.spec_v.scale_format == "bf16"


def test_quantize_with_method_qvg_sets_the_k_means_knobs(nodes, tiny):
    out = nodes.JensenKVQuantizeKVCache.execute(tiny, "2", "off", "16", "none", "fp8_e4m3", 3, "qvg", 2, 40, 5).args[0]
    cfg = out.model_options["transformer_options"]["jensen_kv"]
    assert (cfg.spec_k.method, cfg.spec_k.qvg_stages, cfg.spec_k.qvg_centroids, cfg.spec_k.qvg_iters) == (
        "qvg",
        2,
        40,
        5,
    )
    assert cfg.spec_v is None and "QVG" in cfg.describe() and "K=40" in cfg.describe()
    rtn = nodes.JensenKVQuantizeKVCache.execute(tiny, "2", "2", "16", "none", "fp8_e4m3", 0, "rtn", 2, 40, 5).args[0]
    assert rtn.model_options["transformer_options"]["jensen_kv"].spec_k == cfg.spec_k.__class__(bits=2, group_size=16)
    with pytest.raises(ValueError, match="method='vq' is not supported; use one of rtn, qvg"):
        nodes.JensenKVQuantizeKVCache.execute(tiny, "2", "2", "16", "none", "fp8_e4m3", 0, "vq")
    with pytest.raises(ValueError, match="qvg_centroids=-1 must be a whole number from 0 to 256"):
        nodes.JensenKVQuantizeKVCache.execute(tiny, "2", "2", "16", "none", "fp8_e4m3", 0, "qvg", 1, -1)


def test_sampler_runs_a_qvg_cache_and_reports_its_exact_bytes(nodes, tiny):
    inputs = _sampler_inputs(tiny)
    base = nodes.JensenKVChunkedARSampler.execute(tiny, **inputs).args[0]["samples"]
    m = nodes.JensenKVQuantizeKVCache.execute(tiny, "2", "2", "16", "hadamard", "fp8_e4m3", 0, "qvg", 1, 8, 2).args[0]
    m = nodes.JensenKVBiasCorrection.execute(m, "taylor", 1.0).args[0]
    latent, report, _ = nodes.JensenKVChunkedARSampler.execute(m, **inputs).args
    assert torch.isfinite(latent["samples"]).all() and not torch.equal(latent["samples"], base)
    assert (report["method"], report["qvg_stages"], report["qvg_centroids"]) == ("qvg", 1, 8)
    import importlib

    planner = importlib.import_module("comfyui_jensen_kv.jensen_core.planner")
    config = m.model_options["transformer_options"]["jensen_kv"]
    tpf, layers, bh, d = report["tokens_per_frame"], report["layers"], report["heads"], report["head_dim"]
    # outside a server the kv_cache output counts as connected: chunks of 2, 2 and 1 frames are all cached,
    # each with its own centroid table (a shorter chunk pays more per element)
    exact = layers * sum(planner.chunk_bytes(config.spec_k, config.spec_v, bh, f * tpf, d) for f in (2, 2, 1))
    assert report["cache_bytes"] == exact
    assert report["effective_bits"] == pytest.approx(16 * report["cache_bytes"] / report["bf16_bytes"])
    assert "QVG S=1 K=8" in nodes.JensenKVChunkedARSampler.execute(m, **inputs).ui["text"][0]
    # the diagnostics read QVG entries too (heads sampled, chunks concatenated with their own centroids)
    d = nodes.JensenKVDiagnostics.execute(m, "all", "0", "all", 2).args[0]
    diag = nodes.JensenKVChunkedARSampler.execute(d, **inputs).args[1]["diagnostics"]
    assert diag["calls"] > 0 and "QVG+QuaRot S1 K8" in diag["cache"]
    assert diag["stats"]["taylor"]["mean_jsd"] > 0


def test_diagnostics_label_a_tiered_cache_by_every_chunk_it_held(nodes, tiny):
    """Under age tiers the first observation may see only the newest chunk (at the tier's bits): the label names
    each side's range over the run, the values-only tier's keys at one width."""
    inputs = {**_sampler_inputs(tiny), "latent": wan_tiny.video_latent(7)}  # 4 chunks: older ones are demoted
    base = (tiny, "2", "2", "16", "hadamard", "fp8_e4m3", 0, "rtn", 1, 256, 2)
    for tiers, label in (
        (("4", 1, "off", "same"), "K INT2-4 by age / V INT2-4 by age"),
        (("4", 1, "off", "off"), "K INT2 / V INT2-4 by age"),
    ):
        m = nodes.JensenKVQuantizeKVCache.execute(*base, *tiers).args[0]
        d = nodes.JensenKVDiagnostics.execute(m, "all", "0", "all", 2).args[0]
        diag = nodes.JensenKVChunkedARSampler.execute(d, **inputs).args[1]["diagnostics"]
        assert diag["calls"] > 0 and diag["cache"].startswith(label + ", g16"), diag["cache"]


def test_sampler_reports_the_k_auto_picked(nodes, tiny):
    """qvg_centroids 0 (auto, the default): the cache, the report and its text use the K picked from the chunk's tokens."""
    import importlib

    spec_mod = importlib.import_module("comfyui_jensen_kv.jensen_core.spec")
    planner = importlib.import_module("comfyui_jensen_kv.jensen_core.planner")
    inputs = _sampler_inputs(tiny)
    m = nodes.JensenKVQuantizeKVCache.execute(tiny, "2", "2", "16", "none", "fp8_e4m3", 0, "qvg").args[0]
    config = m.model_options["transformer_options"]["jensen_kv"]
    assert config.spec_k.qvg_centroids == 0 and "K=auto" in config.describe()
    out = nodes.JensenKVChunkedARSampler.execute(m, **inputs)
    report = out.args[1]
    tpf, f = report["tokens_per_frame"], report["chunk_frames"]
    k = spec_mod.qvg_auto_centroids(f * tpf)
    assert (report["qvg_centroids"], report["qvg_centroids_used"], report["qvg_chunk_tokens"]) == (0, k, f * tpf)
    assert f"K=auto ({k} on {f * tpf}-token chunks)" in out.ui["text"][0]
    layers, bh, d = report["layers"], report["heads"], report["head_dim"]
    exact = layers * sum(planner.chunk_bytes(config.spec_k, config.spec_v, bh, n * tpf, d) for n in (2, 2, 1))
    assert report["cache_bytes"] == exact


def test_quantize_rejects_a_group_size_that_does_not_divide_head_dim(nodes, tiny):
    with pytest.raises(ValueError, match="group_size 64 does not divide head_dim 32; use 8, 16 or 32"):
        nodes.JensenKVQuantizeKVCache.execute(tiny, "2", "2", "64", "none", "fp8_e4m3", 0)
    with pytest.raises(ValueError, match="group_size='48' is not supported; use one of 8, 16, 32, 64, 128, 256"):
        nodes.JensenKVQuantizeKVCache.execute(tiny, "2", "2", "48", "none", "fp8_e4m3", 0)
    with pytest.raises(ValueError, match="key_bits='5' is not supported; use one of 2, 3, 4, 8, off"):
        nodes.JensenKVQuantizeKVCache.execute(tiny, "5", "2", "32", "none", "fp8_e4m3", 0)


def test_jensen_without_quantized_keys_says_there_is_nothing_to_correct(nodes, tiny, caplog):
    caplog.set_level(logging.WARNING, logger="jensen_kv")
    out = nodes.JensenKVBiasCorrection.execute(tiny, "taylor", 1.0)
    assert out.args[0] is tiny  # passed through untouched
    assert "nothing to correct" in out.ui.as_dict()["text"][0]
    assert any("nothing to correct" in r.getMessage() for r in caplog.records)
    values_only = nodes.JensenKVQuantizeKVCache.execute(tiny, "off", "2", "16", "none", "fp8_e4m3", 0).args[0]
    out2 = nodes.JensenKVBiasCorrection.execute(values_only, "taylor", 1.0)
    assert out2.args[0] is values_only and "nothing to correct" in out2.ui.as_dict()["text"][0]


def test_jensen_sets_mode_and_strength_on_a_clone(nodes, tiny):
    q = nodes.JensenKVQuantizeKVCache.execute(tiny, "2", "2", "16", "none", "fp8_e4m3", 0).args[0]
    for mode, core in (
        ("taylor", "taylor"),
        ("chunk_mean", "chunk_mean"),
        ("exact", "exact"),
        ("per_channel", "per_channel"),
        ("off", "off"),
    ):
        out = nodes.JensenKVBiasCorrection.execute(q, mode, 0.5)
        cfg = out.args[0].model_options["transformer_options"]["jensen_kv"]
        assert (cfg.correction, cfg.strength) == (core, 0.5)
        assert out.args[0] is not q
    assert q.model_options["transformer_options"]["jensen_kv"].correction == "off"


def test_the_guard_is_on_unless_turned_off_and_old_workflows_get_it(nodes, tiny):
    """A workflow saved before the guard existed has no such input: it loads with the guard on."""
    q = nodes.JensenKVQuantizeKVCache.execute(tiny, "2", "2", "16", "none", "fp8_e4m3", 0).args[0]
    inp = next(i for i in nodes.JensenKVBiasCorrection.define_schema().inputs if i.id == "guard")
    assert inp.default is True and inp.optional
    cfg = lambda out: out.args[0].model_options["transformer_options"]["jensen_kv"]  # noqa: E731
    assert cfg(nodes.JensenKVBiasCorrection.execute(q, "taylor", 1.0)).guard is True
    off = cfg(nodes.JensenKVBiasCorrection.execute(q, "taylor", 1.0, guard=False))
    assert off.guard is False and "unguarded" in off.describe()
    with pytest.raises(ValueError, match="guard='yes' must be true or false"):
        nodes.JensenKVBiasCorrection.execute(q, "taylor", 1.0, guard="yes")


def _sampler_inputs(tiny):
    import comfy.samplers

    sigmas = comfy.samplers.calculate_sigmas(tiny.get_model_object("model_sampling"), "simple", 2)
    return dict(
        positive=wan_tiny.conditioning(1, 13, 32),
        negative=wan_tiny.conditioning(2, 13, 32),
        latent=wan_tiny.video_latent(5),
        seed=4,
        cfg=1.0,
        sampler=comfy.samplers.sampler_object("euler"),
        sigmas=sigmas,
        chunk_frames=2,
        window_chunks=0,
        context_noise=0.0,
    )


def test_sampler_node_outputs_latent_report_and_ui(nodes, tiny):
    model = nodes.JensenKVQuantizeKVCache.execute(tiny, "2", "2", "16", "hadamard", "fp8_e4m3", 0).args[0]
    model = nodes.JensenKVBiasCorrection.execute(model, "taylor", 1.0).args[0]
    inputs = _sampler_inputs(tiny)
    out = nodes.JensenKVChunkedARSampler.execute(model, **inputs)
    latent, report, state = out.args
    # called outside a server the kv_cache output counts as connected: the state of all 3 chunks comes back
    assert state.next_chunk == 3 and state.next_frame == 5 and report["state_file_bytes"] > 0
    assert latent["samples"].shape == (1, 16, 5, 8, 8) and torch.isfinite(latent["samples"]).all()
    assert inputs["latent"]["samples"].abs().sum() == 0  # input latent untouched
    assert set(report) == REPORT_KEYS
    assert report["kv_heads"] == report["heads"] == 2  # the tiny Wan's K/V heads: as many as its query heads
    assert report["chunks"] == 3 and len(report["seconds_per_chunk"]) == 3
    assert report["effective_bits"] == pytest.approx(2 + 24 / 16)
    assert report["cache_mib"] == report["cache_bytes"] / 2**20
    assert out.ui["jensen_kv_report"] == [report]
    text = out.ui["text"][0]
    # 5 latent frames in chunks of 2: the last chunk has 1, and the words say so
    assert report["chunk_lengths"] == [2, 2, 1] and report["warnings"] == []
    assert "3 chunks: 2 of 2 latent frames, the last of 1," in text and "3 chunks of 2" not in text
    assert "MiB" in text and "correction: taylor" in text and "Warning" not in text
    # the FP baseline: no patch nodes, full-precision cache in the model's dtype (fp32 here)
    base = nodes.JensenKVChunkedARSampler.execute(tiny, **inputs).args[1]
    assert base["key_bits"] == "off" and base["correction"] == "off" and base["effective_bits"] == 32.0
    assert base["cache_bytes"] == 2 * base["bf16_bytes"] and base["bf16_bytes"] == report["bf16_bytes"]


def test_ksampler_variant_equals_sampler_with_the_same_sigmas(nodes, tiny):
    import comfy.samplers

    inputs = _sampler_inputs(tiny)
    for name in ("sampler", "sigmas", "cfg"):
        inputs.pop(name)
    simple = nodes.JensenKVChunkedARKSampler.execute(
        tiny, steps=3, cfg=1.0, sampler_name="euler", scheduler="normal", **inputs
    ).args[0]
    ks = comfy.samplers.KSampler(tiny, steps=3, device=tiny.load_device, sampler="euler", scheduler="normal")
    full = nodes.JensenKVChunkedARSampler.execute(
        tiny, cfg=1.0, sampler=comfy.samplers.sampler_object("euler"), sigmas=ks.sigmas, **inputs
    ).args[0]
    assert torch.equal(simple["samples"], full["samples"])


def _with_shift(tiny, shift: float):
    """``tiny`` with the model sampling ModelSamplingSD3 gives a Wan model (flow matching, multiplier 1000)."""
    import comfy.model_sampling

    class FlowConst(comfy.model_sampling.ModelSamplingDiscreteFlow, comfy.model_sampling.CONST):
        pass

    class Config:
        sampling_settings = {"shift": shift, "multiplier": 1000}

    m = tiny.clone()
    m.add_object_patch("model_sampling", FlowConst(Config()))
    return m


def test_ksampler_variant_defaults_reproduce_self_forcing_and_causvid_warp(nodes, tiny):
    """lcm + simple + 4 steps: Self-Forcing's (and LongLive's) sigmas at shift 5, CausVid warp-4step's at 8."""
    import importlib

    sched = importlib.import_module("comfyui_jensen_kv.runtime.schedules")
    ksampler = importlib.import_module("comfyui_jensen_kv.nodes.chunked_ar_ksampler")
    d = {i.id: getattr(i, "default", None) for i in _schema(nodes.JensenKVChunkedARKSampler).inputs}
    assert (d["sampler_name"], d["scheduler"], d["steps"]) == ("lcm", "simple", 4)
    for shift, preset in ((5.0, "self_forcing_4step"), (5.0, "longlive_4step"), (8.0, "causvid_warp_4step")):
        got = ksampler.ksampler_sigmas(_with_shift(tiny, shift), d["steps"], d["sampler_name"], d["scheduler"])
        torch.testing.assert_close(got.float(), sched.ar_sigmas(preset), rtol=0, atol=1e-6)
    tip = {i.id: i.tooltip for i in _schema(nodes.JensenKVChunkedARKSampler).inputs}["steps"]
    assert "CausVid: 4" not in tip and "1000, 757, 522" in tip and "shift 5" in tip


@pytest.mark.parametrize(
    "key_bits,value_bits,mode",
    [
        ("2", "2", "exact"),
        ("3", "2", "per_channel"),
        ("2", "4", "chunk_mean"),
        ("off", "4", "taylor"),
        ("8", "off", "off"),
    ],
)
def test_every_mode_and_side_samples(nodes, tiny, key_bits, value_bits, mode):
    inputs = _sampler_inputs(tiny)
    base = nodes.JensenKVChunkedARSampler.execute(tiny, **inputs).args[0]["samples"]
    m = nodes.JensenKVQuantizeKVCache.execute(tiny, key_bits, value_bits, "16", "hadamard", "fp8_e4m3", 0).args[0]
    m = nodes.JensenKVBiasCorrection.execute(m, mode, 1.0).args[0]
    latent, report, _ = nodes.JensenKVChunkedARSampler.execute(m, **inputs).args
    assert torch.isfinite(latent["samples"]).all()
    assert not torch.equal(latent["samples"], base)  # the cache really is quantized
    assert (report["key_bits"], report["value_bits"]) == tuple(
        int(b) if b != "off" else "off" for b in (key_bits, value_bits)
    )
    # the correction applies to quantized keys only
    assert report["correction"] == (mode if key_bits != "off" else "off")


def test_quantize_sets_age_tiers_and_names_bad_ones(nodes, tiny):
    q = nodes.JensenKVQuantizeKVCache
    base = (tiny, "2", "4", "16", "none", "fp8_e4m3", 0, "rtn", 1, 256, 2)
    cfg = q.execute(*base, "8", 3, "4").args[0].model_options["transformer_options"]["jensen_kv"]
    assert str(cfg.tiers) == "recent3@8+sink@4" and "newest 3 chunk(s) at 8 bits" in cfg.describe()
    off = q.execute(*base, "off", 5, "off").args[0].model_options["transformer_options"]["jensen_kv"]
    assert off.tiers is None  # recent_chunks counts only with recent_chunks_bits on
    assert q.execute(*base[:6]).args[0].model_options["transformer_options"]["jensen_kv"].tiers is None
    with pytest.raises(ValueError, match="recent_chunks=0 with recent_chunks_bits=4: keep 1 to 64"):
        q.execute(*base, "4", 0, "off")
    with pytest.raises(ValueError, match="keep no chunk above key_bits=4 and value_bits=8"):
        q.execute(tiny, "4", "8", "16", "none", "fp8_e4m3", 0, "rtn", 1, 256, 2, "4", 2, "off")
    with pytest.raises(ValueError, match="key_bits and value_bits are both off"):
        q.execute(tiny, "off", "off", "16", "none", "fp8_e4m3", 0, "rtn", 1, 256, 2, "off", 2, "8")
    with pytest.raises(ValueError, match="sink_bits='2' is not supported; use one of off, 3, 4, 8"):
        q.execute(*base, "off", 2, "2")
    # the recent tier's keys apart from its values: values only, or keys at other bits
    base2 = (tiny, "2", "2", *base[3:])
    vo = q.execute(*base2, "4", 1, "off", "off").args[0].model_options["transformer_options"]["jensen_kv"]
    assert str(vo.tiers) == "recent1@4k0" and "values at 4 bits (keys not tiered)" in vo.describe()
    with pytest.raises(ValueError, match="recent_chunks_key_bits=off and sink_bits=off keep no chunk above key_bits=2"):
        q.execute(*base, "4", 1, "off", "off")  # values already at INT4: a values-only INT4 tier adds nothing
    k3 = q.execute(*base2, "8", 1, "off", "3").args[0].model_options["transformer_options"]["jensen_kv"]
    assert str(k3.tiers) == "recent1@8k3"
    same = q.execute(*base2, "4", 1, "off", "same").args[0].model_options["transformer_options"]["jensen_kv"]
    assert str(same.tiers) == "recent1@4"
    ignored = q.execute(*base, "off", 1, "off", "8").args[0].model_options["transformer_options"]["jensen_kv"]
    assert ignored.tiers is None  # the keys' bits count only with recent_chunks_bits on
    with pytest.raises(ValueError, match="recent_chunks_key_bits='2' is not supported; use one of same, off, 3, 4, 8"):
        q.execute(*base, "4", 1, "off", "2")
    with pytest.raises(ValueError, match="keep no chunk above key_bits=4"):  # values off: keys at their own bits
        q.execute(tiny, "4", "off", "16", "none", "fp8_e4m3", 0, "rtn", 1, 256, 2, "8", 1, "off", "off")
    inputs = {i.id: i for i in _schema(q).inputs}
    for name in ("recent_chunks_bits", "recent_chunks", "sink_bits", "recent_chunks_key_bits"):
        assert inputs[name].optional and inputs[name].tooltip


def test_quantize_sets_precision_by_head_and_names_bad_values(nodes, tiny):
    q = nodes.JensenKVQuantizeKVCache
    base = (tiny, "2", "2", "16", "hadamard", "fp8_e4m3", 0, "rtn", 1, 0, 2, "off", 2, "off", "same")
    cfg = q.execute(*base, "4", 0.5).args[0].model_options["transformer_options"]["jensen_kv"]
    assert str(cfg.head_bits) == "0.5@4" and "precision by head" in cfg.describe()
    assert q.execute(*base).args[0].model_options["transformer_options"]["jensen_kv"].head_bits is None
    assert q.execute(*base, "off", 7).args[0].model_options["transformer_options"]["jensen_kv"].head_bits is None
    with pytest.raises(ValueError, match="head_bits='5' is not supported; use one of off, 3, 4, 8"):
        q.execute(*base, "5", 0.25)
    for bad in (0, 1.5, "x"):
        with pytest.raises(ValueError, match=f"head_fraction={bad!r} with head_bits=4: .* from 0.01 to 1"):
            q.execute(*base, "4", bad)
    with pytest.raises(ValueError, match="head_bits=4 is not above key_bits=4"):
        q.execute(tiny, "4", "2", *base[3:], "4", 0.25)
    with pytest.raises(ValueError, match="head_bits=4 keeps some heads' keys at more bits, but key_bits is off"):
        q.execute(tiny, "off", "2", *base[3:], "4", 0.25)
    with pytest.raises(ValueError, match="cannot be combined with recent_chunks_bits / sink_bits yet"):
        q.execute(*base[:11], "4", 1, "off", "same", "8", 0.25)
    inputs = {i.id: i for i in _schema(q).inputs}
    for name in ("head_bits", "head_fraction"):
        assert inputs[name].optional and inputs[name].tooltip


def test_sampler_with_precision_by_head_stores_the_planned_bytes_and_reports_the_heads(nodes, tiny):
    """3 chunks of 2 latent frames, 2 layers x 2 heads, half the heads at 4 bits: the report's bytes are the planner's
    to the byte (the last chunk too: the kv_cache output counts as connected), more than uniform INT2's, and the
    report names one promoted head per layer."""
    inputs = {**_sampler_inputs(tiny), "latent": wan_tiny.video_latent(6)}
    base = (tiny, "2", "2", "16", "hadamard", "fp8_e4m3", 0, "rtn", 1, 0, 2, "off", 2, "off", "same")
    reports = {}
    for head_bits in ("off", "4"):
        m = nodes.JensenKVQuantizeKVCache.execute(*base, head_bits, 0.5).args[0]
        m = nodes.JensenKVBiasCorrection.execute(m, "taylor", 1.0).args[0]
        out = nodes.JensenKVChunkedARSampler.execute(m, **inputs)
        reports[head_bits] = (out.args[1], out.ui["text"][0])
    report, text = reports["4"]
    assert set(report) == REPORT_KEYS
    assert report["cache_bytes"] == report["planned_bytes"] > reports["off"][0]["cache_bytes"]
    assert reports["off"][0]["cache_bytes"] == reports["off"][0]["planned_bytes"]
    assert report["head_bits"] == 4 and report["head_fraction"] == 0.5
    assert len(report["promoted_heads"]) == 2 and all(len(p) == 1 and p[0] in (0, 1) for p in report["promoted_heads"])
    # keys 1/2 at INT4 + 1/2 at INT2 (g16: 3.5 and 5.5 bits), values INT2: (4.5 + 3.5) / 2
    assert report["effective_bits"] == pytest.approx(4.0)
    assert "Precision by head: 1 of 2 K/V head(s) per layer kept their keys at 4 bits (layer 0: " in text
    assert reports["off"][0]["promoted_heads"] is None and "Precision by head" not in reports["off"][1]


def test_a_window_past_the_video_is_said_in_the_log_and_the_report(nodes, tiny, caplog):
    """window_chunks 8 on a 3-chunk video keeps every chunk, as 0 does: a warning, not silence; 2 slides, no word."""
    inputs = {**_sampler_inputs(tiny), "window_chunks": 8}
    with caplog.at_level(logging.WARNING, logger="jensen_kv"):
        out = nodes.JensenKVChunkedARSampler.execute(tiny, **inputs)
    report = out.args[1]
    assert len(report["warnings"]) == 1
    warning = report["warnings"][0]
    assert "window_chunks 8 is not fewer than this video's 3 chunks" in warning and "below 3" in warning
    assert any(warning in r.getMessage() for r in caplog.records)
    assert f"Warning: {warning}." in out.ui["text"][0]
    slides = nodes.JensenKVChunkedARSampler.execute(tiny, **{**inputs, "window_chunks": 2}).args[1]
    assert slides["warnings"] == []
