"""The option groups of a Chunked AR run: frozen values that check themselves (ValueError naming the value and the fix).

- :class:`Sampling`: seed, cfg, the SAMPLER and its SIGMAS, the first chunk's own schedule;
- :class:`Chunking`: latent frames per chunk (and the first chunk's), the window and the sink the cache keeps;
- :class:`Continuation`: a prefix clip to extend, a saved run to continue, whether to hand the state on;
- :class:`RecipeOptions`: what the reference recipes read (context noise and its mode, the re-cache on a prompt
  switch, Krea's recompute, attention bias and VAE); :mod:`runtime.recipes` turns them into the run's recipe;
- :class:`Hooks`: what sees the run (an attention observer, a step callback, progress and previews).

``runtime.chunk_loop.ChunkedARRequest`` holds one of each; MAGI-1's and HY-WorldPlay's requests hold the shared four
(:data:`SHARED_GROUPS`) and one options value of their own. :func:`grouped` puts flat keyword options into their
groups. No ComfyUI import here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..jensen_core.bias import check_attention_bias
from ..jensen_core.retention import Retention
from .saved_run import SavedRun
from .schedules import carried_first_chunk

#: how a prompt switch re-caches the retained chunks (:attr:`RecipeOptions.recache_mode`): ``longlive`` is
#: NVlabs/LongLive's ``_recache_after_switch`` (the default: the one reference of a prompt switch); ``causal`` is the
#: pack's own (every retained chunk, the sink included, re-written one chunk per forward), which LongLive does not do
RECACHE_MODES = ("causal", "longlive")
#: what ``context_noise`` does to a cache write (:attr:`RecipeOptions.context_noise_mode`)
CONTEXT_NOISE_MODES = ("relabel", "skyreels")


def _check_schedule(name: str, sigmas, fix: str) -> None:
    if not isinstance(sigmas, torch.Tensor) or sigmas.ndim != 1 or sigmas.numel() < 2:
        raise ValueError(
            f"{name} must be a 1-D schedule with at least 2 values (one step), got "
            f"{tuple(sigmas.shape) if isinstance(sigmas, torch.Tensor) else type(sigmas).__name__}{fix}"
        )
    if not torch.isfinite(sigmas).all():
        raise ValueError(f"{name} contains NaN or Inf values: {sigmas.tolist()}{fix}")


def _whole(name: str, value, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name}={value!r} must be {what}")


def refuse_set(why: str, *settings: tuple[str, bool]) -> None:
    """One ValueError for the settings a loop fixes itself: ``settings`` are ``(what, is_set)`` pairs (``what`` names
    the value, e.g. ``"cfg=3.0"``); the message names every one that is set, then ``why`` (the reason and the fix)."""
    clash = [what for what, bad in settings if bad]
    if clash:
        raise ValueError(f"{', '.join(clash)}: {why}")


def check_one_entry(conditioning, what: str, why: str) -> None:
    """ValueError unless ``conditioning`` (a CONDITIONING list) has exactly one entry; ``what`` names it (positive,
    negative), ``why`` says why the loop takes one and how to merge several."""
    if not isinstance(conditioning, list) or len(conditioning) != 1:
        n = len(conditioning) if isinstance(conditioning, list) else type(conditioning).__name__
        raise ValueError(f"{what} conditioning has {n} entries; {why}")


@dataclass(frozen=True, eq=False)
class Sampling:
    """How every chunk is denoised: ``seed`` (each chunk derives its own noise streams from it), ``cfg``, the
    ``sampler`` (a ComfyUI SAMPLER) and ``sigmas`` (one chunk's schedule). ``first_chunk_sigmas``: the schedule of
    the first chunk a run denoises when it starts a video or extends a prefix (Causal Forcing++'s
    ``denoising_step_list_first_chunk``); unset, the one ``sigmas`` carries from its preset (AR Video Schedule's
    ``causal_forcing_framewise_2step`` / ``_1step``), else ``sigmas``. ``first_chunk_from`` says which:
    ``"given"``, ``"preset"`` or None. A loop that samples with ComfyUI's samplers needs ``sampler`` and ``sigmas``
    (:meth:`require_schedule`); one with its own schedule (MAGI-1's) refuses them."""

    seed: int
    cfg: float = 1.0
    sampler: Any = None
    sigmas: torch.Tensor | None = None
    first_chunk_sigmas: torch.Tensor | None = None
    first_chunk_from: str | None = None

    def __post_init__(self) -> None:
        if self.sigmas is not None:
            _check_schedule("SIGMAS", self.sigmas, "")
        first, source = self.first_chunk_sigmas, "given"
        if first is None and self.sigmas is not None:
            first, source = carried_first_chunk(self.sigmas), "preset"
        if first is not None:
            try:
                _check_schedule("first_chunk_sigmas", first, "")
            except ValueError:
                raise ValueError(
                    "first_chunk_sigmas must be a 1-D schedule of finite values with at least 2 values (one step), "
                    f"got {first.tolist() if isinstance(first, torch.Tensor) else type(first).__name__}; leave it "
                    "unconnected to use sigmas for every chunk"
                ) from None
            object.__setattr__(self, "first_chunk_sigmas", first)
            object.__setattr__(self, "first_chunk_from", source)
        if not isinstance(self.cfg, (int, float)) or not math.isfinite(self.cfg) or self.cfg < 0:
            raise ValueError(f"cfg={self.cfg} must be a non-negative number")

    def require_cfg_one(self, why: str) -> None:
        """ValueError unless ``cfg`` is 1, for a loop that samples without guidance (``why``: whose rule it is)."""
        if not math.isclose(float(self.cfg), 1.0):
            raise ValueError(f"cfg={self.cfg}: {why}; use cfg 1")

    def require_schedule(self) -> None:
        """ValueError unless ``sigmas`` is a schedule (a loop that samples each chunk with ComfyUI's sampler)."""
        _check_schedule("SIGMAS", self.sigmas, "")

    @property
    def branches(self) -> list[int]:
        """CFG branches the cache keeps: cond only at cfg 1, else cond and uncond."""
        return [0] if math.isclose(self.cfg, 1.0) else [0, 1]

    def sigmas_of(self, c: int, resumed: bool) -> torch.Tensor:
        """The schedule of a run's ``c``-th chunk: ``first_chunk_sigmas`` for the first one of a run that starts the
        video or extends a prefix (not a continued one: its first chunk is not the video's), else ``sigmas``."""
        if c == 0 and self.first_chunk_sigmas is not None and not resumed:
            return self.first_chunk_sigmas
        return self.sigmas


@dataclass(frozen=True)
class Chunking:
    """How the video splits and what the cache keeps: ``chunk_frames`` latent frames per chunk (the video's first
    chunk ``first_chunk_frames``, 0: as the others; 1 is the references' independent first frame), the newest
    ``window_chunks`` (0: all) and the first ``sink_chunks`` for good."""

    chunk_frames: int
    window_chunks: int = 0
    sink_chunks: int = 0
    first_chunk_frames: int = 0

    def __post_init__(self) -> None:
        f = self.first_chunk_frames
        if isinstance(f, bool) or not isinstance(f, int):
            raise ValueError(f"first_chunk_frames={f!r} must be an integer (0: chunk_frames)")
        if f < 0:
            raise ValueError(
                f"first_chunk_frames={f} must be 0 (as chunk_frames) or a number of latent frames (1 for an "
                "independent first frame)"
            )
        if f > self.chunk_frames:
            raise ValueError(
                f"first_chunk_frames={f} is longer than chunk_frames={self.chunk_frames}: a first chunk may only be "
                "shorter (the references' independent first frame is 1 frame), since the planner and the window "
                "assume no chunk is longer than chunk_frames; lower first_chunk_frames or raise chunk_frames"
            )
        if self.window_chunks < 0:
            raise ValueError(
                f"window_chunks={self.window_chunks} must be 0 (keep every chunk) or a positive number of chunks"
            )
        if self.sink_chunks < 0:
            raise ValueError(
                f"sink_chunks={self.sink_chunks} must be 0 (no attention sink) or a positive number of chunks"
            )

    @property
    def retention(self) -> Retention:
        """The rule the caches keep chunks by (the window and the sink)."""
        return Retention(self.window_chunks, self.sink_chunks)


@dataclass(frozen=True, eq=False)
class Continuation:
    """Where the run starts and what it hands on: ``prefix`` (a LATENT of existing frames written into the cache
    first; ``include_prefix`` puts them in front of the output), ``resume`` (a :class:`SavedRun` to continue, never
    modified), ``keep_state`` (also write the last chunk and return the state to continue from)."""

    prefix: dict | torch.Tensor | None = None
    include_prefix: bool = False
    resume: SavedRun | None = None
    keep_state: bool = False

    def __post_init__(self) -> None:
        if self.prefix is not None and self.resume is not None:
            raise ValueError(
                "give either a KV cache to continue from or a prefix clip to extend, not both: a saved cache "
                "already holds the frames before it"
            )

    def refuse(self, *, prefix: str | None = None, state: str | None = None) -> None:
        """For a loop that extends no clip (``prefix``: why, and what it starts from) or hands no KV cache on
        (``state``: why): ValueError naming what was connected and how to go on."""
        if prefix is not None and self.prefix is not None:
            raise ValueError(f"a prefix clip: {prefix}; leave prefix unconnected")
        if state is not None and (self.keep_state or self.resume is not None):
            raise ValueError(
                f"saving or continuing a KV cache: {state}; leave the kv_cache input and output unconnected"
            )


@dataclass(frozen=True, eq=False)
class RecipeOptions:
    """What the reference recipes read (:mod:`runtime.recipes` picks the run's recipe from them).

    ``context_noise``: the noise level of the cache-writing forward as a fraction of the model's maximum sigma
    (Wan's flow matching: it *is* the sigma; 0 = clean); ``context_noise_mode`` ``"relabel"`` (Self-Forcing,
    CausVid, LongLive: the clean chunk, told t = context_noise x 1000) or ``"skyreels"`` (SkyReels-V2 DF's
    ``addnoise_condition``: noised to that level, with fresh noise at every denoising step).
    ``recache_on_switch``: re-write the retained chunks when the prompt changes; ``recache_mode`` how
    (:data:`RECACHE_MODES`: ``"longlive"``, NVlabs/LongLive's, by default; ``"causal"``, the pack's own).
    ``recompute_frames`` (Krea's ``kv_cache_num_frames``; 0 = off): before each chunk the cache is rebuilt from the
    last N latent frames; ``vae`` re-encodes the first of them from the decoded video, as Krea does.
    ``attention_bias`` (Krea's ``kv_cache_attention_bias``; 1.0 = off): ``log(bias)`` on the scores of every cached
    key but the first cached frame's while denoising."""

    context_noise: float = 0.0
    context_noise_mode: str = "relabel"
    recache_on_switch: bool = True
    recache_mode: str = "longlive"
    recompute_frames: int = 0
    attention_bias: float = 1.0
    vae: Any = None

    def __post_init__(self) -> None:
        if not 0.0 <= self.context_noise <= 1.0:
            raise ValueError(f"context_noise={self.context_noise} must be between 0 (clean context) and 1 (pure noise)")
        if self.recache_mode not in RECACHE_MODES:
            raise ValueError(f"recache_mode={self.recache_mode!r} is not known; use one of {', '.join(RECACHE_MODES)}")
        if self.context_noise_mode not in CONTEXT_NOISE_MODES:
            raise ValueError(
                f"context_noise_mode={self.context_noise_mode!r} is not known; use one of {', '.join(CONTEXT_NOISE_MODES)}"
            )
        check_attention_bias(self.attention_bias)
        _whole("recompute_frames", self.recompute_frames, "0 (off) or a number of latent frames (Krea uses 3)")
        if self.recompute_frames == 0 and self.vae is not None:
            raise ValueError("a VAE is used only with recompute_frames > 0 (it re-encodes the first context frame)")

    @property
    def skyreels_noise(self) -> bool:
        """Whether cache writes are noised (SkyReels-V2 DF's context noise, redrawn every step)."""
        return self.context_noise_mode == "skyreels" and self.context_noise > 0


@dataclass(frozen=True, eq=False)
class Hooks:
    """What sees the run: ``observer`` (every attention call, :mod:`runtime.observer`), ``step_callback(chunk, step,
    steps)`` after every denoising step, ``progress`` / ``preview`` (ComfyUI's progress bar and latent previews)."""

    observer: Any = None
    step_callback: Callable[[int, int, int], None] | None = None
    progress: bool = True
    preview: bool = True


#: option groups of a request: its field name -> (the group's class, the flat option names it takes)
OptionGroups = dict[str, tuple[type, tuple[str, ...]]]


def grouped(groups: OptionGroups, options: dict, what: str, defaults: dict | None = None) -> dict[str, Any]:
    """Flat keyword ``options`` (``seed=..., window_chunks=...``) put into their groups: ``{field: group value}``
    for a request's constructor. ``defaults`` fills names not given (a family's fixed chunk); an unknown name is a
    TypeError that lists ``what``'s options."""
    known = {name for _, names in groups.values() for name in names}
    unknown = sorted(set(options) - known)
    if unknown:
        raise TypeError(f"unknown {what} options {unknown}; the options are {sorted(known)}")
    given = {**(defaults or {}), **options}
    return {field: kind(**{k: given[k] for k in names if k in given}) for field, (kind, names) in groups.items()}


#: the shared groups every loop's request takes (the Chunked AR loop, MAGI-1's and HY-WorldPlay's recipes)
SHARED_GROUPS: OptionGroups = {
    "sampling": (Sampling, ("seed", "cfg", "sampler", "sigmas", "first_chunk_sigmas")),
    "chunking": (Chunking, ("chunk_frames", "window_chunks", "sink_chunks", "first_chunk_frames")),
    "continuation": (Continuation, ("prefix", "include_prefix", "resume", "keep_state")),
    "hooks": (Hooks, ("observer", "step_callback", "progress", "preview")),
}
