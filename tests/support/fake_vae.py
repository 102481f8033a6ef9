"""A VAE stand-in with Wan's time layout, for Krea Realtime's re-encoded context frame (no ComfyUI needed)."""

from __future__ import annotations

import torch


class FakeVAE:
    """A VAE stand-in with Wan's time layout: latent frame 0 -> 1 pixel frame, every later one -> 4.

    Pixel frame j shows latent frame ceil(j / 4) (so decoding a window or the whole video gives the same
    frame), and ``encode`` of one image is a fixed, different function of it (so a re-encoded frame is
    not the latent frame it came from). Records its calls.
    """

    def __init__(self):
        self.calls = []

    def decode(self, latent):
        T = latent.shape[2]
        idx = torch.tensor([(j + 3) // 4 for j in range(1 + 4 * (T - 1))])
        self.calls.append(("decode", T))
        return latent[:, :3, idx].permute(0, 2, 3, 4, 1)  # (B, pixel frames, H, W, 3)

    def encode(self, pixels):
        self.calls.append(("encode", pixels.shape[0]))
        img = pixels[:, :, :, :3].permute(3, 0, 1, 2)  # (3, 1, H, W)
        lat = torch.cat([img * (0.5 + 0.1 * i) + 0.2 for i in range(6)])[:16]
        return lat.unsqueeze(0)  # (1, 16, 1, H, W)


class StreamVAE(FakeVAE):
    """A causal VAE stand-in whose decode of a frame depends on every latent frame before it (as a causal video VAE's
    does, through its convolutions' caches): pixel frame j shows latent frame ceil(j / 4) plus half the mean of the
    latent frames up to it. So decoding a window of the last frames gives another frame than decoding the video from
    its first frame - the case FakeVAE cannot show."""

    def decode(self, latent):
        T = latent.shape[2]
        self.calls.append(("decode", T))
        x = latent[:, :3]
        running = x.cumsum(dim=2) / torch.arange(1, T + 1, dtype=x.dtype).view(1, 1, T, 1, 1)
        frames = x + 0.5 * running
        idx = torch.tensor([(j + 3) // 4 for j in range(1 + 4 * (T - 1))])
        return frames[:, :, idx].permute(0, 2, 3, 4, 1)  # (B, pixel frames, H, W, 3)
