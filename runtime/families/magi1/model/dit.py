"""The MAGI-1 DiT in pure torch, with the reference's module and parameter names (official checkpoints load as-is).

Written from ``inference/model/dit/dit_module.py`` and ``dit_model.py`` of github:SandAI-org/MAGI-1 (commit
6ff822e), without flash-attn, flashinfer or Triton:

- ``x_embedder``: a Conv3d patchifier (t_patch x 2 x 2, no bias); the input is first scaled by
  ``x_rescale_factor`` and, for the 24B (``half_channel_vae``), fed twice along the channels;
- ``t_embedder``: sinusoid of ``1000 t`` (256 wide) -> MLP, where ``t`` runs from 0 (noise) to 1 (clean);
  the distilled models add the embedding of a step-size constant (``num_steps / 4 * 2``);
- ``y_embedder``: the caption's cross-attention projection (Linear + SiLU) and the AdaLN condition, which is
  *not* the caption but one of two learned tokens (``null_caption_embedding[-2]``, or ``[-1]`` when the caption
  is dropped, as in the cfg passes);
- 3-D RoPE with learned frequencies ``rope.bands`` (head_dim // 8 per axis): it rotates 3/4 of each head
  (96 of 128) GPT-NeoX style; time is absolute from the start of the video, space centred and scaled to
  a 16 x 16 reference grid;
- per layer: one LayerNorm, then parallel self-attention (q, k, v with per-head zero-centred LayerNorm on
  q and k, RoPE, grouped-query attention) and cross-attention to the chunk's own caption (qx, and K/V from
  the caption; per-head norms, no RoPE); both outputs concatenated, reordered in 8 groups (the reference's
  TP-8 layout) and projected; gates-only AdaLN (SiLU -> Linear -> tanh softcap, two gates per chunk);
  sandwich post-norms (``post_norm(gate * x) + residual`` after attention and after the MLP, GELU or SwiGLU);
- ``final_layernorm`` and ``final_linear`` (no bias), unpatchified; the output (a velocity towards the clean
  latent) is divided by ``x_rescale_factor``.

Precision follows the reference's ``_high_precision_promoter`` and autocast regions: the embedders, RoPE,
q/k norms, post-norms, the final norm and linear, and ``linear_proj`` compute in float32; the rest in
the compute dtype (``compute_dtype``, bf16 in the reference).

ComfyUI's ``operations`` (its ``comfy.ops`` classes: ``Linear``, ``Conv3d``, ``LayerNorm``) are a constructor
argument; the default is plain ``torch.nn``. The zero-centred norms, ``rope.bands`` and the null caption are
plain parameters, cast at use (so fp8 storage works). Every self-attention call goes through the
``attention`` callable a forward is given (:mod:`runtime.families.magi1.model.attention`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from .attention import ChunkPlan, no_cache, sdpa
from .config import FREQ_DIM, PROJ_GROUPS, MagiConfig

TORCH_OPS = SimpleNamespace(Linear=nn.Linear, Conv3d=nn.Conv3d, LayerNorm=nn.LayerNorm)
AttentionFn = Callable[[int, Tensor, Tensor, Tensor, ChunkPlan], Tensor]
#: the reference's ``TimestepEmbedder.timestep_rescale_factor``
TIMESTEP_SCALE = 1000.0
#: the reference's ``softcap_gate_cap``
GATE_CAP = 1.0


def _cast(p: Tensor, like: Tensor) -> Tensor:
    return p.to(device=like.device, dtype=like.dtype)


class ZeroCenteredLayerNorm(nn.Module):
    """The reference's ``FusedLayerNorm`` with ``apply_layernorm_1p``: LayerNorm with gamma = 1 + weight."""

    def __init__(self, size: int, eps: float, one_plus: bool = True, device=None, dtype=None):
        super().__init__()
        self.size, self.eps, self.one_plus = size, eps, one_plus
        self.weight = nn.Parameter(torch.zeros(size, device=device, dtype=dtype))
        self.bias = nn.Parameter(torch.zeros(size, device=device, dtype=dtype))

    def forward(self, x: Tensor) -> Tensor:
        w = _cast(self.weight, x)
        w = w + 1 if self.one_plus else w
        return F.layer_norm(x, (self.size,), w, _cast(self.bias, x), self.eps)


class TimestepEmbedder(nn.Module):
    def __init__(self, cfg: MagiConfig, ops, device=None):
        super().__init__()
        d = cfg.cond_dim
        self.mlp = nn.Sequential(
            ops.Linear(FREQ_DIM, d, bias=True, device=device, dtype=torch.float32),
            nn.SiLU(),
            ops.Linear(d, d, bias=True, device=device, dtype=torch.float32),
        )

    @staticmethod
    def sinusoid(t: Tensor, dim: int = FREQ_DIM, max_period: float = 10000.0) -> Tensor:
        half = dim // 2
        freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32) / half).to(t.device)
        args = t[:, None].float() * freqs[None] * TIMESTEP_SCALE
        emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
        if dim % 2:
            emb = torch.cat([emb, torch.zeros_like(emb[:, :1])], dim=-1)
        return emb

    def forward(self, t: Tensor, compute_dtype: torch.dtype) -> Tensor:
        # the reference rounds the sinusoid to params_dtype before its float32 MLP
        return self.mlp(self.sinusoid(t.float()).to(compute_dtype).float())


class CaptionEmbedder(nn.Module):
    def __init__(self, cfg: MagiConfig, ops, device=None):
        super().__init__()
        self.y_proj_xattn = nn.Sequential(
            ops.Linear(cfg.caption_channels, cfg.xattn_dim, bias=True, device=device, dtype=torch.float32), nn.SiLU()
        )
        self.y_proj_adaln = nn.Sequential(
            ops.Linear(cfg.caption_channels, cfg.cond_dim, bias=True, device=device, dtype=torch.float32)
        )
        self.null_caption_embedding = nn.Parameter(
            torch.zeros(cfg.caption_max_length, cfg.caption_channels, device=device, dtype=torch.float32)
        )

    def adaln_token(self, dropped: Tensor) -> Tensor:
        """(N, caption_channels) float32: ``null[-1]`` where the caption is dropped, ``null[-2]`` elsewhere."""
        null = self.null_caption_embedding.float()
        return torch.where(dropped.to(null.device)[:, None], null[-1][None], null[-2][None])


class Rope(nn.Module):
    """``LearnableRotaryEmbeddingCat(head_dim, in_pixels=False)``: ``bands`` (head_dim // 8) learned frequencies."""

    def __init__(self, cfg: MagiConfig, device=None):
        super().__init__()
        nb = cfg.rope_bands
        exp = torch.arange(nb, dtype=torch.float32) / nb
        self.bands = nn.Parameter((1.0 / (10000.0**exp)).to(device))

    def table(self, first_frame: int, frames: int, h: int, w: int, device) -> tuple[Tensor, Tensor]:
        """(sin, cos), each (frames * h * w, 3 * bands) float32, for latent frames ``first_frame`` .. +frames of a
        video whose tokens are ``h`` x ``w`` per frame (the reference's ``get_embed`` over ``first_frame + frames``
        frames, keeping the last ``frames``)."""
        total = first_frame + frames
        rescale = math.sqrt((h * w) / (16 * 16))
        feat = (total, h, w)
        ref = (total, h / rescale, w / rescale)
        axes = [
            torch.arange(total, device=device, dtype=torch.int64).to(torch.float32)[first_frame:],
            torch.arange(h, device=device, dtype=torch.int64).to(torch.float32) - (h - 1) / 2,
            torch.arange(w, device=device, dtype=torch.int64).to(torch.float32) - (w - 1) / 2,
        ]
        axes = [x if f == 1 else x / (f - 1) * (r - 1) for x, f, r in zip(axes, feat, ref)]
        grid = torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1).unsqueeze(-1)
        pos = grid * self.bands.float().to(device)
        n = frames * h * w
        return pos.sin().reshape(n, -1), pos.cos().reshape(n, -1)


def apply_rope(x: Tensor, sin: Tensor, cos: Tensor) -> Tensor:
    """flash-attn's ``apply_rotary_emb`` (non-interleaved): the first 2 * sin.shape[-1] channels of ``x``
    (batch, heads, tokens, head_dim) rotated as [x1 cos - x2 sin, x2 cos + x1 sin], the rest unchanged."""
    half = sin.shape[-1]
    x1, x2, rest = x[..., :half], x[..., half : 2 * half], x[..., 2 * half :]
    sin, cos = sin.to(x.dtype), cos.to(x.dtype)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], dim=-1)


class LayerNormLinear(nn.Module):
    """``linear_qkv``: one LayerNorm, then the q (self), qx (cross), k and v projections."""

    def __init__(self, cfg: MagiConfig, ops, device=None, dtype=None):
        super().__init__()
        h, q_out, kv_out = (
            cfg.hidden_size,
            cfg.num_attention_heads * cfg.kv_channels,
            cfg.num_query_groups * cfg.kv_channels,
        )
        self.layer_norm = ops.LayerNorm(h, eps=cfg.layernorm_epsilon, device=device, dtype=dtype)
        self.q = ops.Linear(h, q_out, bias=False, device=device, dtype=dtype)
        self.qx = ops.Linear(h, q_out, bias=False, device=device, dtype=dtype)
        self.k = ops.Linear(h, kv_out, bias=False, device=device, dtype=dtype)
        self.v = ops.Linear(h, kv_out, bias=False, device=device, dtype=dtype)


class SelfAttention(nn.Module):
    """``self_attention``: the parallel self- and cross-attention of one layer (reference: FullyParallelAttention)."""

    def __init__(self, cfg: MagiConfig, ops, device=None, dtype=None):
        super().__init__()
        self.cfg = cfg
        hd, eps = cfg.kv_channels, cfg.layernorm_epsilon
        one_p = cfg.apply_layernorm_1p
        self.linear_qkv = LayerNormLinear(cfg, ops, device, dtype)
        self.linear_kv_xattn = ops.Linear(
            cfg.xattn_dim, 2 * cfg.num_query_groups * hd, bias=False, device=device, dtype=dtype
        )
        self.linear_proj = ops.Linear(
            2 * cfg.num_attention_heads * hd, cfg.hidden_size, bias=False, device=device, dtype=dtype
        )
        # q/k norms compute in float32 (the reference promotes them); the cross-attention ones stay in the
        # compute dtype (its promoter skips names with "_xattn")
        self.q_layernorm = ZeroCenteredLayerNorm(hd, eps, one_p, device, torch.float32)
        self.q_layernorm_xattn = ZeroCenteredLayerNorm(hd, eps, one_p, device, dtype)
        self.k_layernorm = ZeroCenteredLayerNorm(hd, eps, one_p, device, torch.float32)
        self.k_layernorm_xattn = ZeroCenteredLayerNorm(hd, eps, one_p, device, dtype)

    def _heads(self, x: Tensor, heads: int) -> Tensor:
        """(N, S, heads * hd) -> (N, heads, S, hd)."""
        n, s, _ = x.shape
        return x.view(n, s, heads, self.cfg.kv_channels).transpose(1, 2)

    def forward(self, hidden, context, rope, attention, layer: int, plan: ChunkPlan) -> tuple[Tensor, Tensor]:
        cfg = self.cfg
        hq, hkv = cfg.num_attention_heads, cfg.num_query_groups
        mixed = self.linear_qkv.layer_norm(hidden)
        sin, cos = rope
        q = self._heads(self.linear_qkv.q(mixed), hq)
        q = apply_rope(self.q_layernorm(q.float()), sin, cos).to(mixed.dtype)
        k = self._heads(self.linear_qkv.k(mixed), hkv)
        k = apply_rope(self.k_layernorm(k.float()), sin, cos).to(mixed.dtype)
        v = self._heads(self.linear_qkv.v(mixed), hkv)
        core = attention(layer, q, k, v, plan)  # (N, hq, S, hd)
        core = core.transpose(1, 2).reshape(hidden.shape[0], hidden.shape[1], -1)
        cross = self._cross(mixed, context, plan)
        return core, cross

    def _cross(self, mixed: Tensor, context: Sequence[Tensor], plan: ChunkPlan) -> Tensor:
        """Each chunk of each batch row attends to its own caption's tokens (``context[row * chunks + j]``)."""
        cfg = self.cfg
        hd, hq, hkv = cfg.kv_channels, cfg.num_attention_heads, cfg.num_query_groups
        qx = self._heads(self.linear_qkv.qx(mixed), hq)
        qx = self.q_layernorm_xattn(qx)
        n_tok = plan.chunk_tokens
        rows = []
        for b in range(mixed.shape[0]):
            outs = []
            for j in range(plan.current):
                y = context[b * plan.current + j]
                kv = self.linear_kv_xattn(y.to(mixed.dtype)).view(1, y.shape[0], hkv, 2 * hd)
                kx, vx = kv[..., :hd], kv[..., hd:]
                kx = self.k_layernorm_xattn(kx).transpose(1, 2)
                vx = vx.transpose(1, 2)
                outs.append(sdpa(qx[b : b + 1, :, j * n_tok : (j + 1) * n_tok], kx, vx))
            rows.append(torch.cat(outs, dim=2))
        out = torch.cat(rows, dim=0)  # (N, hq, S, hd)
        return out.transpose(1, 2).reshape(mixed.shape[0], mixed.shape[1], hq * hd)


class AdaModulateLayer(nn.Module):
    def __init__(self, cfg: MagiConfig, ops, device=None, dtype=None):
        super().__init__()
        self.proj = nn.Sequential(
            ops.Linear(
                cfg.cond_dim, int(cfg.hidden_size * cfg.cond_gating_ratio * 2), bias=True, device=device, dtype=dtype
            )
        )

    def forward(self, c: Tensor) -> Tensor:
        return self.proj(F.silu(c))


class MLP(nn.Module):
    def __init__(self, cfg: MagiConfig, ops, device=None, dtype=None):
        super().__init__()
        self.gated = cfg.gated_linear_unit
        h, f = cfg.hidden_size, cfg.ffn_hidden_size
        self.layer_norm = ops.LayerNorm(h, eps=cfg.layernorm_epsilon, device=device, dtype=dtype)
        self.linear_fc1 = ops.Linear(h, 2 * f if self.gated else f, bias=False, device=device, dtype=dtype)
        self.linear_fc2 = ops.Linear(f, h, bias=False, device=device, dtype=dtype)

    def forward(self, x: Tensor) -> Tensor:
        x = self.linear_fc1(self.layer_norm(x))
        if self.gated:  # flashinfer's silu_and_mul: silu(first half) * second half
            a, b = x.chunk(2, dim=-1)
            x = F.silu(a) * b
        else:
            x = F.gelu(x)
        return self.linear_fc2(x)


def _gate_add(x: Tensor, residual: Tensor, gate: Tensor, chunk_tokens: int, norm: nn.Module) -> Tensor:
    """The reference's ``bias_modulate_add``: ``norm(x * gate[chunk]) + residual``, in float32.

    ``x``, ``residual``: (N, S, hidden); ``gate``: (N, chunks, hidden), one row per chunk of ``chunk_tokens``."""
    g = gate.float().repeat_interleave(chunk_tokens, dim=1)
    return norm(x.float() * g) + residual.float()


class TransformerLayer(nn.Module):
    def __init__(self, cfg: MagiConfig, ops, index: int, device=None, dtype=None):
        super().__init__()
        self.index = index
        eps, one_p = cfg.layernorm_epsilon, cfg.apply_layernorm_1p
        self.ada_modulate_layer = AdaModulateLayer(cfg, ops, device, dtype)
        self.self_attention = SelfAttention(cfg, ops, device, dtype)
        self.self_attn_post_norm = ZeroCenteredLayerNorm(cfg.hidden_size, eps, one_p, device, torch.float32)
        self.mlp = MLP(cfg, ops, device, dtype)
        self.mlp_post_norm = ZeroCenteredLayerNorm(cfg.hidden_size, eps, one_p, device, torch.float32)

    def forward(self, x, condition, context, rope, attention, plan: ChunkPlan) -> Tensor:
        dtype = x.dtype
        core, cross = self.self_attention(x, context, rope, attention, self.index, plan)
        attn = torch.cat([core, cross], dim=2)
        attn = rearrange(attn, "n s (two g d) -> n s (g two d)", two=2, g=PROJ_GROUPS)
        # the reference runs linear_proj in float32 (autocast) on its bf16 weights; here it runs in the layer's
        # compute dtype (the same in float32) so that ComfyUI's ops need no upcast of their stored weights
        attn = self.self_attention.linear_proj(attn).float()
        gates = self.ada_modulate_layer(condition)
        gates = (GATE_CAP * torch.tanh(gates.float() / GATE_CAP)).to(gates.dtype)
        gate_msa, gate_mlp = gates.chunk(2, dim=-1)
        x = _gate_add(attn, x, gate_msa, plan.chunk_tokens, self.self_attn_post_norm).to(dtype)
        x = _gate_add(self.mlp(x), x, gate_mlp, plan.chunk_tokens, self.mlp_post_norm).to(dtype)
        return x


class TransformerBlock(nn.Module):
    """``videodit_blocks``: the layers and the final norm."""

    def __init__(self, cfg: MagiConfig, ops, device=None, dtype=None):
        super().__init__()
        self.layers = nn.ModuleList([TransformerLayer(cfg, ops, i, device, dtype) for i in range(cfg.num_layers)])
        self.final_layernorm = ZeroCenteredLayerNorm(
            cfg.hidden_size, cfg.layernorm_epsilon, cfg.apply_layernorm_1p, device, torch.float32
        )


class FinalLinear(nn.Module):
    def __init__(self, cfg: MagiConfig, ops, device=None):
        super().__init__()
        p, tp = cfg.patch_size, cfg.t_patch_size
        self.linear = ops.Linear(
            cfg.hidden_size, p * p * tp * cfg.out_channels, bias=False, device=device, dtype=torch.float32
        )


@dataclass(frozen=True)
class Forward:
    """What one DiT forward takes besides the latent: the reference's ``forward`` keyword arguments.

    ``t``: (N, chunks) MAGI time per chunk (0 noise, 1 clean); ``captions``: N * chunks caption embeddings,
    row-major (row ``b``, chunk ``j`` at ``b * chunks + j``), each (tokens, caption_channels) holding only the
    valid tokens (the reference's masked, packed ``y_xattn_flat``); ``caption_dropped``: (N,) or (1,) bool,
    which AdaLN token; ``first_frame``: absolute latent frame of the first frame of the input (RoPE time);
    ``plan``: the attention plan; ``distill_dt``: the distilled models' step-size constant (None for base)."""

    t: Tensor
    captions: Sequence[Tensor]
    caption_dropped: Tensor
    first_frame: int
    plan: ChunkPlan
    distill_dt: float | None = None


class MagiDiT(nn.Module):
    """A MAGI-1 DiT (``VideoDiTModel``). ``operations``: ComfyUI's op classes, default ``torch.nn``; ``dtype``: the
    weights' storage dtype of the layers (the float32 parts stay float32); ``compute_dtype``: what the layers
    compute in (default ``dtype`` when it is a 16/32-bit float, else bfloat16)."""

    def __init__(
        self,
        config: MagiConfig,
        operations=None,
        device=None,
        dtype: torch.dtype | None = None,
        compute_dtype: torch.dtype | None = None,
    ):
        super().__init__()
        ops = operations if operations is not None else TORCH_OPS
        self.config = cfg = config
        self.dtype = dtype or torch.float32
        if compute_dtype is None:
            compute_dtype = (
                self.dtype if self.dtype in (torch.float32, torch.float16, torch.bfloat16) else torch.bfloat16
            )
        self.compute_dtype = compute_dtype
        p, tp = cfg.patch_size, cfg.t_patch_size
        self.x_embedder = ops.Conv3d(
            cfg.in_channels,
            cfg.hidden_size,
            kernel_size=(tp, p, p),
            stride=(tp, p, p),
            bias=False,
            device=device,
            dtype=torch.float32,
        )
        self.t_embedder = TimestepEmbedder(cfg, ops, device)
        self.y_embedder = CaptionEmbedder(cfg, ops, device)
        self.rope = Rope(cfg, device)
        self.videodit_blocks = TransformerBlock(cfg, ops, device, dtype)
        self.final_linear = FinalLinear(cfg, ops, device)

    # ------------------------------------------------------------------ pieces
    def tokens_per_frame(self, h: int, w: int) -> int:
        return (h // self.config.patch_size) * (w // self.config.patch_size)

    def null_caption(self, tokens: int = 50) -> Tensor:
        """The reference's negative caption: the first ``tokens`` rows of ``null_caption_embedding`` (float32)."""
        return self.y_embedder.null_caption_embedding.float()[:tokens]

    def embed_captions(self, captions: Sequence[Tensor], device) -> list[Tensor]:
        proj = self.y_embedder.y_proj_xattn
        return [proj(c.to(device=device, dtype=torch.float32)).to(self.compute_dtype) for c in captions]

    def condition(self, t: Tensor, dropped: Tensor, distill_dt: float | None) -> Tensor:
        """(N, chunks, cond_dim) in the compute dtype: timestep (+ distill step) embedding + the AdaLN token."""
        n, chunks = t.shape
        t_flat = t.flatten().float()
        emb = self.t_embedder(t_flat, self.compute_dtype)
        if distill_dt is not None:
            emb = emb + self.t_embedder(torch.full_like(t_flat, float(distill_dt)), self.compute_dtype)
        emb = emb.reshape(n, chunks, -1)
        adaln = self.y_embedder.y_proj_adaln(self.y_embedder.adaln_token(dropped.reshape(-1)))  # (N or 1, cond)
        return (emb + adaln[:, None]).to(self.compute_dtype)

    # ------------------------------------------------------------------ forward
    @torch.no_grad()
    def forward_chunks(self, x: Tensor, spec: Forward, attention: AttentionFn | None = None) -> Tensor:
        """The velocity (N, C, T, H, W) float32 of the latent ``x`` (N, C, T, H, W) whose T frames are
        ``spec.plan.current`` chunks; ``attention`` (default: no K/V buffer) serves every self-attention call."""
        cfg = self.config
        attention = no_cache if attention is None else attention
        plan = spec.plan
        n, _, frames, h, w = x.shape
        if frames % plan.current:
            raise ValueError(f"{frames} latent frames do not split into the plan's {plan.current} chunks")
        if spec.t.shape != (n, plan.current):
            raise ValueError(f"t has shape {tuple(spec.t.shape)}; expected ({n}, {plan.current})")
        if len(spec.captions) != n * plan.current:
            raise ValueError(f"{len(spec.captions)} captions for {n} x {plan.current} chunks")
        if cfg.distill != (spec.distill_dt is not None):
            raise ValueError(
                f"a {'distilled' if cfg.distill else 'base'} MAGI-1 "
                + ("needs the step-size constant distill_dt" if cfg.distill else "takes no distill_dt")
            )
        x = x.float() * cfg.x_rescale_factor
        if cfg.half_channel_vae:
            x = torch.cat([x, x], dim=1)
        x = self.x_embedder(x)
        _, _, tt, hh, ww = x.shape
        if plan.chunk_tokens * plan.current != tt * hh * ww:
            raise ValueError(f"the plan's chunks of {plan.chunk_tokens} tokens do not cover {tt * hh * ww} tokens")
        rope = self.rope.table(spec.first_frame // cfg.t_patch_size, tt, hh, ww, x.device)
        hidden = rearrange(x, "n c t h w -> n (t h w) c").to(self.compute_dtype)
        condition = self.condition(spec.t.to(x.device), spec.caption_dropped.to(x.device), spec.distill_dt)
        context = self.embed_captions(spec.captions, x.device)
        for layer in self.videodit_blocks.layers:
            hidden = layer(hidden, condition, context, rope, attention, plan)
        hidden = self.videodit_blocks.final_layernorm(hidden.float())
        out = self.final_linear.linear(hidden)
        p, tp = cfg.patch_size, cfg.t_patch_size
        out = rearrange(out, "n (t h w) (pt ph pw c) -> n c (t pt) (h ph) (w pw)", t=tt, h=hh, w=ww, pt=tp, ph=p, pw=p)
        if cfg.half_channel_vae:
            out = out[:, : cfg.out_channels // 2]
        return out / cfg.x_rescale_factor
