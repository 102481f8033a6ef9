"""One sampling run of ComfyUI's own AR video sampler (``sample_ar_video``), served by the pack's cache.

Core's protocol, as ``comfy/k_diffusion/sampling.py::sample_ar_video`` (v0.27) drives it:

- ``init_kv_caches(batch, video_tokens, ...)`` returns one dict per layer with ``"k"``, ``"v"`` (the
  whole video, preallocated) and ``"end"``; the pack returns :class:`CoreLayerCache` dicts that hold
  only ``"end"`` and a link to this session: nothing the size of the video is allocated;
- every model call writes its block of ``s`` tokens at ``end`` and sets ``end += s``;
- after every non-final denoising step, and once more before the clean (sigma = 0) pass of a
  finished block, the sampler moves ``end`` back by the block's tokens;
- so a block whose ``end`` was *not* moved back before the next model call is final. This session
  keeps the last call's post-RoPE K/V of every (layer, CFG branch) as *pending* and, at the next
  call, commits it to the quantized :class:`jensen_core.ChunkCache` (window and sink evict there)
  when ``end`` stayed, drops it when ``end`` went back, and refuses any other move.

The pending block is held already quantized as the cache will store it (``ChunkCache.prepare``),
so the block in flight costs the cache's bits, not the model's: 14B at 720p holds 1.4 GiB of INT2
in flight instead of 8.2 GiB of BF16. QVG's k-means would then run at every denoising step, so with
``method="qvg"`` the block waits in the model's dtype and is quantized once, at commit. KV Cache
Diagnostics also keeps the full-precision block (its shadow cache needs it).

A "call" is one sampler model call, i.e. one ``calc_cond_batch`` (cond and uncond may run as one
batch or as separate ``apply_model`` calls; both write the same block at the same ``end``).
RoPE positions are core's own (absolute): the pack never recomputes them on this path.
No ComfyUI import here.

What this path takes of the pack's run session (``runtime/session.py``), and what core's sampler keeps:

- taken: the run's :class:`runtime.run_caches.RunCaches` (freed with the diagnostics in :meth:`CoreARSession.free`,
  called in ``finally`` by the ``SAMPLER_SAMPLE`` wrapper) and the base report (``runtime.session.base_report``,
  in ``patches.finish_session``);
- not taken, the clone and its install / remove: the object patches are attached when a node returns its MODEL
  (``patches.attach``) and ComfyUI's ModelPatcher applies and removes them with the model's other patches; by the
  time core's ``sample_ar_video`` starts the session the model is already patched and loaded;
- not taken, the memory request: ComfyUI has loaded the model for core's sampler before the ``SAMPLER_SAMPLE``
  wrapper runs, so a request for room would come after the load it is meant to shape (and core preallocates
  nothing the pack's cache replaces: ``init_kv_caches`` returns only ``end`` here);
- not taken, progress, previews and interrupts: core's sampler reports its own steps through SamplerCustom's
  callback (bar and previews) and ComfyUI's sampling loop checks interrupts; a second bar would count the same
  steps twice.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from ...jensen_core.cache import PreparedChunk
from ...jensen_core.methods import method_of
from ..config import JensenKVConfig
from ..observer import PHASE_DENOISE
from ..run_caches import RunCaches


@dataclass(eq=False)
class PendingBlock:
    """One (layer, branch)'s block of the last call: prepared for the cache, or raw k, v (QVG, diagnostics)."""

    prepared: PreparedChunk | None
    k: Tensor | None
    v: Tensor | None

    @property
    def nbytes(self) -> int:
        raw = sum(t.numel() * t.element_size() for t in (self.k, self.v) if t is not None)
        return raw + (self.prepared.nbytes if self.prepared is not None else 0)


class CoreARProtocolError(RuntimeError):
    """Core's sampler (or another patch) moved the cache in a way core's protocol does not."""


@dataclass(frozen=True)
class CoreARGeometry:
    """What the run is made of: batch (as core allocated it), tokens per latent frame, latent frames."""

    batch: int
    frame_tokens: int
    latent_frames: int
    latent_height: int = 0
    latent_width: int = 0


class CoreLayerCache(dict):
    """Stands in for one layer's ``{"k", "v", "end"}`` of core's ``init_kv_caches``: only ``end`` is real.

    Core's own self-attention would write ``cache["k"][:, end:new_end]``; reaching for ``"k"`` or
    ``"v"`` here means the pack's self-attention patch did not run (another patch replaced it), so
    it fails with that finding instead of a bare KeyError.
    """

    #: what a family's core-path self-attention patch recognises it by (families never import this room)
    jensen_kv_layer = True

    def __init__(self, session: CoreARSession, layer: int):
        super().__init__(end=0)
        self.session, self.layer = session, layer

    def __missing__(self, key):
        if key in ("k", "v"):
            raise CoreARProtocolError(
                f"layer {self.layer}'s self-attention reached for the full-precision cache ({key!r}) that the Jensen KV "
                "cache replaces: something replaced the pack's self-attention patch on this layer after it was applied "
                "(another node pack patching CausalWanSelfAttention.forward, e.g. a sequence-parallel patch). Use one "
                "of the two: remove Quantize KV Cache / Jensen Bias Correction, or the other pack's patch."
            )
        raise KeyError(key)


class CoreCrossAttnCache(dict):
    """Stands in for one layer's cross-attention cache of core's ``init_crossattn_caches``, one per CFG branch set.

    Core caches the text K/V of the first call and reuses it for every later call. When ComfyUI runs
    cond and uncond as separate model calls (it does when memory is short), uncond would then attend
    to the positive prompt's K/V; here each set of branches (``cond_or_uncond``) has its own entry.
    """

    def __init__(self, session: CoreARSession):
        super().__init__()
        self.session = session
        self._per_branches: dict[tuple, dict] = {}

    def _current(self) -> dict:
        key = tuple(self.session.labels or (0,))
        return self._per_branches.setdefault(key, {"is_init": False})

    def get(self, key, default=None):
        return self._current().get(key, default)

    def __getitem__(self, key):
        return self._current()[key]

    def __setitem__(self, key, value):
        self._current()[key] = value

    def __contains__(self, key):
        return key in self._current()

    def clear(self):
        self._per_branches.clear()


class CoreARSession:
    """Per-run state of one ``sample_ar_video`` call: the pack's caches and core's ``end`` protocol."""

    def __init__(
        self, config: JensenKVConfig, *, num_layers: int, window_chunks: int = 0, sink_chunks: int = 0, observer=None
    ):
        self.config = config
        self.num_layers = num_layers
        self.window_chunks, self.sink_chunks = int(window_chunks), int(sink_chunks)
        self.run = RunCaches(config, window_chunks, num_layers, observer=observer, sink_chunks=sink_chunks)
        self.layers: list[CoreLayerCache] = []
        self.geometry: CoreARGeometry | None = None
        self.call_start: int | None = None  # token where the block of the current call starts
        self.call_tokens: int | None = None  # tokens of that block (known at the first attention)
        self.committed_end = 0  # token after the last committed block
        self.pending: dict[tuple[int, int], PendingBlock] = {}
        self.in_flight_peak_bytes = 0
        specs = [sp for sp in (config.spec_k, config.spec_v) if sp is not None]
        #: hold the pending block quantized (RTN, full precision); QVG waits in the model's dtype (see module doc)
        self.prepare_pending = all(method_of(sp).quantizes_early for sp in specs)
        self.pending_start: int | None = None
        self.pending_tokens: int | None = None
        self.reached: set[tuple[int, int]] = set()
        self.calls = 0
        self.commits = 0
        self.chunk = 0
        self.step = 0
        self.labels: list[int] | None = None  # CFG branches of the apply_model call in progress
        #: this rank's share of the heads under sequence parallelism (runtime/families/wan/raylight.HeadShard)
        self.shard = None
        # filled in by the ComfyUI side (patches.start_session) for the report
        self.diagnostics = None
        self.adapter = None
        self.block_frames = 1
        self.prefix_frames = 0
        self.model_dtype = None

    # ------------------------------------------------------------------ core's init_kv_caches
    def init_caches(self, batch: int, max_tokens: int) -> list[CoreLayerCache]:
        if self.layers:
            raise CoreARProtocolError(
                "init_kv_caches was called twice in one sampling run; the Jensen KV cache "
                "serves one sample_ar_video call at a time"
            )
        if self.geometry is not None and batch != self.geometry.batch:
            raise CoreARProtocolError(
                f"core's AR sampler asked for caches of batch {batch}, but the latent's batch is {self.geometry.batch}"
            )
        self.layers = [CoreLayerCache(self, i) for i in range(self.num_layers)]
        return self.layers

    def init_crossattn_caches(self) -> list[CoreCrossAttnCache]:
        self.crossattn = [CoreCrossAttnCache(self) for _ in range(self.num_layers)]
        return self.crossattn

    # ------------------------------------------------------------------ one sampler model call
    def _end(self) -> int:
        ends = {int(c["end"]) for c in self.layers}
        if len(ends) != 1:
            raise CoreARProtocolError(
                f"the layers' cache ends disagree ({sorted(ends)}); core's AR sampler moves every layer's end together"
            )
        return ends.pop()

    def begin_call(self) -> None:
        """Before a sampler model call: commit or drop the previous call's block by where ``end`` stands."""
        if not self.layers:
            raise CoreARProtocolError("a model call reached the Jensen KV cache before init_kv_caches")
        end = self._end()
        if self.pending_start is not None:
            final = self.pending_start + self.pending_tokens
            if end == final:
                self._commit()
            elif end == self.pending_start:
                self.pending.clear()
                self.step += 1
            else:
                raise CoreARProtocolError(
                    f"core's AR sampler set the cache end to token {end}; after a block of {self.pending_tokens} tokens "
                    f"written at {self.pending_start} it must stay at {final} (the block is final) or go back to "
                    f"{self.pending_start} (the block is re-denoised)"
                )
            self.pending_start = self.pending_tokens = None
        elif end != self.committed_end:
            raise CoreARProtocolError(f"the cache end is at token {end} but {self.committed_end} tokens are cached")
        self.call_start, self.call_tokens = end, None
        self.reached.clear()
        self.calls += 1

    def end_call(self) -> None:
        """After a sampler model call: every layer must have written the block for every branch it ran."""
        if self.call_start is None:
            return
        if self.call_tokens is not None:
            layers = {layer for layer, _ in self.reached}
            missing = sorted(set(range(self.num_layers)) - layers)
            if missing:
                raise CoreARProtocolError(
                    f"the model call at token {self.call_start} did not reach the self-attention of layers {missing[:6]}"
                    f"{' ...' if len(missing) > 6 else ''}; another patch may skip Wan blocks (e.g. a step cache): "
                    "remove it when sampling with the Jensen KV cache"
                )
            self.pending_start, self.pending_tokens = self.call_start, self.call_tokens
            self.in_flight_peak_bytes = max(self.in_flight_peak_bytes, self.in_flight_bytes)
        self.call_start = self.call_tokens = None

    @property
    def in_flight_bytes(self) -> int:
        """Bytes of the block held until the next call says whether it is final (every layer and branch)."""
        return sum(b.nbytes for b in self.pending.values())

    def _commit(self) -> None:
        """The pending block is final: append it to every (layer, branch) cache (window and sink evict there)."""
        frame_tokens = self.geometry.frame_tokens if self.geometry else None
        frame0 = self.pending_start // frame_tokens if frame_tokens else 0
        # a write event carries the chunk's keys and values (observers read k, v of writes only)
        self.run.commit(
            self.chunk,
            frame0,
            ((layer, branch, b.k, b.v, b.prepared) for (layer, branch), b in sorted(self.pending.items())),
        )
        self.pending.clear()
        self.committed_end = self.pending_start + self.pending_tokens
        self.commits += 1
        self.chunk += 1
        self.step = 0

    # ------------------------------------------------------------------ sequence parallelism
    def use_shard(self, shard) -> None:
        """The caches hold ``shard.local_heads`` heads from global head ``shard.head_offset`` on (one rank of
        ``shard.ranks``); called by a sequence-parallel composition before each attention, the same every time."""
        if self.shard is None:
            if self.run.observer is not None:
                raise CoreARProtocolError(
                    "KV Cache Diagnostics measures every head of a layer against its full-precision shadow; under "
                    f"sequence parallelism this rank holds {shard.local_heads} of {shard.heads} heads. Remove KV Cache "
                    "Diagnostics from this MODEL, or run it on one GPU."
                )
            self.run.shard_heads(int(shard.head_offset))
            self.shard = shard
        elif shard != self.shard:
            raise CoreARProtocolError(f"layer heads changed hands mid-run: {shard} after {self.shard}")

    @property
    def ranks(self) -> int:
        """How many ranks share every layer's heads (1 without sequence parallelism)."""
        return 1 if self.shard is None else int(self.shard.ranks)

    # ------------------------------------------------------------------ one self-attention call
    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor, labels: list[int]) -> Tensor:
        """Attention of the current block (q, k, v post-RoPE, (batch, heads, tokens, head_dim)) over the cache.

        ``labels``: the CFG branches stacked in the batch (``cond_or_uncond``). Keeps k, v as the
        pending block and moves this layer's ``end`` as core's own attention would.
        """
        if self.call_start is None:
            self.begin_call()  # a model call that did not go through calc_cond_batch (e.g. a direct forward)
            implicit = True
        else:
            implicit = False
        s = int(q.shape[2])
        if self.call_tokens is None:
            self.call_tokens = s
        elif s != self.call_tokens:
            raise CoreARProtocolError(
                f"layer {layer} got a block of {s} tokens in a call of {self.call_tokens}-token blocks"
            )
        cache_dict = self.layers[layer]
        end = int(cache_dict["end"])
        if end not in (self.call_start, self.call_start + s):
            raise CoreARProtocolError(
                f"layer {layer}'s cache end is at token {end}; this call writes its block at {self.call_start}"
            )
        run = self.run
        frame0 = self.call_start // self.geometry.frame_tokens if self.geometry else 0
        run.at(self.chunk, self.step, PHASE_DENOISE, frame0)
        out = run.attend(layer, q, k, v, {"cond_or_uncond": list(labels)})
        per = q.shape[0] // max(len(labels), 1)
        keep_raw = not self.prepare_pending or run.observer is not None
        for i, branch in enumerate(labels):
            sl = slice(i * per, (i + 1) * per)
            kb, vb = k[sl].detach(), v[sl].detach()
            prepared = None
            if self.prepare_pending:
                prepared = run.prepare(layer, branch, kb, vb, q[sl].detach())
            self.pending[(layer, branch)] = PendingBlock(prepared, kb if keep_raw else None, vb if keep_raw else None)
            self.reached.add((layer, branch))
        cache_dict["end"] = self.call_start + s
        if implicit and layer == self.num_layers - 1:
            self.end_call()
        return out

    # ------------------------------------------------------------------ after the run
    @property
    def peak_bytes(self) -> int:
        return int(self.run.usage.peak_bytes)

    def free(self) -> None:
        """The held block, core's cross-attention entries, the caches and the diagnostics freed (in ``finally``)."""
        self.pending.clear()
        for c in getattr(self, "crossattn", []):
            c.clear()
        self.run.free()
        if self.diagnostics is not None:
            self.diagnostics.free()
