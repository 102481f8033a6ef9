"""The pack's trained tiny MAGI-1 (models/tiny_magi1): its architecture, captions, loading, rollouts and the
checks that its rollouts stay stable (``tools/train_tiny_magi1.py`` trains it, ``tools/tiny_magi1_rollout.py``
prints the checks, ``tests/test_tiny_magi1.py`` asserts them).

Pure torch: the pack's MAGI-1 (:mod:`magi1`) and the toy videos (:mod:`jensen_core.toy_video`), no ComfyUI.
Every import of the MAGI-1 package the training tool and the checks use is in the block below (a refactor may
move the package: change it here).

What "stable" means here (:func:`stability`): a MAGI-1 rollout is text to video (no prefix), so it has no ground
truth to compare with; each finished chunk is compared with the *statistics* of the data instead, per chunk, over
held-out videos of the same prompt:

- ``std``: the latent's standard deviation over channels, frames and pixels (the data's: ~0.6; noise: 1);
- ``motion``: the mean absolute change between consecutive latent frames (the data's: 0.02-0.1 latent units per
  frame; an undenoised chunk: ~1.1);
- ``detail``: the mean absolute spatial Laplacian (high-frequency energy: residual noise or a blow-up raise it).

Each as a ratio to the data's mean for that prompt; a chunk is in range when every ratio lies within
:data:`BOUNDS`, and a rollout is stable when every chunk is (and every value is finite).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from jensen_core import toy_video as tv

# --- the MAGI-1 package: every import of it in one place --------------------------------------------------
from runtime.families.magi1.model import pipeline as magi_pipeline
from runtime.families.magi1.model.attention import ChunkPlan
from runtime.families.magi1.model.caption import DEFAULT_TOKENS, chunk_captions
from runtime.families.magi1.model.checkpoint import inspect_dit
from runtime.families.magi1.model.config import MagiConfig
from runtime.families.magi1.model.dit import Forward, MagiDiT
from runtime.families.magi1.model.sampler import NULL_CAPTION_TOKENS, MagiSettings, iter_sample

# -----------------------------------------------------------------------------------------------------------

PACK_ROOT = Path(__file__).resolve().parents[1]
MODEL_DIR = PACK_ROOT / "models" / "tiny_magi1"
MODEL_FILE = "jensen-kv-tiny-magi1.safetensors"
MODEL_PATH = MODEL_DIR / MODEL_FILE
FORMAT = "jensen_kv_tiny_magi1"

#: the architecture: the tiny AR model's size (hidden 256, 4 layers, ffn 1024) with MAGI-1's grouped-query
#: attention (4 query heads over 2 K/V heads of 64), a 4096-wide caption (T5-XXL's width, what MAGI-1 Text Encode
#: and ``toy_video.prompt_embedding`` give) and a null-caption table of 52 rows (the 50-token null caption and the
#: two AdaLN tokens, rows -2 / -1); distilled: it takes the step-size constant and runs the cfg-1 pipeline
CONFIG = MagiConfig(
    num_layers=4,
    hidden_size=256,
    ffn_hidden_size=1024,
    num_attention_heads=4,
    num_query_groups=2,
    kv_channels=64,
    caption_channels=tv.TEXT_WIDTH,
    caption_max_length=NULL_CAPTION_TOKENS + 2,
    distill=True,
)
#: latent frames per chunk: what MAGI-1 AR Sampler uses (``runtime/families/magi1/comfy_model.py`` CHUNK_FRAMES)
CHUNK_FRAMES = 6
LATENT_HW = 16
HELD_OUT_SEED0 = 1_000_000  # training videos use seeds below this
#: the special tokens the file carries (seeded unit Gaussians rounded to float16, as Sand AI ships its own in
#: float16): HQ and DURATION_1..8, what the MAGI-1 AR Sampler puts in front of every chunk's caption
SPECIAL_NAMES = ("HQ_TOKEN", *(f"DURATION_TOKEN_{i + 1}" for i in range(8)))
SPECIAL_SEED = 40_001
#: the sampler settings the checks use: 16 steps (the paper's, the sampler's default), key ranges 5, 4, 3, 2
STEPS = 16
#: a chunk's statistic over the data's, (low, high), for every statistic (see the module docstring). The data's own
#: chunks span std 0.79-1.24, motion 0.62-1.54, detail 0.69-1.49 of their prompt's mean (20 held-out videos x 16
#: chunks per prompt, seeds from 1,500,000); the bounds are about twice as wide around 1. Noise (an undenoised
#: chunk) is at std ~1.6, motion ~12-25, detail ~8-11.
BOUNDS = {"std": (0.6, 1.6), "motion": (0.4, 2.5), "detail": (0.5, 2.0)}


def special_tokens() -> dict[str, Tensor]:
    """{name: (4096,) float32} of the tokens the file carries (float16-rounded values)."""
    g = torch.Generator().manual_seed(SPECIAL_SEED)
    return {n: torch.randn(CONFIG.caption_channels, generator=g).half().float() for n in SPECIAL_NAMES}


def prompt_caption(prompt: int) -> Tensor:
    """The caption of a toy prompt: its fixed embedding, (8, 4096) (``toy_video.prompt_embedding``)."""
    return tv.prompt_embedding(prompt)[0]


def captions(prompt: int, chunks: int, special: dict[str, Tensor]) -> list[Tensor]:
    """One caption per chunk as the MAGI-1 AR Sampler builds them: ``[DURATION_k, HQ, prompt tokens]``."""
    return chunk_captions(prompt_caption(prompt), chunks, special, tokens=DEFAULT_TOKENS)


def settings(window: int, steps: int = STEPS) -> MagiSettings:
    return MagiSettings.distilled(num_steps=steps, window_size=window, chunk_width=CHUNK_FRAMES)


def forward_with_grad(model: MagiDiT, x: Tensor, spec: Forward, attention=None) -> Tensor:
    """``MagiDiT.forward_chunks`` without its ``no_grad`` (the same code, so training and sampling agree)."""
    return MagiDiT.forward_chunks.__wrapped__(model, x, spec, attention)


def load(path: Path | str = MODEL_PATH) -> tuple[MagiDiT, dict[str, Tensor]]:
    """(the DiT in float32, eval mode; its special tokens) from a tiny MAGI-1 file, read as the pack's loader reads
    it (``runtime.families.magi1.model.checkpoint.inspect_dit``: the ``magi1_config`` metadata, shapes checked)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing: the trained tiny MAGI-1 is committed under models/tiny_magi1 "
            "(or train it: python tools/train_tiny_magi1.py)"
        )
    ck = inspect_dit(path)
    model = MagiDiT(ck.config)
    sd = {k: v.float() for k, v in ck.state_dict().items()}
    model.load_state_dict(sd, strict=True)
    special = {k: v.float() for k, v in ck.special().items()}
    return model.eval(), special


def held_out(n: int) -> list[tuple[int, int]]:
    """(prompt, video seed) pairs of held-out videos, cycling through the prompts."""
    return [(i % len(tv.PROMPTS), HELD_OUT_SEED0 + i) for i in range(n)]


def rollout(
    model: MagiDiT,
    special: dict[str, Tensor],
    prompt: int,
    chunks: int,
    window: int,
    seed: int,
    steps: int = STEPS,
    attention=None,
) -> Tensor:
    """A text-to-video rollout of ``chunks`` chunks with the pack's MAGI-1 sampler (``runtime.families.magi1.model.sampler``; distilled,
    cfg 1, key ranges 5, 4, 3, 2): the latent (1, 16, chunks * 6, 16, 16). Noise: ``torch.randn`` after
    ``manual_seed(seed)``, as the MAGI-1 AR Sampler draws it."""
    noise = torch.randn(
        (1, CONFIG.latent_channels, chunks * CHUNK_FRAMES, LATENT_HW, LATENT_HW),
        generator=torch.Generator().manual_seed(seed),
    )
    x = noise
    for event in iter_sample(model, noise, captions(prompt, chunks, special), settings(window, steps), attention):
        x = event.latent
    return x


# ---------------------------------------------------------------------------------------------- statistics
def chunk_statistics(video: Tensor, chunk_frames: int = CHUNK_FRAMES) -> dict[str, Tensor]:
    """Per chunk of ``video`` ((16, T, H, W) or (1, 16, T, H, W)): ``std``, ``motion``, ``detail`` (module docstring)."""
    v = video.float().reshape(-1, *video.shape[-3:]) if video.ndim == 5 else video.float()
    c, frames = v.shape[:2]
    n = frames // chunk_frames
    out = {"std": [], "motion": [], "detail": []}
    lap_kernel = torch.tensor([[0.0, 1.0, 0.0], [1.0, -4.0, 1.0], [0.0, 1.0, 0.0]]).view(1, 1, 3, 3)
    for i in range(n):
        ch = v[:, i * chunk_frames : (i + 1) * chunk_frames]
        out["std"].append(ch.std())
        out["motion"].append((ch[:, 1:] - ch[:, :-1]).abs().mean())
        flat = ch.reshape(-1, 1, *ch.shape[-2:])
        lap = torch.nn.functional.conv2d(torch.nn.functional.pad(flat, (1, 1, 1, 1), mode="circular"), lap_kernel)
        out["detail"].append(lap.abs().mean())
    return {k: torch.stack(vals) for k, vals in out.items()}


def data_statistics(prompt: int, videos: int = 8, starts: tuple[int, ...] = (0, 60, 120)) -> dict[str, float]:
    """The mean of each statistic over chunks of held-out videos of ``prompt`` (seeds from 2,000,000)."""
    acc = {"std": [], "motion": [], "detail": []}
    for i in range(videos):
        scene = tv.make_scene(prompt, 2 * HELD_OUT_SEED0 + i, LATENT_HW, LATENT_HW)
        for s in starts:
            st = chunk_statistics(tv.render(scene, s, 2 * CHUNK_FRAMES))
            for k in acc:
                acc[k].append(st[k])
    return {k: float(torch.cat(v).mean()) for k, v in acc.items()}


@dataclass
class Stability:
    """Per chunk: each statistic's ratio to the data's; ``stable``: all finite and within :data:`BOUNDS`."""

    prompt: int
    window: int
    ratios: dict[str, list[float]]
    first_bad_chunk: int | None
    stable: bool
    values: dict[str, list[float]] = field(default_factory=dict)

    def line(self) -> str:
        def fmt(xs):
            return " ".join(f"{x:.2f}" for x in xs)

        verdict = "stable" if self.stable else f"UNSTABLE from chunk {self.first_bad_chunk}"
        return f"prompt {self.prompt} window {self.window}: {verdict}\n" + "\n".join(
            f"  {k:6s}/data: {fmt(v)}" for k, v in self.ratios.items()
        )


def stability(video: Tensor, prompt: int, window: int, data: dict[str, float] | None = None) -> Stability:
    """Each chunk of a rollout against the data's statistics for ``prompt`` (:data:`BOUNDS`)."""
    data = data_statistics(prompt) if data is None else data
    st = chunk_statistics(video)
    ratios = {k: (st[k] / data[k]).tolist() for k in st}
    chunks = len(ratios["std"])
    bad = None
    for i in range(chunks):
        for k, (lo, hi) in BOUNDS.items():
            r = ratios[k][i]
            if not (math.isfinite(r) and lo <= r <= hi):
                bad = i if bad is None else min(bad, i)
    return Stability(prompt, window, ratios, bad, bad is None, {k: v.tolist() for k, v in st.items()})


# ---------------------------------------------------------------------------------------------- one-step loss
@torch.no_grad()
def context_loss(
    model: MagiDiT,
    special: dict[str, Tensor],
    videos: list[tuple[int, int]],
    chunks: int = 16,
    context: int = 1,
    t_values: tuple[float, ...] = (0.05, 0.2, 0.5),
    other: bool = False,
    seed: int = 0,
) -> Tensor:
    """The one-step flow-matching loss per chunk position (``chunks``,) averaged over ``videos`` and ``t_values``:
    chunk ``c`` at time ``t`` (noise drawn once per video, position and t) after its ``context`` finished chunks
    (``min(c, context)``; the clean chunks as the sampler writes them: ``t = 0.9999``, the null caption, each
    attending to itself), reading them through its key range; the target is MAGI-1's velocity ``clean - noise``.
    ``other``: the context is taken from another held-out video of the same prompt (what the chunk can then not
    use), for the context dependence."""
    g = torch.Generator().manual_seed(seed)
    null = model.null_caption(NULL_CAPTION_TOKENS)
    n_tok = CHUNK_FRAMES * model.tokens_per_frame(LATENT_HW, LATENT_HW)
    dt = magi_pipeline.distill_dt(STEPS, 1.0)
    out = torch.zeros(chunks)
    for prompt, seed_v in videos:
        video = tv.render(tv.make_scene(prompt, seed_v, LATENT_HW, LATENT_HW), 0, chunks * CHUNK_FRAMES)
        ctx_video = video
        if other:
            ctx_video = tv.render(tv.make_scene(prompt, seed_v + 7_777, LATENT_HW, LATENT_HW), 0, chunks * CHUNK_FRAMES)
        caps = captions(prompt, chunks, special)
        for c in range(chunks):
            k = min(c, context)
            for t in t_values:
                clean = video[:, c * CHUNK_FRAMES : (c + 1) * CHUNK_FRAMES]
                eps = torch.randn(clean.shape, generator=g)
                noisy = t * clean + (1 - t) * eps
                ctx = ctx_video[:, (c - k) * CHUNK_FRAMES : c * CHUNK_FRAMES]
                ctx = 0.9999 * ctx + 0.0001 * torch.randn(ctx.shape, generator=g)
                x = torch.cat([ctx, noisy], dim=1)[None]
                ranges = tuple((j, j + 1) for j in range(k)) + ((0, k + 1),)
                spec = Forward(
                    t=torch.tensor([[0.9999] * k + [t]]),
                    captions=[null] * k + [caps[c]],
                    caption_dropped=torch.tensor([False]),
                    first_frame=(c - k) * CHUNK_FRAMES,
                    plan=ChunkPlan(n_tok, 0, ranges),
                    distill_dt=dt,
                )
                v = model.forward_chunks(x, spec)[0, :, k * CHUNK_FRAMES :]
                out[c] += (v - (clean - eps)).pow(2).mean() / (len(videos) * len(t_values))
    return out
