"""HY-WorldPlay camera paths: a pose string or a pose JSON -> a checked :class:`Trajectory`.

One pose per latent frame. WorldPlay's AR model generates chunks of 4 latent frames, so a path must
hold a multiple of 4 poses; ``n`` latent frames decode to ``4 n - 3`` video frames (125 frames = 32
latents, 253 = 64).

**Pose string** (the reference's ``generate.py``): comma-separated ``action-duration`` commands, the
duration in latent frames. The camera starts at the identity, and every latent frame of a command
moves it once in its own frame: ``w`` / ``s`` forward / back 0.08, ``d`` / ``a`` right / left 0.08,
``right`` / ``left`` yaw +-3 degrees, ``up`` / ``down`` pitch +-3 degrees. ``w-31`` gives 1 + 31 = 32
poses. Durations must be whole numbers here (the reference truncates ``right-0.5`` to no motion).

**Pose JSON** (the reference's format): ``{"0": {"extrinsic": 4x4 camera-to-world, "K": 3x3
intrinsics in pixels}, "1": ...}`` (a list of such entries works too). The intrinsics are
normalised as the reference does: ``fx / (2 cx)``, ``fy / (2 cy)``, principal point 0.5.

**Actions** (the reference's ``pose_to_input``): one label 0..80 per latent frame from the motion
between it and the previous frame (frame 0: 0), ``9 * translation + rotation``. Translation: forward
(1) or back (2) when the move's direction is within 60 degrees of +z or -z, right (3) or left (4)
within 60 degrees of +x or -x, and the four diagonals (5: forward-right, 6: forward-left, 7:
back-right, 8: back-left); moves shorter than 1e-4 count as none. Rotation, from the relative
rotation's extrinsic x-y-z Euler angles: right (1) / left (2) for a y angle above +-0.05 degrees, up
(3) / down (4) for an x angle, and the diagonals in the same order (5: right-up, 6: right-down, 7:
left-up, 8: left-down). Pure torch / Python.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

#: latent frames per generated chunk of WorldPlay's AR model
CHUNK_LATENTS = 4
#: the pose string's step per latent frame: translation (scene units) and rotation (degrees)
STEP_TRANSLATION = 0.08
STEP_DEGREES = 3.0
#: command -> (motion kind, sign)
COMMANDS: dict[str, tuple[str, int]] = {
    "w": ("forward", 1),
    "s": ("forward", -1),
    "d": ("right", 1),
    "a": ("right", -1),
    "right": ("yaw", 1),
    "left": ("yaw", -1),
    "up": ("pitch", 1),
    "down": ("pitch", -1),
}
#: the reference's default intrinsics (pixels, a 1920 x 1080 camera) for pose strings
DEFAULT_K = ((969.6969696969696, 0.0, 960.0), (0.0, 969.6969696969696, 540.0), (0.0, 0.0, 1.0))
#: one-hot (a, b, c, d) -> label, as the reference maps both its translation and rotation one-hots
_ONE_HOT_LABEL = {
    (0, 0, 0, 0): 0,
    (1, 0, 0, 0): 1,
    (0, 1, 0, 0): 2,
    (0, 0, 1, 0): 3,
    (0, 0, 0, 1): 4,
    (1, 0, 1, 0): 5,
    (1, 0, 0, 1): 6,
    (0, 1, 1, 0): 7,
    (0, 1, 0, 1): 8,
}
ACTION_LABELS = 81
MOVE_EPS = 1e-4
ANGLE_EPS_DEG = 5e-2


class TrajectoryError(ValueError):
    """A camera path that WorldPlay cannot take (the message names the value and the fix)."""


def frames_for_latents(latents: int) -> int:
    """Video frames of ``latents`` latent frames (the VAE keeps the first frame alone, then 4 per latent)."""
    return 4 * latents - 3


def _rot_x(a: float) -> Tensor:
    c, s = math.cos(a), math.sin(a)
    return torch.tensor([[1.0, 0.0, 0.0], [0.0, c, -s], [0.0, s, c]], dtype=torch.float64)


def _rot_y(a: float) -> Tensor:
    c, s = math.cos(a), math.sin(a)
    return torch.tensor([[c, 0.0, s], [0.0, 1.0, 0.0], [-s, 0.0, c]], dtype=torch.float64)


def parse_pose_string(text: str) -> list[tuple[str, int]]:
    """``"w-31, right-8"`` -> ``[("w", 31), ("right", 8)]``; errors name the bad command and the fix."""
    if not isinstance(text, str) or not text.strip():
        raise TrajectoryError(
            "the pose string is empty: write commands such as 'w-31' or 'w-15, right-16' "
            f"(actions {', '.join(COMMANDS)}; the number is the duration in latent frames)"
        )
    out = []
    for raw in text.split(","):
        cmd = raw.strip()
        if not cmd:
            continue
        parts = cmd.split("-")
        if len(parts) != 2 or not parts[0].strip():
            raise TrajectoryError(
                f"pose command {cmd!r} is not 'action-duration' (for example 'w-4' or 'right-8'); "
                f"actions: {', '.join(COMMANDS)}"
            )
        action, duration = parts[0].strip().lower(), parts[1].strip()
        if action not in COMMANDS:
            raise TrajectoryError(f"pose command {cmd!r}: unknown action {action!r}; use one of {', '.join(COMMANDS)}")
        try:
            value = float(duration)
        except ValueError:
            raise TrajectoryError(
                f"pose command {cmd!r}: duration {duration!r} is not a number of latent frames (e.g. {action}-4)"
            ) from None
        if not math.isfinite(value) or value < 1 or value != int(value):
            raise TrajectoryError(
                f"pose command {cmd!r}: duration {duration!r} must be a whole number of latent frames, at least 1 "
                f"(the reference truncates {duration} to {int(value) if math.isfinite(value) else 0} and moves that "
                f"many frames); write {action}-{max(1, round(value)) if math.isfinite(value) else 1}"
            )
        out.append((action, int(value)))
    if not out:
        raise TrajectoryError("the pose string holds no command: write commands such as 'w-31'")
    return out


def c2w_from_commands(commands: Sequence[tuple[str, int]]) -> Tensor:
    """Camera-to-world matrices ``(1 + sum of durations, 4, 4)``, float64: the identity, then one move per latent."""
    t = torch.eye(4, dtype=torch.float64)
    poses = [t.clone()]
    step = math.radians(STEP_DEGREES)
    for action, n in commands:
        kind, sign = COMMANDS[action]
        for _ in range(n):
            if kind == "yaw":
                t[:3, :3] = t[:3, :3] @ _rot_y(sign * step)
            elif kind == "pitch":
                t[:3, :3] = t[:3, :3] @ _rot_x(sign * step)
            else:
                local = torch.zeros(3, dtype=torch.float64)
                local[2 if kind == "forward" else 0] = sign * STEP_TRANSLATION
                t[:3, 3] += t[:3, :3] @ local
            poses.append(t.clone())
    return torch.stack(poses)


def normalise_intrinsics(k: Tensor) -> Tensor:
    """Pixel intrinsics ``(..., 3, 3)`` -> the reference's normalised form: ``fx / (2 cx)``, ``fy / (2 cy)``, 0.5."""
    out = k.to(torch.float64).clone()
    out[..., 0, 0] = k[..., 0, 0] / (2 * k[..., 0, 2])
    out[..., 1, 1] = k[..., 1, 1] / (2 * k[..., 1, 2])
    out[..., 0, 2] = 0.5
    out[..., 1, 2] = 0.5
    return out


def _euler_xy_deg(r: Tensor) -> tuple[float, float]:
    """The x and y angles (degrees) of extrinsic x-y-z Euler angles of a rotation ``R = Rz Ry Rx``."""
    x = math.degrees(math.atan2(float(r[2, 1]), float(r[2, 2])))
    y = math.degrees(math.asin(max(-1.0, min(1.0, -float(r[2, 0])))))
    return x, y


def action_labels(c2w: Tensor) -> Tensor:
    """One action label 0..80 per pose (int64), from consecutive camera-to-world matrices ``(n, 4, 4)``."""
    n = c2w.shape[0]
    labels = torch.zeros(n, dtype=torch.int64)
    c2w = c2w.to(torch.float64)
    for i in range(1, n):
        rel = torch.linalg.inv(c2w[i - 1]) @ c2w[i]
        move = rel[:3, 3]
        norm = float(torch.linalg.norm(move))
        trans = [0, 0, 0, 0]
        if norm > MOVE_EPS:
            angle = [math.degrees(math.acos(max(-1.0, min(1.0, float(c) / norm)))) for c in move]
            if angle[2] < 60:
                trans[0] = 1
            elif angle[2] > 120:
                trans[1] = 1
            if angle[0] < 60:
                trans[2] = 1
            elif angle[0] > 120:
                trans[3] = 1
        ax, ay = _euler_xy_deg(rel[:3, :3])
        rot = [0, 0, 0, 0]
        if ay > ANGLE_EPS_DEG:
            rot[0] = 1
        elif ay < -ANGLE_EPS_DEG:
            rot[1] = 1
        if ax > ANGLE_EPS_DEG:
            rot[2] = 1
        elif ax < -ANGLE_EPS_DEG:
            rot[3] = 1
        labels[i] = 9 * _ONE_HOT_LABEL[tuple(trans)] + _ONE_HOT_LABEL[tuple(rot)]
    return labels


@dataclass(frozen=True, eq=False)
class Trajectory:
    """A checked WorldPlay camera path: one pose per latent frame.

    ``c2w`` ``(n, 4, 4)`` camera-to-world and ``intrinsics`` ``(n, 3, 3)`` normalised (float64),
    ``actions`` ``(n,)`` int64 in 0..80; ``source`` says where it came from (for the UI)."""

    c2w: Tensor
    intrinsics: Tensor
    actions: Tensor
    source: str = ""

    def __post_init__(self) -> None:
        n = self.c2w.shape[0]
        if self.c2w.shape != (n, 4, 4) or self.intrinsics.shape != (n, 3, 3) or self.actions.shape != (n,):
            raise TrajectoryError(
                f"a trajectory needs (n, 4, 4) poses, (n, 3, 3) intrinsics and (n,) actions, got "
                f"{tuple(self.c2w.shape)}, {tuple(self.intrinsics.shape)}, {tuple(self.actions.shape)}"
            )
        if int(self.actions.min()) < 0 or int(self.actions.max()) >= ACTION_LABELS:
            raise TrajectoryError(f"action labels must lie in 0..{ACTION_LABELS - 1}")

    @property
    def latents(self) -> int:
        return self.c2w.shape[0]

    @property
    def frames(self) -> int:
        """Video frames (``4 * latents - 3``)."""
        return frames_for_latents(self.latents)

    @property
    def chunks(self) -> int:
        return self.latents // CHUNK_LATENTS

    @property
    def w2c(self) -> Tensor:
        """World-to-camera matrices ``(n, 4, 4)``, float64 (what PRoPE and the context selection take)."""
        return torch.linalg.inv(self.c2w)

    def describe(self) -> str:
        return f"{self.latents} latent frames ({self.frames} video frames, {self.chunks} chunks of {CHUNK_LATENTS})" + (
            f" from {self.source}" if self.source else ""
        )


def check_latents(latents: int, what: str) -> None:
    """The multiple-of-4 rule, with an error that names the fix."""
    if latents % CHUNK_LATENTS == 0 and latents > 0:
        return
    down = latents - latents % CHUNK_LATENTS
    up = down + CHUNK_LATENTS
    fixes = [f"{up} ({frames_for_latents(up)} frames: add {up - latents})"]
    if down > 0:
        fixes.append(f"{down} ({frames_for_latents(down)} frames: remove {latents - down})")
    raise TrajectoryError(
        f"{what} gives {latents} latent frames ({frames_for_latents(latents)} video frames); WorldPlay generates "
        f"chunks of {CHUNK_LATENTS} latent frames, so a path needs a multiple of {CHUNK_LATENTS}: make it "
        + " or ".join(fixes)
    )


def _check_pose(i: object, c2w: Tensor, k: Tensor) -> None:
    if not bool(torch.isfinite(c2w).all() and torch.isfinite(k).all()):
        raise TrajectoryError(f"pose {i}: the matrices hold a non-finite number")
    if not torch.allclose(c2w[3], torch.tensor([0.0, 0.0, 0.0, 1.0], dtype=torch.float64), atol=1e-6):
        raise TrajectoryError(f"pose {i}: extrinsic's last row is {c2w[3].tolist()}, not [0, 0, 0, 1]")
    r = c2w[:3, :3]
    err = float((r.T @ r - torch.eye(3, dtype=torch.float64)).abs().max())
    if err > 1e-3 or float(torch.linalg.det(r)) <= 0:
        raise TrajectoryError(
            f"pose {i}: the extrinsic's 3 x 3 block is not a rotation (|R^T R - I| = {err:.2g}, det "
            f"{float(torch.linalg.det(r)):.3g}); give a camera-to-world matrix [R t; 0 0 0 1]"
        )
    if float(k[0, 0]) <= 0 or float(k[1, 1]) <= 0 or float(k[0, 2]) <= 0 or float(k[1, 2]) <= 0:
        raise TrajectoryError(
            f"pose {i}: intrinsics K need positive fx, fy, cx, cy in pixels (got fx={float(k[0, 0]):g}, "
            f"fy={float(k[1, 1]):g}, cx={float(k[0, 2]):g}, cy={float(k[1, 2]):g})"
        )


def _entries(data: object) -> list[tuple[object, Mapping]]:
    if isinstance(data, Mapping):
        if not data:
            raise TrajectoryError("the pose JSON is empty: give one entry per latent frame")
        try:
            order = sorted(data, key=lambda key: int(key))
        except (TypeError, ValueError):
            raise TrajectoryError(
                f"the pose JSON's keys must be latent indices '0', '1', ... (found {next(iter(data))!r})"
            ) from None
        if [int(k) for k in order] != list(range(len(order))):
            missing = sorted(set(range(len(order))) - {int(k) for k in order})
            raise TrajectoryError(f"the pose JSON's keys must run 0..{len(order) - 1} without gaps (missing {missing})")
        return [(k, data[k]) for k in order]
    if isinstance(data, Sequence) and not isinstance(data, (str, bytes)):
        if not data:
            raise TrajectoryError("the pose JSON is empty: give one entry per latent frame")
        return list(enumerate(data))
    raise TrajectoryError(
        'a pose JSON is an object {"0": {"extrinsic": 4x4, "K": 3x3}, "1": ...} or a list of such entries'
    )


def _matrix(i: object, entry: Mapping, key: str, shape: tuple[int, int]) -> Tensor:
    if not isinstance(entry, Mapping) or key not in entry:
        raise TrajectoryError(f"pose {i} has no {key!r} (each entry holds 'extrinsic' 4x4 and 'K' 3x3)")
    try:
        m = torch.tensor(entry[key], dtype=torch.float64)
    except (TypeError, ValueError):
        raise TrajectoryError(f"pose {i}: {key!r} is not a matrix of numbers") from None
    if tuple(m.shape) != shape:
        raise TrajectoryError(f"pose {i}: {key!r} has shape {tuple(m.shape)}, expected {shape}")
    return m


def trajectory_from_poses(c2w: Tensor, k_pixels: Tensor, source: str, latents: int = 0) -> Trajectory:
    """Check ``c2w`` ``(n, 4, 4)`` and pixel ``k`` ``(n, 3, 3)``; keep the first ``latents`` poses (0: all)."""
    n = c2w.shape[0]
    if latents:
        if latents > n:
            raise TrajectoryError(f"latents={latents} asks for more poses than the {source} holds ({n})")
        c2w, k_pixels = c2w[:latents], k_pixels[:latents]
    for i in range(c2w.shape[0]):
        _check_pose(i, c2w[i], k_pixels[i])
    what = f"the {source}" + (f" (its first {latents} poses)" if latents else f" ({n} poses)")
    if not latents and source == "pose JSON" and n % CHUNK_LATENTS == 1 and n > 1:
        # the reference's bundled assets/pose/test_forward_32_latents.json holds 33 poses: a 4k + 1 path
        down = n - 1
        raise TrajectoryError(
            f"{what} gives {n} latent frames ({frames_for_latents(n)} video frames); WorldPlay generates chunks "
            f"of {CHUNK_LATENTS} latent frames, so a path needs a multiple of {CHUNK_LATENTS}. A path of 4k + 1 "
            "poses (such as the reference's bundled test_forward_32_latents.json, 33 poses) has one pose too many "
            f"for {down} latents: set latents to {down} to keep its first {down} poses "
            f"({frames_for_latents(down)} frames), or add {CHUNK_LATENTS - 1} poses"
        )
    check_latents(c2w.shape[0], what)
    return Trajectory(c2w=c2w, intrinsics=normalise_intrinsics(k_pixels), actions=action_labels(c2w), source=source)


def trajectory_from_string(text: str, latents: int = 0) -> Trajectory:
    commands = parse_pose_string(text)
    c2w = c2w_from_commands(commands)
    k = torch.tensor(DEFAULT_K, dtype=torch.float64).expand(c2w.shape[0], 3, 3)
    label = ", ".join(f"{a}-{n}" for a, n in commands)
    return trajectory_from_poses(c2w, k, f"pose string '{label}'", latents)


def trajectory_from_json(data: object, latents: int = 0) -> Trajectory:
    """A pose JSON (its text, or the parsed object) -> a checked trajectory."""
    if isinstance(data, str):
        try:
            data = json.loads(data)
        except json.JSONDecodeError as exc:
            raise TrajectoryError(f"the pose JSON does not parse: {exc}") from None
    entries = _entries(data)
    c2w = torch.stack([_matrix(i, e, "extrinsic", (4, 4)) for i, e in entries])
    k = torch.stack([_matrix(i, e, "K", (3, 3)) for i, e in entries])
    return trajectory_from_poses(c2w, k, "pose JSON", latents)


def parse_trajectory(text: str, latents: int = 0) -> Trajectory:
    """A pose string or a pose JSON (text starting with ``{`` or ``[``) -> a checked trajectory."""
    if not isinstance(text, str):
        raise TrajectoryError(f"a camera path is text (a pose string or a pose JSON), not {type(text).__name__}")
    if isinstance(latents, bool) or not isinstance(latents, int) or latents < 0:
        raise TrajectoryError(f"latents={latents!r} must be 0 (every pose) or a positive number of latent frames")
    stripped = text.strip()
    if stripped.startswith(("{", "[")):
        return trajectory_from_json(stripped, latents)
    return trajectory_from_string(stripped, latents)


__all__ = [
    "ACTION_LABELS",
    "CHUNK_LATENTS",
    "COMMANDS",
    "DEFAULT_K",
    "Trajectory",
    "TrajectoryError",
    "action_labels",
    "c2w_from_commands",
    "check_latents",
    "frames_for_latents",
    "normalise_intrinsics",
    "parse_pose_string",
    "parse_trajectory",
    "trajectory_from_json",
    "trajectory_from_poses",
    "trajectory_from_string",
]
