"""Grouped-query attention (fewer K/V heads than query heads), context tokens and per-group key ranges in jensen_core.

Every attention result is compared with the float64 reference of ``support/gqa_reference.py``, written plainly one
query head at a time (query head ``h`` attends K/V head ``h // groups``; the bias from that K/V head's stored steps
and the query's own rotated channels; context tokens and the current chunk never corrected). With as many K/V heads
as query heads and no context tokens, the results are those of the code before GQA, bit for bit
(``tests/data/mha_outputs.safetensors``, see ``support/mha_cases.py``).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from support.gqa_reference import reference_attention
from support.mha_cases import mha_outputs

from jensen_core import CacheEntry, ChunkCache, QuantSpec, attention, cached_attention, jensen_bias, quantize
from jensen_core import correction_layouts as layouts
from jensen_core.attention_shift import attention_shift
from jensen_core.cache import chunk_bytes
from jensen_core.correction_layouts import Layout
from jensen_core.geometry import LatentGeometry
from jensen_core.planner import CachePrecision, CacheShape, block_in_flight_bytes, plan_cache
from jensen_core.quant import cat_quantized
from jensen_core.tiers import AgeTiers
from jensen_testing.numerics import assert_within_rounding, relative_error, rounding_bound
from jensen_testing.planning import plan_by_fields

MODES = ("taylor", "chunk_mean", "exact", "per_channel", "off")
DATA = Path(__file__).parent / "data" / "mha_outputs.safetensors"
TOL = {"rtol": 1e-4, "atol": 2e-5}


def _problem(Hq, Hkv, D=64, rotation="none", chunks=3, T=12, M=5, cur=6, ctx=0, seed=0, bits=2):
    gen = torch.Generator().manual_seed(seed)
    spec = QuantSpec(bits=bits, group_size=32, rotation=rotation, seed=seed + 1)
    entries = [
        CacheEntry(
            quantize(torch.randn(1, Hkv, T, D, generator=gen) * 2, spec),
            quantize(torch.randn(1, Hkv, T, D, generator=gen), spec),
        )
        for _ in range(chunks)
    ]
    q = torch.randn(1, Hq, M, D, generator=gen) * 2
    kc, vc = (torch.randn(1, Hkv, cur, D, generator=gen) for _ in range(2))
    kx, vx = (torch.randn(1, Hkv, ctx, D, generator=gen) * 1.5 for _ in range(2)) if ctx else (None, None)
    return entries, q, kc, vc, kx, vx


@pytest.fixture(params=["streamed", "one-buffer"])
def path(request, monkeypatch):
    """Both implementations: the log-sum-exp merge chunk by chunk, and one buffer for the window."""
    monkeypatch.setattr(attention, "_FORCE_CONCAT", request.param == "one-buffer")
    return request.param


# ------------------------------------------------------------------------------------ GQA against float64
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("rotation", ["none", "hadamard"])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("Hq,Hkv", [(4, 2), (6, 2)])
def test_gqa_equals_the_float64_reference(Hq, Hkv, D, rotation, mode, path):
    entries, q, kc, vc, _, _ = _problem(Hq, Hkv, D, rotation)
    out = cached_attention(q, kc, vc, entries, mode, 0.8)
    assert out.shape == q.shape
    torch.testing.assert_close(out.double(), reference_attention(q, kc, vc, entries, mode, 0.8), **TOL)


@pytest.mark.parametrize("width", [136, 192])
def test_gqa_through_each_cpu_pad_width(width, monkeypatch):
    """The padded layout at the flash kernel's width (136) and at AMX's multiple of 64 (192), chosen for the test."""
    monkeypatch.setattr(layouts, "_LAYOUTS", {("cpu", torch.float32, 128, 4): Layout("pad", width)})
    entries, q, kc, vc, kx, vx = _problem(6, 2, 128, "hadamard", ctx=4)
    out = cached_attention(q, kc, vc, entries, "taylor", 1.2, k_ctx=kx, v_ctx=vx)
    torch.testing.assert_close(out.double(), reference_attention(q, kc, vc, entries, "taylor", 1.2, kx, vx), **TOL)
    assert layouts.kernel_choices() == {"cpu/torch.float32 d128 G4": f"q,k,v padded to {width}"}


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (CPU-only machine)")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gqa_through_every_cuda_layout(dtype, monkeypatch):
    """pad, split (v of head_dim), FlexAttention and the fused Triton kernel where it imports, each chosen in turn."""
    dev = torch.device("cuda")
    entries, q, kc, vc, kx, vx = _problem(6, 2, 128, "hadamard", T=300, ctx=40)
    ref = reference_attention(q, kc, vc, entries, "taylor", 0.9, kx, vx)
    moved = [CacheEntry(e.k.to(dev), e.v.to(dev)) for e in entries]
    tol = 1e-3 if dtype == torch.float32 else 3e-2
    cands = layouts.candidate_layouts(dev, dtype, 128, 4)
    assert [lay.kind for lay in cands][:3] == ["pad", "split", "flex"]
    for lay in cands:
        monkeypatch.setattr(layouts, "_LAYOUTS", {("cuda", dtype, 128, 4): lay})
        cast = lambda t: t.to(device=dev, dtype=dtype)  # noqa: E731
        out = cached_attention(cast(q), cast(kc), cast(vc), moved, "taylor", 0.9, k_ctx=cast(kx), v_ctx=cast(vx))
        torch.testing.assert_close(out.double().cpu(), ref, rtol=tol, atol=tol, msg=str(lay))


def test_the_reference_tells_the_grouping_and_the_correction_apart():
    """Positive controls: query head h on K/V head h % H_kv (the wrong grouping), or the bias of another K/V head's
    steps, are far outside the tolerance the tests above use - so those tests would catch either mistake."""
    entries, q, kc, vc, _, _ = _problem(6, 2, 64, "hadamard")
    out = cached_attention(q, kc, vc, entries, "taylor", 1.0).double()
    perm = sorted(range(6), key=lambda h: (h % 2, h))  # the reference's h // 3 on these positions is h % 2
    wrong = torch.empty_like(out)
    wrong[:, perm] = reference_attention(q[:, perm], kc, vc, entries, "taylor", 1.0)
    assert (out - wrong).abs().max() > 1e-2
    other = [CacheEntry(e.k[:, [1, 0]], e.v) for e in entries]  # the other head's steps (and keys)
    assert (out - reference_attention(q, kc, vc, other, "taylor", 1.0)).abs().max() > 1e-2
    assert (out - reference_attention(q, kc, vc, entries, "off", 1.0)).abs().max() > 1e-3  # the bias is seen


def test_gqa_never_expands_the_cached_keys_and_values(monkeypatch):
    """The streamed path dequantizes every cached chunk into a buffer of the K/V heads (never H_q heads) and the
    query heads of a group become rows of their K/V head."""
    entries, q, kc, vc, _, _ = _problem(6, 2)
    shapes = []
    real = attention._fill
    monkeypatch.setattr(attention, "_fill", lambda dst, src, il: shapes.append(tuple(dst.shape)) or real(dst, src, il))
    cached_attention(q, kc, vc, entries, "chunk_mean")
    assert shapes and all(s[1] == 2 for s in shapes), shapes


def test_gqa_equals_the_same_attention_over_repeated_heads(path):
    """An equivalence that must hold: GQA over H_kv stored heads equals MHA over the stored heads indexed h // groups
    (the same codes and steps for the query heads of a group)."""
    entries, q, kc, vc, kx, vx = _problem(6, 2, 64, "hadamard", ctx=7)
    idx = [h // 3 for h in range(6)]
    rep = [CacheEntry(e.k[:, idx], e.v[:, idx]) for e in entries]
    for mode in MODES:
        out = cached_attention(q, kc, vc, entries, mode, 0.6, k_ctx=kx, v_ctx=vx)
        ref = cached_attention(q, kc[:, idx], vc[:, idx], rep, mode, 0.6, k_ctx=kx[:, idx], v_ctx=vx[:, idx])
        # two float32 paths (a group's heads folded into rows, or one head each): the kernel's blocking differs
        # with the thread count (measured 1.4e-6 on 2 threads, 0 on 1)
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=5e-6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gqa_in_half_precision(dtype):
    entries, q, kc, vc, kx, vx = _problem(4, 2, 128, "hadamard", ctx=5)
    cast = lambda t: t.to(dtype)  # noqa: E731
    out = cached_attention(cast(q), cast(kc), cast(vc), entries, "taylor", 1.0, k_ctx=cast(kx), v_ctx=cast(vx))
    assert out.dtype == dtype
    ref = reference_attention(cast(q), cast(kc), cast(vc), entries, "taylor", 1.0, cast(kx), cast(vx))
    torch.testing.assert_close(out.double(), ref, rtol=3e-2, atol=3e-2)


# ------------------------------------------------------------------------------------------ context tokens
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("rotation", ["none", "hadamard"])
@pytest.mark.parametrize("Hq,Hkv", [(2, 2), (6, 2)])
def test_context_tokens_are_attended_in_full_precision_and_never_corrected(Hq, Hkv, rotation, mode, path):
    """softmax over [cached (corrected), context, current]: the bias on the cached quantized keys only."""
    entries, q, kc, vc, kx, vx = _problem(Hq, Hkv, 64, rotation, ctx=9)
    out = cached_attention(q, kc, vc, entries, mode, 0.9, k_ctx=kx, v_ctx=vx)
    torch.testing.assert_close(out.double(), reference_attention(q, kc, vc, entries, mode, 0.9, kx, vx), **TOL)


def test_context_tokens_change_the_result_and_compose_with_key_offsets(path):
    entries, q, kc, vc, kx, vx = _problem(4, 2, 64, "hadamard", ctx=8)
    with_ctx = cached_attention(q, kc, vc, entries, "taylor", k_ctx=kx, v_ctx=vx)
    assert (with_ctx - cached_attention(q, kc, vc, entries, "taylor")).abs().max() > 1e-2
    # a log-offset on the cached keys (Krea's bias) never reaches the context tokens: an offset of -inf-ish on every
    # cached key leaves attention over [context, current] alone
    gone = cached_attention(q, kc, vc, entries, "taylor", key_log_offsets=[-60.0] * 3, k_ctx=kx, v_ctx=vx)
    torch.testing.assert_close(gone.double(), reference_attention(q, kc, vc, [], "off", 1.0, kx, vx), **TOL)


def test_context_tokens_without_a_cache(path):
    _, q, kc, vc, kx, vx = _problem(6, 2, 64, ctx=10)
    out = cached_attention(q, kc, vc, [], "taylor", k_ctx=kx, v_ctx=vx)
    torch.testing.assert_close(out.double(), reference_attention(q, kc, vc, [], "off", 1.0, kx, vx), **TOL)
    empty = kx[..., :0, :]
    torch.testing.assert_close(
        cached_attention(q, kc, vc, [], k_ctx=empty, v_ctx=empty), cached_attention(q, kc, vc, [])
    )


# -------------------------------------------------------------------------------------------- key ranges
def test_a_query_group_attends_a_suffix_of_the_cache(path):
    """MAGI-1's per-chunk key range: each group of queries attends its newest n cached chunks (one call per group)."""
    cache = ChunkCache(QuantSpec(bits=2, rotation="hadamard"), QuantSpec(bits=2), window_chunks=3, sink_chunks=1)
    gen = torch.Generator().manual_seed(5)
    for _ in range(5):
        cache.append(torch.randn(1, 2, 8, 64, generator=gen) * 2, torch.randn(1, 2, 8, 64, generator=gen))
    held = cache.entries
    assert len(held) == 4
    _, q, kc, vc, kx, vx = _problem(6, 2, 64, ctx=4)
    for n in range(5):
        out = cache.attend(q, kc, vc, "taylor", 0.7, k_ctx=kx, v_ctx=vx, last_chunks=n)
        ref = reference_attention(q, kc, vc, held[len(held) - n :], "taylor", 0.7, kx, vx)
        torch.testing.assert_close(out.double(), ref, **TOL)
    everything = cache.attend(q, kc, vc, k_ctx=kx, v_ctx=vx)
    assert torch.equal(everything, cache.attend(q, kc, vc, k_ctx=kx, v_ctx=vx, last_chunks=99))
    with pytest.raises(ValueError, match="last_chunks=-1 must be a whole number >= 0"):
        cache.attend(q, kc, vc, last_chunks=-1)
    with pytest.raises(ValueError, match="key_log_offsets has 4 items but the cache holds 2 chunks"):
        cache.attend(q, kc, vc, key_log_offsets=[0.0] * 4, last_chunks=2)


# ----------------------------------------------------------------------------------- tiers, QVG, the cache
@pytest.mark.parametrize("rotation", ["none", "hadamard"])
@pytest.mark.parametrize("method", ["rtn", "qvg"])
def test_a_gqa_cache_with_tiers_and_qvg_equals_the_reference(method, rotation, path):
    kw = {"method": "qvg", "qvg_centroids": 3, "qvg_iters": 3} if method == "qvg" else {}
    cache = ChunkCache(
        QuantSpec(bits=2, rotation=rotation, **kw),
        QuantSpec(bits=2, rotation=rotation, **kw),
        window_chunks=2,
        sink_chunks=1,
        tiers=AgeTiers(recent_bits=4, recent_chunks=1, sink_bits=8),
    )
    gen = torch.Generator().manual_seed(9)
    for _ in range(4):
        cache.append(torch.randn(1, 2, 10, 64, generator=gen) * 2, torch.randn(1, 2, 10, 64, generator=gen))
    assert [e.k.spec.bits for e in cache.entries] == [8, 2, 4]
    _, q, kc, vc, kx, vx = _problem(6, 2, 64, ctx=3)
    for mode in MODES:
        out = cache.attend(q, kc, vc, mode, 0.8, k_ctx=kx, v_ctx=vx)
        torch.testing.assert_close(
            out.double(), reference_attention(q, kc, vc, cache.entries, mode, 0.8, kx, vx), **TOL
        )


def test_bad_gqa_and_context_inputs_are_clear_errors():
    entries, q, kc, vc, kx, vx = _problem(6, 2, ctx=3)
    with pytest.raises(ValueError, match=r"query's heads must be a multiple of the K/V heads, 4 here"):
        cached_attention(q, torch.randn(1, 4, 6, 64), torch.randn(1, 4, 6, 64), [])
    with pytest.raises(ValueError, match="k_ctx and v_ctx, or neither"):
        cached_attention(q, kc, vc, entries, k_ctx=kx)
    with pytest.raises(ValueError, match=r"context tokens k_ctx \(1, 6, 3, 64\) do not match"):
        cached_attention(q, kc, vc, entries, k_ctx=kx.repeat(1, 3, 1, 1), v_ctx=vx.repeat(1, 3, 1, 1))
    with pytest.raises(ValueError, match="must share q's dtype"):
        cached_attention(q, kc, vc, entries, k_ctx=kx.double(), v_ctx=vx.double())
    with pytest.raises(
        ValueError, match=r"cached keys of shape \(1, 2, 12, 64\) do not match the query's batch, heads"
    ):
        cached_attention(q, kc[:, :1], vc[:, :1], entries)


# ---------------------------------------------------------------------------------- bias and diagnostics
@pytest.mark.parametrize("rotation", ["none", "hadamard"])
def test_jensen_bias_of_a_query_group_uses_its_kv_heads_steps(rotation):
    entries, q, *_ = _problem(6, 2, 64, rotation)
    kq = cat_quantized([e.k for e in entries])
    for mode in MODES:
        b = jensen_bias(q, kq, mode, chunk_tokens=[12] * 3)
        assert b.shape == (1, 6, 5, 36)
        for h in range(6):
            torch.testing.assert_close(b[:, h], jensen_bias(q[:, h], kq[:, h // 3], mode, chunk_tokens=[12] * 3))
    with pytest.raises(ValueError, match="must be a multiple of the K/V heads"):
        jensen_bias(q[:, :5], kq)


def test_attention_shift_with_gqa_equals_the_shift_over_repeated_heads():
    entries, q, kc, vc, _, _ = _problem(6, 2, 64, "hadamard")
    gen = torch.Generator().manual_seed(4)
    k_full, v_full = (torch.randn(1, 2, 36, 64, generator=gen) for _ in range(2))
    kq, vq = cat_quantized([e.k for e in entries]), cat_quantized([e.v for e in entries])
    idx = [h // 3 for h in range(6)]
    for mode in ("taylor", "chunk_mean", "exact"):
        a = attention_shift(q, k_full, v_full, kc, vc, kq, vq, mode, chunk_tokens=[12] * 3)
        r = [t[:, idx] for t in (k_full, v_full, kc, vc)]
        b = attention_shift(q, *r, kq[:, idx], vq[:, idx], mode, chunk_tokens=[12] * 3)
        torch.testing.assert_close(a.delta_ps, b.delta_ps)
        torch.testing.assert_close(a.jsd, b.jsd)
        assert a.output_mse == pytest.approx(b.output_mse, rel=1e-5)


# ---------------------------------------------------------------------------------------------- planner
GEOMETRY = LatentGeometry(patch=(1, 2, 2), latent_channels=16)


def test_the_planner_counts_kv_heads_and_equals_the_measured_cache():
    """MAGI-1's layout: 24 query heads over 8 K/V groups: the plan of a GQA model is that of 8 heads, a third of 24;
    and it equals what a ChunkCache of K/V heads really holds."""
    common = dict(
        latent_frames=12, latent_height=8, latent_width=8, chunk_frames=3, window_chunks=2, layers=2, head_dim=64,
        spec_k=QuantSpec(bits=2), spec_v=QuantSpec(bits=4), geometry=GEOMETRY, sink_chunks=1,
    )  # fmt: skip
    gqa = plan_by_fields(heads=24, kv_heads=8, **common)
    assert gqa == plan_by_fields(heads=8, **common)
    assert 3 * gqa.quantized_bytes == plan_by_fields(heads=24, **common).quantized_bytes
    assert plan_by_fields(heads=24, kv_heads=24, **common) == plan_by_fields(heads=24, **common)
    assert block_in_flight_bytes(
        block_tokens=48,
        shape=CacheShape(layers=2, heads=24, head_dim=64, kv_heads=8),
        precision=CachePrecision(spec_k=QuantSpec(), spec_v=None),
    ) == 2 * chunk_bytes(QuantSpec(), None, 8, 48, 64)
    # measured: one layer's cache of 2 K/V heads (queries of 4 heads), chunks of 3 frames x 16 tokens
    plan = plan_cache(
        latent_frames=9, latent_height=8, latent_width=8, chunk_frames=3, window_chunks=0,
        shape=CacheShape(1, 4, 64, GEOMETRY, kv_heads=2), precision=CachePrecision(QuantSpec(bits=2), QuantSpec(bits=4)),
    )  # fmt: skip
    cache = ChunkCache(QuantSpec(bits=2), QuantSpec(bits=4))
    for _ in range(2):  # the last chunk is not written (nothing reads it)
        cache.append(torch.randn(1, 2, 48, 64), torch.randn(1, 2, 48, 64))
        cache.attend(torch.randn(1, 4, 48, 64), torch.randn(1, 2, 48, 64), torch.randn(1, 2, 48, 64))
    assert cache.nbytes == plan.quantized_bytes
    with pytest.raises(ValueError, match="kv_heads=5 must be a whole number >= 1 that divides heads=24"):
        plan_by_fields(heads=24, kv_heads=5, **common)


# ------------------------------------------------------------------------------ H_kv == H_q: as before
def test_as_many_kv_heads_as_query_heads_gives_what_the_code_before_gqa_gave():
    """The outputs of ``support/mha_cases.py`` equal those recorded from the code before GQA (commit d7cce09, on
    another machine) within float32 rounding (jensen_testing.numerics): a key rotation, the scores and the weighted
    values, reductions of at most 64 (head_dim; 35 keys); in bfloat16 the same three stages stored in bfloat16
    (one bfloat16 rounding each, sums in float32). Measured on an AMX Xeon: 6.5e-7 and 1.8e-3 at most, 5 and 17
    times below the bounds; the modes differ from each other by far more (checked below)."""
    with safe_open(str(DATA), framework="pt") as f:
        recorded = {k: f.get_tensor(k) for k in f.keys()}
    now = mha_outputs()
    assert now.keys() == recorded.keys()
    f32, bf16 = rounding_bound(3, 64), rounding_bound(3, 64, bf16_stages=3)
    for name, t in now.items():
        assert_within_rounding(t.float(), recorded[name].float(), bf16 if t.dtype == torch.bfloat16 else f32, name)
    # the bound tells the correction modes apart: each differs from "off" by more than it
    for dtype in ("float32", "bfloat16"):
        for mode in ("taylor", "chunk_mean", "exact", "per_channel"):
            a, b = now[f"attend.{dtype}.none.streamed.{mode}"], now[f"attend.{dtype}.none.streamed.off"]
            assert relative_error(a.float(), b.float()) > (bf16 if dtype == "bfloat16" else f32).value, (dtype, mode)


def test_the_folded_query_is_a_view_when_the_query_is_contiguous(monkeypatch):
    """No query copy either for a contiguous query: the kernel gets (batch, H_kv, groups * M, d) sharing q's storage."""
    entries, q, kc, vc, _, _ = _problem(6, 2, 64)
    seen = []
    real = attention._attend
    monkeypatch.setattr(attention, "_attend", lambda qq, *a: seen.append(qq) or real(qq, *a))
    cached_attention(q, kc, vc, entries, "off")
    assert seen[0].shape == (1, 2, 15, 64) and seen[0].data_ptr() == q.data_ptr()
    assert math.prod(seen[0].shape) == q.numel()
