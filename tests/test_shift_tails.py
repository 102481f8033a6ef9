"""Tail metrics (issue 40, item 6): the 95th / 99th percentiles of |ΔP_S| per head and the worst head."""

from __future__ import annotations

import pytest
import torch

from jensen_core.attention_shift import ShiftStats
from jensen_core.shift_summary import ShiftAccumulator


def _stats(d):
    return ShiftStats(delta_ps=d.reshape(-1), jsd=torch.zeros(d.numel()), output_mse=0.0)


def test_per_head_tails_and_the_worst_head():
    g = torch.Generator().manual_seed(0)
    acc = ShiftAccumulator()
    calls = []
    for _ in range(3):  # batch 2, 3 heads, 50 queries; head 1 has a heavy negative tail
        d = torch.randn(2, 3, 50, generator=g) * 0.01
        d[:, 1, :3] = -0.5
        calls.append(d)
        acc.add(_stats(d), 10, ["h0", "h1", "h2"], batch=2)
    s = acc.summary()
    every = torch.cat([c[:, 1].reshape(-1) for c in calls])
    assert s["worst_head"]["head"] == "h1"
    torch.testing.assert_close(
        torch.tensor(s["per_head"]["h1"]["p99_abs_delta_ps"]), torch.quantile(every.abs(), 0.99), rtol=1e-5, atol=1e-7
    )
    assert s["per_head"]["h0"]["p99_abs_delta_ps"] < 0.05 < s["per_head"]["h1"]["p95_abs_delta_ps"]
    assert s["per_head"]["h1"]["samples"] == 300
    allq = torch.cat([c.reshape(-1) for c in calls]).abs()
    torch.testing.assert_close(torch.tensor(s["p95_abs_delta_ps"]), torch.quantile(allq, 0.95), rtol=1e-5, atol=1e-7)


def test_without_head_labels_the_overall_tails_remain_and_bad_labels_are_refused():
    acc = ShiftAccumulator()
    assert acc.summary()["worst_head"] is None
    acc.add(_stats(torch.linspace(-1, 1, 101)), 1)
    s = acc.summary()
    assert s["per_head"] == {} and s["worst_head"] is None and s["p99_abs_delta_ps"] == pytest.approx(0.99, abs=0.011)
    with pytest.raises(ValueError, match="do not split over batch 1 x 3 head labels"):
        acc.add(_stats(torch.zeros(10)), 1, ["a", "b", "c"])
