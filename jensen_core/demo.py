"""``python -m jensen_core demo``: the Jensen bias and its correction on a video-shaped workload.

Runs a BF16 cache, INT2 RTN, INT2 RTN + Jensen, INT2 QuaRot + Jensen and INT4 RTN over the same
seeded layer (see :mod:`jensen_core.workload`), prints one table and writes a histogram of the
attention-mass shift before and after correction (the paper's Fig. 4, on this data).
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import time
from dataclasses import dataclass

import torch

from .attention_shift import ShiftStats, attention_shift
from .cache import ChunkCache
from .quant import cat_quantized
from .spec import QuantSpec
from .workload import Workload, make_workload

logger = logging.getLogger("jensen_kv")


@dataclass(frozen=True)
class Config:
    name: str
    spec: QuantSpec | None
    correction: str


CONFIGS = (
    Config("BF16 cache", None, "off"),
    Config("INT2 RTN", QuantSpec(bits=2, group_size=32, rotation="none"), "off"),
    Config("INT2 RTN + Jensen", QuantSpec(bits=2, group_size=32, rotation="none"), "taylor"),
    Config("INT2 QuaRot", QuantSpec(bits=2, group_size=32, rotation="hadamard"), "off"),
    Config("INT2 QuaRot + Jensen", QuantSpec(bits=2, group_size=32, rotation="hadamard"), "taylor"),
    Config("INT4 RTN", QuantSpec(bits=4, group_size=32, rotation="none"), "off"),
)


@dataclass
class Row:
    config: Config
    cache_mib: float
    effective_bits: float
    stats: ShiftStats
    ms: float


def fill_cache(w: Workload, spec: QuantSpec | None) -> ChunkCache:
    cache = ChunkCache(spec, spec)
    for k, v in zip(w.k_cached, w.v_cached):
        if spec is None:
            k, v = k.to(torch.bfloat16), v.to(torch.bfloat16)
        cache.append(k, v)
    return cache


def time_attend(cache: ChunkCache, w: Workload, correction: str, repeats: int) -> float:
    cache.attend(w.q, w.k_cur, w.v_cur, correction=correction)  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        cache.attend(w.q, w.k_cur, w.v_cur, correction=correction)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


def run_config(w: Workload, cfg: Config, repeats: int, query_stride: int) -> Row:
    cache = fill_cache(w, cfg.spec)
    ents = cache.entries
    if cfg.spec is None:
        k_hat = torch.cat([e.k for e in ents], dim=-2)
        v_hat = torch.cat([e.v for e in ents], dim=-2)
    else:
        k_hat = cat_quantized([e.k for e in ents])
        v_hat = cat_quantized([e.v for e in ents])
    stats = attention_shift(
        w.q,
        w.k_cached_all,
        w.v_cached_all,
        w.k_cur,
        w.v_cur,
        k_hat,
        v_hat,
        correction=cfg.correction,
        query_stride=query_stride,
    )
    ms = time_attend(cache, w, cfg.correction, repeats)
    return Row(cfg, cache.nbytes / 2**20, cache.effective_bits, stats, ms)


def format_table(rows: list[Row]) -> str:
    head = f"{'configuration':<22}{'cache MiB':>10}{'eff. bits':>10}{'median dP_S':>13}{'mean JSD':>11}{'output MSE':>12}{'ms/attn':>9}"
    lines = [head, "-" * len(head)]
    for r in rows:
        s = r.stats
        lines.append(
            f"{r.config.name:<22}{r.cache_mib:>10.2f}{r.effective_bits:>10.2f}{s.median_delta_ps:>+13.4f}"
            f"{s.mean_jsd:>11.4f}{s.output_mse:>12.2e}{r.ms:>9.0f}"
        )
    return "\n".join(lines)


def plot_histograms(rows: list[Row], path: str) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        logger.warning("matplotlib is not installed: no histogram written (pip install matplotlib)")
        return None
    by_name = {r.config.name: r for r in rows}
    pairs = [("INT2 RTN", "INT2 RTN + Jensen"), ("INT2 QuaRot", "INT2 QuaRot + Jensen")]
    fig, axes = plt.subplots(1, len(pairs), figsize=(11, 3.8), sharey=True)
    for ax, (before, after) in zip(axes, pairs):
        b, a = by_name[before].stats.delta_ps, by_name[after].stats.delta_ps
        lo = float(min(b.min(), a.min()))
        hi = float(max(b.max(), a.max()))
        bins = torch.linspace(lo, hi, 81).tolist()
        ax.hist(
            b.numpy(),
            bins=bins,
            color="#7b3fa0",
            alpha=0.7,
            label=f"{before}: median {by_name[before].stats.median_delta_ps:+.4f}",
        )
        ax.hist(
            a.numpy(),
            bins=bins,
            color="#f08a24",
            alpha=0.7,
            label=f"with correction: median {by_name[after].stats.median_delta_ps:+.4f}",
        )
        ax.axvline(0, color="k", lw=0.8)
        ax.set_xlabel(r"$\Delta P_S$ (attention mass shift to cached keys)")
        ax.set_title(before)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("queries")
    fig.suptitle("Attention stolen by INT2 cached keys, before and after the Jensen correction")
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m jensen_core demo", description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument(
        "--chunk-tokens",
        type=int,
        default=1560,
        help="tokens per chunk (1560 = one latent frame of a 480x832 Wan 2.1 video)",
    )
    ap.add_argument("--cached-chunks", type=int, default=4, help="chunks in the attention window")
    ap.add_argument("--repeats", type=int, default=3, help="timed attention calls per configuration (median)")
    ap.add_argument("--query-stride", type=int, default=4, help="diagnose every n-th query")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    ap.add_argument("--out", default="out/demo_delta_ps.png", help="where to write the histogram PNG")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    w = make_workload(
        seed=args.seed, heads=args.heads, chunk_tokens=args.chunk_tokens, cached_chunks=args.cached_chunks
    )
    print(
        f"workload: {args.heads} heads x head_dim 128, {args.chunk_tokens} tokens/chunk, window {args.cached_chunks} "
        f"cached chunks + the current one ({(args.cached_chunks + 1) * args.chunk_tokens} keys), seed {args.seed}, "
        f"fp32 compute on {torch.get_num_threads()} threads"
    )
    rows = [run_config(w, cfg, args.repeats, args.query_stride) for cfg in CONFIGS]
    print(format_table(rows))
    path = plot_histograms(rows, args.out)
    if path:
        print(f"histogram: {path}")
    print(f"done in {time.perf_counter() - t0:.1f} s")
    return 0
