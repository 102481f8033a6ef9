"""MAGI-1's multi-noise chunk sampler, as the reference runs it (``SampleTransport`` of ``video_generate.py``
and ``VideoDiTModel.forward_dispatcher`` / ``forward_3cfg``), over an injectable attention (:mod:`runtime.families.magi1.model.attention`).

What one forward does (:func:`runtime.families.magi1.model.pipeline.steps_of` lists them):

- the chunks in flight (up to ``window_size``), each at its own time, with the finished chunk in front at
  ``clean_t`` on the first forward of a stage (its caption: the null caption), whose K/V that forward writes;
- ``cfg_number`` 1 (distilled models): one conditional pass; once the oldest in-flight chunk is past
  ``nearly_clean_threshold`` (t > 0.3) a copy of it rides at the end attending to itself only, and its
  velocity becomes ``0.7 v + 0.3 v_self`` (the reference's ``prev_chunks_scale``);
- ``cfg_number`` 3 (base models): the text pass (caption, AdaLN token "kept"), the context pass (null caption,
  AdaLN token "dropped"; it is the one that writes the K/V buffer) and the unconditional pass (each chunk
  alone, null caption, RoPE time from 0, no buffer), blended per chunk by :func:`runtime.families.magi1.model.pipeline.cfg_scales`:
  ``(1 - p) v_uncond + (p - s) v_context + s v_text``.

``attention`` defaults to :class:`runtime.families.magi1.model.attention.FullPrecisionKV` (every finished chunk kept in full
precision, as the reference's whole-video buffer). Text-to-video only (no prefix video).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from . import pipeline as P
from .attention import ChunkPlan, FullPrecisionKV
from .dit import Forward

NULL_CAPTION_TOKENS = 50


@dataclass(frozen=True)
class MagiSettings:
    """The reference's ``runtime_config`` / ``engine_config`` fields the sampler uses."""

    num_steps: int = 64
    window_size: int = 4
    chunk_width: int = 6
    noise2clean_kvrange: tuple[int, ...] = P.NOISE2CLEAN_KVRANGE
    clean_chunk_kvrange: int = 1
    clean_t: float = 0.9999
    cfg_number: int = 1
    cfg_t_range: tuple[float, ...] = P.CFG_T_RANGE
    prev_chunk_scales: tuple[float, ...] = P.PREV_CHUNK_SCALES
    text_scales: tuple[float, ...] = P.TEXT_SCALES
    distill: bool = True
    nearly_clean_threshold: float = 0.3
    nearly_clean_scale: float = 0.7
    shortcut_mode: str = "8,16,16"
    schedule: str = "sd3"
    shift: float = 3.0

    def __post_init__(self) -> None:
        if self.cfg_number not in (1, 3):
            raise ValueError(f"cfg_number {self.cfg_number}: MAGI-1 runs 1 (distilled) or 3 (base)")
        if self.chunk_width < 1:
            raise ValueError(f"chunk_width {self.chunk_width} must be at least 1 latent frame")
        if self.num_steps % self.window_size:
            raise ValueError(
                f"num_steps {self.num_steps} is not a multiple of window_size {self.window_size}; "
                f"pick a window in {[w for w in range(1, 9) if self.num_steps % w == 0]}"
            )
        if self.noise2clean_kvrange and (
            self.num_steps % len(self.noise2clean_kvrange) or min(self.noise2clean_kvrange) < 1
        ):
            raise ValueError(
                f"noise2clean_kvrange {list(self.noise2clean_kvrange)} must hold positive chunk counts and split "
                f"num_steps {self.num_steps} evenly"
            )

    @classmethod
    def base(cls, **kw) -> MagiSettings:
        """``example/4.5B/4.5B_base_config.json``: 64 steps, cfg 3, no distill."""
        return cls(**{"num_steps": 64, "cfg_number": 3, "distill": False, **kw})

    @classmethod
    def distilled(cls, **kw) -> MagiSettings:
        """``example/4.5B/4.5B_distill_config.json`` (64 steps; the 24B distill config and the paper use 16)."""
        return cls(**{"num_steps": 64, "cfg_number": 1, "distill": True, **kw})


@dataclass
class SampleEvent:
    """What :func:`iter_sample` reports after each forward (``finished``: the chunk that became clean, if one)."""

    step: int
    total: int
    finished: int | None = None
    latent: Tensor | None = None


@dataclass
class _Run:
    dit: object
    settings: MagiSettings
    captions: list[Tensor]
    null: Tensor
    attention: Callable
    chunk_tokens: int
    ts: Tensor
    intervals: Tensor


def _forward(run: _Run, x: Tensor, t: Tensor, captions: Sequence[Tensor], dropped: bool, first_frame: int, plan, dt):
    spec = Forward(
        t=t.reshape(x.shape[0], -1),
        captions=list(captions),
        caption_dropped=torch.tensor([dropped]),
        first_frame=first_frame,
        plan=plan,
        distill_dt=dt,
    )
    return run.dit.forward_chunks(x, spec, run.attention)


def _velocity(run: _Run, x: Tensor, step: P.Step) -> Tensor:
    """The velocity of the forward's in-flight chunks (the clean chunk in front removed)."""
    s = run.settings
    cw = s.chunk_width
    cs, ce = step.chunk_start, step.chunk_end
    x_chunk = x[:, :, cs * cw : ce * cw]
    caps = list(run.captions[cs:ce])
    if step.clean_in_front:
        x_chunk = torch.cat([x[:, :, (cs - 1) * cw : cs * cw], x_chunk], dim=2)
        caps = [run.null, *caps]
    t = P.chunk_times(run.ts, step, s.clean_t)
    ranges = P.key_ranges(
        step.slice_point, step.steps_of_chunks, s.num_steps, s.noise2clean_kvrange, s.clean_chunk_kvrange
    )
    store = ((0, step.slice_point),) if step.clean_in_front else ()
    first_frame = step.slice_point * cw
    lead = int(step.clean_in_front)
    nearly_clean = float(t[lead]) > s.nearly_clean_threshold
    dt = P.distill_dt(s.num_steps, float(run.intervals[step.substep])) if s.distill else None
    n = run.chunk_tokens
    if s.cfg_number == 1:
        if nearly_clean:
            extra = x_chunk[:, :, lead * cw : (lead + 1) * cw]
            total = step.slice_point + step.chunks
            plan = ChunkPlan(n, step.slice_point, (*ranges, (total, total + 1)), store)
            out = _forward(
                run,
                torch.cat([x_chunk, extra], dim=2),
                torch.cat([t, t[lead : lead + 1]]),
                [*caps, caps[lead]],
                False,
                first_frame,
                plan,
                dt,
            )
            near = out[:, :, lead * cw : (lead + 1) * cw] * s.nearly_clean_scale + out[:, :, -cw:] * (
                1 - s.nearly_clean_scale
            )
            out = torch.cat([out[:, :, : lead * cw], near, out[:, :, (lead + 1) * cw : -cw]], dim=2)
        else:
            out = _forward(run, x_chunk, t, caps, False, first_frame, ChunkPlan(n, step.slice_point, ranges, store), dt)
        return out[:, :, lead * cw :]
    # cfg 3: text pass (reads the buffer), context pass (reads and writes it), unconditional pass (no buffer)
    null_caps = [run.null] * len(caps)
    v_text = _forward(run, x_chunk, t, caps, False, first_frame, ChunkPlan(n, step.slice_point, ranges), dt)
    v_ctx = _forward(run, x_chunk, t, null_caps, True, first_frame, ChunkPlan(n, step.slice_point, ranges, store), dt)
    noisy = step.chunks - lead
    x_noisy = x_chunk[:, :, lead * cw :]
    batch = x_noisy.reshape(x_noisy.shape[0], x_noisy.shape[1], noisy, cw, *x_noisy.shape[3:])
    batch = batch.squeeze(0).transpose(0, 1)  # (chunks, C, cw, H, W)
    t_noisy = t[lead:]
    v_unc = _forward(run, batch, t_noisy.reshape(noisy, 1), [run.null] * noisy, True, 0, ChunkPlan.self_only(n, 1), dt)
    v_unc = v_unc.transpose(0, 1).reshape(1, v_unc.shape[1], noisy * cw, *v_unc.shape[3:])
    outs = []
    for j in range(noisy):
        p, txt = P.cfg_scales(t_noisy[j], s.cfg_t_range, s.prev_chunk_scales, s.text_scales)
        sl = slice((lead + j) * cw, (lead + j + 1) * cw)
        outs.append((1 - p) * v_unc[:, :, j * cw : (j + 1) * cw] + (p - txt) * v_ctx[:, :, sl] + txt * v_text[:, :, sl])
    return torch.cat(outs, dim=2)


def iter_sample(
    dit,
    noise: Tensor,
    captions: Sequence[Tensor],
    settings: MagiSettings,
    attention: Callable | None = None,
    null_caption: Tensor | None = None,
) -> Iterator[SampleEvent]:
    """Denoise ``noise`` (1, C, chunks * chunk_width, H, W) with MAGI-1's pipeline; one event per forward.

    ``captions``: one caption embedding per chunk, (tokens, caption_channels), valid tokens only and special
    tokens already in front (:func:`runtime.families.magi1.model.caption.chunk_captions`); ``null_caption``: the negative / clean-chunk
    caption (default: the model's ``null_caption_embedding[:50]``). The latent is denoised in place of a copy;
    the last event's ``latent`` is the result."""
    s = settings
    if noise.ndim != 5 or noise.shape[0] != 1:
        raise ValueError(f"noise has shape {tuple(noise.shape)}; expected (1, C, frames, H, W)")
    frames = noise.shape[2]
    if frames % s.chunk_width:
        raise ValueError(f"{frames} latent frames are not whole chunks of {s.chunk_width}")
    chunk_num = frames // s.chunk_width
    if len(captions) != chunk_num:
        raise ValueError(f"{len(captions)} captions for {chunk_num} chunks (one per chunk)")
    cfg = dit.config
    if s.distill != cfg.distill:
        raise ValueError(
            f"settings.distill={s.distill} but the model is a {'distilled' if cfg.distill else 'base'} MAGI-1; "
            f"use MagiSettings.{'distilled' if cfg.distill else 'base'}()"
        )
    h, w = noise.shape[-2:]
    chunk_tokens = s.chunk_width // cfg.t_patch_size * dit.tokens_per_frame(h, w)
    null = dit.null_caption(NULL_CAPTION_TOKENS) if null_caption is None else null_caption
    run = _Run(
        dit=dit,
        settings=s,
        captions=list(captions),
        null=null,
        attention=FullPrecisionKV() if attention is None else attention,
        chunk_tokens=chunk_tokens,
        ts=P.time_schedule(s.num_steps, s.schedule, s.shift, s.shortcut_mode).to(noise.device),
        intervals=P.time_intervals(s.num_steps, s.shortcut_mode),
    )
    x = noise.clone().float()
    counts = [0] * chunk_num
    steps = P.steps_of(s.num_steps, s.window_size, chunk_num)
    cw = s.chunk_width
    for step in steps:
        v = _velocity(run, x, step)
        dt = (P.noisy_times(run.ts, step, after=True) - P.noisy_times(run.ts, step)).to(x.device)
        cs, ce = step.chunk_start, step.chunk_end
        chunk = x[:, :, cs * cw : ce * cw].reshape(1, x.shape[1], ce - cs, cw, h, w)
        vel = v.reshape(1, x.shape[1], ce - cs, cw, h, w)
        chunk = chunk + vel * dt.reshape(1, 1, -1, 1, 1, 1)
        x[:, :, cs * cw : ce * cw] = chunk.reshape(1, x.shape[1], (ce - cs) * cw, h, w)
        finished = None
        for c in range(cs, ce):
            counts[c] += 1
        if counts[cs] == s.num_steps:
            finished = cs
        yield SampleEvent(step.index, len(steps), finished, x)


def sample(
    dit,
    noise: Tensor,
    captions: Sequence[Tensor],
    settings: MagiSettings,
    attention=None,
    null_caption=None,
    callback=None,
) -> Tensor:
    """The denoised latent of :func:`iter_sample`; ``callback(event)`` after each forward (raise to stop)."""
    x = noise
    for event in iter_sample(dit, noise, captions, settings, attention, null_caption):
        x = event.latent
        if callback is not None:
            callback(event)
    return x


__all__ = ["MagiSettings", "SampleEvent", "iter_sample", "sample"]
