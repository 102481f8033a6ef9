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
def magi1(pack):
    return pack_module("runtime.families.magi1.recipe")


@pytest.fixture(scope="module")
def window(pack):
    return pack_module("runtime.families.magi1.window")


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
