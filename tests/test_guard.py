"""The correction's guard (issue 40, item 3): it never makes a head worse than no correction.

Where a cached chunk's attention is spread over many keys the guard's factor is exactly 1 (the correction is the
paper's); where one key holds it, the noise shifts the chunk's log-partition by about nothing in the log, and
the guard takes the correction away. And log(sinh x / x), which the exact mode and the regime cap need, against a
50-digit reference over x in [1e-6, 1e4].
"""

from __future__ import annotations

import math
from decimal import Decimal, getcontext

import pytest
import torch

from jensen_core import CacheEntry, QuantSpec, attention, cached_attention, jensen_bias, log_sinhc, quantize
from jensen_core.attention_shift import attention_shift
from jensen_core.bias import GUARD_QUERIES, GUARD_TOLERANCE, guard_rows, guard_scales, predicted_log_bias
from jensen_core.quant import cat_quantized


def _dominant_head(seed: int, H=16, M=32, T=32, D=64, a=1.5, c=2.0, logit=2.0):
    """Heads whose queries all point along one direction u, one cached key along u (a score ~24, the others ~N(0,
    6^2)) holding the cached chunk's attention, and a current key along u ``logit`` nats lower: the cached mass is
    ~0.88 and saturated, INT2's noise on that key's score has a standard deviation of ~2."""
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(1, H, 1, D, generator=g)
    u = u / u.norm(dim=-1, keepdim=True) * math.sqrt(D)
    q = a * u + 0.3 * torch.randn(1, H, M, D, generator=g)
    k = 0.5 * torch.randn(1, H, T, D, generator=g)
    k[:, :, :1] = c * u
    v = torch.randn(1, H, T, D, generator=g)
    kc = 0.5 * torch.randn(1, H, T, D, generator=g)
    kc[:, :, :1] = (c - logit / (a * math.sqrt(D))) * u
    vc = torch.randn(1, H, T, D, generator=g)
    return q, k, v, kc, vc


def _errors(q, k, v, kc, vc, kq, mode, guard):
    """Mean |cached mass shift| and the attention output's MSE against full precision (values kept exact, so the
    output error is the attention's alone)."""
    ref = cached_attention(q, kc, vc, [CacheEntry(k, v)], correction="off")
    out = cached_attention(q, kc, vc, [CacheEntry(kq, v)], correction=mode, guard=guard)
    shift = attention_shift(q, k, v, kc, vc, kq, v, correction=mode, guard=guard)
    return float(shift.delta_ps.abs().mean()), float((out - ref).square().mean())


@pytest.fixture(params=["streamed", "one-buffer"])
def path(request, monkeypatch):
    monkeypatch.setattr(attention, "_FORCE_CONCAT", request.param == "one-buffer")
    return request.param


EXACT = pytest.param("exact", marks=pytest.mark.slow)  # materialised, ~4 s a call on 2 cores


@pytest.mark.parametrize("mode", ["taylor", EXACT])
@pytest.mark.parametrize("rotation", ["hadamard", "none"])
@pytest.mark.parametrize("seed", [0, 1])
def test_one_dominant_cached_key_the_unguarded_correction_is_worse_than_none_and_the_guarded_is_not(
    seed, rotation, mode, path
):
    q, k, v, kc, vc = _dominant_head(seed)
    kq = quantize(k, QuantSpec(bits=2, group_size=32, rotation=rotation, seed=seed))
    none = _errors(q, k, v, kc, vc, kq, "off", False)
    unguarded = _errors(q, k, v, kc, vc, kq, mode, False)
    guarded = _errors(q, k, v, kc, vc, kq, mode, True)
    # measured (seeds 0-2, both rotations): |dP_S| 1.2-1.8x, output MSE 1.4-5x that of no correction
    assert unguarded[0] > 1.15 * none[0] and unguarded[1] > 1.3 * none[1], (mode, unguarded, none)
    assert guarded[0] <= 1.01 * none[0] and guarded[1] <= 1.01 * none[1], (mode, guarded, none)
    factors = guard_scales(q, kq, "taylor")
    assert float(factors.max()) < 0.05  # nearly all of it taken away, in every head


@pytest.mark.parametrize("mode", ["taylor", "chunk_mean", EXACT])
def test_spread_attention_keeps_the_whole_correction_bit_for_bit(mode, path):
    """The positive control: 2 chunks of 192 keys, scores ~N(0, 1): the guard's factor is exactly 1, the guarded
    output equals the unguarded one bit for bit, and the correction beats no correction."""
    g = torch.Generator().manual_seed(3)
    spec = QuantSpec(bits=2, group_size=32, rotation="hadamard", seed=3)
    ks = [torch.randn(1, 4, 192, 64, generator=g) for _ in range(2)]
    vs = [torch.randn(1, 4, 192, 64, generator=g) for _ in range(2)]
    q, kc, vc = (torch.randn(1, 4, 48, 64, generator=g) for _ in range(3))
    entries = [CacheEntry(quantize(k, spec), v) for k, v in zip(ks, vs)]
    kq = cat_quantized([e.k for e in entries])
    assert torch.equal(guard_scales(q, kq, mode, 1.0, [192] * 2), torch.ones(1, 4, 2))
    on = cached_attention(q, kc, vc, entries, correction=mode, guard=True)
    assert torch.equal(on, cached_attention(q, kc, vc, entries, correction=mode, guard=False))
    k, v = torch.cat(ks, -2), torch.cat(vs, -2)
    shift = {m: attention_shift(q, k, v, kc, vc, kq, v, m, chunk_tokens=[192] * 2, guard=True) for m in ("off", mode)}
    assert abs(float(shift[mode].delta_ps.mean())) < 0.3 * float(shift["off"].delta_ps.mean())


def _guarded_reference(entries, q, kc, vc, mode, strength):
    """softmax over [cached, current] with each chunk's bias (jensen_bias) times its guard factor (guard_scales),
    materialised: the fast path's reference."""
    D = q.shape[-1]
    kq = cat_quantized([e.k for e in entries])
    tokens = [e.tokens for e in entries]
    b = jensen_bias(q, kq, mode, chunk_tokens=tokens)
    if q.shape[1] != kq.shape[1]:  # grouped-query: factors are per K/V head, the bias per query head
        groups = q.shape[1] // kq.shape[1]
        f = guard_scales(q, kq, mode, strength, tokens).repeat_interleave(groups, dim=1)
    else:
        f = guard_scales(q, kq, mode, strength, tokens)
    b = b * torch.cat([f[..., i, None, None].expand(*f.shape[:-1], 1, t) for i, t in enumerate(tokens)], -1)
    k_hat = kq.dequantize(torch.float32)
    v_hat = cat_quantized([e.v for e in entries]).dequantize(torch.float32)
    groups = q.shape[1] // kq.shape[1]
    k_hat, v_hat = (t.repeat_interleave(groups, dim=1) for t in (k_hat, v_hat))
    kcg, vcg = (t.repeat_interleave(groups, dim=1) for t in (kc, vc))
    s = torch.cat(
        [q @ k_hat.transpose(-1, -2) / math.sqrt(D) - strength * b, q @ kcg.transpose(-1, -2) / math.sqrt(D)], -1
    )
    return torch.softmax(s, -1) @ torch.cat([v_hat, vcg], -2)


@pytest.mark.parametrize("mode", ["taylor", "chunk_mean", "per_channel", EXACT])
@pytest.mark.parametrize("heads", [(3, 3), (6, 3)])
def test_the_guarded_fast_path_equals_the_materialised_guarded_reference(mode, heads, path):
    """Scores ~N(0, 4^2) over 3 chunks of 24 keys (the guard acts: factors ~0.5), strength 0.7, grouped-query
    heads too; more queries than the guard samples, so the sample is a strict subset."""
    hq, hkv = heads
    g = torch.Generator().manual_seed(11)
    spec = QuantSpec(bits=2, group_size=32, rotation="hadamard", seed=11)
    entries = [
        CacheEntry(
            quantize(torch.randn(2, hkv, 24, 64, generator=g) * 2, spec),
            quantize(torch.randn(2, hkv, 24, 64, generator=g), spec),
        )
        for _ in range(3)
    ]
    q = torch.randn(2, hq, 40, 64, generator=g) * 2
    kc, vc = torch.randn(2, hkv, 24, 64, generator=g), torch.randn(2, hkv, 24, 64, generator=g)
    f = guard_scales(q, cat_quantized([e.k for e in entries]), mode, 0.7, [24] * 3)
    assert float(f.max()) < 0.95 and float(f.min()) > 0.05  # the guard acts, and not all the way
    out = cached_attention(q, kc, vc, entries, correction=mode, strength=0.7, guard=True)
    torch.testing.assert_close(out, _guarded_reference(entries, q, kc, vc, mode, 0.7), rtol=1e-4, atol=2e-5)
    unguarded = cached_attention(q, kc, vc, entries, correction=mode, strength=0.7, guard=False)
    assert float((out - unguarded).abs().max()) > 1e-3


def test_the_guard_samples_at_most_its_queries_evenly():
    assert guard_rows(5).tolist() == [0, 1, 2, 3, 4]
    rows = guard_rows(1000)
    assert len(rows) == GUARD_QUERIES and rows[0] == 0 and rows[-1] == 999
    assert bool((rows.diff() > 0).all())


def test_predicted_log_bias_one_key_many_keys_and_past_the_second_order_regime():
    b = torch.full((1, 1000), 0.2)
    # one key holds the chunk: no bias in the log
    one = torch.tensor([[50.0] + [0.0] * 999])
    assert float(predicted_log_bias(one, b)) < 1e-12
    # n equal keys, small noise: b (1 - 1/n)
    flat = torch.zeros(1, 1000)
    torch.testing.assert_close(predicted_log_bias(flat, b), torch.tensor([0.2 * (1 - 1e-3)]))
    # noise variance 2b = 40 past 2 log n = 13.8: sigma sqrt(2 log n) - log n, far below Taylor's 20
    big = torch.full((1, 1000), 20.0)
    want = math.sqrt(40 * 2 * math.log(1000)) - math.log(1000)
    torch.testing.assert_close(predicted_log_bias(flat, big), torch.tensor([want]))
    # the cap is continuous at the regime's edge (2b = 2 log n)
    edge = torch.full((1, 1000), math.log(1000))
    torch.testing.assert_close(predicted_log_bias(flat, edge), torch.tensor([math.log(1000) * (1 - 1e-3)]))


def test_the_guard_allows_its_tolerance_and_no_more():
    """With the predicted bias fixed, the factor brings the applied log-partition shift down to the tolerance."""
    scores = torch.zeros(1, 1, 4, 1000)
    b = torch.full((1, 1, 4, 1000), 0.1)
    assert float(guard_scale_of(scores, b, b)) == 1.0
    f = guard_scale_of(scores, b, 3 * b)  # the correction applies 3x the bias
    torch.testing.assert_close(f, torch.tensor([[GUARD_TOLERANCE * (1 - 1e-3) / 3]]), rtol=1e-5, atol=0)


def guard_scale_of(scores, predicted, applied):
    from jensen_core.bias import guard_scale

    return guard_scale(scores, predicted, applied)


# ------------------------------------------------------------------------------------------ log(sinh x / x)
def _log_sinhc_decimal(x: float) -> float:
    """log(sinh x / x) at 50 digits (Python's decimal: no mpmath): exp, ln and the series for tiny x."""
    getcontext().prec = 50
    d = Decimal(x)
    if d < Decimal("1e-3"):  # sinh x / x - 1 = x^2/6 + x^4/120 + ...: summed, so no cancellation
        term, total, n = d * d / 6, Decimal(0), 1
        while term > Decimal("1e-60"):
            total += term
            term = term * d * d / ((2 * n + 2) * (2 * n + 3))
            n += 1
        return float(total - total * total / 2 + total**3 / 3)  # log1p, to far below float64's roundoff here
    sinh = (d.exp() - (-d).exp()) / 2
    return float((sinh / d).ln())


def test_log_sinhc_against_a_50_digit_reference_from_1e_6_to_1e4():
    xs = torch.logspace(-6, 4, 301, dtype=torch.float64)
    want = torch.tensor([_log_sinhc_decimal(x) for x in xs.tolist()], dtype=torch.float64)
    got = log_sinhc(xs)
    # float64: relative 1e-12 (the cancellation near the series' switch at 0.1 costs ~1e3 ulp)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=0)
    torch.testing.assert_close(log_sinhc(-xs), got, rtol=0, atol=0)
    # float32 input: relative 1e-4 (the same cancellation, at float32's roundoff), never inf or nan
    got32 = log_sinhc(xs.to(torch.float32))
    assert torch.isfinite(got32).all()
    torch.testing.assert_close(got32.double(), want, rtol=1e-4, atol=1e-30)
    # and torch's own float64 sinh where it neither overflows nor cancels (x in [0.1, 700])
    mid = xs[(xs >= 0.1) & (xs <= 700)]
    torch.testing.assert_close(log_sinhc(mid), torch.log(torch.sinh(mid) / mid), rtol=1e-12, atol=0)
    # the large-x form x - log(2x) + log1p(-e^-2x) (issue 40's) agrees where it is accurate
    big = xs[xs >= 1]
    torch.testing.assert_close(
        log_sinhc(big), big - torch.log(2 * big) + torch.log1p(-torch.exp(-2 * big)), rtol=1e-13, atol=0
    )
