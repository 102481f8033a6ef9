"""ChunkCache: append, eviction, bytes, persistence, and bad input that leaves it unchanged."""

import pytest
import torch

from jensen_core import ChunkCache, QuantizedTensor, QuantSpec
from jensen_core.planner import CachePrecision, CacheShape, LatentGeometry, plan_cache
from jensen_testing.planning import plan_by_fields, plan_video

#: a toy family's latent layout: 2 x 2 latent pixels per token, 16 channels
GEOMETRY_2X2 = LatentGeometry(patch=(1, 2, 2), latent_channels=16)


def _chunk(seed, B=1, H=2, T=12, D=64, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, H, T, D, generator=g) * scale, torch.randn(B, H, T, D, generator=g)


def _fill(cache, n, **kw):
    chunks = [_chunk(i, **kw) for i in range(n)]
    for k, v in chunks:
        cache.append(k, v)
    return chunks


def test_sliding_window_evicts_oldest_whole_chunks_without_requantizing():
    cache = ChunkCache(QuantSpec(), QuantSpec(bits=4), window_chunks=2)
    _fill(cache, 2)
    kept = cache.entries[1]
    kept_packed = kept.k.packed.clone()
    k3, v3 = _chunk(2)
    cache.append(k3, v3)
    assert cache.num_chunks == 2 and cache.chunks_evicted == 1
    assert cache.entries[0] is kept and torch.equal(cache.entries[0].k.packed, kept_packed)
    # the newest entry holds chunk 2, the oldest kept one chunk 1
    assert (cache.entries[1].k.dequantize(torch.float32) - k3).abs().max() < 2.0
    k1 = _chunk(1)[0]
    assert (cache.entries[0].k.dequantize(torch.float32) - k1).abs().mean() < (
        cache.entries[0].k.dequantize(torch.float32) - k3
    ).abs().mean()


def test_bytes_bf16_bytes_and_effective_bits():
    cache = ChunkCache(QuantSpec(bits=2, group_size=32), QuantSpec(bits=4, group_size=32))
    _fill(cache, 3, T=10, D=128)
    n = 3 * 1 * 2 * 10 * 128
    groups = n // 32
    assert cache.nbytes == (n * 2 // 8 + groups * 3) + (n * 4 // 8 + groups * 3)
    assert cache.bf16_nbytes == 2 * n * 2
    assert cache.effective_bits == pytest.approx((2.75 + 4.75) / 2)
    full = ChunkCache(None, None)
    _fill(full, 3, T=10, D=128)
    assert full.nbytes == 2 * n * 4 and full.effective_bits == 32.0  # fp32 tensors kept as given


def test_planner_matches_the_bytes_a_run_really_stores():
    layers, branches, heads, D, T, chunks, window = 2, 2, 2, 64, 12, 5, 3
    spec_k, spec_v = QuantSpec(bits=2, group_size=16), QuantSpec(bits=3, group_size=32)
    caches = [ChunkCache(spec_k, spec_v, window_chunks=window) for _ in range(layers * branches)]
    peak = 0
    for c in range(chunks - 1):  # the last chunk is never written
        for i, cache in enumerate(caches):
            cache.append(*_chunk(100 * c + i, H=heads, T=T, D=D))
        peak = max(peak, sum(cache.nbytes for cache in caches))
    shape = CacheShape(layers=layers, heads=heads, head_dim=D, geometry=GEOMETRY_2X2, cfg_branches=branches)
    plan = plan_video(
        (chunks * 3, 2, 8),
        3,
        window,
        shape,
        precision=CachePrecision(spec_k=spec_k, spec_v=spec_v),
    )
    assert T == 3 * plan.tokens_per_latent_frame
    assert plan.quantized_bytes == peak
    assert plan.bf16_bytes == sum(cache.bf16_nbytes for cache in caches)


def test_planner_counts_unquantized_sides_in_the_model_dtype():
    cache = ChunkCache(QuantSpec(bits=2, group_size=16), None)  # values kept as given (fp32 here)
    cache.append(*_chunk(0, H=2, T=12, D=64))
    plan = plan_cache(
        latent_frames=6,
        latent_height=2,
        latent_width=8,
        chunk_frames=3,
        window_chunks=0,
        shape=CacheShape(layers=1, heads=2, head_dim=64, geometry=GEOMETRY_2X2, full_bytes=4),
        precision=CachePrecision(spec_k=QuantSpec(bits=2, group_size=16), spec_v=None),
    )
    assert plan.quantized_bytes == cache.nbytes
    assert plan.effective_bits_v == 32.0


@pytest.mark.parametrize("spec_v", [QuantSpec(bits=4, rotation="hadamard", seed=2), None])
def test_safetensors_round_trip_is_bit_identical(tmp_path, spec_v):
    spec_k = QuantSpec(bits=3, group_size=16, rotation="hadamard", seed=2)
    cache = ChunkCache(spec_k, spec_v, window_chunks=4)
    _fill(cache, 3)
    path = str(tmp_path / "cache.safetensors")
    cache.save(path)
    other = ChunkCache(spec_k, spec_v)
    other.load(path)
    assert other.num_chunks == 3 and other.nbytes == cache.nbytes
    for a, b in zip(cache.entries, other.entries):
        for x, y in ((a.k, b.k), (a.v, b.v)):
            if isinstance(x, QuantizedTensor):
                assert torch.equal(x.packed, y.packed) and torch.equal(
                    x.scale.view(torch.uint8), y.scale.view(torch.uint8)
                )
                assert torch.equal(x.minimum, y.minimum) and x.shape == y.shape and x.scale_format == y.scale_format
            else:
                assert torch.equal(x, y)
    q, k, v = _chunk(99)[0], *_chunk(98)
    assert torch.equal(cache.attend(q, k, v), other.attend(q, k, v))


def test_loading_a_file_saved_under_another_spec_or_shape_is_rejected(tmp_path):
    cache = ChunkCache(QuantSpec(bits=2), QuantSpec(bits=2))
    _fill(cache, 2)
    path = str(tmp_path / "c.safetensors")
    cache.save(path)
    with pytest.raises(ValueError, match="saved with specs"):
        ChunkCache(QuantSpec(bits=4), QuantSpec(bits=2)).load(path)
    other = ChunkCache(QuantSpec(bits=2), QuantSpec(bits=2))
    other.append(*_chunk(5, H=4))
    with pytest.raises(ValueError, match="heads 2"):
        other.load(path)
    assert other.num_chunks == 1  # unchanged
    with pytest.raises(ValueError, match="not a jensen-kv cache file"):
        other.load_state_dict({"x": torch.zeros(1)})


def test_clear_frees_everything():
    cache = ChunkCache(QuantSpec(), QuantSpec())
    _fill(cache, 2)
    cache.clear()
    assert cache.num_chunks == 0 and cache.nbytes == 0
    cache.append(*_chunk(0, H=5))  # a new layout is accepted after clear()
    assert cache.num_chunks == 1


# --------------------------------------------------------------------------- bad input
def _snapshot(cache):
    return [id(e) for e in cache.entries], cache.nbytes, cache.chunks_appended


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: QuantSpec(group_size=48), r"group_size=48 .*power of two"),
        (lambda: QuantSpec(bits=5), r"bits=5 is not supported; use one of \(2, 3, 4, 8\)"),
        (lambda: QuantSpec(rotation="random"), "rotation='random'"),
        (lambda: QuantSpec(scale_format="fp4"), "scale_format='fp4'"),
        (lambda: QuantSpec(zero_format="fp8_e4m3"), "zero_format='fp8_e4m3'"),
        (lambda: ChunkCache(QuantSpec(), QuantSpec(), window_chunks=-1), "window_chunks=-1"),
    ],
)
def test_bad_specs_name_the_value_and_the_fix(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_group_size_not_dividing_head_dim_names_the_fix():
    cache = ChunkCache(QuantSpec(group_size=64), QuantSpec(group_size=64))
    with pytest.raises(ValueError, match=r"group_size 64 does not divide head_dim 96; use 8, 16 or 32"):
        cache.append(*_chunk(0, D=96))
    assert cache.num_chunks == 0


@pytest.mark.parametrize("where", ["k", "v"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nan_or_inf_is_rejected_and_the_cache_is_unchanged(where, bad):
    cache = ChunkCache(QuantSpec(), QuantSpec(), window_chunks=2)
    _fill(cache, 2)
    before = _snapshot(cache)
    k, v = _chunk(7)
    (k if where == "k" else v)[0, 1, 3, 5] = bad
    with pytest.raises(ValueError, match=rf"^{where} contains 1 NaN or Inf"):
        cache.append(k, v)
    assert _snapshot(cache) == before


@pytest.mark.parametrize(
    "chunk, match",
    [
        (lambda: _chunk(0, T=0), "empty chunk"),
        (lambda: _chunk(0, H=3), "heads 3, .* heads 2,"),
        (lambda: tuple(t.double() for t in _chunk(0)), "dtype torch.float64 differs"),
        (lambda: tuple(t.to("meta") for t in _chunk(0)), "lives on meta"),
        (lambda: (_chunk(0)[0], _chunk(0, T=3)[1]), "must have the same shape"),
        (lambda: (_chunk(0)[0][0], _chunk(0)[1][0]), r"\(batch, heads, tokens, head_dim\)"),
    ],
)
def test_bad_chunks_are_rejected_and_the_cache_is_unchanged(chunk, match):
    cache = ChunkCache(QuantSpec(), None)
    _fill(cache, 1)
    before = _snapshot(cache)
    with pytest.raises(ValueError, match=match):
        cache.append(*chunk())
    assert _snapshot(cache) == before


def test_bad_attend_inputs_are_clear_errors():
    cache = ChunkCache(QuantSpec(), QuantSpec())
    _fill(cache, 1)
    q, k, v = _chunk(3)[0], *_chunk(4)
    with pytest.raises(ValueError, match="correction mode 'taylr' is not supported"):
        cache.attend(q, k, v, correction="taylr")
    with pytest.raises(ValueError, match="do not match the query's batch, heads"):
        cache.attend(*(t[:, :1] for t in (q, k, v)))
    with pytest.raises(ValueError, match="share a dtype"):
        cache.attend(q.double(), k, v)
    with pytest.raises(ValueError, match="strength=nan"):
        cache.attend(q, k, v, strength=float("nan"))
    with pytest.raises(ValueError, match="current chunk is empty"):
        cache.attend(q, k[..., :0, :], v[..., :0, :])


def test_planner_reports_a_group_size_that_cannot_run_as_an_error():
    plan = plan_cache(
        latent_frames=9,
        latent_height=4,
        latent_width=4,
        chunk_frames=3,
        window_chunks=0,
        shape=CacheShape(layers=1, heads=2, head_dim=128, geometry=GEOMETRY_2X2),
        precision=CachePrecision(spec_k=QuantSpec(group_size=256), spec_v=QuantSpec(group_size=256)),
    )
    assert plan.errors == (
        "key and value cache: group_size 256 does not divide head_dim 128; use 8, 16, 32, 64 or 128",
    )
    assert not plan.runnable and plan.quantized_bytes is None and plan.to_dict()["quantized_mib"] is None
    assert plan.bf16_bytes > 0


# ----------------------------------------------------------------------------------------- attention sink
def test_sink_keeps_the_first_chunks_for_good_and_the_window_rolls():
    cache = ChunkCache(QuantSpec(), None, window_chunks=2, sink_chunks=1)
    chunks = _fill(cache, 6)
    ids = [e.v.data_ptr() for e in cache.entries]
    # chunk 0 (sink) and the last two (4, 5), oldest first; values are kept unquantized: same storage
    assert cache.num_chunks == 3 and cache.chunks_evicted == 3
    torch.testing.assert_close(cache.entries[0].v, chunks[0][1])
    torch.testing.assert_close(cache.entries[1].v, chunks[4][1])
    torch.testing.assert_close(cache.entries[2].v, chunks[5][1])
    assert len(set(ids)) == 3
    # a sink larger than the video keeps everything; no window keeps everything too
    big = ChunkCache(None, None, window_chunks=1, sink_chunks=8)
    _fill(big, 5)
    assert big.num_chunks == 5
    nowin = ChunkCache(None, None, window_chunks=None, sink_chunks=2)
    _fill(nowin, 5)
    assert nowin.num_chunks == 5


def test_sink_survives_a_file_round_trip_and_a_mismatch_is_refused(tmp_path):
    cache = ChunkCache(QuantSpec(), QuantSpec(bits=4), window_chunks=1, sink_chunks=2)
    _fill(cache, 5)
    path = str(tmp_path / "c.safetensors")
    cache.save(path)
    back = ChunkCache(QuantSpec(), QuantSpec(bits=4), window_chunks=1, sink_chunks=2)
    back.load(path)
    k, v = _chunk(99)
    cache.append(k, v)
    back.append(k, v)  # evicts the same chunk in both: the sink stays, the window rolls
    assert [e.k.packed.sum().item() for e in back.entries] == [e.k.packed.sum().item() for e in cache.entries]
    with pytest.raises(ValueError, match="sink_chunks=2"):
        ChunkCache(QuantSpec(), QuantSpec(bits=4), window_chunks=1, sink_chunks=0).load(path)


def test_negative_sink_is_a_clear_error():
    with pytest.raises(ValueError, match="sink_chunks=-1"):
        ChunkCache(None, None, sink_chunks=-1)


# ----------------------------------------------------------------------------------------- planner
def _plan(**kw):
    video = dict(latent=(21, 60, 104), chunk_frames=3, window_chunks=0)
    model = dict(layers=30, heads=12, head_dim=128, spec_k=QuantSpec(), spec_v=QuantSpec(), geometry=GEOMETRY_2X2)
    return plan_by_fields(**{**video, **model, **kw})


@pytest.mark.parametrize("window", [7, 8, 50])
def test_a_window_at_least_the_video_plans_like_no_window(window):
    """7 chunks, of which 6 are ever cached: any window >= 6 holds the same bytes as no window."""
    full = _plan()
    w = _plan(window_chunks=window)
    assert (w.quantized_bytes, w.bf16_bytes, w.cached_chunks_peak) == (full.quantized_bytes, full.bf16_bytes, 6)
    assert any("not smaller than the video" in x for x in w.warnings)


def test_planner_counts_the_sink_the_last_chunk_and_a_prefix():
    one = _plan(latent_frames=3, window_chunks=0, write_last=True).quantized_bytes  # one chunk's bytes
    assert _plan(window_chunks=2).cached_chunks_peak == 2
    assert _plan(window_chunks=2, sink_chunks=1).quantized_bytes == 3 * one
    assert _plan(window_chunks=2, sink_chunks=1).cached_chunks_peak == 3
    assert _plan(window_chunks=0, write_last=True).quantized_bytes == 7 * one
    assert _plan(window_chunks=0, prefix_frames=6).cached_chunks_peak == 8  # 2 prefix chunks + 6 of the 7
    assert any("no effect without a window" in x for x in _plan(sink_chunks=1).warnings)
