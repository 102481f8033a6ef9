"""MAGI-1's KV cache for a 10 s video (240 frames): the reference's whole-video buffer against the pack's cache.

    python benchmarks/magi1_memory.py              # the planner's table, then the tiny model measured (ComfyUI)
    python benchmarks/magi1_memory.py --no-measure # the planner's table only (no ComfyUI needed)

The planner (``jensen_core.planner.plan_cache``, the numbers the web planner shows) with MAGI-1's shapes: 4.5B
(34 layers) and 24B (48 layers), both 8 K/V heads of 128 (24 and 48 query heads: grouped-query attention, the
cache holds the 8); its VAE (8 x 8 pixels and 4 frames per latent pixel, patch 1 x 2 x 2) and chunks of 6 latent
frames: 240 frames are 60 latent frames, 10 chunks. What each side keeps:

- the reference (github:SandAI-org/MAGI-1 at 6ff822e, ``kv_offload``): one K/V buffer for every chunk of the video
  in BF16 (pinned host memory), whatever the window: 10 chunks per layer;
- the pack (MAGI-1 AR Sampler): finished chunks only, as many as the key ranges reach (``noise2clean_kvrange``
  5, 4, 3, 2): at ``window_size`` 4 every query reads exactly one finished chunk, at 1 up to four
  (``runtime.families.magi1.model.pipeline.finished_chunks_reached``); the chunks in flight are computed in every forward, in full
  precision, by the reference and the pack alike, and stored by neither.

Then, at tiny scale, the same comparison measured: the tiny MAGI-1 (2 layers, 4 query heads over 2 K/V heads of 64)
sampled by the recipe, the cache's peak bytes against the planner's, and the reference's buffer as
``runtime.families.magi1.model.attention.FullPrecisionKV`` really held it (every chunk a forward wrote: all but the last).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the pack's jensen_core and magi1; appended, so ComfyUI's folder stays first
    sys.path.append(str(ROOT))

from jensen_core import QuantSpec  # noqa: E402
from jensen_core.geometry import LatentGeometry  # noqa: E402
from jensen_core.planner import CacheShape  # noqa: E402
from jensen_testing.planning import plan_video  # noqa: E402
from runtime.families.magi1.model.config import PUBLISHED  # noqa: E402
from runtime.families.magi1.model.pipeline import finished_chunks_reached  # noqa: E402

#: MAGI-1's VAE (no causal first frame) and the DiT's patches
GEOMETRY = LatentGeometry(
    patch=(1, 2, 2), latent_channels=16, vae_time_stride=4, vae_space_stride=8, causal_first_frame=False
)
CHUNK_FRAMES, FRAMES = 6, 240
SIZES = (("480p", 848, 480), ("720x720", 720, 720), ("720p", 1280, 720))
WINDOWS = (4, 1)
SETTINGS = (
    ("BF16", None),
    ("INT4 g32", QuantSpec(bits=4, group_size=32, rotation="hadamard")),
    ("INT2 g32", QuantSpec(bits=2, group_size=32, rotation="hadamard")),
    ("QVG default (INT2 g64 K256)", QuantSpec(bits=2, group_size=64, method="qvg", qvg_centroids=256)),
)


def _plan(cfg, w, h, held, spec, write_last=False, layers=None, full_bytes=2):
    heads = (cfg.num_attention_heads, cfg.kv_channels)
    shape = CacheShape(layers or cfg.num_layers, *heads, GEOMETRY, kv_heads=cfg.num_query_groups, full_bytes=full_bytes)
    return plan_video(GEOMETRY.latent_shape(w, h, FRAMES), CHUNK_FRAMES, held, shape, spec, write_last=write_last)


def rows() -> list[dict]:
    out = []
    for model in ("4.5B", "24B"):
        cfg = PUBLISHED[model]
        for size, w, h in SIZES:
            whole = _plan(cfg, w, h, 0, None, write_last=True)  # every chunk of the video: the reference's buffer
            out.append({"model": model, "size": size, "window": "any", "cache": "reference buffer, BF16",
                        "chunks": whole.cached_chunks_peak, "bytes": whole.bf16_bytes, "bits": 16.0,
                        "reference": whole.bf16_bytes})  # fmt: skip
            for window in WINDOWS:
                held = finished_chunks_reached(window)
                for name, spec in SETTINGS:
                    p = _plan(cfg, w, h, held, spec)
                    out.append({"model": model, "size": size, "window": window, "cache": f"pack, {name}",
                                "chunks": p.cached_chunks_peak,
                                "bytes": p.bf16_bytes if spec is None else p.quantized_bytes,
                                "bits": p.effective_bits, "reference": whole.bf16_bytes})  # fmt: skip
    return out


def print_table(table: list[dict]) -> None:
    print(
        f"MAGI-1, {FRAMES} frames = {GEOMETRY.latent_shape(16, 16, FRAMES)[0]} latent frames = "
        f"{GEOMETRY.latent_shape(16, 16, FRAMES)[0] // CHUNK_FRAMES} chunks of {CHUNK_FRAMES}; 8 K/V heads x 128; "
        "key ranges 5,4,3,2"
    )
    print(f"{'model':<5} {'size':<8} {'window':>6}  {'cache':<38} {'chunks':>6} {'bits':>5} {'GiB':>8} {'vs ref':>7}")
    for r in table:
        print(
            f"{r['model']:<5} {r['size']:<8} {r['window']!s:>6}  {r['cache']:<38} {r['chunks']:>6} {r['bits']:>5.2f} "
            f"{r['bytes'] / 2**30:>8.3f} {r['reference'] / r['bytes']:>6.1f}x"
        )


def measured() -> list[str]:
    """The tiny MAGI-1 through the recipe (fp32 on the CPU): measured peak bytes against the planner's."""
    import importlib

    import torch

    from jensen_testing import comfyui, magi1_tiny
    from runtime.families.magi1.model.attention import FullPrecisionKV
    from runtime.families.magi1.model.caption import chunk_captions
    from runtime.families.magi1.model.config import TINY
    from runtime.families.magi1.model.sampler import MagiSettings, sample

    comfyui.setup_inprocess_comfyui()
    comfyui.import_pack()
    magi1 = importlib.import_module(f"{comfyui.PACK_MODULE}.runtime.families.magi1.recipe")
    quantize = importlib.import_module(f"{comfyui.PACK_MODULE}.nodes").JensenKVQuantizeKVCache
    model = magi1_tiny.build_patcher(qk_gain=0.5)
    cond = magi1_tiny.conditioning(0)
    chunks, cw, steps = 6, 1, 8
    lines = [f"tiny MAGI-1 ({TINY.num_layers} layers, {TINY.num_attention_heads} query heads over "
             f"{TINY.num_query_groups} K/V heads of {TINY.kv_channels}, fp32), {chunks} chunks of 16 tokens, "
             f"{steps} steps:"]  # fmt: skip
    dm = model.model.diffusion_model
    captions = chunk_captions(cond[0][0][0], chunks, {k: v.float() for k, v in dm.special_tokens.items()})
    noise = torch.randn(1, 16, chunks * cw, 8, 8, generator=torch.Generator().manual_seed(0))
    for window in WINDOWS:
        buffer = FullPrecisionKV()
        sample(dm, noise, captions, MagiSettings(num_steps=steps, window_size=window, chunk_width=cw, distill=False,
                                                  cfg_number=1), attention=buffer)  # fmt: skip
        lines.append(f"  window {window}: the reference's buffer held {buffer.nbytes:,} bytes (fp32)")
        for name, bits, group, method in (("full (fp32)", "off", "32", "rtn"), ("INT4 g32", "4", "32", "rtn"),
                                          ("INT2 g32", "2", "32", "rtn"), ("QVG K auto", "2", "64", "qvg")):  # fmt: skip
            m = model
            if bits != "off":  # QVG: the pack's default K (auto: from the chunk's 16 tokens, not 256)
                m = quantize.execute(model, bits, bits, group, "none" if method == "qvg" else "hadamard", "fp8_e4m3",
                                     0, method, 1, 0, 2).args[0]  # fmt: skip
            req = magi1.Magi1Request.from_options(
                m, cond, latent_frames=chunks * cw, latent_height=8, latent_width=8, seed=0, num_steps=steps,
                window_size=window, cfg_number=1, chunk_frames=cw, progress=False,
            )  # fmt: skip
            rep = magi1.run(req).report
            lines.append(
                f"    pack {name:<12} {rep['window_chunks']} chunk(s) held: measured {rep['cache_bytes']:>7,} bytes, "
                f"planned {rep['planned_bytes']:>7,}, {rep['effective_bits']:.2f} bits"
            )
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--no-measure", action="store_true", help="the planner's table only (no ComfyUI)")
    args = p.parse_args(argv)
    print_table(rows())
    if not args.no_measure:
        print()
        print("\n".join(measured()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
