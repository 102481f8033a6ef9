"""``benchmarks/rollout.py``'s statistics: paired differences over seeds, the per-seed CSV, the setting strings."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

import jensen_core

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def rollout():
    spec = importlib.util.spec_from_file_location("rollout_stats_bench", ROOT / "benchmarks" / "rollout.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def test_paired_stats_known_values(rollout):
    # differences 2, 3, 1, 6: mean 3, sample sd sqrt(14 / 3), SE = sd / sqrt(4)
    mean, se, n = rollout.paired_stats([3.0, 5.0, 4.0, 10.0], [1.0, 2.0, 3.0, 4.0])
    assert (mean, n) == (3.0, 4) and se == pytest.approx(math.sqrt(14 / 3) / 2)
    # a pair with a non-finite side is left out, not the whole setting
    assert rollout.paired_stats([3.0, math.inf, 4.0], [1.0, 0.0, 3.0])[::2] == (1.5, 2)
    mean, se, n = rollout.paired_stats([2.0], [1.0])
    assert (mean, n) == (1.0, 1) and math.isnan(se)
    assert rollout.paired_stats([], [])[2] == 0
    with pytest.raises(ValueError, match="one value per seed on both sides, got 2 and 1"):
        rollout.paired_stats([1.0, 2.0], [1.0])


def _row(rollout, setting, seed, psnr):
    row = {f: 0 for f in rollout.PER_SEED_FIELDS}
    row.update(setting=setting, seed=seed, latent_psnr=psnr)
    return row


def test_paired_table_matches_seeds_not_positions(rollout):
    a, b = "INT2 g32 QuaRot + taylor", "INT2 g32 QuaRot"
    rows = [_row(rollout, a, s, p) for s, p in ((0, 20.0), (1, 22.0), (2, 25.0), (3, 30.0))]
    rows += [_row(rollout, b, s, p) for s, p in ((2, 24.0), (0, 19.0), (1, 21.5))]  # seed 3 missing, other order
    (out,) = rollout.paired_table(rows, [(a, b, "correction")], metrics=("latent_psnr",))
    # per-seed differences 1.0, 0.5, 1.0
    assert (out["a"], out["b"], out["kind"], out["n"]) == (a, b, "correction", 3)
    assert out["mean_diff"] == pytest.approx(2.5 / 3)
    assert out["se"] == pytest.approx(math.sqrt(((1 / 6) ** 2 * 2 + (1 / 3) ** 2) / 2) / math.sqrt(3))
    md = rollout.paired_markdown([out])
    assert md[2] == f"| {a} − {b} | correction | 3 | +0.83 ± {out['se']:.2f} |"


def test_per_seed_csv_schema_round_trips_and_refuses_other_columns(rollout, tmp_path):
    assert rollout.PER_SEED_FIELDS[:2] == ("setting", "seed") and set(rollout.METRICS) <= set(rollout.PER_SEED_FIELDS)
    rows = [_row(rollout, "INT2 g32 RTN", s, 20.0 + s) for s in range(3)]
    path = tmp_path / "per_seed.csv"
    rollout.write_csv(path, rollout.PER_SEED_FIELDS, rows)
    header = path.read_text().splitlines()[0]
    assert header == ",".join(rollout.PER_SEED_FIELDS)
    back = rollout.read_per_seed(path)
    assert [(r["setting"], int(r["seed"]), float(r["latent_psnr"])) for r in back] == [
        ("INT2 g32 RTN", s, 20.0 + s) for s in range(3)
    ]
    bad = tmp_path / "bad.csv"
    bad.write_text("setting,seed,latent_psnr\nx,0,1\n")
    with pytest.raises(ValueError, match="not the per-seed schema"):
        rollout.read_per_seed(bad)


def test_paired_from_recomputes_the_table_of_a_stored_run(rollout, tmp_path, capsys):
    a, b = "INT2 g128 RTN + taylor", "INT2 g128 RTN"
    rows = [
        _row(rollout, n, s, p + (1.0 if n == a else 0.0) * (s + 1)) for n in (b, a) for s, p in ((0, 18.0), (1, 19.0))
    ]
    path = tmp_path / "run_per_seed.csv"
    rollout.write_csv(path, rollout.PER_SEED_FIELDS, rows)
    assert rollout.main(["--paired-from", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"| {a} − {b} | correction | 2 | +1.50 ± 0.50 |" in out


def test_settings_are_spec_strings_that_round_trip(rollout):
    grids = [rollout.grid(False), rollout.grid(True), rollout.grid(False, modes=True), rollout.grid(False, full=True)]
    for cfg in (c for g in grids for c in g):
        assert rollout.parse_setting(cfg.name) == cfg
    qvg = rollout.parse_setting("INT2 g64 QVG+QuaRot + taylor x1.5")
    assert (qvg.qvg, qvg.centroids, qvg.rotation, qvg.correction, qvg.strength) == (True, 0, "hadamard", "taylor", 1.5)
    assert qvg.k_used(jensen_core) == 4  # auto K on the tiny model's 192-token chunks
    assert qvg.effective_bits(jensen_core) == pytest.approx(2.375 + 8 / 128 + 16 * 4 / 192)
    assert rollout.parse_setting("INT2 g64 QVG K2").centroids == 2
    assert rollout.parse_setting("full precision").bits is None
    for bad in ("INT5 g32 RTN", "INT2 g32 Quarot", "INT2 g32 RTN + taylr"):
        with pytest.raises(ValueError, match="does not parse; write 'full precision' or 'INT<bits>"):
            rollout.parse_setting(bad)
    with pytest.raises(ValueError, match=r"option\(s\) \['tires'\] have no handler"):
        rollout.parse_setting("INT2 g32 QuaRot tires=recent1@4")


def test_headline_run_pairs_every_correction_and_fits_an_hour_at_8_seeds(rollout, monkeypatch):
    configs = rollout.grid(False)
    assert [c.name for c in configs] == list(rollout.HEADLINE)
    pairs = rollout.pairs_for(configs)
    corrected = [c.name for c in configs if c.correction != "off"]
    assert [a for a, _, k in pairs if k == "correction"] == corrected
    assert ("INT2 g64 QVG+QuaRot + taylor", "INT2 g32 QuaRot + taylor", "setting") in pairs
    args = rollout.parse_args([])
    assert args.seeds >= 8 and args.chunks == 32
    minutes = (len(configs) + 1) * args.seeds * rollout.SECONDS_PER_ROLLOUT / 60  # + the reference rollout
    assert minutes <= 60
    # the headline tier setting is paired with uniform INT2 and with INT4 g128 (issue 21's gap), labelled "tier"
    tier = "INT2 g128 QuaRot + taylor tiers=recent1@4"
    assert (tier, "INT2 g128 QuaRot + taylor", "tier") in pairs and (tier, "INT4 g128 QuaRot", "tier") in pairs
    # a tier setting is one line per setting and pair; its pair is labelled "tier"
    tiered = rollout.parse_setting("INT2 g32 QuaRot + taylor tiers=recent2@4")
    assert tiered.options == (("tiers", "recent2@4"),) and rollout.parse_setting(tiered.name) == tiered
    extra = (*rollout.HEADLINE_PAIRS, (tiered.name, "INT2 g32 QuaRot + taylor"))
    got = rollout.pairs_for([*configs, tiered], extra)
    assert (tiered.name, "INT2 g32 QuaRot + taylor", "tier") in got
    assert (tiered.name, "INT2 g32 QuaRot tiers=recent2@4", "correction") not in got  # its uncorrected twin did not run


def test_fig5_tells_tiers_and_qvg_apart_and_redraws_from_a_summary(rollout, tmp_path):
    """The Fig. 5 plot's families: uniform RTN / QuaRot, QVG (auto K too) and age tiers on top of any of them."""
    fam = {s: rollout.family(rollout.parse_setting(s)) for s in rollout.HEADLINE}
    assert fam["INT2 g32 RTN"] == "RTN" and fam["INT2 g32 QuaRot + taylor"] == "QuaRot"
    assert fam["INT2 g64 QVG+QuaRot + taylor"] == "QVG"
    assert fam["INT2 g128 QuaRot + taylor tiers=recent1@4k0"] == "tiers" == fam["INT2 g128 QuaRot tiers=recent1@4"]
    pytest.importorskip("matplotlib")
    src = ROOT / "docs" / "results" / "rollout_tiers_paired_summary.csv"
    summary = tmp_path / "x_summary.csv"
    summary.write_text(src.read_text())
    assert rollout.main(["--fig5-from", str(summary)]) == 0
    png = tmp_path / "x_fig5.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    with pytest.raises(SystemExit, match="is not a <stem>_summary.csv"):
        rollout.fig5_from(src.with_name("rollout_tiers_paired_per_seed.csv"))


def test_paired_from_joins_runs_of_the_same_seeds_and_takes_extra_pairs(rollout, capsys):
    res = ROOT / "docs" / "results"
    sides, tiers = res / "rollout_tier_sides_per_seed.csv", res / "rollout_tiers_paired_per_seed.csv"
    pair = "INT2 g128 QuaRot + taylor tiers=recent1@4k3 => INT2 g128 QuaRot + taylor"
    assert rollout.parse_pair(pair) == ("INT2 g128 QuaRot + taylor tiers=recent1@4k3", "INT2 g128 QuaRot + taylor")
    assert rollout.main(["--paired-from", str(sides), str(tiers), "--pair", pair]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("| INT2 g128 QuaRot + taylor tiers=recent1@4k3 −"))
    # the mean of the per-seed differences, from the two files' rows of the same seeds
    a = {r["seed"]: float(r["latent_psnr"]) for r in rollout.read_per_seed(sides) if "4k3" in r["setting"]}
    b = {r["seed"]: float(r["latent_psnr"]) for r in rollout.read_per_seed(tiers) if r["setting"].endswith("+ taylor")}
    mean = sum(a[s] - b[s] for s in a) / len(a)
    assert len(a) == 8 and f"{mean:+.2f} ±" in line
    with pytest.raises(ValueError, match="in both"):
        rollout.paired_from([tiers, tiers], None)
    with pytest.raises(ValueError, match="does not parse"):
        rollout.parse_pair("INT2 g32 QuaRot")
