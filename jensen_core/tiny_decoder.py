"""The tiny AR model's decoder: 16x16 model-space latents -> 128x128 RGB frames (pure torch, no ComfyUI).

A small per-frame convolutional decoder (about 0.15M parameters, 0.3 MB in half precision) trained by
``tools/train_tiny_decoder.py`` on the toy scenes of :mod:`jensen_core.toy_video`: latents from
:func:`toy_video.render` (plus noise, so it also decodes a model's imperfect latents) against the
same frames drawn at 8x the resolution by :func:`toy_video.render_rgb`. It is what a VAE is to Wan,
for this one synthetic world: it knows discs and a smooth texture, nothing else.

Layout: the fixed Wan 2.1 preview colours (:func:`toy_video.to_rgb`) upsampled bilinearly 8x are the
base; a network that runs entirely at the latent resolution (3x3 conv in, two residual blocks, a 3x3
conv to 3 x 8 x 8 channels, an 8x pixel shuffle) adds a per-pixel correction in logit space, so the
output is in 0..1 by construction and the texture needs no learning: the network only has to draw
sharp disc edges where the preview is blurred.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor, nn

LATENT_CHANNELS = 16
SCALE = 8  # output pixels per latent pixel (Wan's VAE stride)
FORMAT = "jensen_kv_tiny_decoder"
WIDTH = 48  # channels of the network at the latent resolution
_EPS = 0.02  # the base is clamped to [_EPS, 1 - _EPS] before its logit
BUFFERS = ("rgb_factors", "rgb_bias")  # fixed (the preview map), not stored in the file


class _Res(nn.Module):
    def __init__(self, ch: int):
        super().__init__()
        self.norm1 = nn.GroupNorm(8, ch)
        self.conv1 = nn.Conv2d(ch, ch, 3, padding=1)
        self.norm2 = nn.GroupNorm(8, ch)
        self.conv2 = nn.Conv2d(ch, ch, 3, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        h = self.conv1(torch.nn.functional.silu(self.norm1(x)))
        h = self.conv2(torch.nn.functional.silu(self.norm2(h)))
        return x + h


class TinyDecoder(nn.Module):
    """(N, 16, h, w) model-space latents -> (N, 3, 8h, 8w) RGB in 0..1."""

    def __init__(self, width: int = WIDTH):
        super().__init__()
        from .toy_video import WAN21_RGB_BIAS, WAN21_RGB_FACTORS

        self.register_buffer("rgb_factors", torch.tensor(WAN21_RGB_FACTORS).T.reshape(3, LATENT_CHANNELS, 1, 1))
        self.register_buffer("rgb_bias", torch.tensor(WAN21_RGB_BIAS))
        self.conv_in = nn.Conv2d(LATENT_CHANNELS, width, 3, padding=1)
        self.mid = nn.Sequential(_Res(width), _Res(width))
        self.norm_out = nn.GroupNorm(8, width)
        self.conv_out = nn.Conv2d(width, 3 * SCALE * SCALE, 3, padding=1)

    def preview(self, z: Tensor) -> Tensor:
        """The fixed Wan 2.1 preview colours at the latent resolution: (N, 3, h, w), 0..1."""
        rgb = torch.nn.functional.conv2d(z, self.rgb_factors, self.rgb_bias)
        return ((rgb + 1) / 2).clamp(0, 1)

    def forward(self, z: Tensor) -> Tensor:
        base = torch.nn.functional.interpolate(self.preview(z), scale_factor=float(SCALE), mode="bilinear")
        base = base.clamp(_EPS, 1 - _EPS)
        h = self.mid(self.conv_in(z))
        r = torch.nn.functional.pixel_shuffle(self.conv_out(torch.nn.functional.silu(self.norm_out(h))), SCALE)
        return torch.sigmoid(torch.logit(base) + r)


def load(path: str | Path, device: str | torch.device = "cpu") -> TinyDecoder:
    """The decoder saved at ``path`` (safetensors written by ``tools/train_tiny_decoder.py``), fp32, eval mode."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"tiny decoder {path} is missing: it ships with the pack under models/tiny_decoder "
            "(or train it: python tools/train_tiny_decoder.py)"
        )
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
    if meta.get("format") != FORMAT:
        raise ValueError(f"{path} is not a tiny AR decoder (metadata format {meta.get('format')!r}, want {FORMAT!r})")
    dec = TinyDecoder()
    missing, unexpected = dec.load_state_dict({k: v.float() for k, v in load_file(str(path)).items()}, strict=False)
    if unexpected or set(missing) - set(BUFFERS):
        raise ValueError(f"{path}: not this decoder's weights (missing {missing[:4]}, unexpected {unexpected[:4]})")
    return dec.to(device).eval()


@torch.no_grad()
def decode_video(decoder: TinyDecoder, video: Tensor, batch: int = 32) -> Tensor:
    """Model-space latents (16, T, h, w) or (B, 16, T, h, w) -> RGB frames (…, T, 8h, 8w, 3) in 0..1, float32."""
    if video.dim() not in (4, 5) or video.shape[-4] != LATENT_CHANNELS:
        raise ValueError(
            f"the tiny decoder takes model-space latents (16, frames, h, w) or (batch, 16, frames, h, w), "
            f"got {tuple(video.shape)}"
        )
    lead = video.shape[:-4]
    x = video.float().movedim(-4, -3).reshape(-1, LATENT_CHANNELS, *video.shape[-2:])  # (N, 16, h, w)
    p = next(decoder.parameters())
    outs = [decoder(x[i : i + batch].to(p.device, p.dtype)).float().cpu() for i in range(0, x.shape[0], batch)]
    rgb = torch.cat(outs).permute(0, 2, 3, 1)  # (N, 8h, 8w, 3)
    return rgb.reshape(*lead, video.shape[-3], *rgb.shape[1:])
