"""Rules a wrong line could break while every other test still passed: which chunks window + sink keep
(in the cache and in the chunk loop's retained latents), and when the planner warns about QVG's centroid cost."""

from __future__ import annotations

import pytest
import torch
from support.pack import load_pack_module

from jensen_core import ChunkCache, QuantSpec, Retained, Retention
from jensen_core.planner import CachePrecision, CacheShape, LatentGeometry
from jensen_testing.planning import plan_by_fields, plan_video


@pytest.mark.parametrize(
    "window,sink,chunks,kept",
    [(1, 1, 4, [0, 3]), (2, 1, 5, [0, 3, 4]), (1, 2, 5, [0, 1, 4]), (2, 0, 4, [2, 3]), (0, 1, 3, [0, 1, 2])],
)
def test_the_sink_stays_and_the_window_rolls(window, sink, chunks, kept):
    """Window 1 + sink 1 over 4 chunks keeps [0, 3]: a rule that evicts the sink instead keeps [2, 3]."""
    cache = ChunkCache(None, None, window_chunks=window, sink_chunks=sink)
    marks = []
    for c in range(chunks):
        k = torch.full((1, 1, 2, 8), float(c))
        cache.append(k, k)
        marks = [int(e.k[0, 0, 0, 0]) for e in cache.entries]
    assert marks == kept

    retained = load_pack_module("runtime.saved_run").RetainedChunk
    timeline = Retained(Retention(window, sink))  # what the chunk loop keeps the clean latents in
    for c in range(chunks):
        timeline.add(retained(c, 2 * c, torch.zeros(1, 16, 2, 2, 2)))
    assert [r.chunk for r in timeline.items] == kept


def _plan_64_token_chunks(spec_k=None, spec_v=None):
    """4 chunks of 64 tokens (1 latent frame of 8 x 8 tokens: 16 x 16 latent pixels), one head of 64 channels."""
    shape = CacheShape(layers=1, heads=1, head_dim=64, geometry=LatentGeometry(patch=(1, 2, 2), latent_channels=16))
    return plan_video((4, 16, 16), 1, 0, shape, precision=CachePrecision(spec_k=spec_k, spec_v=spec_v))


@pytest.mark.parametrize("centroids,warns", [(8, True), (4, False)])
def test_qvg_centroid_cost_warning_at_two_bits(centroids, warns):
    """On 64-token chunks, 8 BF16 centroids cost 8 x 16 / 64 = 2 bits per element: as much as the INT2 residual."""
    spec = QuantSpec(bits=2, group_size=32, method="qvg", qvg_centroids=centroids)
    plan = _plan_64_token_chunks(spec_k=spec)
    hits = [w for w in plan.warnings if "centroids cost" in w]
    assert bool(hits) == warns, plan.warnings
    if warns:
        assert "2.00 bits/element on chunks of 64 tokens" in hits[0] and "lower K" in hits[0]


@pytest.mark.parametrize("centroids,every_token", [(64, True), (63, False)])
def test_qvg_with_as_many_centroids_as_tokens_is_named_as_such(centroids, every_token):
    """K equal to a chunk's 64 tokens makes every token its own BF16 centroid: that warning, not only the cost one."""
    spec = QuantSpec(bits=2, group_size=32, method="qvg", qvg_centroids=centroids)
    plan = _plan_64_token_chunks(spec_v=spec)
    hits = [w for w in plan.warnings if "keeps every token as a BF16 centroid" in w]
    assert bool(hits) == every_token, plan.warnings
    assert every_token or any("centroids cost" in w for w in plan.warnings)


def _plan(**kw):
    video = dict(latent=(4, 16, 16), chunk_frames=1, window_chunks=0)
    model = dict(layers=1, heads=1, head_dim=64, spec_k=None, spec_v=None)
    args = dict(**video, **model, geometry=LatentGeometry(patch=(1, 2, 2), latent_channels=16))
    return plan_by_fields(**{**args, **kw})


@pytest.mark.parametrize("window,sink,warns", [(2, 2, True), (3, 1, True), (2, 1, False), (4, 0, True), (3, 0, False)])
def test_a_window_plus_sink_that_holds_the_whole_video_is_warned_about(window, sink, warns):
    """4 chunks: a window of 2 plus a sink of 2 keeps every chunk (as window 0 would); 2 + 1 does evict."""
    plan = _plan(window_chunks=window, sink_chunks=sink)
    assert any("is not smaller than the video's 4 chunks" in w for w in plan.warnings) == warns, plan.warnings


def test_the_cache_file_size_counts_every_cfg_branch():
    """A second CFG branch adds as many cache bytes to the saved file as a second layer does."""
    one = _plan(window_chunks=2, sink_chunks=1)
    branch = _plan(window_chunks=2, sink_chunks=1, cfg_branches=2).state_file_bytes - one.state_file_bytes
    layer = _plan(window_chunks=2, sink_chunks=1, layers=2).state_file_bytes - one.state_file_bytes
    assert branch == layer > 0
