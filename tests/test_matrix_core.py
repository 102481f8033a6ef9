"""The combination matrix's pure-core crossings (no ComfyUI): age tiers crossed with rotation, sink, keys and
values apart, the planner and the block in flight, each against an independent computation.

- an aged chunk is requantized in the space its codes live in: its reconstruction is within its own half-step
  plus its earlier form's half-step of the raw chunk, in the rotated space (Hadamard) or the plain one;
- a chunk that never left its tier is exactly its raw K/V quantized at its bits (the sink's, the newest's);
- each side follows its own tier, keys and values apart;
- the planner's bits per held chunk, per side, are the tiers' positions written plainly here, its effective
  bits their averages, its bytes what a ChunkCache fed as many chunks really holds, for every side;
- the block in flight of core's AR path is planned at what ChunkCache.prepare really holds.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from jensen_core import ChunkCache, QuantSpec, quantize, rotate
from jensen_core.cache import chunk_bytes
from jensen_core.geometry import LatentGeometry
from jensen_core.planner import CachePrecision, CacheShape, block_in_flight_bytes
from jensen_core.tiers import AgeTiers
from jensen_testing.planning import plan_video

B, H, T, D, G = 1, 2, 8, 32, 16
WAN = LatentGeometry((1, 2, 2), 16)

#: (name, tiers, window, sink): keys and values at different bits, with and without a sink
TIER_CASES = [
    ("recent_k8_v4_sink8", AgeTiers(recent_bits=4, recent_chunks=1, sink_bits=8, recent_key_bits=8), 2, 1),
    ("values_only", AgeTiers(recent_bits=4, recent_chunks=2, recent_key_bits=0), 3, 0),
    ("keys_only_sink4", AgeTiers(recent_bits=0, recent_chunks=1, sink_bits=4, recent_key_bits=8), 2, 1),
    ("sink_only", AgeTiers(sink_bits=8), 2, 2),
]


def chunks(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(B, H, T, D, generator=g) * 3, torch.randn(B, H, T, D, generator=g)) for _ in range(n)]


def positions(tiers: AgeTiers, side: str, n: int, sink_held: int, base: int = 2) -> list[int]:
    """Bits of each of n held chunks (oldest first), written plainly from the tiers' rule."""
    recent = tiers.recent_key_bits if side == "k" and tiers.recent_key_bits is not None else tiers.recent_bits
    out = []
    for i in range(n):
        b = base
        if i < sink_held and tiers.sink_bits:
            b = max(b, tiers.sink_bits)
        if recent and i >= n - tiers.recent_chunks:
            b = max(b, recent)
        out.append(b)
    return out


def first_bits(tiers: AgeTiers, side: str, in_sink: bool, base: int = 2) -> int:
    """The bits a chunk is stored at when appended: the newest chunk's, the sink's while the sink fills."""
    recent = tiers.recent_key_bits if side == "k" and tiers.recent_key_bits is not None else tiers.recent_bits
    b = max(base, recent if tiers.recent_chunks else 0)
    return max(b, tiers.sink_bits) if in_sink else b


def held_history(n, window, sink):
    """(index of each appended chunk held at the end, whether it went into the sink)."""
    held, sink_held = [], 0
    for i in range(n):
        in_sink = sink_held < sink
        held.append((i, in_sink))
        sink_held += in_sink
        while window and len(held) - sink_held > window:
            del held[sink_held]
    return held, sink_held


@pytest.mark.parametrize("rotation", ["hadamard", "none"])
@pytest.mark.parametrize("name,tiers,window,sink", TIER_CASES, ids=[c[0] for c in TIER_CASES])
def test_every_held_chunk_is_its_raw_chunk_at_its_bits_or_a_demotion_in_the_codes_space(
    name, tiers, window, sink, rotation
):
    spec = QuantSpec(bits=2, group_size=G, rotation=rotation, seed=5)
    cache = ChunkCache(spec, spec, window_chunks=window, sink_chunks=sink, tiers=tiers)
    data = chunks(6)
    for k, v in data:
        cache.append(k, v)
    held, sink_held = held_history(len(data), window, sink)
    assert len(cache.entries) == len(held)
    for side, pick in (("k", 0), ("v", 1)):
        want = positions(tiers, side, len(held), sink_held)
        got = [getattr(e, side).spec.bits for e in cache.entries]
        assert got == want, (side, got, want)
        for e, (i, in_sink), b in zip(cache.entries, held, want):
            stored, raw = getattr(e, side), data[i][pick]
            b0 = first_bits(tiers, side, in_sink)
            if b == b0:  # never demoted: exactly the raw chunk quantized at its bits
                exact = quantize(raw, replace(spec, bits=b))
                assert torch.equal(stored.packed, exact.packed) and torch.equal(stored.scale, exact.scale)
                assert torch.equal(stored.minimum, exact.minimum)
                continue
            # demoted from b0: within its own and its first form's half-steps of the raw, where the codes live
            first = quantize(raw, replace(spec, bits=b0))
            target = rotate(raw, spec.seed) if rotation == "hadamard" else raw
            err = (stored.dequantize(dtype=torch.float32, rotated=True) - target).abs()
            half = (stored.step_sizes() + first.step_sizes()).repeat_interleave(G, -1) / 2
            assert bool((err <= half * 1.001 + 1e-6).all()), (side, float((err - half).max()))


@pytest.mark.parametrize("name,tiers,window,sink", TIER_CASES, ids=[c[0] for c in TIER_CASES])
@pytest.mark.parametrize("n", [1, 2, 4, 7])
def test_the_planner_projects_each_side_as_a_cache_holds_it(name, tiers, window, sink, n):
    """plan_cache's bits per held chunk and side == the tiers' positions (written plainly); its effective bits their
    averages; its bytes == a ChunkCache fed the written chunks, key side and value side apart."""
    spec = QuantSpec(bits=2, group_size=G, rotation="hadamard")
    tpf = 4  # a 4 x 4 latent
    shape = CacheShape(layers=1, heads=H, head_dim=D, geometry=WAN, full_bytes=4)
    precision = CachePrecision(spec_k=spec, spec_v=spec, tiers=tiers)
    plan = plan_video((n * 2, 4, 4), 2, window, shape, precision=precision, sink_chunks=sink)
    written = n - 1  # the last chunk is never written (no kv_cache output)
    held, sink_held = held_history(written, window, sink)
    bits_k = positions(tiers, "k", len(held), sink_held)
    bits_v = positions(tiers, "v", len(held), sink_held)
    assert list(plan.chunk_bits_k) == bits_k and list(plan.chunk_bits_v) == bits_v
    if held:
        eb = {b: replace(spec, bits=b).effective_bits for b in (2, 3, 4, 8)}
        assert plan.effective_bits_k == pytest.approx(sum(eb[b] for b in bits_k) / len(held))
        assert plan.effective_bits_v == pytest.approx(sum(eb[b] for b in bits_v) / len(held))
    cache = ChunkCache(spec, spec, window_chunks=window, sink_chunks=sink, tiers=tiers)
    g = torch.Generator().manual_seed(1)
    for _ in range(written):
        k = torch.randn(B, H, 2 * tpf, D, generator=g)
        cache.append(k, torch.randn(k.shape, generator=g))
    key_bytes = sum(e.k.nbytes for e in cache.entries)
    value_bytes = sum(e.v.nbytes for e in cache.entries)
    assert key_bytes == sum(chunk_bytes(replace(spec, bits=b), None, B * H, 2 * tpf, D, 0) for b in bits_k)
    assert value_bytes == sum(chunk_bytes(replace(spec, bits=b), None, B * H, 2 * tpf, D, 0) for b in bits_v)
    assert plan.quantized_bytes == key_bytes + value_bytes == cache.nbytes


@pytest.mark.parametrize("name,tiers,window,sink", TIER_CASES, ids=[c[0] for c in TIER_CASES])
@pytest.mark.parametrize("method", ["rtn", "qvg"])
def test_the_block_in_flight_is_planned_as_prepare_holds_it(name, tiers, window, sink, method):
    """Core's AR path holds each block as ChunkCache.prepare stores it (the first block: the sink's bits while it
    fills); QVG waits in the model's dtype. block_in_flight_bytes projects exactly that, for every side."""
    spec = QuantSpec(bits=2, group_size=G, rotation="hadamard", method=method)
    tiers = tiers if method == "rtn" else None
    k, v = chunks(1)[0]
    cache = ChunkCache(spec, spec, window_chunks=window, sink_chunks=sink, tiers=tiers)
    held = cache.prepare(k, v).nbytes if method == "rtn" else k.nbytes + v.nbytes
    planned = block_in_flight_bytes(
        block_tokens=T,
        shape=CacheShape(layers=1, heads=H, head_dim=D, full_bytes=4),
        precision=CachePrecision(spec_k=spec, spec_v=spec, tiers=tiers),
    )
    if tiers is not None and tiers.sink_bits and not sink:
        assert planned >= held  # no sink: the planner's sink bits are an upper bound
        return
    assert planned == held
