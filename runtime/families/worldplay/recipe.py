"""HY-WorldPlay's recipe: the reference's AR rollout on ComfyUI's sampler, with the pack's quantized store.

What the reference (Tencent-Hunyuan/HY-WorldPlay ``worldplay_video_pipeline.py``, ``ar_rollout``) does, and where it
happens here (:class:`WorldPlayRecipe`, hook-shaped methods):

- chunks of 4 latent frames (``chunk_latent_frames``), each denoised with 4 Euler steps at shift 5, cfg 1 (the AR
  distilled model): here ComfyUI's own SAMPLER and SIGMAS (``AR Video Schedule`` ``worldplay_4step``), one
  ``comfy.sample.sample_custom`` per chunk, with progress bar, latent previews and interrupts;
- the prompt runs once, alone, at ``t = 0`` and is kept apart as a K/V prefix of every block: here the route
  computes it at the first model call (:meth:`prefill` says so) and every vision call attends it as **context
  tokens in full precision, never stored in the chunk cache and never corrected** (its K/V are the prompt's, the
  same at every chunk; quantizing them is measured in ``benchmarks/worldplay_memory.py`` and docs/worldplay.md);
- :meth:`before_chunk` (the reference's "reconstituted context memory", every chunk but the first): the cache is
  emptied and rebuilt from up to 20 context frames (``runtime.families.worldplay.model.context.plan_chunk``: chunk 0, the older chunk
  whose views overlap the new chunk's most, the last 3 chunks), re-encoded in **one bidirectional forward** at
  ``t = 14`` with their RoPE time positions renumbered ``0 .. N - 1``; here that forward writes each context
  chunk (4 frames) as its own cache entry of every (block, stream) layer, quantized as the MODEL's Quantize KV
  Cache says (full precision without it). The view-overlap sample points are drawn from the run's seed (the
  reference draws them from torch's global generator, unseeded);
- the chunk being generated sits at RoPE positions ``N .. N + 3`` and is never written (:meth:`write` is a no-op:
  the next chunk's re-encode reads its latents);
- the image condition of every call is its own frames' (the model's ``concat_cond`` cuts the conditioning's
  ``concat_latent_image`` / ``concat_mask`` to the call's ``worldplay_frames``; the re-encode's calls carry the
  context frames, so the start image reaches them through chunk 0, as in the reference).

:meth:`WorldPlayRecipe.check` refuses what the recipe cannot do, by name: a window or sink (the context is rebuilt
before every chunk), cfg other than 1, saving or continuing a KV cache, a prompt schedule, KV Cache Diagnostics.
Without the pack's patch nodes on the MODEL the cache is full precision: the A/B baseline, equal to the model's own
forward with the reference's full-precision memory (``runtime.families.worldplay.model.attention.ContextKV``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from ....jensen_core.planner import plan_cache
from ...config import JensenKVConfig, get_config, get_window
from ...noise import NOISE_STREAM, SAMPLER_STREAM, chunk_seed
from ...options import (
    SHARED_GROUPS,
    Chunking,
    Continuation,
    Hooks,
    OptionGroups,
    Sampling,
    check_one_entry,
    grouped,
    refuse_set,
)
from ...report import MIB
from ...report import report_text as _base_report_text
from ...run_caches import RunCaches
from ...saved_run import RetainedChunk
from ...session import Session, interrupted
from ...shift_observer import get_request as get_diagnostics_request
from ..base import UnsupportedModelError, attention_override_notice
from .comfy_model import FRAMES_COND, TRAJECTORY_COND
from .family import CONTEXT_CHUNKS, SAMPLER_NODE, SUPPORTED, WorldPlayFamily
from .model.context import CONTEXT_TIMESTEP, MEMORY_FRAMES, ContextPlan, plan_chunk, sphere_points
from .model.trajectory import CHUNK_LATENTS, Trajectory

logger = logging.getLogger("jensen_kv")


@dataclass(frozen=True, eq=False)
class WorldPlayOptions:
    """What HY-WorldPlay's recipe reads besides the shared options: the camera path (``trajectory``, from HY-WorldPlay
    Trajectory) and ``noise``, the whole video's initial noise (None: each chunk draws its own from the seed and its
    index, as the Chunked AR sampler does)."""

    trajectory: Trajectory
    noise: torch.Tensor | None = None


#: the flat options of :meth:`WorldPlayRequest.from_options`, by group (the shared four and HY-WorldPlay's own)
OPTION_GROUPS: OptionGroups = {**SHARED_GROUPS, "options": (WorldPlayOptions, ("trajectory", "noise"))}


@dataclass(frozen=True, eq=False)
class WorldPlayRequest:
    """One HY-WorldPlay run: the MODEL, its prompt (one CONDITIONING entry, with the image condition of
    HunyuanVideo15ImageToVideo), the LATENT to fill, and the option groups: ``sampling`` (seed, cfg, SAMPLER and
    SIGMAS), ``chunking`` (the chunk of 4 latent frames; no window or sink), ``continuation`` (nothing to continue or
    hand on), ``hooks`` (``observer`` sees every attention call, ``step_callback(chunk, step, steps)`` runs after every
    denoising step, ``progress`` / ``preview`` drive ComfyUI's progress bar and latent previews) and HY-WorldPlay's
    own :class:`WorldPlayOptions` (the camera path, the noise). What the recipe cannot do with the shared values is
    refused by :meth:`WorldPlayRecipe.check` with the reason; :meth:`from_options` takes the node's inputs and flat
    names."""

    model: Any
    positive: Any
    latent: dict
    sampling: Sampling
    options: WorldPlayOptions
    chunking: Chunking = field(default_factory=lambda: Chunking(CHUNK_LATENTS))
    continuation: Continuation = field(default_factory=Continuation)
    hooks: Hooks = field(default_factory=Hooks)

    @classmethod
    def from_options(cls, model, positive, latent, trajectory, seed, sampler, sigmas, **options) -> WorldPlayRequest:
        """The request of HY-WorldPlay AR Sampler's inputs and flat keyword options (``cfg=..., noise=...,
        progress=...``: the names of :data:`OPTION_GROUPS`), each put into its group."""
        given = dict(trajectory=trajectory, seed=seed, sampler=sampler, sigmas=sigmas, **options)
        return cls(
            model, positive, latent, **grouped(OPTION_GROUPS, given, "HY-WorldPlay", {"chunk_frames": CHUNK_LATENTS})
        )

    @property
    def samples(self) -> torch.Tensor:
        return self.latent["samples"]


@dataclass
class WorldPlayResult:
    """The video latent, the report, per-chunk timings and each chunk's context plan."""

    samples: torch.Tensor
    report: dict
    seconds_per_chunk: list[float] = field(default_factory=list)
    plans: list[ContextPlan] = field(default_factory=list)
    cache_bytes_after_write: list[int] = field(default_factory=list)


def detect(model_patcher) -> WorldPlayFamily:
    """The WorldPlay adapter of ``model_patcher``, or an :class:`UnsupportedModelError` that says why not."""
    found = WorldPlayFamily.probe(model_patcher)
    if found.supported:
        return WorldPlayFamily(model_patcher)
    base = getattr(model_patcher, "model", None)
    what = f"{type(base).__name__} ({type(getattr(base, 'diffusion_model', None)).__name__})"
    if found.applies:
        raise UnsupportedModelError(f"{SAMPLER_NODE} supports {SUPPORTED}. This MODEL ({what}) {found.problem}.")
    raise UnsupportedModelError(
        f"{SAMPLER_NODE} supports {SUPPORTED}. This MODEL ({what}) is not HY-WorldPlay: load HY-WorldPlay's "
        "checkpoint with Load HY-WorldPlay (Wan 2.1 models go to the Chunked AR Video Sampler)."
    )


def _reencode(model, x, sigmas, extra_args=None, callback=None, disable=None):
    """A 'sampler' that runs the model once on the clean latent (the sampler's ``latent_image``) at ``sigmas[0]``
    (the route gives the call its exact timestep): the context re-encode. Returns x."""
    extra_args = {} if extra_args is None else extra_args
    clean = model.latent_image
    with torch.no_grad():
        model(clean, sigmas[0] * clean.new_ones([clean.shape[0]]), **extra_args)
    return x


class WorldPlayRecipe:
    """One HY-WorldPlay run in flight: the patched clone, its caches, the video so far and the records.

    Hook-shaped: :meth:`prefill`, :meth:`before_chunk` (the reconstitute), :meth:`write`, :meth:`on_prompt_switch`;
    :meth:`check` refuses what the recipe cannot do; :meth:`run` owns the loop."""

    name = "worldplay"

    # ------------------------------------------------------------------ what it can do
    @staticmethod
    def check(r: WorldPlayRequest) -> None:
        """ValueError naming the value and the fix for everything this recipe cannot do (no model call needed)."""
        latent = r.latent
        if not isinstance(latent, dict) or "samples" not in latent:
            raise ValueError("latent must be a LATENT (a dict with 'samples'), e.g. from HunyuanVideo15ImageToVideo")
        if latent.get("noise_mask") is not None:
            raise ValueError(f"the latent carries a noise_mask (inpainting); {SAMPLER_NODE} does not support masks")
        path = r.options.trajectory
        if not isinstance(path, Trajectory):
            raise ValueError(
                f"trajectory must come from HY-WorldPlay Trajectory, got {type(path).__name__}: connect that node's "
                "trajectory output"
            )
        sigmas = r.sampling.sigmas
        if not isinstance(sigmas, torch.Tensor) or sigmas.ndim != 1 or sigmas.numel() < 2:
            raise ValueError(
                "SIGMAS must be a 1-D schedule with at least 2 values (one step), e.g. AR Video Schedule "
                "worldplay_4step"
            )
        if not torch.isfinite(sigmas).all():
            raise ValueError(f"SIGMAS contains NaN or Inf values: {sigmas.tolist()}")
        frames = r.samples.shape[2] if r.samples.ndim == 5 else None
        if frames is None or frames % CHUNK_LATENTS or frames < CHUNK_LATENTS:
            raise ValueError(
                f"the latent has {frames} latent frames; HY-WorldPlay generates chunks of {CHUNK_LATENTS}, so it needs "
                f"a multiple of {CHUNK_LATENTS} (125 video frames = 32 latents): give HunyuanVideo15ImageToVideo the "
                "trajectory's length output"
            )
        if frames > path.latents:
            raise ValueError(
                f"the latent has {frames} latent frames but the trajectory only {path.latents} poses: give "
                f"HunyuanVideo15ImageToVideo the trajectory's length ({path.frames}) or a longer path"
            )
        if r.options.noise is not None and tuple(r.options.noise.shape) != tuple(r.samples.shape):
            raise ValueError(
                f"noise {tuple(r.options.noise.shape)} must have the latent's shape {tuple(r.samples.shape)}"
            )
        WorldPlayRecipe._check_settings(r)

    @staticmethod
    def _check_settings(r: WorldPlayRequest) -> None:
        """The settings the reference's loop fixes (window, sink, cfg, chunk, prefix, saved caches, one prompt)."""
        ch = r.chunking
        refuse_set(
            f"HY-WorldPlay rebuilds its cache before every chunk from up to {MEMORY_FRAMES} context frames it chooses "
            "by view overlap (chunk 0, the best-overlapping older chunk, the last 3), so a window or an attention sink "
            "does not apply: set both to 0",
            (f"window_chunks={ch.window_chunks}", ch.window_chunks != 0),
            (f"sink_chunks={ch.sink_chunks}", ch.sink_chunks != 0),
        )
        r.sampling.require_cfg_one(
            f"HY-WorldPlay's AR distilled model samples at cfg 1 (the reference's few-step run), and {SAMPLER_NODE} "
            "keeps one cache branch"
        )
        if ch.chunk_frames != CHUNK_LATENTS or ch.first_chunk_frames:
            raise ValueError(
                f"chunk_frames={ch.chunk_frames}, first_chunk_frames={ch.first_chunk_frames}: "
                f"HY-WorldPlay generates every chunk as {CHUNK_LATENTS} latent frames (the reference's "
                "chunk_latent_frames): leave both unset"
            )
        r.continuation.refuse(
            prefix=f"{SAMPLER_NODE} starts from the image of its conditioning (HunyuanVideo15ImageToVideo), not from a "
            "clip to extend",
            state="HY-WorldPlay re-encodes its context from the video's latents before every chunk, so there is no "
            "cache to hand on",
        )
        check_one_entry(
            r.positive,
            "positive",
            "HY-WorldPlay computes one text prefix per video from one prompt: give one entry (merge several with "
            "ConditioningConcat); prompt schedules are not supported",
        )

    # ------------------------------------------------------------------ set-up
    def __init__(self, r: WorldPlayRequest):
        import comfy.samplers

        self.check(r)
        self.r = r
        model = r.model
        self.adapter = detect(model)
        self.adapter.check_latent(r.samples)
        notice = attention_override_notice(model.model_options)
        if notice is not None:
            logger.warning("jensen_kv: %s", notice)
        if get_diagnostics_request(model.model_options) is not None:
            raise ValueError(
                "KV Cache Diagnostics follows chunks written once; HY-WorldPlay rebuilds its cache before every chunk: "
                "remove KV Cache Diagnostics (benchmarks/worldplay_memory.py measures the attention shift)"
            )
        if get_window(model.model_options) is not None:
            raise ValueError(
                "the MODEL carries an AR Cache Window (for ComfyUI's SamplerARVideo); HY-WorldPlay chooses its context "
                "itself: remove AR Cache Window"
            )
        self.config = get_config(model.model_options) or JensenKVConfig()
        self.config.check_head_dim(self.adapter.head_dim)
        self.latent_image = _fix_channels(model, r.samples)
        b, _, frames, h, w = self.latent_image.shape
        self.frames = frames
        self.chunks = frames // CHUNK_LATENTS
        self.w2c = r.options.trajectory.w2c[:frames]
        self.points = sphere_points(seed=int(r.sampling.seed))
        self.steps = r.sampling.sigmas.numel() - 1
        self.tokens_per_frame = self.adapter.tokens_per_frame(tuple(self.latent_image.shape))
        self.run = RunCaches(
            self.config,
            CONTEXT_CHUNKS,
            self.adapter.num_layers,
            observer=r.hooks.observer,
            tokens_per_frame=self.tokens_per_frame,
        )
        self.reencode_sampler = comfy.samplers.KSAMPLER(_reencode)
        # the re-encode's sigma (flow matching: t = 1000 sigma); the route gives the call t = 14 exactly
        self.context_sigmas = torch.tensor([CONTEXT_TIMESTEP / 1000.0, 0.0])
        self.planned_bytes = self._planned_bytes()
        self.session = Session(
            model, self.adapter, self.run, self.config, planned_bytes=self.planned_bytes,
            steps=self.chunks * self.steps, progress=r.hooks.progress, preview=r.hooks.preview,
        )  # fmt: skip
        self.work = self.session.work
        self.out = self.latent_image.clone()
        self.plans: list[ContextPlan] = []
        self.seconds: list[float] = []
        self.batch_inds = r.latent.get("batch_index")
        self.text_bytes = 0
        self.text_tokens = 0

    def _planned_bytes(self) -> int:
        """The planner's peak for this run, under the family's planner rule: up to 5 context chunks of 4 frames, every
        (block, stream) layer."""
        li = self.latent_image
        chunking, _ = self.adapter.plan_chunks(Chunking(CHUNK_LATENTS), self.frames)
        plan = plan_cache(
            latent_frames=self.frames,
            latent_height=li.shape[3],
            latent_width=li.shape[4],
            chunk_frames=chunking.chunk_frames,
            window_chunks=chunking.window_chunks,
            sink_chunks=chunking.sink_chunks,
            shape=self.adapter.cache_shape().for_run(
                cfg_branches=1, batch=li.shape[0], full_bytes=torch.finfo(self.r.model.model_dtype()).bits // 8
            ),
            precision=self.config.precision,
        )
        return plan.quantized_bytes or 0

    def _conditioning(self, frames) -> list:
        """The prompt with the camera path and the call's absolute latent frames (its image condition's frames)."""
        (entry,) = self.r.positive
        extra = {TRAJECTORY_COND: self.r.options.trajectory, FRAMES_COND: tuple(int(f) for f in frames)}
        return [[entry[0], {**entry[1], **extra}]]

    # ------------------------------------------------------------------ hooks
    def prefill(self) -> None:
        """Nothing is written before the first chunk: WorldPlay has no prefix clip, and the prompt's K/V (its text
        prefix) are computed by the route at the first model call, once per prompt (``on_prompt_switch``)."""

    def on_prompt_switch(self) -> None:
        """A new prompt: its text prefix is computed again at the next call. (One prompt per video today: check()
        refuses a schedule.)"""
        self.adapter.route.clear_text()

    def before_chunk(self, c: int) -> ContextPlan:
        """The reconstitute: empty the cache and rebuild it from chunk ``c``'s context frames, re-encoded in one
        bidirectional forward at t = 14 with RoPE positions 0 .. N - 1; each context chunk becomes its own entry."""
        plan = plan_chunk(self.w2c, c, self.points)
        self.plans.append(plan)
        self.run.empty()
        frames = plan.context_frames
        if not frames:
            return plan
        interrupted()
        spans = []
        for i in range(0, len(frames), CHUNK_LATENTS):
            group = frames[i : i + CHUNK_LATENTS]
            if (
                len(group) != CHUNK_LATENTS
                or group[0] % CHUNK_LATENTS
                or list(group) != list(range(group[0], group[0] + CHUNK_LATENTS))
            ):
                raise RuntimeError(f"context frames {frames} are not whole chunks of {CHUNK_LATENTS} (a bug)")
            spans.append((group[0] // CHUNK_LATENTS, i, CHUNK_LATENTS))
        import comfy.sample

        clean = self.out[:, :, list(frames)]
        cond = self._conditioning(frames)

        def reencode() -> None:
            self.adapter.route.set_call(plan.context_positions, CONTEXT_TIMESTEP)
            comfy.sample.sample_custom(
                self.work,
                torch.zeros_like(clean),
                1.0,
                self.reencode_sampler,
                self.context_sigmas,
                cond,
                cond,
                clean,
                disable_pbar=True,
                seed=chunk_seed(self.r.sampling.seed, c, SAMPLER_STREAM),
            )

        # each context chunk its own entry, at its place in the context (RoPE positions 0 .. N - 1)
        self.run.joint_write([RetainedChunk(ci, i, clean[:, :, i : i + n]) for ci, i, n in spans], reencode)
        return plan

    def write(self, c: int) -> None:
        """Nothing: the chunk just made is never written; the next chunk's re-encode reads its latents."""

    def chunk(self, c: int) -> None:
        """Chunk ``c``: rebuild the context, then denoise frames ``4c .. 4c + 3`` at RoPE positions ``N .. N + 3``."""
        import comfy.sample

        r = self.r
        interrupted()
        t0 = time.perf_counter()
        plan = self.before_chunk(c)
        f0, f1 = plan.chunk_frames[0], plan.chunk_frames[-1] + 1
        self.run.denoise(c, plan.chunk_positions[0])
        self.adapter.route.set_call(plan.chunk_positions)
        if r.options.noise is not None:
            noise = r.options.noise[:, :, f0:f1].to(self.out.dtype)
        else:
            noise = comfy.sample.prepare_noise(
                self.latent_image[:, :, f0:f1], chunk_seed(r.sampling.seed, c, NOISE_STREAM), self.batch_inds
            )
        out = comfy.sample.sample_custom(
            self.work,
            noise,
            1.0,
            r.sampling.sampler,
            r.sampling.sigmas,
            self._conditioning(plan.chunk_frames),
            self._conditioning(plan.chunk_frames),
            self.latent_image[:, :, f0:f1],
            callback=self.session.sampler_callback(c, c * self.steps, self.steps, r.hooks.step_callback),
            disable_pbar=True,
            seed=chunk_seed(r.sampling.seed, c, SAMPLER_STREAM),
        )
        self.out[:, :, f0:f1] = out.to(self.out.dtype)
        self.write(c)
        self.seconds.append(time.perf_counter() - t0)
        logger.debug(
            "jensen_kv: HY-WorldPlay chunk %d (context %s) took %.3f s", c, plan.context_frames, self.seconds[-1]
        )

    def keep_text_prefix(self) -> None:
        """What the prompt's text prefix cost, for the report (read before the route is closed)."""
        route = self.adapter.route
        if route is not None and route.text_prefix is not None:
            self.text_bytes, self.text_tokens = route.text_prefix.nbytes, route.text_prefix.tokens

    # ------------------------------------------------------------------ the loop and its result
    def execute(self) -> WorldPlayResult:
        """The run on the session's patched clone (unpatched, and the cache freed, in ``finally``)."""
        with self.session.patched():
            self.prefill()
            for c in range(self.chunks):
                self.chunk(c)
            self.keep_text_prefix()
        return self.result()

    def result(self) -> WorldPlayResult:
        report = self.session.report(
            self.adapter.cache_shape(),
            chunks=self.chunks,
            chunk_frames=CHUNK_LATENTS,
            window_chunks=CONTEXT_CHUNKS,
            sink_chunks=0,
            seconds=self.seconds,
            tokens_per_frame=self.tokens_per_frame,
            model_dtype=self.r.model.model_dtype(),
        )
        report.update(
            sampler=SAMPLER_NODE,
            recipe=self.name,
            family=self.adapter.key,
            blocks=self.adapter.blocks,
            streams=self.adapter.num_layers // self.adapter.blocks,
            context_frames=[list(p.context_frames) for p in self.plans],
            context_frames_max=MEMORY_FRAMES,
            context_timestep=CONTEXT_TIMESTEP,
            context_seed=int(self.r.sampling.seed),
            text_prefix="full precision, attended as context tokens, never stored in the chunk cache",
            text_prefix_tokens=int(self.text_tokens),
            text_prefix_bytes=int(self.text_bytes),
            text_prefix_mib=self.text_bytes / MIB,
        )
        return WorldPlayResult(
            samples=self.out,
            report=report,
            seconds_per_chunk=self.seconds,
            plans=self.plans,
            cache_bytes_after_write=self.run.bytes_after_write,
        )


def _fix_channels(model, samples: torch.Tensor) -> torch.Tensor:
    import comfy.sample

    return comfy.sample.fix_empty_latent_channels(model, samples)


def run(request: WorldPlayRequest) -> WorldPlayResult:
    """Sample a HY-WorldPlay video chunk by chunk. ``request.model`` is never modified: the route goes on a clone
    that lives for this call, removed (and the cache freed) in ``finally``, after success, an error or an interrupt."""
    return WorldPlayRecipe(request).execute()


def report_text(report: dict) -> str:
    """The report's paragraph, with what HY-WorldPlay's cache holds."""
    lines = _base_report_text(report).splitlines()
    lines[0] = (
        f"{report['chunks']} chunks of {report['chunk_frames']} latent frames, {report['blocks']} blocks x "
        f"{report['streams']} streams x {report['heads']} heads x {report['head_dim']}."
    )
    ctx = report.get("context_frames") or []
    longest = max((len(f) for f in ctx), default=0)
    lines.insert(
        1,
        f"Context rebuilt before every chunk from up to {report['context_frames_max']} latent frames (chunk 0, the "
        f"best-overlapping older chunk, the last 3), re-encoded at t = {report['context_timestep']:g}; at most "
        f"{longest} here. Text prefix: {report['text_prefix_tokens']} tokens, {report['text_prefix_mib']:.2f} MiB, "
        "full precision, not in the cache.",
    )
    return "\n".join(lines)


__all__ = [
    "CONTEXT_CHUNKS",
    "WorldPlayRecipe",
    "WorldPlayRequest",
    "WorldPlayResult",
    "detect",
    "report_text",
    "run",
]
