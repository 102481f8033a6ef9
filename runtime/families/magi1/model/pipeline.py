"""MAGI-1's chunk pipeline as pure functions: the time schedule, the sliding window of chunks in flight, the
per-chunk noise levels and key ranges, and the cfg scales (``inference/pipeline/video_generate.py`` and
``VideoDiTModel.forward_dispatcher`` of github:SandAI-org/MAGI-1 at 6ff822e).

Time ``t`` runs from 0 (noise) to 1 (clean); the model predicts a velocity ``v`` and a step is
``x += v * (t_next - t)`` (Euler). ``num_steps`` steps per chunk are spread over ``window_size`` stages
of ``num_steps / window_size`` forwards each; in one stage up to ``window_size`` chunks are denoised
together, each at its own noise level (the oldest is the cleanest). When a chunk is finished, the first
forward of the next stage carries it in front of the window at ``t = clean_t`` (0.9999) so that its keys
and values are written to the K/V buffer once; the forwards after that read them from the buffer.

A chunk's keys reach back ``noise2clean_kvrange[q]`` chunks, itself included, during the ``q``-th quarter
of its steps (default 5, 4, 3, 2: the paper's "window annealed from 5 to 2"), and the clean chunk's
``clean_chunk_kvrange`` (1: itself).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

#: the reference's defaults (``RuntimeConfig`` and ``example/*/*_config.json``)
NOISE2CLEAN_KVRANGE = (5, 4, 3, 2)
CFG_T_RANGE = (0.0, 0.0217, 0.1, 0.3, 0.999)
PREV_CHUNK_SCALES = (1.5, 1.5, 1.5, 1.0, 1.0)
TEXT_SCALES = (7.5, 7.5, 7.5, 0.0, 0.0)


def time_schedule(
    num_steps: int, schedule: str = "sd3", shift: float = 3.0, shortcut_mode: str = "8,16,16"
) -> torch.Tensor:
    """The ``num_steps + 1`` times of one chunk (float32, 0 -> 1): the reference's ``init_t``.

    ``sd3``: ``s = u**2`` then ``s / shift / (1 + (1 / shift - 1) s)`` on a uniform ``u``; ``square``: ``u**2``;
    ``identity``: ``u``. For 12 steps the grid is the distilled shortcut grid (``shortcut_mode``)."""
    if num_steps < 1:
        raise ValueError(f"num_steps {num_steps} must be at least 1")
    if num_steps == 12:
        base = torch.linspace(0, 1, 4 + 1) / 4
        accu = torch.linspace(0, 1, 4 + 1)
        base = base[:3] if shortcut_mode == "16,16,8" else torch.cat([base[:1], base[2:4]], dim=0)
        t = torch.cat([base + a for a in accu], dim=0)[: num_steps + 1]
    else:
        t = torch.linspace(0, 1, num_steps + 1)
    if schedule == "sd3":
        if shift < 1.0:
            raise ValueError(f"shift {shift} must be >= 1 (the reference asserts it)")
        t = t**2
        inv = 1.0 / shift
        t = inv * t / (1 + (inv - 1) * t)
    elif schedule == "square":
        t = t**2
    elif schedule != "identity":
        raise ValueError(f"schedule {schedule!r}: use 'sd3' (the reference's), 'square' or 'identity'")
    return t


def time_intervals(num_steps: int, shortcut_mode: str = "8,16,16") -> torch.Tensor:
    """The reference's ``init_intervel``: the distilled model's step sizes (in shortcut units) per forward of a stage."""
    if num_steps % 3 == 0:
        rep = num_steps // 3
        pattern = [1, 1, 2] if shortcut_mode == "16,16,8" else [2, 1, 1]
        return torch.tensor(pattern * rep)
    return torch.ones(num_steps)


def distill_dt(num_steps: int, interval: float) -> float:
    """The step-size constant the distilled model embeds next to ``t`` (``get_embedding_and_meta``)."""
    if num_steps == 12:
        return 4 / float(interval) * 2
    return num_steps / 4 * 2


def window_sequences(chunk_num: int, window_size: int, chunk_offset: int = 0):
    """Per stage: (chunk_start, chunk_end, t_start, t_end), the reference's ``generate_sequences``: chunks
    ``chunk_start .. chunk_end - 1`` are in flight, at window positions ``t_start .. t_end - 1`` (0: newest)."""
    if window_size < 1 or chunk_num < 1:
        raise ValueError(f"window_size {window_size} and chunk count {chunk_num} must be at least 1")
    end_index = chunk_num + window_size - 1
    stages = []
    for i in range(chunk_offset, end_index):
        cs = max(chunk_offset, i - window_size + 1)
        ce = min(chunk_num, i + 1)
        ts = max(0, i - chunk_num + 1)
        te = min(window_size, i - chunk_offset + 1) if i - chunk_offset < window_size else window_size
        stages.append((cs, ce, ts, te))
    return stages


@dataclass(frozen=True)
class Step:
    """One forward of the pipeline: which chunks, at which steps, with which keys."""

    index: int
    stage: int
    substep: int  # denoise_idx: the forward's index inside its stage
    chunk_start: int
    chunk_end: int
    t_start: int
    t_end: int
    clean_in_front: bool  # fwd_extra_1st_chunk: the finished chunk chunk_start - 1 rides in front at clean_t
    slice_point: int  # finished chunks before the forward's first chunk (read from the K/V buffer)
    steps_of_chunks: tuple[int, ...]  # per forward chunk, its denoising step (num_steps for the clean chunk)

    @property
    def chunks(self) -> int:
        return len(self.steps_of_chunks)


def steps_of(num_steps: int, window_size: int, chunk_num: int, chunk_offset: int = 0) -> list[Step]:
    """Every forward of a video of ``chunk_num`` chunks, in order (``SampleTransport.walk``)."""
    if num_steps % window_size:
        raise ValueError(
            f"num_steps {num_steps} is not a multiple of window_size {window_size}: each chunk spends "
            f"num_steps / window_size forwards in each window position; pick a window that divides {num_steps}"
        )
    per_stage = num_steps // window_size
    seqs = window_sequences(chunk_num, window_size, chunk_offset)
    out = []
    for index in range(per_stage * (chunk_num + window_size - 1 - chunk_offset)):
        stage, sub = divmod(index, per_stage)
        cs, ce, ts, te = seqs[stage]
        extra = cs > chunk_offset and sub == 0
        steps = [i * per_stage + sub for i in range(ts, te)][::-1]
        if extra:
            steps = [num_steps, *steps]
        out.append(Step(index, stage, sub, cs, ce, ts, te, extra, cs - 1 if extra else cs, tuple(steps)))
    return out


def chunk_times(ts: torch.Tensor, step: Step, clean_t: float = 0.9999) -> torch.Tensor:
    """t of every chunk of the forward, the clean chunk in front at ``clean_t`` (the reference's ``get_timestep``)."""
    noisy = [ts[s] for s in step.steps_of_chunks[int(step.clean_in_front) :]]
    if step.clean_in_front:
        noisy = [torch.tensor(clean_t, dtype=ts.dtype), *noisy]
    return torch.stack(noisy)


def noisy_times(ts: torch.Tensor, step: Step, after: bool = False) -> torch.Tensor:
    """t of the forward's in-flight chunks before (``after``: after) its Euler step."""
    return torch.stack([ts[s + int(after)] for s in step.steps_of_chunks[int(step.clean_in_front) :]])


def key_ranges(
    slice_point: int,
    steps_of_chunks: tuple[int, ...],
    num_steps: int,
    noise2clean_kvrange: tuple[int, ...] = NOISE2CLEAN_KVRANGE,
    clean_chunk_kvrange: int = 1,
) -> tuple[tuple[int, int], ...]:
    """Per chunk of the forward, the absolute chunks ``(start, end)`` its queries read (the reference's
    ``generate_kvrange_for_denoising_video``, in chunks instead of tokens). ``noise2clean_kvrange`` empty: every
    chunk reads all chunks up to itself."""
    out = []
    if not noise2clean_kvrange:
        return tuple((0, slice_point + j + 1) for j in range(len(steps_of_chunks)))
    if num_steps % len(noise2clean_kvrange):
        raise ValueError(
            f"num_steps {num_steps} does not split into the {len(noise2clean_kvrange)} stages of "
            f"noise2clean_kvrange {list(noise2clean_kvrange)}"
        )
    if clean_chunk_kvrange == -1:
        clean_chunk_kvrange = noise2clean_kvrange[-1]
    per = num_steps // len(noise2clean_kvrange)
    for j, s in enumerate(steps_of_chunks):
        r = clean_chunk_kvrange if s == num_steps else noise2clean_kvrange[s // per]
        end = slice_point + j + 1
        out.append((max(0, end - r), end))
    return tuple(out)


def cfg_scales(t: torch.Tensor, cfg_t_range=CFG_T_RANGE, prev_chunk_scales=PREV_CHUNK_SCALES, text_scales=TEXT_SCALES):
    """(prev_chunk_scale, text_scale) for a chunk at time ``t`` (the reference's ``get_cfg_scale``)."""
    rng = torch.tensor(cfg_t_range, dtype=torch.float32)
    if not (len(rng) == len(prev_chunk_scales) == len(text_scales)):
        raise ValueError("cfg_t_range, prev_chunk_scales and text_scales must have the same length")
    i = int(torch.searchsorted(rng - 1e-7, t.float().reshape(1)).item()) - 1
    if not 0 <= i < len(prev_chunk_scales):
        raise ValueError(f"t {float(t)} lies outside cfg_t_range {list(cfg_t_range)}")
    return float(prev_chunk_scales[i]), float(text_scales[i])


def finished_chunks_reached(window_size: int, noise2clean_kvrange=NOISE2CLEAN_KVRANGE) -> int:
    """The most finished (no longer in flight) chunks any query reads at this window: what a cache of finished
    chunks must hold. At window 4 with 5..2 it is 1; at window 1 it is 4."""
    most = 0
    stages = len(noise2clean_kvrange)
    for pos in range(window_size):  # window position, 0 = newest
        # the quarters a chunk spends at window position ``pos`` (a stage is num_steps / window_size steps)
        first_q = math.floor(pos * stages / window_size)
        last_q = math.ceil((pos + 1) * stages / window_size) - 1
        for q in range(first_q, last_q + 1):
            older_in_window = window_size - 1 - pos
            most = max(most, noise2clean_kvrange[q] - 1 - older_in_window)
    return max(most, 0)
