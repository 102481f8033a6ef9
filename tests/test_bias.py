"""The Jensen bias: Monte-Carlo check of Eq. 12, Taylor vs exact, stability, rotation (App. F)."""

import math
from dataclasses import replace

import pytest
import torch

from jensen_core import QuantSpec, jensen_bias, log_sinhc, quantize, rotate
from jensen_core.quant import cat_quantized


def _quantized_keys(seed: int, scale: float, spec: QuantSpec, tokens: int = 6, head_dim: int = 64):
    gen = torch.Generator().manual_seed(seed)
    return quantize(torch.randn(1, 1, tokens, head_dim, generator=gen) * scale, spec)


@pytest.mark.slow  # Monte Carlo
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_exact_bias_matches_monte_carlo_mean_of_exp_delta(seed):
    """E[exp(delta)] under uniform noise equals exp(b_exact), within 5 standard errors."""
    spec = QuantSpec(bits=2, group_size=16)
    kq = _quantized_keys(seed, 2.0, spec)
    gen = torch.Generator().manual_seed(100 + seed)
    q = torch.randn(1, 1, 3, 64, generator=gen) * 1.5
    b_exact = jensen_bias(q, kq, "exact")[0, 0].double()  # (3 queries, 6 keys)
    step = kq.step_sizes()[0, 0].repeat_interleave(16, -1).double()  # (6, 64)
    n = 200_000
    for i in range(step.shape[0]):
        eps = (torch.rand(n, 64, generator=gen, dtype=torch.float64) - 0.5) * step[i]
        delta = eps @ q[0, 0].double().T / math.sqrt(64)  # (n, 3)
        e = torch.exp(delta)
        mean, se = e.mean(0), e.std(0) / math.sqrt(n)
        target = torch.exp(b_exact[:, i])
        assert (mean - target).abs().le(5 * se).all(), (mean, target, se)
        # and the bias is real: exp(b) is many standard errors away from 1 (no correction)
        assert ((target - 1) / se).min() > 5


def test_taylor_is_an_upper_bound_of_exact_and_agrees_for_small_alpha():
    spec = QuantSpec(bits=2, group_size=32)
    q = torch.randn(2, 3, 20, 128, generator=torch.Generator().manual_seed(5)) * 3
    for scale, rtol in ((20.0, None), (0.05, 1e-3)):
        kq = _quantized_keys(6, scale, spec, tokens=30, head_dim=128)
        kq = quantize(kq.dequantize().expand(2, 3, -1, -1).contiguous(), spec)
        t, e = jensen_bias(q, kq, "taylor"), jensen_bias(q, kq, "exact")
        assert (t >= e - 1e-6).all()
        assert (e >= 0).all()
        if rtol:
            torch.testing.assert_close(t, e, rtol=rtol, atol=1e-9)
        else:
            assert (t - e).max() > 0.1  # large alpha: Taylor overestimates (App. A)


def test_log_sinhc_is_stable_and_accurate():
    a = torch.tensor([0.0, 1e-20, 1e-8, 1e-3, 0.0999, 0.1, 0.5, 2.0, 30.0, 700.0, 1e6], dtype=torch.float64)
    out = log_sinhc(a)
    assert torch.isfinite(out).all()
    ref = torch.tensor(
        [0.0 if x == 0 else math.log(math.sinh(x) / x) if x < 700 else x - math.log(2 * x) for x in a.tolist()[:-1]]
        + [1e6 - math.log(2e6)],
        dtype=torch.float64,
    )
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-15)
    assert torch.equal(log_sinhc(-a), out)
    assert torch.isfinite(log_sinhc(torch.tensor([1e4], dtype=torch.float32))).all()


def test_taylor_is_eq15():
    spec = QuantSpec(bits=2, group_size=32)
    kq = _quantized_keys(7, 1.0, spec, tokens=5, head_dim=128)
    q = torch.randn(1, 1, 4, 128, generator=torch.Generator().manual_seed(8))
    b = jensen_bias(q, kq, "taylor")[0, 0]
    step = kq.step_sizes()[0, 0]
    nu = q[0, 0].view(4, 4, 32).square().sum(-1)
    for m in range(4):
        for i in range(5):
            expect = sum(step[i, j] ** 2 * nu[m, j] for j in range(4)) / (24 * 128)
            assert b[m, i].item() == pytest.approx(expect.item(), rel=1e-5)


def test_rotated_cache_uses_rotated_query_group_norms():
    spec = QuantSpec(bits=2, group_size=16, rotation="hadamard", seed=4)
    kq = _quantized_keys(9, 1.0, spec)
    q = torch.zeros(1, 1, 1, 64)
    q[..., :16] = 1.0  # all energy in group 0 before rotation; spread over all groups after
    b = jensen_bias(q, kq, "taylor")
    nu = rotate(q, 4).view(4, 16).square().sum(-1)
    assert (nu > 0).all()
    expect = (kq.step_sizes()[0, 0].square() * nu).sum(-1) / (24 * 64)
    torch.testing.assert_close(b[0, 0, 0], expect)
    unrotated_nu_bias = kq.step_sizes()[0, 0, :, 0].square() * 16 / (24 * 64)
    assert not torch.allclose(b[0, 0, 0], unrotated_nu_bias)


def test_per_channel_is_one_shared_value_per_query_and_off_is_zero():
    spec = QuantSpec(bits=2, group_size=16)
    kq = _quantized_keys(10, 1.0, spec, tokens=9)
    q = torch.randn(1, 1, 4, 64)
    b = jensen_bias(q, kq, "per_channel")
    assert b.shape == (1, 1, 4, 9)
    assert torch.allclose(b, b[..., :1].expand_as(b))
    torch.testing.assert_close(b.mean(-1), jensen_bias(q, kq, "taylor").mean(-1), rtol=1e-5, atol=1e-7)
    assert (jensen_bias(q, kq, "off") == 0).all()


def test_no_correction_is_called_off_and_the_old_none_still_reads():
    """One name for "no correction" from the UI to the core; "none", its old core name, reads as "off" wherever a
    mode is read (core calls, configs made before, a widget value), while a misspelt mode is still refused."""
    from support.pack import load_pack_module

    from jensen_core import MODES, CacheEntry, cached_attention
    from jensen_core.attention_shift import attention_shift
    from jensen_core.bias import check_mode

    config = load_pack_module("runtime.config")
    assert "off" in MODES and "none" not in MODES and config.CORRECTION_CHOICES == MODES
    assert check_mode("none") == "off" and check_mode("taylor") == "taylor"
    with pytest.raises(ValueError, match="'nothing'"):
        check_mode("nothing")
    spec = QuantSpec(bits=2, group_size=16)
    kq = _quantized_keys(11, 1.0, spec, tokens=8)
    gen = torch.Generator().manual_seed(3)
    q, kc, vc = (torch.randn(1, 1, 8, 64, generator=gen) for _ in range(3))
    assert torch.equal(jensen_bias(q, kq, "none"), jensen_bias(q, kq, "off"))
    entries = [CacheEntry(kq, quantize(vc, spec))]
    assert torch.equal(cached_attention(q, kc, vc, entries, "none"), cached_attention(q, kc, vc, entries, "off"))
    assert not torch.equal(cached_attention(q, kc, vc, entries, "taylor"), cached_attention(q, kc, vc, entries, "off"))
    k = torch.randn(1, 1, 8, 64, generator=gen) * 2
    old, new = (attention_shift(q, k, vc, kc, vc, quantize(k, spec), None, m) for m in ("none", "off"))
    assert torch.equal(old.delta_ps, new.delta_ps) and old.output_mse == new.output_mse > 0
    pack_spec = config.QuantSpec(bits=2, group_size=16)  # the pack's own jensen_core, as the runtime imports it
    assert config.JensenKVConfig(spec_k=pack_spec, correction="none").correction == "off"
    assert config.JensenKVConfig().correction == "off" and config.parse_correction("none") == "off"
    assert (
        config.JensenKVConfig(spec_k=pack_spec, correction="none", strength=0.5).describe().endswith("correction off")
    )
    with pytest.raises(ValueError, match="mode='Off'"):
        config.parse_correction("Off")
    with pytest.raises(ValueError, match="correction='nothing'"):
        config.JensenKVConfig(correction="nothing")


def test_exact_bias_without_the_lookup_table_agrees():
    import jensen_core.bias as bias

    spec = QuantSpec(bits=2, group_size=16, scale_format="fp32")  # many distinct steps
    kq = _quantized_keys(11, 1.5, spec, tokens=40)
    q = torch.randn(1, 1, 5, 64)
    direct = jensen_bias(q, kq, "exact")
    old = bias._TABLE_MAX_VALUES
    bias._TABLE_MAX_VALUES = 10**9
    try:
        table = jensen_bias(q, kq, "exact")
    finally:
        bias._TABLE_MAX_VALUES = old
    torch.testing.assert_close(direct, table, rtol=1e-6, atol=1e-9)


# ----------------------------------------------------------------------------------------- chunk_mean
def test_chunk_mean_is_each_chunks_mean_of_the_taylor_bias():
    spec = QuantSpec(bits=2, group_size=16, rotation="hadamard", seed=2)
    gen = torch.Generator().manual_seed(12)
    chunks = [quantize(torch.randn(2, 3, t, 64, generator=gen) * s, spec) for t, s in ((9, 1.0), (5, 3.0), (12, 0.5))]
    kq = cat_quantized(chunks)
    q = torch.randn(2, 3, 7, 64, generator=gen)
    b = jensen_bias(q, kq, "chunk_mean", chunk_tokens=[9, 5, 12])
    taylor = jensen_bias(q, kq, "taylor")
    for a, e in ((0, 9), (9, 14), (14, 26)):
        torch.testing.assert_close(b[..., a:e], taylor[..., a:e].mean(-1, keepdim=True).expand(-1, -1, -1, e - a))
    # without chunk_tokens the keys are one chunk: the mean over all of them (what per_channel also is)
    torch.testing.assert_close(jensen_bias(q, kq, "chunk_mean"), jensen_bias(q, kq, "per_channel"))
    assert (b[..., 9:14] - b[..., :9].mean(-1, keepdim=True)).abs().min() > 1e-4  # really per chunk


@pytest.mark.slow
def test_chunk_mean_removes_the_partition_sum_bias_in_expectation():
    """Under the noise model (eps ~ U(-Delta/2, Delta/2)) with steps constant over each chunk's keys - the
    case the chunk-constant correction is exact for - E[exp(-b_mean) Z_hat_c] = Z_c for every chunk,
    while the uncorrected Z_hat_c is tens of standard errors above Z_c. Two chunks with different steps."""
    spec = QuantSpec(bits=2, group_size=16)
    gen = torch.Generator().manual_seed(21)
    T, n = 40, 20_000
    keys = [torch.randn(1, 1, T, 64, generator=gen) * s for s in (1.0, 2.0)]
    chunks = []
    for i, k in enumerate(keys):  # one step per group, shared by the chunk's keys (0.2 ... 0.5)
        kq = quantize(k, spec)
        steps = (0.2 + 0.1 * torch.arange(4, dtype=torch.float32) * (i + 1)).expand(1, 1, T, 4)
        chunks.append(replace(kq, scale=steps.contiguous(), scale_format="fp32"))
    q = torch.randn(1, 1, 3, 64, generator=gen) * 1.5
    b = jensen_bias(q, cat_quantized(chunks), "chunk_mean", chunk_tokens=[T, T])[0, 0].double()
    for c, (k, kq) in enumerate(zip(keys, chunks)):
        step = kq.step_sizes()[0, 0].repeat_interleave(16, -1).double()  # (T, 64)
        s = q[0, 0].double() @ k[0, 0].double().T / 8  # (3, T) unquantized scores
        eps = (torch.rand(n, T, 64, generator=gen, dtype=torch.float64) - 0.5) * step
        z_hat = torch.exp(s + (eps @ q[0, 0].double().T).transpose(-1, -2) / 8).sum(-1)  # (n, 3)
        ratio = z_hat / torch.exp(s).sum(-1)
        corrected = ratio * torch.exp(-b[:, c * T])  # the chunk's shared bias, as an LSE offset
        se = ratio.std(0) / math.sqrt(n)
        assert ((ratio.mean(0) - 1) / se).min() > 20, (c, ratio.mean(0), se)
        assert ((corrected.mean(0) - 1).abs() / (corrected.std(0) / math.sqrt(n))).max() < 5, (c, corrected.mean(0))


def _per_chunk_ratios(trials: int, bits: int, qscale: float, scales=(1.0, 3.0), T: int = 128):
    """Per trial and chunk: mean over queries of Z_hat_c / Z_c without correction and with chunk_mean,
    per_channel (the window's mean) and taylor, real INT-``bits`` keys with per-key steps."""
    spec = QuantSpec(bits=bits, group_size=32)
    rows = []
    for t in range(trials):
        g = torch.Generator().manual_seed(1000 + t)
        xs = [torch.randn(1, 1, T, 64, generator=g) * sc for sc in scales]
        q = torch.randn(1, 1, 32, 64, generator=g) * qscale
        kqs = [quantize(x, spec) for x in xs]
        kq = cat_quantized(kqs)
        biases = [jensen_bias(q, kq, m, chunk_tokens=[T] * len(xs)) for m in ("chunk_mean", "per_channel", "taylor")]
        row = []
        for c, (x, k) in enumerate(zip(xs, kqs)):
            lz = torch.logsumexp(q @ x.transpose(-1, -2) / 8, -1)
            s_hat = q @ k.dequantize(torch.float32).transpose(-1, -2) / 8
            for b in (0.0, *(bb[..., c * T : (c + 1) * T] for bb in biases)):
                row.append(float((torch.logsumexp(s_hat - b, -1) - lz).exp().mean()))
        rows.append(row)
    r = torch.tensor(rows, dtype=torch.float64).view(trials, len(scales), 4)
    return r.mean(0) - 1, r.std(0) / math.sqrt(trials)


@pytest.mark.slow
def test_chunk_mean_removes_most_of_each_chunks_partition_sum_bias_with_real_steps():
    """INT4 keys of two chunks, the second with 3x the range (9x the bias). Every key has its own steps, so a
    chunk-constant offset cannot be exact, but it removes >= 75% of each chunk's bias; the window's mean
    (per_channel) over-corrects the quiet chunk and under-corrects the noisy one by tens of standard errors."""
    bias, se = _per_chunk_ratios(200, 4, 4.0)
    for c in range(2):
        none, chunk_mean, per_channel, taylor = bias[c].tolist()
        assert none > 10 * se[c, 0], (bias, se)
        assert abs(chunk_mean) < 0.25 * none, (bias, se)
        assert abs(taylor) < 0.25 * none
    assert bias[0, 2] < -10 * se[0, 2] and bias[1, 2] > 10 * se[1, 2], (bias, se)
