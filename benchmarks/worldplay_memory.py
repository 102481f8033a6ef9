"""HY-WorldPlay's KV cache at 480p, from the planner, and the tiny WorldPlay's, measured: the reference's BF16 cache
against the pack's in BF16, INT4 and INT2 g32, with and without the Jensen correction.

    python benchmarks/worldplay_memory.py             # the planner's table (no model, no ComfyUI)
    python benchmarks/worldplay_memory.py --measure   # + the tiny WorldPlay run by the pack (ComfyUI v0.27+)

**From the planner** (``jensen_core.planner.plan_cache``, the function the web planner and the sampler's memory
request use) with WorldPlay's shape (``runtime.families.worldplay.model.keys.RELEASED``: 54 double blocks, 16 heads x 128) and its latent
layout (HunyuanVideo 1.5's VAE: 16 x 16 pixels and 4 frames per latent, patch 1 x 1 x 1, so 832 x 480 is 52 x 30 =
1,560 tokens per latent frame). What the reference caches (Tencent-Hunyuan/HY-WorldPlay,
``worldplay_video_pipeline.py`` ``ar_rollout`` and ``modules/attention.py``), and the pack the same way
(``runtime/families/worldplay/recipe.py``):

- before every chunk of 4 latent frames but the first, the K/V of up to 20 context frames (every earlier frame up
  to 20, then chunk 0, the best-overlapping older chunk and the last 3 chunks: 5 chunks), re-encoded; both vision
  streams (``img_attn`` and the PRoPE stream) keep their own K/V in every block: 54 x 2 K/V pairs (the planner is
  told 108 layers and a window of 5 chunks, which holds the same tokens as the rebuilt context);
- the chunk being generated is never written; cfg 1 (the AR distilled model): one branch;
- the prompt's K/V per block (SigLIP 729 tokens, ByT5 up to 256, the LLM's prompt), shared by both streams and
  kept for the whole video. The pack keeps it in the model's precision beside the cache (never quantized): the
  planner has no context-token term, so that line is worked out here by hand, with what INT2 would make of it.

The Jensen correction stores nothing: its Taylor bias is computed from the steps the cache stores anyway, so "with"
and "without" have the same bytes (the rows say so); what it costs is time, measured below at tiny scale.

**Measured** (``--measure``): the tiny random WorldPlay (``jensen_testing.worldplay_tiny``: 2 blocks x 2 streams, 2
heads x 32, 4 x 6 latents = 24 tokens per frame, float32) run by the pack's recipe for 32 and 64 latent frames (the
latent lengths of 125 and 253 frames), full precision, INT4 and INT2 g32 (Hadamard, FP8 scales), each with the
correction off and Taylor. Per row: the cache's peak bytes as the run measured them and as the planner projects
them (equal), what BF16 would cost, the seconds per chunk (the correction's time cost: the settings run round by
round, ``--repeats`` rounds, and each keeps its fastest median over chunks; a shared CPU is still noisy), the
video's largest deviation from full precision, and the mean ΔP_S (attention mass the quantized context takes from
the prompt and the chunk's own tokens, paper Eq. 9) on each stream. Then the text-prefix choice: on the
INT2 runs' attention calls, the attention output's error against full precision with the prompt's K/V kept in full
precision (the pack) and with them quantized as one more INT2 cache entry (corrected alike).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the pack's jensen_core and worldplay; appended, so ComfyUI's folder stays first
    sys.path.append(str(ROOT))

from jensen_core import QuantSpec  # noqa: E402
from jensen_core.geometry import LatentGeometry  # noqa: E402
from jensen_core.planner import CacheShape  # noqa: E402
from jensen_testing.planning import plan_video  # noqa: E402
from runtime.families.worldplay.model.keys import RELEASED  # noqa: E402

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
#: INT2 g32 with FP8 steps and BF16 origins: 2 + (8 + 16) / 32 bits per element
INT2_BITS = 2.75


def rows() -> list[dict]:
    """The planner's bytes of each setting at 480p, 125 and 253 frames."""
    out = []
    for frames in VIDEOS:
        lat_t, lat_h, lat_w = GEOMETRY.latent_shape(WIDTH, HEIGHT, frames)
        for name, spec in SETTINGS:
            shape = CacheShape(RELEASED.depth * STREAMS, RELEASED.heads, RELEASED.head_dim, GEOMETRY)
            plan = plan_video((lat_t, lat_h, lat_w), CHUNK_FRAMES, CONTEXT_CHUNKS, shape, spec)
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


def table() -> list[dict]:
    """:func:`rows` as the issue's table: the reference's cache, then the pack's in BF16 (no Quantize KV Cache: the
    cache keeps the BF16 model's dtype), INT4 and INT2 g32, each without and with the correction (same bytes)."""
    out = []
    for r in rows():
        if r["setting"].startswith("BF16"):
            out.append({**r, "setting": "reference (BF16)", "correction": "-"})
            out.append({**r, "setting": "pack, BF16", "correction": "-"})
            continue
        for corr in ("off", "taylor"):
            out.append({**r, "setting": f"pack, {r['setting']}", "correction": corr})
    return out


def prefix_bytes(tokens: int, full_bytes: int = 2) -> int:
    """The prompt prefix in the model's dtype: K and V per block, shared by the two streams."""
    return tokens * RELEASED.heads * RELEASED.head_dim * 2 * RELEASED.depth * full_bytes


def prefix_bytes_int2(tokens: int) -> int:
    """What the prompt prefix would take quantized at INT2 g32 (FP8 steps, BF16 origins): 11 bytes per 32 elements."""
    return tokens * RELEASED.heads * RELEASED.head_dim * 2 * RELEASED.depth * 11 // 32


def print_planner() -> None:
    per_frame = GEOMETRY.tokens_per_frame(*GEOMETRY.latent_shape(WIDTH, HEIGHT, 1)[1:])
    print(
        f"HY-WorldPlay at {WIDTH}x{HEIGHT}: {RELEASED.depth} blocks x {STREAMS} streams, {RELEASED.heads} heads x "
        f"{RELEASED.head_dim}, {per_frame:,} tokens per latent frame, context {CHUNK_FRAMES * CONTEXT_CHUNKS} frames "
        "(the planner)"
    )
    print(f"{'video':>9} {'cache':<20} {'correction':<10} {'tokens':>7} {'bits':>5} {'GB':>7} {'GiB':>7} {'vs ref':>7}")
    base = {}
    for r in table():
        if r["setting"].startswith("reference"):
            base[r["frames"]] = r["bytes"]
        video = f"{r['frames']} ({r['latents']})"
        print(
            f"{video:>9} {r['setting']:<20} {r['correction']:<10} {r['tokens']:>7,} {r['bits']:>5.2f} "
            f"{r['bytes'] / 1e9:>7.2f} {r['bytes'] / 2**30:>7.2f} {base[r['frames']] / r['bytes']:>6.2f}x"
        )
    print("correction: stores nothing (the Taylor bias uses the stored steps): the same bytes with it as without")
    n = sum(PREFIX_TOKENS.values())
    print(
        f"prompt prefix, by hand ({' + '.join(f'{k} {v}' for k, v in PREFIX_TOKENS.items())} = {n} tokens, K and V of "
        f"{RELEASED.depth} blocks, shared by both streams): {prefix_bytes(n) / 1e9:.3f} GB in BF16 (the pack's choice: "
        f"full precision, beside the cache), {prefix_bytes_int2(n) / 1e9:.3f} GB if it were INT2 g32; the same at "
        "every video length"
    )


# ------------------------------------------------------------------------------------------------ measured, tiny
def _measure(lengths: list[int], repeats: int = 2) -> None:
    from jensen_testing import comfyui as support_comfyui

    support_comfyui.setup_inprocess_comfyui()
    import importlib

    import torch

    from jensen_testing import worldplay_tiny as wt

    pack = support_comfyui.import_pack()
    nodes = importlib.import_module(f"{pack.__name__}.nodes")
    jk = importlib.import_module(f"{pack.__name__}.jensen_core")
    attention_shift = importlib.import_module(f"{pack.__name__}.jensen_core.attention_shift").attention_shift
    cat_quantized = importlib.import_module(f"{pack.__name__}.jensen_core.quant").cat_quantized
    config_mod = importlib.import_module(f"{pack.__name__}.runtime.config")
    families = importlib.import_module(f"{pack.__name__}.runtime.families")
    torch.set_num_threads(1)

    model = wt.build_patcher(0)
    dm = model.model.diffusion_model

    def quantized(bits, corr):
        m = nodes.JensenKVQuantizeKVCache.execute(model, bits, bits, "32", "hadamard", "fp8_e4m3", 0).args[0]
        return nodes.JensenKVBiasCorrection.execute(m, corr, 1.0).args[0]

    class Events:
        """Every denoising call's q, k, v, the context's full-precision K/V and its stored entries."""

        def __init__(self):
            self.fp, self.calls = {}, []

        def __call__(self, e):
            if e.phase == "write":
                if e.frame_offset == 0:
                    self.fp[e.layer] = []
                self.fp[e.layer].append((e.k.detach().clone(), e.v.detach().clone()))
            elif e.cache is not None and e.cache.entries:
                kf = torch.cat([k for k, _ in self.fp[e.layer]], dim=-2)
                vf = torch.cat([v for _, v in self.fp[e.layer]], dim=-2)
                self.calls.append((e.layer, e.q.clone(), e.k.clone(), e.v.clone(), kf, vf, list(e.cache.entries)))

    settings = [("full precision", None, "off")] + [
        (f"INT{b} g32", b, corr) for b in ("4", "2") for corr in ("off", "taylor")
    ]
    print(
        f"\nMeasured: the tiny WorldPlay ({wt.TINY.depth} blocks x 2 streams, {wt.TINY.heads} heads x "
        f"{wt.TINY.head_dim}, {wt.LATENT_HW[0]} x {wt.LATENT_HW[1]} latents, float32), the pack's recipe, one thread"
    )
    print(
        f"{'latents':>7} {'cache':<15} {'corr.':<6} {'measured B':>10} {'planner B':>10} {'BF16 B':>8} "
        f"{'s/chunk':>7} {'max|Δ|/max':>10} {'ΔP_S img':>9} {'ΔP_S prope':>10}"
    )
    text_rows = []
    for n in lengths:
        ((text, opts),) = wt.conditioning(1, n)
        with torch.no_grad():
            prefix = dm.text_prefix(
                text, None, opts["conditioning_byt5small"], opts["clip_vision_output"].last_hidden_state
            )
        noise = wt.video_noise(n, 11)
        fp_video = None
        models = {(name, corr): model if bits is None else quantized(bits, corr) for name, bits, corr in settings}
        fastest = {key: math.inf for key in models}
        for _ in range(max(1, repeats) - 1):  # timing rounds, every setting once per round
            for key, m in models.items():
                r = wt.sample(m, n, seed=5, noise=noise, progress=False)
                fastest[key] = min(fastest[key], statistics.median(r.seconds_per_chunk))
        for name, bits, corr in settings:
            m = models[(name, corr)]
            obs = Events()
            r = wt.sample(m, n, seed=5, noise=noise, progress=False, observer=obs)
            fastest[(name, corr)] = min(fastest[(name, corr)], statistics.median(r.seconds_per_chunk))
            rep = r.report
            if fp_video is None:
                fp_video = r.samples
            dev = float((r.samples - fp_video).abs().max() / fp_video.abs().max())
            shifts = {"img": [], "prope": []}
            if bits is not None:
                for layer, q, k, v, kf, vf, entries in obs.calls:
                    tk, tv = prefix.layer(layer // 2)
                    d = attention_shift(
                        q,
                        kf,
                        vf,
                        torch.cat([tk, k], -2),
                        torch.cat([tv, v], -2),
                        cat_quantized([e.k for e in entries]),
                        cat_quantized([e.v for e in entries]),
                        correction=rep["correction"],
                    ).delta_ps
                    shifts[("img", "prope")[layer % 2]].append(d.flatten())
            mean = {s: (float(torch.cat(v).mean()) if v else 0.0) for s, v in shifts.items()}
            assert rep["cache_bytes"] == rep["planned_bytes"], (rep["cache_bytes"], rep["planned_bytes"])
            print(
                f"{n:>7} {name:<15} {rep['correction']:<6} {rep['cache_bytes']:>10,} {rep['planned_bytes']:>10,} "
                f"{rep['bf16_bytes']:>8,} {fastest[(name, corr)]:>7.3f} {dev:>10.2e} "
                f"{mean['img']:>9.2e} {mean['prope']:>10.2e}"
            )
            if bits == "2" and obs.calls:
                config = config_mod.get_config(m.model_options)
                text_rows.append((n, corr, _text_choice(jk, obs, prefix, config, corr)))
    print(
        "\nThe text prefix: attention output error against full precision (mean ||out - ref|| / ||ref|| over the INT2 "
        "runs' calls), the prompt's K/V in full precision beside the INT2 context (the pack) or quantized as one more "
        "INT2 g32 entry"
    )
    print(f"{'latents':>7} {'corr.':<6} {'text full precision':>20} {'text INT2':>10} {'ratio':>6}")
    for n, corr, (kept, quant) in text_rows:
        print(f"{n:>7} {corr:<6} {kept:>20.3e} {quant:>10.3e} {quant / kept:>6.2f}")
    del families


def _text_choice(jk, obs, prefix, config, corr) -> tuple[float, float]:
    """Mean relative attention-output error vs full precision: the prompt kept in full precision (the pack) and the
    prompt quantized like the context (one more cache entry, corrected alike)."""
    import torch
    import torch.nn.functional as F

    kept, quant = [], []
    for layer, q, k, v, kf, vf, entries in obs.calls:
        tk, tv = prefix.layer(layer // 2)
        ref = F.scaled_dot_product_attention(q, torch.cat([tk, kf, k], -2), torch.cat([tv, vf, v], -2))
        text_cache = jk.ChunkCache(config.spec_k, config.spec_v)
        text_cache.append(tk, tv)
        a = jk.cached_attention(q, k, v, entries, correction=corr, k_ctx=tk, v_ctx=tv)
        b = jk.cached_attention(q, k, v, list(text_cache.entries) + entries, correction=corr)
        norm = ref.norm()
        kept.append(float((a - ref).norm() / norm))
        quant.append(float((b - ref).norm() / norm))
    return statistics.fmean(kept), statistics.fmean(quant)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--measure", action="store_true", help="also run the tiny WorldPlay (needs ComfyUI v0.27+)")
    parser.add_argument("--lengths", type=int, nargs="+", default=[32, 64], help="latent frames of the tiny runs")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each setting for its time (fastest kept)")
    args = parser.parse_args(argv)
    print_planner()
    if args.measure:
        _measure(args.lengths, args.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
