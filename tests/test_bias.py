"""The Jensen bias: Monte-Carlo check of Eq. 12, Taylor vs exact, stability, rotation (App. F)."""
import math

import pytest
import torch

from jensen_core import QuantSpec, jensen_bias, log_sinhc, quantize, rotate


def _quantized_keys(seed: int, scale: float, spec: QuantSpec, tokens: int = 6, head_dim: int = 64):
    gen = torch.Generator().manual_seed(seed)
    return quantize(torch.randn(1, 1, tokens, head_dim, generator=gen) * scale, spec)


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
    ref = torch.tensor([0.0 if x == 0 else math.log(math.sinh(x) / x) if x < 700 else x - math.log(2 * x)
                        for x in a.tolist()[:-1]] + [1e6 - math.log(2e6)], dtype=torch.float64)
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


def test_per_channel_is_one_shared_value_per_query_and_none_is_zero():
    spec = QuantSpec(bits=2, group_size=16)
    kq = _quantized_keys(10, 1.0, spec, tokens=9)
    q = torch.randn(1, 1, 4, 64)
    b = jensen_bias(q, kq, "per_channel")
    assert b.shape == (1, 1, 4, 9)
    assert torch.allclose(b, b[..., :1].expand_as(b))
    torch.testing.assert_close(b.mean(-1), jensen_bias(q, kq, "taylor").mean(-1), rtol=1e-5, atol=1e-7)
    assert (jensen_bias(q, kq, "none") == 0).all()


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
