"""Is jensen_core's QVG the reference's algorithm? Same input, same S, K, block size, bits (not CI).

Runs quant-videogen's own ``prq_quant`` / ``prq_dequant`` (its Triton kernels, under
``TRITON_INTERPRET=1`` on a CPU) and ``jensen_core``'s port on the same keys - one chunk of the demo
workload (12 heads x 1,560 tokens x 128, seed 0) in BF16, as a BF16 model holds them - and prints
the reconstruction error of each (the reference sees the same values in FP32: see below), plus crossed pipelines that isolate the k-means from the residual
quantizer:

  ref          the reference end to end (its default: symmetric absmax INT2, FP8 scale per block of 64)
  ref asym     the reference with ``asymmetric=True`` (min-max + zero-point, both stored in FP8)
  ours         jensen_core QVG (asymmetric RTN, FP8 step + BF16 zero-point per group of 64)
  ref k-means + our residual quantizer / our k-means + ref residual quantizer
  k-means only the smoothing residual energy ||x - c[id]||^2 / ||x||^2 of each k-means

Setup (quant-videogen pins torch 2.8, so install it without dependencies)::

    pip install --no-deps quant-videogen loguru termcolor     # and triton (any 3.x)
    python tools/qvg_faithfulness.py                           # about a minute per seed on 2 cores

What the script changes to run the reference on a CPU (the kernels themselves are untouched):
one autotune config per kernel (the autotuner needs a GPU to benchmark), ``libdevice.round`` given
to the interpreter as round-half-away-from-zero (CUDA's ``round``; the interpreter has none), and
the two k-means kernels launched as their wrappers launch them, without the wrappers' ``is_cuda``
asserts. The reference draws its initial centroids from torch's global RNG: each seed is set with
``torch.manual_seed`` before its call.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the pack's jensen_core and jensen_testing; appended, so ComfyUI's folder stays first
    sys.path.append(str(ROOT))

import torch  # noqa: E402

from jensen_core import QuantSpec, quantize  # noqa: E402
from jensen_core.methods import method_of  # noqa: E402
from jensen_core.quant import quantize_rotated  # noqa: E402
from jensen_core.qvg import kmeans as our_kmeans  # noqa: E402
from jensen_core.workload import make_workload  # noqa: E402


def load_reference():
    try:
        import triton
        import triton.language as tl
        from quant_videogen.kmeans import centroid_update, euclid_assign, kmeans_euclid
        from quant_videogen.real import accumulate, prq, quant_pack, smooth
    except ImportError as exc:
        sys.exit(f"needs quant-videogen and triton ({exc}); pip install --no-deps quant-videogen loguru termcolor")

    def first_config(kernel, keep=lambda c: True):
        kernel.configs = [c for c in kernel.configs if keep(c)][:1]

    first_config(quant_pack._quant_pack_kernel, lambda c: c.kwargs["BLOCK_D"] == 128)
    first_config(smooth._minus_centroid_kernel)
    first_config(
        euclid_assign._euclid_assign_kernel, lambda c: (c.kwargs["BLOCK_N"], c.kwargs["BLOCK_K"]) == (128, 128)
    )
    first_config(accumulate._nstage_accum_kernel)

    def _round_half_away(x):  # called from interpreted kernels: plain Python over triton.language
        return tl.where(x >= 0, tl.floor(x + 0.5), tl.ceil(x - 0.5))

    class _Libdevice:  # what the kernels call from triton.language.extra.libdevice
        round = _round_half_away

    quant_pack.libdevice = _Libdevice
    if hasattr(accumulate, "libdevice"):
        accumulate.libdevice = _Libdevice

    def assign(x, centroids, x_sq, out=None, **_):
        B, N, D = x.shape
        K = centroids.shape[1]
        out = torch.empty((B, N), dtype=torch.int64) if out is None else out
        grid = lambda meta: (triton.cdiv(N, meta["BLOCK_N"]), B)  # noqa: E731
        euclid_assign._euclid_assign_kernel[grid](
            x, centroids, x_sq, out, B, N, K, D, *x.stride(), *centroids.stride(), *x_sq.stride(), *out.stride()
        )
        return out

    def update(x, cluster_ids, num_centroids, *, BLOCK_N=256):
        B, N, D = x.shape
        sorted_ids, sorted_idx = torch.sort(cluster_ids, dim=-1)
        sums = torch.zeros((B, num_centroids, D), dtype=torch.float32)
        counts = torch.zeros((B, num_centroids), dtype=torch.int32)
        centroid_update._centroid_update_chunk_kernel[(triton.cdiv(N, BLOCK_N), B)](
            x,
            sorted_idx.to(torch.int32),
            sorted_ids.to(torch.int32),
            sums,
            counts,
            B,
            N,
            D,
            num_centroids,
            BLOCK_N=BLOCK_N,
        )
        return (sums / counts.to(torch.float32).unsqueeze(-1).clamp(min=1.0)).to(x.dtype), counts

    kmeans_euclid.euclid_assign_triton = assign
    kmeans_euclid.triton_centroid_update_sorted_euclid = update
    return prq, kmeans_euclid


def sqnr_db(x: torch.Tensor, x_hat: torch.Tensor) -> float:
    x, x_hat = x.double(), x_hat.double()
    return 10 * torch.log10(x.square().sum() / (x - x_hat).square().sum()).item()


def rel_mse(x: torch.Tensor, x_hat: torch.Tensor) -> float:
    x, x_hat = x.double(), x_hat.double()
    return ((x - x_hat).square().sum() / x.square().sum()).item()


def gather(c: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return torch.gather(c, -2, ids.long().unsqueeze(-1).expand(*ids.shape, c.shape[-1]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3, help="k-means seeds (both sides)")
    ap.add_argument("--iters", type=int, default=2, help="k-means iterations (QVG's scripts: 2)")
    ap.add_argument("--centroids", type=int, default=256)
    ap.add_argument("--block", type=int, default=64, help="residual block (group) size along head_dim")
    ap.add_argument("--stages", type=int, default=1)
    ap.add_argument("--heads", type=int, default=12)
    args = ap.parse_args(argv)
    prq, kmeans_euclid = load_reference()
    S, K, B, bits = args.stages, args.centroids, args.block, 2

    w = make_workload(seed=0, heads=args.heads)
    x16 = w.k_cached[0].to(torch.bfloat16).contiguous()  # (1, H, 1560, 128), as a BF16 model caches it
    x = x16.float()
    # the reference gets the same values in float32: the interpreter's tl.dot on BF16 tiles is wrong
    # (nearest-centroid ids agree with torch's on 2% of tokens in BF16, on all in FP32); its centroids
    # are then FP32 where a BF16 run on a GPU keeps them in BF16 (ours are BF16)
    xr = x.contiguous()
    H, T, D = x.shape[1:]
    print(
        f"input: keys of one demo chunk, {H} heads x {T} tokens x {D}, BF16; S={S}, K={K}, block {B}, INT{bits}, "
        f"{args.iters} k-means iterations, {args.seeds} seeds; TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET')}"
    )
    spec = QuantSpec(method="qvg", bits=bits, group_size=B, qvg_stages=S, qvg_centroids=K, qvg_iters=args.iters)
    spec_rtn = QuantSpec(bits=bits, group_size=B)
    rows: dict[str, list[float]] = {}
    energy: dict[str, list[float]] = {}

    def record(name, x_hat):
        rows.setdefault(name, []).append(rel_mse(x, x_hat))

    t_ref = t_ours = 0.0
    for seed in range(args.seeds):
        # --- the reference, end to end (symmetric default and asymmetric)
        for name, asym in (("ref (symmetric, its default)", False), ("ref asymmetric=True", True)):
            torch.manual_seed(seed)
            t0 = time.perf_counter()
            cl, il, rq, sc, zr = prq.prq_quant(
                xr,
                n_stages=S,
                n_clusters=K,
                block_size=B,
                num_bits=bits,
                scale_precision=torch.float8_e4m3fn,
                max_iters=args.iters,
                PACK_OUTPUT_INT8=True,
                CLUSTER_ID_INT8=True,
                asymmetric=asym,
            )
            x_hat = prq.prq_dequant(
                cl,
                il,
                rq,
                sc,
                block_size=B,
                num_bits=bits,
                PACK_INPUT_INT8=True,
                CLUSTER_ID_INT8=True,
                output_dtype=torch.float32,
                zeros=zr,
            )
            t_ref += time.perf_counter() - t0
            record(name, x_hat)
            if not asym:
                ref_c, ref_ids = cl, il
        ref_smooth = sum(gather(c.float(), i) for c, i in zip(ref_c, ref_ids))
        energy.setdefault("reference k-means", []).append(rel_mse(x, ref_smooth))

        # --- ours, end to end
        t0 = time.perf_counter()
        ours = quantize(x16, QuantSpec(**{**spec.to_dict(), "seed": seed}))
        t_ours += time.perf_counter() - t0
        record("ours (asymmetric, FP8 step + BF16 zero)", ours.dequantize(torch.float32))
        our_smooth = ours.smoothing()
        energy.setdefault("jensen_core k-means", []).append(rel_mse(x, our_smooth))

        # --- crossed: reference k-means + our residual quantizer
        r = (x - ref_smooth).contiguous()
        record(
            "ref k-means + our quantizer",
            ref_smooth + quantize_rotated(r, spec_rtn, torch.float32).dequantize(torch.float32),
        )
        # --- crossed: our k-means + the reference's residual quantizer (symmetric, FP8 scale)
        r = (x - our_smooth).contiguous()
        rq, sc, _ = prq.quant_pack(
            r, block_size=B, num_bits=bits, scale_precision=torch.float8_e4m3fn, pack_output_int8=True
        )
        zero_c = [torch.zeros(1, H, 1, D)]
        zero_i = [torch.zeros(1, H, T, dtype=torch.uint8)]
        r_hat = prq.prq_dequant(
            zero_c,
            zero_i,
            rq,
            sc,
            block_size=B,
            num_bits=bits,
            PACK_INPUT_INT8=True,
            CLUSTER_ID_INT8=True,
            output_dtype=torch.float32,
        )
        record("our k-means + ref quantizer", our_smooth + r_hat)
        # --- the k-means alone, with the reference's initialisation rule (with replacement, global RNG)
        torch.manual_seed(seed)
        ids, c, _, _ = kmeans_euclid.batch_kmeans_Euclid(xr.reshape(H, T, D), n_clusters=K, max_iters=args.iters)
        energy.setdefault("reference batch_kmeans_Euclid, centroids to BF16", []).append(
            rel_mse(x, gather(c.to(torch.bfloat16).float(), ids).reshape(x.shape))
        )
        ids2, c2, _ = our_kmeans(
            x16.reshape(H, T, D).float(), K, args.iters, generator=torch.Generator().manual_seed(seed)
        )
        energy.setdefault("jensen_core kmeans() on the same input", []).append(
            rel_mse(x, gather(c2.to(torch.bfloat16).float(), ids2).reshape(x.shape))
        )

    def show(title, d):
        print(f"\n{title}")
        base = statistics.fmean(next(iter(d.values())))
        for name, v in d.items():
            m = statistics.fmean(v)
            sd = statistics.stdev(v) if len(v) > 1 else 0.0
            print(
                f"  {name:<42} {m:.5f} +- {sd:.5f}  SQNR {-10 * torch.log10(torch.tensor(m)).item():6.2f} dB"
                f"  ({m / base - 1:+.1%} vs first row)"
            )

    show("reconstruction error ||x - x_hat||^2 / ||x||^2 (mean +- sd over seeds)", rows)
    show("smoothing residual ||x - centroid[id]||^2 / ||x||^2 (k-means alone)", energy)
    bits_ours = method_of(spec).effective_bits_for(spec, D, T)
    bits_ref = bits + 8 / B + 8 * S / D + 16 * S * min(K, T) / T
    print(
        f"\nstored bits per element at {T} tokens per chunk: ours {bits_ours:.4f} (residual {spec.effective_bits:g} "
        f"+ ids {8 * S / D:g} + centroids {16 * S * min(K, T) / T:.4f}); reference default {bits_ref:.4f} "
        f"(no zero-point: {bits} + 8/{B})"
    )
    print(f"time (interpreted reference vs torch port, not comparable as speed): {t_ref:.1f} s vs {t_ours:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
