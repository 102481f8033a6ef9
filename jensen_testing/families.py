"""One tiny model per model family, for the family conformance suite (``tests/families/``).

Every registered family (``runtime.families.FAMILIES``) needs an entry in :data:`TINY` (keyed by ``ModelFamily.key``): how to
build a tiny random model of it from ComfyUI's own classes, its latents and conditioning, a few-step schedule, a
model of the family the pack refuses (with the words the refusal must contain) and the family's own block-causal
forward, the reference a full-precision cached run must equal. A new family passes the suite by adding its room
and its entry here, nothing else.

A family whose recipe owns its loop (HY-WorldPlay's context rebuild, MAGI-1's multi-noise pipeline) gives its run
function (``sample``) instead of the Chunked AR loop, its own full-precision reference (``reference``, with the
bound of that equality), the options of the suite its loop refuses (with the words its refusal names: the suite
checks the refusal instead of the run) and the markers its tests need (``marks``: a family built on a part of newer
ComfyUI is deselected on an older one, never skipped).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from . import causal_wan, lingbot_tiny, magi1_tiny, reference, wan_tiny, worldplay_tiny
from .comfyui import pack_module


@dataclass(frozen=True)
class TinyFamily:
    key: str  # runtime.families.ModelFamily.key
    build: Callable[[int], Any]  # seed -> a ModelPatcher of a tiny random model (fp32, CPU)
    latent: Callable[[int, int], dict]  # (latent frames, batch) -> an empty LATENT
    conditioning: Callable[[int], list]  # seed -> a CONDITIONING
    sigmas: Callable[[Any], torch.Tensor] | None  # model -> a few-step SIGMAS (None: the family's loop has its own)
    chunk_frames: int
    # the family's own block-causal forward: (model, cached calls, this call) -> the output this call must give,
    # each call as recorded by :class:`reference.DiffusionModelRecorder` (a cached call: its chunk's write pass)
    # (None for a family with its own ``reference``)
    block_causal: Callable[[Any, list[dict], dict], torch.Tensor] | None
    # a model of this family that the pack refuses, and words its refusal names
    refused: Callable[[], Any]
    refusal_words: tuple[str, ...]
    # core's AR path (v0.27+), where the family has one: seed -> a causal ModelPatcher, and core's own sampling
    build_causal: Callable[[int], Any] | None = None
    sample_core: Callable[..., torch.Tensor] | None = None
    core_sigmas: Callable[[], torch.Tensor] | None = None  # the schedule core's sampler runs in the suite
    run_options: dict = field(default_factory=dict)  # extra options of run_chunked_ar for this family
    # a recipe that owns its loop: (model, conditioning(1), latent(frames), *, seed, cfg, sampler, sigmas, observer,
    # **options) -> a result with .samples and .report, instead of run_chunked_ar
    sample: Callable[..., Any] | None = None
    # its full-precision reference: (model, frames, cfg) -> the samples a full-precision run of ``sample`` must equal
    # (at cfg 1, and at cfg 3 unless the family refuses it), within ``reference_tolerance`` of its largest value
    reference: Callable[[Any, int, float], torch.Tensor] | None = None
    reference_tolerance: float = 1e-5
    # options of the suite the family's loop refuses (name -> words its refusal names)
    refused_options: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # pytest markers of this family's tests (e.g. "hunyuan15": deselected where ComfyUI lacks HunyuanVideo 1.5)
    marks: tuple[str, ...] = ()


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


# --------------------------------------------------------------------------------------------------- HY-WorldPlay
#: the suite's video noise for HY-WorldPlay's runs and its reference (the same noise for both)
WORLDPLAY_NOISE_SEED = 11


def _wp_frames(frames: int) -> int:
    """HY-WorldPlay's chunks are always 4 latent frames: the suite's frame counts, rounded up to whole chunks."""
    return 4 * -(-frames // 4)


def _wp_latent(frames: int, batch: int = 1) -> dict:
    return worldplay_tiny.latent(_wp_frames(frames), batch)


def _wp_conditioning(seed: int) -> list:
    # the image condition is cut to each call's frames, so one of the longest video the suite makes serves every run
    return worldplay_tiny.conditioning(seed, 32)


def _wp_sample(model, positive, latent, *, seed, cfg, sampler, sigmas, observer=None, **options):
    frames = latent["samples"].shape[2]
    recipe = pack_module("runtime.families.worldplay.recipe")
    request = recipe.WorldPlayRequest.from_options(
        model,
        positive,
        latent,
        worldplay_tiny.trajectory(frames),
        seed,
        sampler,
        sigmas,
        cfg=cfg,
        noise=worldplay_tiny.video_noise(frames, WORLDPLAY_NOISE_SEED),
        observer=observer,
        **options,
    )
    return recipe.run(request)


def _wp_reference(model, frames: int, cfg: float = 1.0) -> torch.Tensor:
    n = _wp_frames(frames)
    return worldplay_tiny.plain_rollout(model, n, worldplay_tiny.video_noise(n, WORLDPLAY_NOISE_SEED), seed=7)


def _wp_refused():
    """Plain HunyuanVideo 1.5 of the tiny shape (core's classes, e.g. HY-WorldPlay's file through UNETLoader): the
    family applies (the HunyuanVideo 1.5 lineage) and refuses it, naming Load HY-WorldPlay."""
    import comfy.model_patcher
    import comfy.supported_models

    config = comfy.supported_models.HunyuanVideo15(worldplay_tiny.TINY.core_config())
    config.set_inference_dtype(torch.float32, None)
    cpu = torch.device("cpu")
    return comfy.model_patcher.ModelPatcher(config.get_model({}), load_device=cpu, offload_device=cpu)


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
    "worldplay": TinyFamily(
        key="worldplay",
        build=lambda seed: worldplay_tiny.build_patcher(seed=seed),
        latent=_wp_latent,
        conditioning=_wp_conditioning,
        sigmas=lambda model: worldplay_tiny.worldplay_sigmas(),
        chunk_frames=4,
        block_causal=None,
        refused=_wp_refused,
        refusal_words=("plain HunyuanVideo 1.5", "Load HY-WorldPlay", "HunyuanVideo15"),
        sample=_wp_sample,
        reference=_wp_reference,
        refused_options={
            "window_chunks": ("does not apply", "set both to 0"),
            "sink_chunks": ("does not apply", "set both to 0"),
            "cfg": ("cfg 1",),
            "keep_state": ("no cache to hand on",),
            "resume": ("no cache to hand on",),
        },
        marks=("hunyuan15",),
    ),
}


# --------------------------------------------------------------------------------------------------- MAGI-1
#: the tiny MAGI-1 runs: chunks of 1 latent frame (16 tokens of 8 x 8 latents), 8 steps (the pipeline's window 4
#: and its 4 stages of key ranges both divide them)
MAGI1_CHUNK, MAGI1_STEPS = 1, 8
#: q and k norms' gain of the suite's tiny MAGI-1: scores spread with a standard deviation of ~1 and INT2's noise in
#: them of ~0.35, where the second-order correction holds (measured ΔP_S 0.014 -> 0.0005 with taylor). At gain 1
#: (scores ~4, noise ~1.4) the correction overshoots: 0.078 -> -0.034 (exact: -0.033), tests/test_magi1_cache.py.
MAGI1_QK_GAIN = 0.5


def _magi1_recipe():
    import importlib

    from .comfyui import PACK_MODULE

    return importlib.import_module(f"{PACK_MODULE}.runtime.families.magi1.recipe")


def _magi1_latent(frames: int, batch: int = 1) -> dict:
    return {"samples": torch.zeros(batch, 16, frames, 8, 8)}


def _magi1_sample(model, positive, latent, *, seed, cfg, observer=None, **options):
    """A run of the MAGI-1 AR Sampler's recipe (cfg 1 or 3 is the number of passes)."""
    recipe = _magi1_recipe()
    s = latent["samples"]
    request = recipe.Magi1Request.from_options(
        model,
        positive,
        latent_frames=s.shape[2],
        latent_height=s.shape[3],
        latent_width=s.shape[4],
        seed=seed,
        cfg_number=int(round(cfg)),
        chunk_frames=MAGI1_CHUNK,
        observer=observer,
        **{"num_steps": MAGI1_STEPS, "progress": False, **options},
    )
    return recipe.run(request)


def _magi1_reference(model, frames: int, cfg: float, *, seed=7, num_steps=MAGI1_STEPS, window_size=4):
    """The reference's pipeline (runtime.families.magi1.model.sampler, which matches Sand AI's own outputs: tests/test_magi1_model.py) with
    its whole-history full-precision buffer (runtime.families.magi1.model.attention.FullPrecisionKV), on the same model, noise and captions."""
    from runtime.families.magi1.model.caption import chunk_captions
    from runtime.families.magi1.model.sampler import MagiSettings, sample

    dm = model.model.diffusion_model
    positive = _magi1_conditioning(1)
    s = _magi1_latent(frames)["samples"]
    chunks = s.shape[2] // MAGI1_CHUNK
    special = {k: v.float() for k, v in dm.special_tokens.items()}
    captions = chunk_captions(positive[0][0][0], chunks, special)
    noise = torch.randn(tuple(s.shape), generator=torch.Generator().manual_seed(seed))
    settings = MagiSettings(
        num_steps=num_steps,
        window_size=window_size,
        chunk_width=MAGI1_CHUNK,
        cfg_number=int(round(cfg)),
        distill=dm.config.distill,
    )
    return model.model.process_latent_out(sample(dm, noise, captions, settings))


def _magi1_conditioning(seed: int) -> list:
    return magi1_tiny.conditioning(seed, tokens=7 + seed % 3)


def _magi1_refused():
    """A MAGI-1 whose DiT patches two latent frames per token: the family applies and refuses it."""
    from dataclasses import replace

    m = magi1_tiny.build_patcher(seed=0, qk_gain=MAGI1_QK_GAIN)
    dm = m.model.diffusion_model
    dm.config = replace(dm.config, t_patch_size=2)
    return m


TINY["magi1"] = TinyFamily(
    key="magi1",
    build=lambda seed: magi1_tiny.build_patcher(seed=seed, qk_gain=MAGI1_QK_GAIN),
    latent=_magi1_latent,
    conditioning=_magi1_conditioning,
    sigmas=None,
    block_causal=None,
    chunk_frames=MAGI1_CHUNK,
    refused=_magi1_refused,
    refusal_words=("t_patch_size 2", "MAGI-1 text-to-video"),
    sample=_magi1_sample,
    reference=_magi1_reference,
    # the equality's bound: measured 2.8e-7 (cfg 1) and 3.8e-7 (cfg 3) of the largest value, with one CPU thread or two (1.3e-6 and 1.4e-6
    # at qk_gain 1): the cache's log-sum-exp merge sums in another order than one SDPA over the whole buffer
    reference_tolerance=1e-5,
    refused_options={
        "keep_state": ("does not save or continue",),
        "resume": ("does not save or continue",),
    },
)


# --------------------------------------------------------------------------------------------------- LingBot-World
def _lb_frames(frames: int) -> int:
    """LingBot-World's suite runs use chunks of 4 latent frames: the suite's frame counts, rounded up to whole chunks."""
    return 4 * -(-frames // 4)


def _lb_sample(model, positive, latent, *, seed, cfg, observer=None, **options):
    recipe = pack_module("runtime.families.lingbot.recipe")
    frames = latent["samples"].shape[2]
    request = recipe.LingBotRequest.from_options(
        model, positive, latent, lingbot_tiny.camera_path(frames), seed, cfg=cfg, observer=observer, **options
    )
    return recipe.run(request)


def _lb_reference(model, frames: int, cfg: float = 1.0) -> torch.Tensor:
    """The reference's causal-fast loop with its own frame-granular full-precision rolling cache (window 18, sink 6),
    the same noise stream, image condition and camera (jensen_testing.lingbot_tiny.plain_rollout)."""
    return lingbot_tiny.plain_rollout(model, _lb_frames(frames), seed=7, cond_seed=1)


def _lb_refused():
    """A LingBot model with 1.0 Fast's action-variant camera input (7 channels: 1792 features per token): the family
    applies and refuses it."""
    from dataclasses import replace

    return lingbot_tiny.build_patcher(0, replace(lingbot_tiny.TINY, camera_in=1792))


TINY["lingbot"] = TinyFamily(
    key="lingbot",
    build=lambda seed: lingbot_tiny.build_patcher(seed=seed),
    latent=lambda frames, batch=1: lingbot_tiny.latent(_lb_frames(frames), batch),
    # the image condition is cut to the run's frames, so one of the longest video the suite makes serves every run
    conditioning=lambda seed: lingbot_tiny.conditioning(seed, 32),
    sigmas=None,
    chunk_frames=4,
    block_causal=None,
    refused=_lb_refused,
    refusal_words=("1792", "action variant", "LingBot-World 2.0"),
    sample=_lb_sample,
    reference=_lb_reference,
    # measured 2e-7 of the largest value: the cache's log-sum-exp merge sums in another order than one SDPA
    reference_tolerance=1e-5,
    refused_options={
        "window_chunks": ("local_attn_size", "sink_size"),
        "sink_chunks": ("local_attn_size", "sink_size"),
        "cfg": ("cfg 1",),
        "keep_state": ("no cache to hand on",),
        "resume": ("no cache to hand on",),
    },
)
