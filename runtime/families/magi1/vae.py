"""The MAGI-1 VAE in ComfyUI: the pack's pure-torch decoder (``runtime.families.magi1.model.vae``) under a ModelPatcher, so ComfyUI's
memory management moves it to the GPU (and others off it) for a decode."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch

from .model import checkpoint as ck
from .model.vae import MagiVAE, to_image

logger = logging.getLogger("jensen_kv")

VAE_DTYPES = {"auto": None, "bf16": torch.bfloat16, "fp32": torch.float32}


@dataclass
class Magi1VAE:
    """What the ``MAGI1_VAE`` link carries: the decoder's ModelPatcher and its config."""

    patcher: object
    config: object
    source: str

    @property
    def module(self) -> MagiVAE:
        return self.patcher.model

    def decode(
        self, samples: torch.Tensor, tile_pixels=256, tile_frames=12, overlap=0.25, progress=None
    ) -> torch.Tensor:
        """ComfyUI IMAGE (frames, H, W, 3) of a MAGI-1 VAE latent (B, 16, T, H, W) (a LATENT's ``samples``)."""
        import comfy.model_management as mm

        cfg = self.config
        if samples.ndim != 5 or samples.shape[1] != cfg.z_chans:
            raise ValueError(
                f"MAGI-1 VAE Decode takes a video LATENT (batch, {cfg.z_chans}, frames, height, width); got {tuple(samples.shape)}"
            )
        mm.load_models_gpu([self.patcher])
        device = self.patcher.load_device
        video = self.module.decode(
            samples.to(device), tile_pixels=tile_pixels, tile_frames=tile_frames, overlap=overlap, progress=progress
        )
        return to_image(video).to(mm.intermediate_device())


def load_magi1_vae(path: str | os.PathLike, dtype: str = "auto") -> Magi1VAE:
    import comfy.model_management as mm
    import comfy.model_patcher
    import comfy.ops

    if dtype not in VAE_DTYPES:
        raise ValueError(f"dtype {dtype!r}: use one of {list(VAE_DTYPES)}")
    ckpt = ck.inspect_vae(path)
    load_device = mm.get_torch_device()
    offload_device = mm.vae_offload_device()
    want = VAE_DTYPES[dtype]
    if want is None:
        want = mm.vae_dtype(load_device, [torch.bfloat16, torch.float32])
    model = MagiVAE(ckpt.config, operations=comfy.ops.manual_cast, dtype=want)
    model.decoder.load_state_dict(ckpt.decoder_state_dict(), strict=True)
    model.eval().requires_grad_(False).to(offload_device)
    logger.info("jensen_kv: loaded the MAGI-1 VAE decoder (%d blocks, %s) from %s", ckpt.config.depth, want, path)
    patcher = comfy.model_patcher.ModelPatcher(model, load_device=load_device, offload_device=offload_device)
    return Magi1VAE(patcher, ckpt.config, str(path))
