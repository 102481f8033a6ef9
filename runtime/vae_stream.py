"""Decode a Wan 2.1 video latent as a stream: each call decodes only the frames that are new, continuing the causal
decoder's cache from the frames decoded before (as scope keeps its decoder's cache for Krea Realtime).

Wan's VAE decoder is causal: a pixel frame depends on every latent frame before it, through the caches of its
temporal convolutions (``feat_cache``). ``WanVAE.decode`` fills that cache as it walks the frames of one call, and
forgets it afterwards, so decoding the video from its first frame again for every chunk costs more with every
chunk. :class:`StreamDecoder` keeps the cache between calls: a chunk's decode costs the same at chunk 4 and at
chunk 32 (``python benchmarks/krea_decode.py``).

It walks the frames in the groups ``WanVAE.decode`` uses, because the decoder's result depends on them: ComfyUI
0.27 and later decode the first latent frame alone and then two at a time (one at a time gives other pixels: 2.6
apart on values up to 1.9 with random weights), v0.3.64 one at a time. A group the video so far leaves half full
(the last frame, when it would pair with the next) is decoded on a copy of the cache and decoded again with its pair
later. So the last frame's pixels are those a whole decode of the video so far gives: the same groups, the same
arithmetic (``tests/integration/test_krea_recompute.py`` compares them on every ComfyUI version).

It goes through ComfyUI's own ``VAE.decode`` (device, dtype, memory, the output's range and layout), with the
model's ``decode`` replaced on the instance for that one call (restored in ``finally``). A VAE that is not Wan 2.1's
(or a stand-in without ``first_stage_model``) is decoded whole from the first frame, as before; so is one whose
decode fell back to ComfyUI's tiled decode (out of memory), from then on.
"""

from __future__ import annotations

import logging

import torch

logger = logging.getLogger("jensen_kv")


def _wan_vae():
    """``comfy.ldm.wan.vae`` (every supported ComfyUI has it), or None."""
    try:
        import comfy.ldm.wan.vae as wan_vae
    except ImportError:  # pragma: no cover
        return None
    return wan_vae


def walk_groups(start: int, stop: int, pairs: bool) -> list[tuple[int, int]]:
    """The groups of latent frames ``WanVAE.decode`` walks that lie in ``[start, stop)`` (``start`` on a group's
    start): frame 0 alone, then pairs ``(1, 2), (3, 4), ...`` (ComfyUI 0.27+), or every frame alone (v0.3.64). The
    last group may be cut short at ``stop``."""
    out, f = [], start
    while f < stop:
        end = f + 1 if (f == 0 or not pairs) else min(f + 2, stop)
        out.append((f, end))
        f = end
    return out


class StreamDecoder:
    """One video (batch 1) decoded as its latent frames arrive: :meth:`last_frame` gives the pixel frames of the
    newest latent frame, as a whole decode of the video so far gives them; frames before it are decoded once."""

    def __init__(self, vae):
        self.vae = vae
        wan_vae = _wan_vae()
        model = getattr(vae, "first_stage_model", None)
        self.streams = wan_vae is not None and isinstance(model, wan_vae.WanVAE)
        # ComfyUI 0.27 brought count_cache_layers with the two-frame walk
        self.pairs = self.streams and hasattr(wan_vae, "count_cache_layers")
        self.done = 0  # latent frames whose group is complete and in the cache
        self._cache: list | None = None
        self._last: torch.Tensor | None = None  # the newest frame seen, to notice a video that is not this one
        self._seen = 0
        self._groups: list[tuple[int, int]] = []
        self._commit = 0

    # ------------------------------------------------------------------ the walk, as WanVAE.decode (on the instance)
    def _decode_groups(self, z: torch.Tensor) -> torch.Tensor:
        """Decode the frames ``z`` (the video's frames ``self.done`` on) in ``self._groups``: the first
        ``self._commit`` groups into the kept cache, the rest on a copy of it."""
        model = self.vae.first_stage_model
        if self._cache is None:
            wan_vae = _wan_vae()
            count = getattr(wan_vae, "count_cache_layers", None) or wan_vae.count_conv3d
            self._cache = [None] * count(model.decoder)
        x = model.conv2(z)
        out, cache = [], self._cache
        for i, (a, b) in enumerate(self._groups):
            if i == self._commit:
                cache = list(cache)  # the decoder assigns its entries anew: a shallow copy keeps ours
            part = model.decoder(x[:, :, a - self.done : b - self.done], feat_cache=cache, feat_idx=[0])
            out.append(torch.cat(part, 2) if isinstance(part, list) else part)
        self._called = True
        return torch.cat(out, 2)

    def last_frame(self, latents: torch.Tensor) -> torch.Tensor:
        """The pixel frames (1, n, H, W, C) of the last latent frame of ``latents`` (1, C, T, H, W), the video so far:
        1 pixel frame for latent frame 0, 4 for each later one, in ComfyUI's ``VAE.decode`` layout."""
        if latents.shape[0] != 1:
            raise ValueError(f"StreamDecoder decodes one video at a time (batch 1), got batch {latents.shape[0]}")
        T = latents.shape[2]
        if T < self._seen or (self._last is not None and not torch.equal(latents[:, :, self._seen - 1], self._last)):
            raise ValueError(
                f"the video decoded so far ({self._seen} latent frames) is not the start of this one ({T} frames): "
                "a stream decodes one video from its first frame on"
            )
        if self.streams:
            pixels = self._stream(latents)
        if not self.streams:  # not Wan 2.1's VAE, or ComfyUI fell back to a tiled decode
            pixels = self.vae.decode(latents)
            pixels = pixels.reshape(1, -1, *pixels.shape[-3:])
        self._seen, self._last = T, latents[:, :, T - 1].detach().clone()
        return pixels[:, -(1 if T == 1 else 4) :]

    def _stream(self, latents: torch.Tensor) -> torch.Tensor:
        T = latents.shape[2]
        groups = walk_groups(self.done, T, self.pairs)
        full = [g for g in groups if g[1] - g[0] == (1 if g[0] == 0 or not self.pairs else 2)]
        self._groups, self._commit = groups, len(full)
        model = self.vae.first_stage_model
        self._called = False
        saved = list(self._cache) if self._cache is not None else None
        model.decode = self._decode_groups  # the instance's own decode, for this one call
        try:
            pixels = self.vae.decode(latents[:, :, self.done : T])
        finally:
            del model.decode
        if not self._called:  # a tiled decode called the model otherwise: the cache is not the video's
            logger.warning("jensen_kv: the VAE decoded tiled; the stream decode goes back to whole-video decodes")
            self.streams, self._cache = False, saved
            return pixels
        self.done = full[-1][1] if full else self.done
        return pixels.reshape(1, -1, *pixels.shape[-3:])
