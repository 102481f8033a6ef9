"""Long videos on a tiny Wan: continue later from a saved cache, extend a clip, prompt schedules.

The central property: 4 chunks in one run give the same latents, bit for bit, as 2 chunks -> save
-> load -> 2 more chunks with the same seed, at every bit width and with and without the correction.
A cache file is data: another model, spec, head count, chunk length or latent size is refused with
the reason, and a truncated or edited file is refused.
"""

from __future__ import annotations

import importlib

import pytest
import torch
from support import wan_tiny

from jensen_testing.numerics import relative_error, rounding_bound

FRAMES, CHUNK, STEPS = 8, 2, 2


@pytest.fixture(scope="module")
def rs(pack):
    return importlib.import_module("comfyui_jensen_kv.runtime.saved_run")


def _sigmas(model):
    import comfy.samplers

    return comfy.samplers.calculate_sigmas(model.get_model_object("model_sampling"), "simple", STEPS)


def _conds(seed=1):
    return wan_tiny.conditioning(seed, 13, 32), wan_tiny.conditioning(2, 13, 32)


def _model(nodes, tiny, bits, correction, group="16", rotation="hadamard"):
    if bits == "off":
        return tiny
    m = nodes.JensenKVQuantizeKVCache.execute(tiny, bits, bits, group, rotation, "fp8_e4m3", 0).args[0]
    if correction != "off":
        m = nodes.JensenKVBiasCorrection.execute(m, correction, 1.0).args[0]
    return m


def _run(loop, model, frames, *, cfg=1.0, seed=5, positive=None, euler=None, **kw):
    import comfy.samplers

    pos, neg = _conds()
    return loop.run_chunked_ar(
        model,
        positive or pos,
        neg,
        wan_tiny.video_latent(frames),
        seed=seed,
        cfg=cfg,
        sampler=euler or comfy.samplers.sampler_object("euler"),
        sigmas=_sigmas(model),
        chunk_frames=CHUNK,
        progress=False,
        **kw,
    )


@pytest.mark.parametrize(
    "bits,correction",
    [(b, c) for b in ("2", "3", "4", "8") for c in ("off", "taylor")] + [("2", "chunk_mean"), ("off", "off")],
)  # full precision has no quantized keys to correct
def test_continue_later_equals_one_long_run_bit_for_bit(loop, nodes, tiny, rs, tmp_path, bits, correction):
    model = _model(nodes, tiny, bits, correction)
    whole = _run(loop, model, FRAMES, window_chunks=2, sink_chunks=1).samples
    first = _run(loop, model, FRAMES // 2, window_chunks=2, sink_chunks=1, keep_state=True)
    path = str(tmp_path / "state.safetensors")
    first.state.save(path)
    state = rs.load_saved_run(path)
    assert (state.next_chunk, state.next_frame) == (2, FRAMES // 2)
    second = _run(loop, model, FRAMES // 2, window_chunks=2, sink_chunks=1, resume=state)
    assert torch.equal(first.samples, whole[:, :, : FRAMES // 2])
    assert torch.equal(second.samples, whole[:, :, FRAMES // 2 :])
    assert second.report["first_chunk"] == 2 and second.report["resumed"]
    # resuming never changes the loaded state (ComfyUI caches node outputs: a second run must see the same)
    again = _run(loop, model, FRAMES // 2, window_chunks=2, sink_chunks=1, resume=state)
    assert torch.equal(again.samples, second.samples)


def test_continue_later_under_cfg_keeps_both_branches(loop, nodes, tiny, rs, tmp_path):
    model = _model(nodes, tiny, "2", "taylor")
    whole = _run(loop, model, FRAMES, cfg=3.0).samples
    first = _run(loop, model, FRAMES // 2, cfg=3.0, keep_state=True)
    assert sorted(first.state.branches) == [0, 1]
    path = str(tmp_path / "s.safetensors")
    first.state.save(path)
    second = _run(loop, model, FRAMES // 2, cfg=3.0, resume=rs.load_saved_run(path))
    assert torch.equal(torch.cat([first.samples, second.samples], dim=2), whole)
    with pytest.raises(ValueError, match="CFG branches"):
        _run(loop, model, 2, cfg=1.0, resume=rs.load_saved_run(path))


def test_a_cache_from_elsewhere_is_refused_with_the_reason(loop, nodes, tiny, rs, tmp_path):
    model = _model(nodes, tiny, "2", "taylor")
    state = _run(loop, model, 4, keep_state=True).state
    path = str(tmp_path / "s.safetensors")
    state.save(path)

    def load():
        return rs.load_saved_run(path)

    other_weights = _model(nodes, wan_tiny.build_patcher(seed=9), "2", "taylor")
    with pytest.raises(ValueError, match="model weights with digest"):
        _run(loop, other_weights, 2, resume=load())
    with pytest.raises(ValueError, match="key spec"):
        _run(loop, _model(nodes, tiny, "4", "taylor"), 2, resume=load())
    more_heads = _model(nodes, wan_tiny.build_patcher(seed=0, num_heads=4), "2", "taylor")
    with pytest.raises(ValueError, match="a model whose heads is 2, but this run has 4"):
        _run(loop, more_heads, 2, resume=load())
    with pytest.raises(ValueError, match="chunk_frames 2, but this run has 1"):
        loop.run_chunked_ar(
            model,
            *_conds(),
            wan_tiny.video_latent(2),
            seed=5,
            cfg=1.0,
            sampler=__import__("comfy.samplers").samplers.sampler_object("euler"),
            sigmas=_sigmas(model),
            chunk_frames=1,
            resume=load(),
            progress=False,
        )
    import comfy.samplers

    with pytest.raises(ValueError, match=r"latents of \(batch, channels, height, width\) \(1, 16, 8, 8\)"):
        loop.run_chunked_ar(
            model,
            *_conds(),
            wan_tiny.video_latent(2, height=16, width=16),
            seed=5,
            cfg=1.0,
            sampler=comfy.samplers.sampler_object("euler"),
            sigmas=_sigmas(model),
            chunk_frames=CHUNK,
            resume=load(),
            progress=False,
        )
    with pytest.raises(ValueError, match="window_chunks, sink_chunks"):
        _run(loop, model, 2, window_chunks=3, resume=load())


def test_truncated_or_edited_files_are_refused(loop, nodes, tiny, rs, tmp_path):
    state = _run(loop, _model(nodes, tiny, "2", "taylor"), 4, keep_state=True).state
    path = tmp_path / "s.safetensors"
    state.save(str(path))
    data = path.read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="not a readable safetensors file"):
        rs.load_saved_run(str(tmp_path / "cut.safetensors"))
    flipped = bytearray(data)
    flipped[-5] ^= 0xFF  # a byte of tensor data
    (tmp_path / "flip.safetensors").write_bytes(bytes(flipped))
    with pytest.raises(ValueError, match="does not match its recorded SHA-256"):
        rs.load_saved_run(str(tmp_path / "flip.safetensors"))
    edited = data.replace(b'\\"next_frame\\": 4', b'\\"next_frame\\": 9')
    assert edited != data
    (tmp_path / "meta.safetensors").write_bytes(edited)
    with pytest.raises(ValueError, match="SHA-256"):
        rs.load_saved_run(str(tmp_path / "meta.safetensors"))
    from safetensors.torch import save_file

    save_file({"x": torch.zeros(2)}, str(tmp_path / "other.safetensors"), metadata={"format": "something"})
    with pytest.raises(ValueError, match="not a Jensen KV cache file"):
        rs.load_saved_run(str(tmp_path / "other.safetensors"))


def test_consistent_but_wrong_shapes_are_refused(loop, nodes, tiny, rs, tmp_path):
    """A file rewritten with a matching digest but a tensor whose shape disagrees with its metadata."""
    import json

    from safetensors import safe_open
    from safetensors.torch import save_file

    state = _run(loop, _model(nodes, tiny, "2", "taylor"), 4, keep_state=True).state
    path = str(tmp_path / "s.safetensors")
    state.save(path)
    with safe_open(path, framework="pt") as f:
        meta = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    name = next(k for k in tensors if k.endswith(".packed"))
    tensors[name] = tensors[name][..., :-1].contiguous()
    meta["sha256"] = rs._digest(tensors, meta["state"])
    save_file(tensors, str(tmp_path / "bad.safetensors"), metadata=meta)
    with pytest.raises(ValueError, match="does not match its recorded shape"):
        rs.load_saved_run(str(tmp_path / "bad.safetensors"))
    st = json.loads(meta["state"])
    st["fingerprint"]["heads"] = 3
    meta2 = {**meta, "state": json.dumps(st)}
    with safe_open(path, framework="pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    meta2["sha256"] = rs._digest(tensors, meta2["state"])
    save_file(tensors, str(tmp_path / "bad2.safetensors"), metadata=meta2)
    with pytest.raises(ValueError, match="not \\(1, 3, 32\\) as the metadata says"):
        rs.load_saved_run(str(tmp_path / "bad2.safetensors"))


# ----------------------------------------------------------------------------------------- extend a clip
def test_extending_a_clip_continues_it_as_one_run_would(loop, nodes, tiny):
    """The first 2 chunks of a run, given as a prefix, then 2 chunks: the same as the 4-chunk run."""
    model = _model(nodes, tiny, "2", "taylor")
    whole = _run(loop, model, FRAMES).samples
    prefix = {"samples": whole[:, :, :4].clone()}
    ext = _run(loop, model, 4, prefix=prefix, include_prefix=False)
    assert torch.equal(ext.samples, whole[:, :, 4:])
    assert ext.report["prefix_chunks"] == 2 and ext.report["first_chunk"] == 2
    with_prefix = _run(loop, model, 4, prefix=prefix, include_prefix=True).samples
    assert torch.equal(with_prefix, whole)
    # a prefix of any length: 3 frames = one full chunk and one of a single frame
    odd = _run(loop, model, 2, prefix={"samples": whole[:, :, :3].clone()}, include_prefix=True)
    assert odd.samples.shape[2] == 5 and odd.report["prefix_chunks"] == 2
    with pytest.raises(ValueError, match="must share batch, channels, height and width"):
        _run(loop, model, 2, prefix={"samples": torch.zeros(1, 16, 2, 16, 16)})
    with pytest.raises(ValueError, match="not both"):
        _run(loop, model, 2, prefix=prefix, resume=_run(loop, model, 2, keep_state=True).state)


# ----------------------------------------------------------------------------------------- prompt schedule
def _schedule(ps, switch_at=2):
    a, b = _conds(1)[0], _conds(7)[0]
    return ps.add_to_schedule(ps.add_to_schedule(None, a, 0, "A"), b, switch_at, "B")


def test_prompt_schedule_switches_and_recaches(loop, tiny, euler):
    ps = importlib.import_module("comfyui_jensen_kv.runtime.prompt_schedule")
    only_a = _run(loop, tiny, FRAMES, positive=_conds(1)[0], window_chunks=1, sink_chunks=1)
    only_b = _run(loop, tiny, FRAMES, positive=_conds(7)[0], window_chunks=1, sink_chunks=1)
    on = _run(loop, tiny, FRAMES, positive=_schedule(ps), window_chunks=1, sink_chunks=1)
    off = _run(loop, tiny, FRAMES, positive=_schedule(ps), window_chunks=1, sink_chunks=1, recache_on_switch=False)
    # before the switch: prompt A exactly; after it: neither A's video nor the no-recache run
    assert torch.equal(on.samples[:, :, :4], only_a.samples[:, :, :4])
    assert not torch.equal(on.samples[:, :, 4:], only_a.samples[:, :, 4:])
    assert not torch.equal(on.samples[:, :, 4:], off.samples[:, :, 4:])
    assert not torch.equal(on.samples[:, :, 4:], only_b.samples[:, :, 4:])
    # the report says where each prompt started and how many chunks were re-cached (sink 1 + window 1)
    assert [(p["label"], p["start_chunk"], p["recached_chunks"]) for p in on.report["prompts"]] == [
        ("A", 0, 0),
        ("B", 2, 2),
    ]
    assert [p["recached_chunks"] for p in off.report["prompts"]] == [0, 0]


@pytest.mark.parametrize("mode", ["longlive", "causal"])
def test_recache_rewrites_every_layer_but_the_first(loop, tiny, euler, mode):
    """Layer 0's self-attention input holds no text yet: its re-cached keys are the same (at the same RoPE frames,
    in either re-cache) to float32 rounding: a re-cache forwards several chunks at once, and a BLAS blocks a longer
    matrix otherwise (MKL's AVX2 kernels do), so equal bit for bit only where it does not; the rest change, by
    far more."""
    ps = importlib.import_module("comfyui_jensen_kv.runtime.prompt_schedule")
    written = {}

    class Watch:
        def __call__(self, e):
            if e.phase == "write":
                written.setdefault((e.layer, e.chunk), []).append(e.k.detach().clone())

    _run(loop, tiny, 6, positive=_schedule(ps), observer=Watch(), recache_mode=mode)
    # chunks 0 and 1 were written under A, then again under B at the switch
    for c in (0, 1):
        assert len(written[(0, c)]) == 2 and len(written[(1, c)]) == 2
        same = rounding_bound(1, 128)  # the patch embedding, layer 0's norm and projections (width 64, FFN 128)
        assert relative_error(written[(0, c)][1], written[(0, c)][0]) <= same.value
        assert relative_error(written[(1, c)][1], written[(1, c)][0]) > 100 * same.value


def test_schedule_parsing_errors_name_the_fix(pack):
    ps = importlib.import_module("comfyui_jensen_kv.runtime.prompt_schedule")
    a = _conds(1)[0]
    with pytest.raises(ValueError, match="must start at chunk 0"):
        ps.add_to_schedule(None, a, 3)
    two = [a[0], a[0]]
    with pytest.raises(ValueError, match="Prompt Schedule node"):
        ps.PromptSchedule.from_conditioning(two)
    s = ps.add_to_schedule(ps.add_to_schedule(None, a, 0), _conds(7)[0], 4)
    sched = ps.PromptSchedule.from_conditioning(s)
    assert [sched.index_at(c) for c in range(7)] == [0, 0, 0, 0, 1, 1, 1]
    replaced = ps.add_to_schedule(s, _conds(9)[0], 4, "C")
    assert [p.label for p in ps.PromptSchedule.from_conditioning(replaced).prompts] == ["prompt 1", "C"]


def test_planner_projects_the_cache_file_size(loop, nodes, tiny, tmp_path):
    import os

    planner = importlib.import_module("comfyui_jensen_kv.jensen_core.planner")
    model = _model(nodes, tiny, "2", "taylor")
    res = _run(loop, model, 10, window_chunks=2, sink_chunks=1, keep_state=True)
    path = str(tmp_path / "s.safetensors")
    size = res.state.save(path)
    config = model.model_options["transformer_options"]["jensen_kv"]
    plan = planner.plan_cache(
        latent_frames=10,
        latent_height=8,
        latent_width=8,
        chunk_frames=CHUNK,
        window_chunks=2,
        sink_chunks=1,
        shape=planner.CacheShape(
            layers=2,
            heads=2,
            head_dim=32,
            geometry=importlib.import_module("comfyui_jensen_kv.runtime.families.wan.family").GEOMETRY,
        ),
        precision=planner.CachePrecision(spec_k=config.spec_k, spec_v=config.spec_v),
    )
    assert size == os.path.getsize(path)
    payload = res.state.nbytes + sum(r.latent.numel() * 4 for r in res.state.retained)
    assert plan.state_file_bytes == payload == res.report["state_file_bytes"]
    assert 0 < size - payload < 64 * 1024  # the rest is the safetensors header (JSON metadata)


@pytest.mark.parametrize("switch_at", [2, 3])  # the switch at the first chunk after loading, or inside the second run
def test_resume_across_a_prompt_switch_equals_the_one_run_schedule(loop, tiny, rs, tmp_path, switch_at):
    """2 chunks under an A -> B schedule, save, load, 2 more: bit for bit the one run's video (re-cache included)."""
    ps = importlib.import_module("comfyui_jensen_kv.runtime.prompt_schedule")
    kw = dict(window_chunks=1, sink_chunks=1)
    whole = _run(loop, tiny, FRAMES, positive=_schedule(ps, switch_at), **kw)
    first = _run(loop, tiny, FRAMES // 2, positive=_schedule(ps, switch_at), keep_state=True, **kw)
    path = str(tmp_path / "state.safetensors")
    first.state.save(path)
    second = _run(loop, tiny, FRAMES // 2, positive=_schedule(ps, switch_at), resume=rs.load_saved_run(path), **kw)
    assert torch.equal(first.samples, whole.samples[:, :, : FRAMES // 2])
    assert torch.equal(second.samples, whole.samples[:, :, FRAMES // 2 :])
    # LongLive's re-cache (the default): sink and window, and at chunk 3 also the chunk the window dropped after
    # chunk 2 (written by the second run, so known to it as to the one run)
    recached = {2: 2, 3: 3}[switch_at]
    assert [(p["label"], p["recached_chunks"]) for p in second.report["prompts"]] == [("A", 0), ("B", recached)]
    assert [p["recached_chunks"] for p in whole.report["prompts"]] == [0, recached]


def test_a_second_continuation_reports_its_next_frame_and_equals_one_long_run(loop, nodes, tiny, rs, tmp_path):
    model = _model(nodes, tiny, "2", "taylor")
    kw = dict(window_chunks=2, sink_chunks=1)
    whole = _run(loop, model, 3 * FRAMES // 2, **kw).samples  # 6 chunks
    part = FRAMES // 2  # 2 chunks per run
    first = _run(loop, model, part, keep_state=True, **kw)
    first.state.save(str(tmp_path / "one.safetensors"))
    second = _run(loop, model, part, keep_state=True, resume=rs.load_saved_run(str(tmp_path / "one.safetensors")), **kw)
    second.state.save(str(tmp_path / "two.safetensors"))
    state = rs.load_saved_run(str(tmp_path / "two.safetensors"))
    assert (state.next_chunk, state.next_frame) == (4, 2 * part)
    assert second.report["first_chunk"] == 2
    third = _run(loop, model, part, resume=state, **kw)
    assert third.report["first_chunk"] == 4
    assert torch.equal(torch.cat([first.samples, second.samples, third.samples], dim=2), whole)


def _tiered(nodes, tiny, recent_bits="4", recent=1, sink_bits="8"):
    m = nodes.JensenKVQuantizeKVCache.execute(
        tiny, "2", "2", "16", "hadamard", "fp8_e4m3", 0, "rtn", 1, 256, 2, recent_bits, recent, sink_bits
    ).args[0]
    return nodes.JensenKVBiasCorrection.execute(m, "taylor", 1.0).args[0]


def test_age_tiers_continue_later_bit_for_bit_and_count_to_the_byte(loop, nodes, tiny, rs, tmp_path):
    """Precision by age (sink at 8 bits, the newest chunk at 4, older ones requantized to 2): one run equals
    save -> load -> continue bit for bit, and the report's peak bytes are the planner's."""
    model = _tiered(nodes, tiny)
    kw = {"window_chunks": 2, "sink_chunks": 1}
    whole = _run(loop, model, FRAMES, keep_state=True, **kw)
    assert whole.report["tiers"] == "recent1@4+sink@8" and whole.report["chunks_demoted"] > 0
    assert whole.report["cache_bytes"] == whole.report["planned_bytes"]
    bits = {tuple(e.k.spec.bits for e in c.entries) for c in whole.state.caches.values()}
    assert bits == {(8, 2, 4)}  # sink, an aged chunk, the newest
    plain = _run(loop, _model(nodes, tiny, "2", "taylor"), FRAMES, **kw)
    assert whole.report["cache_bytes"] > plain.report["cache_bytes"]
    assert not torch.equal(whole.samples, plain.samples)  # the tiers change what attention reads
    first = _run(loop, model, FRAMES // 2, keep_state=True, **kw)
    path = str(tmp_path / "tiers.safetensors")
    first.state.save(path)
    state = rs.load_saved_run(path)
    assert state.tiers == first.state.tiers and "tiers recent1@4+sink@8" in state.describe()
    second = _run(loop, model, FRAMES // 2, resume=state, **kw)
    assert torch.equal(torch.cat([first.samples, second.samples], dim=2), whole.samples)
    with pytest.raises(ValueError, match="age tiers recent1@4\\+sink@8, but this run has off"):
        _run(loop, _model(nodes, tiny, "2", "taylor"), 2, resume=rs.load_saved_run(path), **kw)
