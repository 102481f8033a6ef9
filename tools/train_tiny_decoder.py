"""Train the tiny AR model's decoder: 16x16 model-space latents -> 128x128 RGB frames of the same toy scenes.

    python tools/train_tiny_decoder.py       # models/tiny_decoder/jensen-kv-tiny-decoder.safetensors, ~20 min, 1 thread

Data: random training scenes and frames of :mod:`jensen_core.toy_video` (the tiny model's training
seeds, below 1,000,000): the latent frame from ``render`` is the input, the same frame drawn at 8x
the resolution by ``render_rgb`` the target. Augmentation so that it also decodes a model's
imperfect latents, not only perfect ones: Gaussian latent noise of a random level (0 to
``--noise``) per frame, and with probability 1/2 a slight blur of the latent (a sampled video's
edges are softer than the renderer's). Loss: L1 + MSE in RGB. Adam, cosine decay; fp32 on the CPU;
the final file holds the weights in half precision (the preview map is fixed, not stored).
No ComfyUI needed.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from jensen_core import tiny_decoder as td  # noqa: E402
from jensen_core import toy_video as tv  # noqa: E402

TRAIN_SEEDS = (0, 1_000_000)
HELD_OUT_SEED0 = 1_000_000


def make_batch(g: torch.Generator, n: int, seed_range=TRAIN_SEEDS, frames: int = 2):
    """``n`` (latent frame, RGB frame) pairs: (n, 16, 16, 16) model space and (n, 3, 128, 128) in 0..1."""
    lat, rgb = [], []
    for _ in range(max(1, n // frames)):
        p = int(torch.randint(0, len(tv.PROMPTS), (1,), generator=g))
        s = int(torch.randint(seed_range[0], seed_range[1], (1,), generator=g))
        start = int(torch.randint(0, 400, (1,), generator=g))
        scene = tv.make_scene(p, s)
        lat.append(tv.render(scene, start, frames).movedim(0, 1))  # (frames, 16, H, W)
        rgb.append(tv.render_rgb(scene, start, frames, td.SCALE).permute(0, 3, 1, 2))
    return torch.cat(lat), torch.cat(rgb)


def augment(z: torch.Tensor, g: torch.Generator, noise: float) -> torch.Tensor:
    n = z.shape[0]
    level = torch.rand(n, 1, 1, 1, generator=g) * noise
    z = z + level * torch.randn(z.shape, generator=g)
    blur = torch.rand(n, generator=g) < 0.5
    if blur.any():
        k = torch.tensor([0.15, 0.7, 0.15])
        k2 = (k[:, None] * k[None, :]).expand(td.LATENT_CHANNELS, 1, 3, 3)
        soft = F.conv2d(F.pad(z[blur], (1, 1, 1, 1), mode="replicate"), k2, groups=td.LATENT_CHANNELS)
        z = z.clone()
        z[blur] = soft
    return z


def evaluate(dec: td.TinyDecoder, n: int = 32) -> dict:
    """Held-out frames: L1 and PSNR of the decoder and of the 8x-upsampled preview colours (the old decode)."""
    g = torch.Generator().manual_seed(7)
    z, rgb = make_batch(g, n, (HELD_OUT_SEED0, HELD_OUT_SEED0 + 100_000))
    with torch.no_grad():
        out = dec(z)
        nearest = F.interpolate(dec.preview(z), scale_factor=float(td.SCALE), mode="nearest")

    def psnr(x):
        return 10 * math.log10(1 / float((x - rgb).square().mean()))

    return {
        "l1": float((out - rgb).abs().mean()),
        "psnr": psnr(out),
        "preview_psnr": psnr(nearest),
    }


def save(dec: td.TinyDecoder, path: Path, meta: dict) -> None:
    from safetensors.torch import save_file

    sd = {k: v.detach().half().contiguous() for k, v in dec.state_dict().items() if k not in td.BUFFERS}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    save_file(sd, str(tmp), metadata={k: v if isinstance(v, str) else json.dumps(v) for k, v in meta.items()})
    tmp.replace(path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", type=Path, default=ROOT / "models" / "tiny_decoder" / "jensen-kv-tiny-decoder.safetensors")
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--batch", type=int, default=12)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--pool", type=int, default=768, help="training frames rendered once, redrawn with fresh noise")
    ap.add_argument("--noise", type=float, default=0.3, help="largest latent noise std of the augmentation")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--log-every", type=int, default=25)
    ap.add_argument("--save-every", type=int, default=100)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    dec = td.TinyDecoder()
    with torch.no_grad():  # start as the bilinear preview: a zero correction
        dec.conv_out.weight.zero_()
        dec.conv_out.bias.zero_()
    opt = torch.optim.Adam(dec.parameters(), lr=args.lr)
    g = torch.Generator().manual_seed(args.seed + 1)
    pool_z, pool_rgb = make_batch(g, args.pool, frames=4)  # rendering costs a third of a step: once
    log_path = args.out.with_suffix(".log")
    log = open(log_path, "w")
    t0 = time.perf_counter()
    running = None
    for step in range(1, args.steps + 1):
        for group in opt.param_groups:
            group["lr"] = (
                args.lr * min(1.0, step / 20) * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * step / args.steps)))
            )
        idx = torch.randint(0, pool_z.shape[0], (args.batch,), generator=g)
        z, rgb = pool_z[idx], pool_rgb[idx]
        if torch.rand(1, generator=g) < 0.5:  # mirror: the scenes have no preferred direction
            z, rgb = z.flip(-1), rgb.flip(-1)
        out = dec(augment(z, g, args.noise))
        loss = (out - rgb).abs().mean() + (out - rgb).square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        running = loss.item() if running is None else 0.9 * running + 0.1 * loss.item()
        if step % args.log_every == 0 or step == args.steps:
            line = {"step": step, "loss": round(loss.item(), 5), "loss_ema": round(running, 5)}
            line["elapsed_s"] = round(time.perf_counter() - t0, 1)
            if step % args.save_every == 0 or step == args.steps:
                dec.eval()
                line |= {k: round(v, 4) for k, v in evaluate(dec).items()}
                dec.train()
            print(json.dumps(line), flush=True)
            log.write(json.dumps(line) + "\n")
            log.flush()
        if step % args.save_every == 0 or step == args.steps:
            save(
                dec,
                args.out,
                {
                    "format": td.FORMAT,
                    "step": step,
                    "steps": args.steps,
                    "scale": td.SCALE,
                    "width": td.WIDTH,
                    "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                },
            )
    log.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
