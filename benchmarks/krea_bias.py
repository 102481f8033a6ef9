"""What Krea's kv_cache_attention_bias costs on top of the pack's corrected attention (not a test).

    python benchmarks/krea_bias.py                # fp32 on the CPU, 4 heads (Krea's 40 scale linearly)
    python benchmarks/krea_bias.py --heads 40 --device cuda

Krea's shapes at its default 576 x 320: 720 tokens per latent frame, the cache rebuilt from 3 frames (one
cached chunk of 2,160 tokens after recompute, or 3 chunks of one frame), a block of 3 frames (2,160 queries)
in flight, head_dim 128, INT2 g32 Hadamard keys and values. Each configuration runs in the same process,
interleaved round by round; each ratio is the median of the per-round ratios of CPU time (wall time on CUDA),
so a machine that gets busier or quieter hurts all sides alike. The bias splits the first cached chunk into two
runs of keys (the spared first frame, the rest): one more kernel call, no extra channel.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

from jensen_core import CacheEntry, QuantSpec, cached_attention, quantize  # noqa: E402
from jensen_core.bias import KREA_ATTENTION_BIAS, attention_bias_offsets  # noqa: E402

TPF = 720  # 576 x 320: 72 x 40 latent pixels, 36 x 20 patches


def _clock(device):
    if device.type == "cuda":
        torch.cuda.synchronize()
        return time.perf_counter()
    return time.process_time()


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    dev = torch.device(a.device)
    gen = torch.Generator().manual_seed(0)
    spec = QuantSpec(bits=2, group_size=32, rotation="hadamard", seed=0)
    H, D = a.heads, 128
    q, kc, vc = (torch.randn(1, H, 3 * TPF, D, generator=gen).to(dev) for _ in range(3))

    def cache(frames_per_chunk):
        out = []
        for _ in range(3 // frames_per_chunk):
            k, v = (torch.randn(1, H, frames_per_chunk * TPF, D, generator=gen).to(dev) for _ in range(2))
            out.append(CacheEntry(quantize(k, spec), quantize(v, spec)))
        return out

    layouts = {"one chunk of 3 frames": cache(3), "3 chunks of 1 frame": cache(1)}
    calls = {}
    for lname, entries in layouts.items():
        offs = attention_bias_offsets([e.tokens for e in entries], KREA_ATTENTION_BIAS, TPF)
        for mode in ("taylor", "chunk_mean"):
            calls[(lname, mode, False)] = lambda e=entries, m=mode: cached_attention(q, kc, vc, e, m)
            calls[(lname, mode, True)] = lambda e=entries, m=mode, o=offs: cached_attention(
                q, kc, vc, e, m, key_log_offsets=o
            )
    for c in calls.values():  # warm-up: layouts, kernels
        c()
    times = {k: [] for k in calls}
    keys = list(calls)
    for r in range(a.rounds):
        for k in keys if r % 2 == 0 else reversed(keys):
            t0 = _clock(dev)
            calls[k]()
            times[k].append(_clock(dev) - t0)
    print(f"`python benchmarks/krea_bias.py --heads {H} --device {a.device} --threads {a.threads}`")
    print(f"Krea 576x320: {TPF} tokens/frame, 3 cached frames INT2 g32 hadamard, 3-frame block, {H} heads x {D}")
    print("| cache | correction | ms without bias | ms with bias 0.3 | ratio (median per round) |")
    print("|---|---|---|---|---|")
    for lname in layouts:
        for mode in ("taylor", "chunk_mean"):
            off, on = times[(lname, mode, False)], times[(lname, mode, True)]
            ratio = statistics.median(b / x for x, b in zip(off, on))
            print(
                f"| {lname} | {mode} | {statistics.median(off) * 1e3:.1f} | {statistics.median(on) * 1e3:.1f} "
                f"| {ratio:.3f} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
