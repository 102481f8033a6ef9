"""The MAGI-1 AR Sampler's schedule rules that decide what its cache holds, shared by the recipe (which runs them)
and the family (its planner rule, :func:`plan_chunks`, which the web planner and the recipe both ask): the window sizes and steps it takes, its key ranges, and how many
finished chunks a query reads."""

from __future__ import annotations

import math

from ...options import Chunking
from ..base import PlannerFieldError
from .model import pipeline as P
from .model.sampler import MagiSettings

#: the sampler's defaults: 16 steps (the 24B distill config and the paper; the 4.5B configs ship 64), window 4
DEFAULT_STEPS = 16
WINDOW_SIZES = (1, 2, 3, 4)


def parse_kv_ranges(text: str) -> tuple[int, ...]:
    """``"5,4,3,2"`` -> (5, 4, 3, 2) (chunks each query reaches back, itself included, per stage of its steps);
    ``"all"`` -> () (every chunk reads every earlier chunk). ValueError naming the fix otherwise."""
    t = str(text).strip().lower()
    if t in ("all", ""):
        return ()
    try:
        out = tuple(int(p) for p in t.replace(" ", "").split(","))
    except ValueError:
        out = None
    if not out or any(v < 1 for v in out):
        raise ValueError(
            f"kv_ranges={text!r}: give whole chunk counts >= 1 separated by commas, one per stage of a chunk's steps "
            "(the reference's 5,4,3,2), or 'all'"
        )
    return out


def check_schedule(num_steps: int, window_size: int, kv_ranges: tuple[int, ...]) -> None:
    """ValueError naming the fix when the MAGI-1 AR Sampler cannot run ``num_steps`` steps per chunk at
    ``window_size`` chunks in flight with these key ranges (one per stage of a chunk's steps: each a whole number
    of chunks >= 1, since a chunk's range holds the chunk itself)."""
    if isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps < 1:
        raise ValueError(f"num_steps={num_steps!r} must be a whole number >= 1")
    bad = [r for r in kv_ranges if isinstance(r, bool) or not isinstance(r, int) or r < 1]
    if bad:
        raise ValueError(
            f"kv_ranges {list(kv_ranges)}: a key range of {bad[0]!r} chunks; each is a whole number of chunks >= 1 "
            "(the chunk itself and the earlier chunks it reads): use e.g. the reference's 5,4,3,2, or 'all'"
        )
    if window_size not in WINDOW_SIZES:
        raise ValueError(f"window_size={window_size!r}: MAGI-1 keeps 1 to 4 chunks in flight")
    if num_steps % window_size:
        ok = [w for w in WINDOW_SIZES if num_steps % w == 0]
        raise ValueError(
            f"num_steps {num_steps} is not a multiple of window_size {window_size} (each chunk spends "
            f"num_steps / window_size forwards at each place of the window): use window_size {ok} or steps that "
            f"divide by {window_size}"
        )
    if kv_ranges and num_steps % len(kv_ranges):
        raise ValueError(
            f"num_steps {num_steps} does not split into the {len(kv_ranges)} stages of kv_ranges "
            f"{list(kv_ranges)}: use steps that divide by {len(kv_ranges)}"
        )


def finished_reached(settings: MagiSettings, chunks: int) -> int:
    """The most finished chunks any query of this run reads (counted over every forward): what a cache of finished
    chunks must hold so that nothing in a key range is evicted."""
    most = 0
    for st in P.steps_of(settings.num_steps, settings.window_size, chunks):
        ranges = P.key_ranges(st.slice_point, st.steps_of_chunks, settings.num_steps, settings.noise2clean_kvrange, 1)
        for s, _ in ranges:
            most = max(most, st.slice_point - s)
    return most


def auto_window(settings: MagiSettings, chunks: int) -> int:
    """What the sampler's window 0 keeps: as many finished chunks as the key ranges reach (at least one), or every
    chunk (0) when the ranges are unbounded."""
    return max(1, finished_reached(settings, chunks)) if settings.noise2clean_kvrange else 0


def _kv_ranges(raw) -> tuple[tuple[int, ...], str]:
    """The key ranges of a sampler input (a tuple as the request holds it, or the node's text; absent: the
    reference's) and their text, checked as the sampler checks them."""
    if isinstance(raw, (tuple, list)):
        return tuple(raw), ",".join(map(str, raw)) or "all"
    text = str(raw or "").strip() or ",".join(map(str, P.NOISE2CLEAN_KVRANGE))
    try:
        return parse_kv_ranges(text), text
    except ValueError as exc:
        raise PlannerFieldError("kv_ranges", text, "is not a list of key ranges", str(exc)) from None


def plan_chunks(asked: Chunking, latent_frames: int, fields=None, preset=None) -> tuple[Chunking, tuple[str, ...]]:
    """The MAGI-1 AR Sampler's planner rule (``Magi1Family.plan_chunks``): its chunk (``preset.chunk_frames``, 6
    latent frames, where a preset is planned; a run's request carries its own), and what its window 0 keeps: the
    finished chunks its key ranges reach at ``window_size`` / ``kv_ranges`` / ``steps`` (``fields``: the node's
    values or query strings, the node's defaults when absent), checked as the sampler checks them; a note for each."""
    fields, notes = fields or {}, []
    chunk, window = asked.chunk_frames, asked.window_chunks
    if preset is not None and preset.chunk_frames and chunk != preset.chunk_frames:
        notes.append(
            f"MAGI-1 AR Sampler makes chunks of {preset.chunk_frames} latent frames: planned with chunk "
            f"{preset.chunk_frames} (the chunk given, {chunk}, does not apply)"
        )
        chunk = preset.chunk_frames
    if window == 0:
        window, why = _auto_window(fields, latent_frames, chunk)
        notes.append(why)
    return Chunking(chunk, window, asked.sink_chunks), tuple(notes)


def _auto_window(fields, latent_frames: int, chunk_frames: int) -> tuple[int, str]:
    """What the MAGI-1 AR Sampler's window 0 keeps, and a line that says so."""

    def whole(name: str, default: int) -> int:
        raw = str(fields.get(name) or "").strip() or str(default)
        try:
            return int(raw)
        except ValueError:
            raise PlannerFieldError(name, raw, "is not a whole number", "give e.g. " + f"{name}={default}") from None

    window_size, steps = whole("window_size", 4), whole("steps", DEFAULT_STEPS)
    ranges, text = _kv_ranges(fields.get("kv_ranges"))
    try:
        check_schedule(steps, window_size, ranges)
    except ValueError as exc:  # window_size out of range, or steps that do not divide by it or by the stages
        name, value = ("window_size", window_size) if window_size not in WINDOW_SIZES else ("steps", steps)
        if any(r < 1 for r in ranges):
            name, value = "kv_ranges", text
        raise PlannerFieldError(name, value, "is not one the MAGI-1 AR Sampler runs", str(exc)) from None
    settings = MagiSettings(
        num_steps=steps, window_size=window_size, chunk_width=chunk_frames, noise2clean_kvrange=ranges
    )
    window = auto_window(settings, max(1, math.ceil(latent_frames / chunk_frames)))
    if not window:
        return 0, "MAGI-1 AR Sampler with kv_ranges 'all' and window 0 keeps every finished chunk"
    return window, (
        f"MAGI-1 AR Sampler's window 0 keeps what its key ranges reach: {window} finished chunk(s) at "
        f"window_size {window_size}, kv_ranges {text}"
    )
