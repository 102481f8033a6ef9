"""The pack's trained tiny AR model (models/tiny_ar) in tests and benchmarks: loading, sampling settings,
held-out videos, and the cache-dependence measurement.

Needs ComfyUI importable in-process (``jensen_testing.comfyui.setup_inprocess_comfyui()`` first).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import torch

from .comfyui import PACK_ROOT

MODEL_FILE = "jensen-kv-tiny-ar.safetensors"
MODEL_PATH = PACK_ROOT / "models" / "tiny_ar" / MODEL_FILE
#: the successor, fine-tuned on its own rollouts (tools/train_tiny_ar.py --self-forcing; models/tiny_ar/MODEL_CARD.md)
MODEL_V2_FILE = "jensen-kv-tiny-ar-v2.safetensors"
MODEL_V2_PATH = PACK_ROOT / "models" / "tiny_ar" / MODEL_V2_FILE
#: the model the CPU demo workflow and the README picture use
DEMO_MODEL_FILE = MODEL_FILE
DEMO_MODEL_PATH = PACK_ROOT / "models" / "tiny_ar" / DEMO_MODEL_FILE
DECODER_FILE = "jensen-kv-tiny-decoder.safetensors"
DECODER_PATH = PACK_ROOT / "models" / "tiny_decoder" / DECODER_FILE
CHUNK_FRAMES = 3
WINDOW_CHUNKS = 3  # the training mask's window: rollouts use the same
LATENT_HW = 16
#: sampling settings of the demo workflow and the rollout benchmark
SHIFT = 3.0
STEPS = 8
SAMPLER = "euler"
HELD_OUT_SEED0 = 1_000_000  # training videos use seeds below this


def core():
    import importlib

    from .comfyui import import_pack

    import_pack()
    return importlib.import_module("comfyui_jensen_kv.jensen_core.toy_video")


def load_model(path: Path | str = MODEL_PATH, shift: float = SHIFT):
    """A ModelPatcher of the tiny model with flow-matching sampling at ``shift`` (as ModelSamplingSD3 does)."""
    import comfy.model_sampling
    import comfy.sd

    if not Path(path).is_file():
        raise FileNotFoundError(
            f"{path} is missing: the tiny AR model is committed under models/tiny_ar "
            "(or train it: python tools/train_tiny_ar.py)"
        )
    model = comfy.sd.load_diffusion_model(str(path))

    class ModelSamplingAdvanced(comfy.model_sampling.ModelSamplingDiscreteFlow, comfy.model_sampling.CONST):
        pass

    ms = ModelSamplingAdvanced(model.model.model_config)
    ms.set_parameters(shift=shift, multiplier=1000)
    model.add_object_patch("model_sampling", ms)
    return model


def sigmas(model, steps: int = STEPS) -> torch.Tensor:
    import comfy.samplers

    return comfy.samplers.calculate_sigmas(model.get_model_object("model_sampling"), "simple", steps).cpu()


def conditioning(prompt: int):
    tv = core()
    return [[tv.prompt_embedding(prompt), {}]]


def held_out(n: int) -> list[tuple[int, int]]:
    """(prompt, video seed) pairs of held-out videos, cycling through the prompts."""
    tv = core()
    return [(i % len(tv.PROMPTS), HELD_OUT_SEED0 + i) for i in range(n)]


@torch.no_grad()
def next_chunk_losses(
    model,
    videos: list[tuple[int, int]],
    context_videos: list[tuple[int, int]],
    sigmas_: tuple[float, ...] = (0.25, 0.5, 0.75),
    window: int = WINDOW_CHUNKS,
    noise_seed: int = 0,
) -> torch.Tensor:
    """Flow-matching loss of chunk ``window`` of each video, given the first ``window`` chunks of its context video.

    One block-causal forward per (video, sigma): the context chunks clean at t = 0 (what the cache
    holds), the target chunk noised at sigma, the mask of a rollout with that window. Returns
    (videos, sigmas) losses; the same noise for every context, so only the context differs.
    """
    from . import reference

    tv = core()
    dm = model.model.diffusion_model
    F = CHUNK_FRAMES
    out = torch.zeros(len(videos), len(sigmas_))
    g = torch.Generator().manual_seed(noise_seed)
    for i, ((p, s), (pc, sc)) in enumerate(zip(videos, context_videos)):
        target = tv.render(tv.make_scene(p, s), window * F, F).unsqueeze(0)
        ctx_video = tv.render(tv.make_scene(pc, sc), 0, window * F).unsqueeze(0)
        context = tv.prompt_embedding(p)
        ctx_chunks = [ctx_video[:, :, c * F : (c + 1) * F] for c in range(window)]
        eps = torch.randn(target.shape, generator=g)
        for j, sg in enumerate(sigmas_):
            noisy = (1 - sg) * target + sg * eps
            frames = ctx_chunks + [noisy]
            ts = [torch.zeros(1) for _ in ctx_chunks] + [torch.full((1,), sg * 1000.0)]
            v = reference.block_causal_forward(dm, frames, ts, context, window=window)[:, :, window * F :]
            out[i, j] = float((v - (eps - target)).square().mean())
    return out


def cache_dependence(model, n: int = 6) -> dict:
    """Loss with each video's own context against the context of another video of the same prompt."""
    vids = held_out(n)
    others = [(p, s + 10_000) for p, s in vids]
    true = next_chunk_losses(model, vids, vids)
    swapped = next_chunk_losses(model, vids, others)
    return {
        "true_loss": float(true.mean()),
        "swapped_loss": float(swapped.mean()),
        "ratio": float(swapped.mean() / true.mean()),
        "videos": n,
        "per_sigma_ratio": (swapped.mean(0) / true.mean(0)).tolist(),
    }


def rollout(
    model,
    prompt: int,
    video_seed: int,
    seed: int,
    chunks: int,
    prefix: int = 2,
    steps: int = STEPS,
    with_report: bool = False,
):
    """Model-space rollout (16, chunks * 3, 16, 16) continuing a ground-truth video after ``prefix`` chunks.

    The pack's chunk loop with the model's cache settings (a full-precision cache unless ``model``
    carries Quantize KV Cache), window :data:`WINDOW_CHUNKS`, ``steps`` euler steps: the rollouts of
    ``benchmarks/rollout.py`` and ``benchmarks/tiers.py``. ``with_report``: also return the run's report.
    """
    import importlib

    import comfy.samplers

    from .comfyui import import_pack

    loop = importlib.import_module(f"{import_pack().__name__}.runtime.chunk_loop")
    tv = core()
    scene = tv.make_scene(prompt, video_seed)
    pre = tv.to_wan_latent(tv.render(scene, 0, prefix * CHUNK_FRAMES)).unsqueeze(0)
    res = loop.run_chunked_ar(
        model,
        conditioning(prompt),
        conditioning(prompt),
        {"samples": torch.zeros(1, 16, chunks * CHUNK_FRAMES, LATENT_HW, LATENT_HW)},
        seed=seed,
        cfg=1.0,
        sampler=comfy.samplers.sampler_object(SAMPLER),
        sigmas=sigmas(model, steps),
        chunk_frames=CHUNK_FRAMES,
        window_chunks=WINDOW_CHUNKS,
        prefix={"samples": pre},
        include_prefix=False,
        progress=False,
    )
    video = tv.from_wan_latent(res.samples[0])
    return (video, res.report) if with_report else video


def position_errors(model, n: int = 4, chunks: int = 32, prefix: int = 2, steps: int = STEPS) -> torch.Tensor:
    """Object-position error (latent px) of full-precision rollouts against the true continuation: (n, chunks).

    As ``benchmarks/rollout.py`` computes it: held-out videos ``held_out(n)``, noise seed 100 + i, the
    objects found by :func:`toy_video.estimate_positions`, the error of each chunk the mean over its
    frames and objects (objects not found are left out).
    """
    tv = core()
    out = torch.zeros(n, chunks)
    for i, (p, vs) in enumerate(held_out(n)):
        x = rollout(model, p, vs, 100 + i, chunks, prefix, steps)
        out[i] = _chunk_errors(tv.make_scene(p, vs), x, prefix * CHUNK_FRAMES, chunks)
    return out


def _chunk_errors(scene, video: torch.Tensor, start: int, chunks: int) -> torch.Tensor:
    """Per chunk, the mean distance of the objects found in ``video`` (from frame ``start``) to the true ones."""
    tv = core()
    pos, found = tv.estimate_positions(scene, video, start)
    gt = tv.object_positions(scene, range(start, start + chunks * CHUNK_FRAMES))
    err = torch.where(found, (pos - gt).norm(dim=-1), torch.full(found.shape, float("nan")))
    return torch.stack([torch.nanmean(err[c * CHUNK_FRAMES : (c + 1) * CHUNK_FRAMES]) for c in range(chunks)])


def oracle_position_errors(n: int = 4, chunks: int = 32, prefix: int = 2) -> torch.Tensor:
    """The object-position error (latent px) of a physics oracle shown what the rollouts are shown: (n, chunks).

    On the same held-out videos as :func:`position_errors`, the objects are found in the ``prefix``
    ground-truth chunks (:func:`toy_video.estimate_positions`, frames where an object is at least 95%
    visible), :func:`toy_video.fit_trajectories` fits their start and velocity with the data's exact
    dynamics and radii, and the next ``chunks`` chunks of the fitted scene are rendered and measured
    as :func:`position_errors` measures a rollout (the true scene's estimator, objects not found left
    out). No model can be expected below it without reading positions more finely than the centroids
    do: it is the floor of the drift benchmark's figures, not a bound.
    """
    tv = core()
    out = torch.zeros(n, chunks)
    start = prefix * CHUNK_FRAMES
    for i, (p, vs) in enumerate(held_out(n)):
        scene = tv.make_scene(p, vs)
        pos, found = tv.estimate_positions(scene, tv.render(scene, 0, start), 0)
        weight = found & (tv.visibility(scene, 0, start) > 0.95)
        p0, v = tv.fit_trajectories(scene, pos, weight)
        # the fitted scene rendered and measured as the rollouts are (objects not found are left out)
        fitted = dataclasses.replace(scene, p0=p0, velocity=v)
        out[i] = _chunk_errors(scene, tv.render(fitted, start, chunks * CHUNK_FRAMES), start, chunks)
    return out


def psnr(ref: torch.Tensor, x: torch.Tensor, peak: float | None = None) -> float:
    mse = float((x.double() - ref.double()).square().mean())
    peak = float(ref.max() - ref.min()) if peak is None else peak
    return 10 * math.log10(peak**2 / mse) if mse > 0 else float("inf")


def ssim(a: torch.Tensor, b: torch.Tensor, window: int = 7) -> float:
    """Mean SSIM of two image batches (N, H, W, 3) in 0..1 (uniform window, the usual constants)."""
    c1, c2 = 0.01**2, 0.03**2
    x = a.permute(0, 3, 1, 2).double()
    y = b.permute(0, 3, 1, 2).double()
    pool = torch.nn.functional.avg_pool2d
    pad = window // 2
    xp = torch.nn.functional.pad(x, (pad,) * 4, mode="reflect")
    yp = torch.nn.functional.pad(y, (pad,) * 4, mode="reflect")
    mx, my = pool(xp, window, 1), pool(yp, window, 1)
    sxx = pool(xp * xp, window, 1) - mx * mx
    syy = pool(yp * yp, window, 1) - my * my
    sxy = pool(xp * yp, window, 1) - mx * my
    s = ((2 * mx * my + c1) * (2 * sxy + c2)) / ((mx * mx + my * my + c1) * (sxx + syy + c2))
    return float(s.mean())
