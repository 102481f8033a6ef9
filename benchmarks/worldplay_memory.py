"""HY-WorldPlay's per-chunk KV cache at 480p, from the planner: the reference's BF16 cache against INT4 / INT2 g32.

    python benchmarks/worldplay_memory.py

No model and no ComfyUI: ``jensen_core.planner.plan_cache`` with WorldPlay's shape (``worldplay.keys.RELEASED``:
54 double blocks, 16 heads x 128) and its latent layout (HunyuanVideo 1.5's VAE: 16 x 16 pixels and 4 frames per
latent, patch 1 x 1 x 1, so 832 x 480 is 52 x 30 = 1,560 tokens per latent frame). What the reference caches
(Tencent-Hunyuan/HY-WorldPlay, ``worldplay_video_pipeline.py`` ``_ar_rollout_inner`` and
``modules/attention.py`` ``sequence_parallel_attention_vision``):

- before every chunk of 4 latent frames but the first, the K/V of up to 20 context frames (every earlier frame
  up to 20, then chunk 0, the best-overlapping older chunk and the last 3 chunks: 5 chunks), re-encoded; both
  vision streams (``img_attn`` and the PRoPE stream) keep their own K/V in every block: 54 x 2 K/V pairs;
- the chunk being generated is never written (``write_last`` off); cfg 1 (the AR distilled model): one branch;
- the prompt's K/V per block (SigLIP 729 tokens, ByT5 up to 256, the LLM's prompt), shared by both streams and
  kept for the whole video: the planner has no context-token term, so that line is worked out here by hand.

The planner is told 108 layers (54 blocks x 2 streams: each stream's K/V has one layer's shape) and a window of
5 chunks (the 20 context frames; the reference rebuilds them per chunk instead of rolling them, which holds the
same number of tokens). The Jensen correction stores nothing (its Taylor bias uses the stored steps), so "with"
and "without" the correction are one row.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the pack's jensen_core and worldplay; appended, so ComfyUI's folder stays first
    sys.path.append(str(ROOT))

from jensen_core import QuantSpec  # noqa: E402
from jensen_core.geometry import LatentGeometry  # noqa: E402
from jensen_core.planner import plan_cache  # noqa: E402
from worldplay.keys import RELEASED  # noqa: E402

#: HunyuanVideo 1.5's latent layout: 32 channels, 16 x 16 pixels and 4 frames per latent, 1 x 1 x 1 patches
GEOMETRY = LatentGeometry(patch=RELEASED.patch_size, latent_channels=32, vae_time_stride=4, vae_space_stride=16)
STREAMS = 2  # img_attn and the PRoPE stream
CHUNK_FRAMES, CONTEXT_CHUNKS = 4, 5  # 20 context frames
WIDTH, HEIGHT = 832, 480
VIDEOS = (125, 253)
SETTINGS = (
    ("BF16 (the reference)", None),
    ("INT4 g32", QuantSpec(bits=4, group_size=32, rotation="hadamard")),
    ("INT2 g32", QuantSpec(bits=2, group_size=32, rotation="hadamard")),
)
#: the prompt prefix: SigLIP tokens, ByT5 tokens at most, and an LLM prompt of 256 tokens (the reference's text
#: encoder takes up to 1,000)
PREFIX_TOKENS = {"SigLIP": 729, "ByT5 (max)": 256, "LLM prompt (256 assumed)": 256}


def rows() -> list[dict]:
    out = []
    for frames in VIDEOS:
        lat_t, lat_h, lat_w = GEOMETRY.latent_shape(WIDTH, HEIGHT, frames)
        for name, spec in SETTINGS:
            plan = plan_cache(
                latent_frames=lat_t,
                latent_height=lat_h,
                latent_width=lat_w,
                chunk_frames=CHUNK_FRAMES,
                window_chunks=CONTEXT_CHUNKS,
                layers=RELEASED.depth * STREAMS,
                heads=RELEASED.heads,
                head_dim=RELEASED.head_dim,
                spec_k=spec,
                spec_v=spec,
                geometry=GEOMETRY,
            )
            assert plan.runnable, plan.errors
            out.append(
                {
                    "frames": frames,
                    "latents": lat_t,
                    "setting": name,
                    "tokens": plan.cached_tokens_peak,
                    "bytes": plan.bf16_bytes if spec is None else plan.quantized_bytes,
                    "bits": plan.effective_bits,
                }
            )
    return out


def prefix_bytes(tokens: int, full_bytes: int = 2) -> int:
    """The prompt prefix in the model's dtype: K and V per block, shared by the two streams."""
    return tokens * RELEASED.heads * RELEASED.head_dim * 2 * RELEASED.depth * full_bytes


def main() -> None:
    per_frame = GEOMETRY.tokens_per_frame(*GEOMETRY.latent_shape(WIDTH, HEIGHT, 1)[1:])
    print(
        f"HY-WorldPlay at {WIDTH}x{HEIGHT}: {RELEASED.depth} blocks x {STREAMS} streams, {RELEASED.heads} heads x "
        f"{RELEASED.head_dim}, {per_frame:,} tokens per latent frame, context {CHUNK_FRAMES * CONTEXT_CHUNKS} frames"
    )
    print(f"{'video':>12} {'cache':<22} {'tokens':>8} {'bits':>6} {'GB':>8} {'GiB':>8} {'vs BF16':>8}")
    base = {}
    for r in rows():
        if r["setting"].startswith("BF16"):
            base[r["frames"]] = r["bytes"]
        video = f"{r['frames']} ({r['latents']})"
        ratio = base[r["frames"]] / r["bytes"]
        print(
            f"{video:>12} {r['setting']:<22} {r['tokens']:>8,} {r['bits']:>6.2f} {r['bytes'] / 1e9:>8.2f} "
            f"{r['bytes'] / 2**30:>8.2f} {ratio:>7.2f}x"
        )
    n = sum(PREFIX_TOKENS.values())
    print(
        f"prompt prefix, BF16, by hand ({' + '.join(f'{k} {v}' for k, v in PREFIX_TOKENS.items())} = {n} tokens): "
        f"{prefix_bytes(n) / 1e9:.3f} GB for the whole video, the same at every length"
    )


if __name__ == "__main__":
    main()
