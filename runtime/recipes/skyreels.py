"""SkyReels-V2 DF's context noise (``addnoise_condition``), as an experimental causal variant: the cache is written
with the chunk noised to ``context_noise`` (not relabelled), and before every denoising call the cached chunks are
noised anew and re-written (``diffusion_forcing_pipeline.py`` 314-325 / 591-603).
"""

from __future__ import annotations

import torch

from ..noise import CONTEXT_STREAM, REDRAW_STREAM, chunk_seed
from ..observer import PHASE_DENOISE
from .base import ChunkStep
from .plain import SelfForcing

#: the key of the DIFFUSION_MODEL wrapper that redraws the context
SKYREELS_WRAPPER_KEY = "jensen_kv_skyreels_context"


class SkyReels(SelfForcing):
    """SkyReels-V2 DF's context noise (``context_noise_mode="skyreels"``). At context_noise 0 the writes see the clean
    chunk through the noising path and nothing is redrawn."""

    name = "skyreels"
    label = "SkyReels-V2 DF: the cache written noised to context_noise, redrawn with fresh noise every step"
    relabels = False

    def __init__(self, options, recache=None):
        super().__init__(options, recache)
        self.job = None
        self.redraw_noise: list[torch.Generator] = []  # per chunk and batch item, seeded from both (reproducible)
        self.step_noise: tuple[tuple[int, int], dict[int, torch.Tensor]] | None = None  # one step's redrawn noise
        self.redraws = 0

    @classmethod
    def check(cls, request) -> None:
        from ..shift_observer import get_request

        if request.recipe.skyreels_noise and get_request(getattr(request.model, "model_options", None)) is not None:
            raise ValueError(
                "KV Cache Diagnostics compares the cache with a full-precision copy of each written chunk, but "
                "context_noise_mode='skyreels' re-writes the cache with fresh noise at every step: remove KV Cache "
                "Diagnostics, or use context_noise_mode='relabel' (or context_noise 0)"
            )

    def install(self, job) -> None:
        """The redraw wrapper, outside the family's wrappers (added first), so its model calls go through them."""
        self.job = job
        if job.ctx_sigma > 0:
            import comfy.patcher_extension

            job.work.add_wrapper_with_key(
                comfy.patcher_extension.WrappersMP.DIFFUSION_MODEL, SKYREELS_WRAPPER_KEY, self.redraw_context
            )

    def remove(self, job) -> None:
        if job.ctx_sigma > 0:
            import comfy.patcher_extension

            job.work.remove_wrappers_with_key(comfy.patcher_extension.WrappersMP.DIFFUSION_MODEL, SKYREELS_WRAPPER_KEY)

    def before_chunk(self, job, step: ChunkStep) -> int:
        if job.ctx_sigma > 0:
            self.redraw_noise = self.redraw_generators(job, step.index)
        return super().before_chunk(job, step)

    def write_noise(self, job, index: int, clean: torch.Tensor) -> torch.Tensor:
        """The chunk's own context noise (its stream), which the write forward scales to context_noise."""
        if job.ctx_sigma > 0:
            import comfy.sample

            return comfy.sample.prepare_noise(
                clean, chunk_seed(job.request.sampling.seed, index, CONTEXT_STREAM), job.batch_inds
            )
        return torch.zeros_like(clean)

    def redraw_context(
        self, executor, x, timestep, context, clip_fea=None, time_dim_concat=None, transformer_options=None, **kwargs
    ):
        """Before every denoising call the context frames are noised anew, ``x * (1 - f) + randn * f`` with fresh
        noise, at t = f x 1000. Here the context is the cache, so every retained chunk is re-written that way (one
        chunk per forward, causally, under the chunk's prompt; the same noise for the cond and uncond slots)."""
        job = self.job
        run = job.run
        chunk, step, phase, _ = run.position
        if phase != PHASE_DENOISE or not run.timeline.items:
            return executor(x, timestep, context, clip_fea, time_dim_concat, transformer_options, **kwargs)
        labels = (transformer_options or {}).get("cond_or_uncond") or [0]
        slots, branches = len(labels), set(labels)  # ComfyUI may run cond and uncond in separate calls
        ms = job.work.get_model_object("model_sampling")
        t_ctx = ms.timestep(torch.full_like(timestep, job.ctx_sigma, dtype=torch.float32)).to(timestep.dtype)
        if self.step_noise is None or self.step_noise[0] != (chunk, step):
            self.step_noise = ((chunk, step), {})
        drawn = self.step_noise[1]

        def forward(kept) -> None:
            clean = job.work.model.process_latent_in(kept.latent).to(x.device, torch.float32)
            noise = drawn.get(kept.chunk)
            if noise is None:  # once per step: cond and uncond in separate calls see the same noise, as batched
                one = (1, *clean.shape[1:])
                noise = drawn[kept.chunk] = torch.cat([torch.randn(one, generator=g) for g in self.redraw_noise])
            noise = noise.to(x.device)
            noised = (clean * (1.0 - job.ctx_sigma) + noise * job.ctx_sigma).to(x.dtype)
            executor(
                noised.repeat(slots, 1, 1, 1, 1),
                t_ctx,
                context,
                clip_fea,
                time_dim_concat,
                transformer_options,
                **kwargs,
            )

        run.redraw(forward, branches)
        self.redraws += 1
        return executor(x, timestep, context, clip_fea, time_dim_concat, transformer_options, **kwargs)

    def redraw_generators(self, job, chunk_index: int) -> list[torch.Generator]:
        """The redraw noise of chunk ``chunk_index``: one generator per batch item, seeded from the chunk and the
        item's ``batch_index`` (index 0's is the chunk's stream itself), so an item's noise does not depend on the
        batch it runs in, as ComfyUI's noise of a LATENT with a batch_index does not."""
        seed = chunk_seed(job.request.sampling.seed, chunk_index, REDRAW_STREAM)
        inds = job.batch_inds if job.batch_inds is not None else range(job.out.shape[0])
        return [
            torch.Generator().manual_seed(seed if int(i) == 0 else chunk_seed(seed, int(i), REDRAW_STREAM))
            for i in inds
        ]

    def report(self) -> dict:
        return {**super().report(), "context_redraws": self.redraws}
