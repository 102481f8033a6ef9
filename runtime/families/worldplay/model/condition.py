"""The image condition of one WorldPlay call, cut to the call's own latent frames.

HunyuanVideo 1.5 I2V feeds the transformer ``[noise, image latent, mask]`` per latent frame: the start
image's latent in frame 0 (zeros elsewhere) and a mask that is 1 where the image is given. ComfyUI's
``HunyuanVideo15ImageToVideo`` puts the whole video's condition on the conditioning, and core's
``concat_cond`` only resizes it in space: a call on fewer frames (WorldPlay denoises 4 frames, or
re-encodes up to 20 chosen frames) would get the whole video's frames. A WorldPlay call names its
absolute latent frames; :func:`select_frames` takes exactly those (so the image reaches a call only
when frame 0 is among its frames, as in the reference's ``cond_latents[:, :, frames]``). Pure torch.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def call_frames(frames: Sequence[int] | None, call_length: int, video_length: int) -> tuple[int, ...]:
    """The absolute latent frames of a call of ``call_length`` frames on a ``video_length``-frame condition.

    ``frames`` None means the call is the whole video (only allowed when the lengths agree)."""
    if frames is None:
        if call_length != video_length:
            raise ValueError(
                f"a WorldPlay call on {call_length} latent frames got an image condition of {video_length} frames "
                "and no frame indices: pass the call's absolute latent frames (conditioning key 'worldplay_frames'), "
                "or a condition of the call's length. HY-WorldPlay AR Sampler does this for every chunk; KSampler runs "
                "the whole video at once, and the Chunked AR Video Sampler cannot drive HY-WorldPlay"
            )
        return tuple(range(call_length))
    out = tuple(int(f) for f in frames)
    if len(out) != call_length:
        raise ValueError(f"{len(out)} frame indices for a call on {call_length} latent frames: give one per frame")
    bad = [f for f in out if not 0 <= f < video_length]
    if bad:
        raise ValueError(f"frame indices {bad} lie outside the image condition's {video_length} latent frames")
    return out


def select_frames(x: Tensor, frames: Sequence[int]) -> Tensor:
    """``x[:, :, frames]`` for a ``(batch, channels, frames, height, width)`` tensor."""
    if x.ndim != 5:
        raise ValueError(f"a video condition of shape {tuple(x.shape)} must be (batch, channels, frames, h, w)")
    index = torch.as_tensor(list(frames), dtype=torch.long, device=x.device)
    return x.index_select(2, index)


def pad_frames(mask: Tensor, length: int, value: float) -> Tensor:
    """A ``(batch, 1, t, h, w)`` mask padded with ``value`` to ``length`` frames (as core pads a short mask)."""
    if mask.shape[2] >= length:
        return mask
    extra = torch.full((*mask.shape[:2], length - mask.shape[2], *mask.shape[3:]), value, dtype=mask.dtype)
    return torch.cat([mask, extra.to(mask.device)], dim=2)


__all__ = ["call_frames", "pad_frames", "select_frames"]
