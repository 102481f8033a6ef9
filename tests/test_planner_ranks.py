"""The planner's ``ranks`` (sequence parallelism: every rank holds heads / ranks of every cached token).

Checked against the bytes real ``ChunkCache`` objects hold when each keeps one rank's heads, and
through the web planner's route.
"""

from __future__ import annotations

import pytest
import torch
from support.pack import load_pack_module

from jensen_core import ChunkCache, QuantSpec
from jensen_core.geometry import LatentGeometry
from jensen_testing.planning import plan_by_fields

GEOMETRY = LatentGeometry(patch=(1, 2, 2), latent_channels=16)
INT2 = QuantSpec(bits=2, group_size=16, rotation="hadamard")
QVG = QuantSpec(bits=2, group_size=16, method="qvg", qvg_centroids=4)


def _plan(**kw):
    video = dict(latent=(5, 6, 6), chunk_frames=1, window_chunks=2, sink_chunks=1)
    args = dict(**video, layers=2, heads=4, head_dim=32, spec_k=INT2, spec_v=INT2, geometry=GEOMETRY)
    return plan_by_fields(**{**args, **kw})


@pytest.mark.parametrize("spec", [INT2, QVG, None], ids=["int2", "qvg", "full"])
@pytest.mark.parametrize("ranks", [2, 4])
def test_one_ranks_bytes_are_what_caches_of_its_heads_hold(spec, ranks):
    """Each rank's caches (2 layers, window 2 + sink 1 over 4 written chunks of 9 tokens) hold the planned bytes."""
    plan = _plan(spec_k=spec, spec_v=spec, ranks=ranks, full_bytes=4)
    gen = torch.Generator().manual_seed(0)
    chunks = [(torch.randn(1, 4, 9, 32, generator=gen), torch.randn(1, 4, 9, 32, generator=gen)) for _ in range(4)]
    per = 4 // ranks
    held = []
    for rank in range(ranks):
        total = 0
        for _layer in range(2):
            cache = ChunkCache(spec, spec, window_chunks=2, sink_chunks=1, head_offset=rank * per)
            for k, v in chunks:
                cache.append(k[:, rank * per : (rank + 1) * per], v[:, rank * per : (rank + 1) * per])
            total += cache.nbytes
        held.append(total)
    assert held == [plan.quantized_bytes] * ranks
    assert plan.quantized_bytes_all_ranks == sum(held) == _plan(spec_k=spec, spec_v=spec, full_bytes=4).quantized_bytes
    assert plan.bf16_bytes * ranks == plan.bf16_bytes_all_ranks == _plan(spec_k=spec, spec_v=spec).bf16_bytes
    assert plan.ranks == ranks and plan.effective_bits == _plan(spec_k=spec, spec_v=spec, full_bytes=4).effective_bits


def test_heads_that_do_not_divide_by_the_ranks_cannot_run():
    plan = _plan(ranks=3)
    assert not plan.runnable and plan.quantized_bytes is None
    assert any("4 heads do not divide by 3 ranks" in e for e in plan.errors), plan.errors
    with pytest.raises(ValueError, match="ranks=0 must be a whole number >= 1"):
        _plan(ranks=0)


def test_one_rank_is_the_plan_as_before():
    one, default = _plan(ranks=1), _plan()
    assert one == default and one.quantized_bytes_all_ranks == one.quantized_bytes


def test_the_web_planner_takes_ranks():
    routes = load_pack_module("routes.ui")
    one = routes.plan_summary({"preset": "wan2.1-14b", "width": "1280", "height": "720", "frames": "81"})
    four = routes.plan_summary({"preset": "wan2.1-14b", "width": "1280", "height": "720", "frames": "81", "ranks": "4"})
    assert four["ranks"] == 4 and one["ranks"] == 1
    assert 4 * four["quantized_bytes"] == four["quantized_bytes_all_ranks"] == one["quantized_bytes"]
    assert 4 * four["bf16_bytes"] == one["bf16_bytes"]
    assert routes.options()["defaults"]["ranks"] == 1
    bad = routes.plan_summary({"preset": "wan2.1-14b", "ranks": "3"})  # 40 heads
    assert not bad["runnable"] and any("40 heads do not divide by 3 ranks" in e for e in bad["errors"])
    with pytest.raises(routes.ParamError, match="ranks"):
        routes.plan_summary({"ranks": "0"})
