"""Tiny AR Decode: the tiny AR model's LATENT as an IMAGE batch (its fixed latent -> RGB map, no VAE)."""

from __future__ import annotations

import torch
from comfy_api.latest import io

from ..jensen_core import toy_video
from .tiny_ar_prompt import DEMO_CATEGORY


def decode(samples: torch.Tensor, scale: int) -> torch.Tensor:
    """(B, 16, T, H, W) LATENT -> (B*T, H*scale, W*scale, 3) in 0..1 (frames of each video in order)."""
    if samples.ndim != 5 or samples.shape[1] != toy_video.LATENT_CHANNELS:
        raise ValueError(
            f"Tiny AR Decode takes a Wan video LATENT (batch, 16, frames, height, width), got {tuple(samples.shape)}"
        )
    rgb = toy_video.to_rgb(toy_video.from_wan_latent(samples.float().cpu()))  # (B, T, H, W, 3)
    b, t, h, w, _ = rgb.shape
    img = rgb.reshape(b * t, h, w, 3)
    if scale > 1:
        img = img.repeat_interleave(scale, dim=1).repeat_interleave(scale, dim=2)
    return img.contiguous()


class JensenKVTinyARDecode(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="JensenKVTinyARDecode",
            display_name="Tiny AR Decode",
            category=DEMO_CATEGORY,
            description=(
                "Turn the tiny AR model's latent video into images with its fixed latent -> RGB map (ComfyUI's "
                "Wan 2.1 preview colours), each latent pixel a scale x scale block. Not a VAE: for real Wan "
                "latents use VAEDecode."
            ),
            inputs=[
                io.Latent.Input("samples", tooltip="The LATENT of a Chunked AR sampler running the tiny AR model."),
                io.Int.Input(
                    "scale", default=8, min=1, max=32, tooltip="Pixels per latent pixel (8 = Wan's VAE stride)."
                ),
            ],
            outputs=[io.Image.Output(tooltip="One image per latent frame (batch x frames).")],
        )

    @classmethod
    def execute(cls, samples, scale=8) -> io.NodeOutput:
        return io.NodeOutput(decode(samples["samples"], int(scale)))
