"""Tiny random HY-WorldPlay checkpoints in the official key names, for tests (and the reference run that made
``tests/data/worldplay/``).

:func:`tiny_state_dict` draws every tensor from its own generator, seeded by the key's name and ``seed``, so the
same shape gives the same weights in any process and in any module layout (the reference's model and the
pack's, which name and fuse them differently). Linear and convolution weights are normal with std
``1 / sqrt(fan_in)``, norm scales ``1 + 0.1 N(0, 1)``, biases and embeddings ``0.1 N(0, 1)``: every path,
the gates and the PRoPE projection included, changes the output. Pure torch (``worldplay.keys`` only).
"""

from __future__ import annotations

import math
import zlib

import torch

from worldplay.keys import RELEASED, WorldPlayShape, official_shapes

#: 2 double blocks, width 64, 2 heads of 32 (RoPE 4 / 14 / 14), 32 latent channels, tiny text and SigLIP widths
TINY = WorldPlayShape(
    hidden_size=64,
    heads=2,
    depth=2,
    latent_channels=32,
    patch_size=(1, 1, 1),
    mlp_ratio=4.0,
    text_dim=32,
    vision_dim=16,
    byt5=True,
    cond_type_embedding=True,
)
#: the released key list (54 blocks, byt5, SigLIP) at a tiny width: the real names, small tensors
REAL_KEYS_SMALL = WorldPlayShape(
    hidden_size=32,
    heads=1,
    depth=RELEASED.depth,
    latent_channels=4,
    patch_size=(1, 1, 1),
    mlp_ratio=2.0,
    text_dim=8,
    vision_dim=8,
    byt5=True,
    cond_type_embedding=True,
)


def _tensor(name: str, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(zlib.crc32(name.encode()) ^ (seed * 0x9E3779B1 & 0xFFFFFFFF))
    x = torch.randn(shape, generator=g, dtype=torch.float32)
    leaf = name.rsplit(".", 1)[-1]
    if leaf == "bias" or name == "cond_type_embedding.weight":
        return 0.1 * x
    if len(shape) == 1:  # a norm's scale
        return 1 + 0.1 * x
    fan_in = math.prod(shape[1:])
    return x / math.sqrt(fan_in)


def tiny_state_dict(shape: WorldPlayShape = TINY, seed: int = 0, dtype: torch.dtype = torch.float32) -> dict:
    """Every tensor of a WorldPlay checkpoint of ``shape``, official names, deterministic in ``seed``."""
    return {name: _tensor(name, s, seed).to(dtype) for name, s in official_shapes(shape).items()}


__all__ = ["REAL_KEYS_SMALL", "TINY", "tiny_state_dict"]
