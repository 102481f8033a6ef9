"""Outputs that refactors must leave unchanged (jensen_testing/golden_runs.py): every recipe on the pack's sampler,
core's AR path (v0.27+), save and continue, tiers, QVG, a prefix clip and prompt switches, each against its output
recorded for this ComfyUI version (tests/data/golden_runs.safetensors; ``python tools/golden_runs.py --record``
rewrites an entry when a change is meant to alter outputs).

The comparison is within float32 rounding, not bit for bit: another CPU's BLAS and vectorised kernels round
otherwise. The bound (jensen_testing/numerics.py) is 3.2e-5 in relative L2: the tiny Wan's 2 blocks with
reductions up to 256, and its timestep sinusoid; three kernel sets on one machine (native AVX-512 with AMX, AVX2,
ATen's default) differ by at most 6.4e-7. The number of Wan blocks a run evaluates must equal the recorded one. The planted-bug tests show that the bound still catches a
behaviour change: one layer attending without its correction, one model call with its timestep 10 % off.
"""

from __future__ import annotations

import pytest

from jensen_testing.golden_runs import PLANTS, RUNS, compute, differences, load_recorded, planted, version_key
from jensen_testing.numerics import relative_error


def _params():
    for run in RUNS:
        marks = [pytest.mark.core_ar] if run.core_ar else []
        yield pytest.param(run, id=run.name, marks=marks)


@pytest.fixture(scope="module")
def recorded(comfy):
    version = version_key(comfy)
    data = load_recorded(version)
    assert data, f"no golden runs recorded for ComfyUI {version}: python tools/golden_runs.py --record"
    return data


@pytest.mark.numerics
@pytest.mark.parametrize("run", _params())
def test_output_matches_the_recorded_one_within_float32_rounding(pack, recorded, run):
    assert run.name in recorded, f"{run.name} not recorded: python tools/golden_runs.py --record --only {run.name}"
    got = compute(run)
    assert not differences(got, recorded[run.name]), differences(got, recorded[run.name])


#: which planted bug each run must catch: the wrong timestep everywhere; the uncorrected layer wherever the cache
#: holds INT2 keys (at INT4 the correction is 25 times smaller, (3/15)^2, and leaves the tiny model's output within
#: the bound: 0.5 times it)
CAUGHT = [(run, "one_wrong_timestep") for run in RUNS] + [
    (run, "one_layer_uncorrected") for run in RUNS if run.name != "self_forcing_lcm_int4"
]


@pytest.mark.parametrize(
    "run, plant",
    [pytest.param(r, p, id=f"{r.name}-{p}", marks=[pytest.mark.core_ar] if r.core_ar else []) for r, p in CAUGHT],
)
def test_a_planted_bug_moves_the_output_past_the_bound(pack, recorded, run, plant):
    """The bound is not so loose that a one-line bug passes: the planted run differs from the recording by more
    than the bound (and the plant is undone afterwards: the next run is unaffected)."""
    assert plant in PLANTS
    want = recorded[run.name]
    with planted(plant):
        got = compute(run)
    worst = max(relative_error(got.outputs[k], want.outputs[k]) for k in want.outputs)
    assert worst > want.bound().value, f"{plant} moved {run.name} by {worst:.3g} only (bound {want.bound()})"
