"""Tiny random HY-WorldPlay checkpoints in the official key names, for tests (and the reference run that made
``tests/data/worldplay/``), and tiny runs of the pack's WorldPlay on them.

:func:`tiny_state_dict` draws every tensor from its own generator, seeded by the key's name and ``seed``, so the
same shape gives the same weights in any process and in any module layout (the reference's model and the
pack's, which name and fuse them differently). Linear and convolution weights are normal with std
``1 / sqrt(fan_in)``, norm scales ``1 + 0.1 N(0, 1)``, biases and embeddings ``0.1 N(0, 1)``: every path,
the gates and the PRoPE projection included, changes the output. That part is pure torch (``runtime.families.worldplay.model.keys``
only); the rest needs ComfyUI imported in-process (``jensen_testing.comfyui.setup_inprocess_comfyui``) and the
pack imported as ComfyUI does (``import_pack``):

- :func:`build_patcher`: a ModelPatcher of the tiny model (float32, CPU), through the pack's loader;
- :func:`conditioning`, :func:`trajectory`, :func:`latent`: a prompt with its image condition (ByT5 and SigLIP
  features, a start-image latent in frame 0), a camera path of any multiple of 4 latents, an empty LATENT;
- :func:`sample`: the pack's recipe (HY-WorldPlay AR Sampler's run) on them;
- :func:`plain_rollout`: the family's plain forward: the reference's AR rollout through the model's own calls
  with the full-precision memory of ``runtime.families.worldplay.model.attention.ContextKV`` (text prefix once, the context re-encoded
  before every chunk at t = 14 with RoPE positions renumbered, 4 Euler steps), the reference a full-precision
  pack run must equal.
"""

from __future__ import annotations

import math
import zlib

import torch

from runtime.families.worldplay.model.keys import RELEASED, WorldPlayShape, official_shapes

from .comfyui import pack_module

#: 2 double blocks, width 64, 2 heads of 32 (RoPE 4 / 14 / 14), 32 latent channels, tiny text and SigLIP widths
TINY = WorldPlayShape(
    hidden_size=64,
    heads=2,
    depth=2,
    latent_channels=32,
    patch_size=(1, 1, 1),
    mlp_ratio=4.0,
    text_dim=32,
    vision_dim=16,
    byt5=True,
    cond_type_embedding=True,
)


#: the float32 rounding bound (:func:`jensen_testing.numerics.rounding_bound`) between the tiny model's outputs on two
#: machines (a stored reference's and this one's): its 2 double blocks and the text's 2-block token refiner, reductions
#: up to 256 (the 4x MLP of width 64; at most 200 keys), and the 256-wide timestep sinusoid of t <= 1000
def reference_bound():
    from .numerics import rounding_bound

    return rounding_bound(TINY.depth + 2, 256, sinusoid=(1000.0, 256))


#: the released key list (54 blocks, byt5, SigLIP) at a tiny width: the real names, small tensors
REAL_KEYS_SMALL = WorldPlayShape(
    hidden_size=32,
    heads=1,
    depth=RELEASED.depth,
    latent_channels=4,
    patch_size=(1, 1, 1),
    mlp_ratio=2.0,
    text_dim=8,
    vision_dim=8,
    byt5=True,
    cond_type_embedding=True,
)


def _tensor(name: str, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(zlib.crc32(name.encode()) ^ (seed * 0x9E3779B1 & 0xFFFFFFFF))
    x = torch.randn(shape, generator=g, dtype=torch.float32)
    leaf = name.rsplit(".", 1)[-1]
    if leaf == "bias" or name == "cond_type_embedding.weight":
        return 0.1 * x
    if len(shape) == 1:  # a norm's scale
        return 1 + 0.1 * x
    fan_in = math.prod(shape[1:])
    return x / math.sqrt(fan_in)


def tiny_state_dict(shape: WorldPlayShape = TINY, seed: int = 0, dtype: torch.dtype = torch.float32) -> dict:
    """Every tensor of a WorldPlay checkpoint of ``shape``, official names, deterministic in ``seed``."""
    return {name: _tensor(name, s, seed).to(dtype) for name, s in official_shapes(shape).items()}


# ------------------------------------------------------------------------------------------------ tiny runs
#: the tiny runs' latent size (height x width in latents: 24 tokens per latent frame at patch 1)
LATENT_HW = (4, 6)
#: the pose commands :func:`trajectory` cycles through, 4 latent frames each (a path that turns and comes back)
_POSES = ("w", "right", "a", "left", "s", "up", "d", "down")


def build_patcher(seed: int = 0, shape: WorldPlayShape = TINY):
    """A ModelPatcher of a tiny random HY-WorldPlay (float32, CPU), loaded by the pack's loader."""
    cpu = torch.device("cpu")
    loader = pack_module("runtime.families.worldplay.loader")
    return loader.worldplay_from_state_dict(tiny_state_dict(shape, seed), load_device=cpu, offload_device=cpu)


def trajectory(latents: int):
    """A camera path of ``latents`` poses (a multiple of 4): forward, yaw right, left, yaw left, back, ... 4 each."""
    if latents < 4 or latents % 4:
        raise ValueError(f"latents={latents} must be a multiple of 4")
    parts = [f"{_POSES[i % len(_POSES)]}-{3 if i == 0 else 4}" for i in range(latents // 4)]
    return pack_module("runtime.families.worldplay.model.trajectory").parse_trajectory(", ".join(parts))


class VisionOutput:
    """What ComfyUI's CLIPVisionEncode gives HunyuanVideo15ImageToVideo (the model reads ``last_hidden_state``)."""

    def __init__(self, last_hidden_state: torch.Tensor):
        self.last_hidden_state = last_hidden_state

    def __getitem__(self, key):
        return getattr(self, key)


def condition_inputs(seed: int, shape: WorldPlayShape = TINY, hw: tuple[int, int] = LATENT_HW) -> dict:
    """Seeded tensors of one prompt: LLM text (7 tokens), ByT5 (3), SigLIP (5) features and a start-image latent."""
    from runtime.families.worldplay.model.keys import BYT5_IN

    g = torch.Generator().manual_seed(1000 + seed)
    return {
        "text": torch.randn(1, 7, shape.text_dim, generator=g),
        "byt5": torch.randn(1, 3, BYT5_IN, generator=g),
        "vision": torch.randn(1, 5, shape.vision_dim, generator=g),
        "image": torch.randn(1, shape.latent_channels, 1, *hw, generator=g),
    }


def conditioning(seed: int, frames: int, shape: WorldPlayShape = TINY, hw: tuple[int, int] = LATENT_HW) -> list:
    """One CONDITIONING entry as HunyuanVideo15ImageToVideo leaves it for a ``frames``-latent video: the start image's
    latent in frame 0 (``concat_latent_image``), the mask 0 there and 1 elsewhere (``concat_mask``), ByT5 and SigLIP
    features (``conditioning_byt5small``, ``clip_vision_output``)."""
    t = condition_inputs(seed, shape, hw)
    image = torch.zeros(1, shape.latent_channels, frames, *hw)
    image[:, :, :1] = t["image"]
    mask = torch.ones(1, 1, frames, *hw)
    mask[:, :, :1] = 0.0
    return [
        [
            t["text"],
            {
                "conditioning_byt5small": t["byt5"],
                "clip_vision_output": VisionOutput(t["vision"]),
                "concat_latent_image": image,
                "concat_mask": mask,
                "pooled_output": None,
            },
        ]
    ]


def latent(frames: int, batch: int = 1, shape: WorldPlayShape = TINY, hw: tuple[int, int] = LATENT_HW) -> dict:
    return {"samples": torch.zeros(batch, shape.latent_channels, frames, *hw)}


def video_noise(frames: int, seed: int, shape: WorldPlayShape = TINY, hw: tuple[int, int] = LATENT_HW):
    return torch.randn(1, shape.latent_channels, frames, *hw, generator=torch.Generator().manual_seed(seed))


def worldplay_sigmas() -> torch.Tensor:
    return pack_module("runtime.schedules").ar_sigmas("worldplay_4step")


def sample(
    model,
    frames: int,
    *,
    seed: int = 7,
    cond_seed: int = 1,
    noise=None,
    sampler=None,
    path=None,
    hw=LATENT_HW,
    **options,
):
    """The pack's HY-WorldPlay run (the recipe HY-WorldPlay AR Sampler runs) of ``frames`` latent frames, on the camera
    path ``path`` (default :func:`trajectory`) and a latent of ``hw``."""
    import comfy.samplers

    recipe = pack_module("runtime.families.worldplay.recipe")
    sigmas = options.pop("sigmas", None)
    request = recipe.WorldPlayRequest.from_options(
        model,
        conditioning(cond_seed, frames, hw=hw),
        latent(frames, hw=hw),
        trajectory(frames) if path is None else path,
        seed,
        sampler if sampler is not None else comfy.samplers.sampler_object("euler"),
        worldplay_sigmas() if sigmas is None else sigmas,
        noise=noise,
        **options,
    )
    return recipe.run(request)


def plain_rollout(
    model, frames: int, noise: torch.Tensor, *, seed: int = 7, cond_seed: int = 1, sigmas=None, path=None, contexts=None
):
    """The family's plain forward: the reference's AR rollout on the model's own calls, full precision
    (``ContextKV``), from the video's initial ``noise``; returns the LATENT's samples (ComfyUI's latent space, as
    a sampler returns them). The context points are drawn from ``seed``, as the pack's run draws them; ``contexts``
    (each chunk's context frames, e.g. from a selection written in a test) replaces the pack's selection, and
    ``path`` the default camera path."""
    attention = pack_module("runtime.families.worldplay.model.attention")
    context = pack_module("runtime.families.worldplay.model.context")
    model_mod = pack_module("runtime.families.worldplay.comfy_model")
    sigmas = worldplay_sigmas() if sigmas is None else sigmas
    base = model.model
    dm = base.diffusion_model
    ((text, opts),) = conditioning(cond_seed, frames)
    vision = opts["clip_vision_output"].last_hidden_state
    traj = trajectory(frames) if path is None else path
    cpu = torch.device("cpu")
    with torch.no_grad():
        prefix = dm.text_prefix(text, None, opts["conditioning_byt5small"], vision)
        latents = noise.clone().float()
        memory = attention.ContextKV()
        points = context.sphere_points(seed=seed)

        def forward(x, t: float, frames_, positions, timesteps=None):
            cond = base.concat_cond(
                noise=x,
                concat_latent_image=opts["concat_latent_image"],
                concat_mask=opts["concat_mask"],
                worldplay_frames=tuple(frames_),
                device=cpu,
            )
            call = model_mod.WorldPlayCall(
                attention=memory, positions=list(positions), text_prefix=prefix, frames=frames_, timesteps=timesteps
            )
            return dm(
                torch.cat([x, cond], dim=1),
                torch.tensor([t]),
                text,
                transformer_options={model_mod.CALL_KEY: call},
                worldplay_trajectory=traj,
            )

        for c in range(frames // 4):
            plan = context.plan_chunk(traj.w2c[:frames], c, points)
            if contexts is not None:
                plan = context.ContextPlan(c, plan.chunk_frames, tuple(contexts[c]))
            memory.clear()
            if plan.context_frames:
                memory.mode = "write"
                ctx = list(plan.context_frames)
                forward(
                    latents[:, :, ctx],
                    plan.context_timestep,
                    plan.context_frames,
                    plan.context_positions,
                    timesteps=torch.full((1,), plan.context_timestep),
                )
            memory.mode = "read"
            own = list(plan.chunk_frames)
            x = latents[:, :, own]
            for i in range(sigmas.numel() - 1):
                v = forward(x, 1000 * float(sigmas[i]), plan.chunk_frames, plan.chunk_positions)
                x = x + (sigmas[i + 1] - sigmas[i]) * v
            latents[:, :, own] = x
    return base.process_latent_out(latents)


__all__ = [
    "LATENT_HW",
    "REAL_KEYS_SMALL",
    "TINY",
    "VisionOutput",
    "build_patcher",
    "condition_inputs",
    "conditioning",
    "latent",
    "pack_module",
    "plain_rollout",
    "sample",
    "tiny_state_dict",
    "trajectory",
    "video_noise",
    "worldplay_sigmas",
]
