"""Outputs that refactors must leave bit-identical (jensen_testing/golden_runs.py): every recipe on the pack's
sampler, core's AR path (v0.27+), save and continue, tiers, QVG, a prefix clip and prompt switches, each against
the SHA-256 of its output recorded for this ComfyUI version in tests/data/golden_runs.json
(``python tools/golden_runs.py --record`` rewrites an entry when a change is meant to alter outputs)."""

from __future__ import annotations

import json

import pytest

from jensen_testing.golden_runs import GOLDEN_FILE, RUNS, compute, version_key


def _params():
    for run in RUNS:
        marks = [pytest.mark.core_ar] if run.core_ar else []
        yield pytest.param(run, id=run.name, marks=marks)


@pytest.fixture(scope="module")
def recorded(comfy):
    data = json.loads(GOLDEN_FILE.read_text())
    version = version_key(comfy)
    assert version in data, f"no golden runs recorded for ComfyUI {version}: python tools/golden_runs.py --record"
    return data[version]


@pytest.mark.parametrize("run", _params())
def test_output_is_bit_identical_to_the_recorded_one(pack, recorded, run):
    assert run.name in recorded, f"{run.name} not recorded: python tools/golden_runs.py --record --only {run.name}"
    got = compute(run)
    for key, want in recorded[run.name].items():
        assert got[key]["shape"] == want["shape"], key
        assert got[key]["sha256"] == want["sha256"], (
            f"{run.name} {key}: sum {got[key]['sum']!r} (recorded {want['sum']!r}), abs sum {got[key]['abs_sum']!r} "
            f"(recorded {want['abs_sum']!r})"
        )
