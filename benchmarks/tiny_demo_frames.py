"""The CPU demo workflow's three videos as one picture for the README (and how different they are).

    python benchmarks/tiny_demo_frames.py     # writes docs/results/tiny_ar_demo_frames.png (~1 min on 2 cores)

The same settings as ``example_workflows/01 Tiny AR demo - runs on a CPU, no download.json``: the bundled tiny AR model (the
workflow's, ``--model`` for another) with shift 3, prompt "three balls bouncing fast over a cool
texture", seed 42, 24 latent frames in chunks of 3, cache window 3, 8 euler steps; rows:
full-precision cache, INT2 (g32, QuaRot), INT2 + Jensen. Every 3rd latent frame is shown at 128x128,
drawn by the bundled tiny decoder (Tiny AR Decode's default; ``--preview`` for the blocky preview colours).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the pack's jensen_core and jensen_testing; appended, so ComfyUI's folder stays first
    sys.path.append(str(ROOT))

from jensen_testing import comfyui as support_comfyui  # noqa: E402

PROMPT = "three balls bouncing fast over a cool texture"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "results" / "tiny_ar_demo_frames.png")
    p.add_argument("--model", type=Path, default=None, help="tiny AR checkpoint (default: the demo workflow's)")
    p.add_argument("--preview", action="store_true", help="the preview colours instead of the tiny decoder")
    p.add_argument(
        "--prefix",
        type=int,
        default=0,
        help="continue this many ground-truth chunks of a held-out scene of the prompt (the rollout benchmark's "
        "set-up) instead of starting from noise; the top row then shows the true continuation",
    )
    args = p.parse_args(argv)
    support_comfyui.setup_inprocess_comfyui()
    import importlib

    import comfy.samplers
    import torch
    from PIL import Image, ImageDraw

    from jensen_testing import tiny_ar

    pack = support_comfyui.import_pack()
    nodes = importlib.import_module(f"{pack.__name__}.nodes")
    loop = importlib.import_module(f"{pack.__name__}.runtime.chunk_loop")
    tv = tiny_ar.core()
    decode = importlib.import_module(f"{pack.__name__}.nodes.tiny_ar_decode")
    model = tiny_ar.load_model(args.model or tiny_ar.DEMO_MODEL_PATH)
    int2 = nodes.JensenKVQuantizeKVCache.execute(model, "2", "2", "32", "hadamard", "fp8_e4m3", 0).args[0]
    jensen = nodes.JensenKVBiasCorrection.execute(int2, "taylor", 1.0).args[0]
    cond = nodes.JensenKVTinyARPrompt.execute(PROMPT).args[0]
    rows = []
    ref = None
    extra = {}
    if args.prefix:
        scene = tv.make_scene(PROMPT, tiny_ar.HELD_OUT_SEED0 + 1)
        pre = tv.render(scene, 0, 3 * args.prefix)
        extra = {"prefix": {"samples": tv.to_wan_latent(pre).unsqueeze(0)}, "include_prefix": False}
        rows.append(("ground truth", tv.render_rgb(scene, 3 * args.prefix, 24)))
    for label, m in (("full-precision cache", model), ("INT2 cache", int2), ("INT2 + Jensen", jensen)):
        res = loop.run_chunked_ar(
            m,
            cond,
            cond,
            {"samples": torch.zeros(1, 16, 24, 16, 16)},
            seed=42,
            cfg=1.0,
            sampler=comfy.samplers.sampler_object("euler"),
            sigmas=tiny_ar.sigmas(model),
            chunk_frames=3,
            window_chunks=3,
            progress=False,
            **extra,
        )
        x = tv.from_wan_latent(res.samples[0])
        if ref is None:
            ref = x
        print(
            f"{label:22s} latent PSNR vs full precision: {tiny_ar.psnr(ref, x):6.2f} dB, "
            f"cache {res.report['cache_bytes'] / 1024:.1f} KiB"
        )
        method = decode.PREVIEW if args.preview else decode.DECODER
        rows.append((label, decode.decode(res.samples, 8, method)))
    frames = list(range(0, 24, 3))
    cell, pad, left = 128, 4, 170
    img = Image.new("RGB", (left + len(frames) * (cell + pad), len(rows) * (cell + pad) + 18), "white")
    draw = ImageDraw.Draw(img)
    for j, f in enumerate(frames):
        draw.text((left + j * (cell + pad) + 4, 2), f"frame {f + 3 * args.prefix}", fill=(40, 40, 40))
    for i, (label, rgb) in enumerate(rows):
        y = 18 + i * (cell + pad)
        draw.text((6, y + cell // 2 - 6), label, fill=(20, 20, 20))
        for j, f in enumerate(frames):
            tile = Image.fromarray((rgb[f] * 255).round().byte().numpy()).resize((cell, cell), Image.NEAREST)
            img.paste(tile, (left + j * (cell + pad), y))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    img.save(args.out)
    print(f"wrote {args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
