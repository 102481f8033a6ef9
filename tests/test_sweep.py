"""Smoke test of ``benchmarks/sweep.py --quick``: it runs, writes the CSV and plots, and INT2 shifts more attention."""
from __future__ import annotations

import csv
import math
import subprocess
import sys
from pathlib import Path

import pytest
from support import comfyui as support_comfyui

pytestmark = pytest.mark.slow  # runs benchmarks/sweep.py --quick (minutes on 2 cores)

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "sweep.py"
COLUMNS = [
    "scheme", "rotation", "bits", "group_size", "correction", "effective_bits",
    "median_delta_ps", "q25_delta_ps", "q75_delta_ps", "iqr_delta_ps", "mean_jsd", "output_mse",
    "wan_latent_psnr_db", "wan_latent_psnr_se_db", "wan_latent_mse", "wan_median_delta_ps", "wan_iqr_delta_ps",
    "wan_mean_jsd", "wan_output_mse", "method", "qvg_stages", "qvg_centroids",
]


def test_quick_sweep_writes_csv_and_plots(tmp_path):
    have_wan = support_comfyui.find_comfyui() is not None
    proc = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--out", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "elapsed:" in proc.stdout
    if not have_wan:
        assert "tiny Wan part skipped" in proc.stdout

    with open(tmp_path / "sweep.csv", newline="") as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == COLUMNS
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
    if have_wan:
        psnr = {k: float(r["wan_latent_psnr_db"]) for k, r in by.items()}
        assert all(math.isfinite(p) for p in psnr.values())
        assert psnr[(4, "off")] > psnr[(2, "off")]  # fewer bits, further from the unquantized-cache run
        assert med(2, "off", "wan_median_delta_ps") > 0

    # QVG (K=8 on the quick workload's 256-token chunks): its stored bits count centroids and ids, it
    # reconstructs better than RTN at the same group size, and the correction (residual steps) still helps
    from jensen_core import QuantSpec

    q_off, q_tay = qvg["off"], qvg["taylor"]
    assert q_off["scheme"] == "QVG" and (q_off["qvg_stages"], q_off["qvg_centroids"]) == ("1", "8")
    assert float(q_off["effective_bits"]) == pytest.approx(
        QuantSpec(method="qvg", bits=2, group_size=32, qvg_centroids=8).effective_bits_for(128, 256), rel=1e-5)
    assert float(q_off["output_mse"]) < med(2, "off", "output_mse")
    assert abs(float(q_tay["median_delta_ps"])) < 0.5 * float(q_off["median_delta_ps"])
    assert q_off["wan_latent_psnr_db"] == ""  # QVG rows run on the workload only
    for name in ("fig5_storage_quality.png", "fig4_delta_ps_hist.png"):
        assert (tmp_path / name).stat().st_size > 10_000, name
    if have_wan:
        assert list(tmp_path.glob("wan_diagnostics_*.png"))
