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


# ---------------------------------------------------------------------------------------------- in ComfyUI
#: the special tokens a tiny file carries (seeded, float16 as Sand AI ships them): HQ and DURATION_1..8
SPECIAL_NAMES = ("HQ_TOKEN", *(f"DURATION_TOKEN_{i + 1}" for i in range(8)))


def tiny_file_weights(config=None, seed: int = 0, special: bool = True) -> dict[str, torch.Tensor]:
    """Every tensor of a tiny MAGI-1 file (the reference's names), with seeded special tokens when ``special``."""
    from magi1.config import TINY, expected_shapes

    cfg = config or TINY
    sd = seeded_weights(expected_shapes(cfg), seed)
    if special:
        g = torch.Generator().manual_seed(5 + seed)
        for name in SPECIAL_NAMES:
            sd[f"special_tokens.{name}"] = torch.randn(cfg.caption_channels, generator=g).half()
    return sd


def write_file(path, config=None, seed: int = 0, special: bool | dict = True, qk_gain: float = 1.0) -> None:
    """A tiny MAGI-1 safetensors file at ``path`` (its config in the metadata, as the converter writes it).
    ``special``: seeded special tokens (True), none (False), or these ``{name: tensor}``. ``qk_gain`` scales the
    self-attention's q and k norms' gammas (1 + w: w becomes ``qk_gain (1 + w) - 1``), so the scores scale by
    ``qk_gain**2``: at 1 the tiny model's scores spread with a standard deviation of ~4 (attention as peaked as a
    few keys), at 0.5 of ~1."""
    from safetensors.torch import save_file

    from magi1.config import TINY

    cfg = config or TINY
    sd = tiny_file_weights(cfg, seed, special is True)
    if qk_gain != 1.0:
        for name in [
            n for n in sd if n.endswith(("self_attention.q_layernorm.weight", "self_attention.k_layernorm.weight"))
        ]:
            sd[name] = qk_gain * (1 + sd[name]) - 1
    if isinstance(special, dict):
        sd.update({f"special_tokens.{k}": v.half() for k, v in special.items()})
    save_file({k: v.contiguous() for k, v in sd.items()}, str(path), metadata={"magi1_config": cfg.to_json()})


def build_patcher(
    config=None, seed: int = 0, special: bool | dict = True, weight_dtype: str = "default", qk_gain: float = 1.0
):
    """A ModelPatcher of a tiny MAGI-1 loaded by the pack's own loader (``MAGI1.load``), from a file written to a
    temporary folder. Needs ComfyUI in-process and the pack imported (``jensen_testing.comfyui``)."""
    import importlib
    import tempfile
    from pathlib import Path

    from .comfyui import PACK_MODULE

    families = importlib.import_module(f"{PACK_MODULE}.runtime.families")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "tiny-magi1.safetensors"
        write_file(path, config, seed, special, qk_gain)
        return families.MAGI1.load(str(path), weight_dtype, "auto")


def conditioning(seed: int = 0, tokens: int = 7, width: int = 32) -> list:
    """A CONDITIONING as MAGI-1 Text Encode gives it: (1, tokens, width) T5 embeddings of the valid tokens."""
    g = torch.Generator().manual_seed(1000 + seed)
    return [[torch.randn(1, tokens, width, generator=g), {"magi1_caption": True}]]
