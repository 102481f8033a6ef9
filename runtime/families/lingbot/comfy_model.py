"""LingBot-World 2.0's DiT built from ComfyUI's Wan 2.1 classes (composed; nothing of core is edited).

LingBot-World is Wan 2.1 / 2.2's block stack (single expert, text cross-attention, no CLIP) with 36 input channels
and a camera path (``runtime.families.lingbot.model.camera``) folded into every token:

- model level: ``patch_embedding_wancamctrl`` (1536 camera features -> width) and a residual MLP
  (``c2ws_hidden_states_layer1`` / ``2``), once per call;
- every block, after the self-attention's residual and before the cross-attention:
  ``h = cam_injector_layer2(silu(cam_injector_layer1(c))) + c``, ``x = (1 + cam_scale_layer(h)) x + cam_shift_layer(h)``.

The blocks are core's ``WanAttentionBlock`` (their self-attention projections and norms, cross-attention, FFN and
modulation) with the four camera layers added; the head is core's ``Head``, the rotary embedding core's ``EmbedND``
through ``WanModel.rope_encode`` (with the chunk's absolute first frame), the unpatchify ``WanModel.unpatchify``. The
transformer is not a ``WanModel`` subclass: the Wan 2.1 family (and ComfyUI's own Wan paths) must not take it for a
plain Wan model. Its self-attention goes through one callable per call (:class:`LingBotCall`), so a cache decides what
a chunk attends without this file knowing.

Differences from the reference's forward, all within float32 rounding: the rotary embedding is core's (float32
cos / sin, the reference multiplies in complex128), attention is ComfyUI's / SDPA (the reference's flash attention).
The time sinusoid is computed in float64, as the reference's.

ComfyUI is imported lazily: :func:`classes` builds the concrete classes on first use.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from .model.keys import CAMERA_IN

#: ``transformer_options`` key of a :class:`LingBotCall`
CALL_KEY = "lingbot"
#: the reference's sampling shift (``wan_i2v_A14B.py``: ``sample_shift = 10.0``)
SHIFT = 10.0
SAMPLER_NODE = "LingBot-World AR Sampler"


class LingBotInputError(ValueError):
    """A LingBot-World call without what it needs (the message names it and the fix)."""


@dataclass(eq=False)
class LingBotCall:
    """One forward's choices: ``attention(layer, q, k, v) -> out`` over ``(B, H, L, D)`` post-RoPE tensors,
    ``frame_offset`` (the RoPE time position of the call's first latent frame) and ``camera`` ``(B or 1, L, 1536)``
    (the call's camera features, ``CameraMap.tokens``)."""

    attention: Any
    frame_offset: int
    camera: Tensor


def sinusoid(dim: int, t: Tensor) -> Tensor:
    """Wan's ``sinusoidal_embedding_1d`` in float64 (the reference's): ``[cos, sin]`` of ``t * 10000^(-i / half)``."""
    half = dim // 2
    pos = t.to(torch.float64).flatten()
    freqs = torch.pow(10000, -torch.arange(half, dtype=torch.float64, device=pos.device).div(half))
    s = torch.outer(pos, freqs)
    return torch.cat([torch.cos(s), torch.sin(s)], dim=1)


class _BlockMixin:
    """Core's ``WanAttentionBlock`` plus the four camera layers, with LingBot's forward."""

    def __init__(self, *args, operation_settings=None, **kwargs):
        super().__init__(*args, operation_settings=operation_settings, **kwargs)
        ops = operation_settings.get("operations")
        kw = {"device": operation_settings.get("device"), "dtype": operation_settings.get("dtype")}
        for name in ("cam_injector_layer1", "cam_injector_layer2", "cam_scale_layer", "cam_shift_layer"):
            setattr(self, name, ops.Linear(self.dim, self.dim, **kw))

    def forward_lingbot(self, x, e, freqs, context, cam, attention, layer: int, transformer_options: dict):
        """``x`` (B, L, C), ``e`` (B, 1, 6, C), ``cam`` (B or 1, L, C): one block, its self-attention through
        ``attention``."""
        import comfy.model_management
        from comfy.ldm.flux.math import apply_rope1

        mod = comfy.model_management.cast_to(self.modulation, dtype=x.dtype, device=x.device)
        e = (mod.unsqueeze(0) + e).unbind(2)
        sa = self.self_attn
        h = torch.addcmul(e[0], self.norm1(x), 1 + e[1])
        b, s, n, d = h.shape[0], h.shape[1], sa.num_heads, sa.head_dim
        q = apply_rope1(sa.norm_q(sa.q(h)).view(b, s, n, d), freqs)
        k = apply_rope1(sa.norm_k(sa.k(h)).view(b, s, n, d), freqs)
        v = sa.v(h).view(b, s, n, d)
        out = attention(layer, q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        y = sa.o(out.transpose(1, 2).reshape(b, s, n * d))
        x = torch.addcmul(x, y, e[2])
        c = self.cam_injector_layer2(F.silu(self.cam_injector_layer1(cam))) + cam
        x = (1 + self.cam_scale_layer(c)) * x + self.cam_shift_layer(c)
        x = x + self.cross_attn(self.norm3(x), context, context_img_len=None, transformer_options=transformer_options)
        y = self.ffn(torch.addcmul(e[3], self.norm2(x), 1 + e[4]))
        return torch.addcmul(x, y, e[5])


class _TransformerBase(torch.nn.Module):
    """LingBot-World's DiT on core's Wan parts (see the module docstring)."""

    block_class: type = None  # set by classes()

    def __init__(
        self,
        model_type="t2v",
        patch_size=(1, 2, 2),
        text_len=512,
        in_dim=36,
        dim=1536,
        ffn_dim=8960,
        freq_dim=256,
        text_dim=4096,
        out_dim=16,
        num_heads=12,
        num_layers=30,
        window_size=(-1, -1),
        qk_norm=True,
        cross_attn_norm=True,
        eps=1e-6,
        camera_in=CAMERA_IN,
        image_model=None,
        device=None,
        dtype=None,
        operations=None,
        **kwargs,
    ):
        super().__init__()
        from comfy.ldm.flux.layers import EmbedND
        from comfy.ldm.wan.model import Head

        if model_type != "t2v":
            raise ValueError(
                f"LingBot-World's DiT has text cross-attention only (model_type 't2v'), got {model_type!r}"
            )
        self.dtype = dtype
        st = {"operations": operations, "device": device, "dtype": dtype}
        kw = {"device": device, "dtype": dtype}
        self.model_type, self.patch_size, self.text_len = model_type, tuple(patch_size), int(text_len)
        self.in_dim, self.dim, self.ffn_dim, self.freq_dim = in_dim, dim, ffn_dim, freq_dim
        self.text_dim, self.out_dim, self.num_heads, self.num_layers = text_dim, out_dim, num_heads, num_layers
        self.window_size, self.qk_norm, self.cross_attn_norm, self.eps = window_size, qk_norm, cross_attn_norm, eps
        self.camera_in = int(camera_in)
        self.patch_embedding = operations.Conv3d(
            in_dim, dim, kernel_size=self.patch_size, stride=self.patch_size, device=device, dtype=torch.float32
        )
        self.text_embedding = torch.nn.Sequential(
            operations.Linear(text_dim, dim, **kw), torch.nn.GELU(approximate="tanh"), operations.Linear(dim, dim, **kw)
        )
        self.time_embedding = torch.nn.Sequential(
            operations.Linear(freq_dim, dim, **kw), torch.nn.SiLU(), operations.Linear(dim, dim, **kw)
        )
        self.time_projection = torch.nn.Sequential(torch.nn.SiLU(), operations.Linear(dim, dim * 6, **kw))
        self.blocks = torch.nn.ModuleList(
            [
                self.block_class(
                    "t2v_cross_attn",
                    dim,
                    ffn_dim,
                    num_heads,
                    window_size,
                    qk_norm,
                    cross_attn_norm,
                    eps,
                    operation_settings=st,
                )  # fmt: skip
                for _ in range(num_layers)
            ]
        )
        self.head = Head(dim, out_dim, self.patch_size, eps, operation_settings=st)
        d = dim // num_heads
        self.rope_embedder = EmbedND(dim=d, theta=10000.0, axes_dim=[d - 4 * (d // 6), 2 * (d // 6), 2 * (d // 6)])
        self.img_emb = None
        self.ref_conv = None
        self.patch_embedding_wancamctrl = operations.Linear(self.camera_in, dim, **kw)
        self.c2ws_hidden_states_layer1 = operations.Linear(dim, dim, **kw)
        self.c2ws_hidden_states_layer2 = operations.Linear(dim, dim, **kw)

    # ------------------------------------------------------------------ ComfyUI's entry
    def forward(self, x, timestep, context, clip_fea=None, time_dim_concat=None, transformer_options=None, **kwargs):
        import comfy.patcher_extension

        opts = {} if transformer_options is None else transformer_options
        return comfy.patcher_extension.WrapperExecutor.new_class_executor(
            self._forward,
            self,
            comfy.patcher_extension.get_all_wrappers(comfy.patcher_extension.WrappersMP.DIFFUSION_MODEL, opts),
        ).execute(x, timestep, context, clip_fea, time_dim_concat, opts, **kwargs)

    def _forward(self, x, timestep, context, clip_fea=None, time_dim_concat=None, transformer_options=None, **kwargs):
        call = (transformer_options or {}).get(CALL_KEY)
        if call is None:
            raise LingBotInputError(
                f"LingBot-World is sampled by {SAMPLER_NODE}: every chunk needs its camera features, its RoPE frame "
                "and the window's cache, which KSampler and the Chunked AR Video Sampler do not give; connect this "
                f"MODEL to {SAMPLER_NODE}"
            )
        return self.forward_lingbot(x, timestep, context, call, transformer_options)

    # ------------------------------------------------------------------ the forward
    def camera_embedding(self, camera: Tensor, dtype) -> Tensor:
        """The camera features ``(B or 1, L, 1536)`` -> ``(B or 1, L, C)`` (the model-level embedding and MLP)."""
        c = self.patch_embedding_wancamctrl(camera.to(dtype))
        return c + self.c2ws_hidden_states_layer2(F.silu(self.c2ws_hidden_states_layer1(c)))

    def forward_lingbot(self, x: Tensor, t: Tensor, context: Tensor, call: LingBotCall, opts: dict | None = None):
        """``x`` (B, 36, F, H, W) (noise, mask, image latent), ``t`` (B,) the timesteps (integers, as the reference
        feeds them), ``context`` (B, tokens, text_dim) (zero-padded to ``text_len``, as the reference). Returns the
        flow prediction (B, 16, F, H, W)."""
        opts = {} if opts is None else opts
        b, _, f, h, w = x.shape
        if x.shape[1] != self.in_dim:
            raise LingBotInputError(
                f"LingBot-World takes {self.in_dim} input channels (16 noise + 4 mask + 16 image latent), got "
                f"{x.shape[1]}: give the image condition of WanImageToVideo"
            )
        dtype = x.dtype
        x = self.patch_embedding(x.float()).to(dtype)
        grid = x.shape[2:]
        x = x.flatten(2).transpose(1, 2)
        camera = call.camera
        if camera.shape[-2] != x.shape[1] or camera.shape[-1] != self.camera_in:
            raise LingBotInputError(
                f"camera features {tuple(camera.shape)} for {x.shape[1]} tokens: want (1, {x.shape[1]}, {self.camera_in})"
            )
        e = self.time_embedding(sinusoid(self.freq_dim, t).to(device=x.device, dtype=dtype)).reshape(b, 1, self.dim)
        e0 = self.time_projection(e).unflatten(2, (6, self.dim))
        if context.shape[1] < self.text_len:
            context = torch.cat([context, context.new_zeros(b, self.text_len - context.shape[1], context.shape[2])], 1)
        context = self.text_embedding(context)
        freqs = self.rope_encode(f, h, w, t_start=int(call.frame_offset), device=x.device, dtype=dtype)
        cam = self.camera_embedding(camera.to(x.device), dtype)
        for i, block in enumerate(self.blocks):
            x = block.forward_lingbot(x, e0, freqs, context, cam, call.attention, i, opts)
        x = self.head(x, e)
        return self.unpatchify(x, grid)


class _ModelBaseMixin:
    """A ComfyUI BaseModel of the LingBot transformer: flow matching, Wan 2.1's latents, Wan's image condition
    (``concat_cond``: the 4 mask channels and the image latent of WanImageToVideo)."""

    transformer_class: type = None  # set by classes()

    def __init__(self, model_config, model_type=None, device=None):
        import comfy.model_base

        model_type = comfy.model_base.ModelType.FLOW if model_type is None else model_type
        comfy.model_base.BaseModel.__init__(
            self, model_config, model_type, device=device, unet_model=self.transformer_class
        )
        self.image_to_video = False

    def concat_cond(self, **kwargs):
        import comfy.model_base

        return comfy.model_base.WAN21.concat_cond(self, **kwargs)


class _ConfigMixin:
    """Core's ``supported_models.WAN21_T2V`` for LingBot-World: shift 10 and the LingBot model."""

    model_class: type = None  # set by classes()
    sampling_settings = {"shift": SHIFT}

    def get_model(self, state_dict, prefix="", device=None):
        return self.model_class(self, device=device)


@functools.cache
def classes() -> SimpleNamespace:
    """The concrete classes on this ComfyUI: ``block``, ``transformer``, ``model`` (model_base), ``config``."""
    import comfy.ldm.wan.model as wan
    import comfy.model_base
    import comfy.supported_models

    block = type("LingBotBlock", (_BlockMixin, wan.WanAttentionBlock), {})
    transformer = type(
        "LingBotWorldTransformer",
        (_TransformerBase,),
        {"block_class": block, "rope_encode": wan.WanModel.rope_encode, "unpatchify": wan.WanModel.unpatchify},
    )
    model = type("LingBotWorld", (_ModelBaseMixin, comfy.model_base.BaseModel), {"transformer_class": transformer})
    config = type("LingBotWorldConfig", (_ConfigMixin, comfy.supported_models.WAN21_T2V), {"model_class": model})
    for cls in (block, transformer, model, config):
        cls.__module__ = __name__
    return SimpleNamespace(block=block, transformer=transformer, model=model, config=config)


def is_lingbot(model_patcher) -> bool:
    """The MODEL holds the pack's LingBot-World transformer."""
    dm = getattr(getattr(model_patcher, "model", None), "diffusion_model", None)
    return isinstance(dm, _TransformerBase)


__all__ = ["CALL_KEY", "SAMPLER_NODE", "SHIFT", "LingBotCall", "LingBotInputError", "classes", "is_lingbot", "sinusoid"]
