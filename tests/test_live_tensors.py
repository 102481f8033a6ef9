"""jensen_testing/memory.py's LiveTensors: the bytes of tensors alive at once, counted per storage."""

from __future__ import annotations

import gc

import torch

from jensen_testing.memory import LiveTensors

MIB = 2**20


def test_peak_counts_each_storage_once_and_forgets_freed_ones():
    weight = torch.randn(256, 256)  # made before: never counted, nor its views
    with LiveTensors() as live:
        a = torch.ones(MIB // 4)  # 1 MiB
        view, same = a[10:], a.add_(1)  # a view and an in-place result: the same storage
        b = torch.ones(2 * MIB // 4)  # 2 MiB: 3 alive
        _ = weight.t(), weight[0]
        del a, view, same, b
        gc.collect()
        c = torch.zeros(MIB // 4)  # 1 MiB after the 3 MiB are gone
        assert live.live == MIB
        del c
        gc.collect()
    assert live.peak == 3 * MIB
    assert live.live == 0


def test_a_scope_gives_its_transient_not_what_it_leaves_alive():
    kept = []
    with LiveTensors() as live:
        base = torch.ones(MIB // 4)
        with live.scope("attend"):
            tmp = torch.ones(4 * MIB // 4)  # 4 MiB transient
            kept.append(torch.ones(MIB // 4))  # 1 MiB stored (alive after the scope)
            del tmp
            gc.collect()
        with live.scope("attend"):
            tmp = torch.ones(2 * MIB // 4)
            del tmp
    assert live.transients["attend"] == 4 * MIB
    assert live.peak == 6 * MIB
    del base
