"""Train the pack's tiny chunk-wise autoregressive video model (a ComfyUI Wan 2.1 T2V) on 2 CPU cores.

    python tools/train_tiny_ar.py --out models/tiny_ar/jensen-kv-tiny-ar.safetensors   # ~80 min, 2 cores

What it trains (see models/tiny_ar/MODEL_CARD.md):

- data: :mod:`jensen_core.toy_video` (seeded bouncing, occluding discs over a panning texture, in Wan
  2.1's latent model space, 16x16 latents = 64 tokens per frame), six scene/motion prompts whose
  text embeddings are fixed Gaussians (:func:`toy_video.prompt_embedding`);
- model: ComfyUI's own ``WanModel`` class (dim 256 = 2 heads of 128, 4 blocks, ffn 1024, 4096-wide
  text input), so ``UNETLoader`` detects the saved file as Wan 2.1 T2V;
- objective: flow matching (x_s = (1 - s) x0 + s eps, target eps - x0, timestep 1000 s, as
  ComfyUI's Wan sampling expects) under block-causal attention over chunks of 3 latent frames,
  teacher-forced: the sequence holds every chunk twice, clean (t = 0, exactly the cache-writing
  pass of Self-Forcing / CausVid and of the pack's sampler) and noisy (each chunk its own noise
  level). A noisy chunk attends to itself and to the clean copies of the ``--window`` chunks before
  it; a clean chunk attends to itself and the same window. This is the attention a rollout with a
  cache window of ``--window`` chunks performs, so the model rolls out indefinitely.

Everything is seeded (data, noise, initialisation, order), fp32, and runs on the CPU. The run
writes a resumable checkpoint every ``--save-every`` steps and a log line every ``--log-every``
steps to ``<out>.log``; the final file holds the EMA weights in half precision.
Needs ComfyUI importable (COMFYUI_PATH, a ComfyUI above the checkout, /opt/comfyui/v0.33, ...; see jensen_testing/comfyui.py).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the pack's jensen_core and jensen_testing; appended, so ComfyUI's folder stays first
    sys.path.append(str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from jensen_core import toy_video as tv  # noqa: E402

#: the architecture (ComfyUI derives heads = dim / 128 and text_dim 4096 when it loads the file)
ARCH = dict(dim=256, ffn_dim=1024, num_heads=2, num_layers=4, text_dim=tv.TEXT_WIDTH, text_len=512)
CHUNK_FRAMES = 3
LATENT_HW = 16
TRAIN_SEEDS = (0, 1_000_000)  # video seeds used for training; held-out sets use seeds >= 1_000_000
HELD_OUT_SEED0 = 1_000_000


def setup_comfy():
    from jensen_testing import comfyui as support_comfyui

    support_comfyui.setup_inprocess_comfyui()


def build_model(seed: int) -> torch.nn.Module:
    """ComfyUI's WanModel with the tiny architecture, initialised as Wan's reference ``init_weights``."""
    import comfy.ops
    from comfy.ldm.wan.model import WanModel

    torch.manual_seed(seed)
    dm = WanModel(
        model_type="t2v",
        patch_size=(1, 2, 2),
        text_len=ARCH["text_len"],
        in_dim=16,
        dim=ARCH["dim"],
        ffn_dim=ARCH["ffn_dim"],
        freq_dim=256,
        text_dim=ARCH["text_dim"],
        out_dim=16,
        num_heads=ARCH["num_heads"],
        num_layers=ARCH["num_layers"],
        window_size=(-1, -1),
        qk_norm=True,
        cross_attn_norm=True,
        eps=1e-6,
        image_model="wan2.1",
        device="cpu",
        dtype=torch.float32,
        operations=comfy.ops.disable_weight_init,
    )
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in dm.named_parameters():
            if name.endswith(".bias"):
                p.zero_()
            elif "norm" in name.split(".")[-2] and name.endswith("weight"):
                p.fill_(1.0)
            elif name.endswith("modulation"):
                p.copy_(torch.randn(p.shape, generator=g) / ARCH["dim"] ** 0.5)
            elif name.startswith(("text_embedding", "time_embedding")):
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
            elif name.startswith("head.head"):
                p.zero_()
            elif p.dim() >= 2:
                fan_out, fan_in = p.shape[0], math.prod(p.shape[1:])
                bound = math.sqrt(6.0 / (fan_in + fan_out))
                p.copy_((torch.rand(p.shape, generator=g) * 2 - 1) * bound)
            else:
                p.zero_()
    return dm


def block_causal_mask(chunks: int, window: int, tokens_per_chunk: int) -> torch.Tensor:
    """Boolean (2N, 2N) chunk mask -> token mask for the [clean chunks, noisy chunks] sequence (True = attend)."""
    i = torch.arange(chunks).view(-1, 1)
    j = torch.arange(chunks).view(1, -1)
    clean_clean = (j <= i) & (j >= i - window)
    noisy_clean = (j < i) & (j >= i - window)
    noisy_noisy = j == i
    top = torch.cat([clean_clean, torch.zeros_like(clean_clean)], dim=1)
    bottom = torch.cat([noisy_clean, noisy_noisy], dim=1)
    m = torch.cat([top, bottom], dim=0)
    return m.repeat_interleave(tokens_per_chunk, 0).repeat_interleave(tokens_per_chunk, 1)


def block_causal_plan(chunks: int, window: int, tokens_per_chunk: int) -> list[tuple[slice, list[slice]]]:
    """The same pattern as :func:`block_causal_mask`, as (query slice, key slices) per query chunk.

    Attention is computed block by block over only the allowed keys (3.5x less work than a dense
    masked SDPA at 5 chunks, window 3, and the unmasked fused kernel runs).
    """

    def sl(c):
        return slice(c * tokens_per_chunk, (c + 1) * tokens_per_chunk)

    plan = []
    for i in range(chunks):
        lo = max(0, i - window)
        plan.append((sl(i), [slice(lo * tokens_per_chunk, (i + 1) * tokens_per_chunk)]))  # clean i
        keys = [slice(lo * tokens_per_chunk, i * tokens_per_chunk)] if i > lo else []
        plan.append((sl(chunks + i), keys + [sl(chunks + i)]))  # noisy i
    return sorted(plan, key=lambda p: p[0].start)  # query order, so the outputs concatenate in sequence order


class MaskedSelfAttention:
    """WanSelfAttention.forward with the training sequence's block-causal pattern (``plan_ref["plan"]``)."""

    def __init__(self, module, plan_ref: dict):
        self.m, self.plan_ref = module, plan_ref

    def __call__(self, x, freqs, transformer_options=None, **kwargs):
        from comfy.ldm.flux.math import apply_rope1

        m = self.m
        b, s = x.shape[:2]
        n, d = m.num_heads, m.head_dim
        q = apply_rope1(m.norm_q(m.q(x)).view(b, s, n, d), freqs).transpose(1, 2)
        k = apply_rope1(m.norm_k(m.k(x)).view(b, s, n, d), freqs).transpose(1, 2)
        v = m.v(x).view(b, s, n, d).transpose(1, 2)
        outs = []
        for qs, kss in self.plan_ref["plan"]:
            kk = torch.cat([k[:, :, ks] for ks in kss], dim=2) if len(kss) > 1 else k[:, :, kss[0]]
            vv = torch.cat([v[:, :, ks] for ks in kss], dim=2) if len(kss) > 1 else v[:, :, kss[0]]
            outs.append(F.scaled_dot_product_attention(q[:, :, qs], kk, vv))
        out = torch.cat(outs, dim=2)
        return m.o(out.transpose(1, 2).reshape(b, s, n * d))


def install_mask(dm, plan_ref: dict) -> None:
    for blk in dm.blocks:
        blk.self_attn.forward = MaskedSelfAttention(blk.self_attn, plan_ref)


def teacher_forced_forward(
    dm, clean: torch.Tensor, noisy: torch.Tensor, sigma_frames: torch.Tensor, context: torch.Tensor
) -> torch.Tensor:
    """Velocity prediction for ``noisy`` (B, 16, F, H, W) given its clean copy as context.

    ``sigma_frames`` (B, F): the noise level of each noisy frame; clean frames get t = 0. RoPE gives
    clean and noisy copies of a frame the same position.
    """
    B, _, Fr, H, W = noisy.shape
    x = torch.cat([clean, noisy], dim=2)
    t = torch.cat([torch.zeros_like(sigma_frames), sigma_frames], dim=1) * 1000.0
    freqs_one = dm.rope_encode(Fr, H, W, device=x.device, dtype=torch.float32)
    freqs = torch.cat([freqs_one, freqs_one], dim=1)
    out = dm.forward_orig(x, t, context, freqs=freqs, transformer_options={})
    return out[:, :, Fr:]


def sample_sigmas(g: torch.Generator, n: int, shift: float) -> torch.Tensor:
    """Noise levels for ``n`` chunks: uniform u warped by ``shift`` (more weight on high noise, as SD3 / Wan)."""
    u = torch.rand(n, generator=g)
    return shift * u / (1 + (shift - 1) * u)


def make_batch(g: torch.Generator, batch: int, chunks: int, seed_range: tuple[int, int], max_start: int = 240):
    """``batch`` training videos of ``chunks`` chunks: (clean (B,16,F,H,W), context (B,8,4096), prompts, seeds)."""
    videos, ctx, prompts, seeds = [], [], [], []
    for _ in range(batch):
        p = int(torch.randint(0, len(tv.PROMPTS), (1,), generator=g))
        s = int(torch.randint(seed_range[0], seed_range[1], (1,), generator=g))
        start = int(torch.randint(0, max_start + 1, (1,), generator=g))
        scene = tv.make_scene(p, s, LATENT_HW, LATENT_HW)
        videos.append(tv.render(scene, start, chunks * CHUNK_FRAMES))
        ctx.append(tv.prompt_embedding(p))
        prompts.append(p)
        seeds.append(s)
    return torch.stack(videos), torch.cat(ctx), prompts, seeds


def flow_loss(dm, clean, context, g, shift: float, reduce: bool = True, cache=None):
    """Flow-matching loss of every noisy chunk; ``cache`` (default ``clean``) is the clean sequence it attends to.

    With a self-generated ``cache`` the target stays the ground truth ``clean``: the scenes are
    deterministic, so the model learns to bring a drifting rollout back to the true trajectory.
    """
    B, _, Fr = clean.shape[:3]
    chunks = Fr // CHUNK_FRAMES
    sig = torch.stack([sample_sigmas(g, chunks, shift) for _ in range(B)])  # (B, chunks)
    sig_f = sig.repeat_interleave(CHUNK_FRAMES, dim=1)
    eps = torch.randn(clean.shape, generator=g)
    s5 = sig_f.view(B, 1, Fr, 1, 1)
    noisy = (1 - s5) * clean + s5 * eps
    v = teacher_forced_forward(dm, clean if cache is None else cache, noisy, sig_f, context)
    err = (v - (eps - clean)).pow(2)
    return err.mean() if reduce else err


def flow_sigmas(steps: int, shift: float) -> list[float]:
    """The sampler's noise levels for ``steps`` Euler steps: ComfyUI's "simple" schedule at ``shift`` (1 ... 0)."""
    out = []
    for k in range(steps):
        u = 1.0 - k / steps
        out.append(shift * u / (1 + (shift - 1) * u))
    return out + [0.0]


def chunk_plan(n_ctx: int, tokens_per_chunk: int) -> list[tuple[slice, list[slice]]]:
    """Attention of one rollout forward: ``n_ctx`` clean cache chunks (block-causal) then one noisy chunk."""

    def sl(c):
        return slice(c * tokens_per_chunk, (c + 1) * tokens_per_chunk)

    plan = [(sl(i), [slice(0, (i + 1) * tokens_per_chunk)]) for i in range(n_ctx)]
    return plan + [(sl(n_ctx), [slice(0, (n_ctx + 1) * tokens_per_chunk)])]


@torch.no_grad()
def self_generated_context(
    dm,
    clean: torch.Tensor,
    context: torch.Tensor,
    g: torch.Generator,
    plan_ref: dict,
    *,
    prefix: int,
    steps: int,
    shift: float,
    window: int,
) -> torch.Tensor:
    """``clean`` with chunks ``prefix ..`` replaced by the model's own rollout (Self-Forcing's context, no grad).

    Chunk by chunk, as the pack's sampler does: chunk c is sampled from pure noise with ``steps`` Euler
    steps of the flow (the "simple" schedule at ``shift``), attending to the clean (t = 0) copies of
    the ``window`` chunks before it, which are themselves generated from chunk ``prefix`` on, so errors
    compound as in a rollout. The last chunk is never anyone's context, so it is not generated.
    """
    B, C, Fr, H, W = clean.shape
    F_ = CHUNK_FRAMES
    chunks = Fr // F_
    tpc = F_ * (H // 2) * (W // 2)
    out = clean.clone()
    saved = plan_ref["plan"]
    sig = flow_sigmas(steps, shift)
    try:
        for c in range(prefix, chunks - 1):
            lo = max(0, c - window)
            ctx = out[:, :, lo * F_ : c * F_]
            n_ctx = c - lo
            plan_ref["plan"] = chunk_plan(n_ctx, tpc)
            freqs = dm.rope_encode((n_ctx + 1) * F_, H, W, device=clean.device, dtype=torch.float32)
            x = torch.randn((B, C, F_, H, W), generator=g)
            for k in range(steps):
                t = torch.cat([torch.zeros(B, n_ctx * F_), torch.full((B, F_), sig[k] * 1000.0)], dim=1)
                v = dm.forward_orig(torch.cat([ctx, x], dim=2), t, context, freqs=freqs, transformer_options={})
                x = x + (sig[k + 1] - sig[k]) * v[:, :, n_ctx * F_ :]
            out[:, :, c * F_ : (c + 1) * F_] = x
    finally:
        plan_ref["plan"] = saved
    return out


def load_init(dm, path: Path) -> None:
    """Weights of a saved tiny model (the teacher-forced one) into ``dm``, in fp32."""
    from safetensors.torch import load_file

    sd = {k: v.float() for k, v in load_file(str(path)).items()}
    missing, unexpected = dm.load_state_dict(sd, strict=False)
    if missing or unexpected:
        raise ValueError(f"--init {path}: missing keys {missing[:5]}, unexpected keys {unexpected[:5]}")


def save_half(dm, path: Path, meta: dict) -> None:
    from safetensors.torch import save_file

    sd = {k: v.detach().to(torch.float16).contiguous() for k, v in dm.state_dict().items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    save_file(sd, str(tmp), metadata={k: json.dumps(v) if not isinstance(v, str) else v for k, v in meta.items()})
    tmp.replace(path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", type=Path, default=ROOT / "models" / "tiny_ar" / "jensen-kv-tiny-ar.safetensors")
    ap.add_argument("--steps", type=int, default=2400)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--chunks", type=int, default=5, help="chunks per training video (teacher-forced sequence)")
    ap.add_argument("--window", type=int, default=3, help="cache window in chunks the attention mask allows")
    ap.add_argument("--lr", type=float, default=4e-4)
    ap.add_argument("--warmup", type=int, default=150)
    ap.add_argument("--shift", type=float, default=3.0, help="noise-level warp of the training sigmas")
    ap.add_argument("--ema", type=float, default=0.998)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--log-every", type=int, default=25)
    ap.add_argument("--save-every", type=int, default=250)
    ap.add_argument(
        "--ckpt-dir",
        type=Path,
        default=ROOT / "out" / "tiny_ar",
        help="where the resumable training state goes (not the model folder: ComfyUI would list it)",
    )
    ap.add_argument("--resume", action="store_true", help="continue from <ckpt-dir>/<out stem>.ckpt if it exists")
    ap.add_argument("--benchmark", type=int, default=0, help="only time this many steps and exit")
    ap.add_argument("--init", type=Path, default=None, help="start from this saved tiny model (model and EMA)")
    ap.add_argument(
        "--self-forcing",
        type=float,
        default=0.0,
        help="probability per batch that the cached context after the prefix is the model's own rollout",
    )
    ap.add_argument("--sf-steps", type=int, default=3, help="Euler steps per self-generated context chunk")
    ap.add_argument(
        "--sf-prefix", type=str, default="1,2", help="ground-truth chunks before the rollout (drawn per batch)"
    )
    ap.add_argument("--causal", action="store_true", help="add the causal_ar config metadata (as convert_checkpoint)")
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    setup_comfy()
    dm = build_model(args.seed).train()
    if args.init is not None:
        load_init(dm, args.init)
    ema = build_model(args.seed).eval()
    ema.load_state_dict(dm.state_dict())
    for p in ema.parameters():
        p.requires_grad_(False)
    tokens_per_chunk = CHUNK_FRAMES * (LATENT_HW // 2) ** 2
    plan_ref = {"plan": block_causal_plan(args.chunks, args.window, tokens_per_chunk)}
    install_mask(dm, plan_ref)
    sf_prefixes = [int(x) for x in args.sf_prefix.split(",")]
    if not 0 <= args.self_forcing <= 1 or not all(1 <= p < args.chunks - 1 for p in sf_prefixes):
        raise SystemExit(
            f"--self-forcing {args.self_forcing} must be in 0..1 and --sf-prefix {args.sf_prefix} "
            f"values in 1..{args.chunks - 2}"
        )
    decay, no_decay = [], []
    for n, p in dm.named_parameters():
        (no_decay if p.dim() < 2 or "norm" in n or n.endswith("modulation") else decay).append(p)
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(0.9, 0.99),
    )
    g = torch.Generator().manual_seed(args.seed + 1)
    step, elapsed0 = 0, 0.0
    ckpt = args.ckpt_dir / (args.out.stem + ".ckpt")  # resumable state (optimizer too): never next to the model
    ckpt.parent.mkdir(parents=True, exist_ok=True)
    log_path = args.out.with_suffix(".log")
    if args.resume and ckpt.exists():
        st = torch.load(ckpt, weights_only=False)
        dm.load_state_dict(st["model"])
        ema.load_state_dict(st["ema"])
        opt.load_state_dict(st["opt"])
        g.set_state(st["gen"])
        step, elapsed0 = st["step"], st["elapsed"]
        print(f"resumed at step {step}", flush=True)
    log = open(log_path, "a") if not args.benchmark else None

    def lr_at(s):
        if s < args.warmup:
            return args.lr * (s + 1) / args.warmup
        frac = (s - args.warmup) / max(1, args.steps - args.warmup)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))

    t0 = time.perf_counter()
    running = None
    total = args.benchmark or args.steps
    while step < total:
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        clean, ctx, _, _ = make_batch(g, args.batch, args.chunks, TRAIN_SEEDS)
        cache, sf = None, False
        if args.self_forcing > 0 and float(torch.rand(1, generator=g)) < args.self_forcing:
            prefix = sf_prefixes[int(torch.randint(0, len(sf_prefixes), (1,), generator=g))]
            cache = self_generated_context(
                dm, clean, ctx, g, plan_ref, prefix=prefix, steps=args.sf_steps, shift=args.shift, window=args.window
            )
            sf = True
        loss = flow_loss(dm, clean, ctx, g, args.shift, cache=cache)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(dm.parameters(), 1.0)
        opt.step()
        with torch.no_grad():
            d = min(args.ema, (1 + step) / (10 + step))
            for pe, pm in zip(ema.parameters(), dm.parameters()):
                pe.lerp_(pm, 1 - d)
        step += 1
        running = loss.item() if running is None else 0.95 * running + 0.05 * loss.item()
        el = elapsed0 + time.perf_counter() - t0
        if args.benchmark:
            print(f"step {step}: loss {loss.item():.4f} self-forced {sf} {el / step:.2f} s/step", flush=True)
            continue
        if step % args.log_every == 0 or step == total:
            line = json.dumps(
                {
                    "step": step,
                    "loss": round(loss.item(), 5),
                    "loss_ema": round(running, 5),
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
                    "model": dm.state_dict(),
                    "ema": ema.state_dict(),
                    "opt": opt.state_dict(),
                    "gen": g.get_state(),
                    "step": step,
                    "elapsed": el,
                    "args": vars(args) | {"out": str(args.out)},
                },
                tmp,
            )
            tmp.replace(ckpt)
            extra = {"config": {"transformer": {"causal_ar": True}}} if args.causal else {}
            save_half(
                ema,
                args.out,
                extra
                | {
                    "format": "jensen_kv_tiny_ar",
                    "step": step,
                    "steps": args.steps,
                    "elapsed_s": round(el, 1),
                    "loss_ema": round(running, 5),
                    "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                    "arch": ARCH,
                    "chunk_frames": CHUNK_FRAMES,
                    "window_chunks": args.window,
                },
            )
    if log is not None:
        log.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
