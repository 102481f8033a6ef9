"""Seeded latent videos for the pack's tiny autoregressive video model (pure torch, no ComfyUI).

Every video is a function of ``(prompt, seed)``: a few discs with distinct 16-channel signatures
move at constant velocity, bounce off the walls, cross and occlude one another (a fixed depth
order) over a textured background that pans slowly. The future of a chunk therefore depends on
more than that chunk: an object hidden behind another one reappears with the identity and
velocity it had before, and a texture that panned out of view comes back.

The videos live in the *model space* of ComfyUI's Wan 2.1 latent format (what the diffusion model
sees after ``process_in``; roughly unit scale per channel). :func:`to_rgb` is the fixed
latent -> RGB map used to look at them: ComfyUI's own Wan 2.1 ``latent_rgb_factors``, so ComfyUI's
latent previews of the tiny model show the same colours as the pack's decode node.

Geometry is in latent pixels; frames are latent frames. Everything is deterministic: a video is
rendered analytically for any frame index (no simulation state), so a ground-truth continuation
of any length is available for checking rollouts.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import torch
from torch import Tensor

LATENT_CHANNELS = 16

#: ComfyUI's ``latent_formats.Wan21.latent_rgb_factors`` (16 x 3) and bias, applied in model space
WAN21_RGB_FACTORS = (
    (-0.1299, -0.1692, 0.2932),
    (0.0671, 0.0406, 0.0442),
    (0.3568, 0.2548, 0.1747),
    (0.0372, 0.2344, 0.1420),
    (0.0313, 0.0189, -0.0328),
    (0.0296, -0.0956, -0.0665),
    (-0.3477, -0.4059, -0.2925),
    (0.0166, 0.1902, 0.1975),
    (-0.0412, 0.0267, -0.1364),
    (-0.1293, 0.0740, 0.1636),
    (0.0680, 0.3019, 0.1128),
    (0.0032, 0.0581, 0.0639),
    (-0.1251, 0.0927, 0.1699),
    (0.0060, -0.0633, 0.0005),
    (0.3477, 0.2275, 0.2950),
    (0.1984, 0.0913, 0.1861),
)
WAN21_RGB_BIAS = (-0.1835, -0.0868, -0.3360)
#: ``latent_formats.Wan21`` statistics: LATENT (what VAEs and SaveLatent hold) = model space * std + mean
WAN21_LATENTS_MEAN = (
    -0.7571,
    -0.7089,
    -0.9113,
    0.1075,
    -0.1745,
    0.9653,
    -0.1517,
    1.5508,
    0.4134,
    -0.0715,
    0.5517,
    -0.3632,
    -0.1922,
    -0.9497,
    0.2503,
    -0.2921,
)
WAN21_LATENTS_STD = (
    2.8184,
    1.4541,
    2.3275,
    2.6558,
    1.2196,
    1.7708,
    2.6052,
    2.0743,
    3.2687,
    2.1526,
    2.8652,
    1.5579,
    1.6382,
    1.1253,
    2.8251,
    1.9160,
)

#: object colours (RGB in 0..1); each object gets one, plus a private null-space signature
OBJECT_COLOURS = (
    (0.95, 0.15, 0.10),
    (0.10, 0.85, 0.20),
    (0.15, 0.30, 0.95),
    (0.95, 0.90, 0.10),
    (0.90, 0.15, 0.90),
    (0.10, 0.90, 0.90),
)
#: background palettes: (mean colour, texture amplitude in RGB)
PALETTES = {
    "warm": ((0.60, 0.40, 0.25), 0.05),
    "cool": ((0.25, 0.35, 0.60), 0.05),
    "green": ((0.30, 0.55, 0.30), 0.05),
}
TEXTURE_PERIOD = 32  # latent pixels; the background is periodic, so panning reveals texture seen before
TEXT_TOKENS = 8
TEXT_WIDTH = 4096  # UMT5-XXL's width: ComfyUI detects a Wan 2.1 checkpoint with a 4096-wide text embedding


@dataclass(frozen=True)
class ScenePrompt:
    """One of the scene/motion prompts the tiny model was trained on."""

    text: str
    objects: int
    speed: tuple[float, float]  # latent pixels per latent frame (min, max)
    palette: str
    pan: tuple[float, float]  # background pan in latent pixels per latent frame (x, y)


PROMPTS: tuple[ScenePrompt, ...] = (
    ScenePrompt("two balls bouncing over a warm texture", 2, (0.45, 0.7), "warm", (0.12, 0.0)),
    ScenePrompt("three balls bouncing fast over a cool texture", 3, (0.8, 1.1), "cool", (0.0, 0.12)),
    ScenePrompt("one ball drifting slowly over a green texture", 1, (0.25, 0.4), "green", (-0.1, 0.05)),
    ScenePrompt("three balls crossing slowly over a warm texture", 3, (0.3, 0.5), "warm", (-0.12, 0.0)),
    ScenePrompt("two fast balls over a green texture", 2, (0.8, 1.1), "green", (0.08, -0.08)),
    ScenePrompt("four balls bouncing over a cool texture", 4, (0.45, 0.7), "cool", (0.1, 0.1)),
)
PROMPT_TEXTS: tuple[str, ...] = tuple(p.text for p in PROMPTS)


def prompt_index(prompt: int | str) -> int:
    """Index of a prompt given by index or exact text; a clear error otherwise."""
    if isinstance(prompt, str):
        if prompt not in PROMPT_TEXTS:
            raise ValueError(f"unknown prompt {prompt!r}; the tiny model knows: {', '.join(map(repr, PROMPT_TEXTS))}")
        return PROMPT_TEXTS.index(prompt)
    if isinstance(prompt, bool) or not isinstance(prompt, int) or not 0 <= prompt < len(PROMPTS):
        raise ValueError(f"prompt index {prompt!r} is out of range 0..{len(PROMPTS) - 1}")
    return prompt


def _factors(dtype=torch.float32) -> tuple[Tensor, Tensor]:
    return torch.tensor(WAN21_RGB_FACTORS, dtype=dtype), torch.tensor(WAN21_RGB_BIAS, dtype=dtype)


def _generator(*key) -> torch.Generator:
    h = hashlib.sha256(repr(key).encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(h[:8], "little") & 0x7FFF_FFFF_FFFF_FFFF)


def colour_to_latent(rgb: Tensor, null_scale: float, g: torch.Generator) -> Tensor:
    """A 16-channel vector whose preview colour is ``rgb`` plus a random component the preview cannot see.

    ``rgb`` (..., 3) in 0..1. Solves ``x @ F + b = 2 rgb - 1`` with the least-norm x, then adds a
    random vector of the null space of F (so objects of equal colour still differ in channels).
    """
    F, b = _factors()
    target = 2 * rgb - 1 - b
    x = target @ torch.linalg.pinv(F)  # (..., 16)
    q, _ = torch.linalg.qr(F)  # (16, 3): the column space
    noise = torch.randn(*rgb.shape[:-1], LATENT_CHANNELS, generator=g) * null_scale
    noise = noise - (noise @ q) @ q.T
    return x + noise


@dataclass(frozen=True)
class Scene:
    """Everything that determines one video (see :func:`make_scene`)."""

    prompt: int
    seed: int
    height: int
    width: int
    radius: Tensor  # (n,)
    p0: Tensor  # (n, 2) positions (y, x) at frame 0, unfolded
    velocity: Tensor  # (n, 2) latent pixels per frame (y, x)
    signature: Tensor  # (n, 16) latent vector of each object
    bg_mean: Tensor  # (16,)
    bg_amp: Tensor  # (k, 16) amplitude vector of each texture wave
    bg_wave: Tensor  # (k, 2) integer wave numbers (y, x) on the periodic texture
    bg_phase: Tensor  # (k,)
    pan: tuple[float, float]  # (x, y) latent pixels per frame

    @property
    def objects(self) -> int:
        return int(self.radius.numel())


def make_scene(prompt: int | str, seed: int, height: int = 16, width: int = 16) -> Scene:
    """The scene of video ``seed`` for ``prompt`` (any seed; training and held-out sets use disjoint seeds)."""
    pi = prompt_index(prompt)
    p = PROMPTS[pi]
    g = _generator("scene", pi, int(seed), height, width)
    n = p.objects
    radius = 1.6 + 0.9 * torch.rand(n, generator=g)
    lo = radius.unsqueeze(1)
    span = torch.tensor([height, width], dtype=torch.float32) - 2 * lo
    p0 = lo + torch.rand(n, 2, generator=g) * span
    angle = torch.rand(n, generator=g) * 2 * math.pi
    speed = p.speed[0] + (p.speed[1] - p.speed[0]) * torch.rand(n, generator=g)
    velocity = torch.stack([torch.sin(angle), torch.cos(angle)], dim=1) * speed.unsqueeze(1)
    colours = torch.randperm(len(OBJECT_COLOURS), generator=g)[:n]
    signature = colour_to_latent(torch.tensor(OBJECT_COLOURS)[colours], 0.8, g)
    mean_rgb, amp = PALETTES[p.palette]
    bg_mean = colour_to_latent(torch.tensor(mean_rgb), 0.3, g)
    k = 6
    bg_wave = torch.randint(-3, 4, (k, 2), generator=g)
    bg_wave[bg_wave.abs().sum(1) == 0] = torch.tensor([1, 2])
    delta = (torch.rand(k, 3, generator=g) * 2 - 1) * amp
    F, _ = _factors()
    bg_amp = delta @ torch.linalg.pinv(F) * 2  # preview colour swing of +-amp (no bias: a zero-mean wave)
    q, _ = torch.linalg.qr(F)
    extra = torch.randn(k, LATENT_CHANNELS, generator=g) * 0.25
    bg_amp = bg_amp + extra - (extra @ q) @ q.T
    bg_phase = torch.rand(k, generator=g) * 2 * math.pi
    return Scene(
        prompt=pi,
        seed=int(seed),
        height=height,
        width=width,
        radius=radius,
        p0=p0,
        velocity=velocity,
        signature=signature,
        bg_mean=bg_mean,
        bg_amp=bg_amp,
        bg_wave=bg_wave.float(),
        bg_phase=bg_phase,
        pan=p.pan,
    )


def _fold(u: Tensor, lo: Tensor, hi: Tensor) -> Tensor:
    """Reflect ``u`` into [lo, hi] (elastic bounces off both walls, exact for any time)."""
    length = hi - lo
    w = torch.remainder(u - lo, 2 * length)
    return lo + torch.where(w <= length, w, 2 * length - w)


def object_positions(scene: Scene, frames: Tensor | range | list[int]) -> Tensor:
    """Centre (y, x) of every object at each frame: (frames, n, 2), latent pixels."""
    t = torch.as_tensor(list(frames) if not isinstance(frames, Tensor) else frames, dtype=torch.float32)
    raw = scene.p0.unsqueeze(0) + t.view(-1, 1, 1) * scene.velocity.unsqueeze(0)
    r = scene.radius.view(1, -1, 1)
    hi = torch.tensor([scene.height, scene.width], dtype=torch.float32).view(1, 1, 2) - r
    return _fold(raw, r, hi)


def render(scene: Scene, start: int, count: int) -> Tensor:
    """Frames ``start .. start+count-1`` of the scene, model space: (16, count, height, width), float32."""
    if count < 1 or start < 0:
        raise ValueError(f"need start >= 0 and count >= 1, got start={start}, count={count}")
    H, W = scene.height, scene.width
    frames = torch.arange(start, start + count, dtype=torch.float32)
    yy, xx = torch.meshgrid(
        torch.arange(H, dtype=torch.float32) + 0.5, torch.arange(W, dtype=torch.float32) + 0.5, indexing="ij"
    )
    # background: periodic texture sampled at the panned coordinates
    ox = scene.pan[0] * frames
    oy = scene.pan[1] * frames
    Y = yy.unsqueeze(0) + oy.view(-1, 1, 1)
    X = xx.unsqueeze(0) + ox.view(-1, 1, 1)
    arg = (2 * math.pi / TEXTURE_PERIOD) * (
        scene.bg_wave[:, 0].view(-1, 1, 1, 1) * Y.unsqueeze(0) + scene.bg_wave[:, 1].view(-1, 1, 1, 1) * X.unsqueeze(0)
    )
    waves = torch.cos(arg + scene.bg_phase.view(-1, 1, 1, 1))  # (k, T, H, W)
    video = scene.bg_mean.view(-1, 1, 1, 1) + torch.einsum("kc,kthw->cthw", scene.bg_amp, waves)
    # objects, back to front (a fixed depth order: later objects occlude earlier ones)
    pos = object_positions(scene, frames)  # (T, n, 2)
    for i in range(scene.objects):
        dy = yy.unsqueeze(0) - pos[:, i, 0].view(-1, 1, 1)
        dx = xx.unsqueeze(0) - pos[:, i, 1].view(-1, 1, 1)
        dist = torch.sqrt(dy * dy + dx * dx)
        alpha = (scene.radius[i] + 0.5 - dist).clamp(0, 1)  # anti-aliased disc edge
        video = video + alpha.unsqueeze(0) * (scene.signature[i].view(-1, 1, 1, 1) - video)
    return video


def scene_colours(scene: Scene) -> tuple[Tensor, Tensor, Tensor]:
    """The scene's RGB: (object colours (n, 3), background mean (3,), texture wave amplitudes (k, 3)), 0..1 scale.

    Exactly the Wan 2.1 preview colours of the latent signatures (``colour_to_latent`` hits its target
    colour, and the waves' null-space part is invisible to the preview): what :func:`to_rgb` shows.
    """
    F, b = _factors()
    obj = (scene.signature @ F + b + 1) / 2
    bg = (scene.bg_mean @ F + b + 1) / 2
    amp = (scene.bg_amp @ F) / 2
    return obj, bg, amp


def render_rgb(scene: Scene, start: int, count: int, scale: int = 8) -> Tensor:
    """Frames of the scene as RGB images, ``scale`` pixels per latent pixel: (count, H*scale, W*scale, 3) in 0..1.

    The same discs, colours, texture and motion as :func:`render`, sampled on a ``scale`` x finer grid
    with a one-pixel anti-aliased disc edge: what the latents would decode to through a VAE of stride
    ``scale`` (Wan's is 8, so 16x16 latents -> 128x128 frames). The tiny decoder is trained on it.
    """
    if count < 1 or start < 0 or scale < 1:
        raise ValueError(f"need start >= 0, count >= 1 and scale >= 1, got start={start}, count={count}, scale={scale}")
    H, W = scene.height * scale, scene.width * scale
    frames = torch.arange(start, start + count, dtype=torch.float32)
    yy, xx = torch.meshgrid(
        (torch.arange(H, dtype=torch.float32) + 0.5) / scale,
        (torch.arange(W, dtype=torch.float32) + 0.5) / scale,
        indexing="ij",
    )
    obj, bg, amp = scene_colours(scene)
    Y = yy.unsqueeze(0) + (scene.pan[1] * frames).view(-1, 1, 1)
    X = xx.unsqueeze(0) + (scene.pan[0] * frames).view(-1, 1, 1)
    arg = (2 * math.pi / TEXTURE_PERIOD) * (
        scene.bg_wave[:, 0].view(-1, 1, 1, 1) * Y.unsqueeze(0) + scene.bg_wave[:, 1].view(-1, 1, 1, 1) * X.unsqueeze(0)
    )
    waves = torch.cos(arg + scene.bg_phase.view(-1, 1, 1, 1))  # (k, T, H, W)
    img = bg.view(1, 1, 1, 3) + torch.einsum("kc,kthw->thwc", amp, waves)
    pos = object_positions(scene, frames)
    for i in range(scene.objects):
        dy = yy.unsqueeze(0) - pos[:, i, 0].view(-1, 1, 1)
        dx = xx.unsqueeze(0) - pos[:, i, 1].view(-1, 1, 1)
        dist = torch.sqrt(dy * dy + dx * dx)
        alpha = ((scene.radius[i] - dist) * scale + 0.5).clamp(0, 1).unsqueeze(-1)
        img = img + alpha * (obj[i].view(1, 1, 1, 3) - img)
    return img.clamp(0, 1)


def visibility(scene: Scene, start: int, count: int) -> Tensor:
    """Fraction of each object's disc that is not covered by objects in front of it: (count, n)."""
    H, W = scene.height, scene.width
    frames = torch.arange(start, start + count, dtype=torch.float32)
    yy, xx = torch.meshgrid(
        torch.arange(H, dtype=torch.float32) + 0.5, torch.arange(W, dtype=torch.float32) + 0.5, indexing="ij"
    )
    pos = object_positions(scene, frames)
    alphas = []
    for i in range(scene.objects):
        d = torch.sqrt((yy - pos[:, i, 0].view(-1, 1, 1)) ** 2 + (xx - pos[:, i, 1].view(-1, 1, 1)) ** 2)
        alphas.append((scene.radius[i] + 0.5 - d).clamp(0, 1))
    out = torch.zeros(count, scene.objects)
    for i in range(scene.objects):
        cover = torch.zeros_like(alphas[i])
        for j in range(i + 1, scene.objects):
            cover = torch.maximum(cover, alphas[j])
        own = alphas[i].sum(dim=(1, 2)).clamp_min(1e-6)
        out[:, i] = (alphas[i] * (1 - cover)).sum(dim=(1, 2)) / own
    return out


def estimate_positions(scene: Scene, video: Tensor, start: int) -> tuple[Tensor, Tensor]:
    """Where each object of ``scene`` appears in ``video`` (model space, (16, T, H, W) from frame ``start``).

    At every pixel the latent minus the scene's true background is unmixed (least squares over the
    16 channels) into the objects' signatures minus the background: 1 = fully that object. The
    estimate is the centroid of the pixels above 0.5; ``found`` is False where no pixel is. Returns (positions (T, n, 2), found (T, n)).
    """
    T = video.shape[1]
    bg = render_background(scene, start, T)  # (16, T, H, W)
    H, W = scene.height, scene.width
    yy, xx = torch.meshgrid(
        torch.arange(H, dtype=torch.float32) + 0.5, torch.arange(W, dtype=torch.float32) + 0.5, indexing="ij"
    )
    n = scene.objects
    pos = torch.zeros(T, n, 2)
    found = torch.zeros(T, n, dtype=torch.bool)
    if n == 0:
        return pos, found
    # per pixel, unmix x - bg = sum_i a_i (s_i - bg) by least squares over the 16 channels
    resid = (video.float() - bg).permute(1, 2, 3, 0).reshape(-1, LATENT_CHANNELS, 1)  # (THW, 16, 1)
    basis = (scene.signature.view(n, -1, 1, 1, 1) - bg.unsqueeze(0)).permute(2, 3, 4, 1, 0)
    basis = basis.reshape(-1, LATENT_CHANNELS, n)  # (THW, 16, n)
    gram = basis.transpose(1, 2) @ basis + 1e-3 * torch.eye(n)
    a = torch.linalg.solve(gram, basis.transpose(1, 2) @ resid).reshape(T, H, W, n)
    for i in range(n):
        resp = a[..., i]
        w = (resp > 0.5).float() * resp.clamp(0, 1.5)
        mass = w.sum(dim=(1, 2))
        found[:, i] = mass > 0
        safe = mass.clamp_min(1e-6)
        pos[:, i, 0] = (w * yy).sum(dim=(1, 2)) / safe
        pos[:, i, 1] = (w * xx).sum(dim=(1, 2)) / safe
    return pos, found


def fit_trajectories(
    scene: Scene, positions: Tensor, weight: Tensor, start: int = 0, iters: int = 400
) -> tuple[Tensor, Tensor]:
    """The constant-velocity, wall-bouncing trajectories (start positions and velocities, as :class:`Scene` holds
    them) that best fit measured ``positions`` ((T, n, 2) from frame ``start``, e.g. :func:`estimate_positions`),
    frame by frame weighted by ``weight`` ((T, n), 0 to leave a measurement out).

    A physics oracle: it knows the data's dynamics and each object's radius exactly and fits only what a
    model must infer from the frames it is shown (least squares through :func:`object_positions`' fold, Adam
    from 28 starts at once - the measured displacement, mirrored, and a grid of directions at the prompt's
    speeds - keeping the best per object). Returns (p0 (n, 2), velocity (n, 2))."""
    T, n = positions.shape[:2]
    t = torch.arange(start, start + T, dtype=torch.float32).view(-1, 1, 1)
    r = scene.radius.view(1, -1, 1)
    hi = torch.tensor([scene.height, scene.width], dtype=torch.float32).view(1, 1, 2) - r
    w = weight.float().unsqueeze(-1).expand(T, n, 2)
    # the measured displacement between the weighted mean positions (and times) of the two halves
    h = max(1, T // 2)

    def centre(sl):
        m = w[sl].sum(0).clamp_min(1e-6)
        return (w[sl] * positions[sl]).sum(0) / m, (w[sl] * t[sl]).sum(0) / m

    (first, t1), (last, t2) = centre(slice(0, h)), centre(slice(h, T) if T > h else slice(0, h))
    v_init = (last - first) / (t2 - t1).clamp_min(1.0)
    # restarts, all at once: the measured velocity, each axis mirrored (a bounce inside the frames), and every
    # direction (8) at the prompt's slowest, middle and fastest speed (what the scene's prompt promises)
    signs = torch.tensor([[1.0, 1.0], [-1.0, 1.0], [1.0, -1.0], [-1.0, -1.0]])
    lo, hi_speed = PROMPTS[scene.prompt].speed
    angles = torch.arange(8, dtype=torch.float32) * (math.pi / 4)
    dirs = torch.stack([torch.sin(angles), torch.cos(angles)], 1)
    grid = torch.cat([dirs * sp for sp in (lo, (lo + hi_speed) / 2, hi_speed)])  # (24, 2)
    v = torch.cat([v_init.unsqueeze(0) * signs.unsqueeze(1), grid.unsqueeze(1).expand(-1, n, 2)]).clone()
    p0 = (first.unsqueeze(0) - t1.unsqueeze(0) * v).clone()
    p0.requires_grad_(True)
    v.requires_grad_(True)
    with torch.enable_grad():
        opt = torch.optim.Adam([p0, v], lr=0.05)
        for _ in range(iters):
            pred = _fold(p0.unsqueeze(1) + t.unsqueeze(0) * v.unsqueeze(1), r.unsqueeze(0), hi.unsqueeze(0))
            loss = ((pred - positions.unsqueeze(0)).square() * w.unsqueeze(0)).sum(dim=(1, 3))  # (restarts, n)
            opt.zero_grad()
            loss.sum().backward()
            opt.step()
    best = loss.detach().argmin(0)  # per object: the restart that fits its measurements best
    idx = torch.arange(n)
    return p0.detach()[best, idx], v.detach()[best, idx]


def render_background(scene: Scene, start: int, count: int) -> Tensor:
    """The background alone (no objects): (16, count, H, W)."""
    empty = Scene(
        **{
            **scene.__dict__,
            "radius": scene.radius[:0],
            "p0": scene.p0[:0],
            "velocity": scene.velocity[:0],
            "signature": scene.signature[:0],
        }
    )
    return render(empty, start, count)


def to_rgb(video: Tensor) -> Tensor:
    """Model-space latents (16, T, H, W) (or a batch (B, 16, T, H, W)) -> RGB in 0..1, (…, T, H, W, 3).

    The map ComfyUI's latent previews use for Wan 2.1: ``(x @ latent_rgb_factors + bias + 1) / 2``.
    """
    F, b = _factors(torch.float32)
    x = video.float().movedim(-4, -1)  # (..., T, H, W, 16)
    return ((x @ F + b + 1) / 2).clamp(0, 1)


def to_wan_latent(video: Tensor) -> Tensor:
    """Model space -> ComfyUI LATENT values (Wan 2.1 ``process_out``); channels at dim -4."""
    shape = [1] * video.dim()
    shape[-4] = LATENT_CHANNELS
    mean = torch.tensor(WAN21_LATENTS_MEAN, dtype=video.dtype).view(shape)
    std = torch.tensor(WAN21_LATENTS_STD, dtype=video.dtype).view(shape)
    return video * std + mean


def from_wan_latent(latent: Tensor) -> Tensor:
    """ComfyUI LATENT values -> model space (Wan 2.1 ``process_in``); channels at dim -4."""
    shape = [1] * latent.dim()
    shape[-4] = LATENT_CHANNELS
    mean = torch.tensor(WAN21_LATENTS_MEAN, dtype=latent.dtype).view(shape)
    std = torch.tensor(WAN21_LATENTS_STD, dtype=latent.dtype).view(shape)
    return (latent - mean) / std


def prompt_embedding(prompt: int | str, tokens: int = TEXT_TOKENS, width: int = TEXT_WIDTH) -> Tensor:
    """The text embedding the tiny model was trained with for ``prompt``: (1, tokens, width), fixed forever.

    Stands in for a text encoder: one seeded Gaussian per prompt (no UMT5 needed to run the model).
    """
    pi = prompt_index(prompt)
    g = _generator("prompt", pi, tokens, width)
    return torch.randn(1, tokens, width, generator=g)
