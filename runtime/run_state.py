"""The state of a Chunked AR run, to continue it later (the ``JENSEN_KV_CACHE`` link type).

Everything the next chunk needs: every layer's and CFG branch's quantized cache (sink included),
the next chunk index and RoPE frame, the specs, window and sink, the prompt the retained chunks were
written with, the clean latents of the retained chunks (so a prompt switch after loading can
re-cache them), and a fingerprint of the model (architecture and a hash of a few weights).

On disk it is one safetensors file (data, never code): tensors plus JSON in the header metadata,
with a SHA-256 over every tensor's bytes. :func:`load_run_state` checks the format, the digest and
every shape and dtype against the metadata, builds everything in new objects and returns only when
all of it checked out, so a truncated or edited file is refused and nothing is half-loaded.
:meth:`RunState.check_compatible` refuses a state made with another model, spec, head count, chunk
length or latent size, naming which. No ComfyUI import here.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor

from ..jensen_core import ChunkCache, QuantSpec

FORMAT = "jensen_kv_run_state"
VERSION = 1
_CACHE_PREFIX = "cache"
_LATENT_PREFIX = "latent"


def weights_digest(module: torch.nn.Module, names_hint: int = 4, elements: int = 4096) -> str:
    """SHA-256 over the first ``elements`` values of a few weights (first and last blocks, the head)."""
    params = [(n, p) for n, p in module.named_parameters() if p.dim() >= 2]
    if not params:
        params = list(module.named_parameters())
    pick = params[:names_hint // 2] + params[-(names_hint - names_hint // 2):] if len(params) > names_hint else params
    h = hashlib.sha256()
    for name, p in pick:
        h.update(name.encode())
        h.update(str((tuple(p.shape), str(p.dtype))).encode())
        h.update(_leading_bytes(p, elements))
    return h.hexdigest()[:32]


def _leading_bytes(p: Tensor, elements: int) -> bytes:
    """The bytes of the first ``elements`` values of a weight, whatever tensor type holds it."""
    try:
        flat = torch.Tensor(p.detach()).reshape(-1)[:elements] if type(p) is not torch.Tensor else p.detach().reshape(-1)[:elements]
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
class RunState:
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

    # ------------------------------------------------------------------ facts
    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.caches.values())

    def describe(self) -> str:
        spec = self.spec_k or self.spec_v
        kind = "full precision" if spec is None else f"K {self._bits(self.spec_k)}/V {self._bits(self.spec_v)}"
        return (f"{self.next_chunk} chunks ({self.next_frame} latent frames) of {self.fingerprint.get('family')} "
                f"{self.fingerprint.get('layers')}x{self.fingerprint.get('heads')}x{self.fingerprint.get('head_dim')}, "
                f"{kind}, {len(self.retained)} chunks retained (window {self.window_chunks or 'all'}, sink "
                f"{self.sink_chunks}), {self.nbytes / 2**20:.2f} MiB")

    @staticmethod
    def _bits(spec):
        return "full" if spec is None else f"INT{spec.bits}"

    def _meta(self) -> dict:
        return {
            "fingerprint": self.fingerprint,
            "spec_k": self.spec_k.to_dict() if self.spec_k else None,
            "spec_v": self.spec_v.to_dict() if self.spec_v else None,
            "chunk_frames": self.chunk_frames, "window_chunks": self.window_chunks, "sink_chunks": self.sink_chunks,
            "latent_shape": list(self.latent_shape), "next_chunk": self.next_chunk, "next_frame": self.next_frame,
            "branches": list(self.branches), "active_prompt": self.active_prompt,
            "caches": [[layer, branch] for layer, branch in sorted(self.caches)],
            "retained": [{"chunk": r.chunk, "frame_offset": r.frame_offset, "shape": list(r.latent.shape),
                          "dtype": str(r.latent.dtype).removeprefix("torch.")} for r in self.retained],
            "info": self.info,
        }

    def to(self, device) -> RunState:
        """Move the caches to ``device`` (where the model attends); returns self."""
        for cache in self.caches.values():
            cache.to(device)
        return self

    # ------------------------------------------------------------------ compatibility
    def check_compatible(self, *, fingerprint: dict, spec_k, spec_v, chunk_frames: int, window_chunks: int,
                         sink_chunks: int, latent_shape: tuple[int, ...], branches: list[int]) -> None:
        """ValueError naming the first thing that differs between this state and the run that wants it."""
        def differ(what, saved, now, fix):
            raise ValueError(f"this KV cache was made with {what} {saved}, but this run has {now}; {fix}")

        mine = {k: v for k, v in self.fingerprint.items() if k != "weights"}
        theirs = {k: v for k, v in fingerprint.items() if k != "weights"}
        order = ["family", "layers", "heads", "head_dim", "dim", "ffn_dim", "text_dim"]
        for k in sorted(set(mine) | set(theirs), key=lambda k: (order.index(k) if k in order else len(order), k)):
            if mine.get(k) != theirs.get(k):
                differ(f"a model whose {k} is", mine.get(k), theirs.get(k),
                       "load the model the cache was made with (another model's keys mean nothing here)")
        if self.fingerprint.get("weights") != fingerprint.get("weights"):
            differ("model weights with digest", self.fingerprint.get("weights"), fingerprint.get("weights"),
                   "load the same checkpoint, weight dtype and LoRAs the cache was made with")
        for side, saved, now in (("key", self.spec_k, spec_k), ("value", self.spec_v, spec_v)):
            if (saved.to_dict() if saved else None) != (now.to_dict() if now else None):
                differ(f"the {side} spec", saved.to_dict() if saved else "full precision",
                       now.to_dict() if now else "full precision",
                       "set Quantize KV Cache as it was when the cache was saved")
        if self.chunk_frames != chunk_frames:
            differ("chunk_frames", self.chunk_frames, chunk_frames, "use the same chunk length")
        if (self.window_chunks, self.sink_chunks) != (window_chunks, sink_chunks):
            differ("(window_chunks, sink_chunks)", (self.window_chunks, self.sink_chunks), (window_chunks, sink_chunks),
                   "use the same window and sink")
        if tuple(self.latent_shape) != tuple(latent_shape):
            differ("latents of (batch, channels, height, width)", tuple(self.latent_shape), tuple(latent_shape),
                   "use the same video size and batch")
        if sorted(self.branches) != sorted(branches):
            differ("CFG branches", self.branches, branches,
                   "use cfg 1 on both runs, or cfg > 1 on both (cond and uncond are cached separately)")

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
        tmp = f"{path}.tmp-{os.getpid()}"
        try:
            save_file(tensors, tmp, metadata=meta)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
        return os.path.getsize(path)


def _digest(tensors: dict[str, Tensor], state: str) -> str:
    """SHA-256 over the state JSON and every tensor (name, shape, dtype, bytes)."""
    h = hashlib.sha256()
    h.update(state.encode())
    for name in sorted(tensors):
        t = tensors[name]
        h.update(name.encode())
        h.update(str((tuple(t.shape), str(t.dtype))).encode())
        h.update(t.contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def _read_header(path: str) -> dict:
    from safetensors import safe_open

    with safe_open(path, framework="pt") as f:
        return f.metadata() or {}


def load_run_state(path: str) -> RunState:
    """Read a state written by :meth:`RunState.save` (on the CPU; :meth:`RunState.to` moves it).

    Every check passes before anything is returned."""
    try:
        header = _read_header(path)
        tensors = load_file(path, device="cpu")
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise ValueError(f"{os.path.basename(path)} is not a readable safetensors file ({exc}); it may be truncated "
                         "or not a Jensen KV cache file") from None
    if header.get("format") != FORMAT:
        raise ValueError(f"{os.path.basename(path)} is not a Jensen KV cache file (format {header.get('format')!r})")
    if header.get("version") != str(VERSION):
        raise ValueError(f"{os.path.basename(path)} has format version {header.get('version')}; this pack reads {VERSION}")
    if header.get("sha256") != _digest(tensors, str(header.get("state", ""))):
        raise ValueError(f"{os.path.basename(path)} does not match its recorded SHA-256: the file was edited or damaged")
    try:
        meta = json.loads(header["state"])
        return _build(meta, tensors)
    except (KeyError, TypeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{os.path.basename(path)} has malformed metadata ({type(exc).__name__}: {exc})") from None


def _int(meta: dict, key: str, lo: int = 0) -> int:
    v = meta[key]
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise ValueError(f"cache file metadata {key}={v!r} is not an integer >= {lo}")
    return v


def _build(meta: dict, tensors: dict[str, Tensor]) -> RunState:
    spec_k = QuantSpec.from_dict(meta["spec_k"]) if meta["spec_k"] else None
    spec_v = QuantSpec.from_dict(meta["spec_v"]) if meta["spec_v"] else None
    chunk_frames, window, sink = _int(meta, "chunk_frames", 1), _int(meta, "window_chunks"), _int(meta, "sink_chunks")
    shape = meta["latent_shape"]
    if not (isinstance(shape, list) and len(shape) == 4 and all(isinstance(s, int) and s > 0 for s in shape)):
        raise ValueError(f"cache file metadata latent_shape={shape!r} is not (batch, channels, height, width)")
    fp = meta["fingerprint"]
    if not isinstance(fp, dict):
        raise ValueError("cache file metadata fingerprint is not a mapping")
    layers, heads, head_dim = (_int(fp, "layers", 1), _int(fp, "heads", 1), _int(fp, "head_dim", 1))
    caches: dict[tuple[int, int], ChunkCache] = {}
    used: set[str] = set()
    for layer, branch in meta["caches"]:
        if not (0 <= layer < layers and branch in (0, 1)):
            raise ValueError(f"cache file lists a cache for layer {layer}, branch {branch}, outside the model's {layers} layers")
        prefix = f"{_CACHE_PREFIX}.{layer}.{branch}."
        sd = {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
        used.update(prefix + k for k in sd)
        cache = ChunkCache(spec_k, spec_v, window or None, sink)
        cache.load_state_dict(sd)
        lay = cache._layout
        if lay is not None and (lay[1], lay[2], lay[0]) != (heads, head_dim, shape[0]):
            raise ValueError(f"cache of layer {layer} holds (batch, heads, head_dim) = ({lay[0]}, {lay[1]}, {lay[2]}), "
                             f"not ({shape[0]}, {heads}, {head_dim}) as the metadata says")
        caches[(int(layer), int(branch))] = cache
    retained = []
    for r in meta["retained"]:
        name = f"{_LATENT_PREFIX}.{_int(r, 'chunk')}"
        t = tensors.get(name)
        if t is None or list(t.shape) != r["shape"] or str(t.dtype).removeprefix("torch.") != r["dtype"]:
            raise ValueError(f"cache file entry {name} is missing or does not match its recorded shape/dtype")
        if list(t.shape[:2]) != shape[:2] or list(t.shape[3:]) != shape[2:]:
            raise ValueError(f"cache file entry {name} has shape {list(t.shape)}, not a latent of {shape}")
        used.add(name)
        retained.append(RetainedChunk(int(r["chunk"]), _int(r, "frame_offset"), t))
    extra = sorted(set(tensors) - used)
    if extra:
        raise ValueError(f"cache file holds tensors its metadata does not describe ({extra[:3]}...)")
    return RunState(
        fingerprint=fp, spec_k=spec_k, spec_v=spec_v, chunk_frames=chunk_frames, window_chunks=window,
        sink_chunks=sink, latent_shape=tuple(shape), next_chunk=_int(meta, "next_chunk"),
        next_frame=_int(meta, "next_frame"), branches=[int(b) for b in meta["branches"]],
        active_prompt=str(meta["active_prompt"]), caches=caches, retained=retained, info=dict(meta.get("info") or {}),
    )
