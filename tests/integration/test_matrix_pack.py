"""The combination matrix on the pack's own Chunked AR sampler: every recipe crossed with the options users combine.

The cells come from ``tests/support/matrix.py`` (``python tests/support/matrix.py`` prints the table): one test
function per column, parametrized over the recipes. A running cell is checked against an independent
computation - an equivalence that must hold (one run == a prefix clip + its extension, == a saved cache +
its continuation; batch 2 == two batch-1 runs; cfg branches split == batched), a masked forward of
ComfyUI's own Wan over the chunks the cache should hold (``support/matrix_reference.py``), the planner's
bytes per side, quantization of the raw K/V the cache was written with, or the reference's own numbers.
A refused cell must stop with the error the recipe owns.

Tiny Wan (2 layers x 2 heads x 32, fp32, CPU), 8 x 8 latents (16 tokens per frame), chunks of 2 latent
frames (1 for Causal Forcing), 2-4 steps.
"""

from __future__ import annotations

import importlib
import math

import pytest
import torch
from support import matrix as mx
from support import wan_tiny
from support.fake_vae import FakeVAE
from support.matrix_reference import ForwardRecorder, Piece, causal, masked_forward, windowed

SEED, STEPS, TPF = 3, 2, 16
KREA_K, KREA_BIAS, SKY_CTX = 2, 0.5, 0.1
POS_A, POS_B, NEG = (wan_tiny.conditioning(s, 13, 32) for s in (1, 5, 2))
LAYERS, HEADS, HEAD_DIM = 2, 2, 32
FP32_ATOL = 2e-5
START = "jensen_kv_start_chunk"  # runtime.prompt_schedule.START_KEY


def cells(column):
    return pytest.mark.parametrize("cell", mx.cells("pack", column), ids=lambda c: c.id)


def _skip_absent(cell):
    assert cell.status != "absent", f"{cell.id}: absent cells are not listed for the pack"


# ---------------------------------------------------------------------------------------------- set-up
@pytest.fixture(scope="module")
def sched(pack):
    return importlib.import_module("comfyui_jensen_kv.runtime.schedules")


@pytest.fixture(scope="module")
def rs(pack):
    return importlib.import_module("comfyui_jensen_kv.runtime.saved_run")


@pytest.fixture(scope="module")
def planner(pack):
    return importlib.import_module("comfyui_jensen_kv.jensen_core.planner")


@pytest.fixture(scope="module")
def cache_mod(pack):
    return importlib.import_module("comfyui_jensen_kv.jensen_core.cache")


def schedule(switch_at):
    """Prompt A from chunk 0, prompt B from chunk ``switch_at`` (a Prompt Schedule's CONDITIONING)."""
    return [[POS_A[0][0], {START: 0}], [POS_B[0][0], {START: switch_at}]]


def sizes(recipe, n):
    """Latent frames of each of the first ``n`` chunks of the recipe's video."""
    if recipe == "causal_forcing":
        return [1] * n
    if recipe == "first_frame_apart":
        return [1] + [2] * (n - 1)
    return [2] * n


def starts(recipe, n):
    out = [0]
    for f in sizes(recipe, n):
        out.append(out[-1] + f)
    return out


def recipe_options(recipe, sched, model):
    """The request options of a row of the matrix (what its reference sets)."""
    import comfy.samplers

    simple = comfy.samplers.calculate_sigmas(model.get_model_object("model_sampling"), "simple", STEPS)
    euler, lcm = comfy.samplers.sampler_object("euler"), comfy.samplers.sampler_object("lcm")
    # a prompt switch re-caches the pack's causal way (the column's masked reference); LongLive's, the default, in the
    # longlive row (and tests/integration/test_longlive_recache.py)
    o = {"sampler": euler, "sigmas": simple, "chunk_frames": 2, "recache_mode": "causal"}
    if recipe == "self_forcing":
        o.update(sampler=lcm, sigmas=sched.ar_sigmas("self_forcing_4step"))
    elif recipe == "causvid":
        o.update(sampler=lcm, sigmas=sched.ar_sigmas("causvid_3step"))
    elif recipe == "longlive":
        o.update(sampler=lcm, sigmas=sched.ar_sigmas("longlive_4step"), recache_mode="longlive")
    elif recipe == "krea":
        o.update(recompute_frames=KREA_K, attention_bias=KREA_BIAS, vae=FakeVAE())
    elif recipe == "skyreels":
        o.update(context_noise=SKY_CTX, context_noise_mode="skyreels")
    elif recipe == "causal_forcing":
        o.update(
            sampler=lcm,
            chunk_frames=1,
            sigmas=sched.ar_sigmas("causal_forcing_framewise_2step"),
            first_chunk_sigmas=sched.first_chunk_sigmas("causal_forcing_framewise_2step"),
        )
    elif recipe == "first_frame_apart":
        o.update(first_chunk_frames=1)
    else:
        assert recipe == "plain", recipe
    return o


class Runner:
    def __init__(self, loop, sched, tiny, monkeypatch):
        self.loop, self.sched, self.tiny, self.monkeypatch = loop, sched, tiny, monkeypatch

    def __call__(self, model, recipe, chunks=None, *, frames=None, positive=None, latent=None, record=False, **kw):
        """One run of ``recipe``: ``chunks`` of the recipe's sizes (or ``frames``); returns (result, calls):
        every forward of the model during the run when ``record``."""
        cfg = kw.pop("cfg", 1.0)
        sampler = kw.pop("sampler", None)
        opts = recipe_options(recipe, self.sched, model)
        opts.update(kw)
        if sampler is not None:
            opts["sampler"] = sampler
        self.steps = len(opts["sigmas"]) - 1  # of every chunk but a Causal Forcing video's first
        rec = None
        dm = model.model.diffusion_model
        if record:
            rec = ForwardRecorder(dm)
            self.monkeypatch.setattr(dm, "forward_orig", rec, raising=False)
        if latent is None:
            latent = wan_tiny.video_latent(frames if frames is not None else sum(sizes(recipe, chunks)))
        try:
            result = self.loop.run_chunked_ar(
                model, positive or POS_A, NEG, latent, seed=SEED, cfg=cfg, progress=False, **opts
            )
        finally:
            if record:
                self.monkeypatch.delattr(dm, "forward_orig")
        return result, (rec.calls if rec else None)


@pytest.fixture
def run(loop, sched, tiny, monkeypatch):
    return Runner(loop, sched, tiny, monkeypatch)


def int2(nodes, model):
    m = nodes.JensenKVQuantizeKVCache.execute(model, "2", "2", "16", "hadamard", "fp8_e4m3", 0).args[0]
    return nodes.JensenKVBiasCorrection.execute(m, "taylor", 1.0).args[0]


def save_load(rs, state, tmp_path, name="state.safetensors"):
    path = str(tmp_path / name)
    state.save(path)
    return rs.load_saved_run(path)


class Spy:
    """An observer on layer 0, branch 0: the raw K/V of every write (in order) and, at step 0 of each chunk's
    denoising, the cache's entries then (the stored tensors are never modified in place)."""

    def __init__(self):
        self.writes: list[tuple[int, torch.Tensor, torch.Tensor]] = []
        self.seen: dict[int, tuple[list, int]] = {}

    def wants(self, layer, chunk, phase, step):
        return layer == 0 and (phase == "write" or step == 0)

    def __call__(self, e):
        if e.branch != 0:
            return
        if e.phase == "write":
            self.writes.append((e.chunk, e.k.detach().clone(), e.v.detach().clone()))
        elif e.chunk not in self.seen:
            self.seen[e.chunk] = (list(e.cache.entries) if e.cache is not None else [], len(self.writes))

    def raw(self, chunk, before):
        """The raw K/V of the last write of ``chunk`` before write number ``before``."""
        for c, k, v in reversed(self.writes[:before]):
            if c == chunk:
                return k, v
        raise AssertionError(f"no write of chunk {chunk} was observed")


# ---------------------------------------------------------------------------------------------- the reference
def is_write(call, recipe):
    t = float(call["t"].reshape(-1)[0])
    return math.isclose(t, 1000 * SKY_CTX, abs_tol=1e-3) if recipe == "skyreels" else t == 0.0


def chunk_of(recipe):
    return 1 if recipe == "causal_forcing" else 2


def last_chunk_pairs(dm, recipe, calls, n, steps_last, *, window=0, sink=0, switch=False, tpf=TPF):
    """(recorded output, reference output) of every denoising call of the last of ``n`` chunks, each reference a
    masked forward over the chunks the cache should hold then, written as the recipe writes them."""
    st = starts(recipe, n)
    denoise = [i for i, c in enumerate(calls) if not is_write(c, recipe)]
    last = denoise[-steps_last:]
    held = [c for c in range(n - 1) if not window or c >= n - 1 - window or c < sink]
    pairs = []
    for i in last:
        call = calls[i]
        cur = Piece(call["x"], call["t"], st[n - 1])
        writes = [c for c in calls[:i] if is_write(c, recipe)]
        if recipe == "krea":
            ctx = writes[-math.ceil(min(st[n - 1], KREA_K) / 2) :]
            pieces, at = [], 0
            for w in ctx:
                pieces.append(Piece(w["x"], w["t"], at))
                at += w["x"].shape[2]
            cur = Piece(call["x"], call["t"], at)
            bias = {j: (tpf if j == 0 else 0, math.log(KREA_BIAS)) for j in range(len(pieces))}
            ref = masked_forward(dm, pieces + [cur], call["context"], causal(len(pieces) + 1), key_bias=bias)
        elif recipe == "skyreels" and held:
            redraws = writes[-len(held) :]  # re-written (noised afresh) right before this call, causally
            pieces = [Piece(w["x"], w["t"], st[c]) for w, c in zip(redraws, held)]
            ref = masked_forward(dm, pieces + [cur], call["context"], causal(len(pieces) + 1))
        elif switch and recipe == "longlive":
            joint = writes[-1]  # LongLive re-computes sink, evicted chunk and window in one forward, with no mask
            back = [c for c in range(n - 1) if st[c] < joint["x"].shape[2]]
            pieces = [Piece(joint["x"][:, :, st[c] : st[c + 1]], joint["t"], st[c]) for c in back]
            sees = [list(range(len(pieces))) for _ in pieces] + [held + [len(pieces)]]
            ref = masked_forward(dm, pieces + [cur], call["context"], sees)
        elif switch:
            rewrites = writes[-len(held) :]  # the retained chunks re-written under the new prompt, in order
            pieces = [Piece(w["x"], w["t"], st[c]) for w, c in zip(rewrites, held)]
            ref = masked_forward(dm, pieces + [cur], call["context"], causal(len(pieces) + 1))
        else:
            assert len(writes) == n - 1, (recipe, len(writes))
            pieces = [Piece(w["x"], w["t"], st[c]) for c, w in enumerate(writes)]
            sees = windowed(n, window, sink) if window else causal(n)
            ref = masked_forward(dm, pieces + [cur], call["context"], sees)
        pairs.append((call["out"], ref))
    assert len(pairs) == steps_last
    return pairs


# ---------------------------------------------------------------------------------------------- columns
@cells("prefix")
def test_prefix(cell, run, nodes, tiny):
    """One run == the clip (its first two chunks, a prompt switch inside them) + the extension, bit for bit."""
    _skip_absent(cell)
    r = cell.recipe
    model, n, p = int2(nodes, tiny), 5, 2
    clip = sum(sizes(r, p))
    one, _ = run(model, r, n, positive=schedule(1))
    ext, calls = run(
        model,
        r,
        frames=sum(sizes(r, n)) - clip,
        positive=schedule(1),
        prefix={"samples": one.samples[:, :, :clip].clone()},
        record=r == "causal_forcing",
    )
    assert ext.report["prefix_chunks"] == p and ext.report["first_chunk"] == p
    if r == "causal_forcing":
        ts = [round(float(c["t"].reshape(-1)[0]), 1) for c in calls if float(c["t"].reshape(-1)[0]) > 0]
        assert ts == [1000.0, 937.5, 833.3, 625.0] + [1000.0, 833.3] * (n - p - 1), ts
        return
    assert torch.equal(ext.samples, one.samples[:, :, clip:])


@cells("resume")
def test_resume(cell, run, nodes, tiny, rs, tmp_path):
    """One run == its first two chunks, saved to a file and loaded back, + the rest, bit for bit."""
    _skip_absent(cell)
    r, model, n = cell.recipe, int2(nodes, tiny), 5
    if cell.status == "refused":
        with pytest.raises(ValueError, match=cell.detail):
            run(model, r, 2, keep_state=True)
        state, _ = run(model, "plain", 2, keep_state=True)
        with pytest.raises(ValueError, match=cell.detail):
            run(model, r, 2, resume=state.state)
        return
    one, _ = run(model, r, n)
    first, _ = run(model, r, 2, keep_state=True)
    state = save_load(rs, first.state, tmp_path)
    rest, _ = run(model, r, frames=sum(sizes(r, n)) - sum(sizes(r, 2)), resume=state)
    assert rest.report["resumed"] and rest.report["first_chunk"] == 2
    assert torch.equal(first.samples, one.samples[:, :, : sum(sizes(r, 2))])
    assert torch.equal(rest.samples, one.samples[:, :, sum(sizes(r, 2)) :])


#: rows whose sampler is LCM: ComfyUI's LCM draws its per-step noise for the whole batch (``torch.randn`` of the
#: batch's shape), so a batch item's steps differ from a batch-1 run's whatever the pack does; the batch column
#: runs them with euler (the recipe's schedule and cache rules kept)
LCM_ROWS = {"self_forcing", "causvid", "longlive", "causal_forcing"}


@cells("batch2")
def test_batch2(cell, run, nodes, tiny):
    """Each item of a batch of 2 == the batch-1 run of its batch_index."""
    import comfy.samplers

    _skip_absent(cell)
    r, model, n = cell.recipe, int2(nodes, tiny), 3
    kw = {"sampler": comfy.samplers.sampler_object("euler")} if r in LCM_ROWS else {}
    frames = sum(sizes(r, n))
    both, _ = run(model, r, latent=wan_tiny.video_latent(frames, batch=2), **kw)
    assert both.samples.shape[0] == 2 and (both.samples[0] - both.samples[1]).abs().max() > 1e-3
    for b in (0, 1):
        latent = wan_tiny.video_latent(frames)
        latent["batch_index"] = [b]
        one, _ = run(model, r, latent=latent, **kw)
        torch.testing.assert_close(both.samples[b : b + 1], one.samples, atol=1e-5, rtol=0)


@cells("cfg")
def test_cfg(cell, run, nodes, tiny, monkeypatch):
    """cfg 3: cond and uncond run as separate model calls (ComfyUI's low-memory path) == batched in one call."""
    _skip_absent(cell)
    r, model, n = cell.recipe, int2(nodes, tiny), 3
    batched, bcalls = run(model, r, n, cfg=3.0, record=True)
    monkeypatch.setattr(tiny.model, "memory_required", lambda *a, **k: 1e30)  # nothing fits: one branch per call
    split, scalls = run(model, r, n, cfg=3.0, record=True)
    assert {len(c["cond_or_uncond"]) for c in bcalls} == {2} and {len(c["cond_or_uncond"]) for c in scalls} == {1}
    assert batched.report["cfg_branches"] == split.report["cfg_branches"] == 2
    torch.testing.assert_close(split.samples, batched.samples, atol=1e-5, rtol=0)


def _position_bits(n, sink_held, base, recent, recent_n, sink_bits):
    out = []
    for i in range(n):
        b = base
        if i < sink_held:
            b = max(b, sink_bits)
        if i >= n - recent_n:
            b = max(b, recent)
        out.append(b)
    return out


@cells("tiers")
def test_tiers(cell, run, nodes, tiny, jk, planner, cache_mod, rs, tmp_path):
    """Precision by age, keys and values apart: every held chunk at its position's bits on each side, as the
    planner projects them; bytes per side; the newest chunk quantized from its raw K/V at its bits, bit for bit;
    an aged chunk within Delta/2 of each form it was stored in (rotated space); where the recipe resumes, the
    run == its first two chunks saved with their tiers, loaded back and continued, bit for bit."""
    _skip_absent(cell)
    from dataclasses import replace

    r, n = cell.recipe, 5
    window, sink = (0, 0) if r == "krea" else (2, 1)
    model = nodes.JensenKVQuantizeKVCache.execute(
        tiny,
        "2",
        "2",
        "16",
        "hadamard",
        "fp8_e4m3",
        0,
        recent_chunks_bits="4",
        recent_chunks=1,
        sink_bits="8",
        recent_chunks_key_bits="8",
    ).args[0]
    spy = Spy()
    res, _ = run(model, r, n, window_chunks=window, sink_chunks=sink, observer=spy)
    entries, before = spy.seen[n - 1]
    st = starts(r, n)
    if r == "krea":
        held_frames = [KREA_K]
        ids = [c for c, _, _ in spy.writes[before - 1 : before]]
    else:
        ids = [c for c in range(n - 1) if c >= n - 1 - window or c < sink]
        held_frames = [st[c + 1] - st[c] for c in ids]
    held, sink_held = len(ids), min(sink, len(ids))
    bits_k = _position_bits(held, sink_held, 2, 8, 1, 8)  # keys: old 2, newest 8, sink 8
    bits_v = _position_bits(held, sink_held, 2, 4, 1, 8)  # values: old 2, newest 4, sink 8
    assert [e.k.spec.bits for e in entries] == bits_k and [e.v.spec.bits for e in entries] == bits_v
    spec = jk.QuantSpec(bits=2, group_size=16, rotation="hadamard", scale_format="fp8_e4m3", seed=0)
    tiers = model.model_options["transformer_options"]["jensen_kv"].tiers

    def side_bytes(bits, frames):
        return sum(
            cache_mod.chunk_bytes(replace(spec, bits=b), None, HEADS, f * TPF, HEAD_DIM, full_bytes=0)
            for b, f in zip(bits, frames)
        )

    assert sum(e.k.nbytes for e in entries) == side_bytes(bits_k, held_frames)
    assert sum(e.v.nbytes for e in entries) == side_bytes(bits_v, held_frames)
    assert res.report["cache_bytes"] == LAYERS * (side_bytes(bits_k, held_frames) + side_bytes(bits_v, held_frames))
    full = [chunk_of(r)] * held  # the planner counts every chunk full
    assert res.report["planned_bytes"] == LAYERS * (side_bytes(bits_k, full) + side_bytes(bits_v, full))
    geometry = importlib.import_module("comfyui_jensen_kv.jensen_core.geometry").LatentGeometry((1, 2, 2), 16)
    plan = planner.plan_cache(
        latent_frames=sum(sizes(r, n)),
        latent_height=8,
        latent_width=8,
        chunk_frames=full[0],
        window_chunks=1 if r == "krea" else window,
        sink_chunks=sink,
        shape=planner.CacheShape(layers=LAYERS, heads=HEADS, head_dim=HEAD_DIM, geometry=geometry, full_bytes=4),
        precision=planner.CachePrecision(spec_k=spec, spec_v=spec, tiers=tiers),
    )
    assert list(plan.chunk_bits_k) == bits_k and list(plan.chunk_bits_v) == bits_v
    eb = {b: replace(spec, bits=b).effective_bits for b in (2, 4, 8)}
    assert plan.effective_bits_k == pytest.approx(sum(eb[b] for b in bits_k) / held)
    assert plan.effective_bits_v == pytest.approx(sum(eb[b] for b in bits_v) / held)
    for i, (e, c) in enumerate(zip(entries, ids)):
        k_raw, v_raw = spy.raw(c, before)
        first_k, first_v = 8, 8 if i < sink_held else 4  # as first stored: the newest chunk's bits, or the sink's
        for side, stored, raw, b0 in (("k", e.k, k_raw, first_k), ("v", e.v, v_raw, first_v)):
            exact = jk.quantize(raw, replace(spec, bits=stored.spec.bits))
            if stored.spec.bits == b0:  # never demoted: exactly its raw K/V quantized at its bits
                assert torch.equal(stored.packed, exact.packed), (r, side, i)
                assert torch.equal(stored.scale, exact.scale) and torch.equal(stored.minimum, exact.minimum)
            else:  # demoted from b0 bits: within its own and the first form's half-steps of the raw
                first = jk.quantize(raw, replace(spec, bits=b0))
                target = jk.rotate(raw.float(), 0)
                err = (stored.dequantize(dtype=torch.float32, rotated=True) - target).abs()
                steps = stored.step_sizes().repeat_interleave(16, -1) + first.step_sizes().repeat_interleave(16, -1)
                assert bool((err <= steps / 2 * 1.001 + 1e-5).all()), (r, side, i, float((err - steps / 2).max()))
    if r == "krea":  # recompute refuses a kv_cache input and output
        return
    first, _ = run(model, r, 2, window_chunks=window, sink_chunks=sink, keep_state=True)
    state = save_load(rs, first.state, tmp_path)
    assert state.tiers == tiers
    rest, _ = run(model, r, frames=sum(sizes(r, n)[2:]), window_chunks=window, sink_chunks=sink, resume=state)
    assert torch.equal(rest.samples, res.samples[:, :, st[2] :])


@cells("qvg")
def test_qvg(cell, run, nodes, tiny, rs, tmp_path, cache_mod, jk):
    """QVG on both sides: cache bytes == the planner's (centroids and ids per chunk); the newest chunk within its
    residual's Delta/2 of its raw keys (rotated space); where the recipe resumes, one run == save/load + rest."""
    _skip_absent(cell)
    r, n = cell.recipe, 3
    model = nodes.JensenKVQuantizeKVCache.execute(tiny, "2", "2", "16", "hadamard", "fp8_e4m3", 0, "qvg").args[0]
    spy = Spy()
    one, _ = run(model, r, n, observer=spy)
    entries, before = spy.seen[n - 1]
    spec = model.model_options["transformer_options"]["jensen_kv"].spec_k
    st = starts(r, n)
    frames = [KREA_K] if r == "krea" else [st[c + 1] - st[c] for c in range(n - 1)]
    per = [cache_mod.chunk_bytes(spec, spec, HEADS, f * TPF, HEAD_DIM) for f in frames]
    assert [e.k.nbytes + e.v.nbytes for e in entries] == per
    full = chunk_of(r)
    assert one.report["cache_bytes"] == LAYERS * sum(per)
    assert one.report["planned_bytes"] == LAYERS * len(per) * cache_mod.chunk_bytes(
        spec, spec, HEADS, full * TPF, HEAD_DIM
    )
    k_raw, v_raw = spy.writes[before - 1][1:]
    for stored, raw in ((entries[-1].k, k_raw), (entries[-1].v, v_raw)):
        err = (stored.dequantize(dtype=torch.float32, rotated=True) - jk.rotate(raw.float(), spec.seed)).abs()
        assert bool((err <= stored.step_sizes().repeat_interleave(16, -1) / 2 * 1.001 + 1e-5).all())
    if r == "krea":
        return
    whole, _ = run(model, r, 4)
    first, _ = run(model, r, 2, keep_state=True)
    rest, _ = run(model, r, frames=sum(sizes(r, 4)) - sum(sizes(r, 2)), resume=save_load(rs, first.state, tmp_path))
    assert torch.equal(rest.samples, whole.samples[:, :, sum(sizes(r, 2)) :])


@cells("window_sink")
def test_window_sink(cell, run, tiny):
    """Window 2 + sink 1, full precision: every call of the last chunk == a masked forward over the chunks kept."""
    _skip_absent(cell)
    r, n = cell.recipe, 5
    if cell.status == "refused":
        with pytest.raises(ValueError, match=cell.detail):
            run(tiny, r, n, window_chunks=2, sink_chunks=1)
        return
    _, calls = run(tiny, r, n, window_chunks=2, sink_chunks=1, record=True)
    for out, ref in last_chunk_pairs(tiny.model.diffusion_model, r, calls, n, run.steps, window=2, sink=1):
        torch.testing.assert_close(out, ref, atol=FP32_ATOL, rtol=FP32_ATOL)


@cells("odd_tokens")
def test_odd_tokens(cell, run, nodes, tiny, cache_mod):
    """A 6 x 10 latent (15 tokens per frame): the last chunk's calls == the masked forward (full precision); an
    INT2 run holds and plans 15 tokens per frame."""
    _skip_absent(cell)
    r, n = cell.recipe, 3
    frames = sum(sizes(r, n))
    _, calls = run(tiny, r, latent=wan_tiny.video_latent(frames, height=6, width=10), record=True)
    for out, ref in last_chunk_pairs(tiny.model.diffusion_model, r, calls, n, run.steps, tpf=15):
        torch.testing.assert_close(out, ref, atol=FP32_ATOL, rtol=FP32_ATOL)
    model = int2(nodes, tiny)
    res, _ = run(model, r, latent=wan_tiny.video_latent(frames, height=6, width=10))
    spec = model.model_options["transformer_options"]["jensen_kv"].spec_k
    st = starts(r, n)
    held = [KREA_K] if r == "krea" else [st[c + 1] - st[c] for c in range(n - 1)]
    full = chunk_of(r)
    assert res.report["tokens_per_frame"] == 15
    assert res.report["cache_bytes"] == LAYERS * sum(
        cache_mod.chunk_bytes(spec, spec, HEADS, f * 15, HEAD_DIM) for f in held
    )
    assert res.report["planned_bytes"] == LAYERS * len(held) * cache_mod.chunk_bytes(
        spec, spec, HEADS, full * 15, HEAD_DIM
    )


@cells("odd_size")
def test_odd_size(cell, run, tiny):
    """An odd latent height is refused by the Wan family before anything runs."""
    _skip_absent(cell)
    assert cell.status == "refused"
    with pytest.raises(ValueError, match=cell.detail):
        run(tiny, cell.recipe, latent=wan_tiny.video_latent(4, height=7, width=10))


@cells("prompt_switch")
def test_prompt_switch(cell, run, tiny, rs, tmp_path):
    """A switch at chunk 4 under window 2 + sink 1: the calls after it == a masked forward over the chunks
    re-cached under the new prompt (LongLive: as LongLive re-computes them; Krea: its context under the new
    prompt); a run resumed from a state saved before the switch == the one run, bit for bit."""
    _skip_absent(cell)
    r, n = cell.recipe, 5
    window, sink = (0, 0) if r == "krea" else (2, 1)
    one, calls = run(tiny, r, n, positive=schedule(4), window_chunks=window, sink_chunks=sink, record=True)
    assert one.report["prompts"][1]["recached_chunks"] == (0 if r == "krea" else 4 if r == "longlive" else 3)
    pairs = last_chunk_pairs(tiny.model.diffusion_model, r, calls, n, run.steps, window=window, sink=sink, switch=True)
    for out, ref in pairs:
        torch.testing.assert_close(out, ref, atol=FP32_ATOL, rtol=FP32_ATOL)
    if r == "krea":
        writes = [c for c in calls if is_write(c, r)]
        assert torch.equal(writes[-1]["context"], POS_B[0][0]) and torch.equal(writes[-2]["context"], POS_A[0][0])
        return
    if r == "longlive":  # a saved state does not keep the chunk the window dropped, which LongLive re-computes
        return  # (documented; tests/integration/test_longlive_recache.py checks the resumed re-cache on its own)
    # saved at chunk 3: the resumed run adds chunk 3 (the window evicts, the sink must stay) before the switch
    first, _ = run(tiny, r, 3, positive=schedule(4), window_chunks=window, sink_chunks=sink, keep_state=True)
    rest, _ = run(
        tiny,
        r,
        frames=sum(sizes(r, n)[3:]),
        positive=schedule(4),
        window_chunks=window,
        sink_chunks=sink,
        resume=save_load(rs, first.state, tmp_path),
    )
    assert torch.equal(rest.samples, one.samples[:, :, starts(r, n)[3] :])


def test_the_table_lists_every_cell_of_the_pack():
    """Every recipe of the pack has one cell per column; nothing refused without the recipe's text."""
    pack = mx.cells("pack")
    assert len(pack) == len(mx.RECIPES) * len(mx.COLUMNS)
    assert all(c.status in ("runs", "refused") for c in pack)
    assert all(c.detail for c in pack)
