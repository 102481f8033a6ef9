"""The KV caches of a Chunked AR run in progress: one per (layer, CFG branch), and the life of every chunk.

Family-independent: a model family's adapter (``runtime/families/``) routes each self-attention
call of the patched model to :meth:`RunCaches.attend` with post-RoPE q, k, v of shape
(batch, heads, tokens, head_dim); this class picks the cache of that layer and CFG branch,
attends over it with :meth:`jensen_core.ChunkCache.attend` and, in the write phase, appends the
chunk.

A chunk's life is here too, one method per event, each given the model call it wraps: :meth:`RunCaches.denoise`
(the chunk's denoising steps read the caches), :meth:`RunCaches.write` (one forward writes it; the clean latents of
the chunks the caches hold are kept in :attr:`RunCaches.timeline`), :meth:`RunCaches.rewrite` (the caches emptied and
chunks written again), :meth:`RunCaches.joint_write` (several chunks in one forward) and :meth:`RunCaches.adopt_run`
(a saved run's caches and chunks become this run's). No ComfyUI import here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

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


class RunCaches:
    """The caches of every (layer, CFG branch) of a run in progress, the current chunk and phase."""

    def __init__(
        self,
        config: JensenKVConfig,
        window_chunks: int,
        num_layers: int,
        observer=None,
        sink_chunks: int = 0,
        on_rewrite: Callable[[], None] | None = None,
    ):
        self.config = config
        self.precision = config.precision
        self.num_layers = num_layers
        self.window_chunks = window_chunks or None
        self.sink_chunks = int(sink_chunks)
        self.correction = config.effective_correction
        self.strength = float(config.strength)
        self.observer = observer
        self._wants = getattr(observer, "wants", None)
        self.caches: dict[tuple[int, int], ChunkCache] = {}
        self._written: dict[tuple[int, int], int] = {}
        self.branches_written: set[int] = set()
        self.phase = PHASE_DENOISE
        self.joint: list[tuple[int, int, int]] | None = None  # the chunks of a joint write (begin_joint)
        self.chunk = 0
        self.frame_offset = 0
        self.step = 0
        # Krea's kv_cache_attention_bias (1.0 = off): log(bias) on every cached key but the window's first frame
        # (``tokens_per_frame`` tokens), while denoising only
        self.attention_bias = 1.0
        self.tokens_per_frame = 0
        self.peak_bytes = 0
        self.peak_bf16_bytes = 0
        self.chunks_demoted = 0  # chunks requantized at the specs' bits as they left an age tier (all caches)
        self.active = True
        self.head_offset = 0  # global index of the caches' first head (a sequence-parallel rank's share)
        # the clean latents of the chunks the caches hold, under the caches' rule; the chunk the window dropped last
        self.timeline: Retained[RetainedChunk] = Retained(Retention(window_chunks, sink_chunks))
        self.evicted: RetainedChunk | None = None
        self.bytes_after_write: list[int] = []  # every (layer, branch) cache's bytes, after each write
        self.on_rewrite = on_rewrite  # told when the caches are emptied to be written again (diagnostics)

    # ------------------------------------------------------------ a chunk's life
    def denoise(self, chunk: int, rope_frame: int) -> None:
        """Chunk ``chunk`` is denoised next at RoPE frame ``rope_frame``: its steps read the caches, never write."""
        self.begin(chunk, rope_frame, PHASE_DENOISE)

    def write(
        self, chunk: int, frame_offset: int, clean: Tensor, forward: Callable[[], object], record: bool = True
    ) -> None:
        """One cache-writing pass of chunk ``chunk`` (first latent frame ``frame_offset``): ``forward()`` runs the model
        once over ``clean`` (its LATENT frames) and every layer stores the chunk. ``record``: a new chunk, whose clean
        latents join :attr:`timeline` (a re-write of a held chunk is not)."""
        self.begin(chunk, frame_offset, PHASE_WRITE)
        forward()
        self._written_one()
        if record:
            before = list(self.timeline.items)
            self.timeline.add(RetainedChunk(chunk, frame_offset, clean.detach().to("cpu").clone()))
            gone = [c for c in before if all(c is not k for k in self.timeline.items)]
            if gone:
                self.evicted = gone[-1]

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
            self.keep_sink()
        else:
            self.start_rewrite()

    def joint_write(self, group: list[RetainedChunk], forward: Callable[[], object]) -> None:
        """Consecutive chunks written in one forward (``forward()``): every token attends to the caches and to all of
        them, with no block mask; each is stored as its own entry, oldest first (LongLive's re-cache)."""
        self.begin_joint([(c.chunk, c.frame_offset, c.frames) for c in group])
        forward()
        self._written_one()

    def adopt_run(self, saved: SavedRun, device) -> None:
        """Continue ``saved`` (never modified): copies of its caches on ``device`` and its retained chunks become this
        run's, the sink counted as the rule keeps it."""
        self.adopt({k: c.copy().to(device) for k, c in saved.caches.items()}, saved.branches)
        sink = self.sink_chunks
        self.timeline = Retained(
            self.timeline.rule,
            saved.retained,
            sink_held=min(sink, sum(1 for c in saved.retained if c.chunk < sink)),
        )

    def redraw(self, forward: Callable[[RetainedChunk], None], branches: set[int]) -> None:
        """Inside a denoising step, every held chunk written again for the CFG branches ``branches`` (``forward(chunk)``
        runs the model over it: SkyReels-V2 DF's context redrawn with fresh noise); the step's state is restored."""
        chunk, frame_offset, step = self.chunk, self.frame_offset, self.step
        self.start_rewrite(branches)
        for kept in self.timeline.items:
            self.begin(kept.chunk, kept.frame_offset, PHASE_WRITE)
            forward(kept)
            self.end_write(branches)
        self.begin(chunk, frame_offset, PHASE_DENOISE)
        self.step = step

    def _written_one(self, branches: set[int] | None = None) -> None:
        self.end_write(branches)
        self.bytes_after_write.append(sum(c.nbytes for c in self.caches.values()))

    # ------------------------------------------------------------ chunk lifecycle
    def begin(self, chunk: int, frame_offset: int, phase: str) -> None:
        self.chunk, self.frame_offset, self.phase, self.step = chunk, frame_offset, phase, 0
        self.joint = None

    def begin_joint(self, spans: list[tuple[int, int, int]]) -> None:
        """A write pass of several consecutive chunks in one forward (LongLive's re-cache): ``spans`` lists
        (chunk, first frame, frames) in order. Every token attends to the cache and to all of them, with no
        block mask; each chunk is then stored as its own cache entry, oldest first."""
        if not spans or any(a[1] + a[2] != b[1] for a, b in zip(spans, spans[1:])):
            raise ValueError(f"a joint write needs consecutive chunks, got (chunk, frame, frames) {spans}")
        self.begin(spans[-1][0], spans[0][1], PHASE_WRITE)
        self.joint = list(spans)

    def end_write(self, branches: set[int] | None = None) -> None:
        """After a write pass: check every layer got the chunk for every branch (only ``branches`` when given: a
        model call that holds some CFG branches), and record the peak size."""
        now = {key for key, c in self._written.items() if c == self.chunk}
        if branches is None:
            branches = ({b for _, b in now} or {0}) | self.branches_written
        expected = {(layer, b) for layer in range(self.num_layers) for b in branches}
        missing = sorted(expected - now)
        if missing:
            raise RuntimeError(
                f"the cache-writing pass of chunk {self.chunk} did not reach every self-attention layer and CFG "
                f"branch (missing (layer, branch) {missing[:4]}{' ...' if len(missing) > 4 else ''}); another "
                "patch may skip Wan blocks or model calls (e.g. a step cache); remove it for chunked AR sampling"
            )
        self._record_peak()
        self.phase = PHASE_DENOISE
        self.joint = None

    def keep_sink(self) -> None:
        """Drop every cached chunk but the attention sink (LongLive's re-cache keeps the old prompt's sink)."""
        for cache in self.caches.values():
            cache.keep_sink()
        self._written.clear()

    def new_cache(self) -> ChunkCache:
        return ChunkCache.with_precision(self.precision, self.window_chunks, self.sink_chunks, self.head_offset)

    def shard_heads(self, head_offset: int) -> None:
        """The caches hold a sequence-parallel rank's share of each layer's heads, from global head ``head_offset`` on
        (QVG seeds its centroids per global head, so the share equals those heads of a one-process cache)."""
        self.head_offset = int(head_offset)

    def adopt(self, caches: dict[tuple[int, int], ChunkCache], branches: list[int]) -> None:
        """Continue from caches a previous run left (a loaded KV cache): they become this run's."""
        self.caches = dict(caches)
        self.branches_written.update(branches)
        self._record_peak()

    def start_rewrite(self, branches: set[int] | None = None) -> None:
        """Empty every cache (of ``branches`` only, when given) before re-writing the retained chunks."""
        if self.on_rewrite is not None:
            self.on_rewrite()
        for (_, branch), cache in self.caches.items():
            if branches is None or branch in branches:
                cache.clear()
        self._written = {k: c for k, c in self._written.items() if branches is not None and k[1] not in branches}

    def _record_peak(self) -> None:
        total = sum(c.nbytes for c in self.caches.values())
        bf16 = sum(c.bf16_nbytes for c in self.caches.values())
        if total > self.peak_bytes:
            self.peak_bytes, self.peak_bf16_bytes = total, bf16

    @property
    def branches(self) -> list[int]:
        """The CFG branches that were cached (0 = cond, 1 = uncond); survives :meth:`free`."""
        return sorted(self.branches_written)

    def free(self) -> None:
        """Drop every cached chunk (called in ``finally``; safe to call twice)."""
        for cache in self.caches.values():
            cache.clear()
        self.caches.clear()
        self._written.clear()
        self.active = False

    def store(self, layer: int, branch: int, k: Tensor | None = None, v: Tensor | None = None, prepared=None) -> None:
        """Append one finished chunk to the (layer, branch) cache: raw ``k``, ``v``, or ``prepared`` by
        :meth:`jensen_core.ChunkCache.prepare` (core's AR path holds a block that way until it is final)."""
        key = (layer, branch)
        cache = self.caches.get(key)
        if cache is None:
            cache = self.caches[key] = self.new_cache()
        before = cache.chunks_demoted
        if prepared is not None:
            cache.append_prepared(prepared)
        else:
            cache.append(k, v)
        self.chunks_demoted += cache.chunks_demoted - before
        self._written[key] = self.chunk
        self.branches_written.add(branch)

    # ------------------------------------------------------------ attention
    def _slots(self, batch: int, transformer_options: dict | None) -> list[tuple[int, slice]]:
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

    def _offsets(self, cache: ChunkCache, last_chunks: int | None = None):
        """Krea's attention bias as log-offsets of the attended cached keys (None when off or not denoising)."""
        if self.attention_bias == 1.0 or self.phase != PHASE_DENOISE:
            return None
        entries = cache.entries if last_chunks is None else cache.entries[len(cache.entries) - last_chunks :]
        return attention_bias_offsets([e.tokens for e in entries], self.attention_bias, self.tokens_per_frame)

    def _parts(self, tokens: int) -> list[tuple[int, int, slice]]:
        """(chunk, first frame, token slice) of each chunk in this call: one unless it is a joint write."""
        if self.joint is None or self.phase != PHASE_WRITE:
            return [(self.chunk, self.frame_offset, slice(None))]
        frames = sum(f for _, _, f in self.joint)
        if tokens % frames:
            raise RuntimeError(f"{tokens} tokens do not split into the {frames} frames of the joint write {self.joint}")
        per, start, parts = tokens // frames, 0, []
        for chunk, frame_offset, f in self.joint:
            parts.append((chunk, frame_offset, slice(start, start + f * per)))
            start += f * per
        return parts

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
        """
        if not self.active:
            raise RuntimeError("this Chunked AR run has finished; its cache is freed")
        if context is not None and (len(context) != 2 or context[0].shape[0] != q.shape[0]):
            raise ValueError(
                "context must be (k_ctx, v_ctx) with the query's batch "
                f"({q.shape[0]}), got {[tuple(t.shape) for t in context] if isinstance(context, tuple) else context!r}"
            )
        outs = []
        for branch, sl in self._slots(q.shape[0], transformer_options):
            key = (layer, branch)
            cache = self.caches.get(key)
            if cache is None and self.branches_written and self.phase == PHASE_DENOISE:
                raise RuntimeError(
                    f"CFG branch {BRANCH_NAMES.get(branch, branch)!r} reached layer {layer} at chunk {self.chunk} "
                    "but no cache was written for it (the cache-writing pass ran without that branch); "
                    "keep cfg the same for the whole run"
                )
            qb, kb, vb = q[sl], k[sl], v[sl]
            ctx = {} if context is None else {"k_ctx": context[0][sl], "v_ctx": context[1][sl]}
            if (cache is None or cache.num_chunks == 0) and not ctx and qb.shape[1] == kb.shape[1]:
                out = F.scaled_dot_product_attention(qb, kb, vb)
            elif cache is None or cache.num_chunks == 0:  # grouped-query heads or context tokens, nothing cached
                out = cached_attention(qb, kb, vb, [], correction=self.correction, strength=self.strength, **ctx)
            else:
                out = cache.attend(
                    qb,
                    kb,
                    vb,
                    correction=self.correction,
                    strength=self.strength,
                    key_log_offsets=self._offsets(cache, last_chunks),
                    last_chunks=last_chunks,
                    **ctx,
                )
            if self.phase == PHASE_WRITE and self._written.get(key) == self.chunk:
                raise RuntimeError(
                    f"layer {layer}, branch {BRANCH_NAMES.get(branch, branch)!r} was written twice for chunk "
                    f"{self.chunk}; the cache-writing pass must run the model exactly once"
                )
            # one part per chunk: a joint write shows and stores each of its chunks on its own, oldest first
            parts = self._parts(kb.shape[2])
            for chunk, frame_offset, part in parts:
                qp, kp, vp, op = (t[:, :, part] for t in (qb, kb, vb, out))
                if self.observer is not None and (
                    self._wants is None or self._wants(layer, chunk, self.phase, self.step)
                ):
                    self.observer(
                        AttentionEvent(
                            layer=layer,
                            branch=branch,
                            chunk=chunk,
                            frame_offset=frame_offset,
                            phase=self.phase,
                            step=self.step,
                            q=qp,
                            k=kp,
                            v=vp,
                            cache=cache,
                            out=op,
                            correction=self.correction,
                            strength=self.strength,
                            last_chunks=last_chunks,
                            context=(ctx["k_ctx"], ctx["v_ctx"]) if ctx else None,
                        )
                    )
            if self.phase == PHASE_WRITE:
                for _, _, part in parts:
                    self.store(layer, branch, kb[:, :, part], vb[:, :, part])
            outs.append(out)
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)
