"""The fused fast path against the materialised reference softmax(QK^T/sqrt(d) - lambda*B) V."""

import math

import pytest
import torch
import torch.nn.functional as F

from jensen_core import (
    CacheEntry,
    QuantSpec,
    attention,
    cached_attention,
    fwht,
    jensen_bias,
    quantize,
    rotate,
    unrotate,
)
from jensen_core.attention_shift import attention_shift
from jensen_core.bias import query_group_norms, taylor_weights
from jensen_core.hadamard import rotation_matrix
from jensen_core.quant import cat_quantized


def _setup(rotation, bits=2, g=32, B=2, H=3, T=24, D=64, chunks=3, seed=0, v_bits=2):
    gen = torch.Generator().manual_seed(seed)
    spec = QuantSpec(bits=bits, group_size=g, rotation=rotation, seed=seed)
    vspec = QuantSpec(bits=v_bits, group_size=g, rotation=rotation, seed=seed)
    ks = [torch.randn(B, H, T, D, generator=gen) * 2 for _ in range(chunks)]
    vs = [torch.randn(B, H, T, D, generator=gen) for _ in range(chunks)]
    entries = [CacheEntry(quantize(k, spec), quantize(v, vspec)) for k, v in zip(ks, vs)]
    q = torch.randn(B, H, T + 5, D, generator=gen) * 2
    kc = torch.randn(B, H, T, D, generator=gen)
    vc = torch.randn(B, H, T, D, generator=gen)
    return entries, q, kc, vc


def _reference(entries, q, kc, vc, mode, strength):
    """softmax(Q K^T / sqrt(d) - lambda B) V over [cached, current], B materialised by jensen_bias (0 on current keys)."""
    D = q.shape[-1]
    kq = cat_quantized([e.k for e in entries])
    k_hat = kq.dequantize(torch.float32)
    v_hat = cat_quantized([e.v for e in entries]).dequantize(torch.float32)
    if mode == "per_channel":
        # App. E across the whole cache: token-averaged Delta^2 per group, one value per query
        nu = query_group_norms(rotate(q, kq.spec.seed) if kq.spec.rotation == "hadamard" else q, kq.spec.group_size)
        w = taylor_weights(kq.step_sizes(), D).mean(-2, keepdim=True)
        b = (nu @ w.transpose(-1, -2)).expand(*q.shape[:-1], k_hat.shape[-2])
    else:
        b = jensen_bias(q, kq, mode, chunk_tokens=[e.tokens for e in entries])
    s = torch.cat(
        [q @ k_hat.transpose(-1, -2) / math.sqrt(D) - strength * b, q @ kc.transpose(-1, -2) / math.sqrt(D)], -1
    )
    return torch.softmax(s, -1) @ torch.cat([v_hat, vc], -2)


@pytest.fixture(params=["streamed", "one-buffer"])
def path(request, monkeypatch):
    """Both implementations of the fast path: LSE-merged chunk streaming and one window buffer."""
    monkeypatch.setattr(attention, "_FORCE_CONCAT", request.param == "one-buffer")
    return request.param


def test_streaming_is_available_on_this_machine():
    assert attention.lse_supported(torch.device("cpu"), torch.float32, 72)
    assert attention.lse_supported(torch.device("cpu"), torch.bfloat16, 64)


@pytest.mark.slow  # 60 combinations (rotation x mode x strength x path)
@pytest.mark.parametrize("rotation", ["none", "hadamard"])
@pytest.mark.parametrize("mode", ["taylor", "chunk_mean", "per_channel", "exact", "off"])
@pytest.mark.parametrize("strength", [1.0, 0.4, 2.5])
def test_fast_path_equals_materialised_reference(rotation, mode, strength, path):
    entries, q, kc, vc = _setup(rotation)
    out = cached_attention(q, kc, vc, entries, correction=mode, strength=strength)
    ref = _reference(entries, q, kc, vc, mode, strength)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("g", [8, 16, 64])
def test_fast_path_for_other_group_sizes_and_bits(g, path):
    entries, q, kc, vc = _setup("none", bits=3, g=g, D=64, v_bits=8)
    torch.testing.assert_close(
        cached_attention(q, kc, vc, entries, "taylor"),
        _reference(entries, q, kc, vc, "taylor", 1.0),
        rtol=1e-4,
        atol=2e-5,
    )


@pytest.mark.parametrize("mode", ["taylor", "chunk_mean"])
def test_chunks_of_different_lengths_are_streamed_correctly(path, mode):
    entries, q, kc, vc = _setup("none", T=24)
    short, *_ = _setup("none", T=7)
    entries = entries[:2] + [short[0]] + entries[2:]
    out = cached_attention(q, kc, vc, entries, mode)
    torch.testing.assert_close(out, _reference(entries, q, kc, vc, mode, 1.0), rtol=1e-4, atol=2e-5)
    if mode == "chunk_mean":  # each chunk gets its own mean, not the window's (that is per_channel)
        assert (out - cached_attention(q, kc, vc, entries, "per_channel")).abs().max() > 1e-4


def test_chunk_mean_is_an_offset_of_each_cached_chunks_log_sum_exp(path):
    """Per query and cached chunk, chunk_mean changes only the chunk's weight in the merge: the output is
    the mix of the uncorrected per-chunk attentions with weights exp(lse_c - lambda * mean_c(b))."""
    entries, q, kc, vc = _setup("hadamard", T=16, chunks=2)
    D, lam = q.shape[-1], 0.6
    qr = rotate(q, 0)
    parts, lses = [], []
    for e in entries:
        kh, vh = e.k.dequantize(torch.float32, rotated=True), e.v.dequantize(torch.float32, rotated=True)
        s = qr @ kh.transpose(-1, -2) / math.sqrt(D)
        b_mean = jensen_bias(q, e.k, "taylor").mean(-1)  # the chunk's mean of the per-score bias
        parts.append(unrotate(torch.softmax(s, -1) @ vh, 0))
        lses.append(torch.logsumexp(s, -1) - lam * b_mean)
    s_cur = q @ kc.transpose(-1, -2) / math.sqrt(D)
    parts.append(torch.softmax(s_cur, -1) @ vc)
    lses.append(torch.logsumexp(s_cur, -1))
    wts = torch.softmax(torch.stack(lses, -1), -1)
    expect = sum(wts[..., i, None] * p for i, p in enumerate(parts))
    torch.testing.assert_close(cached_attention(q, kc, vc, entries, "chunk_mean", lam), expect, rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("mode", ["taylor", "chunk_mean"])
def test_correction_never_touches_the_current_chunk(path, mode):
    entries, q, kc, vc = _setup("none")
    D = q.shape[-1]
    out = cached_attention(q, kc, vc, entries, correction=mode)
    # the known bug: subtracting a bias from the current chunk's scores too (with its own "steps")
    kq = cat_quantized([e.k for e in entries])
    k_hat = kq.dequantize(torch.float32)
    v_hat = cat_quantized([e.v for e in entries]).dequantize(torch.float32)
    b_cached = jensen_bias(q, kq, mode, chunk_tokens=[e.tokens for e in entries])
    b_cur = jensen_bias(q, quantize(kc, kq.spec), mode)
    s = torch.cat(
        [q @ k_hat.transpose(-1, -2) / math.sqrt(D) - b_cached, q @ kc.transpose(-1, -2) / math.sqrt(D) - b_cur], -1
    )
    buggy = torch.softmax(s, -1) @ torch.cat([v_hat, vc], -2)
    assert (out - buggy).abs().max() > 1e-3
    # with an empty cache the result is plain attention: nothing to correct
    torch.testing.assert_close(out, _reference(entries, q, kc, vc, mode, 1.0), rtol=1e-4, atol=2e-5)
    # with an empty cache the result is plain attention: nothing to correct
    torch.testing.assert_close(cached_attention(q, kc, vc, [], mode), F.scaled_dot_product_attention(q, kc, vc))


def test_unknown_mode_and_bad_chunk_layouts_are_clear_errors():
    entries, q, kc, vc = _setup("none", chunks=2)
    with pytest.raises(ValueError, match="'chunk-mean' is not supported; use one of .*'chunk_mean'"):
        cached_attention(q, kc, vc, entries, correction="chunk-mean")
    kq = cat_quantized([e.k for e in entries])
    with pytest.raises(ValueError, match=r"add up to 30 tokens, but the cached keys hold 48"):
        jensen_bias(q, kq, "chunk_mean", chunk_tokens=[24, 6])
    for bad in ([24, 0, 24], [24.0, 24], []):
        with pytest.raises(ValueError, match="chunk_tokens"):
            jensen_bias(q, kq, "chunk_mean", chunk_tokens=bad)
    with pytest.raises(ValueError, match="add up to"):  # before any diagnostics work
        attention_shift(q, kq.dequantize(), kq.dequantize(), kc, vc, kq, correction="chunk_mean", chunk_tokens=[47])


def test_correction_moves_mass_away_from_cached_keys():
    entries, q, kc, vc = _setup("none")
    D = q.shape[-1]
    kq = cat_quantized([e.k for e in entries])
    k_hat = kq.dequantize(torch.float32)

    def cached_mass(bias):
        s = torch.cat([q @ k_hat.transpose(-1, -2) / math.sqrt(D) - bias, q @ kc.transpose(-1, -2) / math.sqrt(D)], -1)
        return torch.softmax(s, -1)[..., : k_hat.shape[-2]].sum(-1)

    assert (cached_mass(jensen_bias(q, kq, "taylor")) < cached_mass(0.0)).all()


def test_rotation_is_orthogonal_and_leaves_unquantized_attention_unchanged():
    R = rotation_matrix(64, seed=3)
    torch.testing.assert_close(R @ R.T, torch.eye(64, dtype=torch.float64), atol=1e-12, rtol=0)
    x = torch.randn(5, 64, dtype=torch.float64)
    torch.testing.assert_close(rotate(x, 3), x @ R)
    torch.testing.assert_close(unrotate(rotate(x, 3), 3), x)
    # fwht is the Sylvester Hadamard transform
    H = torch.tensor([[1.0]], dtype=torch.float64)
    while H.shape[0] < 64:
        H = torch.cat([torch.cat([H, H], 1), torch.cat([H, -H], 1)], 0)
    torch.testing.assert_close(fwht(x), x @ H / 8)
    q, k, v = (torch.randn(1, 2, 10, 64) for _ in range(3))
    torch.testing.assert_close(
        F.scaled_dot_product_attention(rotate(q, 3), rotate(k, 3), v),
        F.scaled_dot_product_attention(q, k, v),
        rtol=1e-5,
        atol=1e-6,
    )
    # a rotated INT8 cache of the same keys gives the same attention as an unrotated one
    out = {}
    for rot in ("none", "hadamard"):
        spec = QuantSpec(bits=8, group_size=16, rotation=rot, seed=3)
        out[rot] = cached_attention(q, k, v, [CacheEntry(quantize(k, spec), quantize(v, spec))], correction="off")
    ref = F.scaled_dot_product_attention(q, torch.cat([k, k], -2), torch.cat([v, v], -2))
    for rot in out:
        torch.testing.assert_close(out[rot], ref, rtol=0, atol=0.02)


def test_matmul_and_butterfly_rotations_agree(monkeypatch):
    from jensen_core import hadamard

    x = torch.randn(3, 7, 128, generator=torch.Generator().manual_seed(0))
    fast = (rotate(x, 5), unrotate(x, 5), rotate(x.bfloat16(), 5))
    monkeypatch.setattr(hadamard, "MATMUL_MAX_DIM", 0)
    butterflies = (rotate(x, 5), unrotate(x, 5), rotate(x.bfloat16(), 5))
    for a, b in zip(fast, butterflies):
        # both round the same float32 result to bf16 at the end: at most one bf16 ulp apart
        tol = 1e-5 if a.dtype == torch.float32 else 2**-7
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)
    torch.testing.assert_close(unrotate(rotate(x, 5), 5), x, rtol=1e-5, atol=1e-5)


def test_non_power_of_two_rotation_is_a_clear_error():
    with pytest.raises(ValueError, match="power-of-two head_dim, got 96"):
        quantize(torch.randn(1, 1, 4, 96), QuantSpec(group_size=32, rotation="hadamard"))


def test_full_precision_entries_and_mixed_dtypes():
    q, k, v = (torch.randn(1, 2, 8, 32) for _ in range(3))
    e = CacheEntry(k.bfloat16(), v.bfloat16())
    out = cached_attention(q, k, v, [e], correction="taylor")  # nothing quantized: no correction
    ref = F.scaled_dot_product_attention(
        q, torch.cat([k.bfloat16().float(), k], -2), torch.cat([v.bfloat16().float(), v], -2)
    )
    torch.testing.assert_close(out, ref)


def test_bf16_compute_stays_close_to_fp32(path):
    entries, q, kc, vc = _setup("hadamard")
    err = {}
    for mode in ("off", "taylor"):
        out16 = cached_attention(q.bfloat16(), kc.bfloat16(), vc.bfloat16(), entries, mode)
        out32 = cached_attention(q, kc, vc, entries, mode)
        assert out16.dtype == torch.bfloat16
        err[mode] = (out16.float() - out32).abs().mean().item()
    # the appended correction channels add no error beyond what bf16 attention has anyway
    assert err["taylor"] <= 1.5 * err["off"] + 1e-4, err


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (CPU-only machine)")
def test_cuda_fast_path_matches_reference():
    entries, q, kc, vc = _setup("hadamard")
    dev = torch.device("cuda")
    moved = [CacheEntry(*(quantize(t.dequantize().to(dev), e.k.spec) for t in (e.k, e.v))) for e in entries]
    out = cached_attention(q.to(dev), kc.to(dev), vc.to(dev), moved, "taylor")
    ref = _reference(
        [CacheEntry(*(quantize(t.dequantize(), e.k.spec) for t in (e.k, e.v))) for e in entries],
        q,
        kc,
        vc,
        "taylor",
        1.0,
    )
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-3, atol=1e-3)
