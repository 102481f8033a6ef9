"""The planner's KV-cache figures for Krea Realtime 14B's streaming settings (Wan 2.1 14B: 40 layers x 40 heads x 128).

    python benchmarks/krea_plan.py            # prints the table, writes docs/results/krea_plan.txt (+ .csv)
    python benchmarks/krea_plan.py --out -    # prints only

No model and no ComfyUI: ``jensen_core.planner.plan_cache`` with the Wan family's latent layout and its
``wan2.1-14b`` preset. Krea's settings, as daydreamlive/scope (commit 68b0f95) runs Krea Realtime Video:

- ``num_frame_per_block: 3``, ``kv_cache_num_frames: 3``, ``local_attn_size: 6``
  (``src/scope/core/pipelines/krea_realtime_video/model.yaml`` lines 8-10);
- the cache: ``local_attn_size * frame_seq_length`` tokens per layer, the generator's dtype, batch 1
  (``src/scope/core/pipelines/wan2_1/utils.py:23``, called from ``wan2_1/blocks/setup_caches.py:192``),
  ``frame_seq_length = (height // 16) * (width // 16)`` (``setup_caches.py:167``);
- before each block the cache is rebuilt from ``kv_cache_num_frames`` = 3 context frames: the oldest frame of
  the decoded buffer, re-encoded, and the last 2 latent frames (``krea_realtime_video/blocks/recompute_kv_cache.py``
  lines 158-167 and 267-292); the block of 3 frames being generated fills the other 3 of the 6;
- no sink: ``WanDiffusionWrapper`` is built without ``sink_size`` (``krea_realtime_video/pipeline.py:77-83``),
  whose default is 0 (``wan2_1/components/generator.py:28``);
- default resolution 576 x 320 (``krea_realtime_video/schema.py:79-95``); 480p (832 x 480) and 720p
  (1280 x 720) as asked.

On the pack that is chunks of 3 latent frames, a window of 1 chunk (3 cached frames) and no sink, plus the block
in flight (3 frames, what core's AR path holds until the next call; ``block_in_flight_bytes``). With a window the
peak does not depend on the video's length (21 latent frames = 81 video frames here; any length >= 3 chunks
gives the same). INT4 / INT2: group 32, Hadamard rotation, as in ``core_ar_memory.py``.
"""

from __future__ import annotations

import argparse
import csv
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the pack's jensen_core and jensen_testing; appended, so ComfyUI's folder stays first
    sys.path.append(str(ROOT))

from jensen_core import QuantSpec  # noqa: E402
from jensen_core.planner import CachePrecision, CacheShape, block_in_flight_bytes  # noqa: E402
from jensen_testing.pack import load_pack_module  # noqa: E402
from jensen_testing.planning import plan_video  # noqa: E402

DEFAULT_OUT = ROOT / "docs" / "results" / "krea_plan.txt"
MIB = 2**20
#: Krea Realtime Video's model.yaml (lines 8-10)
BLOCK_FRAMES, KV_CACHE_NUM_FRAMES, LOCAL_ATTN_SIZE, SINK_FRAMES = 3, 3, 6, 0
VIDEO_FRAMES = 81
RESOLUTIONS = {"Krea default 576x320": (576, 320), "480p 832x480": (832, 480), "720p 1280x720": (1280, 720)}
SETTINGS = (("BF16", None), ("INT4 g32", 4), ("INT2 g32", 2))


def rows() -> list[dict]:
    wan = load_pack_module("runtime.families.wan.family")
    layers, heads, head_dim = wan.PRESETS["wan2.1-14b"]
    window = KV_CACHE_NUM_FRAMES // BLOCK_FRAMES  # chunks of context kept: 1
    out = []
    for res, (w, h) in RESOLUTIONS.items():
        lat_t, lat_h, lat_w = wan.GEOMETRY.latent_shape(w, h, VIDEO_FRAMES)
        tokens = wan.GEOMETRY.tokens_per_frame(lat_h, lat_w)
        assert tokens == (h // 16) * (w // 16)  # Krea's frame_seq_length
        krea = 2 * LOCAL_ATTN_SIZE * tokens * layers * heads * head_dim * 2  # K and V, BF16, its 6-frame buffer
        for name, bits in SETTINGS:
            spec = None if bits is None else QuantSpec(bits=bits, group_size=32, rotation="hadamard")
            shape = CacheShape(layers, heads, head_dim, wan.GEOMETRY, full_bytes=2)
            sink = SINK_FRAMES // BLOCK_FRAMES
            plan = plan_video((lat_t, lat_h, lat_w), BLOCK_FRAMES, window, shape, spec, sink_chunks=sink)
            assert plan.runnable and plan.cached_tokens_peak == KV_CACHE_NUM_FRAMES * tokens
            flight = block_in_flight_bytes(
                block_tokens=BLOCK_FRAMES * tokens,
                shape=CacheShape(layers=layers, heads=heads, head_dim=head_dim, full_bytes=2),
                precision=CachePrecision(spec_k=spec, spec_v=spec),
            )
            out.append(
                dict(
                    resolution=res,
                    latent=f"{lat_w}x{lat_h}",
                    tokens_per_frame=tokens,
                    setting=name,
                    effective_bits=round(plan.effective_bits, 3),
                    cached_frames=plan.cached_tokens_peak // tokens,
                    cached_bytes=plan.quantized_bytes,
                    in_flight_bytes=flight,
                    total_bytes=plan.quantized_bytes + flight,
                    krea_bf16_bytes=krea,
                )
            )
    return out


def table(rs: list[dict]) -> list[str]:
    lines = [
        "| resolution | latent (tokens/frame) | cache | bits | cached frames | cached MiB | + block in flight MiB "
        "| = total MiB | vs Krea's BF16 6-frame buffer |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rs:
        lines.append(
            f"| {r['resolution']} | {r['latent']} ({r['tokens_per_frame']}) | {r['setting']} | {r['effective_bits']:g} "
            f"| {r['cached_frames']} | {r['cached_bytes'] / MIB:,.1f} | {r['in_flight_bytes'] / MIB:,.1f} "
            f"| {r['total_bytes'] / MIB:,.1f} | {r['krea_bf16_bytes'] / MIB:,.1f} MiB "
            f"({r['total_bytes'] / r['krea_bf16_bytes']:.3f}x) |"
        )
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(DEFAULT_OUT), help="text output (and a .csv next to it); '-' for none")
    a = p.parse_args(argv)
    rs = rows()
    argv_ = argv if argv is not None else sys.argv[1:]
    lines = [
        f"`python benchmarks/krea_plan.py{' ' + shlex.join(argv_) if argv_ else ''}`",
        "",
        "Wan 2.1 14B (40 layers x 40 heads x 128), batch 1, cfg 1, BF16 model; Krea's blocks of 3 latent frames, "
        "3 cached context frames (window 1 chunk, no sink) + the block in flight; planner: jensen_core.planner",
        "",
        *table(rs),
    ]
    print("\n".join(lines))
    if a.out != "-":
        out = Path(a.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("\n".join(lines) + "\n")
        with out.with_suffix(".csv").open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rs[0]))
            w.writeheader()
            w.writerows(rs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
