"""``benchmarks/magi1_quality.py`` (the paper's table in MAGI-1's setting, on the trained tiny MAGI-1).

Fast: its reference run through the pack's MAGI-1 cache seam is the pure sampler's rollout; the cache holds what the
benchmark says at each window_size, and each row's effective bits are the ones its docs table prints (precision by
age within 2.85 bits at window_size 1, the one chunk at window_size 4 over it); the latent SSIM / PSNR definitions.
Slow: ``--quick`` end to end (every row and seed, finite, the reference exact, INT4 above INT2, the correction
lowering the mass shift, the bits of the run's own report)."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
import torch

from jensen_testing.pack import load_script, run_script

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "magi1_quality.py"


@pytest.fixture(autouse=True)
def one_thread():
    """One torch thread, as the benchmark runs (many small calls: two threads on a busy 2-core machine are slower);
    restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def bench():
    return load_script("benchmarks/magi1_quality.py")


@pytest.fixture(scope="module")
def model(bench):
    return bench.mt.load()


@pytest.mark.parametrize("window", [1, 4])
def test_the_reference_row_through_the_packs_seam_is_the_pure_samplers_rollout(bench, model, window):
    """The BF16 row's run (the pack's Magi1CacheAttention over RunCaches, no quantization) against the sampler's own
    full-precision buffer: the same rollout up to float32 summation order (measured: 2e-6 of values up to 2.6)."""
    m, special = model
    got = bench.rollout(m, special, bench.ROWS[0], window, prompt=1, seed=7, chunks=2, steps=4, stride=1)
    want = bench.mt.rollout(m, special, 1, 2, window, 7, steps=4)
    torch.testing.assert_close(got.latent, want, atol=1e-4, rtol=0)
    assert got.delta_ps == 0.0 and got.effective_bits == 32.0  # float32 stored, as the table says


@pytest.mark.parametrize(("window", "held"), [(4, 1), (1, 4)])
def test_each_rows_cache_at_the_full_runs_size_stores_the_bits_the_table_prints(bench, window, held):
    """At the full run's 6 chunks the cache keeps what the key ranges reach (1 chunk at window_size 4, 4 at 1); the
    rows' caches, filled with that many chunks of the model's K/V shape, store: INT2 g32 2.75, INT4 g32 4.75, QVG more
    than its INT2 g64 residual, and precision by age 2.75 (<= 2.85) at window_size 1, 2.875 at window_size 4."""
    jk = bench._jk
    settings = bench.mt.settings(window, 16)
    assert bench._window.auto_window(settings, 6) == held
    gen = torch.Generator().manual_seed(0)
    bits = {}
    for row in bench.ROWS[1:]:
        cache = jk.ChunkCache.with_precision(row.config(window).precision, held, 0)
        for _ in range(6):
            k, v = (torch.randn(1, 2, 384, 64, generator=gen) for _ in range(2))
            cache.append(k, v)
        bits[row.name] = cache.effective_bits
    int2 = jk.QuantSpec(bits=2, group_size=32)
    for name in ("INT2 RTN", "INT2 RTN + correction", "INT2 QuaRot", "INT2 QuaRot + correction"):
        assert bits[name] == pytest.approx(int2.effective_bits) == pytest.approx(2.75)
    assert bits["INT4"] == pytest.approx(4.75)
    assert bits["QVG"] == bits["QVG + correction"]
    assert jk.QuantSpec(bits=2, group_size=64).effective_bits < bits["QVG"] < 3.0
    tier = bits["precision by age"]
    if window == 1:  # newest chunk: keys INT3, values INT4; three chunks INT2 (g64)
        assert tier == pytest.approx((3.375 + 3 * 2.375 + 4.375 + 3 * 2.375) / 8) == pytest.approx(2.75)
        assert tier <= bench.BITS_BOUND
    else:  # the one chunk held: keys INT2, values INT3 (g64), the cheapest tier, over the bound
        assert tier == pytest.approx((2.375 + 3.375) / 2)
        assert tier > bench.BITS_BOUND


def test_latent_ssim_and_psnr(bench):
    gen = torch.Generator().manual_seed(3)
    ref = torch.randn(1, 16, 12, 16, 16, generator=gen, dtype=torch.float64)
    assert bench.latent_ssim(ref, ref) == pytest.approx(1.0, abs=1e-12)
    assert bench.latent_psnr(ref, ref) == math.inf
    noise = torch.randn(ref.shape, generator=gen, dtype=torch.float64)
    ssims = [bench.latent_ssim(ref, ref + s * noise) for s in (0.01, 0.1, 0.5)]
    psnrs = [bench.latent_psnr(ref, ref + s * noise) for s in (0.01, 0.1, 0.5)]
    assert 1 > ssims[0] > ssims[1] > ssims[2] > 0
    assert psnrs[0] > psnrs[1] > psnrs[2]
    # 10x the noise: 20 dB less, whatever the data (PSNR's definition, the reference's range as the peak)
    assert psnrs[0] - psnrs[1] == pytest.approx(20.0, abs=1e-9)
    # the SSIM of a latent is the mean over its (frame, channel) images: one image's SSIM alone is that image's
    one = bench.latent_ssim(ref[:, :1, :1], (ref + 0.1 * noise)[:, :1, :1])
    assert 0 < one < 1


@pytest.mark.slow  # --quick: 36 rollouts, 50-90 s on the shared 2 cores
def test_quick_run_gives_every_row_paired_and_finite(bench, tmp_path):
    r = run_script("benchmarks/magi1_quality.py", "--quick", "--out", str(tmp_path))
    assert "command: python benchmarks/magi1_quality.py --quick --out" in r.stdout
    with open(tmp_path / "magi1_quality_per_seed.csv") as f:
        rows = list(csv.DictReader(f))
    by = {(int(x["window"]), x["row"], int(x["seed_index"])): x for x in rows}
    names = [row.name for row in bench.ROWS]
    assert set(by) == {(w, n, s) for w in (4, 1) for n in names for s in (0, 1)}
    for (_w, name, _s), x in by.items():
        assert x["finite"] == "True"
        psnr, ssim, shift, bits = (float(x[k]) for k in ("psnr", "ssim", "delta_ps", "effective_bits"))
        if name == "BF16":  # the reference itself
            assert (psnr, ssim, shift, bits) == (math.inf, 1.0, 0.0, 32.0)
            continue
        assert math.isfinite(psnr) and 0 < ssim < 1 and math.isfinite(shift) and 2 < bits < 5
    for w in (4, 1):
        for s in (0, 1):
            v = {n: by[(w, n, s)] for n in names}
            # INT4 against INT2, seed by seed (quick run: 60 vs 40-45 dB)
            assert float(v["INT4"]["psnr"]) > float(v["INT2 RTN"]["psnr"]) + 5
            assert float(v["INT4"]["ssim"]) > float(v["INT2 RTN"]["ssim"])
            # the correction lowers the cached mass shift (quick run: 3x to 70x)
            for base in ("INT2 RTN", "INT2 QuaRot", "QVG"):
                assert abs(float(v[f"{base} + correction"]["delta_ps"])) < float(v[base]["delta_ps"])
            # the run's own bytes: the specs' bits; the tier's with the one chunk the quick run holds
            assert float(v["INT2 QuaRot"]["effective_bits"]) == pytest.approx(2.75)
            assert float(v["INT4"]["effective_bits"]) == pytest.approx(4.75)
            tier = float(v["precision by age"]["effective_bits"])
            assert tier == pytest.approx((2.375 + 3.375) / 2 if w == 4 else (3.375 + 4.375) / 2)
    assert "window_size 4: INT2 QuaRot + correction" in r.stdout and "window_size 1: INT2" in r.stdout
