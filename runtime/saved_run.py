"""A Chunked AR run saved to continue it later (the ``JENSEN_KV_CACHE`` link type).

Everything the next chunk needs: every layer's and CFG branch's quantized cache (sink included),
the next chunk index and RoPE frame, the specs, window and sink, the prompt the retained chunks were
written with, the clean latents of the retained chunks (so a prompt switch after loading can
re-cache them), and a fingerprint of the model (architecture and a hash of a few weights).

On disk it is one safetensors file (data, never code): tensors plus JSON in the header metadata,
with a SHA-256 over the state JSON and every tensor's name, shape, dtype and bytes.

What the SHA-256 is, and is not: a check against corruption (a truncated download, a flipped
byte, a file cut short by a full disk). It has no key, so it is not a signature: anyone can edit a
file and record the new digest, and a file from someone else is exactly as trustworthy as they
are. So a file is never trusted for being signed: :func:`load_saved_run` treats every file as
written by a stranger. It reads the header with a size cap, checks the digest by streaming the
file (no tensor is copied to hash it), then checks the state's whole structure before any tensor
is read: unique (layer, branch) pairs, exactly one per layer and CFG branch; exactly the retained
chunks the window and sink keep, with frames consistent with ``chunk_frames`` and ``next_frame``;
every tensor one the record describes, of the recorded shape and dtype. Then each cache's own
record (:func:`~jensen_core.cache.read_meta`: chunk count within window + sink, layout, specs)
against the state, and only then its tensors. Every refusal is one ValueError naming the field and
what was expected; memory goes to what the file really holds, never to a number it claims; a
caller's ``check_interrupt`` runs between reads. Nothing is half-loaded: the state is returned only
when all of it checked out. :meth:`SavedRun.check_compatible` then refuses a state made with another
model, spec, head count, chunk length, window, sink or latent size, naming which. No ComfyUI import here.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import stat
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from safetensors.torch import save_file
from torch import Tensor

from ..jensen_core import CachePrecision, ChunkCache, QuantSpec
from ..jensen_core.cache import MAX_META_BYTES, META_KEY, parse_json, read_meta, whole
from ..jensen_core.retention import Retention
from ..jensen_core.tiers import AgeTiers

FORMAT = "jensen_kv_run_state"
VERSION = 1
_CACHE_PREFIX = "cache"
_LATENT_PREFIX = "latent"


def weights_digest(module: torch.nn.Module, names_hint: int = 4, elements: int = 4096) -> str:
    """SHA-256 over the first ``elements`` values of a few weights (first and last blocks, the head)."""
    params = [(n, p) for n, p in module.named_parameters() if p.dim() >= 2]
    if not params:
        params = list(module.named_parameters())
    pick = params[: names_hint // 2] + params[-(names_hint - names_hint // 2) :] if len(params) > names_hint else params
    h = hashlib.sha256()
    for name, p in pick:
        h.update(name.encode())
        h.update(str((tuple(p.shape), str(p.dtype))).encode())
        h.update(_leading_bytes(p, elements))
    return h.hexdigest()[:32]


def _leading_bytes(p: Tensor, elements: int) -> bytes:
    """The bytes of the first ``elements`` values of a weight, whatever tensor type holds it."""
    try:
        flat = (
            torch.Tensor(p.detach()).reshape(-1)[:elements]
            if type(p) is not torch.Tensor
            else p.detach().reshape(-1)[:elements]
        )
        return flat.to("cpu").contiguous().view(torch.uint8).numpy().tobytes()
    except (RuntimeError, TypeError, ValueError):
        try:
            return p.detach().reshape(-1)[:elements].to("cpu", torch.float32).numpy().tobytes()
        except (RuntimeError, TypeError, ValueError):
            return b""


@dataclass
class RetainedChunk:
    """A chunk whose entries are in the cache: its absolute index, first frame, and clean LATENT frames."""

    chunk: int
    frame_offset: int
    latent: Tensor  # (batch, channels, frames, height, width), LATENT space (as SaveLatent holds it)

    @property
    def frames(self) -> int:
        return int(self.latent.shape[2])


@dataclass
class SavedRun:
    fingerprint: dict
    spec_k: QuantSpec | None
    spec_v: QuantSpec | None
    chunk_frames: int
    window_chunks: int
    sink_chunks: int
    latent_shape: tuple[int, int, int, int]  # batch, channels, height, width
    next_chunk: int
    next_frame: int
    branches: list[int]
    active_prompt: str
    caches: dict[tuple[int, int], ChunkCache]
    retained: list[RetainedChunk] = field(default_factory=list)
    info: dict = field(default_factory=dict)  # free-form, for people: seed, prompts, when
    tiers: AgeTiers | None = None  # precision by age of every cache (each chunk records its own bits)

    # ------------------------------------------------------------------ facts
    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.caches.values())

    @property
    def precision(self) -> CachePrecision:
        """How its caches store keys and values (the specs and the age tiers)."""
        return CachePrecision(self.spec_k, self.spec_v, self.tiers)

    def describe(self) -> str:
        spec = self.spec_k or self.spec_v
        kind = "full precision" if spec is None else f"K {self._bits(self.spec_k)}/V {self._bits(self.spec_v)}"
        return (
            f"{self.next_chunk} chunks ({self.next_frame} latent frames) of {self.fingerprint.get('family')} "
            f"{self.fingerprint.get('layers')}x{self.fingerprint.get('heads')}x{self.fingerprint.get('head_dim')}, "
            f"{kind}{f' (tiers {self.tiers})' if self.tiers else ''}, {len(self.retained)} chunks retained (window {self.window_chunks or 'all'}, sink "
            f"{self.sink_chunks}), {self.nbytes / 2**20:.2f} MiB"
        )

    @property
    def tokens_per_frame(self) -> int | None:
        """Self-attention tokens per latent frame the caches hold (the newest retained chunk's), None when empty."""
        cache = next(iter(self.caches.values()), None)
        if cache is None or not cache.entries or not self.retained:
            return None
        return cache.entries[-1].tokens // self.retained[-1].frames

    @staticmethod
    def _bits(spec):
        return "full" if spec is None else f"INT{spec.bits}"

    def _meta(self) -> dict:
        return {
            "fingerprint": self.fingerprint,
            "spec_k": self.spec_k.to_dict() if self.spec_k else None,
            "spec_v": self.spec_v.to_dict() if self.spec_v else None,
            "chunk_frames": self.chunk_frames,
            "window_chunks": self.window_chunks,
            "sink_chunks": self.sink_chunks,
            "latent_shape": list(self.latent_shape),
            "next_chunk": self.next_chunk,
            "next_frame": self.next_frame,
            "branches": list(self.branches),
            "active_prompt": self.active_prompt,
            "caches": [[layer, branch] for layer, branch in sorted(self.caches)],
            "retained": [
                {
                    "chunk": r.chunk,
                    "frame_offset": r.frame_offset,
                    "shape": list(r.latent.shape),
                    "dtype": str(r.latent.dtype).removeprefix("torch."),
                }
                for r in self.retained
            ],
            "info": self.info,
            # written only with tiers: a state without them stays readable by packs that predate them
            **({"tiers": self.tiers.to_dict()} if self.tiers is not None else {}),
        }

    def to(self, device) -> SavedRun:
        """Move the caches to ``device`` (where the model attends); returns self."""
        for cache in self.caches.values():
            cache.to(device)
        return self

    # ------------------------------------------------------------------ compatibility
    def check_compatible(
        self,
        *,
        fingerprint: dict,
        chunk_frames: int,
        window_chunks: int,
        sink_chunks: int,
        latent_shape: tuple[int, ...],
        branches: list[int],
        precision: CachePrecision | None = None,
        tokens_per_frame: int | None = None,
        **specs,
    ) -> None:
        """ValueError naming the first thing that differs between this state and the run that wants it.

        ``precision``: how the run stores its caches (a :class:`CachePrecision`; or its ``spec_k``, ``spec_v`` and
        ``tiers`` one by one, as before the value existed). ``tokens_per_frame``: what the run's model family makes
        of one latent frame of its latent; the caches must hold as many (the file's latent size and its caches'
        tokens are two fields: both are compared)."""
        if precision is None:
            unknown = sorted(set(specs) - {"spec_k", "spec_v", "tiers"})
            if unknown:
                raise TypeError(f"check_compatible() got unexpected keyword arguments {unknown}")
            precision = CachePrecision(specs.get("spec_k"), specs.get("spec_v"), specs.get("tiers"))
        elif specs:
            raise TypeError("check_compatible(): give precision= or spec_k / spec_v / tiers, not both")
        spec_k, spec_v, tiers = precision.spec_k, precision.spec_v, precision.tiers

        def differ(what, saved, now, fix):
            raise ValueError(f"this KV cache was made with {what} {saved}, but this run has {now}; {fix}")

        mine = {k: v for k, v in with_kv_heads(self.fingerprint).items() if k != "weights"}
        theirs = {k: v for k, v in with_kv_heads(fingerprint).items() if k != "weights"}
        order = ["family", "layers", "heads", "kv_heads", "head_dim", "dim", "ffn_dim", "text_dim"]
        for k in sorted(set(mine) | set(theirs), key=lambda k: (order.index(k) if k in order else len(order), k)):
            if mine.get(k) != theirs.get(k):
                differ(
                    f"a model whose {k} is",
                    mine.get(k),
                    theirs.get(k),
                    "load the model the cache was made with (another model's keys mean nothing here)",
                )
        if self.fingerprint.get("weights") != fingerprint.get("weights"):
            differ(
                "model weights with digest",
                self.fingerprint.get("weights"),
                fingerprint.get("weights"),
                "load the same checkpoint, weight dtype and LoRAs the cache was made with",
            )
        for side, saved, now in (("key", self.spec_k, spec_k), ("value", self.spec_v, spec_v)):
            if (saved.to_dict() if saved else None) != (now.to_dict() if now else None):
                differ(
                    f"the {side} spec",
                    saved.to_dict() if saved else "full precision",
                    now.to_dict() if now else "full precision",
                    "set Quantize KV Cache as it was when the cache was saved",
                )
        if self.tiers != tiers:
            differ(
                "age tiers",
                str(self.tiers) if self.tiers else "off",
                str(tiers) if tiers else "off",
                "set Quantize KV Cache's recent_chunks_bits, recent_chunks and sink_bits as they were",
            )
        if self.chunk_frames != chunk_frames:
            differ("chunk_frames", self.chunk_frames, chunk_frames, "use the same chunk length")
        if (self.window_chunks, self.sink_chunks) != (window_chunks, sink_chunks):
            differ(
                "(window_chunks, sink_chunks)",
                (self.window_chunks, self.sink_chunks),
                (window_chunks, sink_chunks),
                "use the same window and sink",
            )
        if tuple(self.latent_shape) != tuple(latent_shape):
            differ(
                "latents of (batch, channels, height, width)",
                tuple(self.latent_shape),
                tuple(latent_shape),
                "use the same video size and batch",
            )
        if sorted(self.branches) != sorted(branches):
            differ(
                "CFG branches",
                self.branches,
                branches,
                "use cfg 1 on both runs, or cfg > 1 on both (cond and uncond are cached separately)",
            )
        held = self.tokens_per_frame
        if tokens_per_frame is not None and held is not None and held != tokens_per_frame:
            differ(
                "caches of",
                f"{held} tokens per latent frame",
                f"{tokens_per_frame} for its latent of (batch, channels, height, width) {tuple(latent_shape)}",
                "the file's latent size and its caches disagree (it was edited or damaged): save the cache again",
            )

    # ------------------------------------------------------------------ files
    def save(self, path: str) -> int:
        """Write to ``path`` (atomically: a temporary file renamed into place). Returns the file size."""
        tensors: dict[str, Tensor] = {}
        for (layer, branch), cache in sorted(self.caches.items()):
            for name, t in cache.state_dict().items():
                tensors[f"{_CACHE_PREFIX}.{layer}.{branch}.{name}"] = t.detach().to("cpu").contiguous()
        for r in self.retained:
            tensors[f"{_LATENT_PREFIX}.{r.chunk}"] = r.latent.detach().to("cpu").contiguous()
        state = json.dumps(self._meta())
        meta = {"format": FORMAT, "version": str(VERSION), "state": state, "sha256": _digest(tensors, state)}
        # a fresh temporary file (O_EXCL, unguessable name) beside the target: a symlink planted under a
        # predictable name in output/ cannot redirect the write
        fd, tmp = tempfile.mkstemp(
            prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=os.path.dirname(os.path.abspath(path))
        )
        os.close(fd)
        try:
            save_file(tensors, tmp, metadata=meta)
            os.replace(tmp, path)
        finally:
            if os.path.lexists(tmp):
                os.remove(tmp)
        return os.path.getsize(path)


def _digest(tensors: dict[str, Tensor], state: str) -> str:
    """SHA-256 over the state JSON and every tensor (name, shape, dtype, bytes): what :meth:`SavedRun.save` records.

    Each tensor's bytes are hashed where they lie (a uint8 view of a contiguous CPU tensor), not copied."""
    h = hashlib.sha256()
    h.update(state.encode("utf-8", "surrogatepass"))
    for name in sorted(tensors):
        t = tensors[name]
        h.update(name.encode("utf-8", "surrogatepass"))
        h.update(_describe(tuple(t.shape), t.dtype))
        if t.numel():
            h.update(t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy())
    return h.hexdigest()


def _describe(shape: tuple[int, ...], dtype: torch.dtype) -> bytes:
    return str((tuple(shape), str(dtype))).encode()


def with_kv_heads(fingerprint: dict) -> dict:
    """``fingerprint`` with its ``kv_heads`` (the K/V heads its caches hold): a file written before grouped-query
    attention, or by a model with as many K/V heads as query heads, records none, and reads as ``heads``."""
    if "kv_heads" in fingerprint or "heads" not in fingerprint:
        return fingerprint
    return {**fingerprint, "kv_heads": fingerprint["heads"]}


# ---------------------------------------------------------------------------------------------- reading a file
#: the largest safetensors header read (tensor index and metadata); this pack's files need ~100 bytes per tensor
MAX_HEADER_BYTES = 16 << 20
#: the largest state record (the JSON in the header's ``state``): ~100 bytes per retained chunk
MAX_STATE_BYTES = 4 << 20
MAX_LAYERS = 4096
MAX_HEADS = 4096
MAX_HEAD_DIM = 1 << 16
MAX_BATCH = 4096
MAX_CHANNELS = 4096
MAX_LATENT_SIDE = 1 << 16
#: the largest frame or chunk count a state may record (a C int: RoPE offsets and seeds stay in range)
MAX_FRAMES = (1 << 31) - 1

_STORED_DTYPES = {  # safetensors dtype name -> torch dtype (what the header may name; the format check narrows it)
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "U8": torch.uint8,
    "I8": torch.int8,
    "I16": torch.int16,
    "I32": torch.int32,
    "I64": torch.int64,
    "BOOL": torch.bool,
}
_LATENT_DTYPES = ("float32", "float16", "bfloat16", "float64")
_STATE_FIELDS = (
    "fingerprint",
    "spec_k",
    "spec_v",
    "chunk_frames",
    "window_chunks",
    "sink_chunks",
    "latent_shape",
    "next_chunk",
    "next_frame",
    "branches",
    "active_prompt",
    "caches",
    "retained",
    "info",
)
#: state fields a file may lack (written only when set)
_OPTIONAL_STATE_FIELDS = ("tiers",)


class _Unreadable(ValueError):
    """The file is not a safetensors file this loader can read (its header, or its data's extent)."""


@dataclass(frozen=True)
class _Stored:
    """One tensor where the file's header places it."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int  # absolute offset in the file
    nbytes: int


class _CacheFile:
    """A safetensors file read through one descriptor of a regular file: the header is read (at most
    :data:`MAX_HEADER_BYTES`) and checked whole (every tensor's dtype, shape and extent, the extents
    following one another to the end of the file); data is read only where the header places it."""

    def __init__(self, path: str):
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise _Unreadable("it is not a regular file")
            self._file = os.fdopen(fd, "rb", buffering=0)
        except BaseException:
            os.close(fd)
            raise
        self.size = st.st_size
        try:
            self.metadata, self.tensors = self._read_header()
        except _Unreadable:
            self._file.close()
            raise
        except ValueError as exc:  # a field of the header out of range (whole())
            self._file.close()
            raise _Unreadable(str(exc)) from None
        except BaseException:
            self._file.close()
            raise

    def __enter__(self) -> _CacheFile:
        return self

    def __exit__(self, *exc) -> None:
        self._file.close()

    def _read_into(self, offset: int, view: memoryview) -> None:
        self._file.seek(offset)
        got = 0
        while got < len(view):
            n = self._file.readinto(view[got:])
            if not n:
                raise _Unreadable(f"it ended at byte {offset + got} while being read")
            got += n

    def _read_header(self) -> tuple[dict, dict[str, _Stored]]:
        if self.size < 8:
            raise _Unreadable(f"it has {self.size} bytes, fewer than a safetensors header's 8")
        head = bytearray(8)
        self._read_into(0, memoryview(head))
        n = int.from_bytes(head, "little")
        if n > MAX_HEADER_BYTES:
            raise _Unreadable(
                f"its header declares {n} bytes; a Jensen KV cache file's header is at most {MAX_HEADER_BYTES}"
            )
        if 8 + n > self.size:
            raise _Unreadable(f"its header declares {n} bytes but only {self.size - 8} follow")
        raw = bytearray(n)
        self._read_into(8, memoryview(raw))
        try:
            header = parse_json(raw, "its header")
        except ValueError as exc:
            raise _Unreadable(str(exc)) from None
        del raw
        if not isinstance(header, dict):
            raise _Unreadable(f"its header is a JSON {type(header).__name__}, not an object")
        meta = header.pop("__metadata__", None) or {}
        if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
            raise _Unreadable("its __metadata__ does not map names to text")
        data_start = 8 + n
        tensors: dict[str, _Stored] = {}
        for name, rec in header.items():
            if not (name.isascii() and name.isprintable()):
                raise _Unreadable(f"it names a tensor {_short(name)}; this format's tensor names are plain ASCII")
            if not isinstance(rec, dict) or set(rec) != {"dtype", "shape", "data_offsets"}:
                raise _Unreadable(f"its header entry for {name!r} is not {{dtype, shape, data_offsets}}")
            dtype = _STORED_DTYPES.get(rec["dtype"]) if isinstance(rec["dtype"], str) else None
            if dtype is None:
                raise _Unreadable(
                    f"tensor {name!r} has dtype {_short(rec['dtype'])}; this loader reads {', '.join(_STORED_DTYPES)}"
                )
            shape, offsets = rec["shape"], rec["data_offsets"]
            if not isinstance(shape, list) or len(shape) > 8 or not isinstance(offsets, list) or len(offsets) != 2:
                raise _Unreadable(f"tensor {name!r} has no readable shape and data_offsets")
            shape = tuple(whole(s, f"tensor {name!r} shape[{i}]") for i, s in enumerate(shape))
            if math.prod(s for s in shape if s) >= 1 << 62:
                raise _Unreadable(f"tensor {name!r} has shape {list(shape)}, larger than any tensor can be")
            begin, end = (whole(o, f"tensor {name!r} data_offsets", 0, self.size - data_start) for o in offsets)
            nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
            if end - begin != nbytes:
                raise _Unreadable(
                    f"tensor {name!r} of shape {list(shape)} {rec['dtype']} needs {nbytes} bytes, but its "
                    f"data_offsets span {end - begin}"
                )
            tensors[name] = _Stored(name, dtype, shape, data_start + begin, nbytes)
        pos = data_start
        for t in sorted(tensors.values(), key=lambda t: (t.start, t.nbytes)):
            if t.start != pos:
                raise _Unreadable(
                    f"its tensors' data do not follow one another (tensor {t.name!r} starts at byte "
                    f"{t.start}, not {pos})"
                )
            pos += t.nbytes
        if pos != self.size:
            raise _Unreadable(f"its tensors' data end at byte {pos}, but the file has {self.size} bytes")
        return meta, tensors

    def digest(self, state: str, tick: Callable[[], None]) -> str:
        """:func:`_digest` of the file's tensors, read from the file in 1 MiB blocks (no tensor is built)."""
        h = hashlib.sha256()
        h.update(state.encode("utf-8", "surrogatepass"))
        block = memoryview(bytearray(min(1 << 20, max(self.size, 1))))
        for name in sorted(self.tensors):
            t = self.tensors[name]
            h.update(name.encode())
            h.update(_describe(t.shape, t.dtype))
            pos, left = t.start, t.nbytes
            while left:
                n = min(left, len(block))
                self._read_into(pos, block[:n])
                h.update(block[:n])
                pos, left = pos + n, left - n
                tick()
        return h.hexdigest()

    def read(self, t: _Stored) -> Tensor:
        """The tensor, in memory of its own (read straight into it: one copy of its bytes, no more)."""
        if not t.nbytes:
            return torch.empty(t.shape, dtype=t.dtype)
        buf = torch.empty(t.nbytes, dtype=torch.uint8)
        self._read_into(t.start, memoryview(buf.numpy()))
        return buf.view(t.dtype).reshape(t.shape)


def _no_interrupt() -> None:
    return None


def load_saved_run(path: str, *, check_interrupt: Callable[[], None] | None = None) -> SavedRun:
    """Read a state written by :meth:`SavedRun.save` (on the CPU; :meth:`SavedRun.to` moves it).

    In this order, each step before any work of the next: the header (bounded, checked whole), the
    format and version, the SHA-256 (streamed from the file), the state record's structure against
    itself and against the header's tensors (:func:`_check_state`), then each cache's record and
    tensors, then the retained latents. Every refusal is one ValueError naming the file, the field
    and what was expected. ``check_interrupt`` (ComfyUI passes its
    ``throw_exception_if_processing_interrupted``) is called between reads so an interrupt stops a
    load of a large file. Nothing is returned until all of it checked out.
    """
    name = os.path.basename(path)
    tick = check_interrupt or _no_interrupt
    try:
        f = _CacheFile(path)
    except _Unreadable as exc:
        raise ValueError(
            f"{name} is not a readable safetensors file ({exc}); it may be truncated or not a Jensen KV cache file"
        ) from None
    except OSError as exc:
        raise ValueError(f"{name} is not a readable safetensors file ({exc.strerror or exc})") from None
    with f:
        header = f.metadata
        if header.get("format") != FORMAT:
            raise ValueError(f"{name} is not a Jensen KV cache file (format {_short(header.get('format'))})")
        if header.get("version") != str(VERSION):
            raise ValueError(f"{name} has format version {_short(header.get('version'))}; this pack reads {VERSION}")
        state_text = header.get("state")
        if state_text is None or len(state_text) > MAX_STATE_BYTES:
            raise ValueError(
                f"{name} has {'no' if state_text is None else f'a {len(state_text)}-character'} state "
                f"record; a Jensen KV cache file has one of at most {MAX_STATE_BYTES} characters"
            )
        try:
            signed = header.get("sha256") == f.digest(state_text, tick)
        except _Unreadable as exc:
            raise ValueError(f"{name} could not be read to the end ({exc})") from None
        if not signed:
            raise ValueError(f"{name} does not match its recorded SHA-256: the file was edited or damaged")
        try:
            plan = _check_state(parse_json(state_text, "the state record"), f.tensors)
            return _build(plan, f, tick)
        except _Unreadable as exc:
            raise ValueError(f"{name} could not be read to the end ({exc})") from None
        except ValueError as exc:
            raise ValueError(f"{name}: {exc}") from None


# ---------------------------------------------------------------------------------------------- the state's structure
@dataclass(frozen=True)
class _Retained:
    chunk: int
    frame_offset: int
    frames: int
    tensor: _Stored


@dataclass(frozen=True)
class _Plan:
    """A state record whose structure checked out, with the header's tensors grouped by cache and latent."""

    fingerprint: dict
    spec_k: QuantSpec | None
    spec_v: QuantSpec | None
    chunk_frames: int
    window_chunks: int
    sink_chunks: int
    latent_shape: tuple[int, int, int, int]
    next_chunk: int
    next_frame: int
    branches: list[int]
    active_prompt: str
    info: dict
    retained: list[_Retained]
    caches: dict[tuple[int, int], dict[str, _Stored]]  # (layer, branch) -> {name in the cache's state dict: tensor}
    tiers: AgeTiers | None = None


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _index(text: str) -> int | None:
    """A tensor-name part that spells a whole number as :meth:`SavedRun.save` writes it ("0", "12"; not "01", "+1")."""
    if text.isascii() and text.isdigit() and (text == "0" or not text.startswith("0")) and len(text) <= 10:
        return int(text)
    return None


def _check_state(st, stored: dict[str, _Stored]) -> _Plan:
    """Check a state record against itself and against the header's tensors; no tensor data is read.

    The (layer, branch) pairs are unique whole numbers, exactly every layer under every CFG branch
    listed; the retained chunks are exactly those the window and sink keep at ``next_chunk``, each
    of 1 to ``chunk_frames`` frames, their first frames consistent with one another, and
    ``next_frame`` follows the last of them; every tensor is one the record describes, of the
    recorded shape and dtype. Lengths are checked before anything is iterated."""
    if not isinstance(st, dict):
        raise ValueError(f"the state record must be a JSON object, got {type(st).__name__}")
    missing = [k for k in _STATE_FIELDS if k not in st]
    unknown = sorted(k for k in st if k not in _STATE_FIELDS + _OPTIONAL_STATE_FIELDS)
    if missing or unknown:
        raise ValueError(
            "the state record "
            + "; ".join(
                ([f"lacks {', '.join(missing)}"] if missing else [])
                + ([f"has fields format version {VERSION} does not know: {_short(unknown)}"] if unknown else [])
            )
        )
    fp = st["fingerprint"]
    if not isinstance(fp, dict):
        raise ValueError(f"fingerprint must be a JSON object, got {type(fp).__name__}")
    for k, v in fp.items():
        if not (v is None or isinstance(v, (str, int, float, bool))):
            raise ValueError(f"fingerprint {k}={_short(v)} must be text, a number or null")
    for k in ("family", "weights"):
        if not isinstance(fp.get(k), str):
            raise ValueError(f"fingerprint {k}={_short(fp.get(k))} must be text")
    layers = whole(fp.get("layers"), "fingerprint layers", 1, MAX_LAYERS)
    heads = whole(fp.get("heads"), "fingerprint heads", 1, MAX_HEADS)
    kv_heads = whole(fp.get("kv_heads", heads), "fingerprint kv_heads", 1, MAX_HEADS)
    if heads % kv_heads:
        raise ValueError(f"fingerprint kv_heads={kv_heads} must divide heads={heads} (grouped-query attention)")
    head_dim = whole(fp.get("head_dim"), "fingerprint head_dim", 1, MAX_HEAD_DIM)
    specs = []
    for side in ("spec_k", "spec_v"):
        d = st[side]
        if d is not None and not isinstance(d, dict):
            raise ValueError(f"{side} must be a quantization spec (a JSON object) or null, got {type(d).__name__}")
        try:
            spec = None if d is None else QuantSpec.from_dict(d)
            if spec is not None:
                spec.check_head_dim(head_dim)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{side} is not a quantization spec for head_dim {head_dim}: {exc}") from None
        specs.append(spec)
    tiers = AgeTiers.from_record(st.get("tiers"), "tiers")
    chunk_frames = whole(st["chunk_frames"], "chunk_frames", 1, MAX_FRAMES)
    window = whole(st["window_chunks"], "window_chunks", 0, MAX_FRAMES)
    sink = whole(st["sink_chunks"], "sink_chunks", 0, MAX_FRAMES)
    shape = st["latent_shape"]
    if not isinstance(shape, list) or len(shape) != 4:
        raise ValueError(f"latent_shape={_short(shape)} must be [batch, channels, height, width]")
    shape = tuple(
        whole(v, f"latent_shape {what}", 1, hi)
        for v, what, hi in zip(
            shape, ("batch", "channels", "height", "width"), (MAX_BATCH, MAX_CHANNELS, MAX_LATENT_SIDE, MAX_LATENT_SIDE)
        )
    )
    next_chunk = whole(st["next_chunk"], "next_chunk", 1, MAX_FRAMES)
    next_frame = whole(st["next_frame"], "next_frame", 1, MAX_FRAMES)
    branches = st["branches"]
    if (
        not isinstance(branches, list)
        or branches not in ([0], [1], [0, 1])
        or any(isinstance(b, bool) or not isinstance(b, int) for b in branches)
    ):
        raise ValueError(f"branches={_short(branches)} must be [0] (cfg 1) or [0, 1] (cond and uncond)")
    if not isinstance(st["active_prompt"], str):
        raise ValueError(f"active_prompt={_short(st['active_prompt'])} must be text (the prompt's fingerprint)")
    if not isinstance(st["info"], dict):
        raise ValueError(f"info must be a JSON object, got {type(st['info']).__name__}")

    # caches: every layer under every branch, once
    pairs = st["caches"]
    expected_pairs = layers * len(branches)
    if not isinstance(pairs, list) or len(pairs) != expected_pairs:
        got = f"{len(pairs)} entries" if isinstance(pairs, list) else type(pairs).__name__
        raise ValueError(
            f"caches lists {got}; a model of {layers} layers with CFG branches {branches} has "
            f"{expected_pairs} caches, one per (layer, branch)"
        )
    caches: dict[tuple[int, int], dict[str, _Stored]] = {}
    for i, pair in enumerate(pairs):
        if not isinstance(pair, list) or len(pair) != 2:
            raise ValueError(f"caches[{i}]={_short(pair)} must be a [layer, branch] pair")
        layer = whole(pair[0], f"caches[{i}] layer", 0, layers - 1)
        branch = pair[1]
        if isinstance(branch, bool) or branch not in branches or not isinstance(branch, int):
            raise ValueError(f"caches[{i}] branch={_short(branch)} must be one of the branches {branches}")
        if (layer, branch) in caches:
            raise ValueError(f"caches lists (layer, branch) ({layer}, {branch}) twice; each is listed once")
        caches[(layer, branch)] = {}

    # retained chunks: exactly those the window and sink keep, in order, their frames consistent
    records = st["retained"]
    retention = Retention(window, sink)
    count = retention.count(next_chunk)
    if not isinstance(records, list) or len(records) != count:
        got = f"{len(records)} chunks" if isinstance(records, list) else type(records).__name__
        raise ValueError(
            f"retained lists {got}; a state at chunk {next_chunk} with window_chunks={window} and "
            f"sink_chunks={sink} retains {count}"
        )
    indices = retention.indices(next_chunk)
    retained: list[_Retained] = []
    for i, (r, chunk) in enumerate(zip(records, indices)):
        what = f"retained[{i}]"
        if not isinstance(r, dict) or set(r) != {"chunk", "frame_offset", "shape", "dtype"}:
            raise ValueError(f"{what} must be a JSON object of chunk, frame_offset, shape and dtype")
        if whole(r["chunk"], f"{what} chunk", 0, MAX_FRAMES) != chunk:
            raise ValueError(
                f"{what} is chunk {r['chunk']}, but at chunk {next_chunk} with window_chunks={window} "
                f"and sink_chunks={sink} the retained chunks are {_span(indices)}"
            )
        rshape = r["shape"]
        if not isinstance(rshape, list) or len(rshape) != 5:
            raise ValueError(f"{what} shape={_short(rshape)} must be [batch, channels, frames, height, width]")
        rshape = tuple(whole(v, f"{what} shape[{j}]", 0, MAX_FRAMES) for j, v in enumerate(rshape))
        frames = rshape[2]
        if rshape[:2] + rshape[3:] != shape or not 1 <= frames <= chunk_frames:
            raise ValueError(
                f"{what} shape={list(rshape)} is not a latent of 1 to chunk_frames={chunk_frames} "
                f"frames of (batch, channels, height, width) {shape}"
            )
        if r["dtype"] not in _LATENT_DTYPES:
            raise ValueError(f"{what} dtype={_short(r['dtype'])} must be one of {', '.join(_LATENT_DTYPES)}")
        if i and r["dtype"] != records[0]["dtype"]:
            raise ValueError(
                f"{what} dtype={r['dtype']} differs from retained[0]'s {records[0]['dtype']}: a run keeps every "
                "retained latent in one dtype (the file was edited or damaged)"
            )
        offset = whole(r["frame_offset"], f"{what} frame_offset", 0, MAX_FRAMES)
        lo, hi = chunk, chunk * chunk_frames  # every earlier chunk holds 1 to chunk_frames frames
        if retained:
            prev = retained[-1]
            gap = chunk - prev.chunk - 1
            lo, hi = prev.frame_offset + prev.frames + gap, prev.frame_offset + prev.frames + gap * chunk_frames
        if not lo <= offset <= hi:
            raise ValueError(
                f"{what} (chunk {chunk}) frame_offset={offset} must be from {lo} to {hi}: each chunk "
                f"holds 1 to chunk_frames={chunk_frames} frames"
                + (
                    f" and chunk {retained[-1].chunk} ends at frame {retained[-1].frame_offset + retained[-1].frames}"
                    if retained
                    else ""
                )
            )
        retained.append(_Retained(chunk, offset, frames, None))
    last = retained[-1]
    if next_frame != last.frame_offset + last.frames:
        raise ValueError(
            f"next_frame={next_frame} does not follow the retained chunks: the last one (chunk "
            f"{last.chunk}) starts at frame {last.frame_offset} and holds {last.frames}, so next_frame "
            f"is {last.frame_offset + last.frames}"
        )

    # the header's tensors: grouped by cache once, every one described by the record
    latents: dict[int, _Stored] = {}
    wanted = {r.chunk: records[i] for i, r in enumerate(retained)}
    for tname, t in stored.items():
        kind, _, rest = tname.partition(".")
        if kind == _CACHE_PREFIX:
            layer_s, _, rest = rest.partition(".")
            branch_s, _, rest = rest.partition(".")
            key = (_index(layer_s), _index(branch_s))
            if key not in caches or not rest:
                raise ValueError(f"tensor {tname!r} belongs to no (layer, branch) the caches list names")
            caches[key][rest] = t
        elif kind == _LATENT_PREFIX and _index(rest) in wanted:
            latents[_index(rest)] = t
        else:
            raise ValueError(f"tensor {tname!r} is not one the state record describes")
    for r in list(retained):
        t = latents.get(r.chunk)
        rec = wanted[r.chunk]
        if t is None or list(t.shape) != rec["shape"] or str(t.dtype).removeprefix("torch.") != rec["dtype"]:
            raise ValueError(
                f"tensor {_LATENT_PREFIX}.{r.chunk} is missing or does not match its recorded shape "
                f"{rec['shape']} and dtype {rec['dtype']}"
            )
    retained = [_Retained(r.chunk, r.frame_offset, r.frames, latents[r.chunk]) for r in retained]
    for (layer, branch), group in caches.items():
        t = group.get(META_KEY)
        if t is None or t.dtype != torch.uint8 or len(t.shape) != 1 or t.nbytes > MAX_META_BYTES:
            raise ValueError(
                f"the cache of layer {layer}, branch {branch} has no {META_KEY} record (a 1-D uint8 "
                f"tensor of at most {MAX_META_BYTES} bytes)"
            )
    return _Plan(
        fingerprint=fp,
        spec_k=specs[0],
        spec_v=specs[1],
        chunk_frames=chunk_frames,
        window_chunks=window,
        sink_chunks=sink,
        latent_shape=shape,
        next_chunk=next_chunk,
        next_frame=next_frame,
        branches=list(branches),
        active_prompt=st["active_prompt"],
        info=st["info"],
        retained=retained,
        caches=caches,
        tiers=tiers,
    )


def _span(indices: list[int]) -> str:
    return str(indices) if len(indices) <= 8 else f"[{', '.join(map(str, indices[:4]))}, ..., {indices[-1]}]"


def _build(plan: _Plan, f: _CacheFile, tick: Callable[[], None]) -> SavedRun:
    """Read each cache (its record first, checked against the state, then its tensors) and the retained latents."""
    batch, _, _, _ = plan.latent_shape
    want = tuple(None if s is None else s.to_dict() for s in (plan.spec_k, plan.spec_v))
    frames = [r.frames for r in plan.retained]
    dtype = tokens_per_frame = None
    caches: dict[tuple[int, int], ChunkCache] = {}
    for layer, branch in sorted(plan.caches):
        tick()
        where = f"cache of layer {layer}, branch {branch}"
        group = plan.caches[(layer, branch)]
        try:
            meta = read_meta(f.read(group[META_KEY]))
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
        saved = tuple(None if s is None else s.to_dict() for s in (meta.spec_k, meta.spec_v))
        if saved != want:
            raise ValueError(f"{where} was saved with specs (keys, values) {saved}, but the state says {want}")
        if meta.tiers != plan.tiers:
            raise ValueError(
                f"{where} was saved with age tiers {str(meta.tiers) if meta.tiers else 'off'}, but the state says "
                f"{str(plan.tiers) if plan.tiers else 'off'}"
            )
        if (meta.window_chunks or 0, meta.sink_chunks) != (plan.window_chunks, plan.sink_chunks):
            raise ValueError(
                f"{where} keeps window_chunks={meta.window_chunks or 0}, sink_chunks={meta.sink_chunks}, "
                f"but the state says {plan.window_chunks}, {plan.sink_chunks}"
            )
        if len(meta.chunks) != len(frames):
            raise ValueError(f"{where} holds {len(meta.chunks)} chunks, but the state retains {len(frames)}")
        lay = meta.layout
        kv_heads = with_kv_heads(plan.fingerprint)["kv_heads"]  # a cache holds the K/V heads
        if lay[:3] != (batch, kv_heads, plan.fingerprint["head_dim"]):
            raise ValueError(
                f"{where} holds (batch, heads, head_dim) = ({lay[0]}, {lay[1]}, {lay[2]}), not "
                f"({batch}, {kv_heads}, {plan.fingerprint['head_dim']}) as the metadata says"
            )
        if dtype is not None and lay[3] != dtype:
            raise ValueError(f"{where} holds {lay[3]} chunks, the other caches {dtype}")
        dtype = lay[3]
        for i, (tokens, n) in enumerate(zip(meta.chunk_tokens, frames)):
            per = tokens // n if tokens_per_frame is None else tokens_per_frame
            if per < 1 or tokens != n * per:
                raise ValueError(
                    f"{where} holds {tokens} tokens in chunk {plan.retained[i].chunk}, whose latent has "
                    f"{n} frames; expected {n * per} ({per} tokens per frame, as in the first chunk)"
                    if per
                    else f"{where} holds {tokens} tokens for {n} frames"
                )
            tokens_per_frame = per
        extra = sorted(set(group) - meta.tensor_names() - {META_KEY})
        if extra:
            raise ValueError(
                f"{where} holds tensors its record does not describe ({extra[:3]}{' ...' if len(extra) > 3 else ''})"
            )
        sd = {}
        for name, t in group.items():
            tick()
            sd[name] = f.read(t)
        cache = ChunkCache.with_precision(
            CachePrecision(plan.spec_k, plan.spec_v, plan.tiers), plan.window_chunks or None, plan.sink_chunks
        )
        try:
            cache.load_state_dict(sd)
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
        caches[(layer, branch)] = cache
    retained = []
    for r in plan.retained:
        tick()
        retained.append(RetainedChunk(r.chunk, r.frame_offset, f.read(r.tensor)))
    return SavedRun(
        fingerprint=plan.fingerprint,
        spec_k=plan.spec_k,
        spec_v=plan.spec_v,
        chunk_frames=plan.chunk_frames,
        window_chunks=plan.window_chunks,
        sink_chunks=plan.sink_chunks,
        latent_shape=plan.latent_shape,
        next_chunk=plan.next_chunk,
        next_frame=plan.next_frame,
        branches=plan.branches,
        active_prompt=plan.active_prompt,
        caches=caches,
        retained=retained,
        info=plan.info,
        tiers=plan.tiers,
    )
