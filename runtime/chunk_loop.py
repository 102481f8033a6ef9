"""The chunk-wise autoregressive loop: ComfyUI's own samplers, one chunk of latent frames at a time.

For every chunk: denoise it with the given SAMPLER and SIGMAS (its self-attention reads the KV cache
of the finished chunks, never writes), then write it to the cache with one extra forward of the
clean chunk at the context-noise level (that forward also attends to the cache, as block-causal
attention would). The last chunk is written only when the run hands its cache on (``keep_state``).

Noise: every chunk has its own streams, derived from the seed and the chunk's absolute index
(:func:`chunk_seed`): the chunk's initial noise, the sampler's per-step noise (LCM, ancestral and
SDE samplers re-noise at every step, as Self-Forcing and CausVid draw fresh noise for every step of
every block), and the context noise of its cache write. So runs are reproducible, no two chunks
share noise, and a chunk's noise does not depend on how long the video is or where a run started -
continuing a saved cache gives the same chunks as one long run.

Around the loop: a prefix clip is written into the cache first (``prefix``), a saved run state is
adopted (``resume``), a prompt schedule switches the positive prompt by chunk and re-caches the
retained chunks under the new prompt (LongLive's re-cache), ComfyUI is asked to make room for the
planned cache, and previews of each chunk go to the UI as KSampler's do.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..jensen_core.planner import plan_cache
from ..jensen_core.retention import Retained, Retention
from .config import JensenKVConfig, get_config, get_window
from .families import ModelFamily, detect
from .observer import PHASE_DENOISE, PHASE_WRITE
from .prompt_schedule import PromptSchedule
from .report import MIB, build_report, report_text  # noqa: F401 - report_text re-exported for the nodes
from .run_caches import RunCaches
from .saved_run import RetainedChunk, SavedRun
from .shift_observer import combine_observers, make_diagnostics

logger = logging.getLogger("jensen_kv")

_SEED_MASK = 0xFFFFFFFFFFFFFFFF
#: independent noise streams of one chunk
NOISE_STREAM, SAMPLER_STREAM, CONTEXT_STREAM = 0, 1, 2


def chunk_seed(seed: int, chunk: int, stream: int) -> int:
    """A 63-bit seed for noise stream ``stream`` of chunk ``chunk`` (SplitMix64 of the three; deterministic)."""
    x = (
        (int(seed) & _SEED_MASK)
        ^ ((int(chunk) + 1) * 0x9E3779B97F4A7C15 & _SEED_MASK)
        ^ (int(stream) + 1) * 0xD1B54A32D192ED03
    )
    x &= _SEED_MASK
    for _ in range(2):
        x = (x + 0x9E3779B97F4A7C15) & _SEED_MASK
        z = x
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _SEED_MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _SEED_MASK
        x = z ^ (z >> 31)
    return x & 0x7FFF_FFFF_FFFF_FFFF


@dataclass(frozen=True)
class ChunkPlan:
    """How a video of ``frames`` latent frames splits into chunks of ``chunk_frames``."""

    frames: int
    chunk_frames: int

    def __post_init__(self) -> None:
        if self.chunk_frames < 1:
            raise ValueError(f"chunk_frames={self.chunk_frames} must be at least 1 latent frame")
        if self.frames < 1:
            raise ValueError(f"the latent has {self.frames} frames; it needs at least one")

    @property
    def chunks(self) -> int:
        return math.ceil(self.frames / self.chunk_frames)

    def bounds(self) -> list[tuple[int, int]]:
        return [(s, min(s + self.chunk_frames, self.frames)) for s in range(0, self.frames, self.chunk_frames)]


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
    """One Chunked AR run: what to sample, with which sampler, how the cache keeps chunks, what to hand back.

    ``positive`` is one CONDITIONING entry or a prompt schedule (:mod:`runtime.prompt_schedule`);
    ``negative`` exactly one entry. ``context_noise`` is the noise level of the cache-writing forward
    as a fraction of the model's maximum sigma (Wan's flow matching has sigma_max = 1, so it *is* the
    sigma: 0 = clean). ``prefix``: a LATENT of existing frames written into the cache first
    (generation continues after it; ``include_prefix`` puts them in front of the output).
    ``resume``: a :class:`SavedRun` from an earlier run to continue (never modified).
    ``keep_state``: also write the last chunk and return the state to continue from.
    ``recache_on_switch``: re-write the retained chunks when the prompt changes.
    ``observer``: sees every attention call (see :mod:`runtime.observer`).
    ``step_callback(chunk, step, steps)`` runs after every denoising step (tests, UIs);
    ``progress`` / ``preview`` drive ComfyUI's progress bar and latent previews.

    The values that need no model are checked here (ValueError naming the value and the fix).
    """

    model: Any
    positive: Any
    negative: Any
    latent: dict
    seed: int
    cfg: float
    sampler: Any
    sigmas: torch.Tensor
    chunk_frames: int
    window_chunks: int = 0
    sink_chunks: int = 0
    context_noise: float = 0.0
    prefix: dict | None = None
    include_prefix: bool = False
    resume: SavedRun | None = None
    keep_state: bool = False
    recache_on_switch: bool = True
    observer: Any = None
    step_callback: Callable[[int, int, int], None] | None = None
    progress: bool = True
    preview: bool = True

    def __post_init__(self) -> None:
        latent, sigmas = self.latent, self.sigmas
        if not isinstance(latent, dict) or "samples" not in latent:
            raise ValueError("latent must be a LATENT (a dict with 'samples'), e.g. from EmptyHunyuanLatentVideo")
        if latent.get("noise_mask") is not None:
            raise ValueError(
                "the latent carries a noise_mask (inpainting); the Chunked AR sampler does not support masks yet"
            )
        if not isinstance(sigmas, torch.Tensor) or sigmas.ndim != 1 or sigmas.numel() < 2:
            raise ValueError(
                f"SIGMAS must be a 1-D schedule with at least 2 values (one step), got "
                f"{tuple(sigmas.shape) if isinstance(sigmas, torch.Tensor) else type(sigmas).__name__}"
            )
        if not torch.isfinite(sigmas).all():
            raise ValueError(f"SIGMAS contains NaN or Inf values: {sigmas.tolist()}")
        if self.window_chunks < 0:
            raise ValueError(
                f"window_chunks={self.window_chunks} must be 0 (keep every chunk) or a positive number of chunks"
            )
        if self.sink_chunks < 0:
            raise ValueError(
                f"sink_chunks={self.sink_chunks} must be 0 (no attention sink) or a positive number of chunks"
            )
        if not 0.0 <= self.context_noise <= 1.0:
            raise ValueError(f"context_noise={self.context_noise} must be between 0 (clean context) and 1 (pure noise)")
        if not math.isfinite(self.cfg) or self.cfg < 0:
            raise ValueError(f"cfg={self.cfg} must be a non-negative number")

    @property
    def samples(self) -> torch.Tensor:
        return self.latent["samples"]

    @property
    def branches(self) -> list[int]:
        """CFG branches the cache keeps: cond only at cfg 1, else cond and uncond."""
        return [0] if math.isclose(self.cfg, 1.0) else [0, 1]


def _interrupt_check() -> None:
    import comfy.model_management

    comfy.model_management.throw_exception_if_processing_interrupted()


def _previewer(model, enabled: bool):
    if not enabled:
        return None
    try:
        import latent_preview

        return latent_preview.get_previewer(model.load_device, model.model.latent_format)
    except Exception:  # noqa: BLE001 - previews are a nicety; a previewer that fails must not stop sampling
        logger.debug("jensen_kv: no latent previewer", exc_info=True)
        return None


def _request_memory(work, planned_bytes: int) -> dict:
    """Ask ComfyUI to load the model with room for the planned cache (it offloads other models to make it)."""
    import comfy.model_management as mm

    device = work.load_device
    mm.load_models_gpu([work], memory_required=int(planned_bytes))
    return {
        "bytes": int(planned_bytes),
        "mib": planned_bytes / MIB,
        "device": str(device),
        "how": "comfy.model_management.load_models_gpu(memory_required=planned peak cache)",
    }


def run_chunked_ar(model, positive, negative, latent: dict, **options) -> ChunkedARResult:
    """Shorthand for ``run(ChunkedARRequest(model, positive, negative, latent, **options))``."""
    return run(ChunkedARRequest(model, positive, negative, latent, **options))


def run(request: ChunkedARRequest) -> ChunkedARResult:
    """Sample a video chunk by chunk with a (quantized) KV cache.

    ``request.model`` is never modified: the patches go on a clone that lives for this call only and
    are removed, and the cache freed, in ``finally`` (after success, an exception or an interrupt).
    """
    setup = _Setup.prepare(request)
    job = _Job(request, setup)
    try:
        job.start()
        job.prefill()
        for c, (f0, f1) in enumerate(setup.plan.bounds()):
            job.chunk(c, f0, f1)
        if request.keep_state:
            job.keep_state()
    finally:
        job.close()
    return job.result()


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
    first_chunk: int = 0
    first_frame: int = 0
    active: Any = None
    prefix_bounds: list[tuple[int, int]] = field(default_factory=list)
    planned_bytes: int = 0

    @classmethod
    def prepare(cls, r: ChunkedARRequest) -> _Setup:
        adapter, config, schedule = _check_model(r)
        latent_image, prefix_latent = _latents(r, adapter)
        setup = cls(
            adapter,
            config,
            schedule,
            latent_image,
            prefix_latent,
            ChunkPlan(latent_image.shape[2], r.chunk_frames),
            {**adapter.fingerprint(), "weights": adapter.weights_digest()},
        )
        setup._start_point(r)
        setup.planned_bytes = setup._planned_bytes(r)
        return setup

    @property
    def latent_geometry(self) -> tuple[int, int, int, int]:
        """(batch, channels, height, width) of the video: what a resumed state must share."""
        s = self.latent_image.shape
        return (s[0], s[1], s[3], s[4])

    def _start_point(self, r: ChunkedARRequest) -> None:
        """Where generation starts: after a resumed state's chunks, after a prefix clip's, or at chunk 0."""
        if r.resume is not None:
            r.resume.check_compatible(
                fingerprint=self.fingerprint,
                spec_k=self.config.spec_k,
                spec_v=self.config.spec_v,
                tiers=self.config.tiers,
                chunk_frames=r.chunk_frames,
                window_chunks=r.window_chunks,
                sink_chunks=r.sink_chunks,
                latent_shape=self.latent_geometry,
                branches=r.branches,
            )
            self.first_chunk, self.first_frame = r.resume.next_chunk, r.resume.next_frame
            self.active = r.resume.active_prompt
        elif self.prefix_latent is not None:
            self.prefix_bounds = ChunkPlan(self.prefix_latent.shape[2], r.chunk_frames).bounds()
            self.first_chunk, self.first_frame = len(self.prefix_bounds), int(self.prefix_latent.shape[2])

    def _planned_bytes(self, r: ChunkedARRequest) -> int:
        """The planner's peak cache bytes for this run (ComfyUI is asked for that much room)."""
        adapter, li = self.adapter, self.latent_image
        planned = plan_cache(
            latent_frames=self.plan.frames,
            latent_height=li.shape[3],
            latent_width=li.shape[4],
            chunk_frames=r.chunk_frames,
            window_chunks=r.window_chunks,
            layers=adapter.num_layers,
            heads=adapter.heads,
            head_dim=adapter.head_dim,
            spec_k=self.config.spec_k,
            spec_v=self.config.spec_v,
            cfg_branches=len(r.branches),
            batch=li.shape[0],
            full_bytes=torch.finfo(r.model.model_dtype()).bits // 8,
            sink_chunks=r.sink_chunks,
            write_last=r.keep_state,
            geometry=adapter.geometry,
            tiers=self.config.tiers,
            # what is in the cache before the first generated chunk, as frames: a loaded state's chunks as it holds
            # them (never its claimed next_frame), a prefix clip's frames
            prefix_frames=len(r.resume.retained) * r.chunk_frames if r.resume is not None else self.first_frame,
        )
        return planned.quantized_bytes or 0


def _check_model(r: ChunkedARRequest) -> tuple[ModelFamily, JensenKVConfig, PromptSchedule]:
    """The model's family, the KV-cache settings on it and the prompt schedule, each checked against the request."""
    adapter = detect(r.model)
    adapter.check_latent(r.samples)
    config = get_config(r.model.model_options) or JensenKVConfig()
    config.check_head_dim(adapter.head_dim)
    window_node = get_window(r.model.model_options)
    if window_node is not None and (window_node.window_chunks, window_node.sink_chunks) != (
        r.window_chunks,
        r.sink_chunks,
    ):
        raise ValueError(
            f"the MODEL carries an AR Cache Window ({window_node.describe()}) but this sampler's window_chunks="
            f"{r.window_chunks}, sink_chunks={r.sink_chunks}: AR Cache Window is for ComfyUI's SamplerARVideo; set the "
            "window on the Chunked AR Video Sampler's own inputs (or make both the same)"
        )
    schedule = PromptSchedule.from_conditioning(r.positive, "positive")
    negative = r.negative
    if not isinstance(negative, list) or len(negative) != 1:
        raise ValueError(
            f"negative conditioning has {len(negative) if isinstance(negative, list) else type(negative).__name__} "
            "entries; the Chunked AR sampler keeps one KV cache per CFG branch and needs exactly one: merge them with "
            "ConditioningConcat or ConditioningAverage"
        )
    if r.prefix is not None and r.resume is not None:
        raise ValueError(
            "give either a KV cache to continue from or a prefix clip to extend, not both: a saved cache "
            "already holds the frames before it"
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
    if r.prefix is None:
        return latent_image, None
    prefix_latent = r.prefix["samples"] if isinstance(r.prefix, dict) else r.prefix
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
    """One run in flight: the patched clone, its cache, the timeline of retained chunks, the output and the records."""

    def __init__(self, r: ChunkedARRequest, setup: _Setup):
        import comfy.samplers
        import comfy.utils

        self.r, self.s = r, setup
        adapter, config, model = setup.adapter, setup.config, r.model
        self.steps = r.sigmas.numel() - 1
        sigma_max = float(model.get_model_object("model_sampling").sigma_max)
        self.ctx_sigma = float(r.context_noise) * sigma_max
        self.write_sigmas = torch.tensor([self.ctx_sigma, 0.0], dtype=torch.float32)
        self.write_sampler = comfy.samplers.KSAMPLER(_write_once)
        self.batch_inds = r.latent.get("batch_index")
        self.active = setup.active
        self.diagnostics = make_diagnostics(
            model.model_options,
            num_layers=adapter.num_layers,
            heads=adapter.heads,
            steps=self.steps,
            window_chunks=r.window_chunks,
            correction=config.effective_correction,
            strength=config.strength,
            keys_quantized=config.keys_quantized,
            sink_chunks=r.sink_chunks,
        )
        if self.diagnostics is not None and r.resume is not None:
            raise ValueError(
                "KV Cache Diagnostics compares the cache with full-precision keys of every cached chunk; "
                "a loaded KV cache has only its quantized keys. Remove KV Cache Diagnostics to continue a "
                "cache"
            )
        self.run = RunCaches(
            config,
            r.window_chunks,
            adapter.num_layers,
            observer=combine_observers(r.observer, self.diagnostics),
            sink_chunks=r.sink_chunks,
        )
        # the clean latents of the chunks the caches hold, under the caches' rule
        self.timeline: Retained[RetainedChunk] = Retained(Retention(r.window_chunks, r.sink_chunks))
        if r.resume is not None:
            device = model.load_device
            self.run.adopt({k: c.copy().to(device) for k, c in r.resume.caches.items()}, r.resume.branches)
            self.timeline = Retained(
                self.timeline.rule,
                r.resume.retained,
                sink_held=min(r.sink_chunks, sum(1 for c in r.resume.retained if c.chunk < r.sink_chunks)),
            )
        self.work = model.clone()
        self.out = setup.latent_image.clone()
        self.seconds: list[float] = []
        self.denoise_seconds: list[float] = []
        self.prompts_report = [
            {"start_chunk": p.start_chunk, "label": p.label, "recached_chunks": 0} for p in setup.schedule.prompts
        ]
        self.previewer = _previewer(model, r.preview and r.progress)
        self.pbar = comfy.utils.ProgressBar(setup.plan.chunks * self.steps) if r.progress else None
        self.memory_request = None
        self.state: SavedRun | None = None
        self.bytes_after_write: list[int] = []

    # ------------------------------------------------------------------ steps
    def start(self) -> None:
        """Patch the clone and ask ComfyUI for room for the planned cache."""
        self.s.adapter.install(self.work, self.run)
        self.memory_request = _request_memory(self.work, self.s.planned_bytes)

    def prefill(self) -> None:
        """The prefix clip becomes the first chunks of the cache."""
        schedule, prefix_latent = self.s.schedule, self.s.prefix_latent
        for i, (f0, f1) in enumerate(self.s.prefix_bounds):
            self.write(i, f0, prefix_latent[:, :, f0:f1].to(self.out.dtype), schedule.at(i))
            self.active = schedule.fingerprint_at(i)

    def chunk(self, c: int, f0: int, f1: int) -> None:
        """Chunk ``c`` of this run (latent frames ``f0:f1``): re-cache on a prompt switch, denoise, write."""
        import comfy.sample

        r, schedule = self.r, self.s.schedule
        _interrupt_check()
        chunk_index, frame0 = self.s.first_chunk + c, self.s.first_frame + f0
        t0 = time.perf_counter()
        prompt = schedule.at(chunk_index)
        now = schedule.fingerprint_at(chunk_index)
        if self.active is not None and now != self.active and r.recache_on_switch:
            self.recache(prompt, schedule.index_at(chunk_index))
        self.active = now
        self.run.begin(chunk_index, frame0, PHASE_DENOISE)
        latent_image = self.s.latent_image
        noise = comfy.sample.prepare_noise(
            latent_image[:, :, f0:f1], chunk_seed(r.seed, chunk_index, NOISE_STREAM), self.batch_inds
        )
        chunk = comfy.sample.sample_custom(
            self.work,
            noise,
            r.cfg,
            r.sampler,
            r.sigmas,
            prompt,
            r.negative,
            latent_image[:, :, f0:f1],
            callback=self._on_step(c, chunk_index),
            disable_pbar=True,
            seed=chunk_seed(r.seed, chunk_index, SAMPLER_STREAM),
        )
        self.out[:, :, f0:f1] = chunk.to(self.out.dtype)
        self.denoise_seconds.append(time.perf_counter() - t0)
        if c < self.s.plan.chunks - 1 or r.keep_state:
            self.write(chunk_index, frame0, self.out[:, :, f0:f1], prompt)
        self.seconds.append(time.perf_counter() - t0)
        logger.debug(
            "jensen_kv: chunk %d (frames %d-%d) took %.3f s",
            chunk_index,
            frame0,
            frame0 + f1 - f0 - 1,
            self.seconds[-1],
        )

    def _on_step(self, c: int, chunk_index: int):
        """The sampler callback of chunk ``c``: step count, progress bar and preview, step_callback, interrupt."""
        steps, total_steps = self.steps, self.s.plan.chunks * self.steps

        def on_step(step, x0, x, total):
            self.run.step = step + 1
            if self.pbar is not None:
                preview_bytes = None
                if self.previewer is not None:
                    try:
                        preview_bytes = self.previewer.decode_latent_to_preview_image("JPEG", x0)
                    except Exception:  # noqa: BLE001 - never fail a run for a preview
                        logger.debug("jensen_kv: preview failed", exc_info=True)
                self.pbar.update_absolute(c * steps + step + 1, total_steps, preview_bytes)
            if self.r.step_callback is not None:
                self.r.step_callback(chunk_index, step, steps)
            _interrupt_check()

        return on_step

    def write(self, chunk_index: int, frame_offset: int, clean, prompt, record: bool = True) -> None:
        """One cache-writing forward of ``clean`` (LATENT frames of one chunk) under ``prompt``."""
        import comfy.sample

        r = self.r
        _interrupt_check()
        self.run.begin(chunk_index, frame_offset, PHASE_WRITE)
        if self.ctx_sigma > 0:
            ctx = comfy.sample.prepare_noise(clean, chunk_seed(r.seed, chunk_index, CONTEXT_STREAM), self.batch_inds)
        else:
            ctx = torch.zeros_like(clean)
        comfy.sample.sample_custom(
            self.work,
            ctx,
            r.cfg,
            self.write_sampler,
            self.write_sigmas,
            prompt,
            r.negative,
            clean,
            disable_pbar=True,
            seed=chunk_seed(r.seed, chunk_index, SAMPLER_STREAM),
        )
        self.run.end_write()
        self.bytes_after_write.append(sum(c.nbytes for c in self.run.caches.values()))
        if record:
            self.timeline.add(RetainedChunk(chunk_index, frame_offset, clean.detach().to("cpu").clone()))

    def recache(self, prompt, index: int) -> int:
        """Re-write every retained chunk under ``prompt`` (LongLive's re-cache); returns how many."""
        kept = list(self.timeline.items)
        if not kept:
            return 0
        self.run.start_rewrite()
        if self.diagnostics is not None:
            self.diagnostics.on_rewrite()
        for r in kept:
            self.write(r.chunk, r.frame_offset, r.latent.to(self.out.device, self.out.dtype), prompt, record=False)
        self.prompts_report[index]["recached_chunks"] += len(kept)
        schedule = self.s.schedule
        logger.info(
            "jensen_kv: prompt %r from chunk %d: re-cached %d chunk(s)",
            schedule.prompts[index].label,
            schedule.prompts[index].start_chunk,
            len(kept),
        )
        return len(kept)

    def keep_state(self) -> None:
        """The state to continue from: the cache (on the CPU), the retained chunks and where the next run starts."""
        r, s = self.r, self.s
        self.state = SavedRun(
            fingerprint=s.fingerprint,
            spec_k=s.config.spec_k,
            spec_v=s.config.spec_v,
            tiers=s.config.tiers,
            chunk_frames=r.chunk_frames,
            window_chunks=r.window_chunks,
            sink_chunks=r.sink_chunks,
            latent_shape=s.latent_geometry,
            next_chunk=s.first_chunk + s.plan.chunks,
            next_frame=s.first_frame + s.plan.frames,
            branches=self.run.branches,
            active_prompt=self.active,
            caches={k: c.copy().to("cpu") for k, c in self.run.caches.items()},
            retained=list(self.timeline.items),
            info={"seed": int(r.seed), "prompts": s.schedule.describe(), "model_class": s.adapter.describe()},
        )

    def close(self) -> None:
        """Unpatch the clone and free the cache and the diagnostics (in ``finally``)."""
        self.s.adapter.remove(self.work)
        self.run.free()
        if self.diagnostics is not None:
            self.diagnostics.free()

    def result(self) -> ChunkedARResult:
        r, s, state, out = self.r, self.s, self.state, self.out
        state_bytes = (
            None
            if state is None
            else state.nbytes + sum(c.latent.numel() * c.latent.element_size() for c in state.retained)
        )
        report = build_report(
            self.run,
            s.adapter,
            s.config,
            chunks=s.plan.chunks,
            chunk_frames=r.chunk_frames,
            window_chunks=r.window_chunks,
            sink_chunks=r.sink_chunks,
            seconds=self.seconds,
            cfg=r.cfg,
            tokens_per_frame=s.adapter.tokens_per_frame(tuple(s.latent_image.shape)),
            model_dtype=r.model.model_dtype(),
            first_chunk=s.first_chunk,
            prefix_chunks=len(s.prefix_bounds),
            prompts=self.prompts_report,
            memory_request=self.memory_request,
            planned_bytes=s.planned_bytes,
            state_file_bytes=state_bytes,
            resumed=r.resume is not None,
        )
        if self.diagnostics is not None:
            report["diagnostics"] = self.diagnostics.summary()
        samples_out = out
        if s.prefix_latent is not None and r.include_prefix:
            samples_out = torch.cat([s.prefix_latent.to(out.dtype), out], dim=2)
        return ChunkedARResult(
            samples=samples_out,
            report=report,
            seconds_per_chunk=self.seconds,
            denoise_seconds=self.denoise_seconds,
            state=state,
            cache_bytes_after_write=self.bytes_after_write,
        )


def _write_once(model, x, sigmas, extra_args=None, callback=None, disable=None):
    """A 'sampler' that runs the model once at ``sigmas[0]`` - the cache-writing forward - and returns x."""
    extra_args = {} if extra_args is None else extra_args
    with torch.no_grad():
        model(x, sigmas[0] * x.new_ones([x.shape[0]]), **extra_args)
    return x
