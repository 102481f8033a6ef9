"""LingBot-World 2.0 camera paths -> the camera features its DiT folds into every token, in pure torch (float64 until
the features are rounded once to the model's dtype).

What the reference does (robbyant/lingbot-world-v2 ``wan/image2video.py`` 551-586, ``wan/utils/cam_utils.py``):

1. ``poses.npy``: camera-to-world matrices, OpenCV convention (x right, y down, z forward), one per **video** frame;
   ``intrinsics.npy``: ``(fx, fy, cx, cy)`` in pixels of a 480 x 832 frame (only the first row is used), scaled to the
   video's size;
2. the poses of the video's frames are resampled to one per latent frame (translation linear, rotation slerp), over
   the same time span;
3. relative to frame 0, then each pose relative to the previous one (``framewise``), and every translation divided
   by the largest translation norm of the whole path (a path that does not move is left as it is);
4. per pixel of the video frame: ``d = normalise(((x + .5 - cx) / fx, (y + .5 - cy) / fy, 1))``, the 6 channels
   ``[t, R d]`` (origin and world direction: not a Plucker moment), folded 8 x 8 pixels per latent pixel (384
   channels, channel-major) and 1 x 2 x 2 latent pixels per token: **1536 features per token**.

A typed path (:func:`parse_key_path`) follows the LingBot realtime convention of SGLang-diffusion's
``lingbot_world_camera.actions_to_c2ws`` (one pose per latent frame, no resampling): ``w`` / ``s`` move 0.05 forward /
back and ``d`` / ``a`` right / left along the camera's axes flattened onto the ground plane, ``right`` / ``left`` (or
``l`` / ``j``) yaw 6 degrees about the world's vertical, ``up`` / ``down`` (or ``i`` / ``k``) pitch 4 degrees about
the camera's x axis, the pitch held within +-85 degrees; intrinsics ``fx = fy = 500`` px at the video's size with the
principal point in the middle. The syntax is HY-WorldPlay Trajectory's (``w-8, right-4``: durations in latent frames,
``1 + sum`` poses), with ``+`` for keys held together (``w+right-4``); the motions are LingBot's, not WorldPlay's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

#: the frame size the reference's ``intrinsics.npy`` are for (height, width)
REFERENCE_HW = (480, 832)
#: video pixels per latent pixel (Wan's VAE), folded into the camera channels
VAE_STRIDE = 8
#: channels of the per-pixel map ([t, R d])
RAY_CHANNELS = 6
#: the typed path's steps (SGLang-diffusion's LingBot camera)
MOVE = 0.05
YAW_DEG = 6.0
PITCH_DEG = 4.0
PITCH_LIMIT_DEG = 85.0
DEFAULT_FOCAL = 500.0
#: key -> (motion, sign)
KEYS: dict[str, tuple[str, int]] = {
    "w": ("forward", 1),
    "s": ("forward", -1),
    "d": ("right", 1),
    "a": ("right", -1),
    "right": ("yaw", 1),
    "l": ("yaw", 1),
    "left": ("yaw", -1),
    "j": ("yaw", -1),
    "up": ("pitch", 1),
    "i": ("pitch", 1),
    "down": ("pitch", -1),
    "k": ("pitch", -1),
    "none": ("none", 0),
}


class CameraError(ValueError):
    """A camera path LingBot-World cannot take (the message names the value and the fix)."""


def camera_features(patch: Sequence[int] = (1, 2, 2)) -> int:
    """Features per token: 6 channels x 8 x 8 pixels x the patch's latent pixels (1536 for 1 x 2 x 2)."""
    return RAY_CHANNELS * VAE_STRIDE * VAE_STRIDE * math.prod(patch)


# ------------------------------------------------------------------------------------------------ rotations
def _rotvec_between(r0: Tensor, r1: Tensor) -> Tensor:
    """The rotation vector of ``r0^T r1`` (the principal log, angle in [0, pi]), float64, ``(..., 3)``."""
    rel = r0.transpose(-1, -2) @ r1
    v = 0.5 * torch.stack(
        [rel[..., 2, 1] - rel[..., 1, 2], rel[..., 0, 2] - rel[..., 2, 0], rel[..., 1, 0] - rel[..., 0, 1]], -1
    )
    s = v.norm(dim=-1)
    c = 0.5 * (rel[..., 0, 0] + rel[..., 1, 1] + rel[..., 2, 2] - 1)
    angle = torch.atan2(s, c)
    axis = torch.where(s[..., None] > 1e-12, v / s.clamp_min(1e-300)[..., None], torch.zeros_like(v))
    near_pi = (s <= 1e-6) & (c < 0)
    if bool(near_pi.any()):  # axis from the symmetric part: (R + I) / 2 = a a^T at angle pi
        sym = 0.5 * (rel + torch.eye(3, dtype=rel.dtype))
        col = sym.diagonal(dim1=-2, dim2=-1).argmax(-1)
        a = torch.gather(sym, -1, col[..., None, None].expand(*sym.shape[:-1], 1)).squeeze(-1)
        a = a / a.norm(dim=-1, keepdim=True).clamp_min(1e-300)
        axis = torch.where(near_pi[..., None], a, axis)
    return axis * angle[..., None]


def _rotation(rotvec: Tensor) -> Tensor:
    """Rodrigues: rotation vectors ``(..., 3)`` -> matrices ``(..., 3, 3)``, float64."""
    angle = rotvec.norm(dim=-1)
    axis = rotvec / angle.clamp_min(1e-300)[..., None]
    x, y, z = axis.unbind(-1)
    zero = torch.zeros_like(x)
    k = torch.stack([zero, -z, y, z, zero, -x, -y, x, zero], -1).reshape(*rotvec.shape[:-1], 3, 3)
    eye = torch.eye(3, dtype=rotvec.dtype).expand_as(k)
    s, c = torch.sin(angle)[..., None, None], torch.cos(angle)[..., None, None]
    return eye + s * k + (1 - c) * (k @ k)


def _linspace(start: float, stop: float, num: int) -> Tensor:
    """numpy's ``linspace`` (``i * step + start``, the last value ``stop``), float64."""
    if num == 1:
        return torch.tensor([float(start)], dtype=torch.float64)
    step = (stop - start) / (num - 1)
    out = torch.arange(num, dtype=torch.float64) * step + start
    out[-1] = stop
    return out


def resample_poses(c2w: Tensor, count: int) -> Tensor:
    """``c2w`` ``(N, 4, 4)`` at times ``0 .. N-1`` resampled at ``count`` times spread over the same span:
    translation linear, rotation along the geodesic between neighbours (scipy's ``interp1d`` and ``Slerp``, as the
    reference). float64."""
    c2w = c2w.to(torch.float64)
    n = c2w.shape[0]
    if n == 1 or count == n:
        return c2w.clone()
    t = _linspace(0.0, n - 1.0, count)
    lo = torch.clamp(torch.floor(t).to(torch.long), 0, n - 2)
    alpha = t - lo.to(torch.float64)
    r0, r1 = c2w[lo, :3, :3], c2w[lo + 1, :3, :3]
    rot = r0 @ _rotation(_rotvec_between(r0, r1) * alpha[:, None])
    t0, t1 = c2w[lo, :3, 3], c2w[lo + 1, :3, 3]
    trans = (t1 - t0) * alpha[:, None] + t0
    out = torch.zeros(count, 4, 4, dtype=torch.float64)
    out[:, :3, :3], out[:, :3, 3], out[:, 3, 3] = rot, trans, 1.0
    return out


def _se3_inverse(m: Tensor) -> Tensor:
    out = torch.zeros_like(m)
    r = m[..., :3, :3].transpose(-1, -2)
    out[..., :3, :3] = r
    out[..., :3, 3] = -(r @ m[..., :3, 3:]).squeeze(-1)
    out[..., 3, 3] = 1.0
    return out


def relative_poses(c2w: Tensor) -> Tensor:
    """The reference's ``compute_relative_poses(framewise=True, normalize_trans=True)``: pose 0 the identity, each
    later pose in the previous one's frame, translations divided by the path's largest translation norm."""
    rel = _se3_inverse(c2w[:1]) @ c2w
    rel[0] = torch.eye(4, dtype=c2w.dtype)
    out = rel.clone()
    out[1:] = _se3_inverse(rel[:-1]) @ rel[1:]
    largest = out[:, :3, 3].norm(dim=-1).max()
    if largest > 0:
        out[:, :3, 3] = out[:, :3, 3] / largest
    return out


def scale_intrinsics(k: Sequence[float], from_hw: Sequence[int], to_hw: Sequence[int]) -> tuple[float, ...]:
    """``(fx, fy, cx, cy)`` for a ``from_hw`` frame -> for a ``to_hw`` frame (scaled, no crop: ``get_Ks_transformed``)."""
    sy, sx = to_hw[0] / from_hw[0], to_hw[1] / from_hw[1]
    fx, fy, cx, cy = (float(v) for v in k)
    return (fx * sx, fy * sy, cx * sx, cy * sy)


def ray_map(c2w: Tensor, k: Sequence[float], height: int, width: int) -> Tensor:
    """The per-pixel ``[t, R d]`` map ``(F, height, width, 6)`` of poses ``c2w`` ``(F, 4, 4)``, float64."""
    c2w = c2w.to(torch.float64)
    fx, fy, cx, cy = (float(v) for v in k)
    ys, xs = torch.meshgrid(
        torch.arange(height, dtype=torch.float64) + 0.5, torch.arange(width, dtype=torch.float64) + 0.5, indexing="ij"
    )
    dirs = torch.stack([(xs - cx) / fx, (ys - cy) / fy, torch.ones_like(xs)], -1).reshape(-1, 3)
    dirs = dirs / dirs.norm(dim=-1, keepdim=True)
    rays_d = (c2w[:, :3, :3] @ dirs.T).transpose(1, 2)
    rays_o = c2w[:, :3, 3].unsqueeze(1).expand_as(rays_d)
    return torch.cat([rays_o, rays_d], -1).reshape(c2w.shape[0], height, width, RAY_CHANNELS)


def fold_tokens(rays: Tensor, patch: Sequence[int] = (1, 2, 2)) -> Tensor:
    """``(F, 8 h, 8 w, 6)`` -> ``(F * h/ph * w/pw, 6 * 64 * prod(patch))``: 8 x 8 pixels per latent pixel, channel-major
    (``'f (h c1) (w c2) c -> f h w (c c1 c2)'``), then the patch's latent pixels per token (``'(f p0) (h p1) (w p2) C ->
    (f h w) (C p0 p1 p2)'``), token order frame-major as the DiT's."""
    f, hp, wp, c = rays.shape
    s = VAE_STRIDE
    h, w = hp // s, wp // s
    x = rays.reshape(f, h, s, w, s, c).permute(0, 1, 3, 5, 2, 4).reshape(f, h, w, c * s * s)
    p0, p1, p2 = (int(p) for p in patch)
    if f % p0 or h % p1 or w % p2:
        raise CameraError(f"a {f} x {h} x {w} latent does not split into {p0} x {p1} x {p2} patches")
    x = x.reshape(f // p0, p0, h // p1, p1, w // p2, p2, c * s * s).permute(0, 2, 4, 6, 1, 3, 5)
    return x.reshape((f // p0) * (h // p1) * (w // p2), -1)


# ------------------------------------------------------------------------------------------------ paths
def parse_key_path(text: str) -> list[tuple[tuple[str, ...], int]]:
    """``"w-8, w+right-4, none-3"`` -> ``[(('w',), 8), (('right', 'w'), 4), (('none',), 3)]``. CameraError naming the
    token and the fix."""
    out = []
    for token in str(text).replace("\n", ",").split(","):
        token = "".join(token.split()).lower()
        if not token:
            continue
        keys, _, count = token.rpartition("-")
        if not keys or not count.isdigit() or int(count) < 1:
            raise CameraError(
                f"camera path token {token!r}: write <keys>-<latent frames>, e.g. w-8 or w+right-4 (keys: "
                f"{', '.join(KEYS)})"
            )
        names = tuple(sorted(set(keys.split("+"))))
        unknown = [k for k in names if k not in KEYS]
        if unknown:
            raise CameraError(f"camera path token {token!r}: unknown keys {unknown}; use {', '.join(KEYS)}")
        out.append((names, int(count)))
    if not out:
        raise CameraError("the camera path is empty: write e.g. 'w-15' (16 latent frames moving forward)")
    return out


def _rot_x(a: float) -> Tensor:
    c, s = math.cos(a), math.sin(a)
    return torch.tensor([[1, 0, 0], [0, c, -s], [0, s, c]], dtype=torch.float64)


def _rot_y(a: float) -> Tensor:
    c, s = math.cos(a), math.sin(a)
    return torch.tensor([[c, 0, s], [0, 1, 0], [-s, 0, c]], dtype=torch.float64)


def c2w_from_keys(commands: Sequence[tuple[Sequence[str], int]]) -> Tensor:
    """Integrate key commands from the identity: ``1 + sum(durations)`` camera-to-world poses (float64)."""
    c2w = torch.eye(4, dtype=torch.float64)
    pitch, limit = 0.0, math.radians(PITCH_LIMIT_DEG)
    poses = [c2w.clone()]
    ground = torch.tensor([1.0, 0.0, 1.0], dtype=torch.float64)
    for keys, count in commands:
        motion = {KEYS[k][0]: 0 for k in keys}
        for k in keys:
            motion[KEYS[k][0]] += KEYS[k][1]
        for _ in range(count):
            dp = math.radians(PITCH_DEG) * motion.get("pitch", 0)
            if abs(pitch + dp) <= limit:
                pitch += dp
            else:
                dp = 0.0
            rot = _rot_y(math.radians(YAW_DEG) * motion.get("yaw", 0)) @ c2w[:3, :3] @ _rot_x(dp)
            fwd, right = rot[:, 2] * ground, rot[:, 0] * ground
            fwd, right = fwd / (fwd.norm() + 1e-6), right / (right.norm() + 1e-6)
            move = MOVE * (fwd * motion.get("forward", 0) + right * motion.get("right", 0))
            c2w = c2w.clone()
            c2w[:3, :3], c2w[:3, 3] = rot, c2w[:3, 3] + move
            poses.append(c2w.clone())
    return torch.stack(poses)


@dataclass(frozen=True, eq=False)
class CameraPath:
    """A camera path as the user gave it: ``c2w`` ``(N, 4, 4)`` (OpenCV camera-to-world, float64), one per video frame
    (``per="video"``: a pose folder, resampled to the latents as the reference does) or per latent frame
    (``per="latent"``: a typed path, used as it is); ``intrinsics`` ``(fx, fy, cx, cy)`` in pixels of an
    ``intrinsics_hw`` frame (None: 500 px focal length at the video's size, centred); ``source`` for messages."""

    c2w: Tensor
    per: str
    intrinsics: tuple[float, float, float, float] | None = None
    intrinsics_hw: tuple[int, int] = REFERENCE_HW
    source: str = ""

    def __post_init__(self) -> None:
        c2w = self.c2w
        if not isinstance(c2w, Tensor) or c2w.ndim != 3 or tuple(c2w.shape[1:]) != (4, 4) or c2w.shape[0] < 1:
            raise CameraError(
                f"camera poses must be (N, 4, 4) camera-to-world matrices, got {getattr(c2w, 'shape', c2w)}"
            )
        if not bool(torch.isfinite(c2w).all()):
            raise CameraError(f"camera poses of {self.source or 'the path'} contain NaN or Inf")
        if self.per not in ("video", "latent"):
            raise CameraError(f"per={self.per!r} must be 'video' or 'latent'")
        if self.intrinsics is not None and (len(self.intrinsics) != 4 or min(self.intrinsics[:2]) <= 0):
            raise CameraError(f"intrinsics {self.intrinsics} must be (fx, fy, cx, cy) with fx, fy > 0")
        object.__setattr__(self, "c2w", c2w.to(torch.float64))

    def latents_available(self) -> int:
        """The most latent frames this path covers."""
        n = self.c2w.shape[0]
        return n if self.per == "latent" else (n - 1) // 4 + 1

    def describe(self) -> str:
        unit = "video frames" if self.per == "video" else "latent frames"
        return f"{self.source or 'camera path'}: {self.c2w.shape[0]} poses ({unit}), {self.latents_available()} latents"

    def latent_poses(self, latent_frames: int) -> Tensor:
        """The relative, normalised pose of each of ``latent_frames`` latent frames (``(F, 4, 4)`` float64).
        Pose folders: the poses of the ``4 (F - 1) + 1`` video frames the latents cover, resampled to ``F``."""
        if latent_frames > self.latents_available():
            raise CameraError(
                f"the video has {latent_frames} latent frames but {self.describe()}: give a longer path or a shorter "
                "video"
            )
        if self.per == "latent":
            poses = self.c2w[:latent_frames]
        else:
            frames = 4 * (latent_frames - 1) + 1
            poses = resample_poses(self.c2w[:frames], latent_frames)
        return relative_poses(poses)

    def pixel_intrinsics(self, height: int, width: int) -> tuple[float, ...]:
        """``(fx, fy, cx, cy)`` for a ``height`` x ``width`` video."""
        if self.intrinsics is None:
            return (DEFAULT_FOCAL, DEFAULT_FOCAL, width / 2.0, height / 2.0)
        return scale_intrinsics(self.intrinsics, self.intrinsics_hw, (height, width))


class CameraMap:
    """The camera features of one video: its latent poses and intrinsics, and :meth:`tokens` per chunk."""

    def __init__(self, path: CameraPath, latent_frames: int, latent_h: int, latent_w: int, patch=(1, 2, 2)):
        self.poses = path.latent_poses(latent_frames)
        self.height, self.width = VAE_STRIDE * latent_h, VAE_STRIDE * latent_w
        self.k = path.pixel_intrinsics(self.height, self.width)
        self.patch = tuple(int(p) for p in patch)

    def tokens(self, start: int, stop: int, dtype=torch.float32, device=None) -> Tensor:
        """``(1, tokens, 1536)`` camera features of latent frames ``start .. stop - 1`` (rounded once to ``dtype``)."""
        rays = ray_map(self.poses[start:stop], self.k, self.height, self.width)
        return fold_tokens(rays, self.patch).unsqueeze(0).to(device=device, dtype=dtype)


def path_from_arrays(poses, intrinsics=None, source: str = "poses.npy") -> CameraPath:
    """A pose folder's arrays -> a :class:`CameraPath` per video frame (only the first intrinsics row is used)."""
    c2w = torch.as_tensor(poses, dtype=torch.float64)
    k = None
    if intrinsics is not None:
        kt = torch.as_tensor(intrinsics, dtype=torch.float64).reshape(-1, 4)
        k = tuple(float(v) for v in kt[0])
    return CameraPath(c2w, "video", k, REFERENCE_HW, source)


def path_from_keys(text: str) -> CameraPath:
    """A typed key path -> a :class:`CameraPath` per latent frame (500 px focal length, centred)."""
    return CameraPath(c2w_from_keys(parse_key_path(text)), "latent", None, REFERENCE_HW, f"path {text.strip()!r}")


__all__ = [
    "CameraError",
    "CameraMap",
    "CameraPath",
    "KEYS",
    "REFERENCE_HW",
    "c2w_from_keys",
    "camera_features",
    "fold_tokens",
    "parse_key_path",
    "path_from_arrays",
    "path_from_keys",
    "ray_map",
    "relative_poses",
    "resample_poses",
    "scale_intrinsics",
]
