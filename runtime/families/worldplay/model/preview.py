"""A top-down picture of a WorldPlay camera path: where the camera goes and where it looks.

The ground plane is the world's x-z plane seen from above (x to the right, z up the picture: the pose
string's start looks up the picture). The path joins the camera centres of every latent frame, a dot
marks each chunk's first frame, and a wedge of the camera's 60-degree view (the context selection's
horizontal field of view) shows where each chunk's first frame looks. Drawn with PIL (imported when
drawing); no ComfyUI.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

BACKGROUND = (24, 26, 30)
GRID = (48, 52, 60)
PATH = (230, 230, 235)
START = (90, 200, 120)
END = (230, 90, 90)
VIEW = (80, 150, 255)
TEXT = (200, 200, 205)
#: the view wedge's half angle (degrees), as the context selection's 60-degree view
HALF_VIEW_DEG = 30.0


def _ground(c2w: Tensor) -> tuple[Tensor, Tensor]:
    """Camera centres ``(n, 2)`` and forward directions ``(n, 2)`` on the ground plane (x, z)."""
    centres = c2w[:, [0, 2], 3].to(torch.float64)
    forward = c2w[:, [0, 2], 2].to(torch.float64)
    norm = forward.norm(dim=1, keepdim=True)
    forward = torch.where(norm > 1e-9, forward / norm.clamp_min(1e-9), torch.tensor([0.0, 1.0], dtype=torch.float64))
    return centres, forward


def render_trajectory(c2w: Tensor, size: int = 512, chunk: int = 4, caption: str = ""):
    """A ``size`` x ``size`` RGB ``PIL.Image`` of the camera-to-world path ``c2w`` ``(n, 4, 4)``."""
    from PIL import Image, ImageDraw

    if c2w.ndim != 3 or c2w.shape[1:] != (4, 4) or c2w.shape[0] < 1:
        raise ValueError(f"c2w of shape {tuple(c2w.shape)} must be (frames, 4, 4)")
    if size < 64:
        raise ValueError(f"size {size} is too small for a picture (at least 64 pixels)")
    centres, forward = _ground(c2w)
    margin = 0.12 * size
    lo, hi = centres.min(0).values, centres.max(0).values
    span = float((hi - lo).max())
    reach = max(span * 0.15, 0.25)  # the view wedges' length in world units
    span = max(span + 2 * reach, 1e-6)
    mid = (lo + hi) / 2
    scale = (size - 2 * margin) / span

    def px(p: Tensor) -> tuple[float, float]:
        return (size / 2 + float(p[0] - mid[0]) * scale, size / 2 - float(p[1] - mid[1]) * scale)

    img = Image.new("RGB", (size, size), BACKGROUND)
    draw = ImageDraw.Draw(img)
    for i in range(1, 8):
        g = i * size / 8
        draw.line([(g, 0), (g, size)], fill=GRID)
        draw.line([(0, g), (size, g)], fill=GRID)
    width = max(1, size // 170)
    r = max(2, size // 110)
    for f in range(0, c2w.shape[0], chunk):
        o, d = centres[f], forward[f]
        a = math.atan2(float(d[1]), float(d[0]))
        h = math.radians(HALF_VIEW_DEG)
        left = o + reach * torch.tensor([math.cos(a + h), math.sin(a + h)], dtype=torch.float64)
        right = o + reach * torch.tensor([math.cos(a - h), math.sin(a - h)], dtype=torch.float64)
        draw.polygon([px(o), px(left), px(right)], outline=VIEW)
        draw.line([px(o), px(o + reach * d)], fill=VIEW, width=width)
    points = [px(p) for p in centres]
    if len(points) > 1:
        draw.line(points, fill=PATH, width=width, joint="curve")
    for f in range(0, c2w.shape[0], chunk):
        x, y = points[f]
        draw.ellipse([x - r, y - r, x + r, y + r], fill=PATH)
    for (x, y), colour in ((points[0], START), (points[-1], END)):
        draw.ellipse([x - 2 * r, y - 2 * r, x + 2 * r, y + 2 * r], fill=colour)
    if caption:
        draw.text((8, 6), caption, fill=TEXT)
    draw.text((8, size - 18), f"1 grid cell = {span / 8:.3g} units (top-down: x right, z up)", fill=TEXT)
    return img


def image_tensor(img) -> Tensor:
    """A PIL RGB image -> ComfyUI's IMAGE ``(1, H, W, 3)`` float32 in [0, 1]."""
    data = torch.frombuffer(bytearray(img.tobytes()), dtype=torch.uint8)
    return data.reshape(img.height, img.width, 3).to(torch.float32).div(255).unsqueeze(0)


__all__ = ["image_tensor", "render_trajectory"]
