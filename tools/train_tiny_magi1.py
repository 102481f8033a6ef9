"""Train the pack's tiny MAGI-1 (the pack's pure-torch ``runtime.families.magi1.model.dit.MagiDiT``) on a CPU, with MAGI-1's own objective.

    python tools/train_tiny_magi1.py --threads 1    # writes models/tiny_magi1/jensen-kv-tiny-magi1.safetensors

What it trains (see models/tiny_magi1/MODEL_CARD.md):

- data: :mod:`jensen_core.toy_video`, the tiny AR model's data (seeded bouncing, occluding discs over a panning
  texture, 16 channels, 16x16 latents = 64 tokens per frame after the 2x2 patches), in chunks of 6 latent frames
  (the MAGI-1 AR Sampler's chunk); the six prompts' fixed 8 x 4096 embeddings as captions, with the HQ and
  DURATION special tokens in front as the sampler puts them (``runtime.families.magi1.model.caption.chunk_captions``);
- model: ``runtime.families.magi1.model.dit.MagiDiT`` of ``jensen_testing.magi1_trained.CONFIG`` (hidden 256, 4 layers, ffn 1024, 4 query
  heads over 2 K/V heads of 64, distilled: the step-size embedding and the cfg-1 pipeline);
- objective: MAGI-1's. Time ``t`` runs from 0 (noise) to 1 (clean), ``x_t = t x + (1 - t) eps``, the model predicts
  the velocity ``x - eps`` (the sampler's Euler step is ``x += v dt``). Teacher forcing on the sampler's own
  forwards: each training sequence is one forward the pack's MAGI-1 sampler (``runtime.families.magi1.model.sampler``) runs at some window
  (1 to 4 chunks in flight, drawn per sequence), with the ground truth in place of the earlier chunks:

  * the chunks in flight, oldest first, each at its own time: at window ``W`` the chunk at window place ``p``
    (0 = newest) is at the fraction ``(p + u) / W`` of its steps (``u`` uniform, shared, as the sampler's sub-step)
    and at ``t = sd3(fraction)`` (``runtime.families.magi1.model.pipeline.time_schedule``'s map: ``u**2``, shift 3);
  * each reads the chunks of its key range: ``noise2clean_kvrange`` = 5, 4, 3, 2 chunks back (itself included) in
    the four quarters of its steps (``runtime.families.magi1.model.pipeline.key_ranges``), so at window 4 every chunk reads the older
    chunks in flight and one finished chunk, at window 1 up to four finished chunks;
  * the finished chunks before them, as many as the key ranges reach (fewer at a video's start), at ``t = 0.9999``
    under the null caption, each attending to itself only: exactly the K/V the sampler's clean chunk in front
    writes to its buffer;
  * the ramps: at a video's start fewer chunks in flight and none finished, at its end only the oldest places;
  * once the oldest chunk in flight is past ``t = 0.3``, the distilled pipeline's copy of it that attends to
    itself only (its velocity is blended 0.7 / 0.3 with the chunk's own);

  the loss is the mean squared error of the velocity over the chunks in flight (and the copy); the finished chunks
  are context only. Captions are dropped (the null caption and the "dropped" AdaLN token on every chunk, the cfg-3
  context pass) in 10% of sequences; the step-size constant is 16 steps' (8) in half of them and another step
  count's (4, 12, 16, 24, 32) in the rest, so that it does not matter (the model is trained by flow matching, not
  distilled: the constant carries no information).

Everything is seeded (data, noise, initialisation, order), fp32, and runs on the CPU. The run writes a resumable
checkpoint every ``--save-every`` steps (``out/tiny_magi1/``, never next to the model) and a JSON line every
``--log-every`` steps to ``<out>.log``; the file holds the EMA weights in half precision with ``magi1_config`` in
its metadata and the special tokens as ``special_tokens.<NAME>``: the pack's MAGI-1 loader reads it as it is.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the pack's jensen_core, magi1 and jensen_testing; appended, so others stay first
    sys.path.append(str(ROOT))

import torch  # noqa: E402

from jensen_core import toy_video as tv  # noqa: E402
from jensen_testing import magi1_trained as mt  # noqa: E402  (every MAGI-1 import of this tool goes through it)

TRAIN_SEEDS = (0, mt.HELD_OUT_SEED0)  # held-out videos use seeds >= 1,000,000
KV_RANGE = mt.magi_pipeline.NOISE2CLEAN_KVRANGE
CLEAN_T = 0.9999
NEARLY_CLEAN = 0.3
#: windows the sampler runs at 16 steps (1, 2, 4) and 3 (12 steps), drawn with these weights
WINDOWS = {1: 0.3, 2: 0.15, 3: 0.1, 4: 0.45}
#: the step-size constants of 8, 12 (shortcut grid), 24, 32 and 64 steps, besides 16 steps' 8
OTHER_DT = (4.0, 12.0, 16.0, 24.0, 32.0)


def sd3(frac: float, shift: float = 3.0) -> float:
    """MAGI-1's time at a fraction of a chunk's steps (``runtime.families.magi1.model.pipeline.time_schedule``, schedule sd3)."""
    s = frac * frac
    inv = 1.0 / shift
    return inv * s / (1 + (inv - 1) * s)


@dataclass(frozen=True)
class Layout:
    """One training sequence: ``finished`` clean chunks, then the chunks in flight (oldest first) with their times
    and key ranges (chunks back, itself included), then the self-only copy of the oldest when ``copy``."""

    window: int
    finished: int
    times: tuple[float, ...]
    ranges: tuple[int, ...]
    copy: bool

    @property
    def chunks(self) -> int:
        return self.finished + len(self.times) + int(self.copy)


def _choice(g: torch.Generator, weights: dict):
    keys = list(weights)
    i = int(torch.multinomial(torch.tensor([float(weights[k]) for k in keys]), 1, generator=g))
    return keys[i]


def sample_layout(g: torch.Generator, windows: dict = WINDOWS) -> Layout:
    """A forward of the sampler: the window, the places in flight, their times and key ranges, the finished chunks."""
    W = _choice(g, windows)
    places = list(range(W))  # steady: every place in flight
    r = float(torch.rand(1, generator=g))
    ramp_up = False
    if W > 1 and r < 0.15:  # a video's start: the newest places only, nothing finished yet
        places = list(range(int(torch.randint(1, W, (1,), generator=g))))
        ramp_up = True
    elif W > 1 and r < 0.25:  # a video's end: the oldest places only
        places = list(range(int(torch.randint(1, W, (1,), generator=g)), W))
    u = float(torch.rand(1, generator=g))
    times, ranges = [], []
    for p in sorted(places, reverse=True):  # oldest (highest place, cleanest) first
        frac = (p + u) / W
        times.append(sd3(frac))
        ranges.append(KV_RANGE[min(len(KV_RANGE) - 1, int(frac * len(KV_RANGE)))])
    reach = max(max(0, rng - 1 - j) for j, rng in enumerate(ranges))  # j: older chunks in flight
    if ramp_up:
        finished = 0
    elif float(torch.rand(1, generator=g)) < 0.8:
        finished = reach
    else:  # near a video's start: fewer finished chunks than the key ranges reach
        finished = int(torch.randint(0, reach + 1, (1,), generator=g))
    return Layout(W, finished, tuple(times), tuple(ranges), times[0] > NEARLY_CLEAN)


def plan_of(layout: Layout, chunk_tokens: int) -> mt.ChunkPlan:
    """The key ranges of the sequence's forward (as ``runtime.families.magi1.model.pipeline.key_ranges`` gives them to the sampler)."""
    ranges = [(i, i + 1) for i in range(layout.finished)]  # clean chunks: themselves
    for j, rng in enumerate(layout.ranges):
        end = layout.finished + j + 1
        ranges.append((max(0, end - rng), end))
    if layout.copy:
        n = len(ranges)
        ranges.append((n, n + 1))
    return mt.ChunkPlan(chunk_tokens, 0, tuple(ranges))


def init_weights(model, seed: int) -> None:
    """From scratch: Xavier-uniform matrices, zero biases, unit norms, zero output layer, gates near tanh(0.5)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name == "rope.bands":
                continue  # the reference's default frequencies (learned from there)
            if name.endswith("null_caption_embedding"):
                p.copy_(torch.randn(p.shape, generator=g))
            elif name.startswith("final_linear."):
                p.zero_()
            elif name.endswith("ada_modulate_layer.proj.0.bias"):
                p.fill_(0.5)
            elif name.endswith("ada_modulate_layer.proj.0.weight"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
            elif name.endswith(".layer_norm.weight"):  # plain LayerNorms (linear_qkv's, the MLP's)
                p.fill_(1.0)
            elif name.endswith(".bias") or p.dim() < 2:  # biases; zero-centred norms (gamma = 1 + w)
                p.zero_()
            else:
                fan_out, fan_in = p.shape[0], math.prod(p.shape[1:])
                bound = math.sqrt(6.0 / (fan_in + fan_out))
                p.copy_((torch.rand(p.shape, generator=g) * 2 - 1) * bound)


def build(seed: int):
    model = mt.MagiDiT(mt.CONFIG)
    init_weights(model, seed)
    return model


def sequence_loss(model, g: torch.Generator, special: dict, caption_drop: float):
    """One training sequence's loss (a scalar with its graph) and its layout."""
    cw = mt.CHUNK_FRAMES
    null = model.null_caption(mt.NULL_CAPTION_TOKENS)  # learned: the clean chunks' and dropped captions
    layout = sample_layout(g)
    inflight = len(layout.times)
    real = layout.finished + inflight  # distinct video chunks
    prompt = int(torch.randint(0, len(tv.PROMPTS), (1,), generator=g))
    vseed = int(torch.randint(TRAIN_SEEDS[0], TRAIN_SEEDS[1], (1,), generator=g))
    start = int(torch.randint(0, 241, (1,), generator=g))
    scene = tv.make_scene(prompt, vseed, mt.LATENT_HW, mt.LATENT_HW)
    clean = tv.render(scene, start, real * cw)  # (16, real * cw, H, W)
    # where the sequence sits in a video of `length` chunks (RoPE time, and the DURATION tokens)
    length = int(torch.randint(real, 33, (1,), generator=g))
    first = int(torch.randint(0, length - real + 1, (1,), generator=g))
    eps = torch.randn(clean.shape, generator=g)
    t_chunks = [CLEAN_T] * layout.finished + list(layout.times)
    t_frames = torch.tensor(t_chunks).repeat_interleave(cw).view(1, -1, 1, 1)
    x = t_frames * clean + (1 - t_frames) * eps
    target = clean - eps
    dropped = float(torch.rand(1, generator=g)) < caption_drop
    caps = mt.captions(prompt, length, special)[first : first + real]
    caps = [null] * layout.finished + ([null] * inflight if dropped else caps[layout.finished :])
    lead = layout.finished * cw
    if layout.copy:  # the oldest chunk in flight again, attending to itself only
        x = torch.cat([x, x[:, lead : lead + cw]], dim=1)
        target = torch.cat([target, target[:, lead : lead + cw]], dim=1)
        t_chunks.append(layout.times[0])
        caps.append(caps[layout.finished])
    dt = (
        8.0
        if float(torch.rand(1, generator=g)) < 0.5
        else OTHER_DT[int(torch.randint(0, len(OTHER_DT), (1,), generator=g))]
    )
    n_tok = cw * model.tokens_per_frame(mt.LATENT_HW, mt.LATENT_HW)
    spec = mt.Forward(
        t=torch.tensor([t_chunks]),
        captions=caps,
        caption_dropped=torch.tensor([dropped]),
        first_frame=first * cw,
        plan=plan_of(layout, n_tok),
        distill_dt=dt,
    )
    v = mt.forward_with_grad(model, x[None], spec)[0]
    err = (v[:, lead:] - target[:, lead:]).pow(2)
    return err.mean(), layout


def save_half(model, path: Path, meta: dict) -> None:
    from safetensors.torch import save_file

    sd = {k: v.detach().to(torch.float16).contiguous() for k, v in model.state_dict().items()}
    sd.update({f"special_tokens.{k}": v.half().contiguous() for k, v in mt.special_tokens().items()})
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    meta = {"magi1_config": mt.CONFIG.to_json(), **meta}
    save_file(sd, str(tmp), metadata={k: v if isinstance(v, str) else json.dumps(v) for k, v in meta.items()})
    tmp.replace(path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", type=Path, default=mt.MODEL_PATH)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--batch", type=int, default=2, help="training sequences per step (one forward each)")
    ap.add_argument("--lr", type=float, default=4e-4)
    ap.add_argument("--warmup", type=int, default=150)
    ap.add_argument("--ema", type=float, default=0.998)
    ap.add_argument("--caption-drop", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--log-every", type=int, default=25)
    ap.add_argument("--save-every", type=int, default=100)
    ap.add_argument(
        "--ckpt-dir",
        type=Path,
        default=ROOT / "out" / "tiny_magi1",
        help="where the resumable training state goes (not the model folder: ComfyUI would list it)",
    )
    ap.add_argument("--resume", action="store_true", help="continue from <ckpt-dir>/<out stem>.ckpt if it exists")
    ap.add_argument("--benchmark", type=int, default=0, help="only time this many steps and exit")
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    model = build(args.seed).train()
    ema = build(args.seed).eval()
    ema.load_state_dict(model.state_dict())
    for p in ema.parameters():
        p.requires_grad_(False)
    special = mt.special_tokens()
    decay, no_decay = [], []
    for n, p in model.named_parameters():
        matrix = p.dim() >= 2 and not n.endswith("null_caption_embedding")
        (decay if matrix else no_decay).append(p)
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(0.9, 0.99),
    )
    g = torch.Generator().manual_seed(args.seed + 1)
    step, elapsed0 = 0, 0.0
    ckpt = args.ckpt_dir / (args.out.stem + ".ckpt")
    ckpt.parent.mkdir(parents=True, exist_ok=True)
    log_path = args.out.with_suffix(".log")
    if args.resume and ckpt.exists():
        st = torch.load(ckpt, weights_only=False)
        model.load_state_dict(st["model"])
        ema.load_state_dict(st["ema"])
        opt.load_state_dict(st["opt"])
        g.set_state(st["gen"])
        step, elapsed0 = st["step"], st["elapsed"]
        print(f"resumed at step {step}", flush=True)
    log = None
    if not args.benchmark:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(log_path, "a")

    def lr_at(s):
        if s < args.warmup:
            return args.lr * (s + 1) / args.warmup
        frac = (s - args.warmup) / max(1, args.steps - args.warmup)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))

    n_params = sum(p.numel() for p in model.parameters())
    print(f"tiny MAGI-1: {n_params:,} parameters, {mt.CONFIG.to_json()}", flush=True)
    t0 = time.perf_counter()
    running = None
    by_window: dict[int, float] = {}
    total = args.benchmark or args.steps
    while step < total:
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        opt.zero_grad(set_to_none=True)
        losses = []
        for _ in range(args.batch):
            loss, layout = sequence_loss(model, g, special, args.caption_drop)
            (loss / args.batch).backward()
            losses.append(loss.item())
            w = layout.window
            by_window[w] = loss.item() if w not in by_window else 0.97 * by_window[w] + 0.03 * loss.item()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        with torch.no_grad():
            d = min(args.ema, (1 + step) / (10 + step))
            for pe, pm in zip(ema.parameters(), model.parameters()):
                pe.lerp_(pm, 1 - d)
        step += 1
        mean = sum(losses) / len(losses)
        running = mean if running is None else 0.95 * running + 0.05 * mean
        el = elapsed0 + time.perf_counter() - t0
        if args.benchmark:
            print(f"step {step}: loss {mean:.4f} {el / step:.2f} s/step", flush=True)
            continue
        if step % args.log_every == 0 or step == total:
            line = json.dumps(
                {
                    "step": step,
                    "loss": round(mean, 5),
                    "loss_ema": round(running, 5),
                    "loss_ema_by_window": {str(k): round(v, 5) for k, v in sorted(by_window.items())},
                    "grad_norm": round(float(gn), 4),
                    "lr": lr_at(step - 1),
                    "elapsed_s": round(el, 1),
                }
            )
            print(line, flush=True)
            log.write(line + "\n")
            log.flush()
        if step % args.save_every == 0 or step == total:
            tmp = ckpt.with_suffix(".ckpt.tmp")
            torch.save(
                {
                    "model": model.state_dict(),
                    "ema": ema.state_dict(),
                    "opt": opt.state_dict(),
                    "gen": g.get_state(),
                    "step": step,
                    "elapsed": el,
                    "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                },
                tmp,
            )
            tmp.replace(ckpt)
            save_half(
                ema,
                args.out,
                {
                    "format": mt.FORMAT,
                    "step": step,
                    "steps": args.steps,
                    "elapsed_s": round(el, 1),
                    "loss_ema": round(running, 5),
                    "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                    "chunk_frames": mt.CHUNK_FRAMES,
                },
            )
    if log is not None:
        log.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
