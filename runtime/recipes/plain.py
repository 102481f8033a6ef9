"""Self-Forcing / CausVid: every finished chunk written into the cache once, by one forward of the clean chunk
labelled with the context-noise timestep (``context_noise``, 0 = clean), as both references do; a prefix clip is
written first, chunk by chunk. On a prompt switch the retained chunks are re-cached under the new prompt by the
run's re-cache: LongLive's (:mod:`.longlive`, the default) or the pack's own causal one (:class:`CausalRecache`).

This is the base of the pack loop's other recipes (LongLive, SkyReels-V2 DF, Krea, Causal Forcing).
"""

from __future__ import annotations

import logging

import torch

from .base import ChunkStep, Recipe

logger = logging.getLogger("jensen_kv")


class CausalRecache:
    """The pack's own re-cache on a prompt switch (``recache_mode="causal"``), not LongLive's: every retained chunk,
    the sink included, re-written under the new prompt one chunk per forward, each attending to the ones re-written
    before it (block-causal, as the chunks were first written). LongLive keeps the old prompt's sink instead."""

    name = "causal"

    def __call__(self, job, step: ChunkStep, index: int) -> int:
        kept = list(job.run.timeline.items)
        if not kept:
            return 0
        n = job.run.rewrite(kept, lambda c: job.write_again(c, step.prompt))
        job.count_recached(index, n)
        prompt = job.setup.schedule.prompts[index]
        logger.info(
            "jensen_kv: prompt %r from chunk %d: causal re-cache (the pack's own, not LongLive's) of %d chunk(s)",
            prompt.label,
            prompt.start_chunk,
            n,
        )
        return n


class SelfForcing(Recipe):
    """Self-Forcing / CausVid (the plain recipe)."""

    name = "plain"
    label = "Self-Forcing / CausVid: each finished chunk written once, relabelled at the context noise"
    #: the cache-writing forward shows the model the clean chunk with the context-noise timestep (Self-Forcing,
    #: CausVid, LongLive); False: the chunk as noised to that level (SkyReels-V2 DF)
    relabels = True

    def __init__(self, options, recache=None):
        self.options = options
        self.recache = recache if recache is not None else CausalRecache()

    def planned_window(self, chunking) -> int:
        """The window (in chunks) the planner counts for this recipe's cache."""
        return chunking.window_chunks

    def prefill(self, job) -> None:
        """The prefix clip becomes the first chunks of the cache (a switch inside the clip re-caches, as in one run)."""
        s = job.setup
        for i, (f0, f1) in enumerate(s.prefix_bounds):
            prompt = s.schedule.at(i)
            job.switch_prompt(i, f0, prompt, s.schedule.fingerprint_at(i))
            job.write(i, f0, s.prefix_latent[:, :, f0:f1].to(job.out.dtype), prompt)

    def write(self, job, step: ChunkStep, clean) -> None:
        """The finished chunk into the cache; the run's last only when its state is handed on (nothing reads it)."""
        if not step.last or job.request.continuation.keep_state:
            job.write(step.index, step.frame0, clean, step.prompt)

    def write_noise(self, job, index: int, clean: torch.Tensor) -> torch.Tensor:
        """The noise of a cache-writing forward of chunk ``index``: none (the relabelled write sees the clean chunk)."""
        return torch.zeros_like(clean)

    def on_prompt_switch(self, job, step: ChunkStep, index: int) -> int:
        return self.recache(job, step, index)

    def report(self) -> dict:
        return {"recipe": self.name, "recache_mode": self.recache.name}
