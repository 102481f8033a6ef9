"""What QVG costs against RTN on the demo's shapes: writing a chunk (k-means) and attending (not a test).

    python benchmarks/qvg.py                  # CPU, fp32, 5 interleaved rounds
    python benchmarks/qvg.py --device cuda    # the same code on a GPU
    python benchmarks/qvg.py --auto-k         # what auto K picks, and the bits, on Wan and tiny-model chunks (no timing)

Write: quantizing one finished chunk's keys and values (12 heads x 1,560 tokens x 128 each), as
``ChunkCache.append`` does. Attend: one ``ChunkCache.attend`` of the current chunk over 4 cached
chunks with the Taylor correction (the fused fast path). Every configuration runs in the same
process, interleaved round by round; each ratio is the median of the per-round ratios (CPU time of
this process on the CPU, wall time on a GPU), so a machine that gets busier hurts all sides alike.
The k-means line times :func:`jensen_core.qvg.kmeans` alone on one side of one chunk.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the pack's jensen_core and jensen_testing; appended, so ComfyUI's folder stays first
    sys.path.append(str(ROOT))

from jensen_core import ChunkCache, QuantSpec, kmeans, quantize  # noqa: E402
from jensen_core.workload import make_workload  # noqa: E402

CONFIGS = {
    "RTN g32": QuantSpec(bits=2, group_size=32),
    "QuaRot g32": QuantSpec(bits=2, group_size=32, rotation="hadamard"),
    "QVG g64 K30": QuantSpec(bits=2, group_size=64, method="qvg", qvg_centroids=30),
    "QVG+QuaRot g64 K30": QuantSpec(bits=2, group_size=64, rotation="hadamard", method="qvg", qvg_centroids=30),
    "QVG g64 K256 (QVG default)": QuantSpec(bits=2, group_size=64, method="qvg", qvg_centroids=256),
}
BASE = "RTN g32"


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def interleaved(calls: dict, rounds: int, device) -> tuple[dict, dict]:
    """Median wall and CPU ms per call, and per-round times, with the call order rotated every round."""
    for fn in calls.values():
        fn()  # warm-up
    wall = {n: [] for n in calls}
    cpu = {n: [] for n in calls}
    names = list(calls)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            _sync(device)
            t0, c0 = time.perf_counter(), time.process_time()
            out = calls[name]()
            _sync(device)
            wall[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
            del out
    return wall, cpu


def ratios(times: dict, base: str) -> dict:
    return {n: statistics.median(a / b for a, b in zip(t, times[base])) for n, t in times.items()}


#: (label, tokens per chunk) of the chunks auto K's table shows
AUTO_K_CHUNKS = (
    ("tiny AR model (3 latent frames of 8 x 8)", 192),
    ("Wan 480p, 1 latent frame (52 x 30)", 1560),
    ("Wan 480p, 3 latent frames (Self-Forcing)", 4680),
    ("Wan 720p, 3 latent frames (80 x 45 x 3)", 10800),
    ("MAGI-1 720 x 720, 6 latent frames (QVG's 2.52-bit rows)", 12150),
)


def auto_k_table() -> list[str]:
    """Markdown: K auto picks per chunk size and the stored bits of INT2 QVG at g32 / g64 / g128 (K and V alike)."""
    from jensen_core.methods import method_of

    lines = [
        "| chunk | tokens T | auto K | centroid bits | INT2 g32 | INT2 g64 | INT2 g128 |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, t in AUTO_K_CHUNKS:
        bits = []
        for g in (32, 64, 128):
            spec = QuantSpec(bits=2, group_size=g, method="qvg")
            bits.append(method_of(spec).effective_bits_for(spec, 128, t))
        spec = QuantSpec(bits=2, group_size=64, method="qvg")
        b = method_of(spec).bits_breakdown(spec, 128, t)
        lines.append(
            f"| {label} | {t:,} | {b['centroids']} | {b['centroid_bits']:.3f} | "
            + " | ".join(f"{x:.3f}" for x in bits)
            + " |"
        )
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--auto-k", action="store_true", help="print what auto K picks per chunk size, and the bits")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--chunk-tokens", type=int, default=1560)
    ap.add_argument("--cached-chunks", type=int, default=4)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    args = ap.parse_args(argv)
    if args.auto_k:
        print("\n".join(auto_k_table()))
        return 0
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    w = make_workload(heads=args.heads, chunk_tokens=args.chunk_tokens, cached_chunks=args.cached_chunks)
    move = lambda t: t.to(device)  # noqa: E731
    q, k_cur, v_cur = map(move, (w.q, w.k_cur, w.v_cur))
    k0, v0 = move(w.k_cached[0]), move(w.v_cached[0])
    print(
        f"torch {torch.__version__}, {device}, {torch.get_num_threads()} threads; {args.heads} heads x 128, "
        f"{args.chunk_tokens} tokens/chunk, {args.cached_chunks} cached chunks; {args.rounds} interleaved rounds; "
        "QVG: 1 stage, at most 2 k-means iterations (its scripts' setting)"
    )
    clock = "CPU" if device.type == "cpu" else "wall"

    # ---- write: one chunk's K and V
    writes = {n: (lambda s=s: (quantize(k0, s), quantize(v0, s))) for n, s in CONFIGS.items()}
    rows = k0.reshape(-1, args.chunk_tokens, 128).float()
    for k in (30, 256):
        writes[f"k-means alone, K={k}, one side"] = lambda k=k: kmeans(
            rows, k, 2, generator=torch.Generator().manual_seed(0)
        )
    wall, cpu = interleaved(writes, args.rounds, device)
    prim = cpu if device.type == "cpu" else wall
    r = ratios(prim, BASE)
    print(f"\nwrite one chunk (K and V): median ms ({clock}) and ratio to {BASE} (median of per-round ratios)")
    for n in writes:
        print(f"  {n:<34}{1000 * statistics.median(prim[n]):9.1f} ms   x{r[n]:.2f}")

    # ---- attend: the current chunk over the cached ones, Taylor-corrected (and plain for the QVG overhead)
    caches = {}
    for n, s in CONFIGS.items():
        c = ChunkCache(s, s)
        for k, v in zip(w.k_cached, w.v_cached):
            c.append(move(k), move(v))
        caches[n] = c
    attends = {n: (lambda c=c: c.attend(q, k_cur, v_cur, correction="taylor")) for n, c in caches.items()}
    attends["QVG g64 K30, no correction"] = lambda: caches["QVG g64 K30"].attend(q, k_cur, v_cur, correction="off")
    attends["RTN g32, no correction"] = lambda: caches[BASE].attend(q, k_cur, v_cur, correction="off")
    wall, cpu = interleaved(attends, args.rounds, device)
    prim = cpu if device.type == "cpu" else wall
    r = ratios(prim, BASE)
    print(f"\nattend (Taylor-corrected fast path): median ms ({clock}) and ratio to {BASE} + Taylor")
    for n in attends:
        print(f"  {n:<34}{1000 * statistics.median(prim[n]):9.1f} ms   x{r[n]:.2f}")
    qvg_corr = statistics.median(a / b for a, b in zip(prim["QVG g64 K30"], prim["QVG g64 K30, no correction"]))
    print(f"  correction overhead on QVG (QVG g64 K30 + Taylor / no correction): x{qvg_corr:.2f}")
    print(
        "\nstored bits per element (keys and values alike): "
        + ", ".join(f"{n} {c.effective_bits:.3f}" for n, c in caches.items())
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
