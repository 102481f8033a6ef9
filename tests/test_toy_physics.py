"""The toy scenes' physics oracle (jensen_core.toy_video.fit_trajectories): what the drift benchmark's floor rests on."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from jensen_core import toy_video as tv

pytestmark = pytest.mark.slow  # Adam fits: about a minute on 2 busy cores


def _predict(scene, p0, v, frames):
    return tv.object_positions(dataclasses.replace(scene, p0=p0, velocity=v), frames)


def test_exact_measurements_give_back_the_trajectories_far_ahead():
    """Six exactly measured frames fix start and velocity: 96 frames later, bounces included, the fit is exact."""
    for prompt in range(len(tv.PROMPTS)):
        scene = tv.make_scene(prompt, 1_000_000 + prompt)
        pos = tv.object_positions(scene, range(6))
        p0, v = tv.fit_trajectories(scene, pos, torch.ones(pos.shape[:2]))
        ahead = range(6, 102)
        err = (_predict(scene, p0, v, ahead) - tv.object_positions(scene, ahead)).norm(dim=-1)
        assert float(err.max()) < 0.05, (prompt, float(err.max()))


def test_left_out_frames_do_not_pull_the_fit():
    scene = tv.make_scene(1, 1_000_003)
    pos = tv.object_positions(scene, range(6)).clone()
    weight = torch.ones(pos.shape[:2])
    pos[2:4, 0] += 5.0  # two frames of object 0 measured 5 px off ...
    weight[2:4, 0] = 0  # ... and left out
    p0, v = tv.fit_trajectories(scene, pos, weight)
    err = (_predict(scene, p0, v, range(6, 102)) - tv.object_positions(scene, range(6, 102))).norm(dim=-1)
    assert float(err.max()) < 0.05
    # kept in, they do pull it (so the weight is what kept it out)
    p0, v = tv.fit_trajectories(scene, pos, torch.ones(pos.shape[:2]))
    err = (_predict(scene, p0, v, range(6, 102)) - tv.object_positions(scene, range(6, 102))).norm(dim=-1)
    assert float(err[:, 0].max()) > 0.5


def test_centroid_measurements_leave_an_error_that_grows_with_the_horizon():
    """From the rendered prefix the centroids are slightly off, and so is the velocity: the floor is not zero."""
    errs = []
    for i in range(4):
        scene = tv.make_scene(i, 1_000_000 + i)
        pos, found = tv.estimate_positions(scene, tv.render(scene, 0, 6), 0)
        p0, v = tv.fit_trajectories(scene, pos, found & (tv.visibility(scene, 0, 6) > 0.95))
        frames = [8, 101]
        errs.append((_predict(scene, p0, v, frames) - tv.object_positions(scene, frames)).norm(dim=-1).mean(-1))
    e = torch.stack(errs).mean(0)
    assert 0 < float(e[0]) < float(e[1])
