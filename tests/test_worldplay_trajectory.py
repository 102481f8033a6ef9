"""Camera paths (runtime/families/worldplay/model/trajectory.py): pose strings and pose JSON against the reference's own parse
(tests/data/worldplay/trajectories.json, made by HY-WorldPlay's ``pose_to_input``), hand-worked action labels,
the Euler angles against SciPy's, and every error naming its fix."""

from __future__ import annotations

import json
import math

import pytest
import torch
from support.stored import stored_json

from runtime.families.worldplay.model.trajectory import (
    Trajectory,
    TrajectoryError,
    action_labels,
    c2w_from_commands,
    frames_for_latents,
    parse_pose_string,
    parse_trajectory,
    trajectory_from_json,
)

REF = stored_json("worldplay", "trajectories.json")


@pytest.mark.parametrize("pose", [p for p in REF if not p.startswith("json:")])
def test_pose_strings_parse_as_the_reference_does(pose):
    """Same camera-to-world path (as world-to-camera), same normalised intrinsics and same actions. The reference
    needs its length to be a multiple of 4 only at generation time; ``latents`` keeps the whole path here when
    it is one."""
    ref = REF[pose]
    n = len(ref["actions"])
    cut = n - n % 4
    t = parse_trajectory(pose, latents=cut) if n % 4 else parse_trajectory(pose)
    torch.testing.assert_close(t.w2c, torch.tensor(ref["w2c"][:cut], dtype=torch.float64), rtol=0, atol=1e-12)
    torch.testing.assert_close(t.intrinsics, torch.tensor(ref["K"][:cut], dtype=torch.float64), rtol=0, atol=1e-15)
    assert t.actions.tolist() == ref["actions"][:cut]


def test_a_pose_json_with_mixed_motions_gives_the_references_actions():
    """Diagonal translations and rotations (labels 5-8 on either axis), a 1e-5 move and a 0.03 degree turn (below
    the reference's thresholds: no action)."""
    ref = REF["json:mixed"]
    entries = ref["json"]
    keep = {str(i): entries[str(i)] for i in range(12)}  # 13 poses -> the first 12
    t = trajectory_from_json(keep)
    assert t.actions.tolist() == ref["actions"][:12]
    assert {45, 54, 63, 72, 5, 6, 7, 8} <= set(ref["actions"])  # the data covers every diagonal
    all13 = torch.tensor([entries[str(i)]["extrinsic"] for i in range(13)], dtype=torch.float64)
    assert action_labels(all13).tolist() == ref["actions"]  # the last two: below both thresholds
    torch.testing.assert_close(t.w2c, torch.tensor(ref["w2c"][:12], dtype=torch.float64), rtol=0, atol=1e-12)
    torch.testing.assert_close(t.intrinsics, torch.tensor(ref["K"][:12], dtype=torch.float64), rtol=0, atol=1e-15)


def test_hand_worked_labels():
    """9 * translation + rotation: w 1, s 2, d (right) 3, a (left) 4; yaw right 1, left 2, pitch up 3, down 4."""
    t = parse_trajectory("w-1, s-1, d-1, a-1, right-1, left-1, up-1")
    assert t.actions.tolist() == [0, 9, 18, 27, 36, 1, 2, 3]
    assert parse_trajectory("down-3").actions.tolist() == [0, 4, 4, 4]


def test_pose_string_geometry():
    """w-2 moves 0.16 along +z; right-30 turns 90 degrees about +y (x goes to -z)."""
    c2w = c2w_from_commands([("w", 2)])
    torch.testing.assert_close(c2w[-1, :3, 3], torch.tensor([0, 0, 0.16], dtype=torch.float64))
    r = c2w_from_commands([("right", 30)])[-1, :3, :3]
    torch.testing.assert_close(
        r @ torch.tensor([1.0, 0, 0], dtype=torch.float64),
        torch.tensor([0, 0, -1.0], dtype=torch.float64),
        atol=1e-12,
        rtol=0,
    )


def test_euler_angles_agree_with_scipy():
    """The x and y angles the labels use, against SciPy's extrinsic 'xyz' (what the reference calls)."""
    rotation = pytest.importorskip("scipy.spatial.transform").Rotation
    g = torch.Generator().manual_seed(0)
    from runtime.families.worldplay.model.trajectory import _euler_xy_deg

    for _ in range(50):
        angles = (torch.rand(3, generator=g, dtype=torch.float64) - 0.5) * torch.tensor([2 * math.pi, 2.5, 2 * math.pi])
        r = rotation.from_euler("xyz", angles.numpy())
        x, y = _euler_xy_deg(torch.tensor(r.as_matrix()))
        ref = r.as_euler("xyz", degrees=True)
        assert abs(x - ref[0]) < 1e-9 and abs(y - ref[1]) < 1e-9


def test_lengths_and_frames():
    assert frames_for_latents(32) == 125 and frames_for_latents(64) == 253
    t = parse_trajectory("w-31")
    assert (t.latents, t.frames, t.chunks) == (32, 125, 8)
    assert "32 latent frames (125 video frames, 8 chunks of 4)" in t.describe()


def test_the_multiple_of_4_rule_names_the_fix():
    with pytest.raises(TrajectoryError) as exc:
        parse_trajectory("w-30")
    msg = str(exc.value)
    assert "31 latent frames (121 video frames)" in msg and "32 (125 frames: add 1)" in msg and "28 (109" in msg


def test_the_references_bundled_33_pose_json_gets_a_message_and_latents_fixes_it():
    poses = {
        str(i): {
            "extrinsic": [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0.08 * i], [0, 0, 0, 1]],
            "K": [[969.6969696969696, 0, 960], [0, 969.6969696969696, 540], [0, 0, 1]],
        }
        for i in range(33)
    }
    with pytest.raises(TrajectoryError) as exc:
        parse_trajectory(json.dumps(poses))
    msg = str(exc.value)
    assert "33 latent frames (129 video frames)" in msg and "set latents to 32" in msg and "125 frames" in msg
    t = parse_trajectory(json.dumps(poses), latents=32)
    assert (t.latents, t.frames) == (32, 125) and t.actions.tolist() == [0] + [9] * 31
    with pytest.raises(TrajectoryError, match="more poses than the pose JSON holds"):
        parse_trajectory(json.dumps(poses), latents=36)


@pytest.mark.parametrize(
    "text, match",
    [
        ("", "empty"),
        ("   ,  ", "no command"),
        ("w31", "not 'action-duration'"),
        ("jump-4", "unknown action 'jump'"),
        ("w-x", "not a number of latent frames"),
        ("right-0.5", "whole number of latent frames.*write right-1"),
        ("w-0", "at least 1"),
        ("w--3", "not 'action-duration'"),
    ],
)
def test_bad_pose_strings_are_named(text, match):
    with pytest.raises(TrajectoryError, match=match):
        parse_pose_string(text) if text.strip(" ,") else parse_trajectory(text)


def _entry(c2w, k=((500, 0, 320), (0, 500, 240), (0, 0, 1))):
    return {"extrinsic": [list(r) for r in c2w], "K": [list(r) for r in k]}


EYE = ((1, 0, 0, 0), (0, 1, 0, 0), (0, 0, 1, 0), (0, 0, 0, 1))


@pytest.mark.parametrize(
    "data, match",
    [
        ("{not json", "does not parse"),
        ({}, "empty"),
        ({"a": _entry(EYE)}, "latent indices"),
        ({"0": _entry(EYE), "2": _entry(EYE)}, "without gaps"),
        ({"0": {"K": [[1, 0, 0], [0, 1, 0], [0, 0, 1]]}}, "has no 'extrinsic'"),
        ({"0": _entry(((1, 0, 0), (0, 1, 0), (0, 0, 1)))}, "shape"),
        (
            {str(i): _entry(((2, 0, 0, 0), (0, 1, 0, 0), (0, 0, 1, 0), (0, 0, 0, 1))) for i in range(4)},
            "not a rotation",
        ),
        ({str(i): _entry(((1, 0, 0, 0), (0, 1, 0, 0), (0, 0, 1, 0), (0, 0, 1, 1))) for i in range(4)}, "last row"),
        ({str(i): _entry(EYE, ((500, 0, 0), (0, 500, 240), (0, 0, 1))) for i in range(4)}, "positive fx, fy, cx, cy"),
        ([_entry(EYE)] * 3, "3 latent frames"),
        (5, "object"),
    ],
)
def test_bad_pose_json_is_named(data, match):
    with pytest.raises(TrajectoryError, match=match):
        trajectory_from_json(data)


def test_a_list_json_and_unordered_keys_read_in_latent_order():
    steps = [((1, 0, 0, 0), (0, 1, 0, 0), (0, 0, 1, 0.1 * i), (0, 0, 0, 1)) for i in range(4)]
    as_list = trajectory_from_json([_entry(s) for s in steps])
    shuffled = trajectory_from_json({str(i): _entry(steps[i]) for i in (3, 1, 0, 2)})
    torch.testing.assert_close(as_list.c2w, shuffled.c2w)
    assert as_list.actions.tolist() == [0, 9, 9, 9]


def test_a_trajectory_checks_itself():
    with pytest.raises(TrajectoryError, match="0..80"):
        Trajectory(
            torch.eye(4).expand(4, 4, 4).double(), torch.eye(3).expand(4, 3, 3).double(), torch.tensor([0, 81, 0, 0])
        )
    assert action_labels(torch.eye(4, dtype=torch.float64).expand(4, 4, 4)).tolist() == [0, 0, 0, 0]
