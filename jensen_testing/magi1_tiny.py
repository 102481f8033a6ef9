"""Tiny MAGI-1 models for tests, with weights rebuilt from a seed and the tensor names alone.

:func:`seeded_weights` gives every tensor a value that depends only on its name, its shape and the seed, so
the reference (run outside the repo, ``tests/data/magi1/README.md``) and :mod:`magi1` get bit-identical
weights without storing them. Scales keep a 2-layer model's activations of order 1: linear weights are
normal / sqrt(fan_in); the zero-centred norms' weights (gamma = 1 + w) are 0.1 normal; plain LayerNorm
gammas 1 + 0.1 normal; biases 0.1 normal; ``rope.bands`` the reference's default frequencies times
exp(0.1 normal); the null caption unit normal.
"""

from __future__ import annotations

import hashlib
import math
import zlib

import torch

#: plain ``torch.nn.LayerNorm`` gammas (not zero-centred): ``linear_qkv.layer_norm``, ``mlp.layer_norm``, the VAE's
PLAIN_NORMS = (".layer_norm.weight", ".norm1.weight", ".norm2.weight", "norm.weight")


def _gen(name: str, seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))


def seeded_tensor(name: str, shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    """The value of tensor ``name`` of ``shape`` under ``seed`` (float32)."""
    g = _gen(name, seed)
    r = torch.randn(tuple(shape), generator=g, dtype=torch.float32)
    if name == "rope.bands":
        n = shape[0]
        default = 1.0 / (10000.0 ** (torch.arange(n, dtype=torch.float32) / n))
        return default * torch.exp(0.1 * r)
    if name.endswith("null_caption_embedding") or name.endswith(("pos_embed", "cls_token")):
        return r
    if name.endswith(".bias"):
        return 0.1 * r
    if len(shape) >= 2:
        fan_in = math.prod(shape[1:])
        return r / math.sqrt(fan_in)
    if name.endswith(PLAIN_NORMS):
        return 1.0 + 0.1 * r
    return 0.1 * r  # zero-centred norm weights (gamma = 1 + w)


def seeded_weights(shapes: dict[str, tuple[int, ...]], seed: int = 0) -> dict[str, torch.Tensor]:
    """A state dict for ``shapes`` (name -> shape): every tensor from :func:`seeded_tensor`."""
    return {name: seeded_tensor(name, tuple(shape), seed) for name, shape in sorted(shapes.items())}


def fingerprint(sd: dict[str, torch.Tensor]) -> torch.Tensor:
    """SHA-256 (32 uint8) of every tensor's name, shape and float32 bytes in name order (to check a rebuild)."""
    h = hashlib.sha256()
    for k in sorted(sd):
        t = sd[k].detach().float().contiguous().cpu()
        h.update(f"{k}{tuple(t.shape)}".encode())
        h.update(t.numpy().tobytes())
    return torch.frombuffer(bytearray(h.digest()), dtype=torch.uint8)


def build(config=None, seed: int = 0, dtype: torch.dtype = torch.float32):
    """A :class:`magi1.dit.MagiDiT` of ``config`` (default :data:`magi1.config.TINY`) with seeded weights."""
    from magi1.config import TINY
    from magi1.dit import MagiDiT

    model = MagiDiT(config or TINY, dtype=dtype)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    missing, unexpected = model.load_state_dict(seeded_weights(shapes, seed), strict=True)
    assert not missing and not unexpected
    return model.eval()
