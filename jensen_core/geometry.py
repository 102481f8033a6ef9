"""How a model family lays out its latents: what the planner needs to know about a model besides its attention.

A family (``runtime/families/``) provides its instance; the core knows no family by name. Latent
shapes are (batch, channels, frames, height, width); a token is one ``patch`` of latent pixels.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LatentGeometry:
    """``patch`` (frames, height, width) of latent pixels per token, ``latent_channels``, and the VAE's strides
    from video pixels to latent pixels (``vae_time_stride`` frames, ``vae_space_stride`` pixels per side).
    ``causal_first_frame``: the VAE encodes the first frame alone (Wan's, HunyuanVideo's: 4k + 1 frames); False
    for one that makes ``vae_time_stride`` frames of every latent frame (MAGI-1's)."""

    patch: tuple[int, int, int]
    latent_channels: int
    vae_time_stride: int = 1
    vae_space_stride: int = 1
    causal_first_frame: bool = True

    def __post_init__(self) -> None:
        patch = tuple(self.patch)
        if len(patch) != 3 or any(int(p) != p or p < 1 for p in patch):
            raise ValueError(f"patch={self.patch!r} must be three positive integers (frames, height, width)")
        object.__setattr__(self, "patch", tuple(int(p) for p in patch))
        for name in ("latent_channels", "vae_time_stride", "vae_space_stride"):
            v = getattr(self, name)
            if int(v) != v or v < 1:
                raise ValueError(f"{name}={v!r} must be a positive integer")

    def tokens_per_frame(self, latent_height: int, latent_width: int) -> int:
        """Self-attention tokens of one latent frame (whole patches only)."""
        return (latent_height // self.patch[1]) * (latent_width // self.patch[2])

    def latent_shape(self, width: int, height: int, frames: int) -> tuple[int, int, int]:
        """(latent frames, latent height, latent width) of a ``width`` x ``height`` video of ``frames`` frames
        (a causal VAE: the first frame alone, then one latent frame per ``vae_time_stride`` frames; otherwise
        one latent frame per ``vae_time_stride`` frames, a last partial one included)."""
        t = self.vae_time_stride
        return (
            (frames - 1) // t + 1 if self.causal_first_frame else -(-frames // t),
            height // self.vae_space_stride,
            width // self.vae_space_stride,
        )
