"""The paper's Table 1 and Fig. 5 on the pack's trained tiny AR model: quantized caches over long rollouts.

    python benchmarks/rollout.py            # 8 seeds x 32 chunks, the 18 HEADLINE settings (about 50 min, 2 cores)
    python benchmarks/rollout.py --full --seeds 4   # the old default: 34 settings (54 min on one core)
    python benchmarks/rollout.py --quick    # 1 seed x 4 chunks, 4 configurations (about a minute)
    python benchmarks/rollout.py --settings "INT2 g32 QuaRot; INT2 g32 QuaRot + taylor"   # any settings
    python benchmarks/rollout.py --paired-from docs/results/rollout_per_seed.csv   # the paired table again
    python benchmarks/rollout.py --fig5-from docs/results/rollout_summary.csv      # the Fig. 5 plot again
    python benchmarks/rollout.py --modes    # correction modes and QVG side by side at INT2 (rollout_modes_*.csv)

Every rollout continues a held-out ground-truth video: its first ``--prefix`` chunks are written into
the cache (the sampler's prefix input), then ``--chunks`` chunks are generated with a cache window of
3 chunks (the training window; the rollout goes far beyond the 5 chunks the model was trained on).
Every configuration of one seed sees identical noise (the chunk loop derives each chunk's noise from
the seed and the chunk index), so differences come from the cache alone.

Measured per configuration, against the same seed's rollout with a full-precision cache (fp32 here,
the model's dtype on the CPU):

- per-chunk latent PSNR (model space, peak = the reference rollout's range) and, on the decoded
  frames (the fixed latent -> RGB map), PSNR (peak 1) and SSIM;
- the attention diagnostics of the same runs (KV Cache Diagnostics: every layer and head, denoising
  steps 0 and 4, every 4th query): median attention-mass shift onto the cache (dP_S) and mean JSD;
- the full-precision rollouts' object-position error against the ground-truth continuation (the
  data's physics) after 8, 16 and 32 chunks.

Writes ``<out>/rollout_summary.csv`` (one row per configuration, means and standard errors over
seeds), ``<out>/rollout_per_seed.csv`` (one row per configuration and seed: :data:`PER_SEED_FIELDS`),
``<out>/rollout_paired.csv`` (paired differences a - b over the seeds both ran: mean, SE = sd / sqrt(n),
n; every "+ correction" setting against the same one without, and :data:`HEADLINE_PAIRS`),
``<out>/rollout_per_chunk.csv``, ``<out>/rollout_drift.png`` (PSNR against chunk index) and
``<out>/rollout_fig5.png`` (PSNR against effective bits), and prints the README table and the paired one.
Settings are spec strings (:func:`parse_setting`, the form of :attr:`Config.name`).
"""

from __future__ import annotations

import argparse
import csv
import importlib
import math
import re
import shlex
import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: denoising steps the attention diagnostics sample (0-based): the first, at full noise, and the middle one
DIAG_STEPS = "0, 4"
if str(ROOT) not in sys.path:  # the pack's jensen_core and jensen_testing; appended, so ComfyUI's folder stays first
    sys.path.append(str(ROOT))

from jensen_testing import comfyui as support_comfyui  # noqa: E402

#: the correction modes a setting string may name after " + "
CORRECTIONS = ("taylor", "chunk_mean", "exact", "per_channel")
_SETTING = re.compile(
    r"^INT(?P<bits>[2348]) g(?P<group>\d+) "
    r"(?:(?P<qvg>QVG(?: K(?P<k>\d+))?)(?P<qrot>\+QuaRot)?|(?P<rot>RTN|QuaRot))"
    r"(?: \+ (?P<corr>" + "|".join(CORRECTIONS) + r")(?: x(?P<lam>\d+(?:\.\d+)?))?)?"
    r"(?P<extra>(?: [a-z_]+=\S+)*)$"
)
SETTING_GRAMMAR = (
    "'full precision' or 'INT<bits> g<group> <scheme>[ + <correction>[ x<strength>]][ key=value ...]' with scheme "
    "RTN, QuaRot, QVG (auto K), QVG K<k>, QVG+QuaRot or QVG K<k>+QuaRot and correction one of "
    + ", ".join(CORRECTIONS)
    + "; e.g. 'INT2 g32 QuaRot + taylor', 'INT2 g64 QVG+QuaRot + taylor x1.5'"
)


@dataclass(frozen=True)
class Config:
    """One rollout setting; :func:`parse_setting` reads it from its name (the spec string), :attr:`name` writes it."""

    bits: int | None  # None: full precision (the reference)
    group: int = 32
    rotation: str = "hadamard"
    correction: str = "off"
    strength: float = 1.0
    qvg: bool = False  # QVG: k-means smoothing (one stage) before RTN of the residual
    centroids: int = 0  # QVG's K; 0 = auto (picked from the chunk's tokens: 4 on the tiny model's 192-token chunks)
    #: ``key=value`` options after the setting (e.g. precision-by-age tiers): each needs a handler in OPTIONS
    options: tuple[tuple[str, str], ...] = ()

    @property
    def name(self) -> str:
        if self.bits is None:
            return "full precision"
        rot = "QuaRot" if self.rotation == "hadamard" else "RTN"
        if self.qvg:
            rot = "QVG" + (f" K{self.centroids}" if self.centroids else "") + ("+QuaRot" if rot == "QuaRot" else "")
        corr = (
            ""
            if self.correction == "off"
            else f" + {self.correction}" + (f" x{self.strength:g}" if self.strength != 1.0 else "")
        )
        opts = "".join(f" {k}={v}" for k, v in self.options)
        return f"INT{self.bits} g{self.group} {rot}{corr}{opts}"

    @property
    def uncorrected(self) -> Config:
        """The same setting without the correction (the other side of a correction pair)."""
        return replace(self, correction="off", strength=1.0)

    def spec(self, core):
        extra = {"method": "qvg", "qvg_centroids": self.centroids} if self.qvg else {}
        return core.QuantSpec(bits=self.bits, group_size=self.group, rotation=self.rotation, **extra)

    def k_used(self, core, chunk_tokens: int = 192) -> int:
        """QVG's K on the tiny model's chunks (what auto picks there), 0 without QVG."""
        if not self.qvg or self.bits is None:
            return 0
        spec = self.spec(core)
        return core.method_of(spec).centroids_per_chunk(spec, chunk_tokens)

    def effective_bits(self, core, chunk_tokens: int = 192, head_dim: int = 128) -> float:
        """Stored bits per cached element; QVG's centroids and ids counted on the tiny model's 192-token chunks."""
        if self.bits is None:
            return 32.0
        spec = self.spec(core)
        return core.method_of(spec).effective_bits_for(spec, head_dim, chunk_tokens)


def parse_setting(text: str) -> Config:
    """A setting from its spec string (the :attr:`Config.name` form); a ValueError names what does not parse."""
    t = " ".join(str(text).split())
    if t.lower() in ("full precision", "fp32", "full"):
        return Config(None)
    m = _SETTING.match(t)
    if not m:
        raise ValueError(f"setting {text!r} does not parse; write {SETTING_GRAMMAR}")
    opts = tuple(tuple(o.split("=", 1)) for o in m["extra"].split())
    unknown = [k for k, _ in opts if k not in OPTIONS]
    if unknown:
        raise ValueError(
            f"setting {text!r}: option(s) {unknown} have no handler; known: {sorted(OPTIONS) or 'none yet'} "
            "(add one to OPTIONS in benchmarks/rollout.py)"
        )
    return Config(
        int(m["bits"]),
        int(m["group"]),
        "hadamard" if (m["qrot"] or m["rot"] == "QuaRot") else "none",
        m["corr"] or "off",
        float(m["lam"]) if m["lam"] else 1.0,
        qvg=bool(m["qvg"]),
        centroids=int(m["k"] or 0),
        options=opts,
    )


#: ``key=value`` setting options -> a function (node module, model, value) -> patched model, applied after
#: Quantize KV Cache and before the correction. Precision-by-age tiers plug in here (one entry), then their
#: settings and pairs are one line each in HEADLINE and HEADLINE_PAIRS.
def _tiers_option(nodes, model, value: str):
    """``tiers=recent1@4`` (jensen_core.tiers' form): precision by age on top of Quantize KV Cache's specs."""
    pack = nodes.__name__.rsplit(".", 1)[0]
    config = importlib.import_module(f"{pack}.runtime.config")
    tiers = importlib.import_module(f"{pack}.jensen_core.tiers").parse_tiers(value)
    upstream = config.get_config(model.model_options)
    work = model.clone()
    config.set_config(work, upstream.with_specs(upstream.spec_k, upstream.spec_v, tiers))
    return work


OPTIONS: dict = {"tiers": _tiers_option}

#: the default run's settings: every headline pair below, 8 seeds x 32 chunks in about 50 minutes on 2 cores
#: (19 rollouts per seed with the reference; the old 34-setting grid took 3227 s for 4 seeds)
HEADLINE = (
    "INT2 g32 RTN",
    "INT2 g32 RTN + taylor",
    "INT2 g128 RTN",
    "INT2 g128 RTN + taylor",
    "INT2 g32 QuaRot",
    "INT2 g32 QuaRot + taylor",
    "INT2 g128 QuaRot",
    "INT2 g128 QuaRot + taylor",
    "INT2 g64 QVG+QuaRot",
    "INT2 g64 QVG+QuaRot + taylor",
    "INT3 g128 QuaRot",
    "INT3 g128 QuaRot + taylor",
    "INT4 g128 QuaRot",
    "INT4 g128 QuaRot + taylor",
    "INT2 g128 QuaRot tiers=recent1@4",  # precision by age: the newest cached chunk at INT4 (docs/tiers.md)
    "INT2 g128 QuaRot + taylor tiers=recent1@4",
    "INT2 g128 QuaRot tiers=recent1@4k0",  # the newest chunk's values alone at INT4: 2.52 bits (docs/tiers.md)
    "INT2 g128 QuaRot + taylor tiers=recent1@4k0",
)
#: paired differences (a - b, seed by seed) besides every "+ correction" against the same setting without it;
#: precision-by-age tiers add theirs here: ("<setting> tiers=...", "<the same setting, uniform>")
HEADLINE_PAIRS: tuple[tuple[str, str], ...] = (
    ("INT2 g64 QVG+QuaRot + taylor", "INT2 g32 QuaRot + taylor"),  # QVG against QuaRot at ~2.75 bits
    ("INT2 g32 QuaRot", "INT2 g32 RTN"),  # the rotation alone
    ("INT2 g128 QuaRot + taylor tiers=recent1@4", "INT2 g128 QuaRot + taylor"),  # the tier against uniform INT2
    ("INT2 g128 QuaRot + taylor tiers=recent1@4", "INT4 g128 QuaRot"),  # issue 21's gap to INT4 g128
    ("INT2 g128 QuaRot + taylor tiers=recent1@4k0", "INT2 g128 QuaRot + taylor"),  # values-only tier against uniform
    ("INT2 g128 QuaRot + taylor tiers=recent1@4k0", "INT2 g64 QVG+QuaRot + taylor"),  # against QVG at <= 2.75 bits
    ("INT2 g128 QuaRot + taylor tiers=recent1@4k0", "INT4 g128 QuaRot"),  # the gap to INT4 g128 at <= 2.75 bits
)
#: seconds one 32-chunk rollout took in the old default run: 3227 s / (4 seeds x ~44 setting-equivalents)
SECONDS_PER_ROLLOUT = 3227 / (4 * 44)
#: the per-seed metrics (one value per setting and seed) and the ones the paired table shows
METRICS = (
    "latent_psnr",
    "rgb_psnr",
    "ssim",
    "latent_psnr_first_chunk",
    "latent_psnr_last_chunk",
    "median_delta_ps",
    "mean_jsd",
)
PAIRED_METRICS = ("latent_psnr", "latent_psnr_last_chunk", "rgb_psnr", "ssim")
PER_SEED_FIELDS = (
    "setting",
    "seed",
    "noise_seed",
    "prompt",
    "video_seed",
    "effective_bits",
    "qvg_k",
    *METRICS,
    "seconds",
)
PAIRED_FIELDS = ("a", "b", "kind", "metric", "mean_diff", "se", "n")


def grid(quick: bool, modes: bool = False, full: bool = False) -> list[Config]:
    if modes:  # the correction modes side by side at INT2 (chunk_mean against taylor), and QVG
        # at the bits of RTN g32 (QVG g64 K4: 2.77 bits on 192-token chunks) and g64 (QVG g128 K2: 2.42)
        return [
            Config(2, g, r, c) for r in ("none", "hadamard") for g in (32, 128) for c in ("off", "taylor", "chunk_mean")
        ] + [
            Config(2, g, "hadamard", c, qvg=True, centroids=k)
            for g, k in ((64, 4), (128, 2))
            for c in ("off", "taylor", "chunk_mean")
        ]
    if quick:
        return [
            parse_setting(s)
            for s in ("INT2 g32 QuaRot", "INT2 g32 QuaRot + taylor", "INT4 g32 QuaRot", "INT2 g128 RTN + taylor")
        ]
    if not full:
        return [parse_setting(s) for s in HEADLINE]
    # the old default (--full): the exact correction only at INT2, where the bias it removes beyond Taylor's is
    # largest (it costs about 3x a Taylor run here, and at 3 and 4 bits the two agree to the noise of the rollouts)
    out = [
        Config(b, g, r, c)
        for b in (2, 3, 4)
        for r in ("none", "hadamard")
        for g in (32, 128)
        for c in ("off", "taylor") + (("exact",) if b == 2 else ())
    ]
    out += [Config(2, g, "hadamard", "taylor", lam) for g in (32, 128) for lam in (0.5, 1.5, 2.0)]
    return out


def pairs_for(configs: list[Config], extra: tuple[tuple[str, str], ...] = HEADLINE_PAIRS) -> list[tuple[str, str, str]]:
    """(a, b, kind) of the paired differences the run can report: each corrected setting against the same one
    uncorrected ("correction"), then the ``extra`` pairs both of whose settings ran ("tier" when a names options)."""
    names = {c.name for c in configs}
    out = [
        (c.name, c.uncorrected.name, "correction")
        for c in configs
        if c.correction != "off" and c.uncorrected.name in names
    ]
    for a, b in extra:
        a, b = parse_setting(a).name, parse_setting(b).name
        if a in names and b in names and (a, b) not in {(x, y) for x, y, _ in out}:
            out.append((a, b, "tier" if parse_setting(a).options else "setting"))
    return out


def paired_stats(a: list[float], b: list[float]) -> tuple[float, float, int]:
    """Mean of the paired differences a_i - b_i, its standard error sd / sqrt(n) (sample sd, n - 1), and n.

    Pairs with a non-finite side are left out; the SE is nan below 2 pairs (and the mean below 1)."""
    if len(a) != len(b):
        raise ValueError(f"paired_stats needs one value per seed on both sides, got {len(a)} and {len(b)}")
    d = [x - y for x, y in zip(a, b) if math.isfinite(x) and math.isfinite(y)]
    n = len(d)
    if n == 0:
        return float("nan"), float("nan"), 0
    mean = statistics.fmean(d)
    return mean, (statistics.stdev(d) / math.sqrt(n) if n > 1 else float("nan")), n


def paired_table(per_seed: list[dict], pairs: list[tuple[str, str, str]], metrics=PAIRED_METRICS) -> list[dict]:
    """Rows of :data:`PAIRED_FIELDS` from per-seed rows (:data:`PER_SEED_FIELDS`), matched by seed."""
    by: dict[tuple[str, int], dict] = {(r["setting"], int(r["seed"])): r for r in per_seed}
    out = []
    for a, b, kind in pairs:
        seeds = sorted(s for (name, s) in by if name == a and (b, s) in by)
        for metric in metrics:
            mean, se, n = paired_stats(
                [float(by[a, s][metric]) for s in seeds], [float(by[b, s][metric]) for s in seeds]
            )
            out.append({"a": a, "b": b, "kind": kind, "metric": metric, "mean_diff": mean, "se": se, "n": n})
    return out


def write_csv(path: Path, fields: tuple[str, ...], rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(fields))
        w.writeheader()
        w.writerows({k: r[k] for k in fields} for r in rows)


def read_per_seed(path: Path) -> list[dict]:
    """The per-seed CSV back, checking its columns (so a paired table can be recomputed from a stored run)."""
    with open(path, newline="") as f:
        r = csv.DictReader(f)
        if tuple(r.fieldnames or ()) != PER_SEED_FIELDS:
            raise ValueError(f"{path}: columns {r.fieldnames} are not the per-seed schema {list(PER_SEED_FIELDS)}")
        return list(r)


def paired_markdown(rows: list[dict]) -> list[str]:
    """The paired table as markdown: one line per pair, mean difference ± SE per metric."""
    metrics = list(dict.fromkeys(r["metric"] for r in rows))
    head = {"latent_psnr": "Δ latent PSNR (dB)", "latent_psnr_last_chunk": "Δ last chunk (dB)",
            "rgb_psnr": "Δ RGB PSNR (dB)", "ssim": "Δ SSIM"}  # fmt: skip
    lines = [
        "| a − b (paired by seed) | kind | n | " + " | ".join(head.get(m, "Δ " + m) for m in metrics) + " |",
        "|---|---|---|" + "---|" * len(metrics),
    ]
    by = {}
    for r in rows:
        by.setdefault((r["a"], r["b"], r["kind"]), {})[r["metric"]] = r
    for (a, b, kind), ms in by.items():
        n = next(iter(ms.values()))["n"]
        cells = []
        for m in metrics:
            r = ms[m]
            digits = 4 if m == "ssim" else 2
            cells.append(f"{r['mean_diff']:+.{digits}f} ± {r['se']:.{digits}f}")
        lines.append(f"| {a} − {b} | {kind} | {n} | " + " | ".join(cells) + " |")
    return lines


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="1 seed, 4 chunks, 4 configurations")
    p.add_argument("--seeds", type=int, default=8, help="held-out videos (the paired table wants >= 8)")
    p.add_argument("--chunks", type=int, default=32, help="generated chunks per rollout")
    p.add_argument("--prefix", type=int, default=2, help="ground-truth chunks written into the cache first")
    p.add_argument("--steps", type=int, default=None, help="denoising steps per chunk (default: the demo's)")
    p.add_argument("--model", type=Path, default=None, help="a tiny AR checkpoint (default: models/tiny_ar)")
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "results")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument(
        "--modes",
        action="store_true",
        help="INT2 RTN / QuaRot / QVG, off / taylor / chunk_mean: writes rollout_modes_*.csv, no plots",
    )
    p.add_argument("--full", action="store_true", help="the old 34-setting grid (about 2 hours at 8 seeds)")
    p.add_argument(
        "--settings",
        action="append",
        default=None,
        help="run these settings instead of a grid (repeatable, or ';'-separated spec strings like "
        "'INT2 g32 QuaRot + taylor')",
    )
    p.add_argument("--stem", default=None, help="output file prefix (default: rollout, or rollout_modes)")
    p.add_argument(
        "--paired-from",
        type=Path,
        nargs="+",
        default=None,
        help="recompute the paired-difference table from the per-seed CSVs of earlier runs (same seeds), run nothing",
    )
    p.add_argument(
        "--pair",
        action="append",
        default=[],
        help="one more paired difference, '<setting a> => <setting b>' (repeatable; with --paired-from or a run)",
    )
    p.add_argument(
        "--fig5-from",
        type=Path,
        default=None,
        help="redraw <stem>_fig5.png from a <stem>_summary.csv of an earlier run, run nothing",
    )
    a = p.parse_args(argv)
    if a.settings:
        a.settings = [parse_setting(t) for arg in a.settings for t in arg.split(";") if t.strip()]
    a.pair = [parse_pair(t) for t in a.pair]
    if a.quick:
        a.seeds, a.chunks = 1, 4
    if a.modes:
        a.no_plots = True
    return a


def parse_pair(text: str) -> tuple[str, str]:
    """``"<setting a> => <setting b>"`` (``--pair``): one more paired difference a - b."""
    if text.count("=>") != 1:
        raise ValueError(f"pair {text!r} does not parse; write '<setting a> => <setting b>'")
    a, b = (parse_setting(t).name for t in text.split("=>"))
    return a, b


def paired_from(paths: list[Path], out: Path | None, extra: tuple[tuple[str, str], ...] = ()) -> int:
    """Print (and with ``out`` write) the paired table of stored per-seed CSVs: runs of the same seeds (and so
    the same videos and noise) join, a setting found in two of them is refused."""
    rows, where = [], {}
    for path in paths:
        got = read_per_seed(path)
        for name in dict.fromkeys(r["setting"] for r in got):
            if name in where:
                raise ValueError(f"setting {name!r} is in both {where[name]} and {path}: give each setting once")
            where[name] = path
        rows += got
    order = list(dict.fromkeys(r["setting"] for r in rows))
    table = paired_table(rows, pairs_for([parse_setting(n) for n in order], (*HEADLINE_PAIRS, *extra)))
    print("\n".join(paired_markdown(table)))
    if out is not None:
        write_csv(out, PAIRED_FIELDS, table)
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.paired_from is not None:
        return paired_from(args.paired_from, None, tuple(args.pair))
    if args.fig5_from is not None:
        return fig5_from(args.fig5_from)
    support_comfyui.setup_inprocess_comfyui()

    import torch

    from jensen_testing import tiny_ar

    pack = support_comfyui.import_pack()
    nodes = importlib.import_module(f"{pack.__name__}.nodes")
    core = importlib.import_module(f"{pack.__name__}.jensen_core")
    tv = tiny_ar.core()
    model = tiny_ar.load_model(args.model or tiny_ar.MODEL_PATH)
    F = tiny_ar.CHUNK_FRAMES
    configs = args.settings or grid(args.quick, args.modes, args.full)
    stem = args.stem or ("rollout_modes" if args.modes else "rollout")
    cost = sum(3 if c.correction == "exact" else 1 for c in configs) + 1  # + the full-precision reference
    print(
        f"{len(configs)} settings x {args.seeds} seeds x {args.chunks} chunks: about "
        f"{cost * args.seeds * args.chunks / 32 * SECONDS_PER_ROLLOUT / 60:.0f} min on 2 quiet cores "
        f"({SECONDS_PER_ROLLOUT:.1f} s per 32-chunk rollout, the old default run's rate)",
        flush=True,
    )

    def patched(cfg: Config):
        qvg = ("qvg", 1, cfg.centroids) if cfg.qvg else ()
        m = nodes.JensenKVQuantizeKVCache.execute(
            model, str(cfg.bits), str(cfg.bits), str(cfg.group), cfg.rotation, "fp8_e4m3", 0, *qvg
        ).args[0]
        for key, value in cfg.options:
            m = OPTIONS[key](nodes, m, value)
        if cfg.correction != "off":
            m = nodes.JensenKVBiasCorrection.execute(m, cfg.correction, cfg.strength).args[0]
        return nodes.JensenKVDiagnostics.execute(m, "all", "all", DIAG_STEPS, 4).args[0]

    def rollout(m, prompt, vseed, seed):
        return tiny_ar.rollout(
            m, prompt, vseed, seed, args.chunks, args.prefix, args.steps or tiny_ar.STEPS, with_report=True
        )

    t_start = time.perf_counter()
    videos = tiny_ar.held_out(args.seeds)
    per_chunk: dict[str, list[list[tuple[float, float, float]]]] = {c.name: [] for c in configs}
    diag: dict[str, list[tuple[float, float]]] = {c.name: [] for c in configs}
    physics: list[list[float]] = []
    per_seed: list[dict] = []
    for i, (prompt, vseed) in enumerate(videos):
        seed = 100 + i
        ref, _ = rollout(model, prompt, vseed, seed)
        scene = tv.make_scene(prompt, vseed)
        start = args.prefix * F
        pos, found = tv.estimate_positions(scene, ref, start)
        gt = tv.object_positions(scene, range(start, start + args.chunks * F))
        err = (pos - gt).norm(dim=-1)
        err = torch.where(found, err, torch.full_like(err, float("nan")))
        physics.append([float(torch.nanmean(err[c * F : (c + 1) * F])) for c in range(args.chunks)])
        ref_rgb = tv.to_rgb(ref)
        peak = float(ref.max() - ref.min())
        for cfg in configs:
            t0 = time.perf_counter()
            x, report = rollout(patched(cfg), prompt, vseed, seed)
            took = time.perf_counter() - t0
            rgb = tv.to_rgb(x)
            rows = []
            for c in range(args.chunks):
                sl = slice(c * F, (c + 1) * F)
                rows.append(
                    (
                        tiny_ar.psnr(ref[:, sl], x[:, sl], peak),
                        tiny_ar.psnr(ref_rgb[sl], rgb[sl], 1.0),
                        tiny_ar.ssim(ref_rgb[sl], rgb[sl]),
                    )
                )
            per_chunk[cfg.name].append(rows)
            st = report["diagnostics"]["stats"]
            mode = cfg.correction
            diag[cfg.name].append((st[mode]["median_delta_ps"], st[mode]["mean_jsd"]))
            row = {
                "setting": cfg.name,
                "seed": i,
                "noise_seed": seed,
                "prompt": prompt,
                "video_seed": vseed,
                # a tiered run's average bits depend on how many chunks it held: the run's own (its report)
                "effective_bits": report["effective_bits"] if cfg.options else cfg.effective_bits(core),
                "qvg_k": cfg.k_used(core),
                "latent_psnr": statistics.fmean(r[0] for r in rows),
                "rgb_psnr": statistics.fmean(r[1] for r in rows),
                "ssim": statistics.fmean(r[2] for r in rows),
                "latent_psnr_first_chunk": rows[0][0],
                "latent_psnr_last_chunk": rows[-1][0],
                "median_delta_ps": st[mode]["median_delta_ps"],
                "mean_jsd": st[mode]["mean_jsd"],
                "seconds": round(took, 2),
            }
            per_seed.append(row)
        print(f"seed {i + 1}/{len(videos)} (prompt {prompt}) done at {time.perf_counter() - t_start:.0f} s", flush=True)

    # ------------------------------------------------------------------ summary
    def mean_se(values):
        vals = [v for v in values if math.isfinite(v)]
        if not vals:
            return float("nan"), float("nan")
        m = statistics.fmean(vals)
        return m, (statistics.stdev(vals) / math.sqrt(len(vals)) if len(vals) > 1 else 0.0)

    summary = []
    for cfg in configs:
        runs = per_chunk[cfg.name]
        seed_means = [statistics.fmean(r[k] for r in rows) for rows in runs for k in (0,)]
        rgb_means = [statistics.fmean(r[1] for r in rows) for rows in runs]
        ssim_means = [statistics.fmean(r[2] for r in rows) for rows in runs]
        last = [rows[-1][0] for rows in runs]
        first = [rows[0][0] for rows in runs]
        row = {
            "config": cfg.name,
            "bits": cfg.bits,
            "group": cfg.group,
            "rotation": cfg.rotation,
            "correction": cfg.correction,
            "strength": cfg.strength,
            "centroids": cfg.k_used(core),
            "effective_bits": statistics.fmean(r["effective_bits"] for r in per_seed if r["setting"] == cfg.name),
        }
        for key, vals in (
            ("latent_psnr", seed_means),
            ("rgb_psnr", rgb_means),
            ("ssim", ssim_means),
            ("latent_psnr_first_chunk", first),
            ("latent_psnr_last_chunk", last),
        ):
            row[key], row[key + "_se"] = mean_se(vals)
        row["median_delta_ps"], row["median_delta_ps_se"] = mean_se([d[0] for d in diag[cfg.name]])
        row["mean_jsd"], row["mean_jsd_se"] = mean_se([d[1] for d in diag[cfg.name]])
        summary.append(row)
    phys = {c: mean_se([p[c - 1] for p in physics]) for c in (1, 8, 16, 32) if c <= args.chunks}

    args.out.mkdir(parents=True, exist_ok=True)
    write_csv(args.out / f"{stem}_per_seed.csv", PER_SEED_FIELDS, per_seed)
    pairs = pairs_for(configs, (*HEADLINE_PAIRS, *args.pair))
    paired = paired_table(per_seed, pairs)
    write_csv(args.out / f"{stem}_paired.csv", PAIRED_FIELDS, paired)
    with open(args.out / f"{stem}_summary.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(summary[0]))
        w.writeheader()
        w.writerows(summary)
    with open(args.out / f"{stem}_per_chunk.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(
            [
                "config",
                "chunk",
                "latent_psnr",
                "latent_psnr_se",
                "rgb_psnr",
                "ssim",
                "fp_position_error_px",
                "fp_position_error_se",
            ]
        )
        for cfg in configs:
            for c in range(args.chunks):
                lp = mean_se([rows[c][0] for rows in per_chunk[cfg.name]])
                rp = mean_se([rows[c][1] for rows in per_chunk[cfg.name]])[0]
                ss = mean_se([rows[c][2] for rows in per_chunk[cfg.name]])[0]
                pe = mean_se([p[c] for p in physics])
                w.writerow(
                    [
                        cfg.name,
                        c + 1,
                        f"{lp[0]:.4f}",
                        f"{lp[1]:.4f}",
                        f"{rp:.4f}",
                        f"{ss:.5f}",
                        f"{pe[0]:.3f}",
                        f"{pe[1]:.3f}",
                    ]
                )

    cmd = "python benchmarks/rollout.py" + (
        " " + shlex.join(argv if argv is not None else sys.argv[1:])
        if (argv if argv is not None else sys.argv[1:])
        else ""
    )
    print(
        f"\n`{cmd}`: {len(videos)} seeds x {args.chunks} chunks (+{args.prefix} ground-truth prefix chunks), "
        f"window {tiny_ar.WINDOW_CHUNKS}, {args.steps or tiny_ar.STEPS} {tiny_ar.SAMPLER} steps, "
        f"{time.perf_counter() - t_start:.0f} s\n"
    )
    print("| setting | eff. bits | latent PSNR (dB) | first / last chunk | RGB PSNR | SSIM | median ΔP_S | mean JSD |")
    print("|---|---|---|---|---|---|---|---|")
    for r in sorted(
        summary, key=lambda r: (-(r["bits"] or 99), r["rotation"], r["group"], r["correction"], r["strength"])
    ):
        print(
            f"| {r['config']} | {r['effective_bits']:.4g} | {r['latent_psnr']:.2f} ± {r['latent_psnr_se']:.2f} | "
            f"{r['latent_psnr_first_chunk']:.1f} / {r['latent_psnr_last_chunk']:.1f} | {r['rgb_psnr']:.2f} | "
            f"{r['ssim']:.4f} | {r['median_delta_ps']:+.4f} | {r['mean_jsd']:.2e} |"
        )
    print("\nfull-precision rollouts against the ground-truth continuation (object-position error, latent px):")
    for c, (m, se) in phys.items():
        print(f"  after {c:2d} chunk(s): {m:.2f} ± {se:.2f} px")
    if paired:
        print(
            f"\npaired differences over {len(videos)} seeds (a - b per seed, then mean ± SE = sd / sqrt(n); "
            "both sides of a pair share the seed's video and noise):"
        )
        print("\n".join(paired_markdown(paired)))
    verdict(summary)
    if not args.no_plots:
        plots(summary, per_chunk, configs, args.out)
    return 0


def verdict(summary: list[dict]) -> None:
    by = {r["config"]: r for r in summary}
    int4 = [r for r in summary if r["bits"] == 4 and r["correction"] == "off"]
    int2c = [r for r in summary if r["bits"] == 2 and r["correction"] != "off" and r["strength"] == 1.0]
    if int4 and int2c:
        best2 = max(int2c, key=lambda r: r["latent_psnr"])
        best4 = max(int4, key=lambda r: r["latent_psnr"])
        print(
            f"\nbest INT2 + correction: {best2['config']} {best2['latent_psnr']:.2f} dB at "
            f"{best2['effective_bits']:.4g} bits; best INT4 without: {best4['config']} {best4['latent_psnr']:.2f} dB "
            f"at {best4['effective_bits']:.4g} bits -> INT2 + correction "
            f"{'beats' if best2['latent_psnr'] > best4['latent_psnr'] else 'does not beat'} INT4 here"
        )
    gains = []
    for r in summary:
        if r["correction"] != "off" and r["strength"] == 1.0:
            off = by.get(parse_setting(r["config"]).uncorrected.name)
            if off:
                gains.append(
                    (
                        r["config"],
                        r["latent_psnr"] - off["latent_psnr"],
                        r["latent_psnr_last_chunk"] - off["latent_psnr_last_chunk"],
                    )
                )
    for name, g, gl in gains:
        print(f"  {name}: {g:+.2f} dB over the rollout, {gl:+.2f} dB at its last chunk")
    lam = [r for r in summary if r["bits"] == 2 and r["correction"] == "taylor"]
    if lam:
        best = max(lam, key=lambda r: r["latent_psnr"])
        print(f"best strength at INT2 (taylor): x{best['strength']:g} ({best['config']}, {best['latent_psnr']:.2f} dB)")


def plots(summary, per_chunk, configs, out: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plots (pip install -e '.[demo]')")
        return
    fig, ax = plt.subplots(figsize=(8, 4.5))
    shown = [
        c
        for c in configs
        if c.strength == 1.0 and c.group == 32 and c.rotation == "hadamard" and c.correction in ("off", "taylor")
    ]
    for cfg in shown:
        rows = per_chunk[cfg.name]
        n = len(rows[0])
        ys = [statistics.fmean(r[c][0] for r in rows) for c in range(n)]
        ax.plot(range(1, n + 1), ys, label=cfg.name, ls="-" if cfg.correction != "off" else "--")
    ax.set_xlabel("generated chunk")
    ax.set_ylabel("latent PSNR vs full-precision cache (dB)")
    ax.set_title("Drift over the rollout (tiny AR model, window 3)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "rollout_drift.png", dpi=110)
    plt.close(fig)
    fig5(summary, out / "rollout_fig5.png")


#: the Fig. 5 plot's families (colour) of settings; the marker is the correction
FAMILY_COLOURS = {"RTN": "tab:blue", "QuaRot": "tab:orange", "QVG": "tab:green", "tiers": "tab:red"}


def family(cfg: Config) -> str:
    """RTN, QuaRot, QVG or tiers (precision by age on top of any of them): the Fig. 5 plot's colours."""
    if any(k == "tiers" for k, _ in cfg.options):
        return "tiers"
    if cfg.qvg:
        return "QVG"
    return "QuaRot" if cfg.rotation == "hadamard" else "RTN"


def fig5(summary: list[dict], path: Path) -> None:
    """Latent PSNR against effective bits, the paper's Fig. 5: uniform RTN / QuaRot, QVG and age tiers apart,
    the QVG and tier points named (``--fig5-from`` redraws it from a summary CSV)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    rows = [(parse_setting(r["config"]), r) for r in summary if r["config"] != "full precision"]
    for fam, colour in FAMILY_COLOURS.items():
        for corr, marker in (("off", "o"), ("taylor", "s"), ("exact", "^"), ("chunk_mean", "D")):
            pts = sorted(
                (float(r["effective_bits"]), float(r["latent_psnr"]), float(r["latent_psnr_se"]), cfg)
                for cfg, r in rows
                if family(cfg) == fam and cfg.correction == corr and cfg.strength == 1.0
            )
            if not pts:
                continue
            ax.errorbar(
                [p[0] for p in pts],
                [p[1] for p in pts],
                yerr=[p[2] for p in pts],
                marker=marker,
                ls="none",
                color=colour,
                alpha=0.85,
                label=f"{fam}, correction {corr}",
            )
            if fam in ("QVG", "tiers") and corr != "off":
                for x, y, _, cfg in pts:
                    what = dict(cfg.options).get("tiers") or f"QVG g{cfg.group} K{cfg.centroids or ' auto'}"
                    ax.annotate(what, (x, y), textcoords="offset points", xytext=(5, -10), fontsize=7, color=colour)
    ax.axvline(2.75, color="0.6", lw=0.8, ls=":")
    ax.set_xlabel("effective bits per cached element (what the run stored)")
    ax.set_ylabel("latent PSNR vs full-precision cache (dB)")
    ax.set_title("Storage against quality over rollouts (the paper's Fig. 5)")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def fig5_from(path: Path) -> int:
    """Redraw ``<stem>_fig5.png`` next to a stored summary CSV (``<stem>_summary.csv``)."""
    with open(path, newline="") as f:
        summary = list(csv.DictReader(f))
    target = path.with_name(path.name.replace("_summary.csv", "_fig5.png"))
    if target == path:
        raise SystemExit(f"{path} is not a <stem>_summary.csv file")
    fig5(summary, target)
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
