"""The KV caches of a Chunked AR run in progress: one per (layer, CFG branch), and the life of every chunk.

Family-independent: a model family's adapter (``runtime/families/``) routes each self-attention
call of the patched model to :meth:`RunCaches.attend` with post-RoPE q, k, v of shape
(batch, heads, tokens, head_dim); this class picks the cache of that layer and CFG branch,
attends over it with :meth:`jensen_core.ChunkCache.attend` and, in the write phase, appends the
chunk.

It speaks through events, one method per event, each given the model call it wraps where there is one, and no
other file assigns its fields (they are private; ``tests/test_layout.py`` checks): where the run is
(:meth:`RunCaches.denoise`, :meth:`RunCaches.at`), a chunk written (:meth:`RunCaches.write`, with the clean latents of
the chunks the caches hold kept in :attr:`RunCaches.timeline`; :meth:`RunCaches.finish_write` when the forward
stored it itself), the caches emptied and chunks written again (:meth:`RunCaches.rewrite`, :meth:`RunCaches.empty`),
several chunks in one forward (:meth:`RunCaches.joint_write`), the context redrawn (:meth:`RunCaches.redraw`), a
saved run's caches and chunks adopted (:meth:`RunCaches.adopt_run`), and for seams that store K/V outside
:meth:`RunCaches.attend` (MAGI-1's attention, core's AR path): :meth:`RunCaches.store`, :meth:`RunCaches.prepare`,
:meth:`RunCaches.commit`, :meth:`RunCaches.layer_cache`. What others read (the peak, the branches, the step) are
read-only properties. No ComfyUI import here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ..jensen_core import ChunkCache
from ..jensen_core.attention import cached_attention
from ..jensen_core.bias import attention_bias_offsets
from ..jensen_core.retention import Retained, Retention
from .config import JensenKVConfig
from .observer import BRANCH_NAMES, PHASE_DENOISE, PHASE_WRITE, AttentionEvent
from .saved_run import RetainedChunk, SavedRun


class Position(NamedTuple):
    """Where a run is (what :meth:`RunCaches.at` sets): the chunk the calls belong to, its denoising step, the phase
    (denoise or write) and the chunk's first latent frame (the RoPE frame a family gives its tokens)."""

    chunk: int
    step: int
    phase: str
    frame_offset: int


class CacheUsage(NamedTuple):
    """What a run's caches cost, as its report reads it: the peak bytes (and what the same tokens cost in BF16), the
    chunks requantized as they left an age tier, the CFG branches cached (0 = cond, 1 = uncond), and under precision
    by head the K/V heads each layer kept at the head bits (the first branch written; empty without it)."""

    peak_bytes: int
    peak_bf16_bytes: int
    chunks_demoted: int
    branches: list[int]
    promoted_heads: Mapping[int, tuple[int, ...]] | None = None


class RunCaches:
    """The caches of every (layer, CFG branch) of a run in progress, the current chunk and phase.

    ``attention_bias`` is Krea's ``kv_cache_attention_bias`` (1.0 = off): ``log(bias)`` on every cached key but the
    window's first frame (``tokens_per_frame`` tokens), while denoising only; ``on_rewrite`` is told when the caches
    are emptied to be written again (the diagnostics)."""

    def __init__(
        self,
        config: JensenKVConfig,
        window_chunks: int,
        num_layers: int,
        observer=None,
        sink_chunks: int = 0,
        on_rewrite: Callable[[], None] | None = None,
        *,
        attention_bias: float = 1.0,
        tokens_per_frame: int = 0,
    ):
        self._precision = config.precision
        self._num_layers = num_layers
        self._window_chunks = window_chunks or None
        self._sink_chunks = int(sink_chunks)
        self._correction = config.effective_correction
        self._strength = float(config.strength)
        self._guard = bool(config.guard)
        self._observer = observer
        self._wants = getattr(observer, "wants", None)
        self._attention_bias = float(attention_bias)
        self._tokens_per_frame = int(tokens_per_frame)
        self._on_rewrite = on_rewrite
        self._caches: dict[tuple[int, int], ChunkCache] = {}
        self._written: dict[tuple[int, int], int] = {}
        self._branches_written: set[int] = set()
        self._phase = PHASE_DENOISE
        self._joint: list[tuple[int, int, int]] | None = None  # the chunks of a joint write
        self._chunk = 0
        self._frame_offset = 0
        self._step = 0
        self._peak_bytes = 0
        self._peak_bf16_bytes = 0
        self._promoted_heads: dict[int, tuple[int, ...]] = {}  # precision by head: each layer's choice, kept past free
        self._chunks_demoted = 0  # chunks requantized at the specs' bits as they left an age tier (all caches)
        self._active = True
        self._head_offset = 0  # global index of the caches' first head (a sequence-parallel rank's share)
        # the clean latents of the chunks the caches hold, under the caches' rule; the chunk the window dropped last
        self._timeline: Retained[RetainedChunk] = Retained(Retention(window_chunks, sink_chunks))
        self._evicted: RetainedChunk | None = None
        self._bytes_after_write: list[int] = []  # every (layer, branch) cache's bytes, after each write

    # ------------------------------------------------------------ what others read
    @property
    def caches(self) -> Mapping[tuple[int, int], ChunkCache]:
        """The caches by (layer, CFG branch), read-only (a saved run copies them; tests look inside)."""
        return MappingProxyType(self._caches)

    @property
    def timeline(self) -> Retained[RetainedChunk]:
        """The clean latents of the chunks the caches hold (a re-cache writes them again)."""
        return self._timeline

    @property
    def evicted(self) -> RetainedChunk | None:
        """The chunk the window dropped last (LongLive's re-cache recomputes it)."""
        return self._evicted

    @property
    def position(self) -> Position:
        """Where the run is: chunk, step, phase and the chunk's first latent frame (:meth:`at` sets them)."""
        return Position(self._chunk, self._step, self._phase, self._frame_offset)

    @property
    def observer(self):
        return self._observer

    @property
    def usage(self) -> CacheUsage:
        """The peak, the demotions and the branches, in one read (survives :meth:`free`)."""
        return CacheUsage(
            self._peak_bytes, self._peak_bf16_bytes, self._chunks_demoted, self.branches, dict(self._promoted_heads)
        )

    @property
    def bytes_after_write(self) -> list[int]:
        """Every (layer, branch) cache's bytes after each write (a copy)."""
        return list(self._bytes_after_write)

    @property
    def branches(self) -> list[int]:
        """The CFG branches that were cached (0 = cond, 1 = uncond); survives :meth:`free`."""
        return sorted(self._branches_written)

    # ------------------------------------------------------------ where the run is
    def denoise(self, chunk: int, rope_frame: int) -> None:
        """Chunk ``chunk`` is denoised next at RoPE frame ``rope_frame``: its steps read the caches, never write."""
        self._begin(chunk, rope_frame, PHASE_DENOISE)

    def at(
        self,
        chunk: int | None = None,
        step: int | None = None,
        phase: str | None = None,
        frame_offset: int | None = None,
    ) -> None:
        """The calls that follow belong to ``chunk``, denoising ``step``, ``phase``, first frame ``frame_offset``
        (each kept as it is when not given): a sampler's step, MAGI-1's chunk of a forward, core's call."""
        if chunk is not None:
            self._chunk = chunk
        if step is not None:
            self._step = step
        if phase is not None:
            self._phase = phase
        if frame_offset is not None:
            self._frame_offset = frame_offset

    # ------------------------------------------------------------ a chunk's life
    def write(
        self, chunk: int, frame_offset: int, clean: Tensor, forward: Callable[[], object], record: bool = True
    ) -> None:
        """One cache-writing pass of chunk ``chunk`` (first latent frame ``frame_offset``): ``forward()`` runs the model
        once over ``clean`` (its LATENT frames) and every layer stores the chunk. ``record``: a new chunk, whose clean
        latents join :attr:`timeline` (a re-write of a held chunk is not)."""
        self._begin(chunk, frame_offset, PHASE_WRITE)
        forward()
        self.finish_write()
        if record:
            before = list(self._timeline.items)
            self._timeline.add(RetainedChunk(chunk, frame_offset, clean.detach().to("cpu").clone()))
            gone = [c for c in before if all(c is not k for k in self._timeline.items)]
            if gone:
                self._evicted = gone[-1]

    def finish_write(self, branches: set[int] | None = None, *, chunk: int | None = None) -> None:
        """A write pass of ``chunk`` (default: the chunk being written) is over: every layer must have stored it for
        every CFG branch (only ``branches`` when given: a model call that holds some of them), the bytes and the peak
        are recorded. A seam that stores in its own forward (MAGI-1) says so here."""
        if chunk is not None:
            self._chunk = chunk
        self._end_write(branches)
        self._bytes_after_write.append(sum(c.nbytes for c in self._caches.values()))

    def rewrite(
        self,
        passes: Iterable[tuple[RetainedChunk, Callable[[], object]]],
        keep_sink: bool = False,
        check: Callable[[], None] | None = None,
    ) -> int:
        """The caches emptied (all but the sink when ``keep_sink``) and chunks written again: each of ``passes`` is a
        retained chunk and the model call that writes it (``check()`` runs before each: an interrupt); returns how
        many."""
        passes = list(passes)
        self.empty(keep_sink)
        for c, forward in passes:
            if check is not None:
                check()
            self.write(c.chunk, c.frame_offset, c.latent, forward, record=False)
        return len(passes)

    def empty(self, keep_sink: bool = False) -> None:
        """Every cache emptied to be written again (all but the attention sink when ``keep_sink``)."""
        if keep_sink:
            self._keep_sink()
        else:
            self._start_rewrite()

    def joint_write(self, group: list[RetainedChunk], forward: Callable[[], object]) -> None:
        """Consecutive chunks written in one forward (``forward()``): every token attends to the caches and to all of
        them, with no block mask; each is stored as its own entry, oldest first (LongLive's re-cache, HY-WorldPlay's
        context)."""
        self._begin_joint([(c.chunk, c.frame_offset, c.frames) for c in group])
        forward()
        self.finish_write()

    def adopt_run(self, saved: SavedRun, device) -> None:
        """Continue ``saved`` (never modified): copies of its caches on ``device`` and its retained chunks become this
        run's, the sink counted as the rule keeps it."""
        self._caches = {k: c.copy().to(device) for k, c in saved.caches.items()}
        self._branches_written.update(saved.branches)
        self._record_peak()
        sink = self._sink_chunks
        self._timeline = Retained(
            self._timeline.rule,
            saved.retained,
            sink_held=min(sink, sum(1 for c in saved.retained if c.chunk < sink)),
        )

    def redraw(self, forward: Callable[[RetainedChunk], None], branches: set[int]) -> None:
        """Inside a denoising step, every held chunk written again for the CFG branches ``branches`` (``forward(chunk)``
        runs the model over it: SkyReels-V2 DF's context redrawn with fresh noise); the step's state is restored."""
        chunk, frame_offset, step = self._chunk, self._frame_offset, self._step
        self._start_rewrite(branches)
        for kept in self._timeline.items:
            self._begin(kept.chunk, kept.frame_offset, PHASE_WRITE)
            forward(kept)
            self._end_write(branches)
        self._begin(chunk, frame_offset, PHASE_DENOISE)
        self._step = step

    def free(self) -> None:
        """Drop every cached chunk (called in ``finally``; safe to call twice)."""
        for cache in self._caches.values():
            cache.clear()
        self._caches.clear()
        self._written.clear()
        self._active = False

    # ------------------------------------------------------------ seams that store outside attend
    def layer_cache(self, layer: int, branch: int = 0, create: bool = False) -> ChunkCache | None:
        """The (layer, branch) cache (None when none was written; with ``create``, an empty one from now on: a layer
        that reads before the writing forward reaches it)."""
        cache = self._caches.get((layer, branch))
        if cache is None and create:
            cache = self._caches[(layer, branch)] = self._new_cache()
        return cache

    def store(
        self,
        layer: int,
        branch: int,
        k: Tensor | None = None,
        v: Tensor | None = None,
        *,
        prepared=None,
        q: Tensor | None = None,
        out: Tensor | None = None,
        frame_offset: int | None = None,
        queries_choose_heads: bool = True,
    ) -> None:
        """Append one finished chunk (the chunk the run is at) to the (layer, branch) cache: raw ``k``, ``v``, or
        ``prepared`` by :meth:`prepare`. With ``q`` (and ``out``), a seam that stores outside :meth:`attend` (MAGI-1's
        attention, core's commit) shows observers the write first: the K/V as written, at first frame
        ``frame_offset`` (default: the run's). ``q`` also chooses the heads kept at ``head_bits`` at a cache's first
        chunk, unless ``queries_choose_heads`` is False (a ``q`` that is not the chunk's queries)."""
        if q is not None and self._observer is not None:
            offset = self._frame_offset if frame_offset is None else frame_offset
            cache = self._caches.get((layer, branch))
            self._show(layer, branch, self._chunk, offset, PHASE_WRITE, q, k, v, out, cache, None, None)
        self._append(layer, branch, k, v, prepared, q if queries_choose_heads else None)

    def prepare(self, layer: int, branch: int, k: Tensor, v: Tensor, q: Tensor | None = None):
        """``k``, ``v`` of the (layer, branch) prepared as its cache will store them (core's block in flight, held
        until it is final), at the bits the cache gives its next chunk; ``q`` (the block's queries) chooses the heads
        kept at ``head_bits`` when the cache has not chosen yet (the cache that stores the chunk adopts them)."""
        cache = self._caches.get((layer, branch)) or self._new_cache()
        return cache.prepare(k, v, q)

    def commit(
        self, chunk: int, frame_offset: int, blocks: Iterable[tuple[int, int, Tensor | None, Tensor | None, object]]
    ):
        """A block held until it was final (core's AR path) written as chunk ``chunk`` at first frame ``frame_offset``:
        each (layer, branch, k, v, prepared) of ``blocks`` stored (observers see the K/V where they were kept), then
        the peak recorded."""
        self._begin(chunk, frame_offset, PHASE_WRITE)
        for layer, branch, k, v, prepared in blocks:
            self.store(layer, branch, k, v, prepared=prepared, q=k, out=v, queries_choose_heads=False)
        self._record_peak()

    def shard_heads(self, head_offset: int) -> None:
        """The caches hold a sequence-parallel rank's share of each layer's heads, from global head ``head_offset`` on
        (QVG seeds its centroids per global head, so the share equals those heads of a one-process cache)."""
        self._head_offset = int(head_offset)

    # ------------------------------------------------------------ inside the events
    def _begin(self, chunk: int, frame_offset: int, phase: str) -> None:
        self._chunk, self._frame_offset, self._phase, self._step = chunk, frame_offset, phase, 0
        self._joint = None

    def _begin_joint(self, spans: list[tuple[int, int, int]]) -> None:
        """A write pass of several consecutive chunks in one forward: ``spans`` lists (chunk, first frame, frames) in
        order. Every token attends to the cache and to all of them, with no block mask; each chunk is then stored as
        its own cache entry, oldest first."""
        if not spans or any(a[1] + a[2] != b[1] for a, b in zip(spans, spans[1:])):
            raise ValueError(f"a joint write needs consecutive chunks, got (chunk, frame, frames) {spans}")
        self._begin(spans[-1][0], spans[0][1], PHASE_WRITE)
        self._joint = list(spans)

    def _end_write(self, branches: set[int] | None = None) -> None:
        """After a write pass: check every layer got the chunk for every branch (only ``branches`` when given: a
        model call that holds some CFG branches), and record the peak size."""
        now = {key for key, c in self._written.items() if c == self._chunk}
        if branches is None:
            branches = ({b for _, b in now} or {0}) | self._branches_written
        expected = {(layer, b) for layer in range(self._num_layers) for b in branches}
        missing = sorted(expected - now)
        if missing:
            raise RuntimeError(
                f"the cache-writing pass of chunk {self._chunk} did not reach every self-attention layer and CFG "
                f"branch (missing (layer, branch) {missing[:4]}{' ...' if len(missing) > 4 else ''}); another "
                "patch may skip Wan blocks or model calls (e.g. a step cache); remove it for chunked AR sampling"
            )
        self._record_peak()
        self._phase = PHASE_DENOISE
        self._joint = None

    def _keep_sink(self) -> None:
        """Drop every cached chunk but the attention sink (LongLive's re-cache keeps the old prompt's sink)."""
        for cache in self._caches.values():
            cache.keep_sink()
        self._written.clear()

    def _start_rewrite(self, branches: set[int] | None = None) -> None:
        """Empty every cache (of ``branches`` only, when given) before re-writing the retained chunks."""
        if self._on_rewrite is not None:
            self._on_rewrite()
        for (_, branch), cache in self._caches.items():
            if branches is None or branch in branches:
                cache.clear()
        self._written = {k: c for k, c in self._written.items() if branches is not None and k[1] not in branches}

    def _new_cache(self) -> ChunkCache:
        return ChunkCache.with_precision(self._precision, self._window_chunks, self._sink_chunks, self._head_offset)

    def _record_peak(self) -> None:
        total = sum(c.nbytes for c in self._caches.values())
        bf16 = sum(c.bf16_nbytes for c in self._caches.values())
        if total > self._peak_bytes:
            self._peak_bytes, self._peak_bf16_bytes = total, bf16

    def _append(
        self, layer: int, branch: int, k: Tensor | None, v: Tensor | None, prepared, q: Tensor | None = None
    ) -> None:
        """One finished chunk into the (layer, branch) cache (made on first use), its demotions counted."""
        key = (layer, branch)
        cache = self._caches.get(key)
        if cache is None:
            cache = self._caches[key] = self._new_cache()
        before = cache.chunks_demoted
        if prepared is not None:
            cache.append_prepared(prepared)
        else:
            cache.append(k, v, q)
        self._chunks_demoted += cache.chunks_demoted - before
        if cache.promoted_heads is not None:
            self._promoted_heads.setdefault(layer, cache.promoted_heads)
        self._written[key] = self._chunk
        self._branches_written.add(branch)

    # ------------------------------------------------------------ attention (the hot path)
    def attend(
        self,
        layer: int,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        transformer_options: dict | None,
        *,
        context: tuple[Tensor, Tensor] | None = None,
        last_chunks: int | None = None,
    ) -> Tensor:
        """Attention of the current chunk for every CFG slot; in the write phase also caches k, v.

        The seam a model family routes its self-attention through, per call:

        - ``q`` (batch, H_q, M, d) and ``k``, ``v`` (batch, H_kv, M, d), post-RoPE: this chunk's tokens, stored
          (quantized) when the call writes the chunk. ``H_q`` may be a multiple of ``H_kv`` (grouped-query
          attention; the correction stays per K/V head, so it is exact);
        - the cached chunks of ``layer`` (the family decides what a layer is: one per block, or one per attention
          stream of a block);
        - ``context`` (optional ``(k_ctx, v_ctx)``, (batch, H_kv, C, d)): tokens attended in full precision and
          never stored, quantized or corrected (a joint-attention model's text tokens, chunks still being
          denoised);
        - ``last_chunks`` (optional): only the newest n cached chunks are attended (a per-chunk key range).

        Per CFG slot (:meth:`_slots`): the cache it reads (:meth:`_readable`), the attention (:meth:`_attention`),
        in the write phase the check that the layer is written once (:meth:`_check_unwritten`), the observer's events
        (:meth:`_show`, one per chunk of a joint write) and the store (:meth:`_append`, one entry per chunk).
        """
        self._check_call(q, context)
        writing = self._phase == PHASE_WRITE
        outs = []
        for branch, sl in self._slots(q.shape[0], transformer_options):
            cache = self._readable(layer, branch)
            qb, kb, vb = q[sl], k[sl], v[sl]
            ctx = {} if context is None else {"k_ctx": context[0][sl], "v_ctx": context[1][sl]}
            out = self._attention(cache, qb, kb, vb, ctx, last_chunks)
            if writing:
                self._check_unwritten(layer, branch)
            # one part per chunk: a joint write shows and stores each of its chunks on its own, oldest first
            parts = self._parts(kb.shape[2])
            if self._observer is not None:
                for chunk, frame_offset, part in parts:
                    self._show(
                        layer, branch, chunk, frame_offset, self._phase, qb[:, :, part], kb[:, :, part],
                        vb[:, :, part], out[:, :, part], cache, last_chunks, ctx,
                    )  # fmt: skip
            if writing:
                for _, _, part in parts:
                    self._append(layer, branch, kb[:, :, part], vb[:, :, part], None, qb[:, :, part])
            outs.append(out)
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)

    def _check_call(self, q: Tensor, context: tuple[Tensor, Tensor] | None) -> None:
        """The run is still on, and ``context`` (when given) is (k_ctx, v_ctx) with the query's batch."""
        if not self._active:
            raise RuntimeError("this Chunked AR run has finished; its cache is freed")
        if context is not None and (len(context) != 2 or context[0].shape[0] != q.shape[0]):
            raise ValueError(
                "context must be (k_ctx, v_ctx) with the query's batch "
                f"({q.shape[0]}), got {[tuple(t.shape) for t in context] if isinstance(context, tuple) else context!r}"
            )

    def _slots(self, batch: int, transformer_options: dict | None) -> list[tuple[int, slice]]:
        """(CFG branch, batch slice) of each slot of this call (``cond_or_uncond``; one cond slot without it)."""
        labels = (transformer_options or {}).get("cond_or_uncond") or [0]
        n = len(labels)
        if batch % n:
            raise RuntimeError(f"batch {batch} does not split into the {n} CFG slots {labels}")
        if len(set(labels)) != n:
            raise ValueError(
                f"the Chunked AR sampler keeps one KV cache per CFG branch, but this call batches the branches "
                f"{[BRANCH_NAMES.get(b, b) for b in labels]}: use a single conditioning entry for positive and one "
                "for negative (merge them with ConditioningConcat / ConditioningAverage first)"
            )
        per = batch // n
        return [(label, slice(i * per, (i + 1) * per)) for i, label in enumerate(labels)]

    def _readable(self, layer: int, branch: int) -> ChunkCache | None:
        """The (layer, branch) cache this call reads; a branch that reaches a denoising call with no cache while
        others were written is refused (cfg changed during the run)."""
        cache = self._caches.get((layer, branch))
        if cache is None and self._branches_written and self._phase == PHASE_DENOISE:
            raise RuntimeError(
                f"CFG branch {BRANCH_NAMES.get(branch, branch)!r} reached layer {layer} at chunk {self._chunk} "
                "but no cache was written for it (the cache-writing pass ran without that branch); "
                "keep cfg the same for the whole run"
            )
        return cache

    def _attention(self, cache: ChunkCache | None, qb, kb, vb, ctx: dict, last_chunks: int | None) -> Tensor:
        """One slot's attention: plain SDPA when nothing is cached (and no context, no grouped heads), else the
        corrected attention over the cache (Krea's bias as log-offsets while denoising)."""
        if (cache is None or cache.num_chunks == 0) and not ctx and qb.shape[1] == kb.shape[1]:
            return F.scaled_dot_product_attention(qb, kb, vb)
        if cache is None or cache.num_chunks == 0:  # grouped-query heads or context tokens, nothing cached
            return cached_attention(
                qb, kb, vb, [], correction=self._correction, strength=self._strength, guard=self._guard, **ctx
            )
        return cache.attend(
            qb,
            kb,
            vb,
            correction=self._correction,
            strength=self._strength,
            key_log_offsets=self._offsets(cache, last_chunks),
            last_chunks=last_chunks,
            guard=self._guard,
            **ctx,
        )

    def _offsets(self, cache: ChunkCache, last_chunks: int | None = None):
        """Krea's attention bias as log-offsets of the attended cached keys (None when off or not denoising)."""
        if self._attention_bias == 1.0 or self._phase != PHASE_DENOISE:
            return None
        entries = cache.entries if last_chunks is None else cache.entries[len(cache.entries) - last_chunks :]
        return attention_bias_offsets([e.tokens for e in entries], self._attention_bias, self._tokens_per_frame)

    def _check_unwritten(self, layer: int, branch: int) -> None:
        """A write pass stores each (layer, branch) once per chunk."""
        if self._written.get((layer, branch)) == self._chunk:
            raise RuntimeError(
                f"layer {layer}, branch {BRANCH_NAMES.get(branch, branch)!r} was written twice for chunk "
                f"{self._chunk}; the cache-writing pass must run the model exactly once"
            )

    def _parts(self, tokens: int) -> list[tuple[int, int, slice]]:
        """(chunk, first frame, token slice) of each chunk in this call: one unless it is a joint write."""
        if self._joint is None or self._phase != PHASE_WRITE:
            return [(self._chunk, self._frame_offset, slice(None))]
        frames = sum(f for _, _, f in self._joint)
        if tokens % frames:
            raise RuntimeError(
                f"{tokens} tokens do not split into the {frames} frames of the joint write {self._joint}"
            )
        per, start, parts = tokens // frames, 0, []
        for chunk, frame_offset, f in self._joint:
            parts.append((chunk, frame_offset, slice(start, start + f * per)))
            start += f * per
        return parts

    def _show(self, layer, branch, chunk, frame_offset, phase, q, k, v, out, cache, last_chunks, ctx) -> None:
        """The observer's event of one chunk of a call, when its ``wants`` (if any) asks for it."""
        if self._wants is not None and not self._wants(layer, chunk, phase, self._step):
            return
        self._observer(
            AttentionEvent(
                layer=layer,
                branch=branch,
                chunk=chunk,
                frame_offset=frame_offset,
                phase=phase,
                step=self._step,
                q=q,
                k=k,
                v=v,
                cache=cache,
                out=out,
                correction=self._correction,
                strength=self._strength,
                last_chunks=last_chunks,
                context=(ctx["k_ctx"], ctx["v_ctx"]) if ctx else None,
            )
        )
