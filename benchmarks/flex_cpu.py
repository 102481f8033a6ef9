"""FlexAttention on the CPU against the padded layout, side by side (not a test).

    python benchmarks/flex_cpu.py --threads 1                  # fp32 and bf16, the demo's shapes
    python benchmarks/flex_cpu.py --threads 1 --chunk-tokens 256 --rounds 3   # a quick look

One corrected attend (INT2 QuaRot keys and values, group 32, ``taylor``) over ``--cached-chunks``
cached chunks and the current one, at 12 heads x 128 and 1560 tokens a chunk (one latent frame of
Wan 1.3B at 480p), with the per-score correction forced to each layout in turn:

- ``pad``: q, k, v padded to 136 channels, the CPU flash kernel (the automatic choice here);
- ``flex``: torch.compile's CPU FlexAttention with the correction as a ``score_mod`` and the
  log-sum-exp from a sink key (:mod:`jensen_core.correction_layouts`).

The first flex call compiles the kernel for this shape; its wall and CPU time (this process and the
C++ compiler it starts) are printed apart. Inductor caches compiled kernels on disk
(``TORCHINDUCTOR_CACHE_DIR``), so a later process compiles the same shape faster; ``--cold`` points
the cache at a fresh folder, as on a first run. Then every configuration runs in the same process,
interleaved round by round; ratios are medians of per-round ratios of the process's CPU time (other
processes on a shared machine inflate wall time, not our CPU time). The last line per dtype is the
number of attends after which flex's compilation would be paid back ("never" when flex is slower
per call): the reason the automatic choice leaves flex out on the CPU.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the pack's jensen_core; appended, so ComfyUI's folder stays first
    sys.path.append(str(ROOT))

from jensen_core import ChunkCache, QuantSpec, correction_layouts, cpu  # noqa: E402
from jensen_core.correction_layouts import Layout  # noqa: E402
from jensen_core.workload import make_workload  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def _cpu_s() -> float:
    """CPU time of this process and of its finished children (the C++ compiler torch.compile starts)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def run(dtype: torch.dtype, rounds: int, heads: int, chunk_tokens: int, cached_chunks: int) -> dict:
    w = make_workload(heads=heads, chunk_tokens=chunk_tokens, cached_chunks=cached_chunks, dtype=dtype)
    spec = QuantSpec(bits=2, group_size=32, rotation="hadamard")
    cache = ChunkCache(spec, spec)
    for k, v in zip(w.k_cached, w.v_cached):
        cache.append(k, v)
    D = w.q.shape[-1]
    G = D // spec.group_size
    key = ("cpu", dtype, D, G)
    layouts = {"pad": Layout("pad", correction_layouts.round_up(D + G, 8)), "flex": Layout("flex", D, sink=True)}

    def attend(kind):
        def call():
            if kind == "off":
                return cache.attend(w.q, w.k_cur, w.v_cur, correction="off")
            correction_layouts._LAYOUTS[key] = layouts[kind]
            return cache.attend(w.q, w.k_cur, w.v_cur, correction="taylor")

        return call

    calls = {"INT2, no correction": attend("off"), "INT2 + Taylor, pad": attend("pad")}
    calls["INT2 + Taylor, flex"] = attend("flex")
    calls["INT2, no correction"]()
    ref = calls["INT2 + Taylor, pad"]()
    t0, c0 = time.perf_counter(), _cpu_s()
    out = calls["INT2 + Taylor, flex"]()  # compiles FlexAttention for this shape
    compile_wall, compile_cpu = time.perf_counter() - t0, _cpu_s() - c0
    diff = (out.float() - ref.float()).abs().max().item()
    times = {name: [] for name in calls}
    names = list(calls)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            c0 = time.process_time()
            calls[name]()
            times[name].append(time.process_time() - c0)
    med = {name: statistics.median(t) for name, t in times.items()}
    ratio = lambda a, b: statistics.median(x / y for x, y in zip(times[a], times[b]))  # noqa: E731
    return {
        "med": med,
        "flex/pad": ratio("INT2 + Taylor, flex", "INT2 + Taylor, pad"),
        "pad/off": ratio("INT2 + Taylor, pad", "INT2, no correction"),
        "flex/off": ratio("INT2 + Taylor, flex", "INT2, no correction"),
        "compile_wall": compile_wall,
        "compile_cpu": compile_cpu,
        "diff": diff,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--chunk-tokens", type=int, default=1560)
    ap.add_argument("--cached-chunks", type=int, default=4)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    ap.add_argument("--cold", action="store_true", help="compile without inductor's on-disk cache (a first run)")
    args = ap.parse_args(argv)
    if args.cold:
        import os
        import tempfile

        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="flex_cpu_inductor_")
    if args.threads:
        torch.set_num_threads(args.threads)
    klass = cpu.cpu_class()
    print(f"command: python benchmarks/flex_cpu.py {' '.join(sys.argv[1:] if argv is None else argv)}".rstrip())
    print(
        f"torch {torch.__version__}, CPU class {klass}, inductor cache {'fresh (--cold)' if args.cold else 'as found'}, {torch.get_num_threads()} threads; {args.heads} heads x 128, "
        f"{args.chunk_tokens} tokens/chunk, {args.cached_chunks} cached chunks + current (INT2 QuaRot, g32); "
        f"{args.rounds} interleaved rounds"
    )
    for dname in args.dtypes.split(","):
        r = run(DTYPES[dname], args.rounds, args.heads, args.chunk_tokens, args.cached_chunks)
        print(f"\n== {dname} on {klass} ==")
        for name, m in r["med"].items():
            print(f"  {name:<28}{m * 1e3:10.1f} ms CPU (median)")
        print(
            f"  flex compile for this shape  {r['compile_wall']:10.1f} s wall, {r['compile_cpu']:.1f} s CPU "
            "(incl. the C++ compiler; once per shape and dtype)"
        )
        print(f"  max |flex - pad| of the output  {r['diff']:.2e}")
        print(f"  INT2 + Taylor / INT2, pad                 {r['pad/off']:.3f}")
        print(f"  INT2 + Taylor / INT2, flex                {r['flex/off']:.3f}")
        print(f"  flex / pad (per attend)                   {r['flex/pad']:.3f}")
        saved = r["med"]["INT2 + Taylor, pad"] - r["med"]["INT2 + Taylor, flex"]
        payback = f"{r['compile_cpu'] / saved:.0f} attends" if saved > 0 else "never (flex is slower per attend)"
        print(f"  flex's compilation paid back after        {payback}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
