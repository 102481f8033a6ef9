"""MAGI-1's multi-noise chunk pipeline on the pack's quantized cache: the recipe the MAGI-1 AR Sampler runs.

The loop is the reference's (github:SandAI-org/MAGI-1 at 6ff822e, ``inference/pipeline/video_generate.py``
``SampleTransport.walk`` and ``VideoDiTModel.forward_dispatcher``), written once in :mod:`runtime.families.magi1.model.sampler` and
driven here over the patched clone (:mod:`.family`): up to ``window_size`` chunks in one forward, each at its own
time on the ``sd3`` schedule (shift 3), Euler on the predicted velocity; per chunk and per quarter of its steps a
key range of ``noise2clean_kvrange`` chunks (default 5, 4, 3, 2: itself and up to 4 earlier ones); the finished
chunk rides once in front of the next stage at ``t = 0.9999`` under the null caption, the forward that writes it to
the cache; distilled models blend the oldest chunk with a copy of it that sees itself only once it is past
``t = 0.3``; base models run three passes (text, context, unconditional) blended per chunk (cfg 3).

What the pack changes: the buffer. The reference keeps every chunk of the video in a full-precision buffer; here
only *finished* chunks are stored, in the run's :class:`runtime.run_caches.RunCaches` (quantized and corrected as
the MODEL's Quantize KV Cache / Jensen Bias Correction say, full precision without them: the A/B baseline), one
cache per layer, kept under a window (``window_chunks``; auto: as many finished chunks as the key ranges reach) and
an attention sink. The chunks still in flight are attended in full precision and never stored.

Memory: at ``window_size`` 4 with 5..2 every query reads exactly one finished chunk (the others in its range are
in flight), so the cache holds one chunk per layer; at window 1 up to four. The paper's "sliding window annealed
from 5 to 2" is ``noise2clean_kvrange`` 5, 4, 3, 2, which every published config pairs with ``window_size`` 4.

Hooks (the vocabulary of the pack's recipes): :meth:`Magi1Recipe.check` refuses what it cannot do,
:meth:`~Magi1Recipe.prefill` (nothing: text-to-video), :meth:`~Magi1Recipe.before_chunk` (a chunk enters the
window), :meth:`~Magi1Recipe.write` (a finished chunk reached every layer's cache) and
:meth:`~Magi1Recipe.on_prompt_switch` (nothing to re-cache: the cache is written under the null caption).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from ....jensen_core.planner import plan_cache
from ...config import JensenKVConfig, get_config, get_window
from ...options import SHARED_GROUPS, Chunking, Continuation, Hooks, OptionGroups, Sampling, grouped, refuse_set
from ...prompt_schedule import PromptSchedule
from ...report import MIB
from ...report import report_text as pack_text
from ...run_caches import RunCaches
from ...session import Session, interrupted
from ...shift_observer import get_request as get_diagnostics
from ..base import UnsupportedModelError, attention_override_notice
from .comfy_model import CHUNK_FRAMES
from .family import Magi1Family
from .model import pipeline as P
from .model.caption import DEFAULT_TOKENS, chunk_captions
from .model.sampler import MagiSettings, iter_sample
from .window import DEFAULT_STEPS, check_schedule, finished_reached

logger = logging.getLogger("jensen_kv")


@dataclass(frozen=True)
class Magi1Options:
    """What the MAGI-1 AR Sampler's pipeline reads besides the shared options: ``num_steps`` per chunk,
    ``window_size`` chunks in flight, ``kv_ranges`` (``noise2clean_kvrange``; () = every earlier chunk),
    ``cfg_number`` 1 (distilled) or 3 (base) passes per step, None for the model's own, and ``special_tokens`` (the
    HQ and DURATION tokens in front of every chunk's caption: the reference's default). Checks itself."""

    num_steps: int = DEFAULT_STEPS
    window_size: int = 4
    kv_ranges: tuple[int, ...] = P.NOISE2CLEAN_KVRANGE
    cfg_number: int | None = None
    special_tokens: bool = True

    def __post_init__(self) -> None:
        v = self.num_steps
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"num_steps={v!r} must be a whole number >= 1")
        check_schedule(self.num_steps, self.window_size, self.kv_ranges)
        if self.cfg_number not in (None, 1, 3):
            raise ValueError(f"cfg_number={self.cfg_number!r}: MAGI-1 runs 1 pass (distilled) or 3 (base)")


#: the flat options of :meth:`Magi1Request.from_options`, by group (the shared four and MAGI-1's own)
OPTION_GROUPS: OptionGroups = {
    **SHARED_GROUPS,
    "options": (Magi1Options, ("num_steps", "window_size", "kv_ranges", "cfg_number", "special_tokens")),
}


@dataclass(frozen=True, eq=False)
class Magi1Request:
    """One MAGI-1 run. ``positive``: MAGI-1 Text Encode's CONDITIONING, or a Prompt Schedule of them (prompts by
    chunk); the latent to make is ``latent_frames`` x ``latent_height`` x ``latent_width`` (VAE latent units).
    The shared option groups (:mod:`runtime.options`): ``sampling`` (its ``seed``; MAGI-1 runs its own schedule, so a
    SAMPLER, SIGMAS or cfg are refused: ``options.cfg_number`` is its passes), ``chunking`` (``chunk_frames`` latent
    frames per chunk; ``window_chunks`` finished chunks the cache keeps per layer, 0: as many as the key ranges
    reach, so nothing a query reads is evicted; ``sink_chunks`` the first chunks kept for good besides the window),
    ``continuation`` (a prefix, a saved run or a state to hand on: refused, :meth:`Magi1Recipe.check`), ``hooks``
    (``step_callback(step, steps)`` after every forward); and MAGI-1's own :class:`Magi1Options`. Checked here where
    no model is needed; :meth:`from_options` takes the flat names."""

    model: Any
    positive: Any
    latent_frames: int
    latent_height: int
    latent_width: int
    sampling: Sampling = field(default_factory=lambda: Sampling(seed=0))
    chunking: Chunking = field(default_factory=lambda: Chunking(CHUNK_FRAMES))
    continuation: Continuation = field(default_factory=Continuation)
    hooks: Hooks = field(default_factory=Hooks)
    options: Magi1Options = field(default_factory=Magi1Options)

    def __post_init__(self) -> None:
        for name, (cls, _) in OPTION_GROUPS.items():
            if not isinstance(getattr(self, name), cls):
                raise TypeError(f"{name} must be a {cls.__name__}, got {type(getattr(self, name)).__name__}")
        chunk = self.chunking.chunk_frames
        for name, v in (*((n, getattr(self, n)) for n in ("latent_frames", "latent_height", "latent_width")),
                        ("chunk_frames", chunk)):  # fmt: skip
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}={v!r} must be a whole number >= 1")
        if self.latent_frames % chunk:
            raise ValueError(
                f"latent_frames={self.latent_frames} is not a whole number of {chunk}-frame chunks; MAGI-1 makes "
                f"whole chunks: use {math.ceil(self.latent_frames / chunk) * chunk}"
            )
        if self.latent_height % 2 or self.latent_width % 2:
            raise ValueError(
                f"latent height {self.latent_height} and width {self.latent_width} must be even (MAGI-1 patches 2x2): "
                "use a video width and height that are multiples of 16"
            )
        seed = self.sampling.seed
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed={seed!r} must be a whole number >= 0")

    @classmethod
    def from_options(cls, model, positive, *, latent_frames, latent_height, latent_width, **options) -> Magi1Request:
        """The request of flat keyword options (``seed=..., num_steps=..., window_chunks=...``: the names of
        :data:`OPTION_GROUPS`), each put into its group; the chunk is MAGI-1's 6 latent frames unless given."""
        groups = grouped(OPTION_GROUPS, options, "MAGI-1", defaults={"seed": 0, "chunk_frames": CHUNK_FRAMES})
        return cls(model, positive, latent_frames, latent_height, latent_width, **groups)

    @property
    def chunks(self) -> int:
        return self.latent_frames // self.chunking.chunk_frames

    def settings(self, distill: bool) -> MagiSettings:
        """The reference's runtime settings for this run (``cfg_number`` None: 1 for distilled models, 3 for base)."""
        o = self.options
        return MagiSettings(
            num_steps=o.num_steps,
            window_size=o.window_size,
            chunk_width=self.chunking.chunk_frames,
            noise2clean_kvrange=tuple(o.kv_ranges),
            cfg_number=o.cfg_number or (1 if distill else 3),
            distill=distill,
        )


@dataclass
class Magi1Result:
    """The video LATENT's samples (VAE latent units), the report, and per chunk: seconds from the previous chunk's
    end, and every layer's cache bytes after each write."""

    samples: torch.Tensor
    report: dict
    seconds_per_chunk: list[float] = field(default_factory=list)
    cache_bytes_after_write: list[int] = field(default_factory=list)


class Magi1Recipe:
    """One MAGI-1 run on the pack's cache (see the module docstring); :func:`run` is the shorthand."""

    def __init__(self, request: Magi1Request):
        self.r = request
        self.check(request)
        self.adapter = Magi1Family(request.model)
        self.config = get_config(request.model.model_options) or JensenKVConfig()
        self.config.check_head_dim(self.adapter.head_dim)
        self.settings = request.settings(self.adapter.config.distill)
        self.schedule = PromptSchedule.from_conditioning(request.positive, "positive")
        self.reached = finished_reached(self.settings, request.chunks)
        o = request.options
        # the family's planner rule: a window of 0 keeps what the key ranges reach (at least one chunk; every chunk
        # when they are unbounded)
        self.chunking, _ = Magi1Family.plan_chunks(
            request.chunking,
            request.latent_frames,
            {"window_size": o.window_size, "kv_ranges": o.kv_ranges, "steps": o.num_steps},
        )
        self.window = self.chunking.window_chunks
        self.warnings: list[str] = []
        if self.window and self.window < self.reached:
            self.warnings.append(
                f"window_chunks {self.window} keeps fewer finished chunks than the key ranges reach ({self.reached} at "
                f"window_size {o.window_size}, kv_ranges {list(o.kv_ranges) or 'all'}): queries read only "
                "the newest ones (and the sink), not what the reference reads"
            )
        self.prompts_report = [{"start_chunk": p.start_chunk, "label": p.label} for p in self.schedule.prompts]
        self.seconds: list[float] = []
        self._t0 = 0.0
        self.run_caches: RunCaches | None = None
        self.session: Session | None = None

    # ------------------------------------------------------------------ hooks
    @staticmethod
    def check(request: Magi1Request) -> None:
        """What this recipe cannot do, refused before anything runs (each error names the fix)."""
        found = Magi1Family.probe(request.model)
        if not found.applies:
            base = getattr(request.model, "model", None)
            what = f"{type(base).__name__} ({type(getattr(base, 'diffusion_model', None)).__name__})"
            raise UnsupportedModelError(
                f"MAGI-1 AR Sampler samples {Magi1Family.supported}. This MODEL ({what}) is not MAGI-1: load one with "
                "Load MAGI-1 Model (Wan models go to the Chunked AR Video Sampler)"
            )
        if found.problem:
            raise UnsupportedModelError(
                f"MAGI-1 AR Sampler supports {Magi1Family.supported}. This MODEL {found.problem}."
            )
        co = request.continuation
        if co.resume is not None or co.keep_state:
            raise ValueError(
                "MAGI-1 AR Sampler does not save or continue a run: its chunks are denoised several at a time, so a run "
                "cut in two would not denoise the chunks around the cut as one run does. Make the whole video in one run "
                "(leave the kv_cache input and output unconnected)"
            )
        if co.prefix is not None:
            raise ValueError(
                "MAGI-1 AR Sampler is text-to-video: extending a clip (a prefix video) is not supported; leave prefix "
                "unconnected"
            )
        sa = request.sampling
        refuse_set(
            "MAGI-1 AR Sampler runs the reference's own schedule (sd3, num_steps per chunk, equal chunks) and its "
            "passes per step are cfg_number (1 or 3): leave these unset",
            ("a SAMPLER", sa.sampler is not None),
            ("SIGMAS", sa.sigmas is not None or sa.first_chunk_sigmas is not None),
            (f"cfg={sa.cfg}", not math.isclose(float(sa.cfg), 1.0)),
            (f"first_chunk_frames={request.chunking.first_chunk_frames}", request.chunking.first_chunk_frames != 0),
        )
        options = request.model.model_options
        if get_diagnostics(options) is not None:
            raise ValueError(
                "KV Cache Diagnostics follows the Chunked AR Video Sampler's cache (one key range per call); MAGI-1's "
                "per-chunk key ranges are not supported by it yet: remove KV Cache Diagnostics from this MODEL"
            )
        if get_window(options) is not None:
            raise ValueError(
                "the MODEL carries an AR Cache Window (for ComfyUI's SamplerARVideo); set the window on MAGI-1 AR "
                "Sampler's own window_chunks / sink_chunks inputs instead"
            )
        notice = attention_override_notice(options)
        if notice is not None:
            logger.warning("jensen_kv: %s", notice)

    def prefill(self) -> None:
        """Nothing goes into the cache before the first chunk: text-to-video (no prefix video, :meth:`check`)."""

    def before_chunk(self, chunk: int) -> None:
        """Chunk ``chunk`` enters the window (its first forward is next)."""
        interrupted()
        logger.debug("jensen_kv: MAGI-1 chunk %d enters the window", chunk)

    def write(self, chunk: int) -> None:
        """Finished chunk ``chunk`` has been stored in every layer's cache (by the forward that just ran)."""
        self.run_caches.finish_write({0}, chunk=chunk)

    def on_prompt_switch(self, chunk: int, label: str) -> None:
        """The schedule switches to prompt ``label`` at ``chunk``: nothing to re-cache, since MAGI-1 writes every
        finished chunk under the null caption (the cache does not depend on the prompt)."""
        logger.info("jensen_kv: MAGI-1 prompt %r from chunk %d", label, chunk)

    # ------------------------------------------------------------------ the run
    def captions(self, dm) -> list[torch.Tensor]:
        """One caption per chunk: its prompt's valid T5 tokens with the special tokens in front (as the reference
        pads them), checked against the model."""
        special = {k: v.float() for k, v in (dm.special_tokens or {}).items()}
        tokens = DEFAULT_TOKENS if self.r.options.special_tokens else ()
        width = dm.config.caption_channels
        out, last = [], None
        chunks = self.r.chunks
        for c in range(chunks):
            p = self.schedule.prompts[self.schedule.index_at(c)]
            tensor, extra = p.entry
            if not extra.get("magi1_caption"):
                raise ValueError(
                    f"the positive conditioning ({p.label}) was not made by MAGI-1 Text Encode: MAGI-1 reads the T5-XXL "
                    "embeddings of the prompt's valid tokens; encode the prompt with MAGI-1 Text Encode (T5-XXL loaded "
                    "with CLIPLoader type pixart)"
                )
            if tensor.ndim != 3 or tensor.shape[0] != 1 or tensor.shape[-1] != width:
                raise ValueError(
                    f"the positive conditioning ({p.label}) has shape {tuple(tensor.shape)}; this MAGI-1 reads "
                    f"(1, tokens, {width}) T5 embeddings from MAGI-1 Text Encode"
                )
            if last is not None and p.label != last:
                self.on_prompt_switch(c, p.label)
            last = p.label
            out.append(chunk_captions(tensor[0], chunks, special, tokens=tokens)[c])
        return out

    def planned(self, dtype: torch.dtype) -> int:
        r, ch = self.r, self.chunking
        plan = plan_cache(
            latent_frames=r.latent_frames,
            latent_height=r.latent_height,
            latent_width=r.latent_width,
            chunk_frames=ch.chunk_frames,
            window_chunks=ch.window_chunks,
            sink_chunks=ch.sink_chunks,
            shape=self.adapter.cache_shape().for_run(cfg_branches=1, batch=1, full_bytes=torch.finfo(dtype).bits // 8),
            precision=self.config.precision,
        )
        return plan.quantized_bytes or 0

    def run(self) -> Magi1Result:
        import comfy.model_management as mm

        r, adapter = self.r, self.adapter
        run = self.run_caches = RunCaches(
            self.config, self.window, adapter.num_layers, observer=r.hooks.observer, sink_chunks=r.chunking.sink_chunks
        )
        dtype = adapter.dm.compute_dtype
        planned = self.planned(dtype)
        steps = P.steps_of(self.settings.num_steps, self.settings.window_size, r.chunks)
        session = self.session = Session(
            r.model, adapter, run, self.config, planned_bytes=planned, steps=len(steps), progress=r.hooks.progress,
            preview=r.hooks.preview,
        )  # fmt: skip
        work = session.work
        with session.patched():
            dm = work.model.diffusion_model
            attention = adapter.attention
            attention.chunk_frames, attention.armed = r.chunking.chunk_frames, True
            device = work.load_device
            self.prefill()
            captions = [c.to(device) for c in self.captions(dm)]
            shape = (1, adapter.latent_channels, r.latent_frames, r.latent_height, r.latent_width)
            # the reference's noise (torch.randn after manual_seed(seed)), as ComfyUI's prepare_noise draws it
            noise = torch.randn(shape, generator=torch.Generator().manual_seed(r.sampling.seed)).to(device)
            entered, x = 0, noise
            self._t0 = time.perf_counter()
            events = iter_sample(dm, noise, captions, self.settings, attention=attention)
            for i, step in enumerate(steps):
                interrupted()
                while entered < step.chunk_end:
                    self.before_chunk(entered)
                    entered += 1
                run.at(step=i)
                event = next(events)
                x = event.latent
                for chunk in attention.take_stored():
                    self.write(chunk)
                if event.finished is not None:
                    now = time.perf_counter()
                    self.seconds.append(now - self._t0)
                    self._t0 = now
                session.progress(i + 1, None if event.finished is None else self._preview(event, work))
                if r.hooks.step_callback is not None:
                    r.hooks.step_callback(i, len(steps))
            attention.armed = False
        samples = work.model.process_latent_out(x.float()).to(mm.intermediate_device())
        return Magi1Result(samples, self.report(dtype), self.seconds, run.bytes_after_write)

    def _preview(self, event, work):
        """The chunk ``event`` finished, in the VAE's latent units, for the preview (decoded only when it is shown)."""
        cw, c = self.r.chunking.chunk_frames, event.finished
        return lambda: work.model.process_latent_out(event.latent[:, :, c * cw : (c + 1) * cw].float())

    def report(self, dtype: torch.dtype) -> dict:
        r, a, s = self.r, self.adapter, self.settings
        rep = self.session.report(
            a.cache_shape(),
            chunks=r.chunks,
            chunk_frames=r.chunking.chunk_frames,
            window_chunks=self.window,
            sink_chunks=r.chunking.sink_chunks,
            seconds=self.seconds,
            tokens_per_frame=a.geometry.tokens_per_frame(r.latent_height, r.latent_width),
            model_dtype=dtype,
            prompts=self.prompts_report,
        )
        chunk_tokens = r.chunking.chunk_frames * a.geometry.tokens_per_frame(r.latent_height, r.latent_width)
        rep.update(
            {
                "family": a.name,
                "kv_heads": a.kv_heads,
                "window_size": s.window_size,
                "num_steps": s.num_steps,
                "noise2clean_kvrange": list(s.noise2clean_kvrange),
                "cfg_number": s.cfg_number,
                "distill": s.distill,
                # what said base or distill: "file metadata", "path name" or "variant input" (Load MAGI-1 Model)
                "variant_from": getattr(self.adapter.dm, "variant_from", None),
                "finished_chunks_read": self.reached,
                # the reference's buffer: every chunk of the video, K and V, every layer, in BF16
                "reference_buffer_bytes": r.chunks * chunk_tokens * a.num_layers * 2 * a.kv_heads * a.head_dim * 2,
                "warnings": list(self.warnings),
            }
        )
        return rep


def report_text(report: dict) -> str:
    """The pack's report paragraph and MAGI-1's own lines (its pipeline, what a query read, the reference's buffer)."""
    ranges = ",".join(map(str, report["noise2clean_kvrange"])) or "all"
    lines = [
        pack_text(report).replace(
            f"{report['heads']} heads x", f"{report['heads']} query heads over {report['kv_heads']} K/V heads x"
        ),
        f"MAGI-1 {'distill' if report['distill'] else 'base'}"
        + (f" (from the {report['variant_from']})" if report.get("variant_from") else "")
        + f": {report['num_steps']} steps, {report['window_size']} chunk(s) in flight, key ranges {ranges}, "
        f"{report['cfg_number']} pass(es) per step; each query read at most {report['finished_chunks_read']} finished "
        f"chunk(s). The reference's whole-video buffer: {report['reference_buffer_bytes'] / MIB:.2f} MiB in BF16.",
    ]
    lines += [f"Warning: {w}." for w in report.get("warnings", [])]
    return "\n".join(lines)


def run(request: Magi1Request) -> Magi1Result:
    """Sample a MAGI-1 video with the pack's cache (``request.model`` is never modified: a clone is patched and
    restored, and the cache freed, in ``finally``)."""
    return Magi1Recipe(request).run()
