"""ChunkCache: the K/V of finished chunks of one attention layer, quantized and bit-packed."""

from __future__ import annotations

import json
import math
from collections import deque
from dataclasses import dataclass
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

from .attention import CacheEntry, cached_attention
from .cache_values import CachePrecision, check_head_bits
from .head_bits import HeadBits, HeadBitsTensor, predicted_head_bias
from .methods import method_of
from .quant import QuantizedTensor, StoredTensor, check_finite, quantize
from .retention import Retention
from .spec import FLOAT_FORMATS, QuantSpec
from .tiers import AgeTiers, requantize

_META_KEY = "__jensen_kv_meta__"
META_KEY = _META_KEY  #: the state-dict entry holding a cache's JSON record (:func:`read_meta`)
#: 2: specs carry method/qvg_* fields and QVG parts (centroids, ids); 3: a part's grid origins are stored
#: as ``.minimum`` (1 and 2 named them ``.zero``); 4: a cache with age tiers records them (``tiers``) and
#: each quantized part its own ``bits``; every version still loads
_FORMAT_VERSION = 4
_READABLE_VERSIONS = (1, 2, 3, 4)
#: the suffix of a part's grid origins (minima) in each readable version
_MINIMUM_SUFFIX = {1: ".zero", 2: ".zero", 3: ".minimum", 4: ".minimum"}
#: the largest ``__jensen_kv_meta__`` record read (JSON, about 250 bytes per cached chunk: 4,000 chunks fit)
MAX_META_BYTES = 1 << 20
#: the largest batch, heads, tokens or head_dim a cache file may record
MAX_DIM = (1 << 31) - 1


@dataclass(frozen=True, eq=False)
class PreparedChunk:
    """A chunk validated and stored as the cache would store it (:meth:`ChunkCache.prepare`), not yet appended."""

    entry: CacheEntry
    layout: tuple  # (batch, heads, head_dim, dtype, device) of the chunk as given

    @property
    def nbytes(self) -> int:
        return self.entry.nbytes


class ChunkCache:
    """Per-layer cache of finished chunks: append once, attend many times.

    ``spec_k`` / ``spec_v`` quantize keys / values (``None`` keeps them as given: the
    full-precision baseline). ``window_chunks`` keeps only the last N chunks (``None`` or 0 = all);
    eviction drops whole chunks and never re-quantizes what stays. ``sink_chunks`` keeps the first
    N chunks ever appended for good (an attention sink, as Self-Forcing's ``sink_size`` and
    LongLive's frame sink), outside the window: the cache holds at most ``sink + window`` chunks.

    ``tiers`` (:class:`~jensen_core.tiers.AgeTiers`) keeps the sink and the newest chunks at more bits
    than the specs': a chunk is stored at its tier's bits and requantized at the spec's bits (from its
    stored form) when it leaves the recent tier. Every chunk keeps its own spec and step sizes.

    ``head_bits`` (:class:`~jensen_core.head_bits.HeadBits`) keeps the keys of the K/V heads with the largest
    predicted bias at more bits: chosen at the first chunk stored (from that chunk's queries, when given to
    :meth:`append` / :meth:`prepare`) and kept for the cache's life (:attr:`promoted_heads`; :meth:`clear` keeps it).

    The cache holds the K/V heads (``heads`` in its layout); queries may have a multiple of them
    (grouped-query attention, :meth:`attend`). ``head_offset`` is the global index of its first head
    when it holds a slice of a layer's heads (a sequence-parallel rank): QVG's k-means is seeded per
    global head, so such a cache stores exactly that slice of the single-process cache.
    """

    def __init__(
        self,
        spec_k: QuantSpec | None = None,
        spec_v: QuantSpec | None = None,
        window_chunks: int | None = None,
        sink_chunks: int = 0,
        tiers: AgeTiers | None = None,
        head_offset: int = 0,
        head_bits: HeadBits | None = None,
    ):
        if isinstance(head_offset, bool) or not isinstance(head_offset, int) or not 0 <= head_offset <= MAX_DIM:
            raise ValueError(
                f"head_offset={head_offset!r} must be a whole number >= 0 (the global index of the cache's first head)"
            )
        for name, s in (("spec_k", spec_k), ("spec_v", spec_v)):
            if s is not None and not isinstance(s, QuantSpec):
                raise TypeError(f"{name} must be a QuantSpec or None, got {type(s).__name__}")
        if tiers is not None and not isinstance(tiers, AgeTiers):
            raise TypeError(f"tiers must be an AgeTiers or None, got {type(tiers).__name__}")
        if head_bits is not None:
            if not isinstance(head_bits, HeadBits):
                raise TypeError(f"head_bits must be a HeadBits or None, got {type(head_bits).__name__}")
            check_head_bits(spec_k, tiers, head_bits)
        self.retention = Retention(window_chunks, sink_chunks)  # checks both, names a bad one
        self.head_bits = head_bits
        self._promoted: tuple[int, ...] | None = None  # precision by head: chosen at the first chunk, then fixed
        self.spec_k = spec_k
        self.spec_v = spec_v
        self.tiers = tiers
        self.head_offset = head_offset
        self.chunks_demoted = 0
        self._sink_held = 0  # how many of the oldest entries are sink chunks (never evicted)
        self._entries: deque[CacheEntry] = deque()
        self._layout: tuple | None = None  # (batch, heads, head_dim, dtype, device) of the first chunk
        self.chunks_appended = 0
        self.chunks_evicted = 0

    @classmethod
    def with_precision(
        cls, precision: CachePrecision, window_chunks: int | None = None, sink_chunks: int = 0, head_offset: int = 0
    ) -> ChunkCache:
        """A cache storing as ``precision`` says (a :class:`~jensen_core.cache_values.CachePrecision`: the specs and
        the age tiers), with this window, sink and first head."""
        return cls(
            precision.spec_k,
            precision.spec_v,
            window_chunks,
            sink_chunks,
            precision.tiers,
            head_offset,
            getattr(precision, "head_bits", None),
        )

    @property
    def precision(self) -> CachePrecision:
        """How this cache stores its chunks (the specs, the age tiers, precision by head)."""
        return CachePrecision(self.spec_k, self.spec_v, self.tiers, self.head_bits)

    @property
    def promoted_heads(self) -> tuple[int, ...] | None:
        """The K/V heads whose keys are kept at ``head_bits`` (None: not chosen yet, or precision by head off)."""
        return self._promoted

    @property
    def window_chunks(self) -> int | None:
        """The window (None: every chunk is kept), as :attr:`retention` holds it."""
        return self.retention.window_chunks

    @property
    def sink_chunks(self) -> int:
        return self.retention.sink_chunks

    # ----------------------------------------------------------------- contents
    @property
    def entries(self) -> list[CacheEntry]:
        return list(self._entries)

    @property
    def num_chunks(self) -> int:
        return len(self._entries)

    @property
    def tokens(self) -> int:
        return sum(e.tokens for e in self._entries)

    @property
    def nbytes(self) -> int:
        """Bytes really held: packed codes, scales and minima, QVG centroids and ids (or the raw tensors)."""
        return sum(e.nbytes for e in self._entries)

    @property
    def bf16_nbytes(self) -> int:
        """What the same cached keys and values would cost in BF16."""
        return sum(e.numel for e in self._entries) * 2

    @property
    def effective_bits(self) -> float:
        """Stored bits per cached element (16.0 for a BF16 cache; 2.75 at INT2, g=32, fp8+bf16).

        An empty cache answers its specs' :attr:`QuantSpec.effective_bits` (for QVG the residual's
        part: the centroids' share depends on the tokens of chunks not yet seen).
        """
        n = sum(e.numel for e in self._entries)
        if n == 0:
            return float(_expected_bits(self.spec_k, 16) + _expected_bits(self.spec_v, 16)) / 2
        return self.nbytes * 8 / n

    def clear(self) -> None:
        self._entries.clear()
        self._sink_held = 0
        self._layout = None

    def keep_sink(self) -> int:
        """Drop every chunk but the attention sink (LongLive's re-cache keeps the sink); returns how many stay."""
        held = self._sink_held
        while len(self._entries) > held:
            self._entries.pop()
        if not self._entries:
            self._layout = None
        return held

    # ----------------------------------------------------------------- writing
    def _validate_chunk(self, k: Tensor, v: Tensor) -> None:
        for name, t in (("k", k), ("v", v)):
            if not isinstance(t, Tensor) or t.dim() != 4:
                raise ValueError(
                    f"{name} must be a (batch, heads, tokens, head_dim) tensor, got {getattr(t, 'shape', type(t))}"
                )
            if not t.is_floating_point():
                raise ValueError(f"{name} must be floating point, got {t.dtype}")
        if k.shape != v.shape:
            raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must have the same shape")
        if k.shape[-2] == 0:
            raise ValueError("cannot append an empty chunk (0 tokens); append only finished chunks")
        if k.dtype != v.dtype or k.device != v.device:
            raise ValueError(f"k and v must share dtype and device, got {k.dtype}/{v.dtype} on {k.device}/{v.device}")
        B, H, _, D = k.shape
        for s in (self.spec_k, self.spec_v):
            if s is not None:
                s.check_head_dim(D)
        if self._layout is not None:
            b0, h0, d0, dt0, dev0 = self._layout
            if (B, H, D) != (b0, h0, d0):
                raise ValueError(
                    f"chunk has batch {B}, heads {H}, head_dim {D} but the cache holds batch {b0}, heads {h0}, "
                    f"head_dim {d0}; use one cache per layer and per CFG branch, or clear() it first"
                )
            if k.dtype != dt0:
                raise ValueError(f"chunk dtype {k.dtype} differs from the cached chunks' {dt0}; cast it to {dt0}")
            if k.device != dev0:
                raise ValueError(f"chunk lives on {k.device} but the cache on {dev0}; move it to {dev0}")
        check_finite("k", k)
        check_finite("v", v)

    def append(self, k: Tensor, v: Tensor, q: Tensor | None = None) -> None:
        """Store one finished chunk (shape (batch, heads, tokens, head_dim), keys after RoPE).

        Everything is validated and quantized before the cache changes: a rejected chunk leaves
        the cache as it was. Beyond ``window_chunks`` the oldest chunk is dropped. ``q`` (the chunk's
        queries, (batch, H_q, tokens, head_dim)) chooses the promoted heads under ``head_bits`` at the
        first chunk; it is read nowhere else.
        """
        self.append_prepared(self.prepare(k, v, q))

    def prepare(self, k: Tensor, v: Tensor, q: Tensor | None = None) -> PreparedChunk:
        """Validate and quantize a chunk exactly as :meth:`append` stores it, without storing it.

        For a caller that learns only later whether the chunk is final (ComfyUI core's AR
        sampler): it holds the chunk at the cache's precision meanwhile, then hands it to
        :meth:`append_prepared` or drops it. Under ``head_bits`` the first chunk prepared chooses
        the promoted heads (from ``q``), whether or not it is appended.
        """
        self._validate_chunk(k, v)
        spec_k, spec_v = self._new_chunk_specs()
        if self.head_bits is not None:
            k_stored = self._quantize_head_bits(k, q)
        else:
            k_stored = quantize(k, spec_k, head_offset=self.head_offset) if spec_k is not None else k.detach().clone()
        entry = CacheEntry(
            k=k_stored,
            v=quantize(v, spec_v, head_offset=self.head_offset) if spec_v is not None else v.detach().clone(),
        )
        return PreparedChunk(entry, (k.shape[0], k.shape[1], k.shape[-1], k.dtype, k.device))

    def _quantize_head_bits(self, k: Tensor, q: Tensor | None) -> HeadBitsTensor:
        """``k`` with the promoted heads' keys at ``head_bits`` (chosen now from ``q`` if not yet)."""
        hb = self.head_bits
        if self._promoted is None:
            low = quantize(k, self.spec_k, head_offset=self.head_offset)
            self._promoted = hb.choose(predicted_head_bias(low, q), k.shape[1])
        return HeadBitsTensor.quantize(k, self.spec_k, hb.spec_for(self.spec_k), self._promoted)

    def _new_chunk_specs(self) -> tuple[QuantSpec | None, QuantSpec | None]:
        """The specs a chunk appended now is stored at: the newest chunk, a sink chunk while the sink fills."""
        t = self.tiers
        if t is None:
            return self.spec_k, self.spec_v
        sink = self._sink_held < self.sink_chunks
        out = []
        for side, spec in (("k", self.spec_k), ("v", self.spec_v)):
            out.append(None if spec is None else t.spec_at(spec, t.newest_bits(spec.bits, side, sink)))
        return out[0], out[1]

    def _demote(self) -> None:
        """Requantize every held chunk stored at more bits than its position keeps (it left the recent tier)."""
        t = self.tiers
        n = len(self._entries)
        want_k = t.specs_for(self.spec_k, n, self._sink_held, "k")
        want_v = t.specs_for(self.spec_v, n, self._sink_held, "v")
        for i, (e, sk, sv) in enumerate(zip(self._entries, want_k, want_v)):
            k = _lower(e.k, sk, self.head_offset)
            v = _lower(e.v, sv, self.head_offset)
            if k is not e.k or v is not e.v:
                self._entries[i] = CacheEntry(k=k, v=v)  # a new entry: a copy() of this cache keeps the old one
                self.chunks_demoted += 1

    def append_prepared(self, chunk: PreparedChunk) -> None:
        """Store a chunk from :meth:`prepare` (of this cache or one with the same specs)."""
        if not isinstance(chunk, PreparedChunk):
            raise TypeError(f"append_prepared takes a PreparedChunk from prepare(), got {type(chunk).__name__}")
        if self._layout is not None and chunk.layout != self._layout:
            raise ValueError(f"prepared chunk layout {chunk.layout} differs from the cached chunks' {self._layout}")
        entry = chunk.entry
        if self.head_bits is not None:
            heads = entry.k.heads if isinstance(entry.k, HeadBitsTensor) else None
            if heads is None or (self._promoted is not None and heads != self._promoted):
                raise ValueError(
                    f"prepared chunk keeps heads {heads} at head_bits but this cache keeps {self._promoted}; prepare "
                    "the chunks of one cache with that cache"
                )
            self._promoted = heads  # a chunk prepared by a fresh cache (core's block in flight) sets the choice
        if self._layout is None:
            self._layout = chunk.layout
        self.chunks_appended += 1
        self._sink_held, evicted = self.retention.push(self._entries, entry, self._sink_held)
        self.chunks_evicted += evicted
        if self.tiers is not None:
            self._demote()

    def copy(self) -> ChunkCache:
        """A new cache holding the same chunks (stored tensors are shared, never modified in place)."""
        other = ChunkCache(
            self.spec_k,
            self.spec_v,
            self.window_chunks,
            self.sink_chunks,
            self.tiers,
            head_offset=self.head_offset,
            head_bits=self.head_bits,
        )
        other._promoted = self._promoted
        other._entries = deque(self._entries)
        other._sink_held, other._layout = self._sink_held, self._layout
        other.chunks_appended, other.chunks_evicted = self.chunks_appended, self.chunks_evicted
        other.chunks_demoted = self.chunks_demoted
        return other

    def to(self, device: str | torch.device) -> ChunkCache:
        """Move every cached chunk to ``device`` (after loading a file on the CPU); returns self."""
        device = torch.device(device)
        self._entries = deque(CacheEntry(k=_move(e.k, device), v=_move(e.v, device)) for e in self._entries)
        if self._layout is not None:
            self._layout = (*self._layout[:4], device)
        return self

    # ----------------------------------------------------------------- reading
    def attend(
        self,
        q: Tensor,
        k_cur: Tensor,
        v_cur: Tensor,
        correction: str = "taylor",
        strength: float = 1.0,
        key_log_offsets=None,
        *,
        k_ctx: Tensor | None = None,
        v_ctx: Tensor | None = None,
        last_chunks: int | None = None,
        guard: bool = False,
    ) -> Tensor:
        """Attention of the current chunk over the cached chunks and itself (see :func:`cached_attention`).

        ``q`` may have more heads than the cached K/V (grouped-query attention, ``H_q = groups * H_kv``).
        ``k_ctx``/``v_ctx``: context tokens attended in full precision, never stored nor corrected.
        ``last_chunks``: attend only the newest ``last_chunks`` held chunks (None: all of them; 0: none), for
        query groups that see a shorter key range than the cache holds (MAGI-1's per-chunk key range: one call
        per group); ``key_log_offsets`` then has one item per attended chunk. ``guard``: the correction's guard
        (see :func:`cached_attention`).
        """
        if self._layout is not None and q.device != self._layout[4]:
            raise ValueError(
                f"query lives on {q.device} but the cache on {self._layout[4]}; move it to {self._layout[4]}"
            )
        entries = self._entries
        if last_chunks is not None:
            if isinstance(last_chunks, bool) or not isinstance(last_chunks, int) or last_chunks < 0:
                raise ValueError(
                    f"last_chunks={last_chunks!r} must be a whole number >= 0 (the newest held chunks to attend) "
                    "or None (all)"
                )
            entries = list(entries)[len(entries) - min(last_chunks, len(entries)) :]
        return cached_attention(
            q,
            k_cur,
            v_cur,
            entries,
            correction=correction,
            strength=strength,
            key_log_offsets=key_log_offsets,
            k_ctx=k_ctx,
            v_ctx=v_ctx,
            guard=guard,
        )

    # ----------------------------------------------------------------- persistence
    def _meta(self) -> dict:
        tiered = self.tiers is not None  # a cache without tiers writes version 3, as before them
        meta = {
            "version": _FORMAT_VERSION if tiered else 3,
            "spec_k": self.spec_k.to_dict() if self.spec_k else None,
            "spec_v": self.spec_v.to_dict() if self.spec_v else None,
            "window_chunks": self.window_chunks,
            "sink_chunks": self.sink_chunks,
            "sink_held": self._sink_held,
            "layout": None
            if self._layout is None
            else {
                "batch": self._layout[0],
                "heads": self._layout[1],
                "head_dim": self._layout[2],
                "dtype": str(self._layout[3]).removeprefix("torch."),
            },
            "chunks": [{name: _part_meta(t, tiered) for name, t in (("k", e.k), ("v", e.v))} for e in self._entries],
        }
        if tiered:
            meta["tiers"] = self.tiers.to_dict()
        if self.head_offset:  # only for a slice of the heads: a whole layer's record reads as before
            meta["head_offset"] = self.head_offset
        return meta

    def state_dict(self) -> dict[str, Tensor]:
        """Flat dict of tensors (safetensors-ready); the layout is JSON in ``__jensen_kv_meta__``."""
        if self.head_bits is not None:
            raise ValueError(
                "a KV cache with head_bits (precision by head) cannot be saved to a file yet; set head_bits off in "
                "Quantize KV Cache to save it"
            )
        sd: dict[str, Tensor] = {}
        for i, e in enumerate(self._entries):
            for name, t in (("k", e.k), ("v", e.v)):
                p = f"chunk{i}.{name}"
                if isinstance(t, StoredTensor):
                    method = method_of(t.spec)
                    r = method.residual(t)
                    sd[p + ".packed"] = r.packed.contiguous()
                    sd[p + ".scale"] = r.scale.contiguous()
                    sd[p + ".minimum"] = r.minimum.contiguous()
                    sd.update((p + suffix, x) for suffix, x in method.state_tensors(t).items())
                else:
                    sd[p] = t.contiguous()
        sd[_META_KEY] = torch.frombuffer(bytearray(json.dumps(self._meta()).encode()), dtype=torch.uint8)
        return sd

    def load_state_dict(self, sd: dict[str, Tensor]) -> None:
        """Replace the contents with a state dict saved under the same specs; rejects others clearly.

        The record in ``__jensen_kv_meta__`` is checked whole first (:func:`read_meta`), then every
        tensor against it; nothing changes unless all of it fits, and a tensor the record does not
        describe is refused too."""
        if _META_KEY not in sd:
            raise ValueError("not a jensen-kv cache file: the __jensen_kv_meta__ entry is missing")
        meta = read_meta(sd[_META_KEY])
        mine = (self.spec_k.to_dict() if self.spec_k else None, self.spec_v.to_dict() if self.spec_v else None)
        theirs = tuple(None if s is None else s.to_dict() for s in (meta.spec_k, meta.spec_v))
        if mine != theirs:
            raise ValueError(
                f"the file was saved with specs (keys, values) {theirs} but this cache uses {mine}; "
                "create the ChunkCache with the file's specs to load it"
            )
        if meta.tiers != self.tiers:
            raise ValueError(
                f"the file was saved with age tiers {_tiers_text(meta.tiers)} but this cache uses "
                f"{_tiers_text(self.tiers)}; create the ChunkCache with the file's tiers to load it"
            )
        if meta.head_offset != self.head_offset:
            raise ValueError(
                f"the file holds the heads from global index {meta.head_offset} but this cache's start at "
                f"{self.head_offset}; create the ChunkCache with head_offset={meta.head_offset} to load it"
            )
        if meta.sink_chunks != self.sink_chunks:
            raise ValueError(
                f"the file was saved with sink_chunks={meta.sink_chunks} but this cache uses "
                f"{self.sink_chunks}; create the ChunkCache with the file's sink to load it"
            )
        n, held = len(meta.chunks), meta.sink_held
        if self.window_chunks is not None and n - held > self.window_chunks:
            raise ValueError(
                f"the file holds {n - held} chunks besides its sink, more than this cache's window of "
                f"{self.window_chunks}; create the ChunkCache with the file's window to load it"
            )
        lay = meta.layout
        if self._layout is not None and lay is not None:
            b0, h0, d0, _, _ = self._layout
            if lay[:3] != (b0, h0, d0):
                raise ValueError(
                    f"the file holds batch {lay[0]}, heads {lay[1]}, head_dim {lay[2]} "
                    f"but this cache holds batch {b0}, heads {h0}, head_dim {d0}; clear() it first"
                )
        used = {_META_KEY}
        entries = []
        for i, cm in enumerate(meta.chunks):
            parts = {}
            for name in ("k", "v"):
                parts[name] = _load_part(
                    sd,
                    f"chunk{i}.{name}",
                    cm[name],
                    meta.part_spec(i, name),
                    used,
                    _MINIMUM_SUFFIX[meta.version],
                )
            entries.append(CacheEntry(**parts))
        extra = sorted(set(sd) - used)
        if extra:
            raise ValueError(
                f"cache file holds entries its metadata does not describe ({extra[:3]}"
                f"{' ...' if len(extra) > 3 else ''})"
            )
        self._entries = deque(entries)
        self._sink_held = held
        if lay is None or not entries:
            self._layout = None
        else:
            self._layout = (*lay, entries[0].k.device)

    def save(self, path: str) -> None:
        """Write the cache to a safetensors file."""
        save_file(self.state_dict(), path, metadata={"format": "jensen_kv_cache", "version": str(_FORMAT_VERSION)})

    def load(self, path: str, device: str | torch.device = "cpu") -> None:
        """Read a cache written by :meth:`save` (must use the same specs)."""
        self.load_state_dict(load_file(path, device=str(device)))

    def __repr__(self) -> str:
        return (
            f"ChunkCache(chunks={self.num_chunks}, tokens={self.tokens}, nbytes={self.nbytes}, "
            f"effective_bits={self.effective_bits:.3f}, window={self.window_chunks}, sink={self.sink_chunks})"
        )


def _move(t: StoredTensor | Tensor, device: torch.device) -> StoredTensor | Tensor:
    return t.to(device)  # a stored tensor moves its stored parts; a raw tensor moves itself


def _expected_bits(spec: QuantSpec | None, full_bits: int) -> float:
    return spec.effective_bits if spec is not None else full_bits


def _lower(t: StoredTensor | Tensor, spec: QuantSpec | None, head_offset: int = 0) -> StoredTensor | Tensor:
    """``t`` requantized at ``spec`` when it is stored at more bits; else ``t`` itself."""
    if spec is None or not isinstance(t, StoredTensor) or t.spec.bits <= spec.bits:
        return t
    return requantize(t, spec, head_offset)


def _tiers_text(tiers: AgeTiers | None) -> str:
    return "off" if tiers is None else repr(str(tiers))


def _part_meta(t: StoredTensor | Tensor, tiered: bool = False) -> dict:
    if isinstance(t, StoredTensor):
        return {
            "quantized": True,
            "shape": list(t.shape),
            "dtype": str(t.dtype).removeprefix("torch."),
            "scale_format": t.scale_format,
            **({"bits": t.spec.bits} if tiered else {}),
            **method_of(t.spec).part_record(t),
        }
    return {"quantized": False, "shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")}


@dataclass(frozen=True)
class CacheFileMeta:
    """A saved cache's ``__jensen_kv_meta__`` record, checked whole (:func:`read_meta`).

    ``layout`` is (batch, heads, head_dim, dtype) of the cached chunks, or None for an empty cache;
    ``chunks`` holds per chunk ``{"k": part, "v": part}``, every part's record already checked
    (``quantized``, ``shape`` (batch, heads, tokens, head_dim), ``dtype``, ``scale_format``, QVG
    ``segments``).
    """

    version: int
    spec_k: QuantSpec | None
    spec_v: QuantSpec | None
    window_chunks: int | None
    sink_chunks: int
    sink_held: int
    layout: tuple[int, int, int, torch.dtype] | None
    chunks: tuple[dict, ...]
    tiers: AgeTiers | None = None
    #: the global index of the first head a cache of a slice of the heads holds (0: from the first)
    head_offset: int = 0

    def part_spec(self, i: int, side: str) -> QuantSpec | None:
        """The spec chunk ``i``'s keys (``side`` "k") or values ("v") are stored at: the side's spec, at the
        part's own ``bits`` under age tiers."""
        spec = self.spec_k if side == "k" else self.spec_v
        bits = self.chunks[i][side].get("bits")
        return spec if spec is None or bits is None or bits == spec.bits else self.tiers.spec_at(spec, bits)

    @property
    def chunk_tokens(self) -> list[int]:
        """Tokens of every cached chunk, oldest first."""
        return [c["k"]["shape"][2] for c in self.chunks]

    def tensor_names(self) -> set[str]:
        """The state-dict entries this record describes (``__jensen_kv_meta__`` aside): what a reader may read."""
        names = set()
        for i, c in enumerate(self.chunks):
            for side in ("k", "v"):
                spec = self.part_spec(i, side)
                p = f"chunk{i}.{side}"
                if not c[side]["quantized"]:
                    names.add(p)
                    continue
                names.update(p + s for s in (".packed", ".scale", _MINIMUM_SUFFIX[self.version]))
                if spec is not None:
                    names.update(p + s for s in method_of(spec).extra_parts)
        return names


def parse_json(raw: bytes | str, what: str) -> Any:
    """JSON of a file someone else wrote: one ValueError naming ``what`` for anything unreadable.

    Nesting too deep for Python and a key given twice in one object are refused as well (a file
    this pack writes has neither)."""

    def no_duplicates(pairs):
        out = {}
        for k, v in pairs:
            if k in out:
                raise ValueError(f"the key {k!r} appears twice in one object")
            out[k] = v
        return out

    def no_constants(name):
        raise ValueError(f"{name} is not a JSON number")

    try:
        text = raw.decode("utf-8") if isinstance(raw, (bytes, bytearray)) else raw
        return json.loads(text, object_pairs_hook=no_duplicates, parse_constant=no_constants)
    except RecursionError:
        raise ValueError(f"{what} is not readable JSON (nested too deeply)") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"{what} is not readable JSON ({exc})") from None


def whole(value, what: str, lo: int = 0, hi: int = MAX_DIM) -> int:
    """``value`` when it is an integer (not a bool or a float) from ``lo`` to ``hi``; else a ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ValueError(f"{what}={_short(value)} must be a whole number from {lo} to {hi}")
    return value


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _record(value, what: str, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict:
    """``value`` when it is a JSON object with every ``required`` key and no key outside ``required + optional``."""
    if not isinstance(value, dict):
        raise ValueError(f"{what} must be a JSON object, got {type(value).__name__}")
    missing = [k for k in required if k not in value]
    if missing:
        raise ValueError(f"{what} lacks {', '.join(missing)}")
    unknown = sorted(k for k in value if k not in required and k not in optional)
    if unknown:
        raise ValueError(f"{what} has fields this format does not know: {_short(unknown)}")
    return value


def read_meta(t) -> CacheFileMeta:
    """Decode and check the ``__jensen_kv_meta__`` entry of a saved cache, before any chunk is read.

    At most :data:`MAX_META_BYTES` bytes, decoded without per-byte Python objects. Every field is
    checked: specs, window and sink, how many chunks the sink holds (the first ``sink`` ever
    appended), no more chunks than sink + window, every chunk's keys and values of one shape
    (batch, heads, tokens, head_dim) and dtype matching the layout, quantized exactly where the
    spec says so. Anything else is one ValueError naming the field and what was expected.
    """
    if not isinstance(t, Tensor) or t.dtype != torch.uint8 or t.dim() != 1:
        raise ValueError(
            f"cache file entry {_META_KEY} must be a 1-D uint8 tensor of JSON, got "
            f"{tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__} "
            f"{t.dtype if isinstance(t, Tensor) else ''}".rstrip()
        )
    if t.numel() > MAX_META_BYTES:
        raise ValueError(
            f"cache file entry {_META_KEY} holds {t.numel()} bytes; a cache record is at most {MAX_META_BYTES} bytes"
        )
    meta = parse_json(t.detach().to("cpu").contiguous().numpy().tobytes(), f"cache file entry {_META_KEY}")
    if not isinstance(meta, dict):
        raise ValueError(f"cache file entry {_META_KEY} must be a JSON object, got {type(meta).__name__}")
    version = meta.get("version")
    if isinstance(version, bool) or version not in _READABLE_VERSIONS:
        raise ValueError(f"cache file format {_short(version)} is not supported (expected one of {_READABLE_VERSIONS})")
    _record(
        meta,
        "cache file metadata",
        ("version", "spec_k", "spec_v", "window_chunks", "layout", "chunks"),
        ("sink_chunks", "sink_held", "head_offset") + (("tiers",) if version >= 4 else ()),
    )
    specs = []
    for side in ("spec_k", "spec_v"):
        d = meta[side]
        if d is not None and not isinstance(d, dict):
            raise ValueError(f"the file's quantization specs are not readable: {side} must be a JSON object or null")
        try:  # older files lack the fields added since: read as specs, defaults filled in
            specs.append(None if d is None else QuantSpec.from_dict(d))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"the file's quantization specs are not readable: {side}: {exc}") from None
    tiers = AgeTiers.from_record(meta.get("tiers"), "cache file metadata tiers")
    window = meta["window_chunks"]
    window = None if window is None else whole(window, "cache file metadata window_chunks") or None
    sink = whole(meta.get("sink_chunks", 0), "cache file metadata sink_chunks")
    held = whole(meta.get("sink_held", 0), "cache file metadata sink_held")
    head_offset = whole(meta.get("head_offset", 0), "cache file metadata head_offset")
    chunks = meta["chunks"]
    if not isinstance(chunks, list):
        raise ValueError(f"cache file metadata chunks must be a list, got {type(chunks).__name__}")
    n = len(chunks)
    if window is not None and n > sink + window:
        raise ValueError(
            f"cache file metadata lists {n} chunks, but a cache with window_chunks={window} and "
            f"sink_chunks={sink} holds at most {sink + window}"
        )
    if held != min(sink, n):
        raise ValueError(
            f"cache file metadata sink_held={held} does not fit its {n} chunks under sink_chunks={sink} "
            f"(the sink holds the first {min(sink, n)})"
        )
    layout = None
    if meta["layout"] is not None:
        lay = _record(meta["layout"], "cache file metadata layout", ("batch", "heads", "head_dim", "dtype"))
        layout = (
            whole(lay["batch"], "cache file layout batch", 1),
            whole(lay["heads"], "cache file layout heads", 1),
            whole(lay["head_dim"], "cache file layout head_dim", 1),
            _float_dtype(lay["dtype"], "layout"),
        )
    if n and layout is None:
        raise ValueError(f"cache file metadata lists {n} chunks but no layout (batch, heads, head_dim, dtype)")
    checked = []
    for i, cm in enumerate(chunks):
        cm = _record(cm, f"cache file entry chunk{i}", ("k", "v"))
        parts = {
            name: _check_part(cm[name], f"chunk{i}.{name}", spec, tiers)
            for name, spec in (("k", specs[0]), ("v", specs[1]))
        }
        k, v = parts["k"], parts["v"]
        if k["shape"] != v["shape"] or k["dtype"] != v["dtype"]:
            raise ValueError(
                f"cache file entry chunk{i} stores keys {k['shape']} {k['dtype']} and values "
                f"{v['shape']} {v['dtype']}; a chunk's keys and values share shape and dtype"
            )
        B, H, _, D = k["shape"]
        if (B, H, D, _CACHE_DTYPES[k["dtype"]]) != layout:
            raise ValueError(
                f"cache file entry chunk{i} holds (batch, heads, head_dim, dtype) = ({B}, {H}, {D}, {k['dtype']}), "
                f"not the layout's ({layout[0]}, {layout[1]}, {layout[2]}, {str(layout[3]).removeprefix('torch.')})"
            )
        checked.append(parts)
    if tiers is not None:  # each part's bits are its position's: the sink's, the newest chunks', the spec's
        for side, spec in (("k", specs[0]), ("v", specs[1])):
            if spec is None:
                continue
            want = tiers.position_bits(spec.bits, n, held, side)
            got = [c[side].get("bits", spec.bits) for c in checked]
            for i, (g, w) in enumerate(zip(got, want)):
                if g != w:
                    raise ValueError(
                        f"cache file entry chunk{i}.{side} bits={g}: under age tiers {str(tiers)!r} with "
                        f"sink_held={held}, chunk {i} of {n} is kept at {w} bits (the sink and the newest chunks at "
                        f"the tiers' bits, the others at INT{spec.bits}); the file was edited or damaged"
                    )
    return CacheFileMeta(
        version=version,
        spec_k=specs[0],
        spec_v=specs[1],
        window_chunks=window,
        sink_chunks=sink,
        sink_held=held,
        layout=layout,
        chunks=tuple(checked),
        tiers=tiers,
        head_offset=head_offset,
    )


def _check_part(rec, prefix: str, spec: QuantSpec | None, tiers: AgeTiers | None = None) -> dict:
    """One stored side of a chunk, as its record says: checked against the spec, shapes bounded.

    Under age tiers a quantized part records its own ``bits``: one of those the tiers keep on that side."""
    optional = ("scale_format", "segments") + (("bits",) if tiers is not None and spec is not None else ())
    rec = _record(rec, f"cache file entry {prefix}", ("quantized", "shape", "dtype"), optional)
    if "bits" in rec:
        allowed = tiers.side_bits(spec.bits, prefix.rsplit(".", 1)[-1])
        if isinstance(rec["bits"], bool) or rec["bits"] not in allowed:
            raise ValueError(
                f"cache file entry {prefix} bits={_short(rec['bits'])}: a side at INT{spec.bits} under age tiers "
                f"{str(tiers)!r} holds chunks of {' or '.join(map(str, allowed))} bits"
            )
        spec = tiers.spec_at(spec, rec["bits"])
    if not isinstance(rec["quantized"], bool):
        raise ValueError(f"cache file entry {prefix} quantized={_short(rec['quantized'])} must be true or false")
    shape = rec["shape"]
    if not isinstance(shape, list) or len(shape) != 4:
        raise ValueError(f"cache file entry {prefix} shape={_short(shape)} must be [batch, heads, tokens, head_dim]")
    shape = [whole(s, f"cache file entry {prefix} shape[{j}]", 1) for j, s in enumerate(shape)]
    _float_dtype(rec["dtype"], prefix)
    if rec["quantized"] != (spec is not None):
        raise ValueError(
            f"cache file entry {prefix} is {'' if rec['quantized'] else 'not '}quantized but this cache "
            f"{'keeps that side unquantized' if spec is None else 'quantizes that side'}"
        )
    if spec is None:
        if "scale_format" in rec or "segments" in rec:
            raise ValueError(f"cache file entry {prefix} is not quantized but records a scale format or QVG segments")
    else:
        if rec.get("scale_format") not in FLOAT_FORMATS:
            raise ValueError(f"cache file entry {prefix} has an unknown scale format {_short(rec.get('scale_format'))}")
        try:
            spec.check_head_dim(shape[3])
        except ValueError as exc:
            raise ValueError(f"cache file entry {prefix}: {exc}") from None
        method_of(spec).check_record(rec, prefix, spec, shape)
    return {**rec, "shape": shape}


def _load_part(
    sd: dict[str, Tensor],
    prefix: str,
    meta: dict,
    spec: QuantSpec | None,
    used: set[str],
    minimum_suffix: str = ".minimum",
) -> StoredTensor | Tensor:
    """The stored tensor(s) of one side of a chunk, checked against its record (from :func:`read_meta`).

    ``minimum_suffix`` names the grid origins as the file's format version does (``.zero`` before 3).
    """
    shape = torch.Size(meta["shape"])
    dtype = _float_dtype(meta.get("dtype"), prefix)
    if not meta["quantized"]:
        t = sd.get(prefix)
        if t is None or tuple(t.shape) != tuple(shape):
            raise ValueError(f"cache file entry {prefix} is missing or has the wrong shape (expected {tuple(shape)})")
        if t.dtype != dtype:
            raise ValueError(f"cache file entry {prefix} is {t.dtype}, but its metadata says {dtype}")
        used.add(prefix)
        return t
    if spec is None:
        raise ValueError(f"cache file entry {prefix} is quantized but this cache keeps that side unquantized")
    try:
        packed, scale, minimum = sd[prefix + ".packed"], sd[prefix + ".scale"], sd[prefix + minimum_suffix]
    except KeyError as exc:
        raise ValueError(f"cache file entry {exc.args[0]} is missing") from None
    G = shape[-1] // spec.group_size
    expect_packed = (*shape[:-1], shape[-1] * spec.bits // 8)
    if (
        tuple(packed.shape) != expect_packed
        or tuple(scale.shape) != (*shape[:-1], G)
        or tuple(minimum.shape) != (*shape[:-1], G)
    ):
        raise ValueError(f"cache file entry {prefix} does not match its recorded shape {tuple(shape)}")
    if meta.get("scale_format") not in FLOAT_FORMATS:
        raise ValueError(f"cache file entry {prefix} has an unknown scale format {meta.get('scale_format')!r}")
    if (
        packed.dtype != torch.uint8
        or scale.dtype != FLOAT_FORMATS[meta["scale_format"]][0]
        or minimum.dtype != FLOAT_FORMATS[spec.zero_format][0]
    ):
        raise ValueError(
            f"cache file entry {prefix} stores codes/scales/minima in unexpected dtypes "
            f"{packed.dtype}/{scale.dtype}/{minimum.dtype}"
        )
    used.update(prefix + s for s in (".packed", ".scale", minimum_suffix))
    residual = QuantizedTensor(
        packed=packed,
        scale=scale,
        minimum=minimum,
        spec=spec,
        shape=shape,
        dtype=dtype,
        scale_format=meta["scale_format"],
    )
    method = method_of(spec)
    out = method.from_state(residual, sd, prefix, meta, spec)
    used.update(prefix + s for s in method.extra_parts)
    return out


_CACHE_DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
}


def _float_dtype(name, where: str) -> torch.dtype:
    """A dtype named in a cache file's metadata (only float dtypes; never ``getattr(torch, anything)``)."""
    if not isinstance(name, str) or name not in _CACHE_DTYPES:
        raise ValueError(
            f"cache file entry {where} records dtype {_short(name)}; expected one of {sorted(_CACHE_DTYPES)}"
        )
    return _CACHE_DTYPES[name]


def window_bytes(
    spec_k: QuantSpec | None, spec_v: QuantSpec | None, elements_per_side: int, full_bytes: int = 2
) -> int:
    """Projected stored bytes for ``elements_per_side`` cached key elements and as many values.

    ``full_bytes`` is the element size of an unquantized side (2 for BF16). Exact for RTN sides
    (packing, FP8 scales and 16-bit zeros are whole bytes per group of a token); a QVG side counts
    its residual only here: use :func:`chunk_bytes`, which knows the tokens per chunk.
    """
    total = 0
    for spec in (spec_k, spec_v):
        if spec is None:
            total += elements_per_side * full_bytes
        else:
            total += math.ceil(elements_per_side * spec.effective_bits / 8)
    return total


def chunk_bytes(
    spec_k: QuantSpec | None, spec_v: QuantSpec | None, lead: int, tokens: int, head_dim: int, full_bytes: int = 2
) -> int:
    """Exact stored bytes of one cached chunk, keys and values, of shape ``(lead..., tokens, head_dim)`` each.

    ``lead`` is batch x heads; ``full_bytes`` the element size of an unquantized side. QVG sides
    include their per-chunk centroids and cluster ids (the method object's ``chunk_nbytes``).
    """
    total = 0
    for spec in (spec_k, spec_v):
        total += (
            lead * tokens * head_dim * full_bytes
            if spec is None
            else method_of(spec).chunk_nbytes(spec, lead, tokens, head_dim)
        )
    return total
