"""Tiny MAGI-1 models for tests, with weights rebuilt from a seed and the tensor names alone.

:func:`seeded_weights` gives every tensor a value that depends only on its name, its shape and the seed, so
the reference (run outside the repo, ``tests/data/magi1/README.md``) and :mod:`magi1` get the same weights without
storing them: the same draws, equal bit for bit on x86 CPUs with AVX2 (ATen's float32 normal sampler takes a
vectorised Box-Muller transform there and libm's elsewhere, which round differently: a few float32 steps of the
largest value), and ``rope.bands``' exponential taken in float64 and rounded once, because MKL's float32 ``exp``
rounds differently per instruction set. Scales keep a 2-layer model's activations of order 1: linear weights are
normal / sqrt(fan_in); the zero-centred norms' weights (gamma = 1 + w) are 0.1 normal; plain LayerNorm
gammas 1 + 0.1 normal; biases 0.1 normal; ``rope.bands`` the reference's default frequencies times
exp(0.1 normal); the null caption unit normal.
"""

from __future__ import annotations

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
    if name == "rope.bands":  # float64, rounded once: MKL's float32 exp and pow round per instruction set
        n = shape[0]
        default = 1.0 / (10000.0 ** (torch.arange(n, dtype=torch.float64) / n))
        return (default * torch.exp(0.1 * r.double())).float()
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


#: how many values of each tensor :func:`samples` keeps
SAMPLES = 16


def samples(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Per tensor, :data:`SAMPLES` values spread over it (every ``n // SAMPLES``-th), to store beside a reference's
    outputs and compare a rebuild with (``tests/data/magi1/weights.safetensors``)."""
    out = {}
    for k, t in sd.items():
        flat = t.detach().float().reshape(-1)
        out[k] = flat[:: max(1, flat.numel() // SAMPLES)][:SAMPLES].clone()
    return out


#: the longest reduction of the tiny DiT (its FFN, 512 wide; attention reads at most 96 keys)
DIT_REDUCTION = 512


def dit_bound(distill: bool):
    """The float32 rounding bound (:func:`jensen_testing.numerics.rounding_bound`) between two runs of the tiny DiT
    on two machines: its 2 blocks, and its timestep sinusoid, whose frequencies come from float32 ``exp`` (MKL
    rounds it per instruction set) and whose argument is up to 1000 t (t <= 1), and 1000 times the distilled
    models' step constant (8 at 16 steps)."""
    from runtime.families.magi1.model.config import FREQ_DIM
    from runtime.families.magi1.model.pipeline import distill_dt

    from .numerics import rounding_bound

    return rounding_bound(2, DIT_REDUCTION, sinusoid=(1000.0 * (distill_dt(16, 1) if distill else 1.0), FREQ_DIM))


def build(config=None, seed: int = 0, dtype: torch.dtype = torch.float32):
    """A :class:`runtime.families.magi1.model.dit.MagiDiT` of ``config`` (default :data:`runtime.families.magi1.model.config.TINY`) with seeded weights."""
    from runtime.families.magi1.model.config import TINY
    from runtime.families.magi1.model.dit import MagiDiT

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
    from runtime.families.magi1.model.config import TINY, expected_shapes

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

    from runtime.families.magi1.model.config import TINY

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
    """A ModelPatcher of a tiny MAGI-1 loaded by the pack's own loader (``comfy_model.load_magi1``), from a file written to a
    temporary folder. Needs ComfyUI in-process and the pack imported (``jensen_testing.comfyui``)."""
    import importlib
    import tempfile
    from pathlib import Path

    from .comfyui import PACK_MODULE

    comfy_model = importlib.import_module(f"{PACK_MODULE}.runtime.families.magi1.comfy_model")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "tiny-magi1.safetensors"
        write_file(path, config, seed, special, qk_gain)
        return comfy_model.load_magi1(str(path), weight_dtype, "auto")


def conditioning(seed: int = 0, tokens: int = 7, width: int = 32) -> list:
    """A CONDITIONING as MAGI-1 Text Encode gives it: (1, tokens, width) T5 embeddings of the valid tokens."""
    g = torch.Generator().manual_seed(1000 + seed)
    return [[torch.randn(1, tokens, width, generator=g), {"magi1_caption": True}]]


# ---------------------------------------------------------------------------------------------- stored samples
#: the weights tests/test_magi1_model.py compares with the stored samples: the four forwards' DiTs and the VAE decoder
def sampled_weights() -> dict[str, dict[str, torch.Tensor]]:
    from dataclasses import replace

    from runtime.families.magi1.model.config import TINY, TINY_24B_STYLE, expected_shapes
    from runtime.families.magi1.model.vae import VAEConfig, decoder_shapes

    vae = VAEConfig(video_size=32, video_length=8, embed_dim=256, depth=2, num_heads=4)
    return {
        "base": samples(seeded_weights(expected_shapes(TINY))),
        "distill": samples(seeded_weights(expected_shapes(replace(TINY, distill=True)))),
        "24b_style": samples(seeded_weights(expected_shapes(TINY_24B_STYLE))),
        "vae": samples(seeded_weights({"decoder." + k: v for k, v in decoder_shapes(vae).items()})),
    }


if __name__ == "__main__":  # python -m jensen_testing.magi1_tiny OUT: write the stored samples
    import sys

    from safetensors.torch import save_file

    flat = {f"{model}/{k}": v for model, sd in sampled_weights().items() for k, v in sd.items()}
    save_file(flat, sys.argv[1])
    print(f"wrote {len(flat)} tensors' samples to {sys.argv[1]}")
