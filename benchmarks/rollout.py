"""The paper's Table 1 and Fig. 5 on the pack's trained tiny AR model: quantized caches over long rollouts.

    python benchmarks/rollout.py            # 4 seeds x 32 chunks, 34 configurations (54 min on one core)
    python benchmarks/rollout.py --quick    # 1 seed x 4 chunks, 4 configurations (about a minute)
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
seeds), ``<out>/rollout_per_chunk.csv``, ``<out>/rollout_drift.png`` (PSNR against chunk index) and
``<out>/rollout_fig5.png`` (PSNR against effective bits), and prints the README table.
"""

from __future__ import annotations

import argparse
import csv
import math
import shlex
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: denoising steps the attention diagnostics sample (0-based): the first, at full noise, and the middle one
DIAG_STEPS = "0, 4"
if str(ROOT) not in sys.path:  # the pack's jensen_core and jensen_testing; appended, so ComfyUI's folder stays first
    sys.path.append(str(ROOT))

from jensen_testing import comfyui as support_comfyui  # noqa: E402


@dataclass(frozen=True)
class Config:
    bits: int | None  # None: full precision (the reference)
    group: int = 32
    rotation: str = "hadamard"
    correction: str = "off"
    strength: float = 1.0
    centroids: int = 0  # > 0: QVG (k-means smoothing, one stage of this many centroids, before RTN of the residual)

    @property
    def name(self) -> str:
        if self.bits is None:
            return "full precision"
        rot = "QuaRot" if self.rotation == "hadamard" else "RTN"
        if self.centroids:
            rot = f"QVG K{self.centroids}" + ("+QuaRot" if self.rotation == "hadamard" else "")
        corr = (
            ""
            if self.correction == "off"
            else f" + {self.correction}" + (f" x{self.strength:g}" if self.strength != 1.0 else "")
        )
        return f"INT{self.bits} g{self.group} {rot}{corr}"

    def spec(self, core):
        extra = {"method": "qvg", "qvg_centroids": self.centroids} if self.centroids else {}
        return core.QuantSpec(bits=self.bits, group_size=self.group, rotation=self.rotation, **extra)

    def effective_bits(self, core, chunk_tokens: int = 192, head_dim: int = 128) -> float:
        """Stored bits per cached element; QVG's centroids and ids counted on the tiny model's 192-token chunks."""
        if self.bits is None:
            return 32.0
        spec = self.spec(core)
        return core.method_of(spec).effective_bits_for(spec, head_dim, chunk_tokens)


def grid(quick: bool, modes: bool = False) -> list[Config]:
    if modes:  # the correction modes side by side at INT2 (chunk_mean against taylor), and QVG
        # at the bits of RTN g32 (QVG g64 K4: 2.77 bits on 192-token chunks) and g64 (QVG g128 K2: 2.42)
        return [
            Config(2, g, r, c) for r in ("none", "hadamard") for g in (32, 128) for c in ("off", "taylor", "chunk_mean")
        ] + [
            Config(2, g, "hadamard", c, centroids=k)
            for g, k in ((64, 4), (128, 2))
            for c in ("off", "taylor", "chunk_mean")
        ]
    if quick:
        return [
            Config(2, 32, "hadamard", "off"),
            Config(2, 32, "hadamard", "taylor"),
            Config(4, 32, "hadamard", "off"),
            Config(2, 128, "none", "taylor"),
        ]
    # the exact correction only at INT2, where the bias it removes beyond Taylor's is largest (it costs
    # about 3x a Taylor run here, and at 3 and 4 bits the two agree to the noise of the rollouts)
    out = [
        Config(b, g, r, c)
        for b in (2, 3, 4)
        for r in ("none", "hadamard")
        for g in (32, 128)
        for c in ("off", "taylor") + (("exact",) if b == 2 else ())
    ]
    out += [Config(2, g, "hadamard", "taylor", lam) for g in (32, 128) for lam in (0.5, 1.5, 2.0)]
    return out


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="1 seed, 4 chunks, 4 configurations")
    p.add_argument("--seeds", type=int, default=4)
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
    a = p.parse_args(argv)
    if a.quick:
        a.seeds, a.chunks = 1, 4
    if a.modes:
        a.no_plots = True
    return a


def main(argv=None) -> int:
    args = parse_args(argv)
    support_comfyui.setup_inprocess_comfyui()
    import importlib

    import comfy.samplers
    import torch

    from jensen_testing import tiny_ar

    pack = support_comfyui.import_pack()
    nodes = importlib.import_module(f"{pack.__name__}.nodes")
    loop = importlib.import_module(f"{pack.__name__}.runtime.chunk_loop")
    core = importlib.import_module(f"{pack.__name__}.jensen_core")
    tv = tiny_ar.core()
    model = tiny_ar.load_model(args.model or tiny_ar.MODEL_PATH)
    sigmas = tiny_ar.sigmas(model, args.steps or tiny_ar.STEPS)
    sampler = comfy.samplers.sampler_object(tiny_ar.SAMPLER)
    F = tiny_ar.CHUNK_FRAMES
    configs = grid(args.quick, args.modes)
    stem = "rollout_modes" if args.modes else "rollout"

    def patched(cfg: Config):
        qvg = ("qvg", 1, cfg.centroids) if cfg.centroids else ()
        m = nodes.JensenKVQuantizeKVCache.execute(
            model, str(cfg.bits), str(cfg.bits), str(cfg.group), cfg.rotation, "fp8_e4m3", 0, *qvg
        ).args[0]
        if cfg.correction != "off":
            m = nodes.JensenKVBiasCorrection.execute(m, cfg.correction, cfg.strength).args[0]
        return nodes.JensenKVDiagnostics.execute(m, "all", "all", DIAG_STEPS, 4).args[0]

    def rollout(m, prompt, vseed, seed):
        scene = tv.make_scene(prompt, vseed)
        prefix = tv.to_wan_latent(tv.render(scene, 0, args.prefix * F)).unsqueeze(0)
        latent = {"samples": torch.zeros(1, 16, args.chunks * F, tiny_ar.LATENT_HW, tiny_ar.LATENT_HW)}
        res = loop.run_chunked_ar(
            m,
            tiny_ar.conditioning(prompt),
            tiny_ar.conditioning(prompt),
            latent,
            seed=seed,
            cfg=1.0,
            sampler=sampler,
            sigmas=sigmas,
            chunk_frames=F,
            window_chunks=tiny_ar.WINDOW_CHUNKS,
            prefix={"samples": prefix},
            include_prefix=False,
            progress=False,
        )
        return tv.from_wan_latent(res.samples[0]), res.report

    t_start = time.perf_counter()
    videos = tiny_ar.held_out(args.seeds)
    per_chunk: dict[str, list[list[tuple[float, float, float]]]] = {c.name: [] for c in configs}
    diag: dict[str, list[tuple[float, float]]] = {c.name: [] for c in configs}
    physics: list[list[float]] = []
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
            x, report = rollout(patched(cfg), prompt, vseed, seed)
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
            "centroids": cfg.centroids,
            "effective_bits": cfg.effective_bits(core),
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
        f"window {tiny_ar.WINDOW_CHUNKS}, {len(sigmas) - 1} {tiny_ar.SAMPLER} steps, "
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
            off = by.get(Config(r["bits"], r["group"], r["rotation"], centroids=r.get("centroids", 0)).name)
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
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for corr, marker in (("off", "o"), ("taylor", "s"), ("exact", "^")):
        for rot, color in (("hadamard", "tab:orange"), ("none", "tab:blue")):
            pts = sorted(
                (r["effective_bits"], r["latent_psnr"], r["latent_psnr_se"])
                for r in summary
                if r["correction"] == corr and r["rotation"] == rot and r["strength"] == 1.0
            )
            if pts:
                ax.errorbar(
                    [p[0] for p in pts],
                    [p[1] for p in pts],
                    yerr=[p[2] for p in pts],
                    marker=marker,
                    ls="none",
                    color=color,
                    alpha=0.8,
                    label=f"{'QuaRot' if rot == 'hadamard' else 'RTN'}, correction {corr}",
                )
    ax.set_xlabel("effective bits per cached element")
    ax.set_ylabel("latent PSNR vs full-precision cache (dB)")
    ax.set_title("Storage against quality over rollouts (the paper's Fig. 5)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "rollout_fig5.png", dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
