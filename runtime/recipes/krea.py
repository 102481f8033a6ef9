"""Krea Realtime 14B (as daydreamlive/scope 68b0f95 runs it, ``krea_realtime_video``): before every chunk the cache
is rebuilt from the last ``recompute_frames`` latent frames (``kv_cache_num_frames``) and the chunk itself is never
written; ``attention_bias`` (``kv_cache_attention_bias``) is applied by the caches while denoising.
"""

from __future__ import annotations

import logging

import torch

from .base import ChunkStep
from .plain import SelfForcing

logger = logging.getLogger("jensen_kv")


class Krea(SelfForcing):
    """Krea's per-block cache recompute (``blocks/recompute_kv_cache.py``, before each block but the first, with
    ``get_context_frames``): the context is the last ``recompute_frames`` (K) latent frames, whose first is replaced -
    by the very first frame while the block before starts within K frames of the video's start
    (``current_start - block < K``), else by the frame K back re-encoded by the VAE from its last decoded pixel frame
    (Krea keeps the last ``1 + (K - 1) x 4`` frames of the video it decodes as a stream and encodes the oldest,
    ``use_cache=False``). The cache is emptied and the context written at t = 0 (the pack's context_noise) with RoPE
    frames 0..K-1, block-causally in pieces of ``chunk_frames`` (``_prepare_blockwise_causal_attn_mask`` over the
    context, ``local_attn_size=-1``), with no attention bias ("no bias to faithfully store context frames"); the
    chunk is then denoised at RoPE frame K (``start_frame = min(current_start_frame, K)``) and never written itself.

    The re-encoded frame is the one scope's stream decode gives: the video decoded from its first latent frame up to
    that frame (a causal VAE decodes a frame differently without the frames before it; Wan's VAE over a 3-frame
    window is off by ~98% relative). As scope does, the decoder's cache is kept between chunks
    (:class:`runtime.vae_stream.StreamDecoder`), so each chunk decodes only its new frames: a constant cost per chunk
    (``python benchmarks/krea_decode.py``). A VAE other than Wan 2.1's decodes the video again for every chunk.
    Differences: with fewer than K frames so far the pack uses the frames there are (Krea pads its buffer with zero
    latents; never with its defaults, K = 3 = the block); without a VAE the latent frame itself is used (the report
    says so). The prompt is the chunk's own, so a prompt switch needs no separate re-cache.
    """

    name = "krea"
    label = "Krea Realtime: the cache rebuilt from the last frames before every chunk, attention bias while denoising"

    @classmethod
    def check(cls, request) -> None:
        """What the recompute cannot be combined with (it rebuilds the cache itself)."""
        from ..shift_observer import get_request

        o, ch, co = request.recipe, request.chunking, request.continuation
        n = o.recompute_frames
        clash = [
            what
            for what, bad in (
                (f"window_chunks={ch.window_chunks}", ch.window_chunks != 0),
                (f"sink_chunks={ch.sink_chunks}", ch.sink_chunks != 0),
                ("a kv_cache to continue", co.resume is not None),
                ("the kv_cache output", co.keep_state),
                (
                    f"first_chunk_frames={ch.first_chunk_frames}",
                    ch.first_chunk_frames not in (0, ch.chunk_frames),
                ),
                ("context_noise_mode='skyreels'", o.skyreels_noise),
            )
            if bad
        ]
        if clash:
            raise ValueError(
                f"recompute_frames={n} rebuilds the cache from the last {n} latent frames before every chunk, so it "
                f"cannot be combined with {', '.join(clash)}: set window_chunks and sink_chunks to 0 and leave the "
                "kv_cache input and output unconnected, first_chunk_frames at 0, context_noise_mode 'relabel' (or set "
                "recompute_frames to 0)"
            )
        if get_request(getattr(request.model, "model_options", None)) is not None:
            raise ValueError(
                "KV Cache Diagnostics follows chunks written once; recompute_frames rebuilds the cache before every "
                "chunk. Remove KV Cache Diagnostics or set recompute_frames to 0"
            )

    def planned_window(self, chunking) -> int:
        """The recompute holds the last recompute_frames frames, written in pieces of chunk_frames."""
        return -(-self.options.recompute_frames // chunking.chunk_frames)

    def prefill(self, job) -> None:
        """Nothing: the recompute reads the prefix frames before every chunk instead."""

    def before_chunk(self, job, step: ChunkStep) -> int:
        """The cache rebuilt from the context of ``step``; returns the RoPE frame it is denoised at."""
        K, F, frame0 = self.options.recompute_frames, job.request.chunking.chunk_frames, step.frame0
        job.active = step.prompt_key  # every chunk is re-cached under its own prompt
        job.run.empty()
        if frame0 == 0:
            return 0
        s = job.setup
        history = job.out[:, :, : frame0 - s.first_frame]
        if s.prefix_latent is not None:
            history = torch.cat([s.prefix_latent.to(job.out.dtype), history], dim=2)
        if frame0 <= K:
            context = history
        else:
            rest = history[:, :, frame0 - K + 1 :]
            if frame0 - F < K:
                first = history[:, :, :1]
            else:
                first = self.reencoded(history, frame0 - K)
            context = torch.cat([first.to(history), rest], dim=2)
        n = context.shape[2]
        for p, a in enumerate(range(0, n, F)):
            # distinct negative ids (each piece its own context-noise stream): no chunks of the video, never recorded
            self.write_chunk(job, -1 - step.index * K - p, a, context[:, :, a : a + F], step.prompt, record=False)
        return n

    def write(self, job, step: ChunkStep, clean) -> None:
        """Nothing: a chunk is never written itself (the next chunk's recompute writes its frames)."""

    def on_prompt_switch(self, job, step: ChunkStep, index: int) -> int:
        return 0  # before_chunk re-caches under the chunk's own prompt (and marks it active): never called

    def reencoded(self, history: torch.Tensor, frame: int) -> torch.Tensor:
        """Latent ``frame`` as Krea re-encodes it: the video decoded from its first latent frame through ``frame`` (as
        scope's stream decode has it: one stream per batch item, each chunk decoding only its new frames), its last
        pixel frame encoded alone (one latent frame, an image's); without a VAE, the latent frame as it is."""
        from ..vae_stream import StreamDecoder

        vae = self.options.vae
        if vae is None:
            return history[:, :, frame : frame + 1]
        if not hasattr(self, "_streams"):
            self._streams: dict[int, StreamDecoder] = {}  # one per batch item, for this run
        out = []
        for b in range(history.shape[0]):
            stream = self._streams.setdefault(b, StreamDecoder(vae))
            pixels = stream.last_frame(history[b : b + 1, :, : frame + 1])  # (1, 1 or 4, H, W, C)
            out.append(vae.encode(pixels[0, -1:, :, :, :3]).to(history.device))
        return torch.cat(out, dim=0)

    def report(self) -> dict:
        o = self.options
        if o.vae is None:
            anchor, note = (
                "latent",
                (
                    "Krea recompute: no VAE connected, so the first context frame is the latent frame itself (scope "
                    "re-encodes it from the decoded video): connect the sampler's vae for Krea's anchor frame."
                ),
            )
        else:
            anchor, note = (
                "vae",
                (
                    "Krea recompute: the first context frame re-encoded by the VAE from the video decoded from its first "
                    "frame, as scope's stream decode gives it."
                ),
            )
        return {
            "recipe": self.name,
            "recompute_frames": int(o.recompute_frames),
            "attention_bias": float(o.attention_bias),
            "anchor_frame": anchor,
            "recipe_notes": [note],
        }
