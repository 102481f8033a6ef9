"""The sink + window retention rule (jensen_core.retention): one class, and the planner, the cache and the
run's other followers agreeing with it for random chunk counts, windows, sinks and chunk lengths."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jensen_core import ChunkCache, QuantSpec, Retained, Retention
from jensen_core.planner import CachePrecision, CacheShape, LatentGeometry, plan_cache
from jensen_core.tiers import AgeTiers

GEOMETRY = LatentGeometry(patch=(1, 2, 2), latent_channels=16)  # Wan's


def test_window_one_and_sink_one_keep_the_first_and_the_last():
    rule = Retention(1, 1)
    assert rule.indices(4) == [0, 3] and rule.count(4) == 2 and rule.sink_held(4) == 1
    assert Retention(2, 1).indices(5) == [0, 3, 4] and Retention(1, 2).indices(5) == [0, 1, 4]
    assert Retention(0, 1).indices(3) == [0, 1, 2]  # no window: the sink changes nothing
    assert Retention(3, 2).indices(1) == [0] and Retention(3, 2).indices(0) == []


def test_no_window_is_none_or_zero_and_unbounded():
    assert Retention(0, 2) == Retention(None, 2) and Retention(0).window_chunks is None
    assert not Retention().bounded and Retention().capacity is None
    assert Retention(4, 1).bounded and Retention(4, 1).capacity == 5
    assert Retention().count(1000) == 1000


@pytest.mark.parametrize(
    "kwargs,named",
    [
        ({"window_chunks": -1}, "window_chunks=-1"),
        ({"window_chunks": 2.0}, "window_chunks=2.0"),
        ({"window_chunks": True}, "window_chunks=True"),
        ({"sink_chunks": -2}, "sink_chunks=-2"),
        ({"sink_chunks": None}, "sink_chunks=None"),
    ],
)
def test_a_bad_window_or_sink_is_named(kwargs, named):
    with pytest.raises(ValueError, match=named):
        Retention(**kwargs)


def test_a_bad_count_or_sink_held_is_named():
    with pytest.raises(ValueError, match="appended=-1"):
        Retention(2).count(-1)
    with pytest.raises(ValueError, match="sink_held=3"):
        Retained(Retention(1, 2), ["a", "b", "c"], sink_held=3)
    with pytest.raises(TypeError, match="Retention"):
        Retained((1, 1))


def test_push_never_evicts_the_sink_and_reports_what_it_dropped():
    rule, items, held = Retention(2, 1), [], 0
    log = []
    for c in range(6):
        held, evicted = rule.push(items, c, held)
        log.append(evicted)
    assert items == [0, 4, 5] and held == 1 and log == [0, 0, 0, 1, 1, 1]


def test_retained_resumes_with_its_sink():
    """A run continued from [0, 3] (window 1, sink 1) keeps the sink chunk 0 and rolls the window."""
    kept = Retained(Retention(1, 1), [0, 3])
    assert kept.sink_held == 1
    assert kept.add(4) == 1 and kept.items == [0, 4]
    # a sink not full yet (sink 2, one chunk written) takes the next chunk too
    young = Retained(Retention(1, 2), [0])
    assert young.sink_held == 1 and young.add(1) == 0 and young.add(2) == 0 and young.add(3) == 1
    assert young.items == [0, 1, 3]


@given(window=st.integers(0, 6), sink=st.integers(0, 4), appended=st.integers(0, 20))
def test_the_rule_counts_what_it_keeps(window, sink, appended):
    rule = Retention(window, sink)
    idx = rule.indices(appended)
    assert len(idx) == rule.count(appended) and idx == sorted(set(idx)) and all(0 <= i < appended for i in idx)
    assert rule.count(appended) <= rule.count(appended + 1)
    assert idx[: rule.sink_held(appended)] == list(range(min(sink, appended)))
    if rule.capacity is not None:
        assert rule.count(appended) == min(appended, rule.capacity)
    items, held = [], 0
    for c in range(appended):
        held, _ = rule.push(items, c, held)
    assert items == idx


SPECS = [None, QuantSpec(bits=4, group_size=32), QuantSpec(bits=2, group_size=16)]
TIERS = [
    None,
    AgeTiers(recent_bits=4, recent_chunks=1),
    AgeTiers(8, 2, 4),
    AgeTiers(sink_bits=8),
    AgeTiers(4, 1, recent_key_bits=0),  # values only
    AgeTiers(4, 2, 8, recent_key_bits=3),
]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    chunks=st.integers(1, 7),
    prefix_chunks=st.integers(0, 3),
    window=st.integers(0, 5),
    sink=st.integers(0, 3),
    chunk_frames=st.integers(1, 3),
    tokens_per_frame=st.integers(1, 3),
    heads=st.integers(1, 2),
    spec=st.sampled_from(SPECS),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    write_last=st.booleans(),
    tiers=st.sampled_from(TIERS),
    value_spec=st.sampled_from(SPECS),
)
def test_the_planner_projects_what_the_cache_holds(
    chunks,
    prefix_chunks,
    window,
    sink,
    chunk_frames,
    tokens_per_frame,
    heads,
    spec,
    dtype,
    write_last,
    tiers,
    value_spec,
):
    """The planner's chunks, tokens, BF16 bytes, stored bytes and state file equal a real ChunkCache's after the
    chunks the run writes; the cache holds exactly the chunks the rule names (window 0 = unbounded). Under age
    tiers each chunk counts at its own bits: the planner's bits per held chunk are the cache's."""
    head_dim = 32
    plan = plan_cache(
        latent_frames=chunks * chunk_frames,
        latent_height=2,
        latent_width=2 * tokens_per_frame,
        chunk_frames=chunk_frames,
        window_chunks=window,
        sink_chunks=sink,
        write_last=write_last,
        prefix_frames=prefix_chunks * chunk_frames,
        shape=CacheShape(
            layers=1, heads=heads, head_dim=head_dim, geometry=GEOMETRY, full_bytes=torch.finfo(dtype).bits // 8
        ),
        precision=CachePrecision(spec_k=spec, spec_v=value_spec, tiers=tiers),
    )
    rule = Retention(window, sink)
    cache = ChunkCache(spec, value_spec, window_chunks=window, sink_chunks=sink, tiers=tiers)
    tokens = chunk_frames * tokens_per_frame
    written = prefix_chunks + chunks - (0 if write_last else 1)
    peak = (0, 0, 0, 0)
    gen = torch.Generator().manual_seed(written)
    for c in range(written):
        k = torch.randn(1, heads, tokens, head_dim, generator=gen).to(dtype)
        cache.append(k, torch.full((1, heads, tokens, head_dim), float(c), dtype=dtype))  # values mark the chunk
        peak = max(peak, (cache.num_chunks, cache.tokens, cache.nbytes, cache.bf16_nbytes))
    marks = [
        int(e.v.dequantize(torch.float32)[0, 0, 0, 0].round()) if value_spec else int(e.v[0, 0, 0, 0])
        for e in cache.entries
    ]
    assert marks == rule.indices(written)
    bits = [[0 if not hasattr(t, "spec") else t.spec.bits for t in (e.k, e.v)] for e in cache.entries]
    assert [list(p) for p in zip(plan.chunk_bits_k, plan.chunk_bits_v)] == bits
    assert cache.chunks_evicted == written - rule.count(written)
    assert plan.cached_chunks_peak == peak[0] == rule.count(written)
    assert plan.cached_tokens_peak == peak[1]
    assert plan.quantized_bytes == peak[2]
    assert plan.bf16_bytes == peak[3]
    if tiers is not None and cache.num_chunks and (spec or value_spec):
        n = sum(e.numel for e in cache.entries)
        assert plan.effective_bits == pytest.approx(cache.nbytes * 8 / n, rel=1e-12)
    if write_last:  # the state file: the cache at the end plus the fp32 clean latents of the chunks it holds
        latents = cache.num_chunks * chunk_frames * 2 * 2 * tokens_per_frame * GEOMETRY.latent_channels * 4
        assert plan.state_file_bytes == cache.nbytes + latents
    followers = Retained(rule)  # what the chunk loop and the diagnostics keep their copies in
    for c in range(written):
        followers.add(c)
    assert followers.items == rule.indices(written)


# ----------------------------------------------------------------------------- LongLive's local_attn_size / sink_size
def longlive_attended_frames(local_attn_size: int, sink_size: int, block: int, blocks: int) -> list[list[int]]:
    """For each block b < ``blocks``, the earlier latent frames LongLive's self-attention sees while generating it.

    The reference's index arithmetic (NVlabs/LongLive 2462895, ``wan/modules/causal_model.py`` 212-347,
    ``pipeline/causal_inference.py`` 110-118), one token per frame: a cache of ``local_attn_size`` slots;
    a block's write rolls the slots after the sink left by the overflow when it does not fit, then writes
    its frames at ``local_end``; attention reads the first ``sink`` slots and the slots from
    ``max(sink, local_end - (max_attention_size - sink))`` to ``local_end``, max_attention_size =
    local_attn_size. The block's own frames are dropped from the result (the pack attends them from the
    activations, outside the cache), and so are slots not yet written (None: the reference's zero-filled
    cache, which its attention does read while a sink of more than one block is filling)."""
    size, sink, max_att = local_attn_size, sink_size, local_attn_size
    cache: list[int | None] = [None] * size
    global_end = local_end = 0
    seen = []
    for b in range(blocks):
        start, new = b * block, block
        end = start + new
        if end > global_end and new + local_end > size:
            evicted = new + local_end - size
            rolled = local_end - evicted - sink
            cache[sink : sink + rolled] = cache[sink + evicted : sink + evicted + rolled]
            local_end = local_end + end - global_end - evicted
        else:
            local_end = local_end + end - global_end
        cache[local_end - new : local_end] = list(range(start, end))
        global_end = end
        window = cache[:sink] + cache[max(sink, local_end - (max_att - sink)) : local_end]
        assert set(range(start, end)) <= set(window)  # the block attends to itself
        seen.append(sorted(f for f in window if f is not None and f < start))
    return seen


@pytest.mark.parametrize(
    "local,sink,block",
    [(12, 3, 3), (21, 3, 3), (24, 3, 3), (12, 0, 3), (15, 6, 3), (8, 2, 2), (10, 5, 1)],
)
def test_local_attn_size_and_sink_size_map_to_what_longlive_attends(local, sink, block):
    rule = Retention.from_local_attention(local, sink, block)
    for n, frames in enumerate(longlive_attended_frames(local, sink, block, blocks=12)):
        chunks = rule.indices(n)  # n chunks finished before block n
        assert [c * block + i for c in chunks for i in range(block)] == frames, (n, chunks, frames)


def test_longlive_1_0_is_a_window_of_two_chunks_and_a_sink_of_one():
    """configs/longlive_inference.yaml: local_attn_size 12, sink_size 3, num_frame_per_block 3."""
    assert Retention.from_local_attention(12, 3, 3) == Retention(window_chunks=2, sink_chunks=1)
    assert Retention.from_local_attention(12, 3, 3).indices(6) == [0, 4, 5]
    assert longlive_attended_frames(12, 3, 3, blocks=7)[6] == [0, 1, 2, 12, 13, 14, 15, 16, 17]
    assert Retention.from_local_attention(-1, 3, 3) == Retention()  # global attention


@pytest.mark.parametrize(
    "args,match",
    [
        ((12, 4, 3), "sink_size=4 latent frames is not a whole number of 3-frame chunks"),
        ((13, 3, 3), "local_attn_size=13"),
        ((6, 3, 3), "leaves no earlier chunk besides the sink .* at least sink_size \\+ 2 x chunk_frames = 9"),
        ((12, 3, 0), "chunk_frames=0"),
        ((12.0, 3, 3), "must be an integer"),
        ((-3, 0, 3), "local_attn_size=-3"),
    ],
)
def test_local_attention_sizes_that_are_not_whole_chunks_are_refused(args, match):
    with pytest.raises(ValueError, match=match):
        Retention.from_local_attention(*args)
