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

import torch

from ..jensen_core.planner import plan_cache
from .cache_run import CacheRun
from .config import JensenKVConfig, get_config, get_window
from .diagnostics_observer import combine_observers, make_diagnostics
from .families import detect
from .observer import PHASE_DENOISE, PHASE_WRITE
from .prompt_schedule import PromptSchedule
from .report import MIB, build_report, report_text  # noqa: F401 - report_text re-exported for the nodes
from .run_state import RetainedChunk, RunState

logger = logging.getLogger("jensen_kv")

_SEED_MASK = 0xFFFFFFFFFFFFFFFF
#: independent noise streams of one chunk
NOISE_STREAM, SAMPLER_STREAM, CONTEXT_STREAM = 0, 1, 2


def chunk_seed(seed: int, chunk: int, stream: int) -> int:
    """A 63-bit seed for noise stream ``stream`` of chunk ``chunk`` (SplitMix64 of the three; deterministic)."""
    x = (int(seed) & _SEED_MASK) ^ ((int(chunk) + 1) * 0x9E3779B97F4A7C15 & _SEED_MASK) ^ (int(stream) + 1) * 0xD1B54A32D192ED03
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
    state: RunState | None = None
    cache_bytes_after_write: list[int] = field(default_factory=list)  # every (layer, branch) cache, per write


class Timeline:
    """Which finished chunks the cache holds (the first ``sink``, the last ``window``) and their clean latents."""

    def __init__(self, window: int, sink: int, retained: list[RetainedChunk] | None = None):
        self.window, self.sink = window, sink
        self.retained: list[RetainedChunk] = list(retained or [])
        self.sink_held = min(sink, sum(1 for r in self.retained if r.chunk < sink))

    def add(self, chunk: RetainedChunk) -> None:
        self.retained.append(chunk)
        if self.sink_held < self.sink:
            self.sink_held += 1
            return
        while self.window and len(self.retained) - self.sink_held > self.window:
            del self.retained[self.sink_held]


def _validate(latent: dict, sigmas, cfg: float, window_chunks: int, sink_chunks: int, context_noise: float):
    if not isinstance(latent, dict) or "samples" not in latent:
        raise ValueError("latent must be a LATENT (a dict with 'samples'), e.g. from EmptyHunyuanLatentVideo")
    if latent.get("noise_mask") is not None:
        raise ValueError("the latent carries a noise_mask (inpainting); the Chunked AR sampler does not support masks yet")
    if not isinstance(sigmas, torch.Tensor) or sigmas.ndim != 1 or sigmas.numel() < 2:
        raise ValueError(
            f"SIGMAS must be a 1-D schedule with at least 2 values (one step), got "
            f"{tuple(sigmas.shape) if isinstance(sigmas, torch.Tensor) else type(sigmas).__name__}"
        )
    if not torch.isfinite(sigmas).all():
        raise ValueError(f"SIGMAS contains NaN or Inf values: {sigmas.tolist()}")
    if window_chunks < 0:
        raise ValueError(f"window_chunks={window_chunks} must be 0 (keep every chunk) or a positive number of chunks")
    if sink_chunks < 0:
        raise ValueError(f"sink_chunks={sink_chunks} must be 0 (no attention sink) or a positive number of chunks")
    if not 0.0 <= context_noise <= 1.0:
        raise ValueError(f"context_noise={context_noise} must be between 0 (clean context) and 1 (pure noise)")
    if not math.isfinite(cfg) or cfg < 0:
        raise ValueError(f"cfg={cfg} must be a non-negative number")
    return latent["samples"]


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
    return {"bytes": int(planned_bytes), "mib": planned_bytes / MIB, "device": str(device),
            "how": "comfy.model_management.load_models_gpu(memory_required=planned peak cache)"}


def run_chunked_ar(model, positive, negative, latent: dict, *, seed: int, cfg: float, sampler, sigmas: torch.Tensor,
                   chunk_frames: int, window_chunks: int = 0, sink_chunks: int = 0, context_noise: float = 0.0,
                   prefix: dict | None = None, include_prefix: bool = False, resume: RunState | None = None,
                   keep_state: bool = False, recache_on_switch: bool = True, observer=None,
                   step_callback: Callable[[int, int, int], None] | None = None, progress: bool = True,
                   preview: bool = True) -> ChunkedARResult:
    """Sample a Wan video chunk by chunk with a (quantized) KV cache.

    ``model`` is never modified: the patches go on a clone that lives for this call only and are
    removed, and the cache freed, in ``finally`` (after success, an exception or an interrupt).
    ``positive`` is one CONDITIONING entry or a prompt schedule (:mod:`runtime.prompt_schedule`).
    ``context_noise`` is the noise level of the cache-writing forward as a fraction of the model's
    maximum sigma (Wan's flow matching has sigma_max = 1, so it *is* the sigma: 0 = clean).
    ``prefix``: a LATENT of existing frames written into the cache first (generation continues
    after it; ``include_prefix`` puts them in front of the output). ``resume``: a :class:`RunState`
    from an earlier run to continue (never modified). ``keep_state``: also write the last chunk and
    return the state to continue from. ``step_callback(chunk, step, steps)`` runs after every
    denoising step (tests, UIs).
    """
    import comfy.sample
    import comfy.samplers
    import comfy.utils

    samples = _validate(latent, sigmas, cfg, window_chunks, sink_chunks, context_noise)
    adapter = detect(model)
    adapter.check_latent(samples)
    config = get_config(model.model_options) or JensenKVConfig()
    config.check_head_dim(adapter.head_dim)
    window_node = get_window(model.model_options)
    if window_node is not None and (window_node.window_chunks, window_node.sink_chunks) != (window_chunks, sink_chunks):
        raise ValueError(
            f"the MODEL carries an AR Cache Window ({window_node.describe()}) but this sampler's window_chunks="
            f"{window_chunks}, sink_chunks={sink_chunks}: AR Cache Window is for ComfyUI's SamplerARVideo; set the "
            "window on the Chunked AR Video Sampler's own inputs (or make both the same)"
        )
    schedule = PromptSchedule.from_conditioning(positive, "positive")
    if not isinstance(negative, list) or len(negative) != 1:
        raise ValueError(
            f"negative conditioning has {len(negative) if isinstance(negative, list) else type(negative).__name__} "
            "entries; the Chunked AR sampler keeps one KV cache per CFG branch and needs exactly one: merge them with "
            "ConditioningConcat or ConditioningAverage"
        )
    if prefix is not None and resume is not None:
        raise ValueError("give either a KV cache to continue from or a prefix clip to extend, not both: a saved cache "
                         "already holds the frames before it")

    latent_image = comfy.sample.fix_empty_latent_channels(model, samples)
    if latent_image.shape[1] != adapter.latent_channels:
        raise ValueError(f"the latent has {latent_image.shape[1]} channels; {adapter.name} latents have "
                         f"{adapter.latent_channels}")
    prefix_latent = None
    if prefix is not None:
        prefix_latent = prefix["samples"] if isinstance(prefix, dict) else prefix
        adapter.check_latent(prefix_latent)
        if tuple(prefix_latent.shape[:2]) + tuple(prefix_latent.shape[3:]) != \
                tuple(latent_image.shape[:2]) + tuple(latent_image.shape[3:]):
            raise ValueError(
                f"the prefix latent {tuple(prefix_latent.shape)} and the latent to generate "
                f"{tuple(latent_image.shape)} must share batch, channels, height and width (only frames differ)"
            )
        if not torch.isfinite(prefix_latent).all():
            raise ValueError("the prefix latent contains NaN or Inf values")
    batch_inds = latent.get("batch_index")
    plan = ChunkPlan(latent_image.shape[2], chunk_frames)
    bounds = plan.bounds()
    steps = sigmas.numel() - 1
    sigma_max = float(model.get_model_object("model_sampling").sigma_max)
    ctx_sigma = float(context_noise) * sigma_max
    write_sigmas = torch.tensor([ctx_sigma, 0.0], dtype=torch.float32)
    write_sampler = comfy.samplers.KSAMPLER(_write_once)
    tokens_per_frame = adapter.tokens_per_frame(tuple(latent_image.shape))
    branches = [0] if math.isclose(cfg, 1.0) else [0, 1]
    latent_geometry = (latent_image.shape[0], latent_image.shape[1], latent_image.shape[3], latent_image.shape[4])
    fingerprint = {**adapter.fingerprint(), "weights": adapter.weights_digest()}

    first_chunk, first_frame, active = 0, 0, None
    prefix_bounds: list[tuple[int, int]] = []
    if resume is not None:
        resume.check_compatible(fingerprint=fingerprint, spec_k=config.spec_k, spec_v=config.spec_v,
                                chunk_frames=chunk_frames, window_chunks=window_chunks, sink_chunks=sink_chunks,
                                latent_shape=latent_geometry, branches=branches)
        first_chunk, first_frame, active = resume.next_chunk, resume.next_frame, resume.active_prompt
    elif prefix_latent is not None:
        prefix_bounds = ChunkPlan(prefix_latent.shape[2], chunk_frames).bounds()
        first_chunk, first_frame = len(prefix_bounds), int(prefix_latent.shape[2])

    planned = plan_cache(
        latent_frames=plan.frames, latent_height=latent_image.shape[3], latent_width=latent_image.shape[4],
        chunk_frames=chunk_frames, window_chunks=window_chunks, layers=adapter.num_layers, heads=adapter.heads,
        head_dim=adapter.head_dim, spec_k=config.spec_k, spec_v=config.spec_v, cfg_branches=len(branches),
        batch=latent_image.shape[0], full_bytes=torch.finfo(model.model_dtype()).bits // 8,
        sink_chunks=sink_chunks, write_last=keep_state, geometry=adapter.geometry,
        # what is in the cache before the first generated chunk, as frames: a loaded state's chunks as it holds
        # them (never its claimed next_frame), a prefix clip's frames
        prefix_frames=len(resume.retained) * chunk_frames if resume is not None else first_frame,
    )
    planned_bytes = planned.quantized_bytes or 0

    diagnostics = make_diagnostics(model.model_options, num_layers=adapter.num_layers, heads=adapter.heads,
                                   steps=steps, window_chunks=window_chunks, correction=config.effective_correction,
                                   strength=config.strength, keys_quantized=config.keys_quantized,
                                   sink_chunks=sink_chunks)
    if diagnostics is not None and resume is not None:
        raise ValueError("KV Cache Diagnostics compares the cache with full-precision keys of every cached chunk; a "
                         "loaded KV cache has only its quantized keys. Remove KV Cache Diagnostics to continue a cache")
    run = CacheRun(config, window_chunks, adapter.num_layers, observer=combine_observers(observer, diagnostics),
                   sink_chunks=sink_chunks)
    timeline = Timeline(window_chunks, sink_chunks)
    if resume is not None:
        device = model.load_device
        run.adopt({k: c.copy().to(device) for k, c in resume.caches.items()}, resume.branches)
        timeline = Timeline(window_chunks, sink_chunks, resume.retained)
    work = model.clone()
    out = latent_image.clone()
    seconds: list[float] = []
    denoise_seconds: list[float] = []
    prompts_report = [{"start_chunk": p.start_chunk, "label": p.label, "recached_chunks": 0} for p in schedule.prompts]
    previewer = _previewer(model, preview and progress)
    pbar = comfy.utils.ProgressBar(plan.chunks * steps) if progress else None
    memory_request = None
    state = None
    bytes_after_write: list[int] = []

    def write(chunk_index: int, frame_offset: int, clean, prompt, record: bool = True) -> None:
        """One cache-writing forward of ``clean`` (LATENT frames of one chunk) under ``prompt``."""
        _interrupt_check()
        run.begin(chunk_index, frame_offset, PHASE_WRITE)
        if ctx_sigma > 0:
            ctx = comfy.sample.prepare_noise(clean, chunk_seed(seed, chunk_index, CONTEXT_STREAM), batch_inds)
        else:
            ctx = torch.zeros_like(clean)
        comfy.sample.sample_custom(work, ctx, cfg, write_sampler, write_sigmas, prompt, negative, clean,
                                   disable_pbar=True, seed=chunk_seed(seed, chunk_index, SAMPLER_STREAM))
        run.end_write()
        bytes_after_write.append(sum(c.nbytes for c in run.caches.values()))
        if record:
            timeline.add(RetainedChunk(chunk_index, frame_offset, clean.detach().to("cpu").clone()))

    def recache(prompt, index: int) -> int:
        """Re-write every retained chunk under ``prompt`` (LongLive's re-cache); returns how many."""
        kept = list(timeline.retained)
        if not kept:
            return 0
        run.start_rewrite()
        if diagnostics is not None:
            diagnostics.on_rewrite()
        for r in kept:
            write(r.chunk, r.frame_offset, r.latent.to(out.device, out.dtype), prompt, record=False)
        prompts_report[index]["recached_chunks"] += len(kept)
        logger.info("jensen_kv: prompt %r from chunk %d: re-cached %d chunk(s)", schedule.prompts[index].label,
                    schedule.prompts[index].start_chunk, len(kept))
        return len(kept)

    try:
        adapter.install(work, run)
        memory_request = _request_memory(work, planned_bytes)
        for i, (f0, f1) in enumerate(prefix_bounds):  # prefill: the prefix clip becomes the first chunks
            write(i, f0, prefix_latent[:, :, f0:f1].to(out.dtype), schedule.at(i))
            active = schedule.fingerprint_at(i)
        for c, (f0, f1) in enumerate(bounds):
            _interrupt_check()
            chunk_index, frame0 = first_chunk + c, first_frame + f0
            t0 = time.perf_counter()
            prompt = schedule.at(chunk_index)
            now = schedule.fingerprint_at(chunk_index)
            if active is not None and now != active and recache_on_switch:
                recache(prompt, schedule.index_at(chunk_index))
            active = now
            run.begin(chunk_index, frame0, PHASE_DENOISE)

            def on_step(step, x0, x, total, _c=c, _k=chunk_index):
                run.step = step + 1
                if pbar is not None:
                    preview_bytes = None
                    if previewer is not None:
                        try:
                            preview_bytes = previewer.decode_latent_to_preview_image("JPEG", x0)
                        except Exception:  # noqa: BLE001 - never fail a run for a preview
                            logger.debug("jensen_kv: preview failed", exc_info=True)
                    pbar.update_absolute(_c * steps + step + 1, plan.chunks * steps, preview_bytes)
                if step_callback is not None:
                    step_callback(_k, step, steps)
                _interrupt_check()

            noise = comfy.sample.prepare_noise(latent_image[:, :, f0:f1], chunk_seed(seed, chunk_index, NOISE_STREAM),
                                               batch_inds)
            chunk = comfy.sample.sample_custom(
                work, noise, cfg, sampler, sigmas, prompt, negative, latent_image[:, :, f0:f1],
                callback=on_step, disable_pbar=True, seed=chunk_seed(seed, chunk_index, SAMPLER_STREAM),
            )
            out[:, :, f0:f1] = chunk.to(out.dtype)
            denoise_seconds.append(time.perf_counter() - t0)
            if c < plan.chunks - 1 or keep_state:
                write(chunk_index, frame0, out[:, :, f0:f1], prompt)
            seconds.append(time.perf_counter() - t0)
            logger.debug("jensen_kv: chunk %d (frames %d-%d) took %.3f s", chunk_index, frame0, frame0 + f1 - f0 - 1,
                         seconds[-1])
        if keep_state:
            state = RunState(
                fingerprint=fingerprint, spec_k=config.spec_k, spec_v=config.spec_v, chunk_frames=chunk_frames,
                window_chunks=window_chunks, sink_chunks=sink_chunks, latent_shape=latent_geometry,
                next_chunk=first_chunk + plan.chunks, next_frame=first_frame + plan.frames, branches=run.branches,
                active_prompt=active, caches={k: c.copy().to("cpu") for k, c in run.caches.items()},
                retained=list(timeline.retained),
                info={"seed": int(seed), "prompts": schedule.describe(), "model_class": adapter.describe()},
            )
    finally:
        adapter.remove(work)
        run.free()
        if diagnostics is not None:
            diagnostics.free()
    state_bytes = None if state is None else state.nbytes + sum(r.latent.numel() * r.latent.element_size()
                                                                for r in state.retained)
    report = build_report(run, adapter, config, chunks=plan.chunks, chunk_frames=chunk_frames,
                          window_chunks=window_chunks, sink_chunks=sink_chunks, seconds=seconds, cfg=cfg,
                          tokens_per_frame=tokens_per_frame, model_dtype=model.model_dtype(), first_chunk=first_chunk,
                          prefix_chunks=len(prefix_bounds), prompts=prompts_report, memory_request=memory_request,
                          planned_bytes=planned_bytes, state_file_bytes=state_bytes, resumed=resume is not None)
    if diagnostics is not None:
        report["diagnostics"] = diagnostics.summary()
    samples_out = out
    if prefix_latent is not None and include_prefix:
        samples_out = torch.cat([prefix_latent.to(out.dtype), out], dim=2)
    return ChunkedARResult(samples=samples_out, report=report, seconds_per_chunk=seconds,
                           denoise_seconds=denoise_seconds, state=state, cache_bytes_after_write=bytes_after_write)


def _write_once(model, x, sigmas, extra_args=None, callback=None, disable=None):
    """A 'sampler' that runs the model once at ``sigmas[0]`` - the cache-writing forward - and returns x."""
    extra_args = {} if extra_args is None else extra_args
    with torch.no_grad():
        model(x, sigmas[0] * x.new_ones([x.shape[0]]), **extra_args)
    return x
