"""The combination matrix for MAGI-1 (issue 43): what its sampler refuses, and the running cells.

Refusals: every schedule or option the MAGI-1 AR Sampler refuses is refused before any model call (the DiT's
``forward_chunks`` is counted), with a message that names the value; one test each (parametrized ids).

Running cells (``tests/support/matrix.py``'s MAGI-1 rows): each is checked against a computation that does not use
the pack's own output of the same run - the planner's bytes counted by hand from the retention rule and the bits of
each held chunk, the raw K/V of the writing forward quantized at the chunk's bits, the float32 reference over what
the retention rule keeps (the pure sampler with its full-precision buffer), the reference's stored numbers.
"""

from __future__ import annotations

import pytest
import torch
from support.comfyui import pack_module

from jensen_testing import magi1_tiny
from jensen_testing.families import MAGI1_QK_GAIN


@pytest.fixture(scope="module")
def model(pack):
    return magi1_tiny.build_patcher(qk_gain=MAGI1_QK_GAIN)


@pytest.fixture
def forwards(pack, monkeypatch):
    """Every forward of a MAGI-1 DiT in this test (the patched clone calls ``MagiDiT.forward_chunks``)."""
    dit = pack_module("runtime.families.magi1.model.dit").MagiDiT
    calls: list[int] = []
    original = dit.forward_chunks

    def counting(self, *a, **k):
        calls.append(1)
        return original(self, *a, **k)

    monkeypatch.setattr(dit, "forward_chunks", counting)
    return calls


def request(magi1, model, frames=2, *, cw=1, hw=(8, 8), cond=None, **kw):
    return magi1.Magi1Request.from_options(
        model, cond or magi1_tiny.conditioning(0), latent_frames=frames, latent_height=hw[0], latent_width=hw[1],
        chunk_frames=cw, **{"num_steps": 8, "progress": False, **kw},
    )  # fmt: skip


# ------------------------------------------------------------------------------------------------ refusals
#: (id, request keywords, a regex naming the value)
REFUSALS = [
    ("window_size_0", dict(window_size=0), r"window_size=0"),
    ("window_size_5", dict(window_size=5), r"window_size=5"),
    ("steps_not_a_multiple_of_the_window", dict(num_steps=10, window_size=4), r"num_steps 10 .*window_size 4"),
    ("steps_16_at_window_3", dict(num_steps=16, window_size=3), r"num_steps 16 .*window_size 3"),
    ("steps_not_split_into_stages", dict(num_steps=6, window_size=2), r"num_steps 6 .*4 stages of kv_ranges"),
    ("steps_not_split_into_3_stages", dict(num_steps=8, kv_ranges=(3, 2, 1)), r"num_steps 8 .*3 stages"),
    ("kv_range_0", dict(kv_ranges=(5, 0, 3, 2)), r"key range of 0 chunks"),
    ("kv_range_negative", dict(kv_ranges=(5, 4, -1, 2)), r"key range of -1 chunks"),
    ("kv_ranges_all_0", dict(num_steps=4, kv_ranges=(0,)), r"key range of 0 chunks"),
    ("num_steps_0", dict(num_steps=0), r"num_steps=0"),
    ("num_steps_negative", dict(num_steps=-4), r"num_steps=-4"),
    ("cfg_number_2", dict(cfg_number=2), r"cfg_number=2"),
    ("cfg_3_on_the_sampling", dict(cfg=3.0), r"cfg=3\.0"),
    ("sigmas", dict(sigmas=torch.tensor([1.0, 0.0])), r"SIGMAS"),
    ("first_chunk_frames", dict(first_chunk_frames=1, cw=2, frames=4), r"first_chunk_frames=1"),
    ("frames_not_whole_chunks", dict(frames=3, cw=2), r"latent_frames=3 .*2-frame chunks.*use 4"),
    ("odd_width", dict(hw=(8, 9)), r"width 9 must be even"),
    ("odd_height", dict(hw=(7, 8)), r"height 7 .*must be even"),
    ("zero_frames", dict(frames=0), r"latent_frames=0"),
    ("chunk_frames_0", dict(cw=0), r"chunk_frames=0"),
    ("window_chunks_negative", dict(window_chunks=-1), r"window_chunks=-1"),
    ("sink_chunks_negative", dict(sink_chunks=-2), r"sink_chunks=-2"),
    ("seed_negative", dict(seed=-1), r"seed=-1"),
    ("keep_state", dict(keep_state=True), r"does not save or continue"),
    ("prefix", dict(prefix={"samples": torch.zeros(1, 16, 1, 8, 8)}), r"prefix video"),
]


@pytest.mark.parametrize("kw,match", [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS])
def test_a_refused_option_names_its_value_before_any_model_call(magi1, model, forwards, kw, match):
    with pytest.raises(ValueError, match=match):
        magi1.run(request(magi1, model, **kw))
    assert forwards == [], "refused after the model ran"


def test_the_forward_counter_counts_a_run_that_is_not_refused(magi1, model, forwards):
    """The positive control of the refusals: the same counter sees the forwards of a run that goes."""
    pipeline = pack_module("runtime.families.magi1.model.pipeline")
    magi1.run(request(magi1, model, 2, num_steps=4, window_size=2, cfg_number=1))
    assert len(forwards) == len(pipeline.steps_of(4, 2, 2))  # one pass per step at cfg_number 1


@pytest.mark.parametrize(
    "fields,name,value",
    [
        ({"kv_ranges": (5, 0, 3, 2)}, "kv_ranges", "5,0,3,2"),
        ({"kv_ranges": "5,0,3,2"}, "kv_ranges", "5,0,3,2"),
        ({"window_size": "5"}, "window_size", "5"),
        ({"steps": "0"}, "steps", "0"),
        ({"steps": "10"}, "steps", "10"),
    ],
    ids=["ranges_tuple_0", "ranges_text_0", "window_size_5", "steps_0", "steps_10"],
)
def test_the_planner_rule_refuses_what_the_sampler_refuses_by_field(window, fields, name, value):
    options = pack_module("runtime.options")
    base = pack_module("runtime.families.base")
    with pytest.raises(base.PlannerFieldError) as e:
        window.plan_chunks(options.Chunking(1, 0, 0), 8, fields)
    assert e.value.param == name and value in str(e.value), (e.value.param, str(e.value))


# ------------------------------------------------------------------------------------------------ running cells
from dataclasses import replace  # noqa: E402

from support import matrix as mx  # noqa: E402

from runtime.families.magi1.model.attention import ChunkPlan, sdpa  # noqa: E402
from runtime.families.magi1.model.caption import chunk_captions  # noqa: E402
from runtime.families.magi1.model.config import TINY  # noqa: E402
from runtime.families.magi1.model.sampler import MagiSettings, sample  # noqa: E402

TABLE = mx.MAGI1
N = 5  # chunks of 1 latent frame; the last is never written (no stage after it), so 4 are
SCALE = 0.18215
TOKENS = 16  # an 8 x 8 latent in 2 x 2 patches
DEFAULT_RANGES = (5, 4, 3, 2)
#: row -> (distill, window_size, num_steps, cfg_number)
ROWS = {
    "distill_w1": (True, 1, 8, 1),
    "distill_w2": (True, 2, 8, 1),
    "distill_w3": (True, 3, 12, 1),
    "distill_w4": (True, 4, 8, 1),
    "base_w2": (False, 2, 8, 3),
}
#: column -> (kv_ranges, window_chunks, sink_chunks, quantize node args or None, correction or None)
COLUMNS = {
    "fp": (DEFAULT_RANGES, 0, 0, None, None),
    "kv_ranges": ((3, 1), 0, 0, None, None),
    "window_sink": ((), 2, 1, None, None),
    "prompts": (DEFAULT_RANGES, 0, 0, None, None),
    "rtn": (DEFAULT_RANGES, 0, 0, ("2", "2", "16", "none", "fp8_e4m3", 0), ("taylor", 1.0)),
    "quarot": (DEFAULT_RANGES, 0, 0, ("2", "2", "16", "hadamard", "fp8_e4m3", 0), ("chunk_mean", 0.5)),
    "qvg": (DEFAULT_RANGES, 0, 0, ("2", "2", "16", "hadamard", "fp8_e4m3", 0, "qvg", 1, 16), ("exact", 1.0)),
    "qvg_auto": (DEFAULT_RANGES, 0, 0, ("2", "2", "16", "hadamard", "fp8_e4m3", 0, "qvg", 1, 0), ("per_channel", 1.0)),
    "tiers": ((), 2, 1, ("2", "2", "16", "hadamard", "fp8_e4m3", 0), ("taylor", 1.0)),
}
TIERS = dict(recent_chunks_bits="4", recent_chunks=1, sink_bits="8", recent_chunks_key_bits="8")


@pytest.fixture(scope="module")
def models(pack):
    return {d: magi1_tiny.build_patcher(replace(TINY, distill=d), qk_gain=MAGI1_QK_GAIN) for d in (True, False)}


class Spy:
    """Layer 0's raw K/V of every write (by chunk) and its cache entries as the last read of the run saw them."""

    def __init__(self):
        self.writes: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.entries: list = []
        self.entries_after = 0

    def wants(self, layer, chunk, phase, step):
        return layer == 0

    def __call__(self, e):
        if e.phase == "write":
            assert e.chunk not in self.writes, f"chunk {e.chunk} written twice"
            self.writes[e.chunk] = (e.k.detach().clone(), e.v.detach().clone())
        elif e.cache is not None:
            self.entries, self.entries_after = list(e.cache.entries), len(self.writes)


def kept(n: int, window: int, sink: int) -> list[int]:
    """The retention rule, written here: the first ``sink`` chunks, and the last ``window`` of the rest (0: all)."""
    head = list(range(min(sink, n)))
    rest = list(range(len(head), n))
    return head + (rest[-window:] if window else rest)


def position_bits(held: int, sink_held: int, base: int, newest: int, sink_bits: int) -> list[int]:
    return [max(base, sink_bits if i < sink_held else base, newest if i == held - 1 else base) for i in range(held)]


def hand_window(window_size: int, ranges: tuple[int, ...], window: int) -> int:
    """Window 0: what the key ranges reach, from the pipeline's closed form (at most the chunks written)."""
    if window or not ranges:
        return window
    return max(1, min(P.finished_chunks_reached(window_size, ranges), N - 1))


def retained_attention(window: int, sink: int):
    """Float32 attention keeping what :func:`kept` keeps: query chunk j of range (s, e) reads the kept finished
    chunks in [s, cached) and the forward's own chunks in range up to itself."""
    stored: dict[int, dict[int, tuple]] = {}

    def attention(layer, q, k, v, plan: ChunkPlan):
        n, cached = plan.chunk_tokens, plan.cached
        mine = stored.setdefault(layer, {})
        held = kept(len(mine), window, sink)
        out = []
        for j, (s, _) in enumerate(plan.key_ranges):
            old = [mine[c] for c in held if s <= c < cached]
            first = max(s, cached) - cached
            ks = [t[0] for t in old] + [k[:, :, first * n : (j + 1) * n]]
            vs = [t[1] for t in old] + [v[:, :, first * n : (j + 1) * n]]
            out.append(sdpa(q[:, :, j * n : (j + 1) * n], torch.cat(ks, 2), torch.cat(vs, 2)))
        for cur, absolute in plan.store:
            mine[absolute] = (k[:, :, cur * n : (cur + 1) * n].clone(), v[:, :, cur * n : (cur + 1) * n].clone())
        return torch.cat(out, 2)

    return attention


P = pack_module  # replaced below by the pipeline module (imported lazily: the pack needs ComfyUI first)


@pytest.fixture(scope="module", autouse=True)
def _pipeline(pack):
    global P
    P = pack_module("runtime.families.magi1.model.pipeline")


def cell_ids(column):
    return [pytest.param(c, id=c.id) for c in TABLE.cells(column)]


@pytest.mark.parametrize("cell", [pytest.param(c, id=c.id) for c in TABLE.cells()])
def test_magi1_cell(cell, magi1, models, nodes, jk, memory_requests):
    distill, window_size, steps, cfg_number = ROWS[cell.recipe]
    model = models[distill]
    if cell.status == "refused":
        with pytest.raises(ValueError, match=cell.detail):
            magi1.run(request(magi1, model, N, hw=(7, 8), num_steps=steps, window_size=window_size))
        return
    ranges, window, sink, quant, correction = COLUMNS[cell.column]
    if quant is not None:
        model = nodes.JensenKVQuantizeKVCache.execute(model, *quant, **(TIERS if cell.column == "tiers" else {}))
        model = model.args[0]
        model = nodes.JensenKVBiasCorrection.execute(model, *correction).args[0]
    a, b = magi1_tiny.conditioning(2), magi1_tiny.conditioning(5, tokens=9)
    cond = a
    if cell.column == "prompts":
        schedule = pack_module("runtime.prompt_schedule")
        cond = schedule.add_to_schedule(schedule.add_to_schedule(None, a, 0, "a"), b, 2, "b")
    spy = Spy()
    kw = dict(num_steps=steps, window_size=window_size, kv_ranges=ranges, cfg_number=cfg_number, seed=3)
    result = magi1.run(request(magi1, model, N, cond=cond, window_chunks=window, sink_chunks=sink, observer=spy, **kw))
    rep = result.report
    # the retention rule by hand: which finished chunks layer 0 holds at the end, and at the peak
    w = hand_window(window_size, ranges, window)
    assert sorted(spy.writes) == list(range(N - 1)), "every chunk but the last is written once"
    held = kept(N - 1, w, sink)
    assert rep["window_chunks"] == w and len(spy.entries) == len(held) and spy.entries_after == N - 1
    config = pack_module("runtime.config").get_config(model.model_options)
    spec_k = None if config is None else config.spec_k
    spec_v = None if config is None else config.spec_v
    if cell.column == "tiers":
        bits_k = position_bits(len(held), min(sink, len(held)), 2, 8, 8)
        bits_v = position_bits(len(held), min(sink, len(held)), 2, 4, 8)
    else:
        bits_k = bits_v = [None if spec_k is None else spec_k.bits] * len(held)
    layers, heads, d = TINY.num_layers, TINY.num_query_groups, TINY.kv_channels

    def at(spec, bits):
        return None if spec is None else replace(spec, bits=bits)

    one_layer = sum(
        jk_cache().chunk_bytes(at(spec_k, bk), at(spec_v, bv), heads, TOKENS, d, full_bytes=4)
        for bk, bv in zip(bits_k, bits_v)
    )
    assert rep["planned_bytes"] == layers * one_layer, (rep["planned_bytes"], layers * one_layer)
    assert memory_requests == [rep["planned_bytes"]]
    assert rep["memory_request"]["bytes"] == rep["planned_bytes"] == rep["cache_bytes"] > 0
    if quant is not None:
        assert rep["correction"] == correction[0]
        assert [e.k.spec.bits for e in spy.entries] == bits_k and [e.v.spec.bits for e in spy.entries] == bits_v
        for entry, c in zip(spy.entries, held):
            _check_stored(jk, entry, spy.writes[c], spec_k, cell.column, first_bits=_first_bits(cell, c, sink))
        return
    # full precision: the samples against the pure sampler with the reference's buffer, or the rule written above
    dm = model.model.diffusion_model
    special = {k: v.float() for k, v in dm.special_tokens.items()}
    caps = chunk_captions(a[0][0][0], N, special)
    if cell.column == "prompts":
        other = chunk_captions(b[0][0][0], N, special)
        caps = [caps[c] if c < 2 else other[c] for c in range(N)]
    noise = torch.randn(1, 16, N, 8, 8, generator=torch.Generator().manual_seed(3))
    settings = MagiSettings(
        num_steps=steps, window_size=window_size, chunk_width=1, noise2clean_kvrange=ranges, cfg_number=cfg_number,
        distill=distill,
    )  # fmt: skip
    attention = retained_attention(window, sink) if window else None
    want = sample(dm, noise, caps, settings, attention=attention)
    got = result.samples * SCALE
    assert float((got - want).abs().max()) <= 1e-5 * float(want.abs().max()), cell.id


def jk_cache():
    return pack_module("jensen_core.cache")


def _first_bits(cell, chunk, sink):
    """The bits a chunk was first stored at: the sink's (8) in the sink, the newest chunk's (8 / 4) otherwise."""
    if cell.column != "tiers":
        return None
    return (8, 8) if chunk < sink else (8, 4)


def _check_stored(jk, entry, raw, spec, column, first_bits):
    for i, (stored, x) in enumerate(((entry.k, raw[0]), (entry.v, raw[1]))):
        s = replace(spec, bits=stored.spec.bits)
        if column.startswith("qvg"):
            err = (stored.dequantize(dtype=torch.float32, rotated=True) - jk.rotate(x.float(), spec.seed)).abs()
            assert bool((err <= stored.step_sizes().repeat_interleave(16, -1) / 2 * 1.001 + 1e-5).all()), column
            continue
        exact = jk.quantize(x, s)
        if first_bits is None or stored.spec.bits == first_bits[i]:  # never demoted: bit for bit
            assert torch.equal(stored.packed, exact.packed), (column, i)
            assert torch.equal(stored.scale, exact.scale) and torch.equal(stored.minimum, exact.minimum)
        else:  # demoted from its first bits: within its own and the first form's half-steps of the raw
            first = jk.quantize(x, replace(spec, bits=first_bits[i]))
            err = (stored.dequantize(dtype=torch.float32, rotated=True) - jk.rotate(x.float(), spec.seed)).abs()
            steps = stored.step_sizes().repeat_interleave(16, -1) + first.step_sizes().repeat_interleave(16, -1)
            assert bool((err <= steps / 2 * 1.001 + 1e-5).all()), (column, i)
