"""``benchmarks/sweep.py``: ``--quick`` runs, writes the CSVs and plots (data only), and INT2 shifts more attention;
the comparison rows it writes hold the numbers of the settings they compare."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
from support import comfyui as support_comfyui

from jensen_testing.pack import load_script, run_script

pytestmark = pytest.mark.slow  # runs benchmarks/sweep.py --quick (minutes on 2 cores)

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "sweep.py"
#: the columns the docs' tables and the plots read (the CSV's full header is the script's ``COLUMNS``, in order)
READ_COLUMNS = {
    "scheme", "bits", "group_size", "correction", "effective_bits", "median_delta_ps", "iqr_delta_ps", "mean_jsd",
    "output_mse", "p95_abs_delta_ps", "p99_abs_delta_ps", "worst_head", "worst_head_p99_abs_delta_ps",
    "wan_latent_psnr_db", "wan_latent_psnr_se_db", "method", "qvg_stages", "qvg_centroids",
}  # fmt: skip
COMPARISON_COLUMNS = ["comparison", "setting", "reference", "metric", "value", "reference_value", "lower_is_better"]


def _sweep_module():
    return load_script("benchmarks/sweep.py")


def test_quick_sweep_writes_csv_and_plots(tmp_path):
    have_wan = support_comfyui.find_comfyui() is not None
    proc = run_script("benchmarks/sweep.py", "--quick", "--out", str(tmp_path), timeout=300)
    assert "elapsed:" in proc.stdout
    assert " wins" not in proc.stdout  # data only: what the numbers say is written in the docs by hand
    if not have_wan:
        assert "tiny Wan part skipped" in proc.stdout

    with open(tmp_path / "sweep.csv", newline="") as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == _sweep_module().COLUMNS and READ_COLUMNS <= set(reader.fieldnames)
        rows = list(reader)
    assert rows[0]["scheme"] == "BF16" and float(rows[0]["effective_bits"]) == 16.0
    qvg = {r["correction"]: r for r in rows[1:] if r["method"] == "qvg"}
    by = {(int(r["bits"]), r["correction"]): r for r in rows[1:] if r["method"] == "rtn"}
    assert set(by) == {(2, "off"), (2, "taylor"), (4, "off"), (4, "taylor")} and set(qvg) == {"off", "taylor"}
    assert float(by[(2, "off")]["effective_bits"]) == 2.75 and float(by[(4, "off")]["effective_bits"]) == 4.75

    def med(b, c, col="median_delta_ps"):
        return float(by[(b, c)][col])

    # INT2 shifts far more attention to cached keys than INT4 (both without correction), and more than BF16
    assert med(2, "off") > 0 and med(2, "off") > 5 * abs(med(4, "off"))
    assert abs(float(rows[0]["median_delta_ps"])) < abs(med(4, "off"))
    # the correction pulls INT2's shift toward zero and lowers its JSD and output MSE
    assert abs(med(2, "taylor")) < 0.5 * med(2, "off")
    assert med(2, "taylor", "mean_jsd") < med(2, "off", "mean_jsd")
    assert med(2, "taylor", "output_mse") < med(2, "off", "output_mse")
    # the tails: |ΔP_S|'s 95th and 99th percentiles bound its median from above (half the queries lie on the
    # median's side), and the worst head's 99th percentile is at least the pooled one (a pooled quantile cannot
    # exceed every head's); the worst head is one of the workload's heads
    for key, row in by.items():
        p95, p99, worst = (
            float(row[c]) for c in ("p95_abs_delta_ps", "p99_abs_delta_ps", "worst_head_p99_abs_delta_ps")
        )
        assert abs(med(*key)) <= p95 <= p99 <= worst * (1 + 1e-6), (key, p95, p99, worst)
        assert row["worst_head"].startswith("head "), row["worst_head"]
    if have_wan:
        psnr = {k: float(r["wan_latent_psnr_db"]) for k, r in by.items()}
        assert all(math.isfinite(p) for p in psnr.values())
        assert psnr[(4, "off")] > psnr[(2, "off")]  # fewer bits, further from the unquantized-cache run
        assert med(2, "off", "wan_median_delta_ps") > 0

    # QVG (K=8 on the quick workload's 256-token chunks): its stored bits count centroids and ids, it
    # reconstructs better than RTN at the same group size, and the correction (residual steps) still helps
    from jensen_core import QuantSpec, method_of

    q_off, q_tay = qvg["off"], qvg["taylor"]
    assert q_off["scheme"] == "QVG" and (q_off["qvg_stages"], q_off["qvg_centroids"]) == ("1", "8")
    spec = QuantSpec(method="qvg", bits=2, group_size=32, qvg_centroids=8)
    assert float(q_off["effective_bits"]) == pytest.approx(method_of(spec).effective_bits_for(spec, 128, 256), rel=1e-5)
    assert float(q_off["output_mse"]) < med(2, "off", "output_mse")
    assert abs(float(q_tay["median_delta_ps"])) < 0.5 * float(q_off["median_delta_ps"])
    assert q_off["wan_latent_psnr_db"] == ""  # QVG rows run on the workload only
    for name in ("fig5_storage_quality.png", "fig4_delta_ps_hist.png"):
        assert (tmp_path / name).stat().st_size > 10_000, name
    if have_wan:
        assert list(tmp_path.glob("wan_diagnostics_*.png"))
    with open(tmp_path / "sweep_comparisons.csv", newline="") as f:
        assert csv.DictReader(f).fieldnames == COMPARISON_COLUMNS


def test_comparisons_carry_the_compared_settings_numbers(tmp_path):
    sweep = _sweep_module()
    Setting, Row = sweep.Setting, sweep.Row

    def row(setting, median, jsd, mse, bits, psnr=None):
        values = {"median_delta_ps": median, "mean_jsd": jsd, "output_mse": mse, "effective_bits": bits}
        if psnr is not None:
            values["wan_latent_psnr_db"] = psnr
        return Row(setting, values)

    int2 = Setting(2, 128, "hadamard", "taylor")
    rows = [
        row(None, 0.0, 1e-7, 1e-9, 16.0),
        row(Setting(2, 128, "hadamard", "off"), 0.05, 0.06, 5e-4, 2.1875, 53.0),
        row(int2, -0.0003, 0.055, 3e-4, 2.1875, 54.0),
        row(Setting(4, 128, "hadamard", "off"), 0.002, 0.0024, 9e-6, 4.1875, 69.0),
        row(Setting(2, 32, "none", "off"), 0.08, 0.11, 4e-3, 2.75),
        row(Setting(2, 64, "none", "taylor", "qvg", 30), 0.001, 0.04, 3e-4, 2.745),
    ]
    got = sweep.comparisons(rows, have_wan=True)
    vs_int4 = {c["metric"]: c for c in got if c["comparison"] == "int2_corrected_vs_int4"}
    assert set(vs_int4) == {"abs_median_delta_ps", "mean_jsd", "output_mse", "wan_latent_psnr_db"}
    assert all(c["setting"] == int2.label() and c["reference"] == "INT4 g128 QuaRot off" for c in vs_int4.values())
    assert (vs_int4["abs_median_delta_ps"]["value"], vs_int4["abs_median_delta_ps"]["reference_value"]) == (
        0.0003,
        0.002,
    )
    assert (vs_int4["wan_latent_psnr_db"]["value"], vs_int4["wan_latent_psnr_db"]["lower_is_better"]) == (54.0, False)
    assert "wan_latent_psnr_db" not in {c["metric"] for c in sweep.comparisons(rows, have_wan=False)}
    # at QVG's 2.75 bits the RTN g32 row competes: QVG wins every metric here
    best = {c["metric"]: c for c in got if c["comparison"] == "best_int2_at_bits"}
    assert {c["reference"] for c in best.values()} == {"2.75 bits"}
    assert (
        best["abs_median_delta_ps"]["setting"] == "INT2 g64 QVG K30 taylor"
        and best["abs_median_delta_ps"]["value"] == 0.001
    )

    modes = [
        row(Setting(2, 32, "none", "off"), 0.08, 0.11, 4e-3, 2.75, 55.0),
        row(Setting(2, 32, "none", "taylor"), 0.02, 0.09, 2e-3, 2.75, 56.0),
        row(Setting(2, 32, "none", "chunk_mean"), -0.035, 0.10, 3e-3, 2.75, 55.5),
    ]
    kept = {c["metric"]: c for c in sweep.modes_comparisons(modes, have_wan=True)}
    assert kept["abs_median_delta_ps_reduction_kept"]["value"] == pytest.approx((0.08 - 0.035) / (0.08 - 0.02))
    assert (kept["mean_jsd"]["value"], kept["mean_jsd"]["reference_value"]) == (0.10, 0.09)
    assert kept["wan_latent_psnr_gain_db"]["value"] == pytest.approx(0.5)
    assert kept["wan_latent_psnr_gain_db"]["reference_value"] == pytest.approx(1.0)

    sweep.write_comparisons(got, tmp_path / "c.csv")
    with open(tmp_path / "c.csv", newline="") as f:
        written = list(csv.DictReader(f))
    assert len(written) == len(got) and written[0]["value"] == "0.0003" and written[0]["lower_is_better"] == "True"
