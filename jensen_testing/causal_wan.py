"""Tiny causal-AR Wan models (ComfyUI v0.27's ``WAN21_CausalAR`` / ``CausalWanModel``) and core's AR sampling.

Needs ComfyUI v0.27+ importable in-process (``jensen_testing.comfyui.setup_inprocess_comfyui()`` first).
The weights are :func:`jensen_testing.wan_tiny.init_weights`' (norm scales and residual gates at 1).
"""

from __future__ import annotations

import torch

from . import wan_tiny


def build_causal_patcher(seed: int = 0, dtype: torch.dtype = torch.float32, **arch):
    """A ModelPatcher around a tiny random ``WAN21_CausalAR`` (what UNETLoader gives for a causal checkpoint)."""
    import comfy.model_patcher
    import comfy.supported_models

    cfg = wan_tiny.unet_config(**{**wan_tiny.TINY, **arch})
    model_config = comfy.supported_models.WAN21_CausalAR_T2V(cfg)
    model_config.set_inference_dtype(dtype, None)
    model = model_config.get_model({})
    wan_tiny.init_weights(model.diffusion_model, seed)
    model.eval()
    dev = torch.device("cpu")
    return comfy.model_patcher.ModelPatcher(model, load_device=dev, offload_device=dev)


def ar_sampler(num_frame_per_block: int = 1):
    """What core's SamplerARVideo node returns."""
    import comfy.samplers

    return comfy.samplers.ksampler("ar_video", {"num_frame_per_block": num_frame_per_block})


def sample_core(
    model,
    latent: torch.Tensor,
    sigmas: torch.Tensor,
    *,
    num_frame_per_block: int = 1,
    seed: int = 0,
    cfg: float = 1.0,
    positive=None,
    negative=None,
) -> torch.Tensor:
    """SamplerCustom's path: core's ``sample_ar_video`` over ``model`` (noise from ``seed``, as SamplerCustom adds)."""
    import comfy.sample

    positive = (
        positive
        if positive is not None
        else wan_tiny.conditioning(1, wan_tiny.TINY["text_len"], wan_tiny.TINY["text_dim"])
    )
    negative = (
        negative
        if negative is not None
        else wan_tiny.conditioning(2, wan_tiny.TINY["text_len"], wan_tiny.TINY["text_dim"])
    )
    noise = comfy.sample.prepare_noise(latent, seed)
    return comfy.sample.sample_custom(
        model,
        noise,
        cfg,
        ar_sampler(num_frame_per_block),
        sigmas,
        positive,
        negative,
        latent,
        disable_pbar=True,
        seed=seed,
    )


def self_forcing_sigmas() -> torch.Tensor:
    """Self-Forcing's 4-step schedule as sigmas (t = 1000, 937.5, 833.3, 625 with shift 5, then 0)."""
    return torch.tensor([1.0, 0.9375, 0.8333, 0.625, 0.0])
