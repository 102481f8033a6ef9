"""The AR Video Schedule presets against what each reference feeds its model."""

import pytest
import torch
from support.pack import load_pack_module

sched = load_pack_module("runtime.schedules")


@pytest.mark.parametrize(
    "preset,expected",
    [
        ("self_forcing_4step", [1.0, 0.9375, 0.833333, 0.625, 0.0]),  # shift 5 on 1000/750/500/250
        ("causvid_3step", [1.0, 0.757, 0.522, 0.0]),  # released checkpoint, no warp
        ("causvid_warp_4step", [1.0, 0.96, 0.888889, 0.727273, 0.0]),  # shift 8 on 1000/750/500/250
    ],
)
def test_few_step_presets(preset, expected):
    torch.testing.assert_close(sched.ar_sigmas(preset), torch.tensor(expected), atol=1e-6, rtol=0)


def test_longlive_is_its_config_warped_as_its_pipeline_does():
    """LongLive 1.0 (configs/longlive_inference.yaml): denoising_step_list [1000, 750, 500, 250],
    warp_denoising_step, timestep_shift 5. Its pipeline takes timesteps[1000 - t] of FlowMatchScheduler(shift=5,
    sigma_min=0, extra_one_step=True).set_timesteps(1000): sigmas linspace(1, 0, 1001)[:-1], shifted."""
    shift = 5.0
    sigmas = torch.linspace(1.0, 0.0, 1001, dtype=torch.float64)[:-1]
    timesteps = torch.cat([1000 * shift * sigmas / (1 + (shift - 1) * sigmas), torch.zeros(1, dtype=torch.float64)])
    expected = [float(timesteps[1000 - t]) / 1000 for t in (1000, 750, 500, 250)] + [0.0]
    torch.testing.assert_close(
        sched.ar_sigmas("longlive_4step").double(), torch.tensor(expected, dtype=torch.float64), atol=1e-6, rtol=0
    )
    assert "longlive_4step" in sched.PRESETS and "LongLive" in sched.PRESET_HELP["longlive_4step"]
    assert sched.describe(sched.ar_sigmas("longlive_4step")) == "4 steps; the model sees t = 1000, 937.5, 833.3, 625"


def test_skyreels_df_is_flowunipc_set_timesteps():
    s = sched.ar_sigmas("skyreels_v2_df", steps=30, shift=8.0)
    assert s.numel() == 31 and s[-1] == 0
    assert float(s[-2]) == pytest.approx(0.2160, abs=2e-4)  # the reference's last non-zero sigma
    assert float(s[0]) == pytest.approx(8 * 0.999 / (1 + 7 * 0.999))
    assert torch.all(s[1:] < s[:-1])
    assert sched.ar_sigmas("skyreels_v2_df", steps=10, shift=3.0).numel() == 11
    help_text = sched.PRESET_HELP["skyreels_v2_df"]
    assert "experimental causal variant" in help_text and "bidirectionally" in help_text


def test_manual_accepts_sigmas_or_timesteps_and_refuses_nonsense():
    torch.testing.assert_close(
        sched.ar_sigmas("manual", manual="1, 0.757, 0.522"), torch.tensor([1.0, 0.757, 0.522, 0.0])
    )
    torch.testing.assert_close(
        sched.ar_sigmas("manual", manual="1000 757 522 0"), torch.tensor([1.0, 0.757, 0.522, 0.0])
    )
    for bad, match in (
        ("", "empty"),
        ("1, x", "'x' is not a number"),
        ("0.5, 0.7", "strictly decrease"),
        ("2000", "above t = 1000"),
        ("1, -0.1", "finite number >= 0"),
        ("nan", "finite"),
    ):
        with pytest.raises(ValueError, match=match):
            sched.ar_sigmas("manual", manual=bad)
    with pytest.raises(ValueError, match="preset='warp9'"):
        sched.ar_sigmas("warp9")


def test_describe_says_what_the_model_sees():
    assert (
        sched.describe(sched.ar_sigmas("self_forcing_4step")) == "4 steps; the model sees t = 1000, 937.5, 833.3, 625"
    )


def _causal_forcing_warp(steps):
    """thu-ml/Causal-Forcing as its pipeline computes it: FlowMatchScheduler(shift=5, sigma_min=0, extra_one_step=True)
    .set_timesteps(1000) (utils/wan_wrapper.py:136-139, utils/scheduler.py:118-133, float32 as there), then
    ``timesteps[1000 - t]`` of the timesteps with a trailing 0 (pipeline/causal_inference.py:28-32)."""
    shift = 5.0
    sigmas = torch.linspace(1.0, 0.0, 1001)[:-1]
    sigmas = shift * sigmas / (1 + (shift - 1) * sigmas)
    timesteps = torch.cat((sigmas * 1000, torch.tensor([0], dtype=torch.float32)))
    return timesteps[1000 - torch.tensor(steps, dtype=torch.long)] / 1000


@pytest.mark.parametrize(
    "preset,steps,first_steps",
    [
        # configs/causal_forcing_dmd_framewise.yaml:7-15 (num_frame_per_block 1 at :47): one list for every block
        ("causal_forcing_framewise_4step", [1000, 750, 500, 250], None),
        # configs/causal_forcing_dmd_framewise_2step.yaml:7-14: denoising_step_list, denoising_step_list_first_chunk
        ("causal_forcing_framewise_2step", [1000, 500], [1000, 750, 500, 250]),
        # configs/causal_forcing_dmd_framewise_1step.yaml:7-13
        ("causal_forcing_framewise_1step", [1000], [1000, 750, 500, 250]),
    ],
)
def test_causal_forcing_framewise_presets_are_its_configs_warped_as_its_pipeline_does(preset, steps, first_steps):
    expected = torch.cat([_causal_forcing_warp(steps), torch.zeros(1)])
    torch.testing.assert_close(sched.ar_sigmas(preset), expected, atol=1e-6, rtol=0)
    first = sched.first_chunk_sigmas(preset)
    if first_steps is None:
        assert first is None
    else:  # the first block's own list, chosen for block_index == 0 (pipeline/causal_inference.py:222-228)
        torch.testing.assert_close(
            first, torch.cat([_causal_forcing_warp(first_steps), torch.zeros(1)]), atol=1e-6, rtol=0
        )
        assert "first_chunk_sigmas" in sched.PRESET_HELP[preset]
    assert preset in sched.PRESETS and "chunk_frames 1" in sched.PRESET_HELP[preset]


def test_causal_forcing_framewise_schedules_in_words():
    assert (
        sched.describe(sched.ar_sigmas("causal_forcing_framewise_2step")) == "2 steps; the model sees t = 1000, 833.3"
    )
    assert sched.describe(sched.ar_sigmas("causal_forcing_framewise_1step")) == "1 step; the model sees t = 1000"
    assert all(sched.first_chunk_sigmas(p) is None for p in ("self_forcing_4step", "causvid_3step", "manual"))


def test_worldplay_is_its_schedulers_4_steps_at_shift_5():
    """HY-WorldPlay's FlowMatchDiscreteScheduler(shift=5).set_timesteps(4): linspace(1, 0, 5) warped with shift 5
    (the same values as the reference's AR rollout's scheduler in tests/data/worldplay/ar_rollout.safetensors)."""
    from pathlib import Path

    from safetensors.torch import load_file

    base = torch.linspace(1, 0, 5, dtype=torch.float64)
    expected = 5 * base / (1 + 4 * base)
    got = sched.ar_sigmas("worldplay_4step")
    torch.testing.assert_close(got.double(), expected, atol=1e-7, rtol=0)
    ref = load_file(Path(__file__).parent / "data" / "worldplay" / "ar_rollout.safetensors")
    torch.testing.assert_close(got, ref["sigmas"], atol=1e-7, rtol=0)
    assert "worldplay_4step" in sched.PRESETS and "shift 5" in sched.PRESET_HELP["worldplay_4step"]
    assert sched.describe(got) == "4 steps; the model sees t = 1000, 937.5, 833.3, 625"
