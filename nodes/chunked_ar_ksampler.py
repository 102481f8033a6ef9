"""Chunked AR Video Sampler (KSampler): the same sampler with KSampler-style steps / sampler / scheduler."""

from __future__ import annotations

import comfy.samplers
from comfy_api.latest import io

from .chunked_ar_sampler import (
    DESCRIPTION,
    cfg_input,
    common_head_inputs,
    common_tail_inputs,
    first_chunk_frames_input,
    hidden_inputs,
    outputs,
    sample_node,
)
from .common import CATEGORY, Combo, advanced, keeps_ui

#: Which settings of this node reproduce which reference (checked in tests/integration/test_nodes.py).
STEPS_TOOLTIP = (
    "Denoising steps per chunk. The defaults (lcm, simple, 4 steps) on a model with shift 5 (ModelSamplingSD3 "
    "shift 5) are Self-Forcing's and LongLive's schedule, t = 1000, 937.5, 833.3, 625; with ComfyUI's Wan "
    "default shift 8 they are CausVid's warp-4step config, t = 1000, 960, 888.9, 727.3. CausVid's released "
    "3-step checkpoint (t = 1000, 757, 522, no warp) and SkyReels-V2 DF's FlowUniPC are not reachable here: "
    "use the plain sampler with AR Video Schedule."
)


def ksampler_sigmas(model, steps: int, sampler_name: str, scheduler: str):
    """The sigmas KSampler would use (including its per-sampler adjustments), on the CPU."""
    ks = comfy.samplers.KSampler(
        model,
        steps=steps,
        device=model.load_device,
        sampler=sampler_name,
        scheduler=scheduler,
        denoise=1.0,
        model_options=model.model_options,
    )
    return ks.sigmas.cpu()


class JensenKVChunkedARKSampler(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="JensenKVChunkedARSamplerSimple",
            display_name="Chunked AR Video Sampler (KSampler)",
            category=CATEGORY,
            description=DESCRIPTION,
            inputs=[
                *common_head_inputs(),
                io.Int.Input(
                    "steps",
                    default=4,
                    min=1,
                    max=10000,
                    tooltip=STEPS_TOOLTIP,
                ),
                cfg_input(),
                Combo(
                    "sampler_name",
                    options=list(comfy.samplers.KSampler.SAMPLERS),
                    default="lcm",
                    tooltip="ComfyUI sampler used for every chunk; lcm (predict x0, then fresh noise) is what "
                    "Self-Forcing, LongLive and CausVid do between steps.",
                ),
                Combo(
                    "scheduler",
                    options=list(comfy.samplers.KSampler.SCHEDULERS),
                    default="simple",
                    tooltip="ComfyUI scheduler giving each chunk's sigmas (with the model's shift).",
                ),
                *common_tail_inputs(),
                advanced(
                    io.Int.Input(
                        "first_chunk_steps",
                        default=0,
                        min=0,
                        max=10000,
                        optional=True,
                        tooltip="Steps of the video's first chunk (the first one after a prefix); 0 = steps. Causal "
                        "Forcing++ 2-step / 1-step: 4 (its first frame's own 4 steps; with lcm, simple and shift 5 "
                        "these are its t = 1000, 937.5, 833.3, 625). A continued kv_cache run uses steps.",
                    )
                ),
                first_chunk_frames_input(),
            ],
            outputs=outputs(),
            hidden=hidden_inputs(),
            **keeps_ui(),  # the report comes back on a cached rerun, as ComfyUI keeps images
        )

    @classmethod
    def execute(
        cls, model, positive, negative, latent, seed, steps, cfg, sampler_name, scheduler, chunk_frames=3,
        window_chunks=0, context_noise=0.0, first_chunk_steps=0, **inputs,
    ) -> io.NodeOutput:  # fmt: skip
        sampling = dict(
            seed=seed,
            cfg=cfg,
            sampler=comfy.samplers.sampler_object(sampler_name),
            sigmas=ksampler_sigmas(model, steps, sampler_name, scheduler),
        )
        if first_chunk_steps:
            sampling["first_chunk_sigmas"] = ksampler_sigmas(model, first_chunk_steps, sampler_name, scheduler)
        tail = dict(chunk_frames=chunk_frames, window_chunks=window_chunks, context_noise=context_noise)
        return sample_node(cls, model, positive, negative, latent, {**sampling, **tail, **inputs})
