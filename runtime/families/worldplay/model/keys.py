"""HY-WorldPlay's checkpoint: its official key names, its shape read off the tensors, and the names core uses.

The official file (``ar_distilled_action_model/model.safetensors``) is the whole HunyuanVideo 1.5
480p I2V transformer in the reference's names, plus WorldPlay's modules:

- per double block ``i``: ``img_mod.linear``, ``img_attn_q`` / ``_k`` / ``_v`` (separate),
  ``img_attn_q_norm`` / ``img_attn_k_norm``, ``img_attn_proj``, ``img_mlp.fc1`` / ``fc2``, the same
  for ``txt_``, and WorldPlay's ``img_attn_prope_proj``;
- ``img_in.proj``, ``time_in.mlp.0`` / ``.2``, ``txt_in.*`` (the token refiner, 2 blocks),
  ``final_layer.*``, ``vision_in.proj.*`` (SigLIP), ``byt5_in.*``, ``cond_type_embedding``, and
  WorldPlay's ``action_in.mlp.0`` / ``.2``.

:func:`official_keys` lists them for a shape; :func:`read_config` reads the shape off a state dict
(refusing what is not WorldPlay, with the reason); :func:`to_core` renames (and fuses q / k / v into
``qkv``) to the module names of ComfyUI's HunyuanVideo classes, which the pack's WorldPlay model is
built from. Pure Python / torch: no ComfyUI.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

#: refiner blocks of HunyuanVideo's text token refiner (fixed in the architecture)
REFINER_BLOCKS = 2
#: the pieces one double block holds, official suffix -> core suffix (q / k / v are fused separately)
_BLOCK_RENAMES = (
    ("img_mod.linear.", "img_mod.lin."),
    ("txt_mod.linear.", "txt_mod.lin."),
    ("img_attn_q_norm.weight", "img_attn.norm.query_norm.weight"),
    ("img_attn_k_norm.weight", "img_attn.norm.key_norm.weight"),
    ("txt_attn_q_norm.weight", "txt_attn.norm.query_norm.weight"),
    ("txt_attn_k_norm.weight", "txt_attn.norm.key_norm.weight"),
    ("img_attn_proj.", "img_attn.proj."),
    ("txt_attn_proj.", "txt_attn.proj."),
    ("img_mlp.fc1.", "img_mlp.0."),
    ("img_mlp.fc2.", "img_mlp.2."),
    ("txt_mlp.fc1.", "txt_mlp.0."),
    ("txt_mlp.fc2.", "txt_mlp.2."),
    ("img_attn_prope_proj.", "img_attn_prope_proj."),
)
_TOP_RENAMES = (
    ("time_in.mlp.0.", "time_in.in_layer."),
    ("time_in.mlp.2.", "time_in.out_layer."),
    ("action_in.mlp.0.", "action_in.in_layer."),
    ("action_in.mlp.2.", "action_in.out_layer."),
    ("txt_in.t_embedder.mlp.0.", "txt_in.t_embedder.in_layer."),
    ("txt_in.t_embedder.mlp.2.", "txt_in.t_embedder.out_layer."),
    ("txt_in.c_embedder.linear_1.", "txt_in.c_embedder.in_layer."),
    ("txt_in.c_embedder.linear_2.", "txt_in.c_embedder.out_layer."),
)
_REFINER_RENAMES = (
    ("self_attn_qkv.", "self_attn.qkv."),
    ("self_attn_proj.", "self_attn.proj."),
    ("mlp.fc1.", "mlp.0."),
    ("mlp.fc2.", "mlp.2."),
)
_BLOCK = re.compile(r"^double_blocks\.(\d+)\.(.*)$")
_REFINER = re.compile(r"^txt_in\.individual_token_refiner\.blocks\.(\d+)\.(.*)$")


class CheckpointError(ValueError):
    """A file that is not a WorldPlay checkpoint, or one with a wrong or missing key (the message names it)."""


@dataclass(frozen=True)
class WorldPlayShape:
    """The architecture a WorldPlay checkpoint holds (read off its tensors by :func:`read_config`)."""

    hidden_size: int
    heads: int
    depth: int
    latent_channels: int
    patch_size: tuple[int, int, int]
    mlp_ratio: float
    text_dim: int
    vision_dim: int | None
    byt5: bool
    cond_type_embedding: bool
    qkv_bias: bool = True

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.heads

    @property
    def rope_axes(self) -> list[int]:
        """RoPE channels for time, height, width: HunyuanVideo 1.5's [16, 56, 56] at head_dim 128, scaled alike."""
        d = self.head_dim
        return [d // 8, 7 * d // 16, 7 * d // 16]

    def core_config(self) -> dict:
        """The keyword arguments of ComfyUI's ``HunyuanVideoParams`` for this shape (no single-stream blocks)."""
        return {
            "image_model": "hunyuan_video",
            "in_channels": self.latent_channels * 2 + 1,
            "out_channels": self.latent_channels,
            "vec_in_dim": None,
            "context_in_dim": self.text_dim,
            "hidden_size": self.hidden_size,
            "mlp_ratio": self.mlp_ratio,
            "num_heads": self.heads,
            "depth": self.depth,
            "depth_single_blocks": 0,
            "axes_dim": self.rope_axes,
            "theta": 256,
            "patch_size": list(self.patch_size),
            "qkv_bias": self.qkv_bias,
            "guidance_embed": False,
            "byt5": self.byt5,
            "meanflow": False,
            "use_cond_type_embedding": self.cond_type_embedding,
            "vision_in_dim": self.vision_dim,
            "meanflow_sum": True,
        }


#: HY-WorldPlay's released shape: HunyuanVideo 1.5 480p I2V (8.3B) with WorldPlay's modules
RELEASED = WorldPlayShape(
    hidden_size=2048,
    heads=16,
    depth=54,
    latent_channels=32,
    patch_size=(1, 1, 1),
    mlp_ratio=4.0,
    text_dim=3584,
    vision_dim=1152,
    byt5=True,
    cond_type_embedding=True,
)


#: ByT5 glyph mapper widths (fixed in HunyuanVideo 1.5: ByT5-small features in, 2048 wide)
BYT5_IN, BYT5_HIDDEN = 1472, 2048
#: refiner MLP ratio and timestep-embedding width (fixed)
REFINER_MLP_RATIO, FREQ_DIM = 4, 256


def official_shapes(shape: WorldPlayShape) -> dict[str, tuple[int, ...]]:
    """Every tensor of a WorldPlay checkpoint of ``shape``: official name -> shape (sorted by name)."""
    h, c, d = shape.hidden_size, shape.latent_channels, shape.head_dim
    pt, ph, pw = shape.patch_size
    mlp = int(h * shape.mlp_ratio)
    out: dict[str, tuple[int, ...]] = {}

    def lin(name: str, n_out: int, n_in: int, bias: bool = True) -> None:
        out[f"{name}.weight"] = (n_out, n_in)
        if bias:
            out[f"{name}.bias"] = (n_out,)

    def norm(name: str, n: int, bias: bool = True) -> None:
        out[f"{name}.weight"] = (n,)
        if bias:
            out[f"{name}.bias"] = (n,)

    out["img_in.proj.weight"] = (h, 2 * c + 1, pt, ph, pw)
    out["img_in.proj.bias"] = (h,)
    lin("txt_in.input_embedder", h, shape.text_dim)
    lin("txt_in.t_embedder.mlp.0", h, FREQ_DIM)
    lin("txt_in.t_embedder.mlp.2", h, h)
    lin("txt_in.c_embedder.linear_1", h, shape.text_dim)
    lin("txt_in.c_embedder.linear_2", h, h)
    for j in range(REFINER_BLOCKS):
        p = f"txt_in.individual_token_refiner.blocks.{j}"
        norm(f"{p}.norm1", h)
        lin(f"{p}.self_attn_qkv", 3 * h, h)
        lin(f"{p}.self_attn_proj", h, h)
        norm(f"{p}.norm2", h)
        lin(f"{p}.mlp.fc1", REFINER_MLP_RATIO * h, h)
        lin(f"{p}.mlp.fc2", h, REFINER_MLP_RATIO * h)
        lin(f"{p}.adaLN_modulation.1", 2 * h, h)
    for emb in ("time_in", "action_in"):
        lin(f"{emb}.mlp.0", h, FREQ_DIM)
        lin(f"{emb}.mlp.2", h, h)
    b = shape.qkv_bias
    for i in range(shape.depth):
        p = f"double_blocks.{i}"
        for side in ("img", "txt"):
            lin(f"{p}.{side}_mod.linear", 6 * h, h)
            for part in ("q", "k", "v", "proj"):
                lin(f"{p}.{side}_attn_{part}", h, h, b)
            norm(f"{p}.{side}_attn_q_norm", d, bias=False)
            norm(f"{p}.{side}_attn_k_norm", d, bias=False)
            lin(f"{p}.{side}_mlp.fc1", mlp, h)
            lin(f"{p}.{side}_mlp.fc2", h, mlp)
        lin(f"{p}.img_attn_prope_proj", h, h, b)
    lin("final_layer.linear", pt * ph * pw * c, h)
    lin("final_layer.adaLN_modulation.1", 2 * h, h)
    if shape.vision_dim is not None:
        v = shape.vision_dim
        norm("vision_in.proj.0", v)
        lin("vision_in.proj.1", v, v)
        lin("vision_in.proj.3", h, v)
        norm("vision_in.proj.4", h)
    if shape.byt5:
        norm("byt5_in.layernorm", BYT5_IN)
        lin("byt5_in.fc1", BYT5_HIDDEN, BYT5_IN)
        lin("byt5_in.fc2", BYT5_HIDDEN, BYT5_HIDDEN)
        lin("byt5_in.fc3", h, BYT5_HIDDEN)
    if shape.cond_type_embedding:
        out["cond_type_embedding.weight"] = (3, h)
    return dict(sorted(out.items()))


def official_keys(shape: WorldPlayShape) -> list[str]:
    """Every key of a WorldPlay checkpoint of ``shape``, in the reference's names (sorted)."""
    return list(official_shapes(shape))


def _lin(prefix: str) -> list[str]:
    return [f"{prefix}.weight", f"{prefix}.bias"]


def worldplay_only_keys(depth: int) -> list[str]:
    """The keys WorldPlay adds to HunyuanVideo 1.5 (112 at 54 blocks): ``action_in.*`` and the PRoPE projections."""
    keys = _lin("action_in.mlp.0") + _lin("action_in.mlp.2")
    for i in range(depth):
        keys += _lin(f"double_blocks.{i}.img_attn_prope_proj")
    return sorted(keys)


def _count(keys, pattern: re.Pattern) -> int:
    found = {int(m.group(1)) for k in keys if (m := pattern.match(k))}
    return max(found) + 1 if found else 0


def _shape_of(sd: Mapping[str, Tensor], key: str) -> tuple[int, ...]:
    if key not in sd:
        raise CheckpointError(f"the checkpoint has no {key!r}, which a WorldPlay checkpoint holds")
    return tuple(sd[key].shape)


def read_config(sd: Mapping[str, Tensor]) -> WorldPlayShape:
    """The :class:`WorldPlayShape` of an official-format WorldPlay state dict; clear errors for anything else."""
    keys = set(sd)
    some = ", ".join(sorted(keys)[:3])
    if "double_blocks.0.img_attn.qkv.weight" in keys:
        raise CheckpointError(
            "this is a HunyuanVideo checkpoint in ComfyUI's layout (fused double_blocks.N.img_attn.qkv), not the "
            "official HY-WorldPlay file: Load HY-WorldPlay reads ar_distilled_action_model/model.safetensors (separate "
            "img_attn_q / _k / _v, action_in.*, double_blocks.N.img_attn_prope_proj.*); load a plain HunyuanVideo "
            "with UNETLoader"
        )
    if "img_in.proj.weight" not in keys or "double_blocks.0.img_attn_q.weight" not in keys:
        raise CheckpointError(
            f"this file is not a HunyuanVideo 1.5 / HY-WorldPlay transformer (it holds keys such as {some}); "
            "Load HY-WorldPlay reads HY-WorldPlay's ar_distilled_action_model/model.safetensors"
        )
    added = [k for k in keys if k.startswith("action_in.") or ".img_attn_prope_proj." in k]
    if not added:
        raise CheckpointError(
            "this is a plain HunyuanVideo 1.5 transformer (no action_in.* and no double_blocks.N.img_attn_prope_proj.*, "
            "the modules HY-WorldPlay adds): load it with UNETLoader, or give Load HY-WorldPlay the WorldPlay checkpoint "
            "ar_distilled_action_model/model.safetensors"
        )
    singles = _count(keys, re.compile(r"^single_blocks\.(\d+)\."))
    if singles:
        raise CheckpointError(
            f"the checkpoint has {singles} single-stream blocks; HY-WorldPlay is HunyuanVideo 1.5's 480p I2V shape "
            "(double-stream blocks only), and its AR forward runs the double-stream blocks alone"
        )
    w_in = _shape_of(sd, "img_in.proj.weight")
    hidden, in_ch, patch = w_in[0], w_in[1], tuple(w_in[2:])
    if len(patch) != 3:
        raise CheckpointError(f"img_in.proj.weight has shape {w_in}: a video patch embedding is 5-D")
    out = _shape_of(sd, "final_layer.linear.weight")[0]
    npatch = patch[0] * patch[1] * patch[2]
    channels = out // npatch
    if channels * npatch != out or in_ch != 2 * channels + 1:
        raise CheckpointError(
            f"img_in takes {in_ch} channels and final_layer gives {out}: an I2V HunyuanVideo 1.5 takes "
            f"2 x latent channels + 1 (noise, image condition, mask), e.g. 65 for 32 latent channels"
        )
    head_dim = _shape_of(sd, "double_blocks.0.img_attn_q_norm.weight")[0]
    if hidden % head_dim:
        raise CheckpointError(f"head_dim {head_dim} (img_attn_q_norm) does not divide the width {hidden}")
    if head_dim % 32:
        raise CheckpointError(
            f"head_dim {head_dim} is not a multiple of 32: RoPE splits it 1/8, 7/16, 7/16 (16, 56, 56 at 128) "
            "and PRoPE needs blocks of 4"
        )
    vision = sd["vision_in.proj.0.weight"].shape[0] if "vision_in.proj.0.weight" in keys else None
    return WorldPlayShape(
        hidden_size=hidden,
        heads=hidden // head_dim,
        depth=_count(keys, _BLOCK),
        latent_channels=channels,
        patch_size=patch,
        mlp_ratio=_shape_of(sd, "double_blocks.0.img_mlp.fc1.weight")[0] / hidden,
        text_dim=_shape_of(sd, "txt_in.input_embedder.weight")[1],
        vision_dim=vision,
        byt5="byt5_in.fc1.weight" in keys,
        cond_type_embedding="cond_type_embedding.weight" in keys,
        qkv_bias="double_blocks.0.img_attn_q.bias" in keys,
    )


def check_keys(sd: Mapping[str, Tensor], shape: WorldPlayShape) -> None:
    """Every expected key present, no other, each of its shape; the error names the missing, unexpected and
    misshapen ones."""
    shapes = official_shapes(shape)
    present = set(sd)
    missing, unexpected = sorted(set(shapes) - present), sorted(present - set(shapes))
    misshapen = [
        f"{k} {tuple(sd[k].shape)} (expected {shapes[k]})"
        for k in sorted(present & set(shapes))
        if tuple(sd[k].shape) != shapes[k]
    ]
    if not (missing or unexpected or misshapen):
        return

    def show(names: list[str]) -> str:
        return ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")

    parts = []
    if missing:
        parts.append(f"{len(missing)} missing key(s): {show(missing)}")
    if unexpected:
        parts.append(f"{len(unexpected)} unexpected key(s): {show(unexpected)}")
    if misshapen:
        parts.append(f"{len(misshapen)} tensor(s) of the wrong shape: {show(misshapen)}")
    raise CheckpointError(
        f"the WorldPlay checkpoint ({shape.depth} double blocks, width {shape.hidden_size}) does not hold the keys its "
        "architecture has: " + "; ".join(parts) + ". Give Load HY-WorldPlay the unmodified "
        "ar_distilled_action_model/model.safetensors"
    )


def core_name(key: str) -> str:
    """The module name core's HunyuanVideo classes use for an official key (q / k / v map to their fused qkv)."""
    m = _BLOCK.match(key)
    if m:
        i, rest = m.groups()
        for side in ("img", "txt"):
            for part in ("q", "k", "v"):
                for kind in ("weight", "bias"):
                    if rest == f"{side}_attn_{part}.{kind}":
                        return f"double_blocks.{i}.{side}_attn.qkv.{kind}"
        for old, new in _BLOCK_RENAMES:
            if rest.startswith(old):
                return f"double_blocks.{i}.{new}{rest[len(old) :]}"
        return key
    m = _REFINER.match(key)
    if m:
        j, rest = m.groups()
        for old, new in _REFINER_RENAMES:
            if rest.startswith(old):
                return f"txt_in.individual_token_refiner.blocks.{j}.{new}{rest[len(old) :]}"
        return key
    for old, new in _TOP_RENAMES:
        if key.startswith(old):
            return new + key[len(old) :]
    return key


def to_core(sd: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """An official-format state dict in core's module names; ``q``, ``k``, ``v`` concatenated into ``qkv``."""
    out: dict[str, Tensor] = {}
    fused: dict[str, dict[str, Tensor]] = {}
    for key, value in sd.items():
        m = _BLOCK.match(key)
        part = None
        if m:
            rest = m.group(2)
            qkv = re.match(r"^(img|txt)_attn_([qkv])\.(weight|bias)$", rest)
            if qkv:
                part = qkv.group(2)
        if part is None:
            out[core_name(key)] = value
        else:
            fused.setdefault(core_name(key), {})[part] = value
    for name, parts in fused.items():
        if set(parts) != {"q", "k", "v"}:
            raise CheckpointError(f"{name}: the checkpoint holds only {sorted(parts)} of q, k, v")
        if len({p.dtype for p in parts.values()}) != 1:
            raise CheckpointError(f"{name}: q, k and v are stored in different dtypes")
        out[name] = torch.cat([parts["q"], parts["k"], parts["v"]], dim=0)
    return out


__all__ = [
    "RELEASED",
    "CheckpointError",
    "WorldPlayShape",
    "check_keys",
    "core_name",
    "official_keys",
    "official_shapes",
    "read_config",
    "to_core",
    "worldplay_only_keys",
]
