"""The noise schedules of the chunk-wise AR checkpoints, as SIGMAS (flow matching: sigma = t / 1000).

What each reference feeds its model, per chunk:

- **Self-Forcing** (``configs/self_forcing_dmd.yaml``): ``denoising_step_list`` [1000, 750, 500, 250]
  warped with shift 5 (``warp_denoising_step``): t = 1000, 937.5, 833.3, 625.
- **LongLive 1.0** (NVlabs/LongLive ``configs/longlive_inference.yaml`` 1-11): the same steps and shift as
  Self-Forcing: ``denoising_step_list`` [1000, 750, 500, 250], ``warp_denoising_step: true``,
  ``timestep_shift: 5.0``; ``pipeline/causal_inference.py`` 33-37 takes ``timesteps[1000 - t]`` of the
  scheduler set to 1000 steps from sigma 1 to 0 with shift 5 (``utils/wan_wrapper.py`` 197-200,
  ``utils/scheduler.py`` 118-133): t = 1000, 937.5, 833.3, 625.
- **CausVid, 3 steps** (the released ``autoregressive_checkpoint``, ``wan_causal_dmd.yaml``):
  t = 1000, 757, 522, without warp.
- **CausVid, warp 4 steps** (``wan_causal_dmd_warp_4step_cfg2.yaml``): [1000, 750, 500, 250] warped
  with shift 8: t = 1000, 960, 888.9, 727.3.
- **SkyReels-V2 DF** (``FlowUniPCMultistepScheduler.set_timesteps``): ``steps`` values of
  linspace(0.999, 0, steps + 1) without the last, warped with ``shift`` (8 for T2V), then 0; at 30
  steps the last non-zero sigma is 0.216. The pack runs SkyReels-V2 DF as an experimental causal variant
  (block-causal, KV cache); the reference's documented runs (``generate_video_df.py`` without
  ``--causal_attention``) attend bidirectionally, keep no KV cache and re-encode ``overlap_history`` frames.
- **Causal Forcing, frame-wise** (thu-ml/Causal-Forcing; ``num_frame_per_block: 1``, ``timestep_shift: 5.0``,
  ``warp_denoising_step: true``; ``pipeline/causal_inference.py`` 28-32 takes ``timesteps[1000 - t]`` of the
  scheduler of ``utils/wan_wrapper.py`` 136-139, as LongLive does):
  4 steps (``configs/causal_forcing_dmd_framewise.yaml`` 7-15): [1000, 750, 500, 250] -> t = 1000, 937.5, 833.3,
  625; 2 steps (``causal_forcing_dmd_framewise_2step.yaml`` 7-9): [1000, 500] -> t = 1000, 833.3; 1 step
  (``causal_forcing_dmd_framewise_1step.yaml`` 7-8): [1000] -> t = 1000. The 2- and 1-step configs give the
  first block its own 4-step list (``denoising_step_list_first_chunk``, 2step 10-14, 1step 9-13; chosen for
  ``block_index == 0`` at ``pipeline/causal_inference.py`` 222-228): :func:`first_chunk_sigmas`.
- **HY-WorldPlay, AR distilled** (Tencent-Hunyuan/HY-WorldPlay ``run.sh``: ``--few_step true
  --num_inference_steps 4``; its ``FlowMatchDiscreteScheduler`` at the 480p I2V pipeline's ``flow_shift`` 5):
  sigmas ``linspace(1, 0, 5)`` warped with shift 5: t = 1000, 937.5, 833.3, 625 (Self-Forcing's values), cfg 1.
  Core's HunyuanVideo 1.5 samples with shift 7.

Every schedule ends with sigma 0 (the last step predicts the clean chunk). No ComfyUI import here.
"""

from __future__ import annotations

import math

import torch

PRESETS = (
    "self_forcing_4step",
    "longlive_4step",
    "causvid_3step",
    "causvid_warp_4step",
    "skyreels_v2_df",
    "causal_forcing_framewise_4step",
    "causal_forcing_framewise_2step",
    "causal_forcing_framewise_1step",
    "worldplay_4step",
    "manual",
)
PRESET_HELP = {
    "self_forcing_4step": "Self-Forcing: t = 1000, 937.5, 833.3, 625 (shift 5 on 1000/750/500/250)",
    "longlive_4step": "LongLive 1.0: t = 1000, 937.5, 833.3, 625 (shift 5 on 1000/750/500/250, as Self-Forcing)",
    "causvid_3step": "CausVid (released 3-step checkpoint): t = 1000, 757, 522, no warp",
    "causvid_warp_4step": "CausVid warp-4step: t = 1000, 960, 888.9, 727.3 (shift 8 on 1000/750/500/250)",
    "skyreels_v2_df": (
        "SkyReels-V2 DF: FlowUniPC's sigmas for `steps` and `shift` (30 and 8 for T2V); the pack's SkyReels path "
        "is an experimental causal variant of SkyReels-V2 DF (the reference's documented runs attend "
        "bidirectionally, keep no KV cache and re-encode overlap_history frames)"
    ),
    "causal_forcing_framewise_4step": "Causal Forcing frame-wise (chunk_frames 1): t = 1000, 937.5, 833.3, 625",
    "causal_forcing_framewise_2step": (
        "Causal Forcing++ frame-wise 2-step (chunk_frames 1): t = 1000, 833.3; its first frame takes 4 steps "
        "(t = 1000, 937.5, 833.3, 625), which these SIGMAS carry to the sampler (or connect a "
        "causal_forcing_framewise_4step schedule to its first_chunk_sigmas)"
    ),
    "causal_forcing_framewise_1step": (
        "Causal Forcing++ frame-wise 1-step (chunk_frames 1): t = 1000; its first frame takes 4 steps "
        "(t = 1000, 937.5, 833.3, 625), which these SIGMAS carry to the sampler (or connect a "
        "causal_forcing_framewise_4step schedule to its first_chunk_sigmas)"
    ),
    "worldplay_4step": "HY-WorldPlay (AR distilled): 4 Euler steps at shift 5, t = 1000, 937.5, 833.3, 625 (cfg 1)",
    "manual": "your own list: sigmas from 1 down (a trailing 0 is added); values above 1 are timesteps t (divided by 1000)",
}


def warp(sigma: float, shift: float) -> float:
    """The flow-matching time shift every reference uses: shift * s / (1 + (shift - 1) * s)."""
    return shift * sigma / (1 + (shift - 1) * sigma)


def skyreels_df_sigmas(steps: int, shift: float) -> list[float]:
    base = [0.999 - 0.999 * i / steps for i in range(steps)]  # linspace(0.999, 0, steps + 1)[:-1]
    return [warp(s, shift) for s in base] + [0.0]


def parse_manual(text: str) -> list[float]:
    """``"1, 0.757, 0.522"`` (or timesteps ``"1000 757 522"``) -> [1.0, 0.757, 0.522, 0.0]; clear errors."""
    parts = [p for p in text.replace(",", " ").replace(";", " ").split() if p]
    if not parts:
        raise ValueError("manual schedule is empty: type sigmas from 1 down, e.g. 1, 0.757, 0.522")
    values = []
    for p in parts:
        try:
            v = float(p)
        except ValueError:
            raise ValueError(f"manual schedule: {p!r} is not a number; separate values with commas or spaces") from None
        if not math.isfinite(v) or v < 0:
            raise ValueError(f"manual schedule: {p!r} must be a finite number >= 0")
        values.append(v)
    if max(values) > 1:
        if max(values) > 1000:
            raise ValueError(
                f"manual schedule: {max(values):g} is above t = 1000; give sigmas (<= 1) or timesteps (<= 1000)"
            )
        values = [v / 1000.0 for v in values]
    if values[-1] != 0:
        values.append(0.0)
    if any(b >= a for a, b in zip(values, values[1:])):
        raise ValueError(f"manual schedule {values} must strictly decrease (each step removes noise)")
    if len(values) < 2:
        raise ValueError("manual schedule needs at least one step (a sigma above 0)")
    return values


#: the reference's ``denoising_step_list`` (before its shift-5 warp) of the presets that warp with shift 5
_SHIFT5_STEPS = {
    "self_forcing_4step": (1000, 750, 500, 250),
    "longlive_4step": (1000, 750, 500, 250),
    "causal_forcing_framewise_4step": (1000, 750, 500, 250),
    "causal_forcing_framewise_2step": (1000, 500),
    "causal_forcing_framewise_1step": (1000,),
    "worldplay_4step": (1000, 750, 500, 250),
}
#: presets whose reference gives the first block its own schedule (``denoising_step_list_first_chunk``)
FIRST_CHUNK_PRESET = {
    "causal_forcing_framewise_2step": "causal_forcing_framewise_4step",
    "causal_forcing_framewise_1step": "causal_forcing_framewise_4step",
}


#: the attribute a preset's SIGMAS carry their first chunk's own schedule in (:func:`carry_first_chunk`)
FIRST_CHUNK_ATTR = "jensen_kv_first_chunk_sigmas"


def carry_first_chunk(sigmas: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
    """``sigmas`` carrying ``first`` as the first chunk's schedule: the sampler takes it when its first_chunk_sigmas
    is unconnected, so a Causal Forcing++ preset cannot lose its first frame's 4 steps on the way. An attribute of
    this tensor only: anything that makes a new tensor (SplitSigmas, a conversion) drops it."""
    setattr(sigmas, FIRST_CHUNK_ATTR, first)
    return sigmas


def carried_first_chunk(sigmas) -> torch.Tensor | None:
    """The first chunk's schedule ``sigmas`` carries (:func:`carry_first_chunk`), else None."""
    first = getattr(sigmas, FIRST_CHUNK_ATTR, None)
    return first if isinstance(first, torch.Tensor) else None


def lost_first_chunk(sigmas: torch.Tensor) -> str | None:
    """The preset whose reference gives the first block its own schedule when ``sigmas`` has exactly its values (and
    so, given without that schedule, runs the video's first frame on too few steps), else None."""
    for preset in FIRST_CHUNK_PRESET:
        ref = ar_sigmas(preset)
        if sigmas.shape == ref.shape and torch.allclose(sigmas.detach().to("cpu", torch.float32), ref, atol=1e-4):
            return preset
    return None


def ar_sigmas(preset: str, steps: int = 30, shift: float = 8.0, manual: str = "") -> torch.Tensor:
    """The SIGMAS of ``preset`` (see the module docstring), float32, ending in 0; a preset whose reference gives the
    first block its own schedule carries it (:func:`carry_first_chunk`)."""
    if preset in _SHIFT5_STEPS:
        values = [warp(t / 1000, 5.0) for t in _SHIFT5_STEPS[preset]] + [0.0]
    elif preset == "causvid_3step":
        values = [1.0, 0.757, 0.522, 0.0]
    elif preset == "causvid_warp_4step":
        values = [warp(t / 1000, 8.0) for t in (1000, 750, 500, 250)] + [0.0]
    elif preset == "skyreels_v2_df":
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"steps={steps!r} must be a positive integer")
        if not math.isfinite(shift) or shift <= 0:
            raise ValueError(f"shift={shift!r} must be a positive number (SkyReels-V2 T2V uses 8)")
        values = skyreels_df_sigmas(steps, shift)
    elif preset == "manual":
        values = parse_manual(manual)
    else:
        raise ValueError(f"preset={preset!r} is not known; use one of {', '.join(PRESETS)}")
    sigmas = torch.tensor(values, dtype=torch.float32)
    first = FIRST_CHUNK_PRESET.get(preset)
    return sigmas if first is None else carry_first_chunk(sigmas, ar_sigmas(first))


def first_chunk_sigmas(preset: str) -> torch.Tensor | None:
    """The first block's own SIGMAS where ``preset``'s reference has one (Causal Forcing++ 2/1-step: 4 steps), else None."""
    first = FIRST_CHUNK_PRESET.get(preset)
    return None if first is None else ar_sigmas(first)


def describe(sigmas: torch.Tensor) -> str:
    ts = ", ".join(f"{1000 * float(s):.1f}".rstrip("0").rstrip(".") for s in sigmas[:-1])
    steps = sigmas.numel() - 1
    return f"{steps} step{'s' if steps != 1 else ''}; the model sees t = {ts}"
