"""Grouped-query attention: the pack's GQA attend against the equivalent repeated-KV paths, side by side (not a test).

    python benchmarks/gqa.py                     # fp32 on the CPU, MAGI-1 4.5B's heads
    python benchmarks/gqa.py --threads 1         # steadier on a shared machine
    python benchmarks/gqa.py --dtype bf16 --device cuda --chunk-tokens 21600

Shapes: MAGI-1 4.5B's self-attention (24 query heads over 8 K/V heads, head_dim 128), ``--cached-chunks`` cached
chunks of ``--chunk-tokens`` tokens (MAGI-1 720p: 21,600) and a current chunk of as many queries; keys and values
INT2 g32 with the Hadamard rotation, Taylor correction. Three ways to the same attention:

- **GQA**: the cache holds the 8 K/V heads; the query heads of a group are folded into their K/V head's query
  rows (``jensen_core.attention.cached_attention``), so every chunk is dequantized once, into an 8-head buffer;
- **repeated at store**: the K/V repeated to 24 heads before they are cached (what a cache without GQA holds):
  3x the stored bytes, 24-head buffers;
- **repeated per attend**: the 8-head cache's codes indexed to 24 heads at every attend (the per-chunk expansion a
  kernel without GQA would need): the stored bytes of GQA, the buffers and work of the repeated cache.

All three give the same numbers (printed: the largest difference to GQA). Printed per path: the median time of one
attend (the process's CPU time on the CPU, CUDA time on a GPU) and its ratio to GQA, measured interleaved round by
round in one process; the peak transient memory of one attend (a child process whose allocator returns freed
memory at once, RSS above the baseline; CUDA: the allocator's peak) and its ratio to GQA's; and the bytes stored.
The query-sized tensors (the query in the layout's width, the fp32 accumulator, the output) are the same on every
path; what differs is the chunk buffer (8 or 24 heads) and, per attend, the expanded codes.

Targets: GQA time <= either repeated path's; GQA transient < either repeated path's; stored bytes at store 3x.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

from jensen_core import CacheEntry, ChunkCache, QuantSpec, cached_attention, cpu  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _rss() -> tuple[int, int]:
    s = Path("/proc/self/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+)", s).group(1)) * 1024, int(re.search(r"VmHWM:\s+(\d+)", s).group(1)) * 1024


def _peak_extra_bytes(fn, device) -> int:
    if device.type == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = fn()
        torch.cuda.synchronize()
        del out
        return torch.cuda.max_memory_allocated() - base
    Path("/proc/self/clear_refs").write_text("5")  # resets the peak RSS (VmHWM)
    base, _ = _rss()
    out = fn()
    _, hwm = _rss()
    del out
    return hwm - base


def _setup(args, device):
    dtype = DTYPES[args.dtype]
    gen = torch.Generator().manual_seed(0)
    Hq, Hkv, D, T = args.heads, args.kv_heads, 128, args.chunk_tokens
    G = Hq // Hkv
    idx = [h // G for h in range(Hq)]
    spec = QuantSpec(bits=2, group_size=32, rotation="hadamard")
    gqa, stored_rep = ChunkCache(spec, spec), ChunkCache(spec, spec)
    for _ in range(args.cached_chunks):
        k = (torch.randn(1, Hkv, T, D, generator=gen) * 2).to(device=device, dtype=dtype)
        v = torch.randn(1, Hkv, T, D, generator=gen).to(device=device, dtype=dtype)
        gqa.append(k, v)
        stored_rep.append(k[:, idx].contiguous(), v[:, idx].contiguous())
    q = (torch.randn(1, Hq, T, D, generator=gen) * 2).to(device=device, dtype=dtype)
    kc, vc = (torch.randn(1, Hkv, T, D, generator=gen).to(device=device, dtype=dtype) for _ in range(2))
    kcr, vcr = kc[:, idx].contiguous(), vc[:, idx].contiguous()

    def per_attend():
        entries = [CacheEntry(e.k[:, idx], e.v[:, idx]) for e in gqa.entries]  # the codes expanded at each attend
        return cached_attention(q, kcr, vcr, entries, "taylor")

    calls = {
        "GQA (K/V heads, query heads folded)": lambda: gqa.attend(q, kc, vc, "taylor"),
        "repeated at store (H_q-head cache)": lambda: stored_rep.attend(q, kcr, vcr, "taylor"),
        "repeated per attend (codes expanded)": per_attend,
    }
    stored = {
        "GQA (K/V heads, query heads folded)": gqa.nbytes,
        "repeated at store (H_q-head cache)": stored_rep.nbytes,
        "repeated per attend (codes expanded)": gqa.nbytes,
    }
    return calls, stored


def measure_memory(args, device) -> dict:
    calls, _ = _setup(args, device)
    for fn in calls.values():
        fn()
    return {name: max(_peak_extra_bytes(fn, device) for _ in range(3)) for name, fn in calls.items()}


def memory_in_child(args) -> dict:
    cmd = [sys.executable, __file__, "--memory-child", *sys.argv[1:]]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", choices=DTYPES, default="fp32")
    ap.add_argument("--heads", type=int, default=24)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--chunk-tokens", type=int, default=1024)
    ap.add_argument("--cached-chunks", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--memory-child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if args.memory_child:
        if device.type == "cpu":
            import ctypes

            ctypes.CDLL("libc.so.6").mallopt(-3, 1 << 16)  # M_MMAP_THRESHOLD: freed blocks leave RSS at once
        print(json.dumps(measure_memory(args, device)))
        return 0
    calls, stored = _setup(args, device)
    outs = {name: fn().float() for name, fn in calls.items()}  # warm-up (layout choice, LSE check) and the outputs
    names = list(calls)
    primary = {n: [] for n in names}
    for r in range(args.rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            _sync(device)
            t0, c0 = time.perf_counter(), time.process_time()
            out = calls[name]()
            _sync(device)
            primary[name].append(time.process_time() - c0 if device.type == "cpu" else time.perf_counter() - t0)
            del out
    mem = measure_memory(args, device) if device.type == "cuda" else memory_in_child(args)
    base = names[0]
    print(
        f"GQA attend: {args.heads} query heads over {args.kv_heads} K/V heads x 128, {args.cached_chunks} cached "
        f"chunks + the current one of {args.chunk_tokens} tokens, INT2 g32 Hadamard, Taylor; {args.dtype} on "
        f"{device.type}{f' ({cpu.cpu_class()})' if device.type == 'cpu' else ''}, {torch.get_num_threads()} threads"
    )
    head = f"{'path':38s} {'ms':>8s} {'vs GQA':>7s} {'transient MiB':>14s} {'vs GQA':>7s} {'stored MiB':>11s}"
    print(head + f" {'max |diff|':>10s}")
    for name in names:
        ms = 1000 * statistics.median(primary[name])
        ratio = statistics.median(a / b for a, b in zip(primary[name], primary[base]))
        diff = float((outs[name] - outs[base]).abs().max())
        mib, mem_ratio = mem[name] / 2**20, mem[name] / mem[base]
        print(
            f"{name:38s} {ms:8.2f} {ratio:7.2f} {mib:14.2f} {mem_ratio:7.2f} {stored[name] / 2**20:11.2f} {diff:10.2e}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
