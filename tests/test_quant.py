"""Quantizer and packing: properties over shapes, bits, group sizes, dtypes and formats."""

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jensen_core import QuantSpec, pack_codes, quantize, rotate, unpack_codes
from jensen_core.spec import FLOAT_FORMATS

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def quant_case(draw):
    bits = draw(st.sampled_from([2, 3, 4, 8]))
    g = draw(st.sampled_from([8, 16, 32, 64]))
    head_dim = g * draw(st.sampled_from([1, 2, 4]))
    rotation = draw(st.sampled_from(["none", "hadamard"]))
    scale_format = draw(st.sampled_from(list(FLOAT_FORMATS)))
    zero_format = draw(st.sampled_from(["bf16", "fp16", "fp32"]))
    dtype = draw(st.sampled_from(DTYPES))
    shape = (draw(st.integers(1, 2)), draw(st.integers(1, 3)), draw(st.integers(1, 9)), head_dim)
    log_scale = draw(st.floats(-3, 3))
    offset = draw(st.floats(-100, 100))
    seed = draw(st.integers(0, 2**16))
    spec = QuantSpec(
        bits=bits, group_size=g, rotation=rotation, scale_format=scale_format, zero_format=zero_format, seed=seed % 7
    )
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=gen) * 10**log_scale + offset).to(dtype)
    return spec, x


def _bound_holds(x: torch.Tensor, spec: QuantSpec) -> tuple[bool, float]:
    qt = quantize(x, spec)
    ref = x.float()
    if spec.rotation == "hadamard":
        ref = rotate(ref, spec.seed)
    x_hat = qt.dequantize(dtype=torch.float32, rotated=True)
    step = qt.step_sizes().repeat_interleave(spec.group_size, dim=-1)
    zero = qt.minimum.float().repeat_interleave(spec.group_size, dim=-1)
    # the bound, plus fp32 rounding of m + code * delta (a few ulps of the magnitudes involved)
    slack = 2.0**-21 * (zero.abs() + (spec.levels - 1) * step + ref.abs())
    err = (x_hat - ref).abs()
    return bool((err <= step / 2 + slack).all()), float((err - step / 2).max())


@SETTINGS
@given(quant_case())
def test_error_within_half_step(case):
    spec, x = case
    ok, worst = _bound_holds(x, spec)
    assert ok, f"|x_hat - x| exceeds delta/2 by {worst} for {spec} on {x.dtype}"


@SETTINGS
@given(quant_case())
def test_packing_round_trips_codes_and_nbytes_is_exact(case):
    spec, x = case
    qt = quantize(x, spec)
    codes = qt.codes()
    assert codes.shape == x.shape and int(codes.max()) <= spec.levels - 1
    assert torch.equal(unpack_codes(pack_codes(codes, spec.bits), spec.bits, x.shape[-1]), codes)
    n, groups = x.numel(), x.numel() // spec.group_size
    scale_bytes = FLOAT_FORMATS[qt.scale_format][0].itemsize
    zero_bytes = FLOAT_FORMATS[spec.zero_format][0].itemsize
    assert qt.packed.dtype == torch.uint8
    assert qt.nbytes == n * spec.bits // 8 + groups * (scale_bytes + zero_bytes)


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_packing_is_dense_and_bit_exact(bits):
    gen = torch.Generator().manual_seed(bits)
    codes = torch.randint(0, 2**bits, (3, 5, 64), generator=gen, dtype=torch.uint8)
    packed = pack_codes(codes, bits)
    assert packed.shape == (3, 5, 64 * bits // 8)
    assert torch.equal(unpack_codes(packed, bits, 64), codes)


def test_int2_packs_four_codes_a_byte_in_order():
    codes = torch.tensor([[1, 2, 3, 0, 0, 0, 0, 3]], dtype=torch.uint8)
    assert pack_codes(codes, 2).tolist() == [[1 | 2 << 2 | 3 << 4, 3 << 6]]


def test_effective_bits_default_is_2_75_and_matches_bytes():
    spec = QuantSpec()
    assert spec.effective_bits == pytest.approx(2.75)
    x = torch.randn(2, 12, 50, 128)
    qt = quantize(x, spec)
    assert qt.nbytes * 8 / x.numel() == pytest.approx(2.75, abs=0)
    assert qt.effective_bits == pytest.approx(spec.effective_bits)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("value", [0.0, 1.0, -3.3, 1234.5, -6.0e4])
@pytest.mark.parametrize("bits", [2, 4])
def test_constant_groups_are_exact_or_within_bound_and_finite(dtype, value, bits):
    x = torch.full((1, 2, 4, 32), value).to(dtype)
    spec = QuantSpec(bits=bits, group_size=16)
    qt = quantize(x, spec)
    x_hat = qt.dequantize(dtype=torch.float32)
    assert torch.isfinite(x_hat).all() and torch.isfinite(qt.step_sizes()).all()
    ok, worst = _bound_holds(x, spec)
    assert ok, worst


@pytest.mark.parametrize("scale_format", ["fp8_e4m3", "bf16", "fp16"])
def test_tiny_ranges_do_not_underflow_the_scale(scale_format):
    x = 0.5 + 1e-9 * torch.randn(1, 1, 8, 32, generator=torch.Generator().manual_seed(0))
    spec = QuantSpec(bits=2, group_size=32, scale_format=scale_format)
    qt = quantize(x, spec)
    assert (qt.step_sizes() >= 0).all() and torch.isfinite(qt.dequantize(torch.float32)).all()
    ok, worst = _bound_holds(x, spec)
    assert ok, worst


def test_fp8_scales_round_up_so_the_top_of_the_range_is_not_clipped():
    # ranges whose exact step falls just above an FP8 value: rounding to nearest would round down
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(4, 64, 32, generator=gen) * 3
    spec = QuantSpec(bits=2, group_size=32)
    qt = quantize(x, spec)
    mx, mn = x.amax(-1, keepdim=True), x.amin(-1, keepdim=True)
    need = (mx - qt.minimum.float()) / 3
    nearest = need.to(torch.float8_e4m3fn).float()
    assert (nearest < need).any(), "the case under test (nearest FP8 rounds the step down) must occur"
    grid_top = qt.minimum.float() + 3 * qt.step_sizes()
    assert (grid_top >= mx).all()
    assert (qt.minimum.float() <= mn).all()


def test_bf16_zero_point_far_from_zero_keeps_the_bound():
    # a narrow group around 1000: BF16 rounding of the zero-point (ulp 4 there) exceeds the step
    x = 1000.3 + 0.05 * torch.randn(1, 1, 16, 32, generator=torch.Generator().manual_seed(1))
    spec = QuantSpec(bits=4, group_size=32)
    qt = quantize(x, spec)
    assert (qt.minimum.float() <= x.amin(-1)).all()
    ok, worst = _bound_holds(x, spec)
    assert ok, worst


def test_huge_ranges_fall_back_from_fp8_scales_and_say_so(caplog):
    x = torch.randn(1, 1, 4, 32, generator=torch.Generator().manual_seed(2)) * 1e5
    spec = QuantSpec(bits=2, group_size=32)
    with caplog.at_level("WARNING", logger="jensen_kv"):
        qt = quantize(x, spec)
    assert qt.scale_format == "bf16" and qt.scale.dtype == torch.bfloat16
    assert "exceeds FP8" in caplog.text
    assert torch.isfinite(qt.dequantize(torch.float32)).all()
    ok, worst = _bound_holds(x, spec)
    assert ok, worst


def test_dequantize_unrotates_to_the_original_space():
    x = torch.randn(1, 2, 16, 64, generator=torch.Generator().manual_seed(4))
    spec = QuantSpec(bits=8, group_size=16, rotation="hadamard", seed=3)
    qt = quantize(x, spec)
    assert torch.allclose(qt.dequantize(torch.float32), x, atol=0.05)
    assert not torch.allclose(qt.dequantize(torch.float32, rotated=True), x, atol=0.05)


def test_indexing_and_cat_keep_the_payload():
    from jensen_core.quant import cat_quantized

    x = torch.randn(2, 3, 10, 32)
    qt = quantize(x, QuantSpec(group_size=16))
    assert torch.equal(qt[1, 2].dequantize(torch.float32), qt.dequantize(torch.float32)[1, 2])
    parts = [quantize(x[..., :4, :], qt.spec), quantize(x[..., 4:, :], qt.spec)]
    assert torch.equal(cat_quantized(parts).dequantize(torch.float32), qt.dequantize(torch.float32))
    assert math.prod(qt.flatten_leading().shape) == x.numel()


def test_two_rotation_seeds_in_one_process_never_share_a_matrix():
    """ComfyUI is a long-running server: a rotation cached for one seed must never serve another."""
    from jensen_core.hadamard import rotation_matrix, unrotate

    x = torch.randn(3, 5, 128, generator=torch.Generator().manual_seed(0))
    for _ in range(2):  # twice: the second pass is served from the cache
        for seed in (1, 2, 1, 7):
            r = rotation_matrix(128, seed).float()
            torch.testing.assert_close(rotate(x, seed), x @ r, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(unrotate(rotate(x, seed), seed), x, atol=1e-5, rtol=1e-5)
    assert (rotate(x, 1) - rotate(x, 2)).abs().max() > 0.1
    # and through the quantizer: specs differing only in the seed store different codes, each decoding right
    a = quantize(x, QuantSpec(bits=8, group_size=32, rotation="hadamard", seed=1))
    b = quantize(x, QuantSpec(bits=8, group_size=32, rotation="hadamard", seed=2))
    assert not torch.equal(a.packed, b.packed)
    for q in (a, b):
        assert (q.dequantize(torch.float32) - x).abs().max() < 0.05


@SETTINGS
@given(quant_case())
def test_interleaved_dequantization_is_a_permutation_within_groups(case):
    """The attention fast path's dequantization: the same values as ``dequantize`` (rotated space), each
    group's channels reordered - and reordering them back gives channel order exactly (fp32) or to one
    rounding of the target dtype."""
    from jensen_core.packing import from_interleaved, to_interleaved

    spec, x = case
    qt = quantize(x, spec)
    if not qt.interleaved:
        assert spec.bits in (3, 8)
        return
    assert spec.bits in (2, 4)
    ref = qt.dequantize(dtype=torch.float32, rotated=True)
    for dtype in DTYPES:
        out = torch.full(x.shape, float("nan"), dtype=dtype)
        qt.dequantize_interleaved(out)
        assert torch.equal(from_interleaved(out, spec.bits, spec.group_size), ref.to(dtype))
        assert torch.equal(out, to_interleaved(ref, spec.bits, spec.group_size).to(dtype))
    # a real permutation within each group (not the identity, never across groups)
    perm = to_interleaved(torch.arange(x.shape[-1]).expand(1, -1), spec.bits, spec.group_size)[0]
    g = spec.group_size
    assert not torch.equal(perm, torch.arange(x.shape[-1]))
    assert torch.equal(perm.view(-1, g).sort(-1).values, torch.arange(x.shape[-1]).view(-1, g))


def test_interleaved_unpacking_of_known_bytes():
    from jensen_core.packing import unpack_codes_interleaved

    codes = torch.arange(16, dtype=torch.uint8) % 4  # channels 0..15 of one INT2 group of 16 (4 bytes)
    packed = pack_codes(codes.view(1, 16), 2)
    # byte j holds channels 4j..4j+3; the interleaved order is code 0 of every byte, then code 1, ...
    expect = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3], dtype=torch.uint8)
    assert torch.equal(unpack_codes_interleaved(packed, 2, 16, 16)[0], expect)
    with pytest.raises(ValueError, match="no interleaved unpacking for 3-bit"):
        unpack_codes_interleaved(pack_codes(torch.zeros(1, 16, dtype=torch.uint8), 3), 3, 16, 16)
