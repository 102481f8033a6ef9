"""What the families' own checkpoint loaders share (ComfyUI imported lazily): stripping a full checkpoint's prefix,
and building a ModelPatcher from a model config and a state dict whose keys the family has already checked.

A family keeps its own key list, config and error type; this module imports no family.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from torch import Tensor

#: prefixes a full checkpoint puts before the transformer's keys
PREFIXES = ("model.diffusion_model.", "diffusion_model.")


def strip_prefix(sd: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """The transformer's keys of ``sd``: a ``model.diffusion_model.`` (or ``diffusion_model.``) prefix removed."""
    for prefix in PREFIXES:
        if sd and all(k.startswith(prefix) for k in sd):
            return {k[len(prefix) :]: v for k, v in sd.items()}
    return dict(sd)


def check_weight_dtype(weight_dtype: str, weight_dtypes: Mapping) -> None:
    if weight_dtype not in weight_dtypes:
        raise ValueError(f"weight_dtype {weight_dtype!r} is not one of {', '.join(weight_dtypes)}")


def load_strict(
    config,
    sd: Mapping[str, Tensor],
    dtype,
    load_device,
    offload_device,
    mismatch: Callable[[list, list], Exception],
):
    """``(model, load_device, offload_device)``: ComfyUI's model of ``config`` (a ``supported_models`` config) with
    every parameter from ``sd``. ``dtype`` None is what ComfyUI picks for the device; the devices None are
    ComfyUI's. A key the model and ``sd`` disagree on raises ``mismatch(missing, unexpected)``."""
    import comfy.model_management as mm
    import comfy.utils

    load_device = mm.get_torch_device() if load_device is None else load_device
    offload_device = mm.unet_offload_device() if offload_device is None else offload_device
    supported = list(config.supported_inference_dtypes)
    if dtype is None:
        dtype = mm.unet_dtype(
            model_params=comfy.utils.calculate_parameters(sd),
            supported_dtypes=supported,
            weight_dtype=comfy.utils.weight_dtype(sd),
        )
    config.set_inference_dtype(dtype, mm.unet_manual_cast(dtype, load_device, supported))
    model = config.get_model(sd, "")
    dm = model.diffusion_model
    dm.requires_grad_(False).eval()  # v0.27's BaseModel leaves this to the sampler's no_grad; v0.33 does it itself
    missing, unexpected = dm.load_state_dict(sd, strict=False)
    if missing or unexpected:  # the key list and the model disagree: a bug of the pack, said plainly
        raise mismatch(missing, unexpected)
    return model, load_device, offload_device


def model_patcher(model, load_device, offload_device):
    import comfy.model_patcher

    return comfy.model_patcher.ModelPatcher(model, load_device=load_device, offload_device=offload_device)


__all__ = ["PREFIXES", "check_weight_dtype", "load_strict", "model_patcher", "strip_prefix"]
