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

from .comfy_model import classes
from .model import keys as wp_keys

logger = logging.getLogger("jensen_kv")

WEIGHT_DTYPES = {
    "default": None,
    "fp8_e4m3fn": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}
#: prefixes a full checkpoint puts before the transformer's keys
_PREFIXES = ("model.diffusion_model.", "diffusion_model.")


def strip_prefix(sd: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """The transformer's keys of ``sd``: a ``model.diffusion_model.`` (or ``diffusion_model.``) prefix removed."""
    for prefix in _PREFIXES:
        if sd and all(k.startswith(prefix) for k in sd):
            return {k[len(prefix) :]: v for k, v in sd.items()}
    return dict(sd)


def worldplay_from_state_dict(
    sd: Mapping[str, Tensor], weight_dtype: str = "default", load_device=None, offload_device=None
):
    """A ComfyUI ModelPatcher of HY-WorldPlay from an official-format state dict (see the module docstring)."""
    import comfy.model_management as mm
    import comfy.model_patcher
    import comfy.utils

    if weight_dtype not in WEIGHT_DTYPES:
        raise ValueError(f"weight_dtype {weight_dtype!r} is not one of {', '.join(WEIGHT_DTYPES)}")
    sd = strip_prefix(sd)
    shape = wp_keys.read_config(sd)
    wp_keys.check_keys(sd, shape)
    core_sd = wp_keys.to_core(sd)
    load_device = mm.get_torch_device() if load_device is None else load_device
    offload_device = mm.unet_offload_device() if offload_device is None else offload_device

    config = classes().config(shape.core_config())
    supported = list(config.supported_inference_dtypes)
    dtype = WEIGHT_DTYPES[weight_dtype]
    if dtype is None:
        dtype = mm.unet_dtype(
            model_params=comfy.utils.calculate_parameters(core_sd),
            supported_dtypes=supported,
            weight_dtype=comfy.utils.weight_dtype(core_sd),
        )
    config.set_inference_dtype(dtype, mm.unet_manual_cast(dtype, load_device, supported))
    model = config.get_model(core_sd, "")
    dm = model.diffusion_model
    dm.requires_grad_(False).eval()  # v0.27's BaseModel leaves this to the sampler's no_grad; v0.33 does it itself
    missing, unexpected = dm.load_state_dict(core_sd, strict=False)
    if missing or unexpected:  # the key list and the model disagree: a bug of the pack, said plainly
        raise wp_keys.CheckpointError(
            f"the pack's WorldPlay model and its key list disagree (missing {missing[:5]}, unexpected {unexpected[:5]})"
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
    return comfy.model_patcher.ModelPatcher(model, load_device=load_device, offload_device=offload_device)


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
