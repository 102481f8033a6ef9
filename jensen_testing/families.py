"""One tiny model per model family, for the family conformance suite (``tests/families/``).

Every family in ``runtime.families.FAMILIES`` needs an entry in :data:`TINY` (keyed by ``ModelFamily.key``): how to
build a tiny random model of it from ComfyUI's own classes, its latents and conditioning, a few-step schedule, a
model of the family the pack refuses (with the words the refusal must contain) and the family's own block-causal
forward, the reference a full-precision cached run must equal. A new family passes the suite by adding its room
and its entry here, nothing else.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from . import causal_wan, reference, wan_tiny


@dataclass(frozen=True)
class TinyFamily:
    key: str  # runtime.families.ModelFamily.key
    build: Callable[[int], Any]  # seed -> a ModelPatcher of a tiny random model (fp32, CPU)
    latent: Callable[[int, int], dict]  # (latent frames, batch) -> an empty LATENT
    conditioning: Callable[[int], list]  # seed -> a CONDITIONING
    sigmas: Callable[[Any], torch.Tensor]  # model -> a few-step SIGMAS
    chunk_frames: int
    # the family's own block-causal forward: (model, cached calls, this call) -> the output this call must give,
    # each call as recorded by :class:`reference.DiffusionModelRecorder` (a cached call: its chunk's write pass)
    block_causal: Callable[[Any, list[dict], dict], torch.Tensor]
    # a model of this family that the pack refuses, and words its refusal names
    refused: Callable[[], Any]
    refusal_words: tuple[str, ...]
    # core's AR path (v0.27+), where the family has one: seed -> a causal ModelPatcher, and core's own sampling
    build_causal: Callable[[int], Any] | None = None
    sample_core: Callable[..., torch.Tensor] | None = None
    core_sigmas: Callable[[], torch.Tensor] | None = None  # the schedule core's sampler runs in the suite
    run_options: dict = field(default_factory=dict)  # extra options of run_chunked_ar for this family


# --------------------------------------------------------------------------------------------------- Wan 2.1
def _wan_latent(frames: int, batch: int = 1) -> dict:
    return wan_tiny.video_latent(frames, batch=batch)


def _wan_conditioning(seed: int) -> list:
    return wan_tiny.conditioning(seed, 13, wan_tiny.TINY["text_dim"])  # 13 text tokens: never a frame's 16


def _wan_sigmas(model) -> torch.Tensor:
    import comfy.samplers

    return comfy.samplers.calculate_sigmas(model.get_model_object("model_sampling"), "simple", 2)


def _wan_block_causal(model, cached: list[dict], call: dict) -> torch.Tensor:
    dm = model.model.diffusion_model
    frames = [c["x"] for c in cached] + [call["x"]]
    ts = [torch.zeros_like(call["t"]) for _ in cached] + [call["t"]]
    out = reference.block_causal_forward(dm, frames, ts, call["context"])
    return out[:, :, sum(c["x"].shape[2] for c in cached) :]


def _wan_refused():
    """A Wan whose diffusion model says it is image-to-video: the family applies and refuses it."""
    m = wan_tiny.build_patcher(seed=0)
    m.model.diffusion_model.model_type = "i2v"
    return m


TINY: dict[str, TinyFamily] = {
    "wan": TinyFamily(
        key="wan",
        build=lambda seed: wan_tiny.build_patcher(seed=seed),
        latent=_wan_latent,
        conditioning=_wan_conditioning,
        sigmas=_wan_sigmas,
        chunk_frames=2,
        block_causal=_wan_block_causal,
        refused=_wan_refused,
        refusal_words=("image-to-video", "model_type 'i2v'", "Wan 2.1 text-to-video"),
        build_causal=lambda seed: causal_wan.build_causal_patcher(seed=seed),
        sample_core=causal_wan.sample_core,
        core_sigmas=causal_wan.self_forcing_sigmas,
    ),
}
