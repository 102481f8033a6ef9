"""LingBot-World 2.0's checkpoint: its key names and the architecture read from their shapes (pure torch).

The DiT's keys are Wan 2.1's with no prefix (``patch_embedding``, ``text_embedding.{0,2}``, ``time_embedding.{0,2}``,
``time_projection.1``, ``blocks.N.{modulation, self_attn.*, norm3, cross_attn.*, ffn.{0,2}}``, ``head.*``; no
``img_emb``: no CLIP image input), 36 input channels (16 noise + 4 mask + 16 image latent), plus the camera layers
(:data:`CAMERA_GLOBAL`, :data:`CAMERA_BLOCK`): 6 + 8 L tensors, 326 for the 14B (4.26 B parameters), 246 for the
1.3B (0.29 B). ComfyUI's own loader (``UNETLoader``) detects the file as a plain ``wan2.1`` text-to-video model with
36 input channels and loads it with ``strict=False``, dropping every one of those camera tensors with a "unet
unexpected" warning (:func:`dropped_by_comfyui` lists them); ``Load LingBot-World`` keeps them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

#: model-level camera layers: the camera features' embedding and its 2-layer residual MLP
CAMERA_GLOBAL = ("patch_embedding_wancamctrl", "c2ws_hidden_states_layer1", "c2ws_hidden_states_layer2")
#: per-block camera layers: ``h = layer2(silu(layer1(c))) + c``; ``x = (1 + scale(h)) x + shift(h)``
CAMERA_BLOCK = ("cam_injector_layer1", "cam_injector_layer2", "cam_scale_layer", "cam_shift_layer")
#: the width of a camera-only 2.0 model's camera input (6 channels x 64 pixels x 4 latent pixels); 1.0 Fast's
#: action variant takes 7 channels (1792)
CAMERA_IN = 1536
HEAD_DIM = 128


class CheckpointError(ValueError):
    """A state dict that is not a LingBot-World checkpoint the pack can load (the message names the key)."""


@dataclass(frozen=True)
class LingBotShape:
    dim: int
    ffn_dim: int
    num_heads: int
    num_layers: int
    in_dim: int = 36
    out_dim: int = 16
    text_dim: int = 4096
    text_len: int = 512
    freq_dim: int = 256
    camera_in: int = CAMERA_IN
    patch_size: tuple[int, int, int] = (1, 2, 2)

    def unet_config(self) -> dict:
        """The model's constructor arguments (ComfyUI's ``unet_config`` of Wan 2.1, plus the camera input)."""
        return {
            "image_model": "wan2.1",
            "model_type": "t2v",
            "patch_size": self.patch_size,
            "text_len": self.text_len,
            "in_dim": self.in_dim,
            "dim": self.dim,
            "ffn_dim": self.ffn_dim,
            "freq_dim": self.freq_dim,
            "text_dim": self.text_dim,
            "out_dim": self.out_dim,
            "num_heads": self.num_heads,
            "num_layers": self.num_layers,
            "window_size": (-1, -1),
            "qk_norm": True,
            "cross_attn_norm": True,
            "eps": 1e-6,
            "camera_in": self.camera_in,
        }


#: the released models (robbyant/lingbot-world-v2 ``wan/configs/wan_i2v_A14B.py``; the 1.3B has Wan 2.1 1.3B's shapes)
RELEASED = {
    "lingbot-world-14b": LingBotShape(dim=5120, ffn_dim=13824, num_heads=40, num_layers=40),
    "lingbot-world-1.3b": LingBotShape(dim=1536, ffn_dim=8960, num_heads=12, num_layers=30),
}


def is_lingbot(sd: Mapping[str, object]) -> bool:
    """The state dict has Wan's head and LingBot's camera layers."""
    return "head.modulation" in sd and "patch_embedding_wancamctrl.weight" in sd


def official_shapes(shape: LingBotShape) -> dict[str, tuple[int, ...]]:
    """Every tensor of a checkpoint of ``shape``: name -> shape (the reference's names)."""
    d, f = shape.dim, shape.ffn_dim
    out: dict[str, tuple[int, ...]] = {
        "patch_embedding.weight": (d, shape.in_dim, *shape.patch_size),
        "patch_embedding.bias": (d,),
        "text_embedding.0.weight": (d, shape.text_dim),
        "text_embedding.0.bias": (d,),
        "text_embedding.2.weight": (d, d),
        "text_embedding.2.bias": (d,),
        "time_embedding.0.weight": (d, shape.freq_dim),
        "time_embedding.0.bias": (d,),
        "time_embedding.2.weight": (d, d),
        "time_embedding.2.bias": (d,),
        "time_projection.1.weight": (6 * d, d),
        "time_projection.1.bias": (6 * d,),
        "patch_embedding_wancamctrl.weight": (d, shape.camera_in),
        "patch_embedding_wancamctrl.bias": (d,),
    }
    for name in CAMERA_GLOBAL[1:]:
        out[f"{name}.weight"], out[f"{name}.bias"] = (d, d), (d,)
    for i in range(shape.num_layers):
        p = f"blocks.{i}."
        out[p + "modulation"] = (1, 6, d)
        for attn in ("self_attn", "cross_attn"):
            for lin in "qkvo":
                out[f"{p}{attn}.{lin}.weight"], out[f"{p}{attn}.{lin}.bias"] = (d, d), (d,)
            out[f"{p}{attn}.norm_q.weight"] = out[f"{p}{attn}.norm_k.weight"] = (d,)
        out[p + "norm3.weight"] = out[p + "norm3.bias"] = (d,)
        out[p + "ffn.0.weight"], out[p + "ffn.0.bias"] = (f, d), (f,)
        out[p + "ffn.2.weight"], out[p + "ffn.2.bias"] = (d, f), (d,)
        for name in CAMERA_BLOCK:
            out[f"{p}{name}.weight"], out[f"{p}{name}.bias"] = (d, d), (d,)
    out["head.head.weight"] = (shape.out_dim * shape.patch_size[0] * shape.patch_size[1] * shape.patch_size[2], d)
    out["head.head.bias"] = (out["head.head.weight"][0],)
    out["head.modulation"] = (1, 2, d)
    return out


def camera_key_names(num_layers: int) -> list[str]:
    """The camera tensors of a checkpoint of ``num_layers`` blocks (what ComfyUI's Wan loader drops)."""
    names = [f"{n}.{p}" for n in CAMERA_GLOBAL for p in ("weight", "bias")]
    names += [f"blocks.{i}.{n}.{p}" for i in range(num_layers) for n in CAMERA_BLOCK for p in ("weight", "bias")]
    return names


def dropped_by_comfyui(sd: Mapping[str, object]) -> list[str]:
    """The keys of ``sd`` that ComfyUI's plain Wan 2.1 model has no place for (loaded ``strict=False``, dropped)."""
    return [k for k in sd if k.startswith(CAMERA_GLOBAL) or any(f".{n}." in k for n in CAMERA_BLOCK)]


def read_shape(sd: Mapping[str, object], num_heads: int | None = None, text_len: int = 512) -> LingBotShape:
    """The architecture of a LingBot-World state dict from its shapes; ``num_heads`` default ``dim // 128`` (the
    released models' head_dim). CheckpointError naming what is missing or odd."""
    if not is_lingbot(sd):
        missing = [k for k in ("head.modulation", "patch_embedding_wancamctrl.weight") if k not in sd]
        raise CheckpointError(
            f"not a LingBot-World checkpoint: no {missing} (a Wan 2.1 file without LingBot's camera layers?)"
        )

    def shp(name: str) -> tuple[int, ...]:
        if name not in sd:
            raise CheckpointError(f"the checkpoint has no {name}")
        return tuple(sd[name].shape)

    dim = shp("head.modulation")[-1]
    layers = 0
    while f"blocks.{layers}.modulation" in sd:
        layers += 1
    heads = int(num_heads) if num_heads else dim // HEAD_DIM
    if heads < 1 or dim % heads:
        raise CheckpointError(f"width {dim} does not split into {heads} heads: give the number of heads")
    pe = shp("patch_embedding.weight")
    head = shp("head.head.weight")
    return LingBotShape(
        dim=dim,
        ffn_dim=shp("blocks.0.ffn.0.weight")[0],
        num_heads=heads,
        num_layers=layers,
        in_dim=pe[1],
        out_dim=head[0] // (pe[2] * pe[3] * pe[4]),
        text_dim=shp("text_embedding.0.weight")[1],
        text_len=int(text_len),
        freq_dim=shp("time_embedding.0.weight")[1],
        camera_in=shp("patch_embedding_wancamctrl.weight")[1],
        patch_size=tuple(pe[2:]),
    )


def check_keys(sd: Mapping[str, object], shape: LingBotShape) -> None:
    """Every key the architecture has, of the right shape, and nothing else: CheckpointError naming the first few."""
    want = official_shapes(shape)
    missing = [k for k in want if k not in sd]
    unexpected = [k for k in sd if k not in want]
    wrong = [f"{k} {tuple(sd[k].shape)} (want {want[k]})" for k in want if k in sd and tuple(sd[k].shape) != want[k]]
    if missing or unexpected or wrong:
        raise CheckpointError(
            f"the checkpoint does not match LingBot-World's layout: missing {missing[:4]}, unexpected {unexpected[:4]}, "
            f"wrong shapes {wrong[:4]}"
        )


__all__ = [
    "CAMERA_BLOCK",
    "CAMERA_GLOBAL",
    "CAMERA_IN",
    "RELEASED",
    "CheckpointError",
    "LingBotShape",
    "camera_key_names",
    "check_keys",
    "dropped_by_comfyui",
    "is_lingbot",
    "official_shapes",
    "read_shape",
]
