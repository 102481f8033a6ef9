"""Loading HY-WorldPlay's official checkpoint into the pack's WorldPlay model (ComfyUI imported lazily).

``UNETLoader`` cannot load it: it detects the file as plain HunyuanVideo 1.5, whose separate
``img_attn_q`` / ``_k`` / ``_v`` it does not fuse and whose ``action_in.*`` and
``double_blocks.N.img_attn_prope_proj.*`` it has no place for. Here the file's keys are checked
against the list the architecture has (``runtime.families.worldplay.model.keys``: a missing or unexpected key is an error
that names it), renamed to core's module names, and loaded strictly: every parameter of the model
comes from the file.

Weight dtypes: ``default`` keeps what ComfyUI picks for the device (the file's BF16 on a GPU that
has it); ``fp8_e4m3fn`` / ``fp8_e5m2`` store the weights in FP8 and compute in the manual-cast
dtype, as ``UNETLoader``'s ``weight_dtype`` does. A file already stored in FP8 loads as it is.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import torch
from torch import Tensor

from ...model_loading import check_weight_dtype, load_strict, model_patcher, strip_prefix
from .comfy_model import classes
from .model import keys as wp_keys

logger = logging.getLogger("jensen_kv")

WEIGHT_DTYPES = {
    "default": None,
    "fp8_e4m3fn": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}


def worldplay_from_state_dict(
    sd: Mapping[str, Tensor], weight_dtype: str = "default", load_device=None, offload_device=None
):
    """A ComfyUI ModelPatcher of HY-WorldPlay from an official-format state dict (see the module docstring)."""
    check_weight_dtype(weight_dtype, WEIGHT_DTYPES)
    sd = strip_prefix(sd)
    shape = wp_keys.read_config(sd)
    wp_keys.check_keys(sd, shape)
    model, load_device, offload_device = load_strict(
        classes().config(shape.core_config()),
        wp_keys.to_core(sd),
        WEIGHT_DTYPES[weight_dtype],
        load_device,
        offload_device,
        lambda missing, unexpected: wp_keys.CheckpointError(
            f"the pack's WorldPlay model and its key list disagree (missing {missing[:5]}, unexpected {unexpected[:5]})"
        ),
    )
    logger.info(
        "jensen_kv: HY-WorldPlay loaded: %d double blocks, width %d, %d heads x %d, weights %s (compute %s)",
        shape.depth,
        shape.hidden_size,
        shape.heads,
        shape.head_dim,
        model.get_dtype(),
        model.manual_cast_dtype or model.get_dtype(),
    )
    return model_patcher(model, load_device, offload_device)


def describe(model_patcher) -> str:
    """``HY-WorldPlay: 54 double blocks, width 2048, 16 heads x 128, weights torch.bfloat16``."""
    model = model_patcher.model
    dm = model.diffusion_model
    heads = dm.num_heads
    return (
        f"HY-WorldPlay: {len(dm.double_blocks)} double blocks, width {dm.hidden_size}, {heads} heads x "
        f"{dm.hidden_size // heads}, weights {model.get_dtype()}"
    )


def load_worldplay(path: str, weight_dtype: str = "default", load_device=None, offload_device=None):
    """:func:`worldplay_from_state_dict` of the safetensors (or torch) file at ``path``."""
    import comfy.utils

    sd = comfy.utils.load_torch_file(path, safe_load=True)
    return worldplay_from_state_dict(sd, weight_dtype, load_device=load_device, offload_device=offload_device)


__all__ = ["WEIGHT_DTYPES", "describe", "load_worldplay", "strip_prefix", "worldplay_from_state_dict"]
