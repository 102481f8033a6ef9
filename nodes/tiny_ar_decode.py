"""Tiny AR Decode: the tiny AR model's LATENT as an IMAGE batch (its bundled tiny decoder, or the preview colours)."""

from __future__ import annotations

import threading
from pathlib import Path

import torch
from comfy_api.latest import io

from ..jensen_core import tiny_decoder, toy_video
from .common import Combo
from .tiny_ar_prompt import DEMO_CATEGORY

DECODER_PATH = Path(__file__).resolve().parents[1] / "models" / "tiny_decoder" / "jensen-kv-tiny-decoder.safetensors"
DECODER = "tiny decoder"
PREVIEW = "preview colours"
METHODS = (DECODER, PREVIEW)

_cache: dict = {}
_lock = threading.Lock()


def _decoder(path: Path | None = None) -> tiny_decoder.TinyDecoder:
    """The bundled decoder, loaded once per file version (path, size, mtime)."""
    path = DECODER_PATH if path is None else path
    st = path.stat() if path.is_file() else None
    key = (str(path), st.st_size, st.st_mtime_ns) if st else None
    with _lock:
        if key is None or _cache.get("key") != key:
            try:
                dec = tiny_decoder.load(path)
            except FileNotFoundError as exc:
                raise FileNotFoundError(
                    f"{exc}. Tiny AR Decode: set decoder to {PREVIEW!r} to use the fixed colour map instead"
                ) from None
            _cache.update(key=key, decoder=dec)
        return _cache["decoder"]


def decode(samples: torch.Tensor, scale: int, method: str = PREVIEW) -> torch.Tensor:
    """(B, 16, T, H, W) LATENT -> (B*T, H*scale, W*scale, 3) in 0..1 (frames of each video in order).

    ``method`` :data:`DECODER`: the bundled tiny decoder draws 8 pixels per latent pixel (resized to
    ``scale`` when that differs); :data:`PREVIEW`: Wan 2.1's preview colours, each latent pixel a block.
    """
    if samples.ndim != 5 or samples.shape[1] != toy_video.LATENT_CHANNELS:
        raise ValueError(
            f"Tiny AR Decode takes a Wan video LATENT (batch, 16, frames, height, width), got {tuple(samples.shape)}"
        )
    if method not in METHODS:
        raise ValueError(f"Tiny AR Decode: unknown decoder {method!r}; choose one of {', '.join(map(repr, METHODS))}")
    video = toy_video.from_wan_latent(samples.float().cpu())
    b, _, t, h, w = video.shape
    if method == DECODER:
        rgb = tiny_decoder.decode_video(_decoder(), video)  # (B, T, 8h, 8w, 3)
        img = rgb.reshape(b * t, *rgb.shape[2:])
        if scale != tiny_decoder.SCALE:
            img = torch.nn.functional.interpolate(
                img.permute(0, 3, 1, 2), size=(h * scale, w * scale), mode="bilinear", antialias=True
            )
            img = img.permute(0, 2, 3, 1).clamp(0, 1)
        return img.contiguous()
    rgb = toy_video.to_rgb(video)  # (B, T, H, W, 3)
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
                "Turn the tiny AR model's latent video into images: with its bundled tiny decoder (sharp discs "
                "over the texture, 8 pixels per latent pixel, trained on the model's toy scenes) or with the "
                "fixed latent -> RGB map of ComfyUI's Wan 2.1 previews (each latent pixel a scale x scale block). "
                "Not a VAE: for real Wan latents use VAEDecode."
            ),
            inputs=[
                io.Latent.Input("samples", tooltip="The LATENT of a Chunked AR sampler running the tiny AR model."),
                io.Int.Input(
                    "scale", default=8, min=1, max=32, tooltip="Pixels per latent pixel (8 = Wan's VAE stride)."
                ),
                Combo(
                    "decoder",
                    options=list(METHODS),
                    default=DECODER,
                    optional=True,
                    tooltip=(
                        "tiny decoder: the bundled decoder (models/tiny_decoder/jensen-kv-tiny-decoder.safetensors) draws "
                        "the discs at 8 pixels per latent pixel (resized for another scale); preview colours: the "
                        "fixed Wan 2.1 colour map, blocky (what ComfyUI's latent previews show)."
                    ),
                ),
            ],
            outputs=[io.Image.Output(tooltip="One image per latent frame (batch x frames).")],
        )

    @classmethod
    def execute(cls, samples, scale=8, decoder=DECODER) -> io.NodeOutput:
        return io.NodeOutput(decode(samples["samples"], int(scale), decoder))
