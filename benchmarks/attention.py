"""Benchmark of one corrected attention call at the demo's shapes (not a test).

    python benchmarks/attention.py                 # fp32 and bf16 on the CPU
    python benchmarks/attention.py --threads 1     # steadier on a shared machine (see below)
    python benchmarks/attention.py --profile       # plus where one attend's time goes, before and after
    python benchmarks/attention.py --device cuda   # the same code on a GPU (SDPA picks a fused kernel)

Every configuration runs in the same process, interleaved round by round, and each ratio is the
median of the per-round ratios, so a machine that gets busier or quieter hurts all sides alike.
On the CPU the ratios use the process's CPU time (other processes on a shared machine inflate
wall time, not the CPU time our threads spend); wall-clock ratios are printed next to them. With
several torch threads on a machine that other processes keep busy, OpenMP's spin-waiting between
the many small parallel regions (dequantization, merges) counts as CPU time too; ``--threads 1``
measures the work itself. Each ratio is printed with the CPU class (AMX / AVX-512 / AVX2, from
/proc/cpuinfo) and the layout the per-score correction chose, so figures from machines compare.

"before" rows run the dequantization and rotations as the first release did (channel-order
unpacking, half-precision arithmetic, the current chunk rotated into the codes' space and back:
``jensen_core.attention._LEGACY``) in the same rounds as the current path.

Targets:
  time(INT2 + Taylor) / time(INT2, no correction)      <= 1.10   (fp32 and bf16)
  time(INT2 + chunk_mean) / time(INT2, no correction)  <= 1.02   (the zero-cost correction)
  time(guarded correction) / time(unguarded)           <= 1.05   (the guard: 32 sampled queries per chunk)
  time(INT2 cache + correction) / time(SDPA, unquantized same keys) <= 1.50
  peak extra memory of one attend / one layer's window (K+V, compute dtype) <= 1.0
  stored bytes / BF16 bytes == effective_bits / 16 within 1%
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the pack's jensen_core and jensen_testing; appended, so ComfyUI's folder stays first
    sys.path.append(str(ROOT))

from jensen_core import ChunkCache, QuantSpec, attention, correction_layouts, cpu  # noqa: E402
from jensen_core.workload import make_workload  # noqa: E402


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def _rss():
    s = Path("/proc/self/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+)", s).group(1)) * 1024, int(re.search(r"VmHWM:\s+(\d+)", s).group(1)) * 1024


def exact_rss_accounting() -> None:
    """Make freed large blocks go back to the OS at once (glibc mallopt M_MMAP_THRESHOLD = 64 KiB).

    Only in the child process that measures memory: every allocation then faults in fresh pages,
    which would slow the timed calls.

    Otherwise glibc reuses freed heap memory without touching RSS, and an attend that runs after
    another one shows no growth at all; with every large tensor in its own mapping, the peak RSS
    above the baseline is the peak of live tensor memory.
    """
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").mallopt(-3, 1 << 16)  # M_MMAP_THRESHOLD
    except OSError:
        print("(no glibc: peak memory figures may under-count)")


def peak_extra_bytes(fn, device) -> int:
    """Peak memory above what was allocated before ``fn`` ran (CUDA allocator, or the process's RSS)."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = fn()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
        del out
        return peak
    Path("/proc/self/clear_refs").write_text("5")  # resets the peak RSS (VmHWM) of this process
    base, _ = _rss()
    out = fn()
    _, hwm = _rss()
    del out
    return hwm - base


def _setup(dtype, device, heads, chunk_tokens, cached_chunks):
    w = make_workload(heads=heads, chunk_tokens=chunk_tokens, cached_chunks=cached_chunks, dtype=dtype)
    move = lambda t: t.to(device)  # noqa: E731
    q, k_cur, v_cur = map(move, (w.q, w.k_cur, w.v_cur))
    spec = QuantSpec(bits=2, group_size=32, rotation="none")
    cache = ChunkCache(spec, spec)
    for k, v in zip(w.k_cached, w.v_cached):
        cache.append(move(k), move(v))
    window = 2 * (cached_chunks + 1) * q.numel() * q.element_size()  # one layer's K+V over the whole window
    return q, k_cur, v_cur, cache, window


def measure_memory(dtype, device, heads, chunk_tokens, cached_chunks) -> dict:
    """Peak extra memory of one corrected attend / one layer's window, both fast-path variants."""
    q, k_cur, v_cur, cache, window = _setup(dtype, device, heads, chunk_tokens, cached_chunks)
    call = lambda: cache.attend(q, k_cur, v_cur, correction="taylor")  # noqa: E731
    call()
    mem = {"window_mib": window / 2**20}
    for label, force in (("streamed", False), ("one buffer", True)):
        attention._FORCE_CONCAT = force
        try:
            mem[label] = max(peak_extra_bytes(call, device) for _ in range(3)) / window
        finally:
            attention._FORCE_CONCAT = False
    return mem


def memory_in_child(dname: str, device: torch.device, args) -> dict:
    """Run :func:`measure_memory` in a fresh process whose allocator returns freed memory at once."""
    cmd = [
        sys.executable,
        __file__,
        "--memory-child",
        "--dtypes",
        dname,
        "--device",
        str(device),
        "--heads",
        str(args.heads),
        "--chunk-tokens",
        str(args.chunk_tokens),
        "--cached-chunks",
        str(args.cached_chunks),
        "--threads",
        str(args.threads),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def _legacy(fn):
    """``fn`` on the first release's path (see the module docstring)."""

    def call():
        attention._LEGACY = True
        try:
            return fn()
        finally:
            attention._LEGACY = False

    return call


def _calls(dtype, device, heads, chunk_tokens, cached_chunks) -> dict:
    w = make_workload(heads=heads, chunk_tokens=chunk_tokens, cached_chunks=cached_chunks, dtype=dtype)
    move = lambda t: t.to(device)  # noqa: E731
    q, k_cur, v_cur = map(move, (w.q, w.k_cur, w.v_cur))
    k_all = torch.cat([move(k) for k in w.k_cached] + [k_cur], dim=-2)
    v_all = torch.cat([move(v) for v in w.v_cached] + [v_cur], dim=-2)
    calls = {"SDPA, unquantized": lambda: F.scaled_dot_product_attention(q, k_all, v_all)}
    caches = {}
    for name, rot in (("RTN", "none"), ("QuaRot", "hadamard")):
        spec = QuantSpec(bits=2, group_size=32, rotation=rot)
        c = caches[name] = ChunkCache(spec, spec)
        for k, v in zip(w.k_cached, w.v_cached):
            c.append(move(k), move(v))
        for label, mode in (("", "off"), (" + Taylor", "taylor"), (" + chunk_mean", "chunk_mean")):
            fn = lambda c=c, mode=mode: c.attend(q, k_cur, v_cur, correction=mode)  # noqa: E731
            calls[f"INT2 {name}{label}"] = fn
            if mode != "chunk_mean":
                calls[f"INT2 {name}{label} (before)"] = _legacy(fn)
            if mode != "off":  # the guard (on in every run of the pack) against the unguarded correction
                guarded = lambda c=c, mode=mode: c.attend(q, k_cur, v_cur, correction=mode, guard=True)  # noqa: E731
                calls[f"INT2 {name}{label}, guarded"] = guarded
    return calls, caches


def run(
    dtype: torch.dtype, device: torch.device, rounds: int, heads: int, chunk_tokens: int, cached_chunks: int
) -> dict:
    calls, caches = _calls(dtype, device, heads, chunk_tokens, cached_chunks)
    for fn in calls.values():  # warm-up (kernel selection, the LSE self-check, the correction's layout)
        fn()
    times = {name: [] for name in calls}
    cpu = {name: [] for name in calls}
    names = list(calls)
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            _sync(device)
            t0, c0 = time.perf_counter(), time.process_time()
            out = calls[name]()
            _sync(device)
            times[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
            del out
    primary = cpu if device.type == "cpu" else times

    def ratio(a, b, t=None):
        t = t or primary
        return statistics.median(x / y for x, y in zip(t[a], t[b]))

    c = caches["RTN"]
    out = {
        "ms": {n: 1000 * statistics.median(t) for n, t in times.items()},
        "cpu_ms": {n: 1000 * statistics.median(t) for n, t in cpu.items()},
        "wall_taylor_vs_plain": ratio("INT2 RTN + Taylor", "INT2 RTN", times),
        "wall_int2_vs_sdpa": ratio("INT2 RTN + Taylor", "SDPA, unquantized", times),
        "bytes_ratio": c.nbytes / c.bf16_nbytes,
        "bits_ratio": c.effective_bits / 16,
        "spec_bits_ratio": QuantSpec().effective_bits / 16,
    }
    for scheme in ("RTN", "QuaRot"):
        base = f"INT2 {scheme}"
        out[f"taylor_vs_plain {scheme}"] = ratio(f"{base} + Taylor", base)
        out[f"chunk_mean_vs_plain {scheme}"] = ratio(f"{base} + chunk_mean", base)
        out[f"guarded_vs_unguarded taylor {scheme}"] = ratio(f"{base} + Taylor, guarded", f"{base} + Taylor")
        out[f"guarded_vs_unguarded chunk_mean {scheme}"] = ratio(
            f"{base} + chunk_mean, guarded", f"{base} + chunk_mean"
        )
        for suffix in ("", " (before)"):
            out[f"plain_vs_sdpa {scheme}{suffix}"] = ratio(f"{base}{suffix}", "SDPA, unquantized")
            out[f"taylor_vs_sdpa {scheme}{suffix}"] = ratio(f"{base} + Taylor{suffix}", "SDPA, unquantized")
        out[f"taylor_vs_plain {scheme} (before)"] = ratio(f"{base} + Taylor (before)", f"{base} (before)")
    return out


# ------------------------------------------------------------------------------------------- profile
_CATEGORIES = (
    ("attention kernel", ("scaled_dot_product", "flash_attention", "efficient_attention", "flex")),
    ("unpacking codes", ("rshift", "bitwise_and", "__and__", "__rshift__")),
    ("dequant arithmetic (m + code * delta)", ("addcmul", "lerp")),
    ("rotations (Hadamard matmuls)", ("aten::mm", "aten::bmm", "aten::matmul")),
    ("dtype conversions and copies", ("copy_", "_to_copy", "clone", "contiguous")),
    ("log-sum-exp merges", ("logaddexp", "aten::exp", "mul_", "aten::sub")),
)


def profile(dtype, device, heads, chunk_tokens, cached_chunks, repeats: int = 2) -> None:
    """Where one attend's time goes (torch.profiler, self CPU time by category), first release against now."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    calls, _ = _calls(dtype, device, heads, chunk_tokens, cached_chunks)
    print(f"  profile of one attend ({repeats} calls each, self CPU time by category, ms per call):")
    rows = {}
    for name in ("INT2 RTN (before)", "INT2 RTN", "INT2 QuaRot (before)", "INT2 QuaRot", "INT2 QuaRot + Taylor"):
        calls[name]()
        with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(repeats):
                calls[name]()
        cats = dict.fromkeys([c for c, _ in _CATEGORIES] + ["other"], 0.0)
        for ev in prof.key_averages():
            cat = next((c for c, keys in _CATEGORIES if any(k in ev.key for k in keys)), "other")
            cats[cat] += ev.self_cpu_time_total / 1000 / repeats
        rows[name] = cats
    names = list(rows)
    print("    " + f"{'':40s}" + "".join(f"{n:>22s}" for n in names))
    for cat in rows[names[0]]:
        print("    " + f"{cat:40s}" + "".join(f"{rows[n][cat]:22.1f}" for n in names))
    print("    " + f"{'total':40s}" + "".join(f"{sum(rows[n].values()):22.1f}" for n in names))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--chunk-tokens", type=int, default=1560)
    ap.add_argument("--cached-chunks", type=int, default=4)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    ap.add_argument("--profile", action="store_true", help="also print where one attend's time goes, before and after")
    ap.add_argument("--memory-child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.memory_child:
        exact_rss_accounting()
        dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[args.dtypes]
        print(json.dumps(measure_memory(dtype, device, args.heads, args.chunk_tokens, args.cached_chunks)))
        return 0
    klass = cpu.cpu_class() if device.type == "cpu" else torch.cuda.get_device_name(device)
    print("command:", shlex.join(["python", "benchmarks/attention.py", *(sys.argv[1:] if argv is None else argv)]))
    print(
        f"torch {torch.__version__}, device {device} ({klass}; CPU class from /proc/cpuinfo: {cpu.cpu_class()}), "
        f"{torch.get_num_threads()} threads; {args.heads} heads x 128, {args.chunk_tokens} tokens/chunk, "
        f"{args.cached_chunks} cached chunks + current; {args.rounds} interleaved rounds"
    )
    ok = True
    for dname in args.dtypes.split(","):
        dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dname]
        r = run(dtype, device, args.rounds, args.heads, args.chunk_tokens, args.cached_chunks)
        r["mem"] = (
            memory_in_child(dname, device, args)
            if device.type == "cpu"
            else measure_memory(dtype, device, args.heads, args.chunk_tokens, args.cached_chunks)
        )
        r["window_mib"] = r["mem"]["window_mib"]
        layout = correction_layouts.kernel_choices().get(f"{device.type}/{dtype} d128 G4", "?")
        tag = f"[{klass} {dname}]"
        print(f"\n== {dname} on {klass}; Taylor layout: {layout} ==")
        for name, ms in r["ms"].items():
            print(f"  {name:<32}{ms:9.1f} ms wall {r['cpu_ms'][name]:9.1f} ms CPU")
        clock = "CPU time" if device.type == "cpu" else "wall time"
        print(
            f"  ratios below: medians of per-round {clock} ratios (wall-clock: INT2+Taylor/INT2 "
            f"{r['wall_taylor_vs_plain']:.3f}, INT2+Taylor/SDPA {r['wall_int2_vs_sdpa']:.3f})"
        )
        checks = [
            ("INT2 + Taylor / INT2 (RTN)", r["taylor_vs_plain RTN"], 1.10),
            ("INT2 + Taylor / INT2 (QuaRot)", r["taylor_vs_plain QuaRot"], 1.10),
            ("INT2 + chunk_mean / INT2 (RTN)", r["chunk_mean_vs_plain RTN"], 1.02),
            ("INT2 + chunk_mean / INT2 (QuaRot)", r["chunk_mean_vs_plain QuaRot"], 1.02),
            ("guarded / unguarded Taylor (RTN)", r["guarded_vs_unguarded taylor RTN"], 1.05),
            ("guarded / unguarded Taylor (QuaRot)", r["guarded_vs_unguarded taylor QuaRot"], 1.05),
            ("guarded / unguarded chunk_mean (RTN)", r["guarded_vs_unguarded chunk_mean RTN"], 1.05),
            ("guarded / unguarded chunk_mean (QuaRot)", r["guarded_vs_unguarded chunk_mean QuaRot"], 1.05),
            ("INT2 + Taylor / SDPA unquantized (RTN)", r["taylor_vs_sdpa RTN"], 1.50),
            ("INT2 + Taylor / SDPA unquantized (QuaRot)", r["taylor_vs_sdpa QuaRot"], 1.50),
            ("peak extra memory / window K+V (streamed)", r["mem"]["streamed"], 1.0),
        ]
        for label, value, target in checks:
            met = value <= target
            ok &= met
            print(f"  {label:<44}{value:7.3f}  {tag} (target <= {target:.2f}: {'met' if met else 'MISSED'})")
        print(
            f"  {'  same, single-buffer fallback path':<44}{r['mem']['one buffer']:7.3f}  (window = {r['window_mib']:.1f} MiB)"
        )
        dev = abs(r["bytes_ratio"] / r["bits_ratio"] - 1)
        ok &= dev <= 0.01
        print(
            f"  stored / BF16 bytes {r['bytes_ratio']:.5f} vs effective_bits/16 {r['spec_bits_ratio']:.5f} "
            f"(deviation {dev:.2%}, target <= 1%: {'met' if dev <= 0.01 else 'MISSED'})"
        )
        print(f"  dequantization and rotations, first release -> now (same rounds) {tag}:")
        for scheme in ("RTN", "QuaRot"):
            for label, key in (
                ("INT2 / SDPA unquantized", "plain_vs_sdpa"),
                ("INT2 + Taylor / SDPA unquantized", "taylor_vs_sdpa"),
            ):
                print(
                    f"    {label + f' ({scheme})':<46}{r[f'{key} {scheme} (before)']:7.3f} -> {r[f'{key} {scheme}']:.3f}"
                )
            print(
                f"    {f'INT2 + Taylor / INT2 ({scheme})':<46}{r[f'taylor_vs_plain {scheme} (before)']:7.3f} -> "
                f"{r[f'taylor_vs_plain {scheme}']:.3f}"
            )
        if args.profile:
            profile(dtype, device, args.heads, args.chunk_tokens, args.cached_chunks)
    print("\nall targets met" if ok else "\nsome targets MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
