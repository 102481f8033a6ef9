"""The noise streams of a Chunked AR run: every chunk derives its own from the seed and its absolute index.

Independent streams of one chunk: its initial noise, the sampler's per-step noise, the context noise of its cache
write, and SkyReels' per-step redraws of the context. So runs are reproducible, no two chunks share noise, and a
chunk's noise does not depend on how long the video is or where a run started. No ComfyUI import here.
"""

from __future__ import annotations

_SEED_MASK = 0xFFFFFFFFFFFFFFFF
#: independent noise streams of one chunk (REDRAW_STREAM: the context noise SkyReels' mode redraws every step)
NOISE_STREAM, SAMPLER_STREAM, CONTEXT_STREAM, REDRAW_STREAM = 0, 1, 2, 3


def chunk_seed(seed: int, chunk: int, stream: int) -> int:
    """A 63-bit seed for noise stream ``stream`` of chunk ``chunk`` (SplitMix64 of the three; deterministic)."""
    x = (
        (int(seed) & _SEED_MASK)
        ^ ((int(chunk) + 1) * 0x9E3779B97F4A7C15 & _SEED_MASK)
        ^ (int(stream) + 1) * 0xD1B54A32D192ED03
    )
    x &= _SEED_MASK
    for _ in range(2):
        x = (x + 0x9E3779B97F4A7C15) & _SEED_MASK
        z = x
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _SEED_MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _SEED_MASK
        x = z ^ (z >> 31)
    return x & 0x7FFF_FFFF_FFFF_FFFF
