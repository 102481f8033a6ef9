"""Attention diagnostics during a Chunked AR run: the quantized cache against a full-precision shadow.

The **KV Cache Diagnostics** node stores a :class:`DiagnosticsRequest` on a cloned MODEL
(``model_options["transformer_options"]["jensen_kv_diagnostics"]``). When the Chunked AR sampler finds
one, it builds a :class:`DiagnosticsObserver` for the run (see ``chunk_loop.run_chunked_ar``); without
one, no observer exists and the run pays nothing.

The observer sees every self-attention call of the sampled layers (``runtime.observer``):

- write phase: the chunk's full-precision post-RoPE K/V, just before the cache quantizes and appends
  them. It keeps a clone of the sampled heads (the *shadow*), kept under the cache's own
  :class:`~jensen_core.retention.Retention`.
- denoising phase, sampled steps, chunks >= 1: it compares attention over the cache as the run read it
  (``event.cache.entries``) with the full-precision shadow on the same queries, using
  :func:`jensen_core.attention_shift.attention_shift`, once without correction ("off") and once with the
  run's correction and strength (or, if the run applied none, with the full "taylor" correction as a
  what-if).

No ComfyUI import here: this module is unit-testable with synthetic events.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

import torch
from torch import Tensor

from ..jensen_core import StoredTensor, method_of
from ..jensen_core.attention_shift import attention_shift
from ..jensen_core.bias import check_mode
from ..jensen_core.quant import cat_quantized
from ..jensen_core.retention import Retained, Retention
from ..jensen_core.shift_summary import ShiftAccumulator, common_histogram
from .config import get_option, set_option
from .observer import PHASE_DENOISE, PHASE_WRITE, AttentionEvent

logger = logging.getLogger("jensen_kv")

REQUEST_KEY = "jensen_kv_diagnostics"
HIST_BINS = 60
WHAT_IF_MODE = "taylor"
SELECTION_HELP = "'all', 'every N' (0, N, 2N, ...), 'first', 'last', or 0-based indices and ranges such as '0, 4, 8-11'"
_EVERY = re.compile(r"^every\s+(\d+)(?:st|nd|rd|th)?$")
_RANGE = re.compile(r"^(\d+)\s*-\s*(\d+)$")


# ----------------------------------------------------------------------------------------- selections
def check_selection(text: str, what: str) -> str:
    """Normalise a selection string (syntax only; indices are checked against the model at run time)."""
    if not isinstance(text, str):
        raise ValueError(f"{what}={text!r} must be a string: {SELECTION_HELP}")
    norm = " ".join(text.strip().lower().split())
    if norm in ("all", "first", "last"):
        return norm
    m = _EVERY.match(norm)
    if m:
        if int(m.group(1)) < 1:
            raise ValueError(f"{what}={text!r}: 'every N' needs N >= 1, e.g. 'every 8'")
        return f"every {int(m.group(1))}"
    parts = [p.strip() for p in norm.split(",")]
    if not norm or any(not (p.isdigit() or _RANGE.match(p)) for p in parts):
        raise ValueError(f"{what}={text!r} is not a selection; use {SELECTION_HELP}")
    for p in parts:
        r = _RANGE.match(p)
        if r and int(r.group(1)) > int(r.group(2)):
            raise ValueError(
                f"{what}={text!r}: the range {p!r} runs backwards; write it as '{r.group(2)}-{r.group(1)}'"
            )
    return ", ".join(parts)


def resolve_selection(text: str, count: int, what: str) -> list[int]:
    """The sorted 0-based indices that ``text`` picks out of ``count`` (layers, heads or steps)."""
    norm = check_selection(text, what)
    if count < 1:
        raise ValueError(f"there are no {what} to select from")
    if norm == "all":
        return list(range(count))
    if norm == "first":
        return [0]
    if norm == "last":
        return [count - 1]
    m = _EVERY.match(norm)
    if m:
        return list(range(0, count, int(m.group(1))))
    picked: set[int] = set()
    for p in norm.split(", "):
        r = _RANGE.match(p)
        lo, hi = (int(r.group(1)), int(r.group(2))) if r else (int(p), int(p))
        if hi >= count:
            raise ValueError(
                f"{what}={text!r} asks for index {hi}, but this run has {count} {what} (0-{count - 1}); "
                f"use indices below {count}, 'all' or 'every N'"
            )
        picked.update(range(lo, hi + 1))
    return sorted(picked)


# ------------------------------------------------------------------------------------------- request
@dataclass(frozen=True)
class DiagnosticsRequest:
    """What to sample: layer, head and denoising-step selections, and every how-many-th query."""

    layers: str = "every 8"
    heads: str = "all"
    steps: str = "all"
    query_stride: int = 4

    def __post_init__(self) -> None:
        for name in ("layers", "heads", "steps"):
            object.__setattr__(self, name, check_selection(getattr(self, name), name))
        s = self.query_stride
        if isinstance(s, bool) or not isinstance(s, int) or s < 1:
            raise ValueError(f"query_stride={s!r} must be a whole number >= 1 (1 = every query, 4 = every 4th)")

    def describe(self) -> str:
        stride = "every query" if self.query_stride == 1 else f"every {self.query_stride}th query"
        return f"layers {self.layers}, heads {self.heads}, steps {self.steps}, {stride}"


def get_request(model_options: dict | None) -> DiagnosticsRequest | None:
    return get_option(model_options, REQUEST_KEY, DiagnosticsRequest, "KV Cache Diagnostics")


def set_request(model_patcher, request: DiagnosticsRequest) -> None:
    """Store ``request`` on ``model_patcher`` (call it on a clone only)."""
    set_option(model_patcher, REQUEST_KEY, request)


# ------------------------------------------------------------------------------------------ observer
def _cat(parts: list) -> StoredTensor | Tensor:
    if isinstance(parts[0], StoredTensor):
        return cat_quantized(parts)
    return torch.cat(parts, dim=-2)


def _spec_text(bits_k: set, bits_v: set, spec) -> str:
    """The cache's label: each side's bits over every chunk observed (``INT2-4 by age`` under age tiers, whose
    chunks differ in bits only), group size and scheme; ``full`` for an unquantized side."""

    def side(bits: set) -> str:
        if not bits:
            return "full"
        lo, hi = min(bits), max(bits)
        return f"INT{lo}" if lo == hi else f"INT{lo}-{hi} by age"

    text = f"K {side(bits_k)} / V {side(bits_v)}"
    if spec is not None:
        text += f", g{spec.group_size}, {method_of(spec).scheme(spec)}"
    return text


def _bits_of(t) -> set:
    """The bit widths a cached side holds: one, or each part's of a tiered join."""
    if not isinstance(t, StoredTensor):
        return set()
    return {p.spec.bits for p in getattr(t, "parts", [t])}


class DiagnosticsObserver:
    """Observer of one Chunked AR run (see the module docstring); :meth:`free` drops the shadow copies."""

    def __init__(
        self,
        request: DiagnosticsRequest,
        *,
        num_layers: int,
        heads: int,
        steps: int,
        window_chunks: int | None,
        correction: str,
        strength: float,
        keys_quantized: bool,
        sink_chunks: int = 0,
        guard: bool = True,
    ):
        self.request = request
        self.layers = resolve_selection(request.layers, num_layers, "layers")
        self.heads = resolve_selection(request.heads, heads, "heads")
        self.steps = resolve_selection(request.steps, steps, "steps")
        self._layer_set, self._step_set = set(self.layers), set(self.steps)
        self._all_heads = len(self.heads) == heads
        self.retention = Retention(window_chunks or None, int(sink_chunks))  # the cache's rule, for the shadow
        self.strength = float(strength)
        self.guard = bool(guard)  # the run's guard: the corrected statistics are those of the run's attention
        correction = check_mode(correction)
        self.applied = correction  # the mode the run applied ("off": none)
        self.keys_quantized = keys_quantized
        if not keys_quantized:
            self.modes = ["off"]
        else:
            self.modes = ["off", correction if correction != "off" else WHAT_IF_MODE]
        self.what_if = keys_quantized and correction == "off"
        if self.what_if:  # the run applied nothing (mode off or strength 0): show the full Taylor correction
            self.strength = 1.0
        self.acc = {m: ShiftAccumulator() for m in self.modes}
        # full-precision (k, v) of the sampled heads of every chunk the cache holds, per (layer, branch)
        self._shadow: dict[tuple[int, int], Retained[tuple[Tensor, Tensor]]] = {}
        self._bits_seen: dict[str, set[int]] = {"k": set(), "v": set()}  # per side, over every chunk observed
        self._spec = None  # the first quantized side's spec (group size and scheme are every chunk's)
        self.chunks_seen: set[int] = set()

    @property
    def cache_text(self) -> str | None:
        """The label of the cache the run observed (None before the first observation)."""
        if not self.chunks_seen:
            return None
        return _spec_text(self._bits_seen["k"], self._bits_seen["v"], self._spec)

    # the adapter asks this before building an event: only sampled layers, and steps only when denoising
    def wants(self, layer: int, chunk: int, phase: str, step: int) -> bool:
        if layer not in self._layer_set:
            return False
        if phase == PHASE_WRITE:
            return True
        return chunk > 0 and step in self._step_set

    def _pick(self, t: Tensor) -> Tensor:
        return t if self._all_heads else t[:, self.heads]

    def __call__(self, e: AttentionEvent) -> None:
        if e.layer not in self._layer_set:
            return
        key = (e.layer, e.branch)
        if e.phase == PHASE_WRITE:
            shadow = self._shadow.get(key)
            if shadow is None:
                shadow = self._shadow[key] = Retained(self.retention)
            shadow.add((self._pick(e.k).detach().clone(), self._pick(e.v).detach().clone()))
            return
        if e.phase != PHASE_DENOISE or e.step not in self._step_set or e.cache is None or e.cache.num_chunks == 0:
            return
        entries = e.cache.entries
        shadow = self._shadow.get(key)
        if (
            shadow is None
            or len(shadow) != len(entries)
            or any(s[0].shape[-2] != en.tokens for s, en in zip(shadow, entries))
        ):
            raise RuntimeError(
                f"KV Cache Diagnostics lost track of the cache of layer {e.layer}, branch {e.branch} at chunk "
                f"{e.chunk}: it holds {len(entries)} chunks but the diagnostics saw "
                f"{0 if shadow is None else len(shadow)} written; another patch may re-run or skip the "
                "cache-writing pass - remove KV Cache Diagnostics (or that patch) for this run"
            )
        for en in entries:
            self._bits_seen["k"] |= _bits_of(en.k)
            self._bits_seen["v"] |= _bits_of(en.v)
            if self._spec is None:
                self._spec = next((t.spec for t in (en.k, en.v) if isinstance(t, StoredTensor)), None)
        k_ref = torch.cat([k for k, _ in shadow], dim=-2)
        v_ref = torch.cat([v for _, v in shadow], dim=-2)
        k_hat = _cat([en.k for en in entries])
        v_hat = _cat([en.v for en in entries])
        if not self._all_heads:
            k_hat, v_hat = k_hat[:, self.heads], v_hat[:, self.heads]
        q, k_cur, v_cur = self._pick(e.q), self._pick(e.k), self._pick(e.v)
        stride = self.request.query_stride
        elements = q[..., ::stride, :].numel()
        for mode in self.modes:
            stats = attention_shift(
                q,
                k_ref,
                v_ref,
                k_cur,
                v_cur,
                k_hat,
                v_hat,
                correction=mode,
                strength=self.strength if mode != "off" else 1.0,
                query_stride=stride,
                chunk_tokens=[en.tokens for en in entries],
                guard=self.guard,
            )
            names = [f"layer {e.layer} head {h}" for h in (self.heads if not self._all_heads else range(q.shape[1]))]
            self.acc[mode].add(stats, elements, names, batch=q.shape[0])
        self.chunks_seen.add(e.chunk)

    def free(self) -> None:
        """Drop the full-precision shadow copies (called in ``finally``; safe to call twice)."""
        self._shadow.clear()

    def on_rewrite(self) -> None:
        """The cache is being re-written (a prompt switch): the shadow follows the new writes."""
        self._shadow.clear()

    def summary(self) -> dict:
        """JSON-ready results (no tensors, no NaN) for the sampler's report under ``diagnostics``."""
        stats = {m: a.summary() for m, a in self.acc.items()}
        samples = {m: a.delta_ps() for m, a in self.acc.items()}
        calls = self.acc[self.modes[0]].calls
        out = {
            "modes": list(self.modes),
            "applied": self.applied,
            "what_if": bool(self.what_if),
            "strength": self.strength,
            "guard": self.guard,
            "keys_quantized": bool(self.keys_quantized),
            "cache": self.cache_text,
            "request": self.request.describe(),
            "layers": list(self.layers),
            "heads": list(self.heads),
            "steps": list(self.steps),
            "query_stride": self.request.query_stride,
            "calls": calls,
            "chunks": sorted(self.chunks_seen),
            "stats": stats,
            "histogram": common_histogram(samples, bins=HIST_BINS) if calls else None,
        }
        if not calls:
            out["note"] = (
                "no sampled attention call read a cached chunk: the video needs at least two chunks, "
                "and the layer/step selections must match this run"
            )
        return out


class TeeObserver:
    """Two observers as one (an explicit ``observer=`` of the chunk loop plus the diagnostics)."""

    def __init__(self, first, second):
        self.parts = (first, second)
        self._wants = [getattr(o, "wants", None) for o in self.parts]

    def wants(self, layer: int, chunk: int, phase: str, step: int) -> bool:
        return any(w is None or w(layer, chunk, phase, step) for w in self._wants)

    def __call__(self, event: AttentionEvent) -> None:
        for o, w in zip(self.parts, self._wants):
            if w is None or w(event.layer, event.chunk, event.phase, event.step):
                o(event)


def combine_observers(first, second):
    if first is None:
        return second
    if second is None:
        return first
    return TeeObserver(first, second)


def make_diagnostics(
    model_options: dict | None,
    *,
    num_layers: int,
    heads: int,
    steps: int,
    window_chunks: int,
    correction: str,
    strength: float,
    keys_quantized: bool,
    sink_chunks: int = 0,
    guard: bool = True,
) -> DiagnosticsObserver | None:
    """The run's observer when KV Cache Diagnostics is on the MODEL, else None (and no cost at all)."""
    request = get_request(model_options)
    if request is None:
        return None
    obs = DiagnosticsObserver(
        request,
        num_layers=num_layers,
        heads=heads,
        steps=steps,
        window_chunks=window_chunks,
        correction=correction,
        strength=strength,
        keys_quantized=keys_quantized,
        sink_chunks=sink_chunks,
        guard=guard,
    )
    logger.info(
        "jensen_kv: attention diagnostics on layers %s, heads %s, steps %s (every %d-th query)",
        obs.layers,
        obs.heads,
        obs.steps,
        request.query_stride,
    )
    return obs
