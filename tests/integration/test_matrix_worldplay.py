"""The combination matrix for HY-WorldPlay (issue 43): what its sampler refuses, and the running cells.

Refusals: every schedule or option HY-WorldPlay's sampler refuses is refused before any model call (the DiT's
``forward`` and ComfyUI's ``sample_custom`` are counted), with a message that names the value; one test each.

Running cells (``tests/support/matrix.py``'s HY-WorldPlay rows): each checked against a computation that does not
use the pack's output of the same run - the planner's bytes counted by hand from each chunk's context selection
(made again here from the seed's points and the trajectory), the raw K/V of the re-encode quantized at the chunk's
bits, the family's plain forward with the reference's full-precision memory.
"""

from __future__ import annotations

import pytest
import torch

from jensen_testing import worldplay_tiny as wt

pytestmark = pytest.mark.hunyuan15


@pytest.fixture(scope="module")
def model(pack):
    return wt.build_patcher(0)


@pytest.fixture
def calls(model, monkeypatch):
    """Every forward of the HY-WorldPlay DiT and every sampler call in this test."""
    import comfy.sample

    seen: list[str] = []
    dm_cls = type(model.model.diffusion_model)
    forward, sample_custom = dm_cls.forward, comfy.sample.sample_custom

    def counting_forward(self, *a, **k):
        seen.append("forward")
        return forward(self, *a, **k)

    def counting_sample(*a, **k):
        seen.append("sample_custom")
        return sample_custom(*a, **k)

    monkeypatch.setattr(dm_cls, "forward", counting_forward)
    monkeypatch.setattr(comfy.sample, "sample_custom", counting_sample)
    return seen


def request(worldplay, model, frames=8, *, path=None, positive=None, latent=None, sigmas=None, seed=0, **options):
    import comfy.samplers

    return worldplay.WorldPlayRequest.from_options(
        model,
        positive or wt.conditioning(1, max(frames, 4)),
        latent or wt.latent(frames),
        wt.trajectory(path or max(frames, 4)),
        seed,
        comfy.samplers.sampler_object("euler"),
        wt.worldplay_sigmas() if sigmas is None else sigmas,
        progress=False,
        **options,
    )


# ------------------------------------------------------------------------------------------------ refusals
#: (id, request keywords, a regex naming the value)
REFUSALS = [
    ("window_chunks", dict(window_chunks=3), r"window_chunks=3.*set both to 0"),
    ("sink_chunks", dict(sink_chunks=2), r"sink_chunks=2.*set both to 0"),
    ("negative_window", dict(window_chunks=-1), r"window_chunks=-1"),
    ("cfg_2", dict(cfg=2.0), r"cfg=2\.0"),
    ("chunk_frames_2", dict(chunk_frames=2), r"chunk_frames=2"),
    ("first_chunk_frames", dict(first_chunk_frames=1), r"first_chunk_frames=1"),
    ("keep_state", dict(keep_state=True), r"no cache to hand on"),
    ("prefix", dict(prefix={"samples": torch.zeros(1, 32, 4, 4, 6)}), r"prefix clip"),
    ("frames_not_whole_chunks", dict(frames=6, path=8), r"latent has 6 latent frames.*multiple of 4"),
    ("zero_frames", dict(frames=0, path=4), r"latent has 0 latent frames"),
    ("video_longer_than_its_path", dict(frames=12, path=8), r"12 latent frames but the trajectory only 8 poses"),
    ("video_one_chunk_longer_than_its_path", dict(frames=8, path=4), r"8 latent frames but the trajectory only 4"),
    ("one_sigma", dict(sigmas=torch.tensor([1.0])), r"SIGMAS must be a 1-D schedule"),
    ("nan_sigmas", dict(sigmas=torch.tensor([1.0, float("nan"), 0.0])), r"NaN or Inf.*nan"),
    ("noise_of_another_shape", dict(noise=torch.zeros(1, 32, 4, 4, 6)), r"noise \(1, 32, 4, 4, 6\)"),
    ("noise_mask", dict(latent={"samples": torch.zeros(1, 32, 8, 4, 6), "noise_mask": torch.ones(1)}), "noise_mask"),
    ("a_prompt_schedule", dict(positive=wt.conditioning(1, 8) + wt.conditioning(2, 8)), r"has 2 entries"),
]


@pytest.mark.parametrize("kw,match", [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS])
def test_a_refused_option_names_its_value_before_any_model_call(worldplay, model, calls, kw, match):
    with pytest.raises(ValueError, match=match):
        worldplay.run(request(worldplay, model, **kw))
    assert calls == [], "refused after the model ran"


def test_the_counters_count_a_run_that_is_not_refused(worldplay, model, calls):
    """The positive control: the same counters see a run that goes (2 chunks: 2 x 4 steps and one re-encode)."""
    worldplay.run(request(worldplay, model, 8))
    assert calls.count("sample_custom") == 3 and calls.count("forward") >= 9
