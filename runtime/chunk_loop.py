"""The chunk-wise autoregressive loop: ComfyUI's own samplers, one chunk of latent frames at a time.

For every chunk: denoise it with the given SAMPLER and SIGMAS (its self-attention reads the KV cache of the
finished chunks, never writes), then hand it to the run's recipe (:mod:`runtime.recipes`), which writes it to the
cache as its reference does (Self-Forcing and CausVid: one extra forward of the clean chunk labelled with the
context-noise timestep; SkyReels-V2 DF: noised to it; Krea: rebuilds the cache before the next chunk instead).
The last chunk is written only when the run hands its cache on (``keep_state``).

Noise: every chunk has its own streams, derived from the seed and the chunk's absolute index
(:func:`runtime.noise.chunk_seed`): the chunk's initial noise, the sampler's per-step noise (LCM, ancestral and
SDE samplers re-noise at every step, as Self-Forcing and CausVid draw fresh noise for every step of every block),
and the context noise of its cache write (and of SkyReels' per-step redraws). So runs are reproducible, no two
chunks share noise, and a chunk's noise does not depend on how long the video is or where a run started -
continuing a saved cache gives the same chunks as one long run.

Around the loop: the recipe prefills the cache (a prefix clip, ``Continuation.prefix``), a saved run state is
adopted (``Continuation.resume``), a prompt schedule switches the positive prompt by chunk and the recipe re-caches
the retained chunks under the new prompt (``RecipeOptions.recache_mode``: LongLive's ``_recache_after_switch`` by
default, which keeps the old prompt's sink, or the pack's own causal re-cache, which re-writes it). The run's
:class:`runtime.session.Session` holds the patched clone and the caches, asks ComfyUI for room for the planned cache,
and drives the progress bar, previews (as KSampler's) and interrupts.

A run's options are values (:mod:`runtime.options`): :class:`ChunkedARRequest` holds the MODEL, the prompts and
the latent, and one :class:`Sampling`, :class:`Chunking`, :class:`Continuation`, :class:`RecipeOptions` and
:class:`Hooks`. :func:`run_chunked_ar` takes them as flat keyword options too.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from ..jensen_core.planner import plan_cache
from .config import JensenKVConfig, get_config, get_window
from .families import CHUNKED_AR_SAMPLER, ModelFamily, attention_override_notice, detect
from .noise import CONTEXT_STREAM, NOISE_STREAM, REDRAW_STREAM, SAMPLER_STREAM, chunk_seed  # noqa: F401 - re-exported
from .options import (
    CONTEXT_NOISE_MODES,
    RECACHE_MODES,
    SHARED_GROUPS,
    Chunking,
    Continuation,
    Hooks,
    OptionGroups,
    RecipeOptions,
    Sampling,
    check_one_entry,
    grouped,
)
from .prompt_schedule import PromptSchedule
from .recipes import ChunkStep, SelfForcing, recipe_for, recipe_type
from .report import report_text  # noqa: F401 - re-exported for the nodes
from .run_caches import RunCaches
from .saved_run import RetainedChunk, SavedRun
from .session import Session, interrupted
from .shift_observer import combine_observers, make_diagnostics

logger = logging.getLogger("jensen_kv")

__all__ = [
    "CONTEXT_NOISE_MODES",
    "RECACHE_MODES",
    "ChunkPlan",
    "ChunkedARRequest",
    "ChunkedARResult",
    "Chunking",
    "Continuation",
    "Hooks",
    "RecipeOptions",
    "Sampling",
    "chunk_seed",
    "report_text",
    "run",
    "run_chunked_ar",
]

#: the flat keyword options of :func:`run_chunked_ar` (and :meth:`ChunkedARRequest.from_options`), by group
OPTION_GROUPS: OptionGroups = {
    **SHARED_GROUPS,
    "recipe": (
        RecipeOptions,
        (
            "context_noise",
            "context_noise_mode",
            "recache_on_switch",
            "recache_mode",
            "recompute_frames",
            "attention_bias",
            "vae",
        ),
    ),
}


@dataclass(frozen=True)
class ChunkPlan:
    """How a video of ``frames`` latent frames splits into chunks of ``chunk_frames``.

    ``first_chunk_frames`` (0: ``chunk_frames``) gives the first chunk its own length, as references with an
    independent first frame do (Self-Forcing's / Causal Forcing's ``independent_first_frame``: blocks of
    1, k, k, ...; LongLive's I2V configs)."""

    frames: int
    chunk_frames: int
    first_chunk_frames: int = 0

    def __post_init__(self) -> None:
        if self.chunk_frames < 1:
            raise ValueError(f"chunk_frames={self.chunk_frames} must be at least 1 latent frame")
        if self.first_chunk_frames < 0:
            raise ValueError(
                f"first_chunk_frames={self.first_chunk_frames} must be 0 (as chunk_frames) or a number of latent frames"
            )
        if self.frames < 1:
            raise ValueError(f"the latent has {self.frames} frames; it needs at least one")

    @property
    def first(self) -> int:
        return min(self.first_chunk_frames or self.chunk_frames, self.frames)

    @property
    def chunks(self) -> int:
        return 1 + math.ceil((self.frames - self.first) / self.chunk_frames)

    def bounds(self) -> list[tuple[int, int]]:
        rest = range(self.first, self.frames, self.chunk_frames)
        return [(0, self.first)] + [(s, min(s + self.chunk_frames, self.frames)) for s in rest]


@dataclass
class ChunkedARResult:
    """The video latent, the report, per-chunk timings (``denoise_seconds`` excludes the cache write)
    and, when asked for, the state to continue from (``state``)."""

    samples: torch.Tensor
    report: dict
    seconds_per_chunk: list[float] = field(default_factory=list)
    denoise_seconds: list[float] = field(default_factory=list)
    state: SavedRun | None = None
    cache_bytes_after_write: list[int] = field(default_factory=list)  # every (layer, branch) cache, per write


@dataclass(frozen=True, eq=False)
class ChunkedARRequest:
    """One Chunked AR run: the MODEL, what to sample and its option groups (each a value that checked itself).

    ``positive`` is one CONDITIONING entry or a prompt schedule (:mod:`runtime.prompt_schedule`); ``negative``
    exactly one entry; ``latent`` a LATENT. ``sampling``, ``chunking``, ``continuation``, ``recipe`` and ``hooks``
    are the option groups of :mod:`runtime.options`. The recipe the run takes (:func:`runtime.recipes.recipe_type`)
    checks the request here: what it cannot be combined with is a ValueError naming the value and the fix.
    """

    model: Any
    positive: Any
    negative: Any
    latent: dict
    sampling: Sampling
    chunking: Chunking
    continuation: Continuation = field(default_factory=Continuation)
    recipe: RecipeOptions = field(default_factory=RecipeOptions)
    hooks: Hooks = field(default_factory=Hooks)

    def __post_init__(self) -> None:
        latent = self.latent
        if not isinstance(latent, dict) or "samples" not in latent:
            raise ValueError("latent must be a LATENT (a dict with 'samples'), e.g. from EmptyHunyuanLatentVideo")
        if latent.get("noise_mask") is not None:
            raise ValueError(
                "the latent carries a noise_mask (inpainting); the Chunked AR sampler does not support masks yet"
            )
        for name, (cls, _) in OPTION_GROUPS.items():
            if not isinstance(getattr(self, name), cls):
                raise TypeError(f"{name} must be a {cls.__name__}, got {type(getattr(self, name)).__name__}")
        self.sampling.require_schedule()
        recipe_type(self).check(self)

    @classmethod
    def from_options(cls, model, positive, negative, latent: dict, **options) -> ChunkedARRequest:
        """The request of flat keyword options (``seed=..., cfg=..., chunk_frames=..., recache_mode=...``: the names
        of :data:`OPTION_GROUPS`), each put into its group."""
        return cls(model, positive, negative, latent, **grouped(OPTION_GROUPS, options, "Chunked AR"))

    @property
    def samples(self) -> torch.Tensor:
        return self.latent["samples"]

    @property
    def resumed(self) -> bool:
        return self.continuation.resume is not None


def run_chunked_ar(model, positive, negative, latent: dict, **options) -> ChunkedARResult:
    """Shorthand for ``run(ChunkedARRequest.from_options(model, positive, negative, latent, **options))``."""
    return run(ChunkedARRequest.from_options(model, positive, negative, latent, **options))


def run(request: ChunkedARRequest) -> ChunkedARResult:
    """Sample a video chunk by chunk with a (quantized) KV cache.

    ``request.model`` is never modified: the run's :class:`runtime.session.Session` patches a clone that lives for
    this call only (the recipe's hooks outside the family's) and removes the patches, and frees the cache, in
    ``finally`` (after success, an exception or an interrupt).
    """
    setup = _Setup.prepare(request)
    job = _Job(request, setup)
    notice = window_notice(request.chunking.window_chunks, setup.first_chunk + setup.plan.chunks)
    if notice is not None:
        logger.warning("jensen_kv: %s", notice)
        job.warnings.append(notice)
    with job.session.patched(install=lambda: job.recipe.install(job), remove=lambda: job.recipe.remove(job)):
        setup.recipe.prefill(job)
        for c, (f0, f1) in enumerate(setup.plan.bounds()):
            job.chunk(c, f0, f1)
        if request.continuation.keep_state:
            job.keep_state()
    return job.result()


def window_notice(window_chunks: int, video_chunks: int) -> str | None:
    """What a window that never drops a chunk (as many chunks as the video has, or more) means, else None."""
    if not window_chunks or window_chunks < video_chunks:
        return None
    return (
        f"window_chunks {window_chunks} is not fewer than this video's {video_chunks} chunks, so no chunk ever leaves "
        f"the cache (the same as window_chunks 0); for a sliding window set it below {video_chunks}"
    )


@dataclass
class _Setup:
    """Everything a run decides before its first model call (checked against the model and the resumed state)."""

    adapter: ModelFamily
    config: JensenKVConfig
    schedule: PromptSchedule
    latent_image: torch.Tensor
    prefix_latent: torch.Tensor | None
    plan: ChunkPlan
    fingerprint: dict
    recipe: SelfForcing
    first_chunk: int = 0
    first_frame: int = 0
    active: Any = None
    prefix_bounds: list[tuple[int, int]] = field(default_factory=list)
    planned_bytes: int = 0

    @classmethod
    def prepare(cls, r: ChunkedARRequest) -> _Setup:
        adapter, config, schedule = _check_model(r)
        latent_image, prefix_latent = _latents(r, adapter)
        ch, co = r.chunking, r.continuation
        setup = cls(
            adapter,
            config,
            schedule,
            latent_image,
            prefix_latent,
            ChunkPlan(
                latent_image.shape[2],
                ch.chunk_frames,
                ch.first_chunk_frames if co.resume is None and co.prefix is None else 0,
            ),
            {**adapter.fingerprint(), "weights": adapter.weights_digest()},
            recipe_for(r),
        )
        setup._start_point(r)
        setup.planned_bytes = setup._planned_bytes(r)
        return setup

    @property
    def latent_geometry(self) -> tuple[int, int, int, int]:
        """(batch, channels, height, width) of the video: what a resumed state must share."""
        s = self.latent_image.shape
        return (s[0], s[1], s[3], s[4])

    @property
    def tokens_per_frame(self) -> int:
        return self.adapter.tokens_per_frame(tuple(self.latent_image.shape))

    def shape(self, r: ChunkedARRequest):
        """The caches' shape for this run (the family's, with the run's CFG branches, batch and element size)."""
        return self.adapter.cache_shape().for_run(
            cfg_branches=len(r.sampling.branches),
            batch=self.latent_image.shape[0],
            full_bytes=torch.finfo(r.model.model_dtype()).bits // 8,
        )

    def _start_point(self, r: ChunkedARRequest) -> None:
        """Where generation starts: after a resumed state's chunks, after a prefix clip's, or at chunk 0."""
        ch, resume = r.chunking, r.continuation.resume
        if resume is not None:
            resume.check_compatible(
                fingerprint=self.fingerprint,
                precision=self.config.precision,
                chunk_frames=ch.chunk_frames,
                window_chunks=ch.window_chunks,
                sink_chunks=ch.sink_chunks,
                latent_shape=self.latent_geometry,
                branches=r.sampling.branches,
                tokens_per_frame=self.tokens_per_frame,
            )
            self.first_chunk, self.first_frame = resume.next_chunk, resume.next_frame
            self.active = resume.active_prompt
        elif self.prefix_latent is not None:
            self.prefix_bounds = ChunkPlan(self.prefix_latent.shape[2], ch.chunk_frames, ch.first_chunk_frames).bounds()
            self.first_chunk, self.first_frame = len(self.prefix_bounds), int(self.prefix_latent.shape[2])

    def _planned_bytes(self, r: ChunkedARRequest) -> int:
        """The planner's peak cache bytes for this run (ComfyUI is asked for that much room)."""
        li, ch, resume = self.latent_image, r.chunking, r.continuation.resume
        # the planner counts chunks of chunk_frames; a shorter first chunk is counted as a full one (an upper bound)
        pad = ch.chunk_frames - ch.first_chunk_frames if ch.first_chunk_frames and resume is None else 0
        planned = plan_cache(
            latent_frames=self.plan.frames + (0 if self.prefix_latent is not None else pad),
            latent_height=li.shape[3],
            latent_width=li.shape[4],
            chunk_frames=ch.chunk_frames,
            window_chunks=self.recipe.planned_window(ch),
            shape=self.shape(r),
            precision=self.config.precision,
            sink_chunks=ch.sink_chunks,
            write_last=r.continuation.keep_state,
            # what is in the cache before the first generated chunk, as frames: a loaded state's chunks as it holds
            # them (never its claimed next_frame), a prefix clip's frames
            prefix_frames=len(resume.retained) * ch.chunk_frames
            if resume is not None
            else self.first_frame + (pad if self.prefix_latent is not None else 0),
        )
        return planned.quantized_bytes or 0


def _check_model(r: ChunkedARRequest) -> tuple[ModelFamily, JensenKVConfig, PromptSchedule]:
    """The model's family, the KV-cache settings on it and the prompt schedule, each checked against the request."""
    adapter = detect(r.model)
    if adapter.sampler_node != CHUNKED_AR_SAMPLER:
        raise ValueError(
            f"this MODEL is {adapter.name}, which is sampled by {adapter.sampler_node}: its recipe owns the chunk loop "
            f"(the Chunked AR Video Sampler's loop cannot drive it); sample {adapter.name} with {adapter.sampler_node}"
        )
    adapter.check_latent(r.samples)
    notice = attention_override_notice(r.model.model_options)
    if notice is not None:
        logger.warning("jensen_kv: %s", notice)
    config = get_config(r.model.model_options) or JensenKVConfig()
    config.check_head_dim(adapter.head_dim)
    window_node, ch = get_window(r.model.model_options), r.chunking
    if window_node is not None and (window_node.window_chunks, window_node.sink_chunks) != (
        ch.window_chunks,
        ch.sink_chunks,
    ):
        raise ValueError(
            f"the MODEL carries an AR Cache Window ({window_node.describe()}) but this sampler's window_chunks="
            f"{ch.window_chunks}, sink_chunks={ch.sink_chunks}: AR Cache Window is for ComfyUI's SamplerARVideo; set "
            "the window on the Chunked AR Video Sampler's own inputs (or make both the same)"
        )
    schedule = PromptSchedule.from_conditioning(r.positive, "positive")
    check_one_entry(
        r.negative,
        "negative",
        "the Chunked AR sampler keeps one KV cache per CFG branch and needs exactly one: merge them with "
        "ConditioningConcat or ConditioningAverage",
    )
    return adapter, config, schedule


def _latents(r: ChunkedARRequest, adapter: ModelFamily) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The latent to generate (channels as the model takes them) and the prefix clip's latent, both checked."""
    import comfy.sample

    latent_image = comfy.sample.fix_empty_latent_channels(r.model, r.samples)
    if latent_image.shape[1] != adapter.latent_channels:
        raise ValueError(
            f"the latent has {latent_image.shape[1]} channels; {adapter.name} latents have {adapter.latent_channels}"
        )
    if r.continuation.prefix is None:
        return latent_image, None
    prefix = r.continuation.prefix
    prefix_latent = prefix["samples"] if isinstance(prefix, dict) else prefix
    adapter.check_latent(prefix_latent)
    if tuple(prefix_latent.shape[:2]) + tuple(prefix_latent.shape[3:]) != tuple(latent_image.shape[:2]) + tuple(
        latent_image.shape[3:]
    ):
        raise ValueError(
            f"the prefix latent {tuple(prefix_latent.shape)} and the latent to generate "
            f"{tuple(latent_image.shape)} must share batch, channels, height and width (only frames differ)"
        )
    if not torch.isfinite(prefix_latent).all():
        raise ValueError("the prefix latent contains NaN or Inf values")
    return latent_image, prefix_latent


class _Job:
    """One run in flight: its session (the patched clone, the caches and every chunk's life in them, ComfyUI's
    services), the output and the records. It walks the chunks; the recipe (``setup.recipe``) does what its
    reference does around them."""

    def __init__(self, r: ChunkedARRequest, setup: _Setup):
        import comfy.samplers

        self.request, self.setup = r, setup
        self.recipe = setup.recipe
        self.warnings: list[str] = []  # shown in the report (and logged when they arise)
        model = r.model
        self.chunk_steps = [r.sampling.sigmas_of(c, r.resumed).numel() - 1 for c in range(setup.plan.chunks)]
        self.steps = max(self.chunk_steps)
        sigma_max = float(model.get_model_object("model_sampling").sigma_max)
        self.ctx_sigma = float(r.recipe.context_noise) * sigma_max
        self.write_sigmas = torch.tensor([self.ctx_sigma, 0.0], dtype=torch.float32)
        self.write_sampler = comfy.samplers.KSAMPLER(_write_relabelled if self.recipe.relabels else _write_once)
        self.batch_inds = r.latent.get("batch_index")
        self.active = setup.active
        self.diagnostics = self._diagnostics()
        self.run = self._caches()
        hooks = r.hooks
        self.session = Session(
            model,
            setup.adapter,
            self.run,
            setup.config,
            planned_bytes=setup.planned_bytes,
            steps=sum(self.chunk_steps),
            progress=hooks.progress,
            preview=hooks.preview,
            diagnostics=self.diagnostics,
        )
        self.work = self.session.work
        self.out = setup.latent_image.clone()
        self.seconds: list[float] = []
        self.denoise_seconds: list[float] = []
        self.prompts_report = [
            {"start_chunk": p.start_chunk, "label": p.label, "recached_chunks": 0} for p in setup.schedule.prompts
        ]
        self.state: SavedRun | None = None

    def _diagnostics(self):
        """KV Cache Diagnostics' observer when the MODEL asks for it (never with a loaded cache), else None."""
        r, setup = self.request, self.setup
        adapter, config, ch = setup.adapter, setup.config, r.chunking
        diagnostics = make_diagnostics(
            r.model.model_options,
            num_layers=adapter.num_layers,
            heads=adapter.heads,
            steps=self.steps,
            window_chunks=ch.window_chunks,
            correction=config.effective_correction,
            strength=config.strength,
            guard=config.guard,
            keys_quantized=config.keys_quantized,
            sink_chunks=ch.sink_chunks,
        )
        if diagnostics is not None and r.resumed:
            raise ValueError(
                "KV Cache Diagnostics compares the cache with full-precision keys of every cached chunk; "
                "a loaded KV cache has only its quantized keys. Remove KV Cache Diagnostics to continue a "
                "cache"
            )
        return diagnostics

    def _caches(self) -> RunCaches:
        """The run's caches (a loaded run's adopted), seen by the hooks' observer and the diagnostics."""
        r, setup, diagnostics = self.request, self.setup, self.diagnostics
        adapter, ch = setup.adapter, r.chunking
        run = RunCaches(
            setup.config,
            ch.window_chunks,
            adapter.num_layers,
            observer=combine_observers(r.hooks.observer, diagnostics),
            sink_chunks=ch.sink_chunks,
            on_rewrite=None if diagnostics is None else diagnostics.on_rewrite,
            attention_bias=float(r.recipe.attention_bias),
            tokens_per_frame=setup.tokens_per_frame,
        )
        if r.resumed:
            run.adopt_run(r.continuation.resume, r.model.load_device)
        return run

    # ------------------------------------------------------------------ the loop
    def chunk(self, c: int, f0: int, f1: int) -> None:
        """Chunk ``c`` of this run (latent frames ``f0:f1``): the recipe before it, denoise, the recipe's write."""
        import comfy.sample

        r, s = self.request, self.setup
        interrupted()
        index, t0 = s.first_chunk + c, time.perf_counter()
        step = ChunkStep(
            c, index, s.first_frame + f0, f1 - f0, s.schedule.at(index), s.schedule.fingerprint_at(index),
            c == s.plan.chunks - 1,
        )  # fmt: skip
        rope_frame = self.recipe.before_chunk(self, step)  # a prompt switch re-caches there
        self.run.denoise(index, rope_frame)
        latent_image, seed = s.latent_image[:, :, f0:f1], r.sampling.seed
        noise = comfy.sample.prepare_noise(latent_image, chunk_seed(seed, index, NOISE_STREAM), self.batch_inds)
        chunk = comfy.sample.sample_custom(
            self.work,
            noise,
            r.sampling.cfg,
            r.sampling.sampler,
            r.sampling.sigmas_of(c, r.resumed),
            step.prompt,
            r.negative,
            latent_image,
            callback=self.session.sampler_callback(
                index, sum(self.chunk_steps[:c]), self.chunk_steps[c], r.hooks.step_callback
            ),
            disable_pbar=True,
            seed=chunk_seed(seed, index, SAMPLER_STREAM),
        )
        self.out[:, :, f0:f1] = chunk.to(self.out.dtype)
        self.denoise_seconds.append(time.perf_counter() - t0)
        self.recipe.write(self, step, self.out[:, :, f0:f1])
        self.seconds.append(time.perf_counter() - t0)
        logger.debug(
            "jensen_kv: chunk %d (frames %d-%d) took %.3f s", index, step.frame0, step.frame0 + step.frames - 1,
            self.seconds[-1],
        )  # fmt: skip

    # ------------------------------------------------------------------ after the loop
    def keep_state(self) -> None:
        """The state to continue from: the cache (on the CPU), the retained chunks and where the next run starts."""
        r, s, ch, precision = self.request, self.setup, self.request.chunking, self.setup.config.precision
        self.state = SavedRun(
            fingerprint=s.fingerprint,
            spec_k=precision.spec_k,
            spec_v=precision.spec_v,
            tiers=precision.tiers,
            chunk_frames=ch.chunk_frames,
            window_chunks=ch.window_chunks,
            sink_chunks=ch.sink_chunks,
            latent_shape=s.latent_geometry,
            next_chunk=s.first_chunk + s.plan.chunks,
            next_frame=s.first_frame + s.plan.frames,
            branches=self.run.branches,
            active_prompt=self.active,
            caches={k: c.copy().to("cpu") for k, c in self.run.caches.items()},
            # float32, as the planner counts them (STATE_LATENT_BYTES) and the file's reader wants one dtype
            retained=[RetainedChunk(c.chunk, c.frame_offset, c.latent.float()) for c in self.run.timeline.items],
            info={"seed": int(r.sampling.seed), "prompts": s.schedule.describe(), "model_class": s.adapter.describe()},
        )

    def result(self) -> ChunkedARResult:
        r, s, out = self.request, self.setup, self.out
        samples_out = out
        if s.prefix_latent is not None and r.continuation.include_prefix:
            samples_out = torch.cat([s.prefix_latent.to(out.dtype), out], dim=2)
        return ChunkedARResult(
            samples=samples_out,
            report=self._report(),
            seconds_per_chunk=self.seconds,
            denoise_seconds=self.denoise_seconds,
            state=self.state,
            cache_bytes_after_write=self.run.bytes_after_write,
        )

    def _report(self) -> dict:
        """The run's report: the caches', the recipe's own fields, the diagnostics."""
        r, s, state, ch = self.request, self.setup, self.state, self.request.chunking
        state_bytes = (
            None
            if state is None
            else state.nbytes + sum(c.latent.numel() * c.latent.element_size() for c in state.retained)
        )
        report = self.session.report(
            s.shape(r),
            chunks=s.plan.chunks,
            chunk_frames=ch.chunk_frames,
            window_chunks=ch.window_chunks,
            sink_chunks=ch.sink_chunks,
            seconds=self.seconds,
            tokens_per_frame=s.tokens_per_frame,
            model_dtype=r.model.model_dtype(),
            first_chunk=s.first_chunk,
            prefix_chunks=len(s.prefix_bounds),
            prompts=self.prompts_report,
            state_file_bytes=state_bytes,
            resumed=r.resumed,
        )
        report.update(self.recipe.report())
        report["chunk_lengths"] = [f1 - f0 for f0, f1 in s.plan.bounds()]
        report["warnings"] = [*report.get("warnings", []), *self.warnings]
        if self.diagnostics is not None:
            report["diagnostics"] = self.diagnostics.summary()
        return report


def _write_relabelled(model, x, sigmas, extra_args=None, callback=None, disable=None):
    """The cache-writing forward of Self-Forcing, CausVid and LongLive: the clean latent (the sampler's
    ``latent_image``, never the noised ``x``) labelled with the timestep of ``sigmas[0]``; returns x."""
    extra_args = {} if extra_args is None else extra_args
    clean = model.latent_image
    with torch.no_grad():
        model(clean, sigmas[0] * clean.new_ones([clean.shape[0]]), **extra_args)
    return x


def _write_once(model, x, sigmas, extra_args=None, callback=None, disable=None):
    """A 'sampler' that runs the model once at ``sigmas[0]`` - the cache-writing forward - and returns x."""
    extra_args = {} if extra_args is None else extra_args
    with torch.no_grad():
        model(x, sigmas[0] * x.new_ones([x.shape[0]]), **extra_args)
    return x
