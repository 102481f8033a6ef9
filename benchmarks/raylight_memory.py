"""KV-cache memory and all-to-all traffic under Raylight's Ulysses sequence parallelism: Raylight as it is against
the pack's cache, per rank, for N = 1, 2, 4, 8 GPUs (on paper: the planner and core's allocation formula; no model).

    python benchmarks/raylight_memory.py                 # Wan 2.1 14B, 720p, 1,024 frames, window 4 + sink 1
    python benchmarks/raylight_memory.py --frames 81 --height 480 --width 832

The run: Wan 2.1 14B (40 layers, 40 heads x 128, dim 5,120), BF16 weights and activations, batch 1, cfg 1,
core's SamplerARVideo with blocks of 3 latent frames (Self-Forcing's), 4 denoising steps + core's clean
(sigma 0) pass = 5 model calls per block.

- **Raylight as it is** (c0495710): every rank runs core's ``init_kv_caches``, which allocates K and V for the
  whole video (``2 x layers x latent_frames x tokens_per_frame x dim x 2 bytes``) whatever N is; each rank
  writes its sequence shard (all heads) of every block into it, so 1/N of the allocation is used. No window.
  Each self-attention call sends its block's q and *all the K/V it has cached so far* through the Ulysses
  all-to-all, and the output back.
- **The pack** (``runtime/families/wan/raylight.py``): each rank keeps its heads' share of the quantized cache
  (:func:`jensen_core.planner.plan_cache` with ``ranks=N``; its bytes are what a run's report measures, see
  tests/integration/test_raylight_ulysses.py), plus the block in flight (the last call's K/V of every layer,
  held quantized until the next call says whether it is final). Only the current block's q, k, v go through
  the all-to-all, and the output back; the cache never crosses ranks.

All-to-all bytes are what one rank sends per self-attention layer and model call: of each tensor it holds
``(N - 1) / N`` leaves it (yunchang's ``all_to_all_4D``). Cross-attention's traffic (Raylight's, the same for
both) is left out. "Run total" is per rank over the whole video: every block, 5 calls, 40 layers.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

from jensen_core import QuantSpec  # noqa: E402
from jensen_core.geometry import LatentGeometry  # noqa: E402
from jensen_core.planner import CachePrecision, CacheShape, block_in_flight_bytes  # noqa: E402
from jensen_testing.planning import plan_video  # noqa: E402

#: Wan 2.1's latent layout (runtime/families/wan/family.py GEOMETRY): 1 x 2 x 2 patches, VAE strides 4 (time) and 8
WAN = LatentGeometry(patch=(1, 2, 2), latent_channels=16, vae_time_stride=4, vae_space_stride=8)
LAYERS, HEADS, HEAD_DIM = 40, 40, 128  # Wan 2.1 14B
DIM = HEADS * HEAD_DIM
BF16 = 2
CALLS_PER_BLOCK = 5  # Self-Forcing's 4 steps + core's clean pass
INT2 = QuantSpec(bits=2, group_size=32, rotation="hadamard", scale_format="fp8_e4m3")
GIB, MIB = 2**30, 2**20


def _padded(tokens: int, ranks: int) -> int:
    return -(-tokens // ranks) * ranks  # Raylight pads the block to a multiple of the ranks


def pack_bytes(spec, ranks: int, latent: tuple[int, int, int], chunk: int, window: int, sink: int) -> dict:
    shape = CacheShape(LAYERS, HEADS, HEAD_DIM, WAN, full_bytes=BF16, ranks=ranks)
    plan = plan_video(latent, chunk, window, shape, spec, sink_chunks=sink)
    assert plan.quantized_bytes * ranks == plan.quantized_bytes_all_ranks
    flight = block_in_flight_bytes(
        block_tokens=chunk * plan.tokens_per_latent_frame,
        shape=CacheShape(layers=LAYERS, heads=HEADS // ranks, head_dim=HEAD_DIM, full_bytes=BF16),
        precision=CachePrecision(spec_k=spec, spec_v=spec),
    )
    return {"cache": plan.quantized_bytes, "in_flight": flight, "all_ranks": plan.quantized_bytes_all_ranks}


def raylight_cache_bytes(latent_frames: int, frame_tokens: int) -> int:
    """Core's init_kv_caches on every rank: K and V of the whole video, every layer, all heads."""
    return 2 * LAYERS * latent_frames * frame_tokens * DIM * BF16


def traffic(ranks: int, block_tokens: int, cached_tokens: int, whole_cache: bool) -> int:
    """Bytes one rank sends through the Ulysses all-to-all in one self-attention call (see the module doc)."""
    if ranks == 1:
        return 0
    shard = _padded(block_tokens, ranks) // ranks  # this rank's tokens of the block
    tensors = 4 * shard  # q, k, v in and the output back
    if whole_cache:  # Raylight: q, then K and V of everything cached so far plus the block, then the output
        local = _padded(cached_tokens, ranks) // ranks + shard
        tensors = 2 * shard + 2 * local
    return tensors * DIM * BF16 * (ranks - 1) // ranks


def rows(frames: int, width: int, height: int, chunk: int, window: int, sink: int) -> list[dict]:
    t, h, w = WAN.latent_shape(width, height, frames)
    frame_tokens = WAN.tokens_per_frame(h, w)
    block = chunk * frame_tokens
    blocks = -(-t // chunk)
    out = []
    for n in (1, 2, 4, 8):
        bf16 = pack_bytes(None, n, (t, h, w), chunk, window, sink)
        int2 = pack_bytes(INT2, n, (t, h, w), chunk, window, sink)
        # a run's traffic: block b attends over the b blocks before it (Raylight: all of them, no window)
        run_pack = sum(traffic(n, block, 0, False) for _ in range(blocks)) * CALLS_PER_BLOCK * LAYERS
        run_ray = sum(traffic(n, block, b * block, True) for b in range(blocks)) * CALLS_PER_BLOCK * LAYERS
        out.append(
            dict(
                ranks=n,
                raylight_alloc=raylight_cache_bytes(t, frame_tokens),
                raylight_used=raylight_cache_bytes(t, frame_tokens) // n,
                bf16=bf16["cache"],
                bf16_flight=bf16["in_flight"],
                int2=int2["cache"],
                int2_flight=int2["in_flight"],
                a2a_pack=traffic(n, block, 0, False),
                a2a_ray_first=traffic(n, block, 0, True),
                a2a_ray_last=traffic(n, block, (blocks - 1) * block, True),
                run_pack=run_pack,
                run_ray=run_ray,
            )
        )
    return [dict(latent=(t, h, w), frame_tokens=frame_tokens, blocks=blocks), *out]


def _g(b: int) -> str:
    return f"{b / GIB:,.1f} GiB"


def _m(b: int) -> str:
    return f"{b / MIB:,.1f} MiB"


def format_rows(result: list[dict], frames: int, width: int, height: int, chunk: int, window: int, sink: int) -> str:
    head, *rs = result
    t, h, w = head["latent"]
    lines = [
        f"Wan 2.1 14B ({LAYERS} layers x {HEADS} heads x {HEAD_DIM}), BF16, {width}x{height}, {frames} frames = {t} "
        f"latent frames of {h}x{w} ({head['frame_tokens']:,} tokens each), blocks of {chunk} latent frames "
        f"({head['blocks']} blocks, {CALLS_PER_BLOCK} model calls each), batch 1, cfg 1.",
        f"The pack: window {window} + sink {sink} blocks; INT2 = K and V INT2, g32, FP8 scales, Hadamard (2.75 bits).",
        "",
        "KV cache per rank (GPU):",
        "| N | Raylight as it is: allocated (used) | pack BF16 | pack INT2 | + block in flight, BF16 / INT2 |",
        "|---|---|---|---|---|",
    ]
    for r in rs:
        lines.append(
            f"| {r['ranks']} | {_g(r['raylight_alloc'])} ({_g(r['raylight_used'])}) | {_g(r['bf16'])} | {_g(r['int2'])} "
            f"| {_g(r['bf16_flight'])} / {_g(r['int2_flight'])} |"
        )
    lines += [
        "",
        "Ulysses all-to-all, bytes one rank sends per self-attention layer and model call (and over the whole run):",
        "| N | pack (current block only) | Raylight, first block | Raylight, last block | run total: pack | run total: Raylight |",
        "|---|---|---|---|---|---|",
    ]
    for r in rs:
        lines.append(
            f"| {r['ranks']} | {_m(r['a2a_pack'])} | {_m(r['a2a_ray_first'])} | {_m(r['a2a_ray_last'])} "
            f"| {_g(r['run_pack'])} | {_g(r['run_ray'])} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--frames", type=int, default=1024)
    p.add_argument("--width", type=int, default=1280)
    p.add_argument("--height", type=int, default=720)
    p.add_argument("--chunk", type=int, default=3, help="latent frames per block (SamplerARVideo num_frame_per_block)")
    p.add_argument("--window", type=int, default=4)
    p.add_argument("--sink", type=int, default=1)
    a = p.parse_args(argv)
    print("$ python benchmarks/raylight_memory.py " + shlex.join(argv if argv is not None else sys.argv[1:]))
    result = rows(a.frames, a.width, a.height, a.chunk, a.window, a.sink)
    print(format_rows(result, a.frames, a.width, a.height, a.chunk, a.window, a.sink))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
