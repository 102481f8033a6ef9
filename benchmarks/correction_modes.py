"""taylor, chunk_mean and head_mean side by side on the same calls: quality and cost (issue 40, item 5; not a test).

    python benchmarks/correction_modes.py                  # the demo's workload, 4 heads, INT2 g32 RTN and QuaRot
    python benchmarks/correction_modes.py --heads 12       # the demo's full shape (slower)

Quality, against full precision on the seeded workload (``jensen_core.workload``: Wan 2.1 1.3B's shapes, 4 cached
chunks + the current one, every 4th query): median ΔP_S, mean JSD and attention-output MSE, per mode, guarded (as
every run of the pack is) and unguarded. Cost: the CPU time of one ``ChunkCache.attend`` per mode, interleaved
round by round, as the median per-round ratio to the uncorrected attend. Prints ratios to ``taylor`` side by side.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

import torch  # noqa: E402

from jensen_core import ChunkCache, QuantSpec  # noqa: E402
from jensen_core.attention_shift import attention_shift  # noqa: E402
from jensen_core.quant import cat_quantized  # noqa: E402
from jensen_core.workload import make_workload  # noqa: E402

MODES = ("off", "taylor", "chunk_mean", "head_mean")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--stride", type=int, default=4, help="every n-th query for the quality metrics")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    w = make_workload(heads=args.heads)
    print(f"workload: {args.heads} heads x 128, 1560 tokens/chunk, 4 cached chunks; torch {torch.__version__}")
    for scheme, rot in (("QuaRot", "hadamard"), ("RTN", "none")):
        spec = QuantSpec(bits=2, group_size=32, rotation=rot)
        cache = ChunkCache(spec, spec)
        for k, v in zip(w.k_cached, w.v_cached):
            cache.append(k, v)
        kq = cat_quantized([e.k for e in cache.entries])
        vq = cat_quantized([e.v for e in cache.entries])
        k_ref, v_ref = torch.cat(w.k_cached, -2), torch.cat(w.v_cached, -2)
        tokens = [e.tokens for e in cache.entries]
        print(f"\n== INT2 g32 {scheme} ==")
        print(f"  {'mode':<22}{'median dP_S':>12}{'mean JSD':>11}{'output MSE':>12}")
        quality = {}
        for mode in MODES:
            for guard in (False, True) if mode != "off" else (False,):
                st = attention_shift(
                    w.q, k_ref, v_ref, w.k_cur, w.v_cur, kq, vq, mode, query_stride=args.stride,
                    chunk_tokens=tokens, guard=guard,
                )  # fmt: skip
                name = mode + (", guarded" if guard else "")
                quality[name] = st
                print(
                    f"  {name:<22}{float(st.delta_ps.median()):>+12.4f}{float(st.jsd.mean()):>11.4f}{st.output_mse:>12.3e}"
                )
        calls = {
            m: (lambda m=m, c=cache: c.attend(w.q, w.k_cur, w.v_cur, correction=m, guard=m != "off")) for m in MODES
        }
        for fn in calls.values():
            fn()
        cpu = {m: [] for m in MODES}
        for r in range(args.rounds):
            for m in MODES[r % len(MODES) :] + MODES[: r % len(MODES)]:
                c0 = time.process_time()
                calls[m]()
                cpu[m].append(time.process_time() - c0)
        cost = {m: statistics.median(a / b for a, b in zip(cpu[m], cpu["off"])) for m in MODES}
        print(f"  side by side (guarded), ratio to taylor | CPU time per attend / uncorrected ({args.rounds} rounds):")
        t = quality["taylor, guarded"]
        for m in ("taylor", "chunk_mean", "head_mean"):
            s = quality[f"{m}, guarded"]
            print(
                f"    {m:<12} |dP_S| {abs(float(s.delta_ps.median())) / max(abs(float(t.delta_ps.median())), 1e-12):6.2f}x"
                f"  JSD {float(s.jsd.mean()) / float(t.jsd.mean()):5.3f}x  MSE {s.output_mse / t.output_mse:5.3f}x"
                f"  | cost {cost[m]:5.3f}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
