"""Precision by head (jensen_core.head_bits): which heads' keys the cache keeps at more bits, that the planner counts
their bytes exactly, and that attention reads a promoted head as RTN at its own bits, corrected with its own steps."""

from __future__ import annotations

import pytest
import torch

from jensen_core import CachePrecision, ChunkCache, QuantSpec, cached_attention, quantize
from jensen_core.attention import CacheEntry
from jensen_core.head_bits import HeadBits, HeadBitsTensor, choose_heads, predicted_head_bias
from jensen_core.planner import LatentGeometry
from jensen_core.quant import cat_quantized
from jensen_core.tiers import AgeTiers
from jensen_testing.planning import plan_by_fields

SPEC = QuantSpec(bits=2, group_size=16, rotation="hadamard", seed=3)
GEOMETRY = LatentGeometry(patch=(1, 2, 2), latent_channels=16)


def _qkv(B=1, Hq=4, H=4, T=12, D=64, seed=0, loud=None, scale=20.0):
    """Queries, keys, values; query head ``loud`` (if any) has a large norm."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, T, D, generator=gen)
    if loud is not None:
        q[:, loud] *= scale
    return q, torch.randn(B, H, T, D, generator=gen) * 2, torch.randn(B, H, T, D, generator=gen)


# ----------------------------------------------------------------------------- the option
def test_head_bits_counts_heads_and_names_bad_values():
    assert [HeadBits(4, 0.25).count(h) for h in (1, 2, 4, 5, 8, 12)] == [1, 1, 1, 2, 2, 3]
    assert HeadBits(8, 1.0).count(6) == 6 and HeadBits(4, 0.5).count(2) == 1
    for bad in (0, 2, 5, True, "4"):
        with pytest.raises(ValueError, match="head_bits=.*use 3, 4 or 8"):
            HeadBits(bad, 0.25)
    for bad in (0, -0.1, 1.5, float("nan"), True):
        with pytest.raises(ValueError, match="head_fraction=.*above 0 and at most 1"):
            HeadBits(4, bad)
    with pytest.raises(ValueError, match="not above key_bits=4"):
        CachePrecision(QuantSpec(bits=4), None, head_bits=HeadBits(4))
    with pytest.raises(ValueError, match="key_bits is off"):
        CachePrecision(None, SPEC, head_bits=HeadBits(4))
    with pytest.raises(ValueError, match="method 'rtn' only"):
        CachePrecision(QuantSpec(bits=2, method="qvg"), None, head_bits=HeadBits(4))
    with pytest.raises(ValueError, match="pick='most' is not supported"):
        HeadBits(4, 0.25, "most")
    with pytest.raises(ValueError, match="cannot be combined yet"):
        CachePrecision(SPEC, SPEC, AgeTiers(4, 1), HeadBits(4))


# ----------------------------------------------------------------------------- which heads
def test_the_head_whose_query_is_loud_is_promoted_and_no_other():
    """One query head with a 20x norm: its K/V head's predicted bias is ~400x the others', so at a quarter of 4 heads
    exactly that head is promoted; with no loud head, a different seed picks by the keys' steps alone."""
    for loud in range(4):
        q, k, v = _qkv(loud=loud)
        score = predicted_head_bias(quantize(k, SPEC), q)
        others = torch.cat([score[:loud], score[loud + 1 :]])
        assert float(score[loud]) > 100 * float(others.max())  # the bias crossed far above the others
        cache = ChunkCache(SPEC, SPEC, head_bits=HeadBits(4, 0.25))
        cache.append(k, v, q)
        assert cache.promoted_heads == (loud,)
        # the choice is fixed for the run: a later chunk with another loud head keeps it
        q2, k2, v2 = _qkv(seed=1, loud=(loud + 1) % 4)
        cache.append(k2, v2, q2)
        assert cache.promoted_heads == (loud,)
        assert all(e.k.heads == (loud,) for e in cache.entries)


def test_the_control_pick_promotes_the_smallest_bias_instead():
    q, k, v = _qkv(loud=2)
    score = predicted_head_bias(quantize(k, SPEC), q)
    cache = ChunkCache(SPEC, SPEC, head_bits=HeadBits(4, 0.25, "smallest"))
    cache.append(k, v, q)
    assert cache.promoted_heads == (int(score.argmin()),) and cache.promoted_heads != (2,)
    assert str(cache.head_bits) == "0.25@4@smallest" and str(HeadBits(4, 0.25)) == "0.25@4"


def test_grouped_query_attention_promotes_per_kv_head():
    # 4 query heads over 2 K/V heads (MAGI-1's layout): query head 3 is loud, so K/V head 1 is promoted
    q, k, v = _qkv(Hq=4, H=2, loud=3)
    cache = ChunkCache(SPEC, SPEC, head_bits=HeadBits(4, 0.5))
    cache.append(k, v, q)
    assert cache.promoted_heads == (1,)
    q, k, v = _qkv(Hq=4, H=2, loud=0)
    cache = ChunkCache(SPEC, SPEC, head_bits=HeadBits(4, 0.5))
    cache.append(k, v, q)
    assert cache.promoted_heads == (0,)


def test_without_queries_the_widest_steps_win_and_ties_go_to_the_lower_head():
    _, k, v = _qkv()
    k[:, 2] *= 10  # wider groups: larger steps
    cache = ChunkCache(SPEC, None, head_bits=HeadBits(4, 0.25))
    cache.append(k, v)
    assert cache.promoted_heads == (2,)
    assert choose_heads(torch.tensor([1.0, 3.0, 3.0, 0.0]), 2) == (1, 2)
    assert choose_heads(torch.tensor([5.0, 5.0, 5.0]), 1) == (0,)


# ----------------------------------------------------------------------------- what is stored
def test_promoted_keys_equal_rtn_at_the_head_bits_and_the_rest_at_the_cache_bits():
    q, k, v = _qkv(B=2, loud=1)
    cache = ChunkCache(SPEC, SPEC, head_bits=HeadBits(8, 0.5))
    cache.append(k, v, q)
    (h,) = [i for i in cache.promoted_heads if i == 1]
    stored = cache.entries[0].k
    assert isinstance(stored, HeadBitsTensor) and stored.shape == k.shape
    hi, lo = quantize(k, QuantSpec(**{**SPEC.to_dict(), "bits": 8})), quantize(k, SPEC)
    promoted = torch.zeros(4, dtype=torch.bool)
    promoted[list(cache.promoted_heads)] = True
    deq, steps = stored.dequantize(torch.float32), stored.step_sizes()
    torch.testing.assert_close(deq[:, promoted], hi.dequantize(torch.float32)[:, promoted], rtol=0, atol=0)
    torch.testing.assert_close(deq[:, ~promoted], lo.dequantize(torch.float32)[:, ~promoted], rtol=0, atol=0)
    torch.testing.assert_close(steps[:, promoted], hi.step_sizes()[:, promoted], rtol=0, atol=0)
    torch.testing.assert_close(steps[:, ~promoted], lo.step_sizes()[:, ~promoted], rtol=0, atol=0)
    # the values are not promoted
    torch.testing.assert_close(
        cache.entries[0].v.dequantize(torch.float32), quantize(v, SPEC).dequantize(torch.float32)
    )
    # the promoted head's keys are closer to the truth; what is stored is the sum of the parts
    err = (deq - k).square().mean(dim=(0, 2, 3))
    assert float(err[h]) < float(err[~promoted].min()) / 50
    assert stored.nbytes == hi[:, promoted].nbytes + lo[:, ~promoted].nbytes
    # batch slicing, flattening and joining along tokens keep the heads in place
    torch.testing.assert_close(stored[1:2].dequantize(torch.float32), deq[1:2], rtol=0, atol=0)
    torch.testing.assert_close(
        stored.flatten_leading().dequantize(torch.float32), deq.reshape(-1, *deq.shape[2:]), rtol=0, atol=0
    )
    joined = cat_quantized([stored, stored])
    torch.testing.assert_close(joined.dequantize(torch.float32), torch.cat([deq, deq], dim=-2), rtol=0, atol=0)


def test_attention_corrects_each_head_with_its_own_steps():
    """Cached attention over a head-bits chunk equals the attention over the same keys in two plain caches, head by
    head: the promoted head read at its bits with its own (small) correction, the others as before."""
    q, k, v = _qkv(loud=2)
    cache = ChunkCache(SPEC, None, head_bits=HeadBits(4, 0.25))
    cache.append(k, v, q)
    assert cache.promoted_heads == (2,)
    qc, kc, vc = _qkv(seed=5)
    out = cache.attend(qc, kc, vc, correction="taylor")
    for spec, heads in ((SPEC, [0, 1, 3]), (QuantSpec(**{**SPEC.to_dict(), "bits": 4}), [2])):
        e = CacheEntry(k=quantize(k[:, heads], spec), v=v[:, heads])
        ref = cached_attention(qc[:, heads], kc[:, heads], vc[:, heads], [e], correction="taylor")
        torch.testing.assert_close(out[:, heads], ref, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- bytes
@pytest.mark.parametrize(
    "heads,kv_heads,fraction,bits,batch,window",
    [(4, None, 0.25, 4, 1, 0), (4, 2, 0.5, 4, 2, 2), (6, None, 0.5, 8, 1, 3), (3, None, 1.0, 3, 1, 0)],
)
def test_planned_bytes_equal_stored_bytes(heads, kv_heads, fraction, bits, batch, window):
    hb = HeadBits(bits, fraction)
    H = kv_heads or heads
    frames, chunk_frames, D, layers = 5, 1, 64, 2
    tokens = 2 * 2 // 4  # a 2x2 latent frame in (1, 2, 2) patches
    plan = plan_by_fields(
        latent_frames=frames, latent_height=2, latent_width=2, chunk_frames=chunk_frames, window_chunks=window,
        layers=layers, heads=heads, kv_heads=kv_heads, head_dim=D, geometry=GEOMETRY, batch=batch,
        spec_k=SPEC, spec_v=SPEC, head_bits=hb,
    )  # fmt: skip
    gen = torch.Generator().manual_seed(0)
    caches = [ChunkCache(SPEC, SPEC, window_chunks=window or None, head_bits=hb) for _ in range(layers)]
    peak = 0
    for _ in range(frames - 1):  # the last chunk is not written (write_last False)
        for c in caches:
            q = torch.randn(batch, heads, tokens, D, generator=gen)
            c.append(
                torch.randn(batch, H, tokens, D, generator=gen), torch.randn(batch, H, tokens, D, generator=gen), q
            )
        peak = max(peak, sum(c.nbytes for c in caches))
    assert plan.quantized_bytes == peak
    assert plan.promoted_heads == hb.count(H) == len(caches[0].promoted_heads)
    assert plan.head_bits == f"{fraction:g}@{bits}"
    uniform = plan_by_fields(
        latent_frames=frames, latent_height=2, latent_width=2, chunk_frames=chunk_frames, window_chunks=window,
        layers=layers, heads=heads, kv_heads=kv_heads, head_dim=D, geometry=GEOMETRY, batch=batch,
        spec_k=SPEC, spec_v=SPEC,
    )  # fmt: skip
    n = hb.count(H)
    hi = QuantSpec(**{**SPEC.to_dict(), "bits": bits}).effective_bits
    assert plan.effective_bits_k == pytest.approx((n * hi + (H - n) * SPEC.effective_bits) / H)
    assert plan.effective_bits_v == uniform.effective_bits_v
    assert plan.quantized_bytes > uniform.quantized_bytes
    if fraction == 1.0:
        assert any("every head's keys" in w for w in plan.warnings)
    else:
        assert not plan.warnings


def test_a_cache_with_head_bits_refuses_to_save_and_copies_its_choice():
    q, k, v = _qkv(loud=3)
    cache = ChunkCache(SPEC, SPEC, head_bits=HeadBits(4, 0.25))
    cache.append(k, v, q)
    other = cache.copy()
    assert other.promoted_heads == (3,) and other.nbytes == cache.nbytes
    cache.clear()
    assert cache.promoted_heads == (3,)  # fixed for the run, even when the cache is emptied and written again
    with pytest.raises(ValueError, match="cannot be saved to a file yet; set head_bits off"):
        other.state_dict()
    # a chunk prepared by a fresh cache (core's block in flight) sets the choice of the cache that stores it
    fresh = ChunkCache(SPEC, SPEC, head_bits=HeadBits(4, 0.25))
    target = ChunkCache(SPEC, SPEC, head_bits=HeadBits(4, 0.25))
    target.append_prepared(fresh.prepare(k, v, q))
    assert target.promoted_heads == (3,)
    q2, k2, v2 = _qkv(seed=3, loud=0)
    with pytest.raises(ValueError, match="keeps heads \\(0,\\) at head_bits but this cache keeps \\(3,\\)"):
        target.append_prepared(ChunkCache(SPEC, SPEC, head_bits=HeadBits(4, 0.25)).prepare(k2, v2, q2))


def test_sequence_parallel_ranks_promote_within_their_own_heads():
    """2 ranks of 2 of 4 K/V heads, a quarter promoted: each rank's caches promote ceil(0.25 x 2) = 1 of their heads
    (2 in all, where one process would promote 1); the plan's bytes are one rank's cache, the all-ranks bytes twice."""
    hb = HeadBits(4, 0.25)
    kw = dict(
        latent_frames=3, latent_height=2, latent_width=2, chunk_frames=1, window_chunks=0, layers=1, heads=4,
        head_dim=64, geometry=GEOMETRY, spec_k=SPEC, spec_v=SPEC, head_bits=hb,
    )  # fmt: skip
    plan = plan_by_fields(**kw, ranks=2)
    assert plan.promoted_heads == 1 and plan_by_fields(**kw).promoted_heads == 1
    gen = torch.Generator().manual_seed(0)
    rank = ChunkCache(SPEC, SPEC, head_bits=hb, head_offset=2)
    for _ in range(2):
        rank.append(*(torch.randn(1, 2, 1, 64, generator=gen) for _ in range(3)))
    assert len(rank.promoted_heads) == 1
    assert plan.quantized_bytes == rank.nbytes and plan.quantized_bytes_all_ranks == 2 * rank.nbytes
    assert plan.quantized_bytes_all_ranks > plan_by_fields(**kw).quantized_bytes  # 2 heads promoted, not 1
