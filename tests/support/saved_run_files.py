"""Run-state files for tests: a state as a model-free Chunked AR run leaves it, and files crafted from it.

The SHA-256 of a cache file has no key, so a crafted file is *re-signed* (:func:`resign`): its digest
checks out and only the loader's structure checks stand between it and a run. Shapes: 2 layers x 2
heads x 32, latents (1, 16, 4, 4), 4 tokens per latent frame (Wan's 2x2 patches). No ComfyUI.
"""

from __future__ import annotations

import json

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from .pack import load_pack_module

rs = load_pack_module("runtime.saved_run")
jk = load_pack_module("jensen_core")
cache_mod = load_pack_module("jensen_core.cache")
ChunkCache, QuantSpec = jk.ChunkCache, jk.QuantSpec
AgeTiers = load_pack_module("jensen_core.tiers").AgeTiers

LAYERS, HEADS, HEAD_DIM = 2, 2, 32
LATENT = (1, 16, 4, 4)  # batch, channels, height, width
TOKENS_PER_FRAME = 4  # Wan's 2x2 patches of a 4x4 latent
INT2 = QuantSpec(bits=2, group_size=16)
INT4 = QuantSpec(bits=4, group_size=16)
META = "__jensen_kv_meta__"


def make_state(
    *,
    spec_k=INT2,
    spec_v=INT2,
    chunks=4,
    chunk_frames=2,
    window=1,
    sink=1,
    branches=(0, 1),
    frames_of=None,
    heads_of=None,
    seed=0,
    tiers=None,
):
    """A state as a Chunked AR run leaves it: chunks 0..chunks-1 written to every (layer, branch) cache, the
    retained latents kept by the same rule (first ``sink`` for good, last ``window``). ``frames_of(c)`` gives a
    chunk's frames (default ``chunk_frames``); ``heads_of(layer, branch, c)`` the heads of one written chunk."""
    g = torch.Generator().manual_seed(seed)
    caches = {
        (layer, b): ChunkCache(spec_k, spec_v, window or None, sink, tiers) for layer in range(LAYERS) for b in branches
    }
    retained, sink_held, offset = [], 0, 0
    for c in range(chunks):
        frames = frames_of(c) if frames_of else chunk_frames
        for (layer, b), cache in caches.items():
            h = heads_of(layer, b, c) if heads_of else HEADS
            k = torch.randn(LATENT[0], h, frames * TOKENS_PER_FRAME, HEAD_DIM, generator=g)
            cache.append(k, torch.randn(k.shape, generator=g))
        retained.append(rs.RetainedChunk(c, offset, torch.randn(*LATENT[:2], frames, *LATENT[2:], generator=g)))
        if sink_held < sink:
            sink_held += 1
        else:
            while window and len(retained) - sink_held > window:
                del retained[sink_held]
        offset += frames
    return rs.SavedRun(
        fingerprint={"family": "wan", "layers": LAYERS, "heads": HEADS, "head_dim": HEAD_DIM, "weights": "ab" * 16},
        spec_k=spec_k,
        spec_v=spec_v,
        chunk_frames=chunk_frames,
        window_chunks=window,
        sink_chunks=sink,
        latent_shape=LATENT,
        next_chunk=chunks,
        next_frame=offset,
        branches=list(branches),
        active_prompt="p0",
        caches=caches,
        retained=retained,
        info={"seed": 5},
        tiers=tiers,
    )


def read_file(path):
    with safe_open(str(path), framework="pt") as f:
        return dict(f.metadata()), {k: f.get_tensor(k) for k in f.keys()}


def cache_meta(tensors, layer=0, branch=0) -> dict:
    return json.loads(tensors[f"cache.{layer}.{branch}.{META}"].numpy().tobytes())


def set_cache_meta(tensors, meta, layer=0, branch=0, raw: bytes | None = None) -> None:
    data = raw if raw is not None else json.dumps(meta).encode()
    tensors[f"cache.{layer}.{branch}.{META}"] = torch.frombuffer(bytearray(data), dtype=torch.uint8)


def resign(path, meta: dict, tensors: dict, state=None) -> str:
    """Write ``tensors`` with ``meta`` (its state replaced by ``state`` when given) and a recomputed SHA-256."""
    meta = dict(meta)
    if state is not None:
        meta["state"] = state if isinstance(state, str) else json.dumps(state)
    meta["sha256"] = rs._digest(tensors, meta["state"])
    save_file(tensors, str(path), metadata=meta)
    return str(path)


def craft(tmp_path, edit, state=None, name="crafted.safetensors") -> str:
    """Save ``state`` (default :func:`make_state`), let ``edit(st, tensors)`` change its state record and
    tensors in place, and write it re-signed."""
    src = tmp_path / "source.safetensors"
    (state or make_state()).save(str(src))
    meta, tensors = read_file(src)
    st = json.loads(meta["state"])
    edit(st, tensors)
    return resign(tmp_path / name, meta, tensors, st)
