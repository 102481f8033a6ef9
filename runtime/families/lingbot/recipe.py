"""LingBot-World 2.0's recipe: the reference's causal-fast rollout on the pack's cache.

What the reference (robbyant/lingbot-world-v2 ``wan/image2video.py`` ``_generate_causal_fast``, run as its
``generate.py`` CLI does) does, and where it happens here (:class:`LingBotRecipe`):

- the whole video's noise is drawn first, ``randn(16, F, h, w)`` from one generator seeded with the seed, and every
  re-noise draws from the same generator, chunk by chunk, step by step: here the same, from a CPU generator
  (:meth:`LingBotRecipe._generator`), so a CPU run draws the reference's CPU stream (the reference draws on its
  device: a CUDA run's noise differs);
- chunks of ``chunk_frames`` (4) latent frames; each is denoised by 4 DMD steps at t = 999, 967, 908, 768 (shift 10,
  ``model.schedule``): x0 = x_t - sigma v, re-noised with fresh noise to the next timestep; no CFG;
- the image condition (4 mask channels + the start image's latent) and the camera features are the chunk's own;
- after the last step, one forward of the clean x0 at t = 0 writes the chunk's K/V (post-RoPE, absolute frame
  positions): here :meth:`RunCaches.joint_write` stores it as ``chunk / e`` cache entries of ``e`` frames (``e`` of
  ``model.window.cache_rule``), quantized as the MODEL's Quantize KV Cache says (full precision without it). The
  reference also runs that pass after the last chunk; nothing reads it, so it is skipped here;
- the window and sink in latent frames (``local_attn_size`` 18, ``sink_size`` 6): the retention rule of those
  entries keeps exactly the frames the reference attends (``model.window``).

:meth:`LingBotRecipe.check` refuses what the recipe cannot do, by name: cfg other than 1, a window or sink in chunks
(give ``local_attn_size`` / ``sink_size`` in latent frames), a prefix clip, saving or continuing a KV cache, a
prompt schedule, a SAMPLER or SIGMAS (the schedule is the reference's).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from ....jensen_core.planner import plan_cache
from ...config import JensenKVConfig, get_config, get_window
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
from ...report import report_text as _base_report_text
from ...run_caches import RunCaches
from ...saved_run import RetainedChunk
from ...session import Session, interrupted
from ..base import UnsupportedModelError, attention_override_notice
from .comfy_model import SAMPLER_NODE
from .family import SUPPORTED, LingBotFamily
from .model.camera import CameraMap, CameraPath
from .model.keys import CAMERA_BLOCK, CAMERA_GLOBAL
from .model.schedule import DEFAULT_INDICES, DEFAULT_SHIFT, DMDSchedule, dmd_schedule
from .model.window import DEFAULT_CHUNK, DEFAULT_LOCAL_ATTN, DEFAULT_SINK, MAX_LATENT_FRAMES, CacheRule, cache_rule

logger = logging.getLogger("jensen_kv")


@dataclass(frozen=True, eq=False)
class LingBotOptions:
    """What LingBot-World's recipe reads besides the shared options: the ``camera`` path, the reference's window and
    sink in latent frames (``local_attn_size`` -1: every frame), and its schedule (``shift``, ``timestep_indices``)."""

    camera: CameraPath
    local_attn_size: int = DEFAULT_LOCAL_ATTN
    sink_size: int = DEFAULT_SINK
    shift: float = DEFAULT_SHIFT
    timestep_indices: tuple[int, ...] = DEFAULT_INDICES

    @property
    def schedule(self) -> DMDSchedule:
        return dmd_schedule(self.shift, self.timestep_indices)


OPTION_GROUPS: OptionGroups = {
    **SHARED_GROUPS,
    "options": (LingBotOptions, ("camera", "local_attn_size", "sink_size", "shift", "timestep_indices")),
}


@dataclass(frozen=True, eq=False)
class LingBotRequest:
    """One LingBot-World run: the MODEL, its prompt (one CONDITIONING entry carrying WanImageToVideo's image
    condition), the LATENT to fill and the option groups (the shared four and :class:`LingBotOptions`)."""

    model: Any
    positive: Any
    latent: dict
    sampling: Sampling
    options: LingBotOptions
    chunking: Chunking = field(default_factory=lambda: Chunking(DEFAULT_CHUNK))
    continuation: Continuation = field(default_factory=Continuation)
    hooks: Hooks = field(default_factory=Hooks)

    @classmethod
    def from_options(cls, model, positive, latent, camera, seed, **options) -> LingBotRequest:
        given = dict(camera=camera, seed=seed, **options)
        return cls(
            model, positive, latent, **grouped(OPTION_GROUPS, given, "LingBot-World", {"chunk_frames": DEFAULT_CHUNK})
        )

    @property
    def samples(self) -> torch.Tensor:
        return self.latent["samples"]


@dataclass
class LingBotResult:
    samples: torch.Tensor
    report: dict
    seconds_per_chunk: list[float] = field(default_factory=list)
    cache_bytes_after_write: list[int] = field(default_factory=list)


def _plain_wan_36(model_patcher) -> bool:
    try:
        import comfy.model_base

        base = model_patcher.model
        return isinstance(base, comfy.model_base.WAN21) and int(base.diffusion_model.in_dim) == 36
    except (AttributeError, ImportError, TypeError):
        return False


def detect(model_patcher) -> LingBotFamily:
    """The LingBot adapter of ``model_patcher``, or an :class:`UnsupportedModelError` that says why not."""
    found = LingBotFamily.probe(model_patcher)
    if found.supported:
        return LingBotFamily(model_patcher)
    base = getattr(model_patcher, "model", None)
    what = f"{type(base).__name__} ({type(getattr(base, 'diffusion_model', None)).__name__})"
    if found.applies:
        raise UnsupportedModelError(f"{SAMPLER_NODE} supports {SUPPORTED}. This MODEL ({what}) {found.problem}.")
    if _plain_wan_36(model_patcher):
        dropped = ", ".join([*CAMERA_GLOBAL, *(f"blocks.N.{n}" for n in CAMERA_BLOCK)])
        raise UnsupportedModelError(
            f"{SAMPLER_NODE} supports {SUPPORTED}. This MODEL ({what}) is plain Wan 2.1 with 36 input channels and no "
            f"camera layers: LingBot-World's file loaded with UNETLoader, which drops {dropped}; load it with Load "
            "LingBot-World."
        )
    raise UnsupportedModelError(
        f"{SAMPLER_NODE} supports {SUPPORTED}. This MODEL ({what}) is not LingBot-World: load its checkpoint with "
        "Load LingBot-World (Wan 2.1 models go to the Chunked AR Video Sampler)."
    )


class LingBotRecipe:
    """One LingBot-World run in flight. :meth:`check` refuses what it cannot do; :meth:`execute` owns the loop."""

    name = "lingbot"

    @staticmethod
    def check(r: LingBotRequest) -> None:
        """ValueError naming the value and the fix for everything this recipe cannot do."""
        latent = r.latent
        if not isinstance(latent, dict) or "samples" not in latent:
            raise ValueError("latent must be a LATENT (a dict with 'samples'), e.g. from WanImageToVideo")
        if latent.get("noise_mask") is not None:
            raise ValueError(f"the latent carries a noise_mask (inpainting); {SAMPLER_NODE} does not support masks")
        if not isinstance(r.options.camera, CameraPath):
            raise ValueError(
                f"camera must come from LingBot-World Camera, got {type(r.options.camera).__name__}: connect that "
                "node's camera output"
            )
        ch = r.chunking
        refuse_set(
            "LingBot-World's window and sink are the reference's, in latent frames: give local_attn_size and "
            "sink_size (18 and 6) and leave the window and sink in chunks at 0",
            (f"window_chunks={ch.window_chunks!r}", ch.window_chunks != 0),
            (f"sink_chunks={ch.sink_chunks!r}", ch.sink_chunks != 0),
            (f"first_chunk_frames={ch.first_chunk_frames!r}", ch.first_chunk_frames != 0),
        )
        r.sampling.require_cfg_one(
            "LingBot-World's causal-fast model is distilled to sample without guidance (the reference runs no CFG), "
            f"and {SAMPLER_NODE} keeps one cache branch"
        )
        refuse_set(
            f"{SAMPLER_NODE} runs the reference's DMD schedule (shift, timestep_indices); leave them unconnected",
            ("a SAMPLER", r.sampling.sampler is not None),
            ("SIGMAS", r.sampling.sigmas is not None),
        )
        r.continuation.refuse(
            prefix=f"{SAMPLER_NODE} starts from the image of its conditioning (WanImageToVideo), not from a clip to extend",
            state="LingBot-World's camera features are normalised over the whole path, so a continued run would not be "
            "the same video; there is no cache to hand on",
        )
        positive = r.positive
        check_one_entry(
            positive,
            "positive",
            "LingBot-World takes one prompt per video: give one entry (merge several with ConditioningConcat); prompt "
            "schedules are not supported",
        )
        if positive[0][1].get("concat_latent_image") is None:
            raise ValueError(
                "the conditioning has no image condition: LingBot-World is image-to-video; pass the prompt through "
                "WanImageToVideo with a start_image"
            )
        chunk = r.chunking.chunk_frames
        frames = r.samples.shape[2] if r.samples.ndim == 5 else None
        if frames is None or frames < chunk or frames % chunk:
            raise ValueError(
                f"the latent has {frames} latent frames; LingBot-World generates chunks of {chunk}, so it needs a "
                f"multiple of {chunk} (e.g. WanImageToVideo length {4 * (4 * chunk - 1) + 1} = {4 * chunk} latents)"
            )
        if frames > MAX_LATENT_FRAMES:
            raise ValueError(
                f"the latent has {frames} latent frames; LingBot-World's RoPE has {MAX_LATENT_FRAMES} time positions"
            )
        if frames > r.options.camera.latents_available():
            raise ValueError(f"the latent has {frames} latent frames but the {r.options.camera.describe()}")
        cache_rule(chunk, r.options.local_attn_size, r.options.sink_size)
        r.options.schedule  # noqa: B018 - checks shift and timestep_indices

    def __init__(self, r: LingBotRequest):
        self.check(r)
        self.r = r
        model = r.model
        self.adapter = detect(model)
        self.adapter.check_latent(r.samples)
        notice = attention_override_notice(model.model_options)
        if notice is not None:
            logger.warning("jensen_kv: %s", notice)
        if get_window(model.model_options) is not None:
            raise ValueError(
                "the MODEL carries an AR Cache Window (for ComfyUI's SamplerARVideo); LingBot-World's window is "
                f"{SAMPLER_NODE}'s local_attn_size and sink_size: remove AR Cache Window"
            )
        self.config = get_config(model.model_options) or JensenKVConfig()
        self.config.check_head_dim(self.adapter.head_dim)
        self.schedule = r.options.schedule
        self.chunk = r.chunking.chunk_frames
        self.rule: CacheRule = cache_rule(self.chunk, r.options.local_attn_size, r.options.sink_size)
        s = r.samples
        self.frames, self.chunks = s.shape[2], s.shape[2] // self.chunk
        self.tokens_per_frame = self.adapter.tokens_per_frame(tuple(s.shape))
        self.run = RunCaches(
            self.config, self.rule.window, self.adapter.num_layers, observer=r.hooks.observer,
            sink_chunks=self.rule.sink, tokens_per_frame=self.tokens_per_frame,
        )  # fmt: skip
        self.planned_bytes = self._planned_bytes()
        self.session = Session(
            model, self.adapter, self.run, self.config, planned_bytes=self.planned_bytes,
            steps=self.chunks * self.schedule.steps, progress=r.hooks.progress, preview=r.hooks.preview,
        )  # fmt: skip
        self.work = self.session.work
        self.seconds: list[float] = []

    def _planned_bytes(self) -> int:
        """The planner's peak for this run: the entries of every chunk but the last (which is never written)."""
        s = self.r.samples
        e = self.rule.entry_frames
        plan = plan_cache(
            latent_frames=(self.chunks - 1) * self.chunk + e,
            latent_height=s.shape[3],
            latent_width=s.shape[4],
            chunk_frames=e,
            window_chunks=self.rule.window,
            sink_chunks=self.rule.sink,
            shape=self.adapter.cache_shape().for_run(
                cfg_branches=1, batch=s.shape[0], full_bytes=torch.finfo(self.r.model.model_dtype()).bits // 8
            ),
            precision=self.config.precision,
        )
        return plan.quantized_bytes or 0

    # ------------------------------------------------------------------ the pieces of a chunk
    def _generator(self) -> torch.Generator:
        return torch.Generator(device="cpu").manual_seed(int(self.r.sampling.seed))

    def _draw(self, gen: torch.Generator, shape) -> torch.Tensor:
        """One reference draw: ``(16, F, h, w)`` per video at batch 1 (the reference's shape), else batch-first."""
        if shape[0] == 1:
            return torch.randn(tuple(shape[1:]), generator=gen, dtype=torch.float32).unsqueeze(0)
        return torch.randn(tuple(shape), generator=gen, dtype=torch.float32)

    def _condition(self, device) -> torch.Tensor:
        """The 20 condition channels (4 mask + 16 image latent) of the whole video, as Wan's ``concat_cond`` makes
        them from WanImageToVideo's ``concat_latent_image`` / ``concat_mask``."""
        (entry,) = self.r.positive
        opts = entry[1]
        image = opts["concat_latent_image"][:, :, : self.frames]
        mask = opts.get("concat_mask")
        if mask is not None:
            mask = mask[:, :, : self.frames]
        noise = torch.zeros(self.r.samples.shape, dtype=torch.float32, device=device)
        y = self.work.model.concat_cond(noise=noise, concat_latent_image=image, concat_mask=mask, device=device)
        return y.to(device=device, dtype=torch.float32)

    def _call(self, x, y, t: float, context, dtype):
        dm = self.work.model.diffusion_model
        opts = dict(self.work.model_options.get("transformer_options", {}))
        opts["cond_or_uncond"] = [0]
        xin = torch.cat([x, y], dim=1).to(dtype)
        ts = torch.full((x.shape[0],), float(t), dtype=torch.float32, device=x.device)
        with torch.no_grad():
            return dm(xin, ts, context, transformer_options=opts).float()

    # ------------------------------------------------------------------ the loop
    def execute(self) -> LingBotResult:
        r, sched = self.r, self.schedule
        with self.session.patched():
            device = self.work.load_device
            dtype = self.work.model.manual_cast_dtype or self.work.model.get_dtype()
            route = self.adapter.route
            s = r.samples
            camera = CameraMap(r.options.camera, self.frames, s.shape[3], s.shape[4])
            y = self._condition(device)
            context = r.positive[0][0].to(device=device, dtype=dtype)
            gen = self._generator()
            noise = self._draw(gen, tuple(s.shape)).to(device)
            out = torch.zeros(s.shape, dtype=torch.float32, device=device)
            e = self.rule.entry_frames
            for c in range(self.chunks):
                interrupted()
                t0 = time.perf_counter()
                f0, f1 = c * self.chunk, (c + 1) * self.chunk
                y_c, x = y[:, :, f0:f1], noise[:, :, f0:f1]
                route.set_call(f0, camera.tokens(f0, f1, dtype=dtype, device=device))
                self.run.denoise(f0 // e, f0)
                x0 = x
                for i in range(sched.steps):
                    self.run.at(step=i)
                    v = self._call(x, y_c, sched.timesteps[i], context, dtype)
                    x0 = sched.to_x0(i, x, v)
                    done = c * sched.steps + i + 1
                    self.session.progress(done, x0)
                    if r.hooks.step_callback is not None:
                        r.hooks.step_callback(c, i, sched.steps)
                    interrupted()
                    if i < sched.steps - 1:
                        x = sched.renoise(i + 1, x0, self._draw(gen, tuple(x0.shape)).to(device))
                out[:, :, f0:f1] = x0
                if c < self.chunks - 1:
                    spans = [RetainedChunk((f0 + j) // e, f0 + j, x0[:, :, j : j + e]) for j in range(0, self.chunk, e)]
                    self.run.joint_write(spans, lambda x0=x0, y_c=y_c: self._call(x0, y_c, 0.0, context, dtype))
                self.seconds.append(time.perf_counter() - t0)
            samples = self.work.model.process_latent_out(out).to(s.dtype).cpu()
        return self.result(samples)

    def result(self, samples) -> LingBotResult:
        o = self.r.options
        report = self.session.report(
            self.adapter.cache_shape(),
            chunks=self.chunks,
            chunk_frames=self.chunk,
            window_chunks=self.rule.window,
            sink_chunks=self.rule.sink,
            seconds=self.seconds,
            tokens_per_frame=self.tokens_per_frame,
            model_dtype=self.r.model.model_dtype(),
        )
        report.update(
            sampler=SAMPLER_NODE,
            recipe=self.name,
            family=self.adapter.key,
            cache_entry_frames=self.rule.entry_frames,
            local_attn_size=o.local_attn_size,
            sink_size=o.sink_size,
            timesteps=list(self.schedule.timesteps),
            shift=self.schedule.shift,
            camera=o.camera.describe(),
        )
        return LingBotResult(samples, report, self.seconds, self.run.bytes_after_write)


def run(request: LingBotRequest) -> LingBotResult:
    """Sample a LingBot-World video chunk by chunk. ``request.model`` is never modified: the route goes on a clone
    that lives for this call, removed (and the cache freed) in ``finally``."""
    return LingBotRecipe(request).execute()


def report_text(report: dict) -> str:
    """The report's paragraph, with LingBot-World's window in frames and its cache entries."""
    lines = _base_report_text(report).splitlines()
    window = report.get("local_attn_size")
    what = "every frame" if window == -1 else f"{window} latent frames (sink {report.get('sink_size')})"
    lines.insert(
        1,
        f"Window: {what}, kept as cache entries of {report.get('cache_entry_frames')} frames (sink "
        f"{report.get('sink_chunks')} entries, window {report.get('window_chunks')}); DMD timesteps "
        f"{report.get('timesteps')}; {report.get('camera')}.",
    )
    return "\n".join(lines)


__all__ = ["LingBotOptions", "LingBotRecipe", "LingBotRequest", "LingBotResult", "detect", "report_text", "run"]
