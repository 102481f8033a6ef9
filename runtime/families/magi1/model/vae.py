"""MAGI-1's ViT VAE decoder in pure torch (SDPA instead of flash-attn), tiled as the reference decodes.

Written from ``inference/model/vae/vae_module.py`` (``ViTDecoder``, ``Block``, ``Attention``,
``ManualLayerNorm``, ``resize_pos_embed``) and ``inference/infra/parallelism/tile_parallel.py``
(``TileProcessor.tiled_decode``) of github:SandAI-org/MAGI-1 at 6ff822e, with the reference's parameter
names (``decoder.*`` of ``ckpt/vae/diffusion_pytorch_model.safetensors``):

- a latent (B, 16, T, H, W) -> tokens (one per latent pixel) -> ``proj_in`` -> a CLS token in front ->
  ``pos_embed`` (trilinearly resized when the tile is not the training grid) -> ``depth`` blocks
  (``ln_in_attn``: no pre-attention LayerNorm; q, k and v each normalised per head without affine,
  ``(x - mean) / (std + 1e-5)``; the reference rounds q, k, v to bfloat16 before flash-attn; a GELU MLP
  with a pre-norm) -> ``norm`` -> each token unpatchified to 4 x 8 x 8 pixels of ``embed / 256`` channels ->
  ``last_layer`` (Conv3d 3 x 3 x 3 to RGB);
- 8 x 8 pixels and 4 frames per latent pixel: T latent frames decode to 4 T frames (no causal first frame);
- output in [-1, 1] (the reference then maps ``x * 127.5 + 127.5`` to uint8).

Tiling (:func:`tiled_decode`): the reference decodes each finished chunk with tiles of 256 x 256 pixels
(32 x 32 latents) overlapping by a quarter and blended linearly over 64 pixels, and 12 frames (3 latent
frames, ``fps // 2``) per tile in time without overlap.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn


class VAEConfigError(ValueError):
    """A VAE checkpoint or config this decoder cannot run (the message names the field)."""


@dataclass(frozen=True)
class VAEConfig:
    """The reference's ``ddconfig`` fields the decoder uses (defaults: the published MAGI-1 VAE)."""

    video_size: int = 256
    video_length: int = 16
    patch_size: int = 8
    patch_length: int = 4
    z_chans: int = 16
    embed_dim: int = 1024
    depth: int = 24
    num_heads: int = 16
    mlp_ratio: float = 4.0
    qkv_bias: bool = True
    with_cls_token: bool = True
    ln_in_attn: bool = True
    use_final_proj: bool = False
    #: the published VAE's latent scale: the DiT works on ``vae_latent * scale_factor``
    scale_factor: float = 0.18215

    def __post_init__(self) -> None:
        if self.embed_dim % self.num_heads:
            raise VAEConfigError(f"embed_dim {self.embed_dim} does not split into {self.num_heads} heads")
        if not self.use_final_proj and self.embed_dim % (self.patch_size**2 * self.patch_length):
            raise VAEConfigError(
                f"embed_dim {self.embed_dim} is not a multiple of {self.patch_size}x{self.patch_size}x"
                f"{self.patch_length} (each token unpatchifies into that many pixels)"
            )

    @property
    def latent_size(self) -> int:
        return self.video_size // self.patch_size

    @property
    def latent_length(self) -> int:
        return self.video_length // self.patch_length

    @property
    def unpatch_channels(self) -> int:
        return 4 if self.use_final_proj else self.embed_dim // (self.patch_size**2 * self.patch_length)

    @classmethod
    def from_ddconfig(cls, dd: dict, scale_factor: float = 0.18215) -> VAEConfig:
        """From the ``ddconfig`` of the VAE folder's ``config.json``; refuses what the decoder does not do."""
        for name, want in (("use_rope", False), ("norm_code", False)):
            if bool(dd.get(name, False)) != want:
                raise VAEConfigError(
                    f"VAE config: {name}={dd.get(name)!r} is not supported (the published VAE has {want})"
                )
        if dd.get("conv_last_layer", True) is not True:
            raise VAEConfigError("VAE config: the decoder needs conv_last_layer=True (the reference asserts it)")
        known = {f.name for f in fields(cls)}
        kw = {k: dd[k] for k in known if k in dd}
        return cls(**kw, scale_factor=scale_factor)

    def to_dict(self) -> dict:
        return asdict(self)


def decoder_shapes(cfg: VAEConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of the decoder (names under ``decoder.``) and its shape."""
    e, hidden = cfg.embed_dim, int(cfg.embed_dim * cfg.mlp_ratio)
    n = cfg.latent_size**2 * cfg.latent_length + int(cfg.with_cls_token)
    shapes = {
        "proj_in.weight": (e, cfg.z_chans),
        "proj_in.bias": (e,),
        "pos_embed": (1, n, e),
        "norm.weight": (e,),
        "norm.bias": (e,),
        "last_layer.weight": (3, cfg.unpatch_channels, 3, 3, 3),
        "last_layer.bias": (3,),
    }
    if cfg.with_cls_token:
        shapes["cls_token"] = (1, 1, e)
    if cfg.use_final_proj:
        px = 4 * cfg.patch_size**2 * cfg.patch_length
        shapes |= {
            "final_proj.weight": (px, e),
            "final_proj.bias": (px,),
            "final_norm.weight": (px,),
            "final_norm.bias": (px,),
        }
    block = {
        "attn.qkv.weight": (3 * e, e),
        "attn.proj.weight": (e, e),
        "attn.proj.bias": (e,),
        "norm2.weight": (e,),
        "norm2.bias": (e,),
        "mlp.fc1.weight": (hidden, e),
        "mlp.fc1.bias": (hidden,),
        "mlp.fc2.weight": (e, hidden),
        "mlp.fc2.bias": (e,),
    }
    if cfg.qkv_bias:
        block["attn.qkv.bias"] = (3 * e,)
    if not cfg.ln_in_attn:
        block |= {"norm1.weight": (e,), "norm1.bias": (e,)}
    for i in range(cfg.depth):
        shapes |= {f"blocks.{i}.{k}": v for k, v in block.items()}
    return shapes


def config_from_decoder_shapes(
    shapes: dict[str, tuple[int, ...]], num_heads: int | None = None, latent_length: int = 4
) -> VAEConfig:
    """A :class:`VAEConfig` from the decoder's tensor shapes (keys without ``decoder.``). Shapes cannot tell the
    head count (default: heads of 64, the published 16 of 1024) nor the training grid's split into frames and
    pixels (``latent_length``: the published VAE's 4 latent frames)."""

    def get(k):
        if k not in shapes:
            raise VAEConfigError(f"not a MAGI-1 VAE decoder: decoder.{k} is missing")
        return tuple(int(x) for x in shapes[k])

    e, z = get("proj_in.weight")
    _, n, _ = get("pos_embed")
    cls_token = "cls_token" in shapes
    grid = n - int(cls_token)
    depth = 1 + max(
        (int(k.split(".")[1]) for k in shapes if k.startswith("blocks.") and k.split(".")[1].isdigit()), default=-1
    )
    if depth < 1:
        raise VAEConfigError("not a MAGI-1 VAE decoder: no decoder.blocks.N keys")
    hidden = get("blocks.0.mlp.fc1.weight")[0]
    unpatch = get("last_layer.weight")[1]
    final_proj = "final_proj.weight" in shapes
    length = latent_length
    side = math.isqrt(grid // length) if grid % length == 0 else 0
    if side * side * length != grid:
        raise VAEConfigError(
            f"decoder.pos_embed holds {grid} grid tokens, not {length} latent frames of a square grid; give the "
            "VAE's config.json (ddconfig: video_size, video_length)"
        )
    # patch size from the unpatch channels: embed = unpatch * p^2 * patch_length with patch_length 4
    p = math.isqrt(e // (unpatch * 4)) if not final_proj else 8
    cfg = VAEConfig(
        video_size=side * p,
        video_length=length * 4,  # patch_length 4
        patch_size=p,
        patch_length=4,
        z_chans=z,
        embed_dim=e,
        depth=depth,
        num_heads=num_heads or max(1, e // 64),
        mlp_ratio=hidden / e,
        qkv_bias="blocks.0.attn.qkv.bias" in shapes,
        with_cls_token=cls_token,
        ln_in_attn="blocks.0.norm1.weight" not in shapes,
        use_final_proj=final_proj,
    )
    return cfg


def _manual_layer_norm(x: Tensor, eps: float = 1e-5) -> Tensor:
    """The reference's ``ManualLayerNorm``: (x - mean) / (population std + eps), no affine."""
    mean = x.mean(dim=-1, keepdim=True)
    std = x.std(dim=-1, keepdim=True, unbiased=False)
    return (x - mean) / (std + eps)


class Attention(nn.Module):
    def __init__(self, cfg: VAEConfig, ops, device=None, dtype=None):
        super().__init__()
        e = cfg.embed_dim
        self.heads, self.ln = cfg.num_heads, cfg.ln_in_attn
        self.qkv = ops.Linear(e, 3 * e, bias=cfg.qkv_bias, device=device, dtype=dtype)
        self.proj = ops.Linear(e, e, bias=True, device=device, dtype=dtype)

    def forward(self, x: Tensor, round_bf16: bool) -> Tensor:
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads)
        if self.ln:
            qkv = _manual_layer_norm(qkv)
        if round_bf16:  # flash_attn_qkvpacked_func(qkv=qkv.bfloat16())
            qkv = qkv.to(torch.bfloat16).to(x.dtype)
        q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
        out = F.scaled_dot_product_attention(q, k, v)
        if round_bf16:
            out = out.to(torch.bfloat16).to(x.dtype)
        return self.proj(out.transpose(1, 2).reshape(b, n, c))


class Mlp(nn.Module):
    def __init__(self, cfg: VAEConfig, ops, device=None, dtype=None):
        super().__init__()
        hidden = int(cfg.embed_dim * cfg.mlp_ratio)
        self.fc1 = ops.Linear(cfg.embed_dim, hidden, bias=True, device=device, dtype=dtype)
        self.fc2 = ops.Linear(hidden, cfg.embed_dim, bias=True, device=device, dtype=dtype)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, cfg: VAEConfig, ops, device=None, dtype=None):
        super().__init__()
        e = cfg.embed_dim
        self.norm1 = nn.Identity() if cfg.ln_in_attn else ops.LayerNorm(e, device=device, dtype=dtype)
        self.attn = Attention(cfg, ops, device, dtype)
        self.norm2 = ops.LayerNorm(e, device=device, dtype=dtype)
        self.mlp = Mlp(cfg, ops, device, dtype)

    def forward(self, x: Tensor, round_bf16: bool) -> Tensor:
        x = x + self.attn(self.norm1(x), round_bf16)
        return x + self.mlp(self.norm2(x))


def resize_pos_embed(posemb: Tensor, src: tuple[int, int, int], dst: tuple[int, int, int]) -> Tensor:
    """The reference's ``resize_pos_embed``: the grid's embeddings trilinearly resized (align_corners False)."""
    g = posemb.reshape(1, *src, -1).permute(0, 4, 1, 2, 3)
    g = F.interpolate(g, size=dst, mode="trilinear", align_corners=False)
    return g.permute(0, 2, 3, 4, 1).reshape(1, math.prod(dst), -1)


class ViTDecoder(nn.Module):
    """``decoder``: latent (B, z, T, H, W) -> video (B, 3, 4T, 8H, 8W) in [-1, 1]. ``round_bf16``: round q, k, v and
    the attention output to bfloat16 as the reference does (no-op when computing in bfloat16)."""

    def __init__(self, cfg: VAEConfig, operations=None, device=None, dtype=None, round_bf16: bool = True):
        super().__init__()
        ops = operations if operations is not None else nn
        self.cfg, self.round_bf16 = cfg, round_bf16
        e = cfg.embed_dim
        self.proj_in = ops.Linear(cfg.z_chans, e, bias=True, device=device, dtype=dtype)
        n = cfg.latent_size**2 * cfg.latent_length
        self.cls_token = nn.Parameter(torch.zeros(1, 1, e, device=device, dtype=dtype)) if cfg.with_cls_token else None
        self.pos_embed = nn.Parameter(torch.zeros(1, n + int(cfg.with_cls_token), e, device=device, dtype=dtype))
        self.blocks = nn.ModuleList([Block(cfg, ops, device, dtype) for _ in range(cfg.depth)])
        self.norm = ops.LayerNorm(e, device=device, dtype=dtype)
        if cfg.use_final_proj:
            px = 4 * cfg.patch_size**2 * cfg.patch_length
            self.final_proj = ops.Linear(e, px, bias=True, device=device, dtype=dtype)
            self.final_norm = ops.LayerNorm(px, device=device, dtype=dtype)
        self.last_layer = ops.Conv3d(
            cfg.unpatch_channels, 3, kernel_size=3, stride=1, padding=1, device=device, dtype=dtype
        )

    @property
    def dtype(self) -> torch.dtype:
        return self.proj_in.weight.dtype

    def forward(self, z: Tensor) -> Tensor:
        cfg = self.cfg
        b, c, t, h, w = z.shape
        if c != cfg.z_chans:
            raise ValueError(f"the latent has {c} channels; this VAE decodes {cfg.z_chans}")
        x = self.proj_in(z.permute(0, 2, 3, 4, 1).reshape(b, -1, c))
        cls = int(cfg.with_cls_token)
        pos = self.pos_embed.to(x)
        if (t, h, w) != (cfg.latent_length, cfg.latent_size, cfg.latent_size):
            grid = resize_pos_embed(pos[:, cls:], (cfg.latent_length, cfg.latent_size, cfg.latent_size), (t, h, w))
            pos = torch.cat([pos[:, :cls], grid], dim=1)
        if cls:
            x = torch.cat([self.cls_token.to(x).expand(b, -1, -1), x], dim=1)
        x = x + pos
        for blk in self.blocks:
            x = blk(x, self.round_bf16)
        x = self.norm(x)[:, cls:]
        if cfg.use_final_proj:
            x = self.final_norm(self.final_proj(x))
        p, pt = cfg.patch_size, cfg.patch_length
        x = x.reshape(b, t, h, w, pt, p, p, cfg.unpatch_channels)
        x = rearrange(x, "b t h w pt ph pw c -> b c (t pt) (h ph) (w pw)")
        return self.last_layer(x)


class MagiVAE(nn.Module):
    """The VAE's decoder half under its checkpoint name (``decoder.*``); the encoder is not implemented."""

    def __init__(self, cfg: VAEConfig, operations=None, device=None, dtype=None, round_bf16: bool = True):
        super().__init__()
        self.config = cfg
        self.decoder = ViTDecoder(cfg, operations, device, dtype, round_bf16)

    @torch.no_grad()
    def decode(self, z: Tensor, **tiling) -> Tensor:
        """(B, 3, 4T, 8H, 8W) in [-1, 1] of a VAE latent (not the DiT's: divide that by ``scale_factor`` first),
        decoded in the reference's tiles (:func:`tiled_decode`; ``tiling`` overrides its sizes)."""
        dtype = self.decoder.dtype

        def one(tile: Tensor) -> Tensor:
            out = self.decoder(tile.to(dtype)).float()
            # ViTVAE.decode: a single latent frame decodes to its first video frame only
            return out[:, :, :1] if tile.shape[2] == 1 else out

        return tiled_decode(one, z, **tiling)


def _blend(a: Tensor, b: Tensor, extent: int, dim: int) -> Tensor:
    """The reference's ``blend_t/v/h``: the first ``extent`` slices of ``b`` faded in from the last of ``a``."""
    extent = min(a.shape[dim], b.shape[dim], extent)
    for i in range(extent):
        w = i / extent
        b.select(dim, i).copy_(a.select(dim, a.shape[dim] - extent + i) * (1 - w) + b.select(dim, i) * w)
    return b


def tile_grid(size: int, stride: int) -> int:
    return (size + stride - 1) // stride


def tiled_decode(
    decode: Callable[[Tensor], Tensor],
    z: Tensor,
    tile_pixels: int = 256,
    tile_frames: int = 12,
    overlap: float = 0.25,
    space_stride: int = 8,
    time_stride: int = 4,
    progress: Callable[[int, int], None] | None = None,
) -> Tensor:
    """``TileProcessor.tiled_decode`` with the reference's settings (``decode_chunk``: 256 px tiles, a quarter of
    overlap blended linearly, ``fps // 2`` = 12 frames per tile in time without overlap). ``progress(done,
    total)`` after each tile."""
    lat_hw = tile_pixels // space_stride
    lat_t = tile_frames // time_stride
    if lat_hw < 1 or lat_t < 1:
        raise ValueError(f"tiles of {tile_pixels} px / {tile_frames} frames are smaller than one latent pixel")
    step_hw = int(lat_hw * (1 - overlap))
    if step_hw < 1:
        raise ValueError(f"overlap {overlap} leaves no stride between tiles of {lat_hw} latents")
    px_hw, px_t = lat_hw * space_stride, lat_t * time_stride
    blend = int(px_hw * overlap)
    limit_hw, limit_t = px_hw - blend, px_t
    nt, nh, nw = tile_grid(z.shape[2], lat_t), tile_grid(z.shape[3], step_hw), tile_grid(z.shape[4], step_hw)
    total = nt * nh * nw
    tiles: dict[tuple[int, int, int], Tensor] = {}
    done = 0
    for f in range(nt):
        for i in range(nh):
            for j in range(nw):
                tile = z[
                    :,
                    :,
                    f * lat_t : f * lat_t + lat_t,
                    i * step_hw : i * step_hw + lat_hw,
                    j * step_hw : j * step_hw + lat_hw,
                ]
                tiles[f, i, j] = decode(tile)
                done += 1
                if progress is not None:
                    progress(done, total)
    frames = []
    for f in range(nt):
        rows = []
        for i in range(nh):
            row = []
            for j in range(nw):
                tile = tiles[f, i, j].clone()
                if i > 0:
                    tile = _blend(tiles[f, i - 1, j], tile, blend, 3)
                if j > 0:
                    tile = _blend(tiles[f, i, j - 1], tile, blend, 4)
                row.append(tile[:, :, :limit_t, :limit_hw, :limit_hw])
            rows.append(torch.cat(row, dim=4))
        frames.append(torch.cat(rows, dim=3))
    return torch.cat(frames, dim=2)


def to_image(video: Tensor) -> Tensor:
    """(B, 3, T, H, W) in [-1, 1] -> ComfyUI IMAGE (B * T, H, W, 3) in [0, 1] (float; the reference rounds down to
    uint8 after ``x * 127.5 + 127.5``)."""
    return ((video.float() + 1) / 2).clamp(0, 1).permute(0, 2, 3, 4, 1).reshape(-1, video.shape[3], video.shape[4], 3)
