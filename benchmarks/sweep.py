"""Storage-quality sweep: bits x group size x correction x rotation, as in the paper's Fig. 4 and Fig. 5.

Two parts, one command:

1. **Embedded workload** (``jensen_core.workload.make_workload()`` defaults: 12 heads x 128, 1,560 tokens
   per chunk, 4 cached chunks): for every setting the cached K/V are quantized chunk by chunk and
   ``jensen_core.attention_shift.attention_shift`` measures the median (and IQR) of ΔP_S, the mean attention
   JSD and the attention-output MSE against full-precision attention on the same queries.
   QVG rows (``method=qvg``: k-means smoothing per chunk, then RTN of the residual) are chosen at the
   effective bits of RTN/QuaRot INT2 g64 and g32 on these 1,560-token chunks (centroids and ids
   counted), plus QVG's own default K=256 at g64; they run on the workload only.
2. **Tiny Wan** (the random-weight model of ``benchmarks/sampler.py``: dim 512, 4 heads x 128, 2 layers),
   sampled chunk by chunk through the pack's nodes exactly as in ComfyUI (Quantize KV Cache -> Jensen
   Bias Correction -> KV Cache Diagnostics -> the Chunked AR sampler's loop): latent PSNR against the
   run with an unquantized cache (same seed), averaged over seeds, and the diagnostics' ΔP_S of the run.
   A random-weight model is only a proxy for a trained one. Skipped (saying so) without ComfyUI.

Writes ``sweep.csv``, ``sweep_comparisons.csv``, ``fig5_storage_quality.png`` (quality vs effective bits, one line per correction x
rotation, one marker per bit width, group sizes 128/64/32 left to right), ``fig4_delta_ps_hist.png``
(ΔP_S histograms before/after correction) and ``wan_diagnostics_int2_g128_quarot_taylor.png`` (what the KV
Cache Diagnostics Plot node shows for one tiny-Wan run) to ``--out`` (default ``docs/results``).

    python benchmarks/sweep.py                  # the full grid, about 7 minutes on 2 CPU cores
    python benchmarks/sweep.py --quick --out /tmp/sweep   # a small grid in seconds (smoke test)
    python benchmarks/sweep.py --modes          # every correction mode at INT2/INT3 (sweep_modes.csv, no plots)

``--modes`` compares the correction modes with each other: off, taylor, chunk_mean (the chunk-mean
bias as an offset of each cached chunk's log-sum-exp, free on every kernel), per_channel and exact, at
INT2 and INT3, every group size, RTN and QuaRot; it writes ``sweep_modes.csv`` and
``sweep_modes_comparisons.csv`` (per setting, how much of Taylor's ΔP_S reduction and PSNR gain each
mode keeps).

The script writes data only: ``sweep_comparisons.csv`` holds the comparisons the grid answers (INT2 g128
+ correction against INT4 without it; the best INT2 setting at QVG's effective bits), one metric per row.
What the numbers say is written by hand in docs/results.md and docs/qvg.md.
"""

from __future__ import annotations

import argparse
import csv
import importlib
import importlib.util
import math
import shlex
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the pack's jensen_core and jensen_testing; appended, so ComfyUI's folder stays first
    sys.path.append(str(ROOT))

import torch  # noqa: E402

from jensen_core import QuantSpec, quantize  # noqa: E402
from jensen_core.attention_shift import attention_shift  # noqa: E402
from jensen_core.quant import cat_quantized  # noqa: E402
from jensen_core.shift_summary import abs_tails, head_tails, quantile  # noqa: E402
from jensen_core.workload import make_workload  # noqa: E402

SCHEMES = {"none": "RTN", "hadamard": "QuaRot"}
QVG_SCHEMES = {"none": "QVG", "hadamard": "QVG+QuaRot"}
CORRECTIONS = ("off", "taylor", "exact")
MODE_CORRECTIONS = ("off", "taylor", "chunk_mean", "per_channel", "exact")
COLUMNS = [
    "scheme",
    "rotation",
    "bits",
    "group_size",
    "correction",
    "effective_bits",
    "median_delta_ps",
    "q25_delta_ps",
    "q75_delta_ps",
    "iqr_delta_ps",
    "mean_jsd",
    "output_mse",
    "p95_abs_delta_ps",
    "p99_abs_delta_ps",
    "worst_head",
    "worst_head_p99_abs_delta_ps",
    "wan_latent_psnr_db",
    "wan_latent_psnr_se_db",
    "wan_latent_mse",
    "wan_median_delta_ps",
    "wan_iqr_delta_ps",
    "wan_mean_jsd",
    "wan_output_mse",
    "method",
    "qvg_stages",
    "qvg_centroids",
]
COMPARISON_COLUMNS = ["comparison", "setting", "reference", "metric", "value", "reference_value", "lower_is_better"]
# QVG (group size, K) at the bits of RTN INT2 g64 (2.375) and g32 (2.75) on 1,560-token chunks, and QVG's default
QVG_GRID = ((128, 12), (64, 30), (64, 256))
COLORS = {"off": "#7b3fa0", "taylor": "#f08a24", "exact": "#2a9d5c"}
MARKERS = {2: "o", 3: "s", 4: "^", 8: "D"}
LINESTYLES = {"hadamard": "-", "none": "--"}


@dataclass(frozen=True)
class Setting:
    bits: int
    group_size: int
    rotation: str
    correction: str
    method: str = "rtn"
    centroids: int = 256  # QVG's K (one stage)

    @property
    def spec(self) -> QuantSpec:
        extra = {"method": "qvg", "qvg_centroids": self.centroids} if self.method == "qvg" else {}
        return QuantSpec(bits=self.bits, group_size=self.group_size, rotation=self.rotation, **extra)

    @property
    def mode(self) -> str:
        return self.correction

    @property
    def scheme(self) -> str:
        return QVG_SCHEMES[self.rotation] if self.method == "qvg" else SCHEMES[self.rotation]

    def label(self) -> str:
        k = f" K{self.centroids}" if self.method == "qvg" else ""
        return f"INT{self.bits} g{self.group_size} {self.scheme}{k} {self.correction}"


@dataclass
class Row:
    setting: Setting | None  # None: the BF16-cache reference
    values: dict = field(default_factory=dict)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(ROOT / "docs" / "results"), help="output folder (CSV and PNGs)")
    p.add_argument(
        "--quick",
        action="store_true",
        help="a small grid (INT2/INT4, g32, RTN, off/taylor) on a small workload and a short video: seconds",
    )
    p.add_argument("--no-wan", action="store_true", help="skip the tiny-Wan part (latent PSNR)")
    p.add_argument(
        "--modes",
        action="store_true",
        help="compare every correction mode at INT2/INT3 (writes sweep_modes.csv, no plots)",
    )
    p.add_argument("--query-stride", type=int, default=4, help="workload: evaluate every n-th query")
    p.add_argument("--seeds", type=int, default=3, help="tiny Wan: seeds averaged for the PSNR (noise + prompt)")
    p.add_argument("--chunks", type=int, default=6, help="tiny Wan: chunks per video (at least 6 for the full grid)")
    p.add_argument("--chunk-frames", type=int, default=3, help="tiny Wan: latent frames per chunk")
    p.add_argument("--latent-size", type=int, default=16, help="tiny Wan: latent height = width (video size / 8)")
    p.add_argument("--steps", type=int, default=4, help="tiny Wan: euler steps per chunk")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    args = p.parse_args(argv)
    if args.quick:
        args.seeds = min(args.seeds, 1)
        args.chunks = min(args.chunks, 3)
        args.latent_size = min(args.latent_size, 8)
        args.steps = min(args.steps, 2)
    elif args.chunks < 6:
        p.error("--chunks must be at least 6 for the full grid (use --quick for a smoke run)")
    if args.query_stride < 1 or args.seeds < 1 or args.latent_size % 2:
        p.error("--query-stride and --seeds must be >= 1 and --latent-size even")
    return args


def grid(quick: bool, modes: bool = False) -> list[Setting]:
    if modes:
        return [
            Setting(b, g, r, c)
            for r in ("none", "hadamard")
            for b in (2, 3)
            for g in ((32,) if quick else (128, 64, 32))
            for c in MODE_CORRECTIONS
        ]
    if quick:
        return [Setting(b, 32, "none", c) for b in (2, 4) for c in ("off", "taylor")] + [
            Setting(2, 32, "none", c, "qvg", 8) for c in ("off", "taylor")
        ]
    return [
        Setting(b, g, r, c) for r in ("none", "hadamard") for b in (2, 3, 4) for g in (128, 64, 32) for c in CORRECTIONS
    ] + [Setting(2, g, r, c, "qvg", k) for r in ("none", "hadamard") for g, k in QVG_GRID for c in CORRECTIONS]


# ------------------------------------------------------------------------------------------ part 1
def workload_part(settings: list[Setting], args) -> tuple[list[Row], dict[str, torch.Tensor], str]:
    w = make_workload(heads=2, chunk_tokens=256, cached_chunks=2) if args.quick else make_workload()
    h, n, d = w.q.shape[1], w.q.shape[2], w.q.shape[3]
    desc = (
        f"{h} heads x head_dim {d}, {n} tokens/chunk, {len(w.k_cached)} cached chunks + the current one, "
        f"every {args.query_stride}th query"
    )
    kc, vc = w.k_cached_all, w.v_cached_all
    rows, hists = [], {}
    bf16 = attention_shift(
        w.q, kc, vc, w.k_cur, w.v_cur, kc.to(torch.bfloat16), vc.to(torch.bfloat16), query_stride=args.query_stride
    )
    rows.append(Row(None, {**_stats(bf16, h), "effective_bits": 16.0}))
    quantized: dict[QuantSpec, tuple] = {}
    for s in settings:
        if s.spec not in quantized:
            quantized.clear()  # settings come grouped by spec: hold one quantized copy at a time
            # chunk by chunk, as the cache stores them (QVG clusters each chunk on its own)
            quantized[s.spec] = tuple(
                cat_quantized([quantize(t, s.spec) for t in ts]) for ts in (w.k_cached, w.v_cached)
            )
        kq, vq = quantized[s.spec]
        st = attention_shift(w.q, kc, vc, w.k_cur, w.v_cur, kq, vq, correction=s.mode, query_stride=args.query_stride)
        bits = (kq.nbytes + vq.nbytes) * 8 / (kq.numel + vq.numel)  # what is really stored (QVG: centroids and ids too)
        rows.append(Row(s, {**_stats(st, h), "effective_bits": bits}))
        if s.group_size == 32 and s.method == "rtn":
            hists[s.label()] = st.delta_ps
    return rows, hists, desc


def _stats(st, heads: int | None = None) -> dict:
    """Median, quartiles and IQR of ΔP_S, mean JSD, output MSE; with ``heads`` (the call's query heads, batch 1)
    the tails: the 95th / 99th percentiles of |ΔP_S| over all queries and the worst head by its 99th."""
    srt = st.delta_ps.sort().values
    q25, q75 = quantile(srt, 0.25), quantile(srt, 0.75)
    out = {
        "median_delta_ps": quantile(srt, 0.5),
        "q25_delta_ps": q25,
        "q75_delta_ps": q75,
        "iqr_delta_ps": q75 - q25,
        "mean_jsd": st.mean_jsd,
        "output_mse": st.output_mse,
    }
    if heads:
        per = st.delta_ps.reshape(heads, -1)
        worst = head_tails({f"head {i}": per[i] for i in range(heads)})["worst_head"]
        out.update(abs_tails(st.delta_ps))
        out["worst_head"] = worst["head"]
        out["worst_head_p99_abs_delta_ps"] = worst["p99_abs_delta_ps"]
    return out


# ------------------------------------------------------------------------------------------ part 2
def wan_part(settings: list[Setting], args, out: Path) -> tuple[dict[Setting, dict], str] | None:
    from jensen_testing import comfyui as support_comfyui

    if support_comfyui.find_comfyui() is None:
        print(f"tiny Wan part skipped: {support_comfyui.SKIP_REASON}")
        return None
    support_comfyui.setup_inprocess_comfyui()
    import comfy.samplers

    from jensen_testing import wan_tiny

    # benchmarks/sampler.py's defaults: the same tiny Wan (loaded by path: no clash with any other "sampler")
    spec = importlib.util.spec_from_file_location("jensen_kv_sampler_bench", ROOT / "benchmarks" / "sampler.py")
    sampler_bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sampler_bench)

    pack = support_comfyui.import_pack()
    nodes = importlib.import_module(f"{pack.__name__}.nodes")
    loop = importlib.import_module(f"{pack.__name__}.runtime.chunk_loop")
    plot = importlib.import_module(f"{pack.__name__}.runtime.shift_histogram")

    b = sampler_bench.parse_args([])
    arch = dict(dim=b.dim, ffn_dim=b.ffn, num_heads=b.heads, num_layers=b.layers, text_dim=64, text_len=32)
    model = wan_tiny.build_patcher(seed=0, **arch)
    frames = args.chunks * args.chunk_frames
    sigmas = comfy.samplers.calculate_sigmas(model.get_model_object("model_sampling"), "simple", args.steps)
    euler = comfy.samplers.sampler_object("euler")
    desc = (
        f"dim {b.dim}, {b.layers} layers x {b.heads} heads x {b.dim // b.heads}, random weights; {args.chunks} "
        f"chunks x {args.chunk_frames} latent frames x {(args.latent_size // 2) ** 2} tokens/frame, "
        f"{args.steps} euler steps, cfg 1, {args.seeds} seed(s)"
    )

    def sample(m, seed):
        return loop.run_chunked_ar(
            m,
            wan_tiny.conditioning(1000 + seed, 32, 64),
            wan_tiny.conditioning(2000 + seed, 32, 64),
            wan_tiny.video_latent(frames, args.latent_size, args.latent_size),
            seed=seed,
            cfg=1.0,
            sampler=euler,
            sigmas=sigmas,
            chunk_frames=args.chunk_frames,
            window_chunks=0,
            progress=False,
        )

    refs = [sample(model, seed).samples for seed in range(args.seeds)]
    results: dict[Setting, dict] = {}
    figure_setting = Setting(2, 128, "hadamard", "taylor") if not args.quick else settings[1]
    for s in settings:
        if s.method != "rtn":  # QVG's K was matched to the workload's 1,560-token chunks, not the tiny Wan's
            continue
        m = nodes.JensenKVQuantizeKVCache.execute(
            model, str(s.bits), str(s.bits), str(s.group_size), s.rotation, "fp8_e4m3", 0
        ).args[0]
        m = nodes.JensenKVBiasCorrection.execute(m, s.correction, 1.0).args[0]
        psnrs, mses, diag = [], [], None
        for seed, ref in enumerate(refs):
            run_model = m
            if seed == 0:  # the diagnostics of the first seed's run (they do not change the samples)
                run_model = nodes.JensenKVDiagnostics.execute(m, "all", "all", "all", 2).args[0]
            res = sample(run_model, seed)
            mse = float((res.samples - ref).double().square().mean())
            peak = float(ref.max() - ref.min())
            mses.append(mse)
            psnrs.append(10 * math.log10(peak**2 / mse) if mse > 0 else float("inf"))
            if seed == 0:
                diag = res.report["diagnostics"]
        st = diag["stats"][s.mode]
        results[s] = {
            "wan_latent_psnr_db": statistics.fmean(psnrs),
            "wan_latent_psnr_se_db": statistics.stdev(psnrs) / math.sqrt(len(psnrs)) if len(psnrs) > 1 else 0.0,
            "wan_latent_mse": statistics.fmean(mses),
            "wan_median_delta_ps": st["median_delta_ps"],
            "wan_iqr_delta_ps": st["iqr_delta_ps"],
            "wan_mean_jsd": st["mean_jsd"],
            "wan_output_mse": st["output_mse"],
        }
        if s == figure_setting:
            name = f"wan_diagnostics_int{s.bits}_g{s.group_size}_{SCHEMES[s.rotation].lower()}_{s.correction}.png"
            plot.render_histogram(diag, 960, 540).save(out / name, optimize=True)
    return results, desc


# ------------------------------------------------------------------------------------------ output
def write_csv(rows: list[Row], path: Path) -> None:
    with open(path, "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=COLUMNS)
        wr.writeheader()
        for r in rows:
            s = r.setting
            base = (
                {"scheme": "BF16", "rotation": "", "bits": 16, "group_size": "", "correction": "off"}
                if s is None
                else {
                    "scheme": s.scheme,
                    "rotation": s.rotation,
                    "bits": s.bits,
                    "group_size": s.group_size,
                    "correction": s.correction,
                    "method": s.method,
                    "qvg_stages": 1 if s.method == "qvg" else "",
                    "qvg_centroids": s.centroids if s.method == "qvg" else "",
                }
            )
            vals = {k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.values.items()}
            wr.writerow({**dict.fromkeys(COLUMNS, ""), **base, **vals})


def _fmt(v, spec: str) -> str:
    return "" if v is None or v == "" else format(v, spec)


def print_table(rows: list[Row], have_wan: bool) -> None:
    head = (
        f"{'setting':<34}{'eff.bits':>9}{'med dP_S':>10}{'IQR':>8}{'p99|dP|':>8}{'worst':>8}{'mean JSD':>10}{'out MSE':>10}"
        + (f"{'PSNR dB':>9}{'Wan dP_S':>10}" if have_wan else "")
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        v = r.values
        name = "BF16 cache (reference)" if r.setting is None else r.setting.label()
        line = (
            f"{name:<34}{v['effective_bits']:>9.4f}{v['median_delta_ps']:>+10.5f}{v['iqr_delta_ps']:>8.4f}"
            f"{_fmt(v.get('p99_abs_delta_ps'), '8.4f'):>8}{_fmt(v.get('worst_head_p99_abs_delta_ps'), '8.4f'):>8}"
            f"{v['mean_jsd']:>10.2e}{v['output_mse']:>10.2e}"
        )
        if have_wan:
            line += f"{_fmt(v.get('wan_latent_psnr_db'), '9.2f'):>9}{_fmt(v.get('wan_median_delta_ps'), '+10.5f'):>10}"
        print(line)


def _comparison(kind: str, setting: str, reference: str, metric: str, value, reference_value, lower_is_better) -> dict:
    return {
        "comparison": kind,
        "setting": setting,
        "reference": reference,
        "metric": metric,
        "value": value,
        "reference_value": reference_value,
        "lower_is_better": lower_is_better,
    }


def comparisons(rows: list[Row], have_wan: bool) -> list[dict]:
    """The grid's two questions, as data (``COMPARISON_COLUMNS``; the reading of them is kept in the docs).

    ``int2_corrected_vs_int4``: INT2 g128 with the correction (2.1875 bits) against INT4 without it at g128 and
    g64, per metric (|median ΔP_S|, mean JSD, output MSE, tiny-Wan latent PSNR).
    ``best_int2_at_bits``: at each QVG row's effective bits, the INT2 setting (QVG, RTN or QuaRot within
    0.02 bits) with the best value of each workload metric.
    """
    by = {
        (r.setting.bits, r.setting.group_size, r.setting.rotation, r.setting.correction): r
        for r in rows
        if r.setting is not None and r.setting.method == "rtn"
    }
    metrics = [("median_delta_ps", True), ("mean_jsd", True), ("output_mse", True)]
    if have_wan:
        metrics.append(("wan_latent_psnr_db", False))
    out = []
    for rot in ("none", "hadamard"):
        for corr in ("taylor", "exact"):
            a = by.get((2, 128, rot, corr))
            if a is None:
                continue
            for g4 in (128, 64):
                b = by.get((4, g4, rot, "off"))
                if b is None:
                    continue
                for key, lower in metrics:
                    x, y = a.values.get(key), b.values.get(key)
                    if x in (None, "") or y in (None, ""):
                        continue
                    if key == "median_delta_ps":
                        key, x, y = "abs_median_delta_ps", abs(x), abs(y)
                    out.append(
                        _comparison("int2_corrected_vs_int4", a.setting.label(), b.setting.label(), key, x, y, lower)
                    )
    return out + best_at_matched_bits(rows)


def best_at_matched_bits(rows: list[Row]) -> list[dict]:
    """QVG against RTN and QuaRot at matched effective bits (within 0.02): the best INT2 setting per budget."""
    int2 = [r for r in rows if r.setting is not None and r.setting.bits == 2]
    out = []
    for budget in sorted({round(r.values["effective_bits"], 2) for r in int2 if r.setting.method == "qvg"}):
        near = [r for r in int2 if abs(r.values["effective_bits"] - budget) <= 0.02]
        if not any(r.setting.method == "rtn" for r in near):
            continue
        for key in ("median_delta_ps", "mean_jsd", "output_mse"):
            scores = [abs(r.values[key]) if key == "median_delta_ps" else r.values[key] for r in near]
            i = min(range(len(near)), key=scores.__getitem__)
            name = "abs_median_delta_ps" if key == "median_delta_ps" else key
            out.append(
                _comparison(
                    "best_int2_at_bits", near[i].setting.label(), f"{budget:.2f} bits", name, scores[i], "", True
                )
            )
    return out


def modes_comparisons(rows: list[Row], have_wan: bool) -> list[dict]:
    """Per setting and mode (chunk_mean, per_channel, exact) against Taylor, as data: the share of Taylor's
    |median ΔP_S| reduction the mode keeps (``value``; ``reference_value`` 1), its mean JSD against Taylor's,
    and with the tiny Wan its latent PSNR gain over no correction against Taylor's."""
    by = {
        (r.setting.bits, r.setting.group_size, r.setting.rotation, r.setting.correction): r
        for r in rows
        if r.setting is not None
    }
    out = []
    for (bits, g, rot, corr), off_row in sorted(by.items()):
        if corr != "off" or (bits, g, rot, "taylor") not in by:
            continue
        off, tay_row = off_row.values, by[(bits, g, rot, "taylor")]
        tay = tay_row.values
        for mode in ("chunk_mean", "per_channel", "exact"):
            row = by.get((bits, g, rot, mode))
            if row is None:
                continue
            v, label, ref = row.values, row.setting.label(), tay_row.setting.label()
            red = abs(off["median_delta_ps"]) - abs(tay["median_delta_ps"])
            kept = (abs(off["median_delta_ps"]) - abs(v["median_delta_ps"])) / red if red > 0 else float("nan")
            out.append(
                _comparison(
                    "share_of_taylor_reduction", label, ref, "abs_median_delta_ps_reduction_kept", kept, 1.0, False
                )
            )
            out.append(
                _comparison("share_of_taylor_reduction", label, ref, "mean_jsd", v["mean_jsd"], tay["mean_jsd"], True)
            )
            if have_wan and v.get("wan_latent_psnr_db") not in (None, ""):
                out.append(
                    _comparison(
                        "share_of_taylor_reduction",
                        label,
                        ref,
                        "wan_latent_psnr_gain_db",
                        v["wan_latent_psnr_db"] - off["wan_latent_psnr_db"],
                        tay["wan_latent_psnr_db"] - off["wan_latent_psnr_db"],
                        False,
                    )
                )
    return out


def write_comparisons(items: list[dict], path: Path) -> None:
    with open(path, "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=COMPARISON_COLUMNS)
        wr.writeheader()
        for item in items:
            wr.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in item.items()})


def plot_fig5(rows: list[Row], path: Path, have_wan: bool, title: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.lines import Line2D
    except ImportError:
        print("matplotlib is not installed: no plots written (pip install matplotlib)")
        return False
    qrows = [r for r in rows if r.setting is not None and r.setting.method == "rtn"]
    qvg_rows = [r for r in rows if r.setting is not None and r.setting.method == "qvg"]
    if have_wan:  # the correction's PSNR gain over the same setting without it
        off = {
            (r.setting.bits, r.setting.group_size, r.setting.rotation): r.values["wan_latent_psnr_db"]
            for r in qrows
            if r.setting.correction == "off"
        }
        for r in qrows:
            s = r.setting
            r.values["_psnr_gain"] = r.values["wan_latent_psnr_db"] - off[(s.bits, s.group_size, s.rotation)]
    panels = [
        ("median_delta_ps", "median ΔP_S (workload)"),
        ("mean_jsd", "mean attention JSD (workload)"),
        ("output_mse", "attention output MSE (workload)"),
    ]
    if have_wan:
        panels += [
            ("wan_latent_psnr_db", "latent PSNR vs unquantized cache, dB (tiny Wan)"),
            ("_psnr_gain", "PSNR gain from the correction, dB (tiny Wan)"),
        ]
    fig, axes = plt.subplots(2, 3, figsize=(13.5, 7.6)) if have_wan else plt.subplots(1, 3, figsize=(13.5, 4.4))
    axes = list(axes.ravel())
    # exact is drawn as crosses on top of taylor: the two nearly coincide
    styles = {"off": dict(linewidth=1.4), "taylor": dict(linewidth=1.4), "exact": dict(linewidth=0, markersize=6)}
    for ax, (key, label) in zip(axes, panels):
        for rot in ("hadamard", "none"):
            for corr in CORRECTIONS:
                if key == "_psnr_gain" and corr == "off":
                    continue
                for bits in (2, 3, 4):
                    pts = sorted(
                        (r.values["effective_bits"], r.values[key], r.values.get("wan_latent_psnr_se_db", 0))
                        for r in qrows
                        if (r.setting.rotation, r.setting.correction, r.setting.bits) == (rot, corr, bits)
                        and r.values.get(key) not in (None, "")
                    )
                    if not pts:
                        continue
                    xs, ys, es = zip(*pts)
                    kw = dict(
                        color=COLORS[corr],
                        linestyle=LINESTYLES[rot],
                        markersize=5,
                        marker="x" if corr == "exact" else MARKERS[bits],
                        markerfacecolor=COLORS[corr] if rot == "hadamard" else "white",
                    )
                    kw.update(styles[corr])
                    if key == "wan_latent_psnr_db" and any(es):
                        ax.errorbar(xs, ys, yerr=es, capsize=2, **kw)
                    else:
                        ax.plot(xs, ys, **kw)
        for r in qvg_rows:  # QVG points (workload panels): stars, filled with rotation
            if r.values.get(key) in (None, "") or key.startswith("_"):
                continue
            ax.plot(
                [r.values["effective_bits"]],
                [r.values[key]],
                linestyle="",
                marker="*",
                markersize=9,
                color=COLORS[r.setting.correction],
                markerfacecolor=COLORS[r.setting.correction] if r.setting.rotation == "hadamard" else "white",
            )
        if key == "median_delta_ps":
            ax.axhline(0, color="k", linewidth=0.8)
            ax.set_yscale("symlog", linthresh=1e-3)
        elif key in ("mean_jsd", "output_mse"):
            ax.set_yscale("log")
        elif key == "_psnr_gain":
            ax.axhline(0, color="k", linewidth=0.8)
        ax.set_xlabel("effective bits (g = 128 / 64 / 32 left to right)", fontsize=9)
        ax.set_title(label, fontsize=10)
        ax.grid(alpha=0.3)
    for ax in axes[len(panels) :]:
        ax.axis("off")
    handles = [
        Line2D(
            [],
            [],
            color=COLORS[c],
            linestyle=LINESTYLES[r] if c != "exact" else "",
            marker="x" if c == "exact" else "o",
            markerfacecolor=COLORS[c] if r == "hadamard" else "white",
            label=f"{SCHEMES[r]}, correction {c}",
        )
        for r in ("hadamard", "none")
        for c in CORRECTIONS
    ]
    handles += [Line2D([], [], color="0.3", linestyle="", marker=MARKERS[b], label=f"INT{b}") for b in (2, 3, 4)]
    if qvg_rows:
        handles.append(
            Line2D(
                [],
                [],
                color="0.3",
                linestyle="",
                marker="*",
                markersize=9,
                label="QVG INT2 (filled: + QuaRot; workload only)",
            )
        )
    if have_wan:
        axes[-1].legend(handles=handles, loc="center", fontsize=9, frameon=False)
    else:
        fig.legend(handles=handles, loc="lower center", ncol=5, fontsize=8, frameon=False)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout(rect=(0, 0 if have_wan else 0.12, 1, 0.96))
    fig.savefig(path, dpi=80)
    plt.close(fig)
    for r in qrows:
        r.values.pop("_psnr_gain", None)
    return True


def plot_fig4(hists: dict[str, torch.Tensor], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = [
        (b, r)
        for b in (2, 4)
        for r in ("none", "hadamard")
        if any(k.startswith(f"INT{b} g32 {SCHEMES[r]} ") for k in hists)
    ]
    fig, axes = plt.subplots(
        1 if len(cells) <= 2 else 2, min(len(cells), 2), figsize=(11, 6.4 if len(cells) > 2 else 3.6), squeeze=False
    )
    for ax, (bits, rot) in zip(axes.ravel(), cells):
        series = {c: hists.get(f"INT{bits} g32 {SCHEMES[rot]} {c}") for c in CORRECTIONS}
        series = {c: t for c, t in series.items() if t is not None}
        allv = torch.cat(list(series.values()))
        lo, hi = float(allv.quantile(0.002)), float(allv.quantile(0.998))
        lo, hi = min(lo, 0.0), max(hi, 0.0)
        bins = torch.linspace(lo, hi, 71).tolist()
        for c, t in series.items():
            med = quantile(t.sort().values, 0.5)  # as in the table (interpolated median)
            lab = f"{'no correction' if c == 'off' else c}: median {med:+.5f}"
            if c == "exact":
                ax.hist(t.clamp(lo, hi).numpy(), bins=bins, histtype="step", color=COLORS[c], linewidth=1.3, label=lab)
            else:
                ax.hist(t.clamp(lo, hi).numpy(), bins=bins, color=COLORS[c], alpha=0.55, label=lab)
            ax.axvline(med, color=COLORS[c], linestyle="--", linewidth=1)
        ax.axvline(0, color="k", linewidth=0.8)
        ax.set_title(f"INT{bits}, g=32, {SCHEMES[rot]}", fontsize=10)
        ax.set_xlabel("ΔP_S (attention mass shifted to cached keys)")
        ax.set_ylabel("queries")
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    fig.savefig(path, dpi=90)
    plt.close(fig)


# ------------------------------------------------------------------------------------------ main
def main(argv=None) -> int:
    args = parse_args(argv)
    t_start = time.perf_counter()
    print("command:", shlex.join(["python", "benchmarks/sweep.py", *(sys.argv[1:] if argv is None else argv)]))
    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    settings = grid(args.quick, args.modes)

    t0 = time.perf_counter()
    rows, hists, wdesc = workload_part(settings, args)
    print(
        f"workload: {wdesc}; {len(settings)} settings in {time.perf_counter() - t0:.1f} s "
        f"on {torch.get_num_threads()} torch threads"
    )

    have_wan = False
    if args.no_wan:
        print("tiny Wan part skipped (--no-wan)")
    else:
        t0 = time.perf_counter()
        wan = wan_part(settings, args, out)
        if wan is not None:
            results, desc = wan
            for r in rows:
                if r.setting is not None:
                    r.values.update(results.get(r.setting, {}))
            have_wan = True
            print(
                f"tiny Wan: {desc}; {len(settings) + 1} configurations x {args.seeds} seed(s) in "
                f"{time.perf_counter() - t0:.1f} s"
            )

    print()
    print_table(rows, have_wan)
    print()
    if args.modes:
        csv_path, cmp_path = out / "sweep_modes.csv", out / "sweep_modes_comparisons.csv"
        write_csv(rows, csv_path)
        write_comparisons(modes_comparisons(rows, have_wan), cmp_path)
        print(f"csv: {csv_path}\ncomparisons: {cmp_path}\nelapsed: {time.perf_counter() - t_start:.1f} s")
        return 0
    csv_path, cmp_path = out / "sweep.csv", out / "sweep_comparisons.csv"
    write_csv(rows, csv_path)
    write_comparisons(comparisons(rows, have_wan), cmp_path)
    print(f"csv: {csv_path}\ncomparisons: {cmp_path}")
    if plot_fig5(
        rows,
        out / "fig5_storage_quality.png",
        have_wan,
        "Storage-quality trade-off (paper Fig. 5 style): K and V quantized alike, FP8 scales + BF16 zeros",
    ):
        plot_fig4(
            hists,
            out / "fig4_delta_ps_hist.png",
            "ΔP_S before/after the Jensen correction on the embedded workload (paper Fig. 4 / App. K style)",
        )
        print(f"plots: {out / 'fig5_storage_quality.png'}, {out / 'fig4_delta_ps_hist.png'}")
    for extra in sorted(out.glob("wan_diagnostics_*.png")):
        print(f"diagnostics plot: {extra}")
    print(f"elapsed: {time.perf_counter() - t_start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
