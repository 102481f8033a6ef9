"""ChunkCache: the K/V of finished chunks of one attention layer, quantized and bit-packed."""
from __future__ import annotations

import json
import math
from collections import deque
from dataclasses import dataclass

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

from .attention import CacheEntry, cached_attention
from .quant import QuantizedTensor, check_finite, quantize
from .qvg import CENTROID_DTYPE, QVGTensor
from .spec import FLOAT_FORMATS, QuantSpec

_META_KEY = "__jensen_kv_meta__"
_FORMAT_VERSION = 2  # 2: specs carry method/qvg_* fields and QVG parts (centroids, ids); 1 still loads
_READABLE_VERSIONS = (1, 2)


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
    """

    def __init__(self, spec_k: QuantSpec | None = None, spec_v: QuantSpec | None = None, window_chunks: int | None = None,
                 sink_chunks: int = 0):
        for name, s in (("spec_k", spec_k), ("spec_v", spec_v)):
            if s is not None and not isinstance(s, QuantSpec):
                raise TypeError(f"{name} must be a QuantSpec or None, got {type(s).__name__}")
        if window_chunks is not None and (isinstance(window_chunks, bool) or not isinstance(window_chunks, int) or window_chunks < 0):
            raise ValueError(f"window_chunks={window_chunks!r} must be a non-negative integer (0 or None keeps every chunk)")
        self.spec_k = spec_k
        self.spec_v = spec_v
        if isinstance(sink_chunks, bool) or not isinstance(sink_chunks, int) or sink_chunks < 0:
            raise ValueError(f"sink_chunks={sink_chunks!r} must be a non-negative integer (0 = no attention sink)")
        self.window_chunks = window_chunks or None
        self.sink_chunks = sink_chunks
        self._sink_held = 0  # how many of the oldest entries are sink chunks (never evicted)
        self._entries: deque[CacheEntry] = deque()
        self._layout: tuple | None = None  # (batch, heads, head_dim, dtype, device) of the first chunk
        self.chunks_appended = 0
        self.chunks_evicted = 0

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
        """Bytes really held: packed codes, scales and zero-points (or the raw tensors)."""
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

    # ----------------------------------------------------------------- writing
    def _validate_chunk(self, k: Tensor, v: Tensor) -> None:
        for name, t in (("k", k), ("v", v)):
            if not isinstance(t, Tensor) or t.dim() != 4:
                raise ValueError(f"{name} must be a (batch, heads, tokens, head_dim) tensor, got {getattr(t, 'shape', type(t))}")
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

    def append(self, k: Tensor, v: Tensor) -> None:
        """Store one finished chunk (shape (batch, heads, tokens, head_dim), keys after RoPE).

        Everything is validated and quantized before the cache changes: a rejected chunk leaves
        the cache as it was. Beyond ``window_chunks`` the oldest chunk is dropped.
        """
        self.append_prepared(self.prepare(k, v))

    def prepare(self, k: Tensor, v: Tensor) -> PreparedChunk:
        """Validate and quantize a chunk exactly as :meth:`append` stores it, without storing it.

        For a caller that learns only later whether the chunk is final (ComfyUI core's AR
        sampler): it holds the chunk at the cache's precision meanwhile, then hands it to
        :meth:`append_prepared` or drops it.
        """
        self._validate_chunk(k, v)
        entry = CacheEntry(
            k=quantize(k, self.spec_k) if self.spec_k is not None else k.detach().clone(),
            v=quantize(v, self.spec_v) if self.spec_v is not None else v.detach().clone(),
        )
        return PreparedChunk(entry, (k.shape[0], k.shape[1], k.shape[-1], k.dtype, k.device))

    def append_prepared(self, chunk: PreparedChunk) -> None:
        """Store a chunk from :meth:`prepare` (of this cache or one with the same specs)."""
        if not isinstance(chunk, PreparedChunk):
            raise TypeError(f"append_prepared takes a PreparedChunk from prepare(), got {type(chunk).__name__}")
        if self._layout is not None and chunk.layout != self._layout:
            raise ValueError(f"prepared chunk layout {chunk.layout} differs from the cached chunks' {self._layout}")
        entry = chunk.entry
        if self._layout is None:
            self._layout = chunk.layout
        self._entries.append(entry)
        self.chunks_appended += 1
        if self._sink_held < self.sink_chunks:
            self._sink_held += 1
            return
        while self.window_chunks is not None and len(self._entries) - self._sink_held > self.window_chunks:
            del self._entries[self._sink_held]  # the oldest chunk of the window; the sink stays
            self.chunks_evicted += 1

    def copy(self) -> ChunkCache:
        """A new cache holding the same chunks (stored tensors are shared, never modified in place)."""
        other = ChunkCache(self.spec_k, self.spec_v, self.window_chunks, self.sink_chunks)
        other._entries = deque(self._entries)
        other._sink_held, other._layout = self._sink_held, self._layout
        other.chunks_appended, other.chunks_evicted = self.chunks_appended, self.chunks_evicted
        return other

    def to(self, device: str | torch.device) -> ChunkCache:
        """Move every cached chunk to ``device`` (after loading a file on the CPU); returns self."""
        device = torch.device(device)
        self._entries = deque(CacheEntry(k=_move(e.k, device), v=_move(e.v, device)) for e in self._entries)
        if self._layout is not None:
            self._layout = (*self._layout[:4], device)
        return self

    # ----------------------------------------------------------------- reading
    def attend(self, q: Tensor, k_cur: Tensor, v_cur: Tensor, correction: str = "taylor", strength: float = 1.0) -> Tensor:
        """Attention of the current chunk over the cached chunks and itself (see :func:`cached_attention`)."""
        if self._layout is not None and q.device != self._layout[4]:
            raise ValueError(f"query lives on {q.device} but the cache on {self._layout[4]}; move it to {self._layout[4]}")
        return cached_attention(q, k_cur, v_cur, self._entries, correction=correction, strength=strength)

    # ----------------------------------------------------------------- persistence
    def _meta(self) -> dict:
        return {
            "version": _FORMAT_VERSION,
            "spec_k": self.spec_k.to_dict() if self.spec_k else None,
            "spec_v": self.spec_v.to_dict() if self.spec_v else None,
            "window_chunks": self.window_chunks,
            "sink_chunks": self.sink_chunks,
            "sink_held": self._sink_held,
            "layout": None if self._layout is None else {
                "batch": self._layout[0], "heads": self._layout[1], "head_dim": self._layout[2],
                "dtype": str(self._layout[3]).removeprefix("torch."),
            },
            "chunks": [
                {name: _part_meta(t) for name, t in (("k", e.k), ("v", e.v))} for e in self._entries
            ],
        }

    def state_dict(self) -> dict[str, Tensor]:
        """Flat dict of tensors (safetensors-ready); the layout is JSON in ``__jensen_kv_meta__``."""
        sd: dict[str, Tensor] = {}
        for i, e in enumerate(self._entries):
            for name, t in (("k", e.k), ("v", e.v)):
                p = f"chunk{i}.{name}"
                if isinstance(t, QuantizedTensor):
                    sd[p + ".packed"] = t.packed.contiguous()
                    sd[p + ".scale"] = t.scale.contiguous()
                    sd[p + ".zero"] = t.zero.contiguous()
                    if isinstance(t, QVGTensor):
                        sd[p + ".centroids"] = t.centroids.contiguous()
                        sd[p + ".ids"] = t.ids.contiguous()
                else:
                    sd[p] = t.contiguous()
        sd[_META_KEY] = torch.frombuffer(bytearray(json.dumps(self._meta()).encode()), dtype=torch.uint8)
        return sd

    def load_state_dict(self, sd: dict[str, Tensor]) -> None:
        """Replace the contents with a state dict saved under the same specs; rejects others clearly."""
        if _META_KEY not in sd:
            raise ValueError("not a jensen-kv cache file: the __jensen_kv_meta__ entry is missing")
        meta = json.loads(bytes(sd[_META_KEY].cpu().tolist()).decode())
        if meta.get("version") not in _READABLE_VERSIONS:
            raise ValueError(f"cache file format {meta.get('version')} is not supported (expected one of {_READABLE_VERSIONS})")
        mine = (self.spec_k.to_dict() if self.spec_k else None, self.spec_v.to_dict() if self.spec_v else None)
        try:  # older files lack the fields added since: compare as specs, defaults filled in
            theirs = tuple(None if d is None else QuantSpec.from_dict(d).to_dict() for d in (meta["spec_k"], meta["spec_v"]))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"the file's quantization specs are not readable: {exc}") from None
        if mine != theirs:
            raise ValueError(
                f"the file was saved with specs (keys, values) {theirs} but this cache uses {mine}; "
                "create the ChunkCache with the file's specs to load it"
            )
        lay = meta["layout"]
        if self._layout is not None and lay is not None:
            b0, h0, d0, _, _ = self._layout
            if (lay["batch"], lay["heads"], lay["head_dim"]) != (b0, h0, d0):
                raise ValueError(
                    f"the file holds batch {lay['batch']}, heads {lay['heads']}, head_dim {lay['head_dim']} "
                    f"but this cache holds batch {b0}, heads {h0}, head_dim {d0}; clear() it first"
                )
        entries = []
        for i, cm in enumerate(meta["chunks"]):
            parts = {}
            for name in ("k", "v"):
                parts[name] = _load_part(sd, f"chunk{i}.{name}", cm[name], self.spec_k if name == "k" else self.spec_v)
            entries.append(CacheEntry(**parts))
        if int(meta.get("sink_chunks", 0)) != self.sink_chunks:
            raise ValueError(
                f"the file was saved with sink_chunks={meta.get('sink_chunks', 0)} but this cache uses "
                f"{self.sink_chunks}; create the ChunkCache with the file's sink to load it"
            )
        held = int(meta.get("sink_held", 0))
        if not 0 <= held <= min(self.sink_chunks, len(entries)):
            raise ValueError(f"cache file records {held} sink chunks, which does not fit its {len(entries)} chunks")
        self._entries = deque(entries)
        self._sink_held = held
        if lay is None or not entries:
            self._layout = None
        else:
            first = entries[0].k
            device = first.device
            self._layout = (lay["batch"], lay["heads"], lay["head_dim"], _float_dtype(lay["dtype"], "layout"), device)

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


def _move(t: QuantizedTensor | Tensor, device: torch.device) -> QuantizedTensor | Tensor:
    return t.to(device)  # QuantizedTensor.to moves its stored parts; a raw tensor moves itself


def _expected_bits(spec: QuantSpec | None, full_bits: int) -> float:
    return spec.effective_bits if spec is not None else full_bits


def _part_meta(t: QuantizedTensor | Tensor) -> dict:
    if isinstance(t, QVGTensor):
        return {"quantized": True, "shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch."),
                "scale_format": t.scale_format, "segments": [list(s) for s in t.segments]}
    if isinstance(t, QuantizedTensor):
        return {"quantized": True, "shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch."), "scale_format": t.scale_format}
    return {"quantized": False, "shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")}


def _load_part(sd: dict[str, Tensor], prefix: str, meta: dict, spec: QuantSpec | None) -> QuantizedTensor | Tensor:
    shape = torch.Size(meta["shape"])
    dtype = _float_dtype(meta.get("dtype"), prefix)
    if not meta["quantized"]:
        t = sd.get(prefix)
        if t is None or tuple(t.shape) != tuple(shape):
            raise ValueError(f"cache file entry {prefix} is missing or has the wrong shape (expected {tuple(shape)})")
        if t.dtype != dtype:
            raise ValueError(f"cache file entry {prefix} is {t.dtype}, but its metadata says {dtype}")
        return t
    if spec is None:
        raise ValueError(f"cache file entry {prefix} is quantized but this cache keeps that side unquantized")
    try:
        packed, scale, zero = sd[prefix + ".packed"], sd[prefix + ".scale"], sd[prefix + ".zero"]
    except KeyError as exc:
        raise ValueError(f"cache file entry {exc.args[0]} is missing") from None
    G = shape[-1] // spec.group_size
    expect_packed = (*shape[:-1], shape[-1] * spec.bits // 8)
    if tuple(packed.shape) != expect_packed or tuple(scale.shape) != (*shape[:-1], G) or tuple(zero.shape) != (*shape[:-1], G):
        raise ValueError(f"cache file entry {prefix} does not match its recorded shape {tuple(shape)}")
    if meta.get("scale_format") not in FLOAT_FORMATS:
        raise ValueError(f"cache file entry {prefix} has an unknown scale format {meta.get('scale_format')!r}")
    if packed.dtype != torch.uint8 or scale.dtype != FLOAT_FORMATS[meta["scale_format"]][0] or zero.dtype != FLOAT_FORMATS[spec.zero_format][0]:
        raise ValueError(
            f"cache file entry {prefix} stores codes/scales/zeros in unexpected dtypes {packed.dtype}/{scale.dtype}/{zero.dtype}"
        )
    fields = dict(packed=packed, scale=scale, zero=zero, spec=spec, shape=shape,
                  dtype=dtype, scale_format=meta["scale_format"])
    if spec.method != "qvg":
        if f"{prefix}.centroids" in sd or "segments" in meta:
            raise ValueError(f"cache file entry {prefix} holds QVG centroids but the spec's method is {spec.method!r}")
        return QuantizedTensor(**fields)
    return QVGTensor(**fields, **_load_qvg(sd, prefix, meta, spec, shape))


def _load_qvg(sd: dict[str, Tensor], prefix: str, meta: dict, spec: QuantSpec, shape: torch.Size) -> dict:
    """The QVG fields of a cache file entry, with every shape, dtype and id range checked."""
    try:
        centroids, ids = sd[prefix + ".centroids"], sd[prefix + ".ids"]
    except KeyError as exc:
        raise ValueError(f"cache file entry {exc.args[0]} is missing (a QVG chunk stores centroids and cluster ids)") from None
    segments = meta.get("segments")
    if not isinstance(segments, list) or not segments or any(
        not isinstance(s, list) or len(s) != 2 or not all(isinstance(v, int) for v in s) for s in segments
    ):
        raise ValueError(f"cache file entry {prefix} has no valid QVG segments record")
    segments = tuple((t, k) for t, k in segments)
    T, D, S = shape[-2], shape[-1], spec.qvg_stages
    if sum(t for t, _ in segments) != T or any(k != spec.centroids_per_chunk(t) for t, k in segments):
        raise ValueError(
            f"cache file entry {prefix}: segments {segments} do not fit {T} tokens with K={spec.qvg_centroids}"
        )
    k_total = sum(k for _, k in segments)
    if tuple(centroids.shape) != (S, *shape[:-2], k_total, D) or centroids.dtype != CENTROID_DTYPE:
        raise ValueError(
            f"cache file entry {prefix}.centroids is {tuple(centroids.shape)} {centroids.dtype}; expected "
            f"{(S, *shape[:-2], k_total, D)} {CENTROID_DTYPE}"
        )
    if tuple(ids.shape) != (S, *shape[:-1]) or ids.dtype != torch.uint8:
        raise ValueError(f"cache file entry {prefix}.ids is {tuple(ids.shape)} {ids.dtype}; expected {(S, *shape[:-1])} uint8")
    start = 0
    for t, k in segments:
        if t and int(ids[..., start : start + t].max()) >= k:
            raise ValueError(f"cache file entry {prefix}.ids points past its chunk's {k} centroids")
        start += t
    return {"centroids": centroids, "ids": ids, "segments": segments}


_CACHE_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64}


def _float_dtype(name, where: str) -> torch.dtype:
    """A dtype named in a cache file's metadata (only float dtypes; never ``getattr(torch, anything)``)."""
    if name not in _CACHE_DTYPES:
        raise ValueError(f"cache file entry {where} records dtype {name!r}; expected one of {sorted(_CACHE_DTYPES)}")
    return _CACHE_DTYPES[name]


def window_bytes(spec_k: QuantSpec | None, spec_v: QuantSpec | None, elements_per_side: int, full_bytes: int = 2) -> int:
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


def chunk_bytes(spec_k: QuantSpec | None, spec_v: QuantSpec | None, lead: int, tokens: int, head_dim: int,
                full_bytes: int = 2) -> int:
    """Exact stored bytes of one cached chunk, keys and values, of shape ``(lead..., tokens, head_dim)`` each.

    ``lead`` is batch x heads; ``full_bytes`` the element size of an unquantized side. QVG sides
    include their per-chunk centroids and cluster ids (:meth:`QuantSpec.chunk_nbytes`).
    """
    total = 0
    for spec in (spec_k, spec_v):
        total += lead * tokens * head_dim * full_bytes if spec is None else spec.chunk_nbytes(lead, tokens, head_dim)
    return total
