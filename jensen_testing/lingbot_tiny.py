"""Tiny random LingBot-World 2.0 checkpoints in the official key names, for tests (and the reference run that made
``tests/data/lingbot/``), and tiny runs of the pack's LingBot-World on them.

:func:`tiny_state_dict` draws every tensor from its own generator, seeded by the key's name and ``seed``, so the same
shape gives the same weights in any process (the reference's model and the pack's). Linear weights are normal with
std ``1 / sqrt(fan_in)``, modulations ``N(0, 1) / sqrt(dim)``, norm scales ``1 + 0.1 N(0, 1)``, biases ``0.1 N(0,
1)``: every path, the camera layers included, changes the output. That part is pure torch; the rest needs ComfyUI
imported in-process (``jensen_testing.comfyui.setup_inprocess_comfyui``) and the pack imported as ComfyUI does:

- :func:`build_patcher`: a ModelPatcher of the tiny model (float32, CPU), through the pack's loader;
- :func:`conditioning`, :func:`latent`, :func:`camera_path`: a prompt with WanImageToVideo's image condition, an
  empty LATENT, a camera path (a pose folder's arrays: video-frame poses and 480 x 832 intrinsics);
- :func:`sample`: the pack's recipe (LingBot-World AR Sampler's run);
- :func:`plain_rollout`: the family's plain forward: the reference's causal-fast loop through the model's own calls
  with the reference's full-precision rolling cache (``model.window.ReferenceKV``), what a full-precision pack run
  must equal.
"""

from __future__ import annotations

import math
import zlib

import torch

from runtime.families.lingbot.model.keys import LingBotShape, official_shapes

from .comfyui import pack_module

#: 2 blocks, width 64, 4 heads of 16 (RoPE 8 / 4 / 4), 36 input channels, 1536 camera features, text 32 x 16 tokens
TINY = LingBotShape(dim=64, ffn_dim=128, num_heads=4, num_layers=2, text_dim=32, text_len=16)
#: the tiny runs' latent size (8 x 8 latents: 64 x 64 video, 16 tokens per latent frame)
LATENT_HW = (8, 8)
TEXT_TOKENS = 7
#: the reference's example intrinsics (fx, fy, cx, cy for 480 x 832)
EXAMPLE_K = (502.9, 503.1, 415.8, 239.8)


def reference_bound():
    """The float32 rounding bound (:func:`jensen_testing.numerics.rounding_bound`) between the tiny model's outputs on
    two machines: its 2 blocks plus the model-level camera MLP and text embedding (4 stages), reductions up to 1536
    (the camera embedding's input), and the 256-wide timestep sinusoid of t <= 999."""
    from .numerics import rounding_bound

    return rounding_bound(TINY.num_layers + 2, 1536, sinusoid=(1000.0, 256))


def _tensor(name: str, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(zlib.crc32(name.encode()) ^ (seed * 0x9E3779B1 & 0xFFFFFFFF))
    x = torch.randn(shape, generator=g, dtype=torch.float32)
    leaf = name.rsplit(".", 1)[-1]
    if leaf == "bias":
        return 0.1 * x
    if leaf == "modulation":
        return x / math.sqrt(shape[-1])
    if len(shape) == 1:
        return 1 + 0.1 * x
    return x / math.sqrt(math.prod(shape[1:]))


def tiny_state_dict(shape: LingBotShape = TINY, seed: int = 0) -> dict:
    """Every tensor of a LingBot-World checkpoint of ``shape``, official names, deterministic in ``seed``."""
    return {name: _tensor(name, s, seed) for name, s in official_shapes(shape).items()}


def build_patcher(seed: int = 0, shape: LingBotShape = TINY):
    """A ModelPatcher of a tiny random LingBot-World (float32, CPU), loaded by the pack's loader."""
    cpu = torch.device("cpu")
    loader = pack_module("runtime.families.lingbot.loader")
    return loader.lingbot_from_state_dict(
        tiny_state_dict(shape, seed), "fp32", num_heads=shape.num_heads, text_len=shape.text_len,
        load_device=cpu, offload_device=cpu,
    )  # fmt: skip


def pose_arrays(video_frames: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A pose folder's arrays for ``video_frames`` frames (float32, as ``poses.npy`` / ``intrinsics.npy``): a camera
    that walks forward, drifts right, yaws and nods."""
    poses = torch.zeros(video_frames, 4, 4, dtype=torch.float64)
    for j in range(video_frames):
        yaw, pitch = 0.03 * j, 0.05 * math.sin(j / 6.0)
        cy, sy, cp, sp = math.cos(yaw), math.sin(yaw), math.cos(pitch), math.sin(pitch)
        ry = torch.tensor([[cy, 0, sy], [0, 1, 0], [-sy, 0, cy]], dtype=torch.float64)
        rx = torch.tensor([[1, 0, 0], [0, cp, -sp], [0, sp, cp]], dtype=torch.float64)
        poses[j, :3, :3] = ry @ rx
        poses[j, :3, 3] = torch.tensor([0.02 * j, 0.01 * math.sin(j / 4.0), 0.05 * j])
        poses[j, 3, 3] = 1.0
    k = torch.tensor([EXAMPLE_K] * video_frames, dtype=torch.float64)
    return poses.float(), k.float()


def camera_path(latents: int):
    """The camera path of :func:`pose_arrays` for a video of ``latents`` latent frames (``4 (latents - 1) + 1`` video
    frames, as the reference reads ``poses.npy``)."""
    camera = pack_module("runtime.families.lingbot.model.camera")
    poses, k = pose_arrays(4 * (latents - 1) + 1)
    return camera.path_from_arrays(poses, k, source="tiny poses")


def condition_inputs(seed: int, shape: LingBotShape = TINY, hw=LATENT_HW) -> dict:
    """Seeded tensors of one prompt: text features (7 tokens) and a start-image latent (ComfyUI's latent space)."""
    g = torch.Generator().manual_seed(2000 + seed)
    return {
        "text": torch.randn(1, TEXT_TOKENS, shape.text_dim, generator=g),
        "image": torch.randn(1, 16, 1, *hw, generator=g),
    }


def conditioning(seed: int, frames: int, shape: LingBotShape = TINY, hw=LATENT_HW) -> list:
    """One CONDITIONING entry as WanImageToVideo leaves it for a ``frames``-latent video: the start image's latent in
    frame 0 and zeros after it (``concat_latent_image``; WanImageToVideo encodes grey frames there, the tiny runs need
    no VAE), the mask 0 on frame 0 and 1 elsewhere (``concat_mask``)."""
    t = condition_inputs(seed, shape, hw)
    image = torch.zeros(1, 16, frames, *hw)
    image[:, :, :1] = t["image"]
    mask = torch.ones(1, 1, frames, *hw)
    mask[:, :, :1] = 0.0
    return [[t["text"], {"concat_latent_image": image, "concat_mask": mask}]]


def latent(frames: int, batch: int = 1, hw=LATENT_HW) -> dict:
    return {"samples": torch.zeros(batch, 16, frames, *hw)}


def sample(model, frames: int, *, seed: int = 7, cond_seed: int = 1, camera=None, **options):
    """The pack's LingBot-World run (what LingBot-World AR Sampler runs) of ``frames`` latent frames."""
    recipe = pack_module("runtime.families.lingbot.recipe")
    request = recipe.LingBotRequest.from_options(
        model,
        conditioning(cond_seed, frames),
        latent(frames),
        camera if camera is not None else camera_path(frames),
        seed,
        **options,
    )
    return recipe.run(request)


def plain_rollout(
    model,
    frames: int,
    *,
    seed: int = 7,
    cond_seed: int = 1,
    chunk_frames: int = 4,
    local_attn_size: int = 18,
    sink_size: int = 6,
    camera=None,
    model_space: bool = False,
):
    """The reference's causal-fast loop on the model's own calls, with the reference's frame-granular full-precision
    rolling cache (``ReferenceKV``) and the reference's noise stream (one CPU generator: the video's noise, then 3
    re-noise draws per chunk); no pack cache. Returns the LATENT's samples (``model_space``: before
    ``process_latent_out``, the reference's normalised latents)."""
    schedule = pack_module("runtime.families.lingbot.model.schedule")
    window = pack_module("runtime.families.lingbot.model.window")
    cam = pack_module("runtime.families.lingbot.model.camera")
    cm = pack_module("runtime.families.lingbot.comfy_model")
    base = model.model
    dm = base.diffusion_model
    ((text, opts),) = conditioning(cond_seed, frames)
    path = camera if camera is not None else camera_path(frames)
    cpu = torch.device("cpu")
    sched = schedule.dmd_schedule()
    hw = LATENT_HW
    with torch.no_grad():
        noise_like = torch.zeros(1, 16, frames, *hw)
        y = base.concat_cond(
            noise=noise_like,
            concat_latent_image=opts["concat_latent_image"],
            concat_mask=opts["concat_mask"],
            device=cpu,
        )
        cmap = cam.CameraMap(path, frames, *hw)
        per = (hw[0] // 2) * (hw[1] // 2)
        kv = window.ReferenceKV(local_attn_size, sink_size, per)
        g = torch.Generator().manual_seed(seed)
        noise = torch.randn(16, frames, *hw, generator=g).unsqueeze(0)
        out = torch.zeros_like(noise)

        def forward(x, t, f0, f1):
            call = cm.LingBotCall(attention=kv, frame_offset=f0, camera=cmap.tokens(f0, f1))
            return dm.forward_lingbot(torch.cat([x, y[:, :, f0:f1]], 1), torch.tensor([float(t)]), text, call).float()

        for c in range(frames // chunk_frames):
            f0, f1 = c * chunk_frames, (c + 1) * chunk_frames
            x = noise[:, :, f0:f1]
            kv.frame_offset, kv.writing = f0, False
            for i in range(sched.steps):
                x0 = sched.to_x0(i, x, forward(x, sched.timesteps[i], f0, f1))
                if i < sched.steps - 1:
                    x = sched.renoise(i + 1, x0, torch.randn(tuple(x0.shape[1:]), generator=g).unsqueeze(0))
            out[:, :, f0:f1] = x0
            kv.writing = True
            forward(x0, 0.0, f0, f1)
    return out if model_space else base.process_latent_out(out)


__all__ = [
    "LATENT_HW",
    "TINY",
    "build_patcher",
    "camera_path",
    "condition_inputs",
    "conditioning",
    "latent",
    "plain_rollout",
    "pose_arrays",
    "reference_bound",
    "sample",
    "tiny_state_dict",
]
