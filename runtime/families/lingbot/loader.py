"""Loading a LingBot-World 2.0 checkpoint into the pack's LingBot model (ComfyUI imported lazily).

``UNETLoader`` would detect the file as plain Wan 2.1 text-to-video with 36 input channels and drop every camera
tensor (``model.keys.dropped_by_comfyui``). Here the keys are checked against the architecture's list (a missing,
unexpected or misshapen key is an error that names it) and loaded strictly.

The released DiT is a diffusers folder (``transformers/``: ``config.json`` and safetensors shards, official key
names, float32). Merge the shards into one ``.safetensors`` file in ``models/diffusion_models`` (docs/lingbot.md gives
the command); the number of heads comes from the file's ``num_heads`` metadata when present, else ``dim // 128`` (the
released 1.3B and 14B).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping

import torch
from torch import Tensor

from ...model_loading import (
    check_weight_dtype,
    folder_config,
    folder_tensor_names,
    load_folder,
    load_strict,
    model_patcher,
    strip_prefix,
)
from .comfy_model import classes
from .model import keys as lb_keys

logger = logging.getLogger("jensen_kv")

WEIGHT_DTYPES = {"default": None, "bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32,
                 "fp8_e4m3fn": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}  # fmt: skip


def lingbot_from_state_dict(
    sd: Mapping[str, Tensor],
    weight_dtype: str = "default",
    num_heads: int | None = None,
    text_len: int = 512,
    load_device=None,
    offload_device=None,
):
    """A ComfyUI ModelPatcher of LingBot-World from an official-format state dict (see the module docstring)."""
    check_weight_dtype(weight_dtype, WEIGHT_DTYPES)
    sd = strip_prefix(sd)
    shape = lb_keys.read_shape(sd, num_heads, text_len)
    lb_keys.check_keys(sd, shape)
    model, load_device, offload_device = load_strict(
        classes().config(shape.unet_config()),
        sd,
        WEIGHT_DTYPES[weight_dtype],
        load_device,
        offload_device,
        lambda missing, unexpected: lb_keys.CheckpointError(
            f"the pack's LingBot model and its key list disagree (missing {missing[:5]}, unexpected {unexpected[:5]})"
        ),
    )
    logger.info(
        "jensen_kv: LingBot-World loaded: %d blocks, width %d, %d heads x %d, weights %s",
        shape.num_layers, shape.dim, shape.num_heads, shape.dim // shape.num_heads, model.get_dtype(),
    )  # fmt: skip
    return model_patcher(model, load_device, offload_device)


def file_metadata(path: str) -> dict:
    """The safetensors header's ``__metadata__`` (empty for other files)."""
    if not str(path).endswith(".safetensors"):
        return {}
    try:
        from safetensors import safe_open

        with safe_open(path, framework="pt") as f:
            return dict(f.metadata() or {})
    except Exception:  # noqa: BLE001 - a header we cannot read is loaded without metadata; the load says what fails
        return {}


def is_lingbot_folder(folder) -> bool:
    """A diffusers folder whose tensors are LingBot-World's (names read from its index or header alone)."""
    return lb_keys.is_lingbot(dict.fromkeys(strip_prefix(dict.fromkeys(folder_tensor_names(folder)))))


def load_lingbot(path: str, weight_dtype: str = "default", load_device=None, offload_device=None):
    """:func:`lingbot_from_state_dict` of the file at ``path`` (``num_heads`` / ``text_len`` from its metadata, or a
    ``config`` JSON entry with the diffusers config's fields), or of the release's folder as it is published
    (``transformers/``: ``config.json`` and the shards, read by :func:`runtime.model_loading.load_folder`)."""
    import os

    import comfy.utils

    if os.path.isdir(path):
        cfg = folder_config(path)
        heads, text_len = cfg.get("num_heads"), cfg.get("text_len", 512)
        return lingbot_from_state_dict(
            load_folder(path), weight_dtype, int(heads) if heads else None, int(text_len or 512), load_device,
            offload_device,
        )  # fmt: skip
    meta = file_metadata(path)
    heads, text_len = meta.get("num_heads"), meta.get("text_len")
    if "config" in meta:
        try:
            cfg = json.loads(meta["config"])
            heads, text_len = cfg.get("num_heads", heads), cfg.get("text_len", text_len)
        except (TypeError, ValueError):
            pass
    sd = comfy.utils.load_torch_file(path, safe_load=True)
    return lingbot_from_state_dict(
        sd, weight_dtype, int(heads) if heads else None, int(text_len or 512), load_device, offload_device
    )


def describe(model_patcher) -> str:
    dm = model_patcher.model.diffusion_model
    return (
        f"LingBot-World: {len(dm.blocks)} blocks, width {dm.dim}, {dm.num_heads} heads x {dm.dim // dm.num_heads}, "
        f"weights {model_patcher.model.get_dtype()}"
    )


__all__ = [
    "WEIGHT_DTYPES",
    "describe",
    "file_metadata",
    "is_lingbot_folder",
    "lingbot_from_state_dict",
    "load_lingbot",
    "strip_prefix",
]
