"""The trajectory picture (runtime/families/worldplay/model/preview.py): where the path and the view wedges land, for paths whose
picture is known by hand."""

from __future__ import annotations

import pytest
import torch

from runtime.families.worldplay.model.preview import PATH, VIEW, image_tensor, render_trajectory
from runtime.families.worldplay.model.trajectory import parse_trajectory


def mask_of(img, colour) -> torch.Tensor:
    t = image_tensor(img)[0]
    return (t - torch.tensor(colour, dtype=torch.float32) / 255).abs().max(dim=-1).values < 2 / 255


def extent(mask: torch.Tensor) -> tuple[float, float]:
    ys, xs = torch.nonzero(mask, as_tuple=True)
    n = mask.shape[0]
    return float(xs.max() - xs.min()) / n, float(ys.max() - ys.min()) / n


def test_forward_draws_a_vertical_path_and_sideways_a_horizontal_one():
    up = mask_of(render_trajectory(parse_trajectory("w-31").c2w, 256), PATH)
    dx, dy = extent(up)
    assert dx < 0.05 and dy > 0.5
    side = mask_of(render_trajectory(parse_trajectory("d-31").c2w, 256), PATH)
    dx, dy = extent(side)
    assert dx > 0.5 and dy < 0.05


def test_forward_runs_up_the_picture_and_right_turns_look_right():
    """w: the start (frame 0) sits low, the path goes up; turning right in place: the wedges sweep from up to right."""
    img = image_tensor(render_trajectory(parse_trajectory("w-31").c2w, 256))[0]
    start_green = (img - torch.tensor([90, 200, 120]) / 255).abs().max(-1).values < 2 / 255
    end_red = (img - torch.tensor([230, 90, 90]) / 255).abs().max(-1).values < 2 / 255
    assert torch.nonzero(start_green)[:, 0].float().mean() > torch.nonzero(end_red)[:, 0].float().mean()
    view = mask_of(render_trajectory(parse_trajectory("right-31").c2w, 256), VIEW)
    n = view.shape[0]
    assert view[: n // 2 - 10, n // 2 - 5 : n // 2 + 5].any()  # looking up (forward)
    assert view[n // 2 - 5 : n // 2 + 5, n // 2 + 10 :].any()  # looking right, after 93 degrees
    assert not view[n // 2 + 10 :, : n // 2 - 10].any()  # never looking back-left (the wedges span up to right)


def test_the_image_is_comfyuis_layout():
    t = image_tensor(render_trajectory(parse_trajectory("w-15, right-16").c2w, 128, caption="x"))
    assert t.shape == (1, 128, 128, 3) and t.dtype == torch.float32 and 0 <= float(t.min()) and float(t.max()) <= 1


@pytest.mark.parametrize(
    "c2w, size, match", [(torch.eye(4), 128, "frames, 4, 4"), (torch.eye(4)[None], 32, "too small")]
)
def test_bad_inputs_are_named(c2w, size, match):
    with pytest.raises(ValueError, match=match):
        render_trajectory(c2w, size)
