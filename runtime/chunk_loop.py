"""The chunk-wise autoregressive loop: ComfyUI's own samplers, one chunk of latent frames at a time.

For every chunk: denoise it with the given SAMPLER and SIGMAS (its self-attention reads the KV cache
of the finished chunks, never writes), then write it to the cache with one extra forward of the
clean chunk labelled with the context-noise timestep (or noised to it: ``context_noise_mode``; that
forward also attends to the cache, as block-causal attention would). The last chunk is written only
when the run hands its cache on (``keep_state``).

Noise: every chunk has its own streams, derived from the seed and the chunk's absolute index
(:func:`chunk_seed`): the chunk's initial noise, the sampler's per-step noise (LCM, ancestral and
SDE samplers re-noise at every step, as Self-Forcing and CausVid draw fresh noise for every step of
every block), and the context noise of its cache write (and of SkyReels' per-step redraws). So runs are reproducible, no two chunks
share noise, and a chunk's noise does not depend on how long the video is or where a run started -
continuing a saved cache gives the same chunks as one long run.

Around the loop: a prefix clip is written into the cache first (``prefix``), a saved run state is
adopted (``resume``), a prompt schedule switches the positive prompt by chunk and re-caches the
retained chunks under the new prompt (``recache_mode``: causal, or LongLive's), ComfyUI is asked to make room for the
planned cache, and previews of each chunk go to the UI as KSampler's do.

Krea Realtime 14B's settings (``recompute_frames``, ``attention_bias``, ``vae``): before every chunk the
cache is rebuilt from the last ``recompute_frames`` latent frames (:meth:`_Job.krea_recompute`), and
while denoising ``log(bias)`` is added to the scores of every cached key but the first frame's.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..jensen_core.bias import check_attention_bias
from ..jensen_core.planner import plan_cache
from ..jensen_core.retention import Retained, Retention
from .config import JensenKVConfig, get_config, get_window
from .families import ModelFamily, attention_override_notice, detect
from .observer import PHASE_DENOISE, PHASE_WRITE
from .prompt_schedule import PromptSchedule
from .report import MIB, build_report, report_text  # noqa: F401 - report_text re-exported for the nodes
from .run_caches import RunCaches
from .saved_run import RetainedChunk, SavedRun
from .shift_observer import combine_observers, make_diagnostics

logger = logging.getLogger("jensen_kv")

_SEED_MASK = 0xFFFFFFFFFFFFFFFF
#: independent noise streams of one chunk (REDRAW_STREAM: the context noise SkyReels' mode redraws every step)
NOISE_STREAM, SAMPLER_STREAM, CONTEXT_STREAM, REDRAW_STREAM = 0, 1, 2, 3
SKYREELS_WRAPPER_KEY = "jensen_kv_skyreels_context"
#: how a prompt switch re-caches the retained chunks (``ChunkedARRequest.recache_mode``)
RECACHE_MODES = ("causal", "longlive")
#: what ``context_noise`` does to a cache write (``ChunkedARRequest.context_noise_mode``)
CONTEXT_NOISE_MODES = ("relabel", "skyreels")


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
    """One Chunked AR run: what to sample, with which sampler, how the cache keeps chunks, what to hand back.

    ``positive`` is one CONDITIONING entry or a prompt schedule (:mod:`runtime.prompt_schedule`);
    ``negative`` exactly one entry. ``context_noise`` is the noise level of the cache-writing forward
    as a fraction of the model's maximum sigma (Wan's flow matching has sigma_max = 1, so it *is* the
    sigma: 0 = clean). ``prefix``: a LATENT of existing frames written into the cache first
    (generation continues after it; ``include_prefix`` puts them in front of the output).
    ``resume``: a :class:`SavedRun` from an earlier run to continue (never modified).
    ``keep_state``: also write the last chunk and return the state to continue from.
    ``recache_on_switch``: re-write the retained chunks when the prompt changes; ``recache_mode`` how:
    ``"causal"`` re-writes every retained chunk (sink included) one chunk per forward, each attending to the
    ones re-written before it; ``"longlive"`` does what LongLive's ``_recache_after_switch`` does (see
    :meth:`_Job.recache_longlive`). ``context_noise_mode``: ``"relabel"`` (Self-Forcing, CausVid, LongLive)
    writes the clean chunk and only tells the model t = context_noise x 1000; ``"skyreels"`` (SkyReels-V2 DF's
    ``addnoise_condition``) writes it noised to that level, with fresh noise at every denoising step.
    ``recompute_frames`` (Krea's ``kv_cache_num_frames``; 0 = off): before each chunk the cache is rebuilt
    from the last N latent frames (:meth:`_Job.krea_recompute`) instead of written after each chunk;
    ``vae`` (optional) re-encodes the first of them from decoded pixels, as Krea does.
    ``attention_bias`` (Krea's ``kv_cache_attention_bias``; 1.0 = off): ``log(bias)`` added to the scores of
    every cached key but the first cached frame's while denoising (never while writing, as in Krea).
    ``observer``: sees every attention call (see :mod:`runtime.observer`).
    ``first_chunk_sigmas``: the schedule of the first chunk this run denoises when it starts a video or
    extends a prefix (Causal Forcing++'s ``denoising_step_list_first_chunk``; a continued run's first
    chunk is not the video's, and uses ``sigmas``). ``first_chunk_frames``: the video's first chunk has
    this many latent frames (0: ``chunk_frames``; Self-Forcing's ``independent_first_frame`` is 1).
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
    recompute_frames: int = 0
    attention_bias: float = 1.0
    vae: Any = None
    recache_mode: str = "causal"
    context_noise_mode: str = "relabel"
    observer: Any = None
    step_callback: Callable[[int, int, int], None] | None = None
    progress: bool = True
    preview: bool = True
    first_chunk_sigmas: torch.Tensor | None = None
    first_chunk_frames: int = 0

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
        first = self.first_chunk_sigmas
        if first is not None and (
            not isinstance(first, torch.Tensor)
            or first.ndim != 1
            or first.numel() < 2
            or not torch.isfinite(first).all()
        ):
            raise ValueError(
                "first_chunk_sigmas must be a 1-D schedule of finite values with at least 2 values (one step), got "
                f"{first.tolist() if isinstance(first, torch.Tensor) else type(first).__name__}; leave it unconnected "
                "to use sigmas for every chunk"
            )
        if isinstance(self.first_chunk_frames, bool) or not isinstance(self.first_chunk_frames, int):
            raise ValueError(f"first_chunk_frames={self.first_chunk_frames!r} must be an integer (0: chunk_frames)")
        if self.first_chunk_frames < 0:
            raise ValueError(
                f"first_chunk_frames={self.first_chunk_frames} must be 0 (as chunk_frames) or a number of latent "
                "frames (1 for an independent first frame)"
            )
        if self.first_chunk_frames > self.chunk_frames:
            raise ValueError(
                f"first_chunk_frames={self.first_chunk_frames} is longer than chunk_frames={self.chunk_frames}: a first "
                "chunk may only be shorter (the references' independent first frame is 1 frame), since the planner and "
                "the window assume no chunk is longer than chunk_frames; lower first_chunk_frames or raise chunk_frames"
            )
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
        if self.recache_mode not in RECACHE_MODES:
            raise ValueError(f"recache_mode={self.recache_mode!r} is not known; use one of {', '.join(RECACHE_MODES)}")
        if self.context_noise_mode not in CONTEXT_NOISE_MODES:
            raise ValueError(
                f"context_noise_mode={self.context_noise_mode!r} is not known; use one of {', '.join(CONTEXT_NOISE_MODES)}"
            )
        check_attention_bias(self.attention_bias)
        self._check_recompute()

    def _check_recompute(self) -> None:
        """What Krea's per-chunk cache recompute cannot be combined with (it rebuilds the cache itself)."""
        n = self.recompute_frames
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"recompute_frames={n!r} must be 0 (off) or a number of latent frames (Krea uses 3)")
        if n == 0:
            if self.vae is not None:
                raise ValueError("a VAE is used only with recompute_frames > 0 (it re-encodes the first context frame)")
            return
        clash = [
            what
            for what, bad in (
                (f"window_chunks={self.window_chunks}", self.window_chunks != 0),
                (f"sink_chunks={self.sink_chunks}", self.sink_chunks != 0),
                ("a kv_cache to continue", self.resume is not None),
                ("the kv_cache output", self.keep_state),
                (
                    f"first_chunk_frames={self.first_chunk_frames}",
                    self.first_chunk_frames not in (0, self.chunk_frames),
                ),
                (
                    "context_noise_mode='skyreels'",
                    self.context_noise_mode == "skyreels" and self.context_noise > 0,
                ),
            )
            if bad
        ]
        if clash:
            raise ValueError(
                f"recompute_frames={n} rebuilds the cache from the last {n} latent frames before every chunk, so it "
                f"cannot be combined with {', '.join(clash)}: set window_chunks and sink_chunks to 0 and leave the "
                "kv_cache input and output unconnected, first_chunk_frames at 0, context_noise_mode 'relabel' (or set "
                "recompute_frames to 0)"
            )

    @property
    def samples(self) -> torch.Tensor:
        return self.latent["samples"]

    def sigmas_of(self, c: int) -> torch.Tensor:
        """The schedule of this run's ``c``-th chunk: ``first_chunk_sigmas`` for the first one of a run that
        starts the video or extends a prefix, else ``sigmas``."""
        if c == 0 and self.first_chunk_sigmas is not None and self.resume is None:
            return self.first_chunk_sigmas
        return self.sigmas

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
            ChunkPlan(
                latent_image.shape[2],
                r.chunk_frames,
                r.first_chunk_frames if r.resume is None and r.prefix is None else 0,
            ),
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
                tokens_per_frame=self.adapter.tokens_per_frame(tuple(self.latent_image.shape)),
            )
            self.first_chunk, self.first_frame = r.resume.next_chunk, r.resume.next_frame
            self.active = r.resume.active_prompt
        elif self.prefix_latent is not None:
            self.prefix_bounds = ChunkPlan(self.prefix_latent.shape[2], r.chunk_frames, r.first_chunk_frames).bounds()
            self.first_chunk, self.first_frame = len(self.prefix_bounds), int(self.prefix_latent.shape[2])

    def _planned_bytes(self, r: ChunkedARRequest) -> int:
        """The planner's peak cache bytes for this run (ComfyUI is asked for that much room)."""
        adapter, li = self.adapter, self.latent_image
        # the planner counts chunks of chunk_frames; a shorter first chunk is counted as a full one (an upper bound)
        pad = r.chunk_frames - r.first_chunk_frames if r.first_chunk_frames and r.resume is None else 0
        planned = plan_cache(
            latent_frames=self.plan.frames + (0 if self.prefix_latent is not None else pad),
            latent_height=li.shape[3],
            latent_width=li.shape[4],
            chunk_frames=r.chunk_frames,
            # Krea's recompute holds the last recompute_frames frames, written in pieces of chunk_frames
            window_chunks=-(-r.recompute_frames // r.chunk_frames) if r.recompute_frames else r.window_chunks,
            layers=adapter.num_layers,
            heads=adapter.heads,
            kv_heads=adapter.kv_heads,
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
            prefix_frames=len(r.resume.retained) * r.chunk_frames
            if r.resume is not None
            else self.first_frame + (pad if self.prefix_latent is not None else 0),
        )
        return planned.quantized_bytes or 0


def _check_model(r: ChunkedARRequest) -> tuple[ModelFamily, JensenKVConfig, PromptSchedule]:
    """The model's family, the KV-cache settings on it and the prompt schedule, each checked against the request."""
    adapter = detect(r.model)
    adapter.check_latent(r.samples)
    notice = attention_override_notice(r.model.model_options)
    if notice is not None:
        logger.warning("jensen_kv: %s", notice)
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
        self.chunk_steps = [r.sigmas_of(c).numel() - 1 for c in range(setup.plan.chunks)]
        self.steps = max(self.chunk_steps)
        sigma_max = float(model.get_model_object("model_sampling").sigma_max)
        self.ctx_sigma = float(r.context_noise) * sigma_max
        self.write_sigmas = torch.tensor([self.ctx_sigma, 0.0], dtype=torch.float32)
        relabel = r.context_noise_mode == "relabel"
        self.write_sampler = comfy.samplers.KSAMPLER(_write_relabelled if relabel else _write_once)
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
        if self.diagnostics is not None and r.recompute_frames:
            raise ValueError(
                "KV Cache Diagnostics follows chunks written once; recompute_frames rebuilds the cache before every "
                "chunk. Remove KV Cache Diagnostics or set recompute_frames to 0"
            )
        if self.diagnostics is not None and r.context_noise_mode == "skyreels" and r.context_noise > 0:
            raise ValueError(
                "KV Cache Diagnostics compares the cache with a full-precision copy of each written chunk, but "
                "context_noise_mode='skyreels' re-writes the cache with fresh noise at every step: remove KV Cache "
                "Diagnostics, or use context_noise_mode='relabel' (or context_noise 0)"
            )
        self.run = RunCaches(
            config,
            r.window_chunks,
            adapter.num_layers,
            observer=combine_observers(r.observer, self.diagnostics),
            sink_chunks=r.sink_chunks,
        )
        self.run.attention_bias = float(r.attention_bias)
        self.run.tokens_per_frame = adapter.tokens_per_frame(tuple(setup.latent_image.shape))
        # the clean latents of the chunks the caches hold, under the caches' rule
        self.timeline: Retained[RetainedChunk] = Retained(Retention(r.window_chunks, r.sink_chunks))
        self.evicted: RetainedChunk | None = None  # the chunk the window dropped last (LongLive re-caches it too)
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
        self.pbar = comfy.utils.ProgressBar(sum(self.chunk_steps)) if r.progress else None
        self.memory_request = None
        self.state: SavedRun | None = None
        self.bytes_after_write: list[int] = []
        # SkyReels' context noise: the cached chunks are re-noised and re-written before every denoising call
        self.redraw = r.context_noise_mode == "skyreels" and self.ctx_sigma > 0
        self.redraw_noise: list[torch.Generator] = []  # per chunk and batch item, seeded from both (reproducible)
        self.step_noise: tuple[tuple[int, int], dict[int, torch.Tensor]] | None = None  # one step's redrawn noise
        self.redraws = 0

    # ------------------------------------------------------------------ steps
    def start(self) -> None:
        """Patch the clone and ask ComfyUI for room for the planned cache."""
        if self.redraw:  # outside the family's wrappers (added first), so its model calls go through them
            import comfy.patcher_extension

            self.work.add_wrapper_with_key(
                comfy.patcher_extension.WrappersMP.DIFFUSION_MODEL, SKYREELS_WRAPPER_KEY, self._redraw_context
            )
        self.s.adapter.install(self.work, self.run)
        self.memory_request = _request_memory(self.work, self.s.planned_bytes)

    def prefill(self) -> None:
        """The prefix clip becomes the first chunks of the cache."""
        schedule, prefix_latent = self.s.schedule, self.s.prefix_latent
        if self.r.recompute_frames:  # Krea's recompute reads the prefix frames before every chunk instead
            return
        for i, (f0, f1) in enumerate(self.s.prefix_bounds):
            prompt = schedule.at(i)
            self.switch_prompt(i, f0, prompt, schedule.fingerprint_at(i))  # a switch inside the clip, as in one run
            self.write(i, f0, prefix_latent[:, :, f0:f1].to(self.out.dtype), prompt)

    def chunk(self, c: int, f0: int, f1: int) -> None:
        """Chunk ``c`` of this run (latent frames ``f0:f1``): re-cache on a prompt switch, denoise, write."""
        import comfy.sample

        r, schedule = self.r, self.s.schedule
        _interrupt_check()
        chunk_index, frame0 = self.s.first_chunk + c, self.s.first_frame + f0
        t0 = time.perf_counter()
        prompt = schedule.at(chunk_index)
        now = schedule.fingerprint_at(chunk_index)
        rope_frame = self.krea_recompute(chunk_index, frame0, prompt, now) if r.recompute_frames else frame0
        self.switch_prompt(chunk_index, frame0, prompt, now)
        self.run.begin(chunk_index, rope_frame, PHASE_DENOISE)
        if self.redraw:
            self.redraw_noise = self._redraw_generators(chunk_index)
        latent_image = self.s.latent_image
        noise = comfy.sample.prepare_noise(
            latent_image[:, :, f0:f1], chunk_seed(r.seed, chunk_index, NOISE_STREAM), self.batch_inds
        )
        chunk = comfy.sample.sample_custom(
            self.work,
            noise,
            r.cfg,
            r.sampler,
            r.sigmas_of(c),
            prompt,
            r.negative,
            latent_image[:, :, f0:f1],
            callback=self._on_step(c, chunk_index),
            disable_pbar=True,
            seed=chunk_seed(r.seed, chunk_index, SAMPLER_STREAM),
        )
        self.out[:, :, f0:f1] = chunk.to(self.out.dtype)
        self.denoise_seconds.append(time.perf_counter() - t0)
        if (c < self.s.plan.chunks - 1 or r.keep_state) and not r.recompute_frames:
            self.write(chunk_index, frame0, self.out[:, :, f0:f1], prompt)
        self.seconds.append(time.perf_counter() - t0)
        logger.debug(
            "jensen_kv: chunk %d (frames %d-%d) took %.3f s",
            chunk_index,
            frame0,
            frame0 + f1 - f0 - 1,
            self.seconds[-1],
        )

    def switch_prompt(self, chunk_index: int, frame0: int, prompt, now) -> None:
        """Chunk ``chunk_index`` (written or denoised next) is made under ``prompt`` (fingerprint ``now``): on a
        switch, re-cache the retained chunks under it first (``recache_mode``), for a prefix clip's chunks as for
        generated ones, so a clip extended with a schedule holds what one run would."""
        r = self.r
        if self.active is not None and now != self.active and r.recache_on_switch:
            index = self.s.schedule.index_at(chunk_index)
            if r.recache_mode == "longlive":
                self.recache_longlive(prompt, index, frame0)
            else:
                self.recache(prompt, index)
        self.active = now

    def _on_step(self, c: int, chunk_index: int):
        """The sampler callback of chunk ``c``: step count, progress bar and preview, step_callback, interrupt."""
        steps, total_steps, done = self.chunk_steps[c], sum(self.chunk_steps), sum(self.chunk_steps[:c])

        def on_step(step, x0, x, total):
            self.run.step = step + 1
            if self.pbar is not None:
                preview_bytes = None
                if self.previewer is not None:
                    try:
                        preview_bytes = self.previewer.decode_latent_to_preview_image("JPEG", x0)
                    except Exception:  # noqa: BLE001 - never fail a run for a preview
                        logger.debug("jensen_kv: preview failed", exc_info=True)
                self.pbar.update_absolute(done + step + 1, total_steps, preview_bytes)
            if self.r.step_callback is not None:
                self.r.step_callback(chunk_index, step, steps)
            _interrupt_check()

        return on_step

    def write(self, chunk_index: int, frame_offset: int, clean, prompt, record: bool = True) -> None:
        """One cache-writing forward of ``clean`` (LATENT frames of one chunk) under ``prompt``."""
        _interrupt_check()
        self.run.begin(chunk_index, frame_offset, PHASE_WRITE)
        self._write_forward(chunk_index, clean, prompt)
        self.run.end_write()
        self.bytes_after_write.append(sum(c.nbytes for c in self.run.caches.values()))
        if record:
            before = list(self.timeline.items)
            self.timeline.add(RetainedChunk(chunk_index, frame_offset, clean.detach().to("cpu").clone()))
            gone = [c for c in before if all(c is not k for k in self.timeline.items)]
            if gone:
                self.evicted = gone[-1]

    def _write_forward(self, chunk_index: int, clean, prompt) -> None:
        """The model call of a write: ``clean`` at the context-noise level, as ``context_noise_mode`` says."""
        import comfy.sample

        r = self.r
        if self.ctx_sigma > 0 and r.context_noise_mode == "skyreels":
            ctx = comfy.sample.prepare_noise(clean, chunk_seed(r.seed, chunk_index, CONTEXT_STREAM), self.batch_inds)
        else:
            ctx = torch.zeros_like(clean)  # relabel: the model sees the clean latent (see _write_relabelled)
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

    def krea_recompute(self, chunk_index: int, frame0: int, prompt, now) -> int:
        """Krea's per-block cache recompute; returns the RoPE frame of the chunk to denoise.

        Mirrors daydreamlive/scope 68b0f95 ``krea_realtime_video/blocks/recompute_kv_cache.py`` (before each
        block but the first) with ``get_context_frames``: the context is the last ``recompute_frames`` (K)
        latent frames, whose first is replaced - by the very first frame while the block before starts within
        K frames of the video's start (``current_start - block < K``), else by the frame K back re-encoded by
        the VAE from its last decoded pixel frame (Krea keeps ``1 + (K - 1) x 4`` decoded frames and encodes the
        oldest, ``use_cache=False``). The cache is emptied and the context written at t = 0 (the pack's
        context_noise) with RoPE frames 0..K-1, block-causally in pieces of ``chunk_frames`` (Krea's
        ``_prepare_blockwise_causal_attn_mask`` over the context, ``local_attn_size=-1``), with no attention
        bias (Krea: "no bias to faithfully store context frames"); the chunk is then denoised at RoPE frame
        K (Krea's ``start_frame = min(current_start_frame, K)``) and never written itself. Differences: with
        fewer than K frames so far the pack uses the frames there are (Krea pads its buffer with zero
        latents; never with its defaults, K = 3 = the block); the VAE decodes the frame with two latent frames
        before it, not with its causal cache over the whole stream; without a VAE the latent frame itself is
        used. The prompt is the chunk's own, so a prompt switch needs no separate re-cache.
        """
        K, F = self.r.recompute_frames, self.r.chunk_frames
        self.active = now  # every chunk is re-cached under its own prompt
        self.run.start_rewrite()
        if frame0 == 0:
            return 0
        history = self.out[:, :, : frame0 - self.s.first_frame]
        if self.s.prefix_latent is not None:
            history = torch.cat([self.s.prefix_latent.to(self.out.dtype), history], dim=2)
        if frame0 <= K:
            context = history
        else:
            rest = history[:, :, frame0 - K + 1 :]
            if frame0 - F < K:
                first = history[:, :, :1]
            else:
                first = self._reencoded(history, frame0 - K)
            context = torch.cat([first.to(history), rest], dim=2)
        n = context.shape[2]
        for p, a in enumerate(range(0, n, F)):
            # distinct negative ids (each piece its own context-noise stream): no chunks of the video, never recorded
            self.write(-1 - chunk_index * K - p, a, context[:, :, a : a + F], prompt, record=False)
        return n

    def _reencoded(self, history: torch.Tensor, frame: int) -> torch.Tensor:
        """Latent ``frame`` as Krea re-encodes it: its last decoded pixel frame through the VAE alone (one latent
        frame, an image's); without a VAE, the latent frame as it is."""
        vae = self.r.vae
        if vae is None:
            return history[:, :, frame : frame + 1]
        out = []
        for b in range(history.shape[0]):
            pixels = vae.decode(history[b : b + 1, :, max(0, frame - 2) : frame + 1])
            pixels = pixels.reshape(-1, *pixels.shape[-3:])  # (frames, H, W, C), as VAEDecode returns them
            out.append(vae.encode(pixels[-1:, :, :, :3]).to(history.device))
        return torch.cat(out, dim=0)

    def recache_longlive(self, prompt, index: int, frame0: int) -> int:
        """LongLive's re-cache (``_recache_after_switch``, NVlabs/LongLive 2462895
        ``pipeline/interactive_causal_inference.py`` 34-96, ``global_sink: true``); returns how many chunks.

        LongLive recomputes its last ``min(local_attn_size, current_start)`` frames in one forward at
        t = context_noise (54-90). Its ``local_attn_size`` is the pack's ``(sink + window + 1) x chunk_frames``
        (:meth:`Retention.from_local_attention`). In that forward (``wan/modules/causal_model.py`` 205-348)
        every recomputed frame attends, with no mask (``attention(...)``, 337-348), to the sink and to every
        recomputed frame that lands in the cache. When the recomputed frames start after frame 0
        (``is_recompute``, 230) the sink keeps the old prompt's K/V (``write_start_index = max(...,
        sink_tokens)``, 295) and the frames that would land on it are left out, so they change nothing: what
        is recomputed is the window plus the chunk the next write evicts (LongLive's cache holds it until then,
        the pack's has dropped it). Otherwise (the switch within the first ``local_attn_size`` frames, or no
        window) everything is recomputed, the sink included. Each recomputed chunk is stored (and quantized) as
        its own entry, as a write stores it; ComfyUI keeps no cross-attention cache to reset (46-48, 93-96).
        """
        kept = list(self.timeline.items)
        if not kept:
            return 0
        rule, sink = self.timeline.rule, self.timeline.sink_held
        local_attn_frames = None if rule.window_chunks is None else self.r.chunk_frames * (rule.capacity + 1)
        keep_sink = local_attn_frames is not None and frame0 > local_attn_frames
        window, e = kept[sink:], self.evicted
        if e is not None and window and e.frame_offset + e.frames == window[0].frame_offset:
            window = [e, *window]
        chunks = window if keep_sink else kept[:sink] + window
        groups: list[list[RetainedChunk]] = []
        for c in chunks:  # consecutive chunks go into one forward (a saved state does not keep the evicted chunk)
            if groups and groups[-1][-1].frame_offset + groups[-1][-1].frames == c.frame_offset:
                groups[-1].append(c)
            else:
                groups.append([c])
        if keep_sink:
            self.run.keep_sink()
        else:
            self.run.start_rewrite()
            if self.diagnostics is not None:
                self.diagnostics.on_rewrite()
        for group in groups:
            _interrupt_check()
            self.run.begin_joint([(c.chunk, c.frame_offset, c.frames) for c in group])
            clean = torch.cat([c.latent for c in group], dim=2).to(self.out.device, self.out.dtype)
            self._write_forward(group[0].chunk, clean, prompt)
            self.run.end_write()
            self.bytes_after_write.append(sum(c.nbytes for c in self.run.caches.values()))
        n = sum(len(g) for g in groups)
        self.prompts_report[index]["recached_chunks"] += n
        logger.info(
            "jensen_kv: prompt %r from chunk %d: LongLive re-cache of %d chunk(s) in %d forward(s), sink %s",
            self.s.schedule.prompts[index].label,
            self.s.schedule.prompts[index].start_chunk,
            n,
            len(groups),
            "kept" if keep_sink else "re-cached",
        )
        return n

    def _redraw_context(
        self, executor, x, timestep, context, clip_fea=None, time_dim_concat=None, transformer_options=None, **kwargs
    ):
        """SkyReels-V2 DF's ``addnoise_condition`` (``diffusion_forcing_pipeline.py`` 314-325 / 591-603): before
        every denoising call the context frames are noised anew, ``x * (1 - f) + randn * f`` with fresh noise, at
        t = f x 1000. Here the context is the cache, so every retained chunk is re-written that way (one chunk per
        forward, causally, under the chunk's prompt; the same noise for the cond and uncond slots)."""
        run = self.run
        if run.phase != PHASE_DENOISE or not self.timeline.items:
            return executor(x, timestep, context, clip_fea, time_dim_concat, transformer_options, **kwargs)
        chunk, frame0, step = run.chunk, run.frame_offset, run.step
        labels = (transformer_options or {}).get("cond_or_uncond") or [0]
        slots, branches = len(labels), set(labels)  # ComfyUI may run cond and uncond in separate calls
        ms = self.work.get_model_object("model_sampling")
        t_ctx = ms.timestep(torch.full_like(timestep, self.ctx_sigma, dtype=torch.float32)).to(timestep.dtype)
        run.start_rewrite(branches)
        if self.diagnostics is not None:
            self.diagnostics.on_rewrite()
        if self.step_noise is None or self.step_noise[0] != (chunk, step):
            self.step_noise = ((chunk, step), {})
        drawn = self.step_noise[1]
        for kept in self.timeline.items:
            clean = self.work.model.process_latent_in(kept.latent).to(x.device, torch.float32)
            noise = drawn.get(kept.chunk)
            if noise is None:  # once per step: cond and uncond in separate calls see the same noise, as batched
                one = (1, *clean.shape[1:])
                noise = drawn[kept.chunk] = torch.cat([torch.randn(one, generator=g) for g in self.redraw_noise])
            noise = noise.to(x.device)
            noised = (clean * (1.0 - self.ctx_sigma) + noise * self.ctx_sigma).to(x.dtype)
            run.begin(kept.chunk, kept.frame_offset, PHASE_WRITE)
            batch = noised.repeat(slots, 1, 1, 1, 1)
            executor(batch, t_ctx, context, clip_fea, time_dim_concat, transformer_options, **kwargs)
            run.end_write(branches)
        self.redraws += 1
        run.begin(chunk, frame0, PHASE_DENOISE)
        run.step = step
        return executor(x, timestep, context, clip_fea, time_dim_concat, transformer_options, **kwargs)

    def _redraw_generators(self, chunk_index: int) -> list[torch.Generator]:
        """SkyReels' redraw noise of chunk ``chunk_index``: one generator per batch item, seeded from the chunk and
        the item's ``batch_index`` (index 0's is the chunk's stream itself), so an item's noise does not depend on
        the batch it runs in, as ComfyUI's noise of a LATENT with a batch_index does not."""
        seed = chunk_seed(self.r.seed, chunk_index, REDRAW_STREAM)
        inds = self.batch_inds if self.batch_inds is not None else range(self.out.shape[0])
        return [
            torch.Generator().manual_seed(seed if int(i) == 0 else chunk_seed(seed, int(i), REDRAW_STREAM))
            for i in inds
        ]

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
            # float32, as the planner counts them (STATE_LATENT_BYTES) and the file's reader wants one dtype
            retained=[RetainedChunk(c.chunk, c.frame_offset, c.latent.float()) for c in self.timeline.items],
            info={"seed": int(r.seed), "prompts": s.schedule.describe(), "model_class": s.adapter.describe()},
        )

    def close(self) -> None:
        """Unpatch the clone and free the cache and the diagnostics (in ``finally``)."""
        self.s.adapter.remove(self.work)
        if self.redraw:
            import comfy.patcher_extension

            self.work.remove_wrappers_with_key(comfy.patcher_extension.WrappersMP.DIFFUSION_MODEL, SKYREELS_WRAPPER_KEY)
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
