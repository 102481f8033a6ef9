"""The effect the pack exists for, on the seeded synthetic video-shaped workload."""

import pytest
import torch

from jensen_core import ChunkCache, QuantSpec, quantize
from jensen_core.attention_shift import attention_shift
from jensen_core.workload import make_workload

pytestmark = pytest.mark.slow  # end-to-end effect measurements on many tokens


@pytest.fixture(scope="module")
def workload():
    return make_workload(seed=1, heads=4, chunk_tokens=512, cached_chunks=3)


def _shift(w, spec, correction, query_stride=2):
    kq, vq = quantize(w.k_cached_all, spec), quantize(w.v_cached_all, spec)
    return attention_shift(
        w.q,
        w.k_cached_all,
        w.v_cached_all,
        w.k_cur,
        w.v_cur,
        kq,
        vq,
        correction,
        query_stride=query_stride,
        chunk_tokens=[k.shape[-2] for k in w.k_cached],
    )


def test_int2_quarot_steals_attention_and_the_correction_gives_it_back(workload):
    spec = QuantSpec(bits=2, group_size=32, rotation="hadamard")
    before, after = _shift(workload, spec, "off"), _shift(workload, spec, "taylor")
    assert before.median_delta_ps > 0.02  # cached keys steal attention mass
    assert abs(after.median_delta_ps) < 0.25 * before.median_delta_ps
    assert after.mean_jsd < before.mean_jsd
    assert after.output_mse < before.output_mse


def test_int2_rtn_with_outlier_channels_is_at_least_halved(workload):
    # plain RTN on keys with outlier channels: INT2's error is not uniform (values bunch between
    # the grid levels), so the Taylor correction removes most but not all of the shift
    spec = QuantSpec(bits=2, group_size=32, rotation="none")
    before, after = _shift(workload, spec, "off"), _shift(workload, spec, "taylor")
    assert before.median_delta_ps > 0.05
    assert abs(after.median_delta_ps) < 0.5 * before.median_delta_ps
    assert after.mean_jsd < before.mean_jsd and after.output_mse < before.output_mse


def test_exact_and_per_channel_modes_also_reduce_the_shift(workload):
    spec = QuantSpec(bits=2, group_size=32, rotation="hadamard")
    before = _shift(workload, spec, "off").median_delta_ps
    for mode in ("exact", "per_channel"):
        assert abs(_shift(workload, spec, mode).median_delta_ps) < 0.5 * before


@pytest.mark.parametrize("rotation", ["hadamard", "none"])
def test_chunk_mean_gives_back_the_stolen_mass_like_taylor(workload, rotation):
    """The zero-cost chunk-constant correction moves the attention mass back about as far as the per-score one
    (it removes each chunk's partition-sum shift) and lowers JSD and output MSE too, though never below Taylor's."""
    spec = QuantSpec(bits=2, group_size=32, rotation=rotation)
    before, taylor, chunk = (_shift(workload, spec, m) for m in ("off", "taylor", "chunk_mean"))
    assert abs(chunk.median_delta_ps) < 0.5 * before.median_delta_ps
    assert abs(chunk.median_delta_ps) < abs(taylor.median_delta_ps) + 0.25 * (
        before.median_delta_ps - abs(taylor.median_delta_ps)
    )
    assert chunk.mean_jsd < before.mean_jsd and chunk.output_mse < before.output_mse
    assert taylor.mean_jsd <= chunk.mean_jsd


def test_unquantized_reference_has_no_shift(workload):
    stats = attention_shift(
        workload.q, workload.k_cached_all, workload.v_cached_all, workload.k_cur, workload.v_cur, None
    )
    assert stats.delta_ps.abs().max() < 1e-5 and stats.output_mse < 1e-10


def test_the_cache_fast_path_moves_mass_like_the_diagnostics_say(workload):
    """ChunkCache.attend with correction lands closer to the full-precision output than without."""
    w = workload
    spec = QuantSpec(bits=2, group_size=32, rotation="hadamard")
    cache, full = ChunkCache(spec, spec), ChunkCache(None, None)
    for k, v in zip(w.k_cached, w.v_cached):
        cache.append(k, v)
        full.append(k, v)
    ref = full.attend(w.q, w.k_cur, w.v_cur)
    err = {
        m: (cache.attend(w.q, w.k_cur, w.v_cur, correction=m) - ref).square().mean().item() for m in ("off", "taylor")
    }
    assert err["taylor"] < err["off"]
    # and the output equals the diagnostics' materialised corrected output
    stats = _shift(w, spec, "taylor", query_stride=1)
    assert stats.output_mse == pytest.approx(err["taylor"], rel=1e-3)


def test_workload_is_seeded():
    a, b = (
        make_workload(seed=3, heads=2, chunk_tokens=16, cached_chunks=1),
        make_workload(seed=3, heads=2, chunk_tokens=16, cached_chunks=1),
    )
    assert torch.equal(a.q, b.q) and torch.equal(a.k_cached_all, b.k_cached_all)
