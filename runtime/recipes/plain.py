"""Self-Forcing / CausVid: every finished chunk written into the cache once, by one forward of the clean chunk
labelled with the context-noise timestep (``context_noise``, 0 = clean), as both references do; a prefix clip is
written first, chunk by chunk. On a prompt switch the retained chunks are re-cached under the new prompt by the
run's re-cache: LongLive's (:mod:`.longlive`, the default) or the pack's own causal one (:class:`CausalRecache`).

This is the base of the pack loop's other recipes (LongLive, SkyReels-V2 DF, Krea, Causal Forcing): it owns the
cache write (the model call, handed to :meth:`RunCaches.write` ready to run) and the prompt switch, so the loop
only walks the chunks.
"""

from __future__ import annotations

import functools
import logging

import torch

from ..noise import SAMPLER_STREAM, chunk_seed
from ..session import interrupted
from .base import ChunkStep, Recipe

logger = logging.getLogger("jensen_kv")


class CausalRecache:
    """The pack's own re-cache on a prompt switch (``recache_mode="causal"``), not LongLive's: every retained chunk,
    the sink included, re-written under the new prompt one chunk per forward, each attending to the ones re-written
    before it (block-causal, as the chunks were first written). LongLive keeps the old prompt's sink instead."""

    name = "causal"

    def __call__(self, recipe, job, step: ChunkStep, index: int) -> int:
        run = job.run
        kept = list(run.timeline.items)
        if not kept:
            return 0
        out = job.out
        passes = [(c, recipe.write_pass(job, c.chunk, c.latent.to(out.device, out.dtype), step.prompt)) for c in kept]
        n = run.rewrite(passes, check=interrupted)
        job.prompts_report[index]["recached_chunks"] += n
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

    # ------------------------------------------------------------------ hooks
    def prefill(self, job) -> None:
        """The prefix clip becomes the first chunks of the cache (a switch inside the clip re-caches, as in one run)."""
        s = job.setup
        for i, (f0, f1) in enumerate(s.prefix_bounds):
            prompt = s.schedule.at(i)
            self.switch_prompt(job, ChunkStep(i, i, f0, f1 - f0, prompt, s.schedule.fingerprint_at(i), False))
            self.write_chunk(job, i, f0, s.prefix_latent[:, :, f0:f1].to(job.out.dtype), prompt)

    def before_chunk(self, job, step: ChunkStep) -> int:
        """A prompt switch at this chunk re-caches first; the chunk is denoised at its own frame."""
        self.switch_prompt(job, step)
        return step.frame0

    def write(self, job, step: ChunkStep, clean) -> None:
        """The finished chunk into the cache; the run's last only when its state is handed on (nothing reads it)."""
        if not step.last or job.request.continuation.keep_state:
            self.write_chunk(job, step.index, step.frame0, clean, step.prompt)

    def on_prompt_switch(self, job, step: ChunkStep, index: int) -> int:
        return self.recache(self, job, step, index)

    # ------------------------------------------------------------------ the cache write
    def switch_prompt(self, job, step: ChunkStep) -> None:
        """``step`` (written or denoised next) is made under its prompt: on a switch, re-cache the retained chunks
        under it first (for a prefix clip's chunks as for generated ones, so a clip extended with a schedule holds
        what one run would)."""
        if job.active is not None and step.prompt_key != job.active and self.options.recache_on_switch:
            self.on_prompt_switch(job, step, job.setup.schedule.index_at(step.index))
        job.active = step.prompt_key

    def write_chunk(self, job, index: int, frame_offset: int, clean, prompt, record: bool = True) -> None:
        """One cache-writing pass of ``clean`` (LATENT frames of chunk ``index``) under ``prompt``."""
        interrupted()
        job.run.write(index, frame_offset, clean, self.write_pass(job, index, clean, prompt), record)

    def write_pass(self, job, index: int, clean: torch.Tensor, prompt):
        """The model call that writes ``clean`` (chunk ``index``) under ``prompt``, ready to run: ComfyUI's sampler with
        the loop's write sampler, from the context-noise level to 0, on this recipe's :meth:`write_noise`."""
        import comfy.sample

        r = job.request
        return functools.partial(
            comfy.sample.sample_custom,
            job.work,
            self.write_noise(job, index, clean),
            r.sampling.cfg,
            job.write_sampler,
            job.write_sigmas,
            prompt,
            r.negative,
            clean,
            disable_pbar=True,
            seed=chunk_seed(r.sampling.seed, index, SAMPLER_STREAM),
        )

    def write_noise(self, job, index: int, clean: torch.Tensor) -> torch.Tensor:
        """The noise of a cache-writing forward of chunk ``index``: none (the relabelled write sees the clean chunk)."""
        return torch.zeros_like(clean)

    def report(self) -> dict:
        return {"recipe": self.name, "recache_mode": self.recache.name}
