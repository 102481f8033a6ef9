"""Precision by age (jensen_core.tiers): how an aging chunk goes to fewer bits, and where tiers sit on the Fig. 5 frontier.

    python benchmarks/tiers.py                       # both parts (decision: ~1 min; frontier: ~17 min, shared 2 cores)
    python benchmarks/tiers.py --decision            # part 1 only
    python benchmarks/tiers.py --frontier --seeds 1 --chunks 4   # a small frontier (smoke test)

1. **Requantize or keep both** (the embedded workload, ``jensen_core.workload.make_workload()``: 12 heads x 128,
   1,560 tokens per chunk, 4 cached chunks). A chunk leaving the high tier is stored at the low spec either by
   *requantizing* its stored INT4/INT8 form (what ``ChunkCache`` does: no extra bytes) or from its original
   values, which the cache would have to keep until demotion (the original in BF16, or a low-bit copy made at
   write time: same codes either way). Printed side by side per setting: the relative reconstruction error of
   keys and values, the share of codes that differ, the attention output MSE (Taylor correction) against
   full-precision attention, and the extra bytes keeping the original would cost.
2. **Frontier** (the pack's trained tiny AR model, as ``benchmarks/rollout.py``: a 2-chunk ground-truth prefix,
   then ``--chunks`` generated chunks, cache window 3): latent PSNR against the full-precision rollout of the
   same seed, against the effective bits the run really stored (the report's peak bytes), for uniform
   INT2 / INT3 / INT4, QVG and age tiers at matched average bits, all QuaRot with the Taylor correction.
   Settings are named by their string form (``jensen_core.tiers.parse_tiers``). Writes
   ``<out>/tiers_frontier.csv``.

Numbers and the decision they led to: docs/tiers.md.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the pack's jensen_core and jensen_testing; appended, so ComfyUI's folder stays first
    sys.path.append(str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from jensen_core import CacheEntry, QuantSpec, cached_attention, quantize  # noqa: E402
from jensen_core.tiers import requantize  # noqa: E402
from jensen_core.workload import make_workload  # noqa: E402
from jensen_testing.results import write_csv  # noqa: E402


# ------------------------------------------------------------------------------------------ 1. requantize or keep
def _rel_err(x: torch.Tensor, t) -> float:
    x = x.double()
    return float((x - t.dequantize(torch.float64)).square().sum() / x.square().sum())


def decision(seed: int = 0) -> list[dict]:
    w = make_workload(seed=seed)
    ref = F.scaled_dot_product_attention(
        w.q, torch.cat([w.k_cached_all, w.k_cur], -2), torch.cat([w.v_cached_all, w.v_cur], -2)
    )
    rows = []
    for rotation in ("hadamard", "none"):
        for low_bits, group in ((2, 32), (2, 128), (3, 32)):
            low = QuantSpec(bits=low_bits, group_size=group, rotation=rotation)
            for high_bits in (4, 8):
                high = QuantSpec(bits=high_bits, group_size=group, rotation=rotation)
                direct, requant = [], []
                err = {"k_direct": 0.0, "k_requant": 0.0, "v_direct": 0.0, "v_requant": 0.0}
                flips = n = 0
                for k, v in zip(w.k_cached, w.v_cached):
                    pair_d, pair_r = [], []
                    for side, x in (("k", k), ("v", v)):
                        d = quantize(x, low)
                        r = requantize(quantize(x, high), low)
                        err[f"{side}_direct"] += _rel_err(x, d) / len(w.k_cached)
                        err[f"{side}_requant"] += _rel_err(x, r) / len(w.k_cached)
                        flips += int((d.codes() != r.codes()).sum())
                        n += d.codes().numel()
                        pair_d.append(d)
                        pair_r.append(r)
                    direct.append(CacheEntry(*pair_d))
                    requant.append(CacheEntry(*pair_r))
                mse = {
                    name: float((cached_attention(w.q, w.k_cur, w.v_cur, es, "taylor") - ref).square().mean())
                    for name, es in (("direct", direct), ("requant", requant))
                }
                rows.append(
                    {
                        "rotation": rotation,
                        "low": f"INT{low_bits} g{group}",
                        "high": f"INT{high_bits}",
                        **err,
                        "codes_differ": flips / n,
                        "out_mse_direct": mse["direct"],
                        "out_mse_requant": mse["requant"],
                        "low_bits": low.effective_bits,
                        "high_bits": high.effective_bits,
                    }
                )
    return rows


def print_decision(rows: list[dict]) -> None:
    print("1. A chunk leaving the high tier: requantized from its stored high-bit form vs from the original")
    print("   (workload: 12 heads x 128, 1,560-token chunks, 4 cached chunks; errors are ||x - x_hat||^2 / ||x||^2;")
    print("   attention output MSE with the Taylor correction against full-precision attention)")
    head = (
        f"{'rotation':9} {'low':10} {'from':5} {'K err orig':>11} {'K err requ':>11} {'V err orig':>11} "
        f"{'V err requ':>11} {'codes diff':>10} {'out MSE orig':>13} {'out MSE requ':>13} {'requ/orig':>9}"
    )
    print(head)
    for r in rows:
        print(
            f"{r['rotation']:9} {r['low']:10} {r['high']:5} {r['k_direct']:11.5f} {r['k_requant']:11.5f} "
            f"{r['v_direct']:11.5f} {r['v_requant']:11.5f} {100 * r['codes_differ']:9.2f}% "
            f"{r['out_mse_direct']:13.4e} {r['out_mse_requant']:13.4e} "
            f"{r['out_mse_requant'] / r['out_mse_direct']:9.3f}"
        )
    print()
    print("   Extra bytes of keeping the original until demotion, per chunk in the high tier (bits per element):")
    for r in rows:
        if r["rotation"] != "hadamard":
            continue
        print(
            f"   {r['low']} with {r['high']} newest chunks: the chunk stores {r['high_bits']:.3f} bits; keeping its "
            f"BF16 original adds 16 (+{100 * 16 / r['high_bits']:.0f}%), a {r['low']} copy made at write time adds "
            f"{r['low_bits']:.3f} (+{100 * r['low_bits'] / r['high_bits']:.0f}%); requantizing adds 0"
        )
    print()


# ------------------------------------------------------------------------------------------ 2. frontier
#: (name, key/value bits, group, centroids (QVG K, 0 = RTN), tiers string): all QuaRot with the Taylor correction
FRONTIER = [
    ("INT2 g128", 2, 128, 0, "off"),
    ("INT2 g32", 2, 32, 0, "off"),
    ("QVG g64 K4", 2, 64, 4, "off"),
    ("INT3 g128", 3, 128, 0, "off"),
    ("INT3 g32", 3, 32, 0, "off"),
    ("INT4 g128", 4, 128, 0, "off"),
    ("INT2 g128 + recent1@4", 2, 128, 0, "recent1@4"),
    ("INT2 g32 + recent1@4", 2, 32, 0, "recent1@4"),
    ("INT2 g128 + recent2@4", 2, 128, 0, "recent2@4"),
    ("INT2 g128 + recent1@8", 2, 128, 0, "recent1@8"),
]


def frontier(args) -> list[dict]:
    from jensen_testing import comfyui as support_comfyui

    support_comfyui.setup_inprocess_comfyui()
    import importlib

    from jensen_testing import tiny_ar

    pack = support_comfyui.import_pack()
    nodes = importlib.import_module(f"{pack.__name__}.nodes")
    tiers_mod = importlib.import_module(f"{pack.__name__}.jensen_core.tiers")
    model = tiny_ar.load_model(tiny_ar.MODEL_PATH)
    Fr = tiny_ar.CHUNK_FRAMES

    def patched(bits, group, centroids, tiers):
        t = tiers_mod.parse_tiers(tiers)
        tier_args = (
            ("off", 2, "off")
            if t is None
            else ("off" if not t.recent_bits else str(t.recent_bits), t.recent_chunks or 2, str(t.sink_bits or "off"))
        )
        method = ("qvg", 1, centroids, 2) if centroids else ("rtn", 1, 256, 2)
        m = nodes.JensenKVQuantizeKVCache.execute(
            model, str(bits), str(bits), str(group), "hadamard", "fp8_e4m3", 0, *method, *tier_args
        ).args[0]
        return nodes.JensenKVBiasCorrection.execute(m, "taylor", 1.0).args[0]

    def rollout(m, prompt, vseed, seed):
        return tiny_ar.rollout(m, prompt, vseed, seed, args.chunks, args.prefix, tiny_ar.STEPS, with_report=True)

    t0 = time.perf_counter()
    psnrs: dict[str, list[float]] = {name: [] for name, *_ in FRONTIER}
    bits: dict[str, float] = {}
    for i, (prompt, vseed) in enumerate(tiny_ar.held_out(args.seeds)):
        seed = 100 + i
        ref, _ = rollout(model, prompt, vseed, seed)
        peak = float(ref.max() - ref.min())
        for name, b, g, k, tiers in FRONTIER:
            x, report = rollout(patched(b, g, k, tiers), prompt, vseed, seed)
            chunk_psnr = [
                tiny_ar.psnr(ref[:, c * Fr : (c + 1) * Fr], x[:, c * Fr : (c + 1) * Fr], peak)
                for c in range(args.chunks)
            ]
            psnrs[name].append(statistics.fmean(chunk_psnr))
            bits[name] = report["effective_bits"]
        print(f"   seed {i + 1}/{args.seeds} done at {time.perf_counter() - t0:.0f} s", flush=True)
    rows = []
    for name, *_, tiers in FRONTIER:
        vals = psnrs[name]
        se = statistics.stdev(vals) / math.sqrt(len(vals)) if len(vals) > 1 else 0.0
        rows.append(
            {"setting": name, "tiers": tiers, "effective_bits": bits[name], "latent_psnr": statistics.fmean(vals)}
            | {"latent_psnr_se": se}
        )
    return rows


def print_frontier(rows: list[dict], args) -> None:
    print(
        f"2. Frontier on the tiny AR model ({args.seeds} seed(s) x {args.chunks} chunks after a {args.prefix}-chunk "
        "prefix, window 3, QuaRot + Taylor): latent PSNR vs the full-precision rollout"
    )
    print(f"{'setting':26} {'tiers':10} {'eff. bits':>9} {'latent PSNR (dB)':>17}")
    for r in sorted(rows, key=lambda r: r["effective_bits"]):
        print(
            f"{r['setting']:26} {r['tiers']:10} {r['effective_bits']:9.3f} "
            f"{r['latent_psnr']:11.2f} +- {r['latent_psnr_se']:.2f}"
        )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--decision", action="store_true", help="part 1 only")
    p.add_argument("--frontier", action="store_true", help="part 2 only")
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--chunks", type=int, default=8, help="generated chunks per rollout")
    p.add_argument("--prefix", type=int, default=2, help="ground-truth chunks written into the cache first")
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "results")
    args = p.parse_args(argv)
    both = not args.decision and not args.frontier
    torch.manual_seed(0)
    if args.decision or both:
        print_decision(decision())
    if args.frontier or both:
        rows = frontier(args)
        print_frontier(rows, args)
        write_csv(args.out / "tiers_frontier.csv", rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
