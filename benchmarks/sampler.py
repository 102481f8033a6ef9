"""Benchmark the Chunked AR sampler: full-precision cache vs INT2 vs INT2 + Jensen, side by side.

A tiny random Wan 2.1 built from ComfyUI's own classes, sampled chunk by chunk through the pack's
chunk loop exactly as the node does. "Tiny" in depth and tokens (2 blocks, 64 tokens a frame) but
with the real Wan 1.3B block width (dim 1536 = 12 heads x 128, FFN 8960): the cache's own work
(rotations, dequantization) scales with the heads x 128 channels while the model's scales with
dim^2, so a narrower toy model overstates the overhead (at --dim 512 --heads 4 --ffn 2048 the
Hadamard rotations alone cost 25% of the attention projections' FLOPs, 8% at Wan's width). The three cache settings run
interleaved (rotating order) for ``--repeats`` rounds after a warm-up; figures are medians, and
time ratios are medians of per-round paired ratios of process CPU time (the machine may be shared; wall
time is printed too). Then a windowed
INT2 + Jensen run checks that seconds per chunk stay flat once the window is full.

    python benchmarks/sampler.py                 # CPU defaults (about 7 minutes on 2 cores)
    python benchmarks/sampler.py --dtype bf16    # the same in bf16 (weights, activations and the cache's compute dtype)
    python benchmarks/sampler.py --dim 512 --heads 4 --ffn 2048 --repeats 5   # a narrower toy (2 minutes)
    python benchmarks/sampler.py --device cuda --dim 1536 --heads 12 --layers 30 --ffn 8960 \
        --height 60 --width 104 --chunks 10 --window 4   # Wan 1.3B shapes on a GPU

Targets: INT2+Jensen / FP time <= 1.15; INT2+Jensen / INT2 <= 1.05 end to end; cache bytes
/ BF16 bytes = effective_bits / 16 within 1%; under a window the last chunk within 15% of the third.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the pack's jensen_core and jensen_testing; appended, so ComfyUI's folder stays first
    sys.path.append(str(ROOT))

from jensen_testing import comfyui as support_comfyui  # noqa: E402
from jensen_testing import wan_tiny  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dim", type=int, default=1536, help="model width (heads x 128; Wan 1.3B: 1536)")
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--ffn", type=int, default=8960)
    p.add_argument("--height", type=int, default=16, help="latent height (video height / 8)")
    p.add_argument("--width", type=int, default=16, help="latent width (video width / 8)")
    p.add_argument("--chunk-frames", type=int, default=3)
    p.add_argument("--chunks", type=int, default=8, help="chunks in the video (at least 8)")
    p.add_argument("--steps", type=int, default=4, help="denoising steps per chunk (Self-Forcing: 4)")
    p.add_argument("--cfg", type=float, default=1.0)
    p.add_argument(
        "--window",
        type=int,
        default=2,
        help="window (chunks) of the flatness run; with 2 the third chunk is the first to read a full window",
    )
    p.add_argument("--window-chunks", type=int, default=10, help="chunks of the flatness run")
    p.add_argument("--group-size", default="32")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default="cpu")
    p.add_argument(
        "--dtype",
        choices=("fp32", "bf16", "fp16"),
        default="fp32",
        help="the model's weights and compute dtype (the cache dequantizes to it)",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (default 1: steadier timings on a shared machine; 0 leaves torch's default)",
    )
    args = p.parse_args(argv)
    if args.chunks < 8:
        p.error("--chunks must be at least 8")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    print("command:", shlex.join([sys.executable, *sys.argv]) if argv is None else shlex.join(argv))
    support_comfyui.setup_inprocess_comfyui(cpu=args.device == "cpu")
    import importlib

    import comfy.samplers
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    pack = support_comfyui.import_pack()
    nodes = importlib.import_module(f"{pack.__name__}.nodes")
    loop = importlib.import_module(f"{pack.__name__}.runtime.chunk_loop")

    arch = dict(dim=args.dim, ffn_dim=args.ffn, num_heads=args.heads, num_layers=args.layers, text_dim=64, text_len=32)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    model = wan_tiny.build_patcher(seed=0, dtype=dtype, device=args.device, **arch)
    model.model.to(args.device)
    frames = args.chunks * args.chunk_frames
    pos, neg = wan_tiny.conditioning(1, 32, 64), wan_tiny.conditioning(2, 32, 64)
    sigmas = comfy.samplers.calculate_sigmas(model.get_model_object("model_sampling"), "simple", args.steps)
    sampler = comfy.samplers.sampler_object("euler")

    q = nodes.JensenKVQuantizeKVCache.execute(model, "2", "2", args.group_size, "hadamard", "fp8_e4m3", 0).args[0]
    q_plain = nodes.JensenKVQuantizeKVCache.execute(model, "2", "2", args.group_size, "none", "fp8_e4m3", 0).args[0]
    settings = {
        "FP": model,
        "INT2": nodes.JensenKVBiasCorrection.execute(q, "off", 1.0).args[0],
        "INT2+Jensen": nodes.JensenKVBiasCorrection.execute(q, "taylor", 1.0).args[0],
        # the zero-cost variant: each cached chunk's mean bias as an offset of its log-sum-exp
        "INT2+Jensen chunk_mean": nodes.JensenKVBiasCorrection.execute(q, "chunk_mean", 1.0).args[0],
        # the same without the Hadamard rotation: shows what the rotation itself costs
        "INT2+Jensen, rotation none": nodes.JensenKVBiasCorrection.execute(q_plain, "taylor", 1.0).args[0],
    }

    def run(m, n_frames, window=0):
        t0, c0 = time.perf_counter(), time.process_time()
        r = loop.run_chunked_ar(
            m,
            pos,
            neg,
            wan_tiny.video_latent(n_frames, args.height, args.width),
            seed=0,
            cfg=args.cfg,
            sampler=sampler,
            sigmas=sigmas,
            chunk_frames=args.chunk_frames,
            window_chunks=window,
            progress=False,
        )
        return time.perf_counter() - t0, time.process_time() - c0, r

    tokens = (args.height // 2) * (args.width // 2)
    cpu_class = importlib.import_module(f"{pack.__name__}.jensen_core.cpu").cpu_class()
    print(
        f"model: {args.dtype}, dim {args.dim}, {args.layers} layers x {args.heads} heads x {args.dim // args.heads}, ffn {args.ffn}; "
        f"{args.chunks} chunks x {args.chunk_frames} latent frames x {tokens} tokens/frame; {args.steps} euler steps, "
        f"cfg {args.cfg}; device {args.device} (CPU class {cpu_class}), torch threads {torch.get_num_threads()}, torch {torch.__version__}"
    )

    for m in settings.values():  # warm-up
        run(m, frames)
    wall = {k: [] for k in settings}
    cpu = {k: [] for k in settings}
    reports = {}
    names = list(settings)
    for r in range(args.repeats):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            w, c, res = run(settings[name], frames)
            wall[name].append(w)
            cpu[name].append(c)
            reports[name] = res.report

    def paired(times, a, b):
        return statistics.median([x / y for x, y in zip(times[a], times[b])])

    print(
        f"\ntime per video, median of {args.repeats} interleaved rounds (process CPU time is the primary figure: "
        "other processes on a shared machine inflate wall time, not our CPU time):"
    )
    for k in names:
        print(
            f"  {k:27s} CPU {statistics.median(cpu[k]):7.3f} s  wall {statistics.median(wall[k]):7.3f} s"
            f"   (CPU runs: {', '.join(f'{t:.2f}' for t in cpu[k])})"
        )
    for a, b, target in (
        ("INT2+Jensen", "FP", 1.15),
        ("INT2+Jensen", "INT2", 1.05),
        ("INT2+Jensen chunk_mean", "INT2", 1.02),
        ("INT2+Jensen, rotation none", "FP", None),
    ):
        rc, rw = paired(cpu, a, b), paired(wall, a, b)
        verdict = "" if target is None else f"; target <= {target} {'OK' if rc <= target else 'MISSED'}"
        print(f"time ratio {a} / {b} = {rc:.3f} CPU, {rw:.3f} wall (medians of paired rounds{verdict})")

    rep, fp = reports["INT2+Jensen"], reports["FP"]
    ratio = rep["cache_bytes"] / rep["bf16_bytes"]
    want = rep["effective_bits"] / 16
    print(
        f"\ncache: INT2+Jensen {rep['cache_bytes']} B ({rep['cache_mib']:.3f} MiB), BF16 would be {rep['bf16_bytes']} B "
        f"({rep['bf16_mib']:.3f} MiB); the FP run held {fp['cache_bytes']} B in {model.model_dtype()}"
    )
    print(
        f"cache bytes ratio = {ratio:.5f}; effective_bits / 16 = {rep['effective_bits']:.4f} / 16 = {want:.5f}; "
        f"off by {abs(ratio / want - 1) * 100:.3f}% (target <= 1%) {'OK' if abs(ratio / want - 1) <= 0.01 else 'MISSED'}"
    )

    # ---------------------------------------------------------------- flatness under a window
    wf = args.window_chunks * args.chunk_frames
    per_chunk, denoise = [], []
    run(settings["INT2+Jensen"], wf, args.window)
    for _ in range(args.repeats):
        _, _, res = run(settings["INT2+Jensen"], wf, args.window)
        per_chunk.append(res.seconds_per_chunk)
        denoise.append(res.denoise_seconds)
    med_chunk = [statistics.median(c) for c in zip(*per_chunk)]
    med_denoise = [statistics.median(c) for c in zip(*denoise)]
    print(
        f"\nINT2+Jensen, window {args.window} chunks, {args.window_chunks} chunks, median of {args.repeats} runs "
        "(wall seconds):"
    )
    print("  seconds per chunk (denoise + cache write):", " ".join(f"{s:.3f}" for s in med_chunk))
    print("  seconds per chunk (denoising only)       :", " ".join(f"{s:.3f}" for s in med_denoise))
    last_vs_third = med_denoise[-1] / med_denoise[2]
    print(
        f"last / third chunk, denoising = {last_vs_third:.3f} (target within 15%) "
        f"{'OK' if abs(last_vs_third - 1) <= 0.15 else 'MISSED'}"
    )
    print(
        f"last writing chunk / third chunk, denoise + write = {med_chunk[-2] / med_chunk[2]:.3f}; the last chunk "
        f"itself ({med_chunk[-1] / med_chunk[2]:.3f}) skips the cache write, which nothing would read"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
