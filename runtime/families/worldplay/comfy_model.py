"""HY-WorldPlay built from ComfyUI's HunyuanVideo 1.5 classes (composed by subclassing; nothing of core is edited).

WorldPlay is HunyuanVideo 1.5's 480p I2V transformer (double-stream blocks only) plus:

- ``action_in``: an embedder of one action label (0..80) per latent frame, added to the time
  embedding of that frame's tokens (core's ``MLPEmbedder`` on the label's sinusoidal embedding,
  as ``time_in`` does for ``t``);
- ``img_attn_prope_proj`` in every double block: the block's vision q, k, v (after the q/k norm,
  before RoPE) go through PRoPE (``runtime.families.worldplay.model.prope``), attend over the same keys as the block's own
  stream, come back through ``P`` and this projection, and are added to ``img_attn.proj``'s output.

Its AR forward is not core's joint forward. The text runs alone (at ``t = 0``, text attending text)
and leaves one K/V prefix per block (:meth:`WorldPlayTransformer.text_prefix`); the vision tokens of
a call attend ``[text prefix, context, own tokens]`` with per-frame modulation
(:meth:`WorldPlayTransformer.forward_vision`). Both vision streams of every block go through one
callable (``runtime.families.worldplay.model.attention.VisionAttention``), so a cache decides what the context is
without this file knowing. Through ComfyUI's model call, ``_forward`` runs the reference's
training-time form unless a :class:`WorldPlayCall` in ``transformer_options["worldplay"]`` says
otherwise: a block-causal forward over the call's frames, in chunks of 4.

ComfyUI is imported lazily: :func:`classes` builds the concrete classes (the mixins below on
core's ``DoubleStreamBlock``, ``HunyuanVideo``, ``model_base.HunyuanVideo15`` and
``supported_models.HunyuanVideo15``) on first use.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import Tensor

from .model.attention import BlockCausalAttention, TextPrefix, VisionAttention
from .model.condition import call_frames, pad_frames, select_frames
from .model.prope import PRoPE
from .model.trajectory import CHUNK_LATENTS, Trajectory

#: ``transformer_options`` key of a :class:`WorldPlayCall`
CALL_KEY = "worldplay"
#: conditioning keys the model reads: the camera path, and the absolute latent frames of a call
TRAJECTORY_COND = "worldplay_trajectory"
FRAMES_COND = "worldplay_frames"
#: the reference's sampling shift (``PIPELINE_CONFIGS['480p_i2v']['flow_shift']``; core's HunyuanVideo 1.5 uses 7)
SHIFT = 5.0


class WorldPlayInputError(ValueError):
    """A WorldPlay call without what it needs (the message names it and the fix)."""


@dataclass(eq=False)
class WorldPlayCall:
    """What the caller of one forward decides; any field left None takes the default of ``_forward``.

    ``attention``: the vision attention (default: block-causal over the call, chunks of 4 frames);
    ``positions``: RoPE time positions of the call's frames (default ``0 .. T - 1``); ``text_prefix``:
    the prompt's K/V (default: computed from the call's text); ``frames``: the call's absolute latent
    frames in the trajectory (default: the conditioning's ``worldplay_frames``, else ``0 .. T - 1``);
    ``timesteps``: per-frame timesteps ``(batch, T)`` (default: the sampler's, the same for every frame).
    The image condition follows the conditioning's ``worldplay_frames`` (``concat_cond`` sees the conditioning, not
    this), so a caller that runs the model on some frames sets that key too."""

    attention: VisionAttention | None = None
    positions: Sequence[int] | None = None
    text_prefix: TextPrefix | None = None
    frames: Sequence[int] | None = None
    timesteps: Tensor | None = None


def _sdpa_heads(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Attention over ``(B, H, L, D)`` tensors, output ``(B, L, H * D)``."""
    out = F.scaled_dot_product_attention(q, k, v)
    return out.transpose(1, 2).reshape(q.shape[0], q.shape[2], -1)


def _flat(x: Tensor) -> Tensor:
    return x.transpose(1, 2).reshape(x.shape[0], x.shape[2], -1)


class _BlockMixin:
    """WorldPlay's double block: core's ``DoubleStreamBlock`` plus ``img_attn_prope_proj``, run as two halves."""

    def __init__(self, hidden_size, num_heads, mlp_ratio, qkv_bias=True, dtype=None, device=None, operations=None):
        super().__init__(
            hidden_size,
            num_heads,
            mlp_ratio=mlp_ratio,
            qkv_bias=qkv_bias,
            proj_bias=qkv_bias,
            dtype=dtype,
            device=device,
            operations=operations,
        )
        self.img_attn_prope_proj = operations.Linear(
            hidden_size, hidden_size, bias=qkv_bias, dtype=dtype, device=device
        )

    def _qkv(self, attn, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        qkv = attn.qkv(x)
        q, k, v = qkv.view(qkv.shape[0], qkv.shape[1], 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        q, k = attn.norm(q, k, v)
        return q, k, v

    def forward_text(self, txt: Tensor, vec_txt: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The text half: text attends text only. Returns the new text and this block's text k, v ``(B, H, L, D)``."""
        from comfy.ldm.flux.layers import apply_mod

        mod1, mod2 = self.txt_mod(vec_txt)
        q, k, v = self._qkv(self.txt_attn, apply_mod(self.txt_norm1(txt), 1 + mod1.scale, mod1.shift))
        txt = txt + apply_mod(self.txt_attn.proj(_sdpa_heads(q, k, v)), mod1.gate)
        mlp_in = apply_mod(self.txt_norm2(txt), 1 + mod2.scale, mod2.shift)
        return txt + apply_mod(self.txt_mlp(mlp_in), mod2.gate), k, v

    def forward_vision(
        self,
        img: Tensor,
        vec: Tensor,
        pe: Tensor,
        prope: PRoPE,
        layer: int,
        text_k: Tensor,
        text_v: Tensor,
        attention: VisionAttention,
    ) -> Tensor:
        """The vision half: both streams through ``attention``; ``vec`` is per token ``(B, L, C)``."""
        from comfy.ldm.flux.layers import apply_mod
        from comfy.ldm.flux.math import apply_rope

        mod1, mod2 = self.img_mod(vec)
        q, k, v = self._qkv(self.img_attn, apply_mod(self.img_norm1(img), 1 + mod1.scale, mod1.shift))
        qp, kp, vp = prope.queries(q), prope.keys_values(k), prope.keys_values(v)
        q, k = apply_rope(q, k, pe)
        out = attention(layer, "img", q, k, v, text_k, text_v)
        out_p = prope.outputs(attention(layer, "prope", qp, kp, vp, text_k, text_v))
        both = self.img_attn.proj(_flat(out)) + self.img_attn_prope_proj(_flat(out_p))
        img = img + apply_mod(both, mod1.gate)
        mlp_in = apply_mod(self.img_norm2(img), 1 + mod2.scale, mod2.shift)
        return img + apply_mod(self.img_mlp(mlp_in), mod2.gate)


class _TransformerMixin:
    """WorldPlay's transformer: core's ``HunyuanVideo`` (1.5 modules) with WorldPlay blocks and ``action_in``."""

    block_class: type = None  # set by classes()

    def __init__(self, image_model=None, final_layer=True, dtype=None, device=None, operations=None, **kwargs):
        depth = int(kwargs["depth"])
        if kwargs.get("depth_single_blocks", 0):
            raise ValueError("HY-WorldPlay has no single-stream blocks (depth_single_blocks must be 0)")
        # core builds everything but the double blocks (depth 0: no throw-away blocks in memory)
        super().__init__(
            image_model=image_model,
            final_layer=final_layer,
            dtype=dtype,
            device=device,
            operations=operations,
            **{**kwargs, "depth": 0},
        )
        self.params = dataclasses.replace(self.params, depth=depth)
        if tuple(self.patch_size)[0] != 1:
            raise ValueError(f"patch_size {self.patch_size}: WorldPlay's frames are one latent frame per token row")
        self.double_blocks = torch.nn.ModuleList(
            [
                self.block_class(
                    self.hidden_size,
                    self.num_heads,
                    mlp_ratio=self.params.mlp_ratio,
                    qkv_bias=self.params.qkv_bias,
                    dtype=dtype,
                    device=device,
                    operations=operations,
                )
                for _ in range(depth)
            ]
        )
        from comfy.ldm.flux.layers import MLPEmbedder

        self.action_in = MLPEmbedder(256, self.hidden_size, dtype=dtype, device=device, operations=operations)

    # ------------------------------------------------------------------------------------------------ text
    def text_prefix(
        self,
        context: Tensor,
        attention_mask: Tensor | None = None,
        txt_byt5: Tensor | None = None,
        clip_fea: Tensor | None = None,
        transformer_options: dict | None = None,
    ) -> TextPrefix:
        """The prompt's K/V per block: the text stream alone at ``t = 0`` (SigLIP tokens, then ByT5, then the LLM's,
        padding dropped), as the reference's text forward."""
        from comfy.ldm.flux.layers import timestep_embedding

        opts = transformer_options or {}
        b, dtype = context.shape[0], context.dtype
        t0 = torch.zeros(b, device=context.device, dtype=torch.float32)
        vec_txt = self.time_in(timestep_embedding(t0, 256, time_factor=1.0).to(dtype))
        mask = attention_mask
        if mask is not None and not torch.is_floating_point(mask):
            mask = (mask - 1).to(dtype) * torch.finfo(dtype).max
        if attention_mask is None:
            valid = torch.ones(context.shape[:2], dtype=torch.bool, device=context.device)
        else:  # the text encoder's 1 / 0 mask of its tokens (ComfyUI passes it only when some are padding)
            valid = (attention_mask > 0.5 if torch.is_floating_point(attention_mask) else attention_mask != 0).reshape(
                b, -1
            )
        if bool(valid.all()):
            txt = self.txt_in(context, t0, mask, transformer_options=opts)
        else:
            txt = self._refine_padded(context, t0, mask, valid, opts)
        kinds = [0]
        parts = [txt]
        if self.byt5_in is not None and txt_byt5 is not None:
            parts.insert(0, self.byt5_in(txt_byt5))
            kinds.insert(0, 1)
            valid = torch.cat([valid.new_ones(b, txt_byt5.shape[1]), valid], dim=1)
        if self.vision_in is not None and clip_fea is not None:
            parts.insert(0, self.vision_in(clip_fea).to(dtype))
            kinds.insert(0, 2)
            valid = torch.cat([valid.new_ones(b, clip_fea.shape[1]), valid], dim=1)
        if self.cond_type_embedding is not None:
            self.cond_type_embedding.to(txt.device)
            parts = [
                p
                + self.cond_type_embedding(torch.full(p.shape[:2], kind, dtype=torch.long, device=p.device)).to(p.dtype)
                for p, kind in zip(parts, kinds)
            ]
        txt = torch.cat(parts, dim=1)
        counts = valid.sum(dim=1)
        if bool((counts != counts[0]).any()):
            raise WorldPlayInputError(
                f"the prompts of one batch have different numbers of valid text tokens ({counts.tolist()}); "
                "WorldPlay drops the padding, so run them in separate batches"
            )
        if not bool(valid.all()):
            txt = txt[valid].reshape(b, int(counts[0]), txt.shape[-1])
        keys, values = [], []
        for block in self.double_blocks:
            txt, k, v = block.forward_text(txt, vec_txt)
            keys.append(k)
            values.append(v)
        return TextPrefix(keys, values)

    def _refine_padded(self, context: Tensor, t0: Tensor, mask: Tensor, valid: Tensor, opts: dict) -> Tensor:
        """Core's token refiner (``txt_in``) on a padded prompt, with its pooled condition averaged over the real
        tokens only, as HY-WorldPlay's own refiner does: core's ``TokenRefiner`` divides the sum over every token,
        padding included, by the padded length (its own TODO says so), which moved the prefix 3-4.6 % on the tiny
        model. The refiner's blocks are core's, under the same attention mask."""
        from comfy.ldm.flux.layers import timestep_embedding

        refiner = self.txt_in
        t = refiner.t_embedder(timestep_embedding(t0, 256, time_factor=1.0).to(context.dtype))
        m = valid.to(torch.float32).unsqueeze(-1)
        pooled = (context.float() * m).sum(dim=1) / m.sum(dim=1)
        c = t + refiner.c_embedder(pooled.to(context.dtype))
        x = refiner.input_embedder(context)
        return refiner.individual_token_refiner(x, c, mask, transformer_options=opts)

    # ------------------------------------------------------------------------------------------------ vision
    def _frame_ids(self, positions: Tensor, h: int, w: int, batch: int, device, dtype) -> Tensor:
        t = positions.to(device=device, dtype=dtype)
        grid = torch.stack(
            torch.meshgrid(
                t,
                torch.arange(h, device=device, dtype=dtype),
                torch.arange(w, device=device, dtype=dtype),
                indexing="ij",
            ),
            dim=-1,
        )
        return grid.reshape(1, -1, 3).expand(batch, -1, -1)

    def forward_vision(
        self,
        x: Tensor,
        timesteps: Tensor,
        actions: Tensor,
        viewmats: Tensor,
        intrinsics: Tensor,
        positions: Sequence[int] | Tensor,
        text_prefix: TextPrefix,
        attention: VisionAttention,
    ) -> Tensor:
        """One vision call: ``x`` ``(B, C, T, H, W)`` (noise, image condition and mask concatenated), ``timesteps``
        ``(B,)`` or ``(B, T)``, ``actions`` ``(B or 1, T)``, cameras ``(B or 1, T, 4, 4)`` / ``(B or 1, T, 3, 3)``,
        ``positions`` the RoPE time positions of the ``T`` frames. Returns the velocity ``(B, C_out, T, H, W)``."""
        from comfy.ldm.flux.layers import timestep_embedding

        b, _, frames, hgt, wid = x.shape
        ph, pw = self.patch_size[1], self.patch_size[2]
        h, w = hgt // ph, wid // pw
        per_frame = h * w
        if text_prefix.layers != len(self.double_blocks):
            raise WorldPlayInputError(
                f"a text prefix of {text_prefix.layers} layers for {len(self.double_blocks)} blocks"
            )
        positions = torch.as_tensor(positions, dtype=torch.float32).reshape(-1)
        if positions.numel() != frames or actions.shape[-1] != frames or viewmats.shape[1] != frames:
            raise WorldPlayInputError(
                f"a call on {frames} latent frames needs {frames} RoPE positions, actions and cameras (got "
                f"{positions.numel()}, {actions.shape[-1]}, {viewmats.shape[1]})"
            )
        img = self.img_in(x)
        t = timesteps.reshape(b, -1).float().expand(b, frames) if timesteps.numel() in (b, b * frames) else None
        if t is None:
            raise WorldPlayInputError(f"timesteps of shape {tuple(timesteps.shape)}: give (batch,) or (batch, frames)")
        vec = self.time_in(timestep_embedding(t.reshape(-1), 256, time_factor=1.0).to(img.dtype))
        a = actions.reshape(-1, frames).expand(b, frames).float()
        vec = vec + self.action_in(timestep_embedding(a.reshape(-1), 256, time_factor=1.0).to(img.dtype))
        vec = vec.view(b, frames, -1).repeat_interleave(per_frame, dim=1)
        pe = self.pe_embedder(self._frame_ids(positions, h, w, b, x.device, torch.float32))
        prope = PRoPE.from_cameras(viewmats.to(x.device), intrinsics.to(x.device))
        for i, block in enumerate(self.double_blocks):
            tk, tv = text_prefix.layer(i)
            img = block.forward_vision(img, vec, pe, prope, i, tk, tv, attention)
        img = self.final_layer(img, vec)
        c = self.out_channels
        img = img.reshape(b, frames, h, w, c, 1, ph, pw).permute(0, 4, 1, 5, 2, 6, 3, 7)
        return img.reshape(b, c, frames, hgt, wid)

    # ------------------------------------------------------------------------------------------------ ComfyUI
    def _forward(
        self,
        x,
        timestep,
        context,
        y=None,
        txt_byt5=None,
        clip_fea=None,
        guidance=None,
        attention_mask=None,
        guiding_frame_index=None,
        ref_latent=None,
        disable_time_r=False,
        control=None,
        transformer_options=None,
        **kwargs,
    ):
        opts = transformer_options or {}
        if ref_latent is not None or guiding_frame_index is not None:
            raise WorldPlayInputError(
                "HY-WorldPlay takes no reference latent or guiding frame (use its image condition)"
            )
        call = opts.get(CALL_KEY) or WorldPlayCall()
        frames_n = x.shape[2]
        trajectory: Trajectory | None = kwargs.get(TRAJECTORY_COND)
        if trajectory is None:
            raise WorldPlayInputError(
                "HY-WorldPlay needs its camera path on the conditioning (key 'worldplay_trajectory', a trajectory "
                "from the HY-WorldPlay Trajectory node)"
            )
        frames = call.frames if call.frames is not None else kwargs.get(FRAMES_COND)
        frames = call_frames(frames, frames_n, trajectory.latents)
        index = torch.as_tensor(frames, dtype=torch.long)
        viewmats = trajectory.w2c[index].unsqueeze(0)
        intrinsics = trajectory.intrinsics[index].unsqueeze(0)
        actions = trajectory.actions[index].unsqueeze(0).to(x.device)
        prefix = call.text_prefix or self.text_prefix(context, attention_mask, txt_byt5, clip_fea, opts)
        positions = call.positions if call.positions is not None else range(frames_n)
        per_frame = (x.shape[3] // self.patch_size[1]) * (x.shape[4] // self.patch_size[2])
        attention = call.attention or BlockCausalAttention(CHUNK_LATENTS * per_frame)
        timesteps = call.timesteps if call.timesteps is not None else timestep
        return self.forward_vision(x, timesteps, actions, viewmats, intrinsics, list(positions), prefix, attention)


class _ModelBaseMixin:
    """core's ``model_base.HunyuanVideo15`` with the WorldPlay transformer, the call's image frames and the trajectory."""

    transformer_class: type = None  # set by classes()

    def __init__(self, model_config, model_type=None, device=None):
        import comfy.model_base

        model_type = comfy.model_base.ModelType.FLOW if model_type is None else model_type
        comfy.model_base.BaseModel.__init__(
            self, model_config, model_type, device=device, unet_model=self.transformer_class
        )

    def concat_cond(self, **kwargs):
        noise = kwargs.get("noise")
        image = kwargs.get("concat_latent_image")
        if image is None or noise is None:
            return super().concat_cond(**kwargs)
        video = image.shape[2]
        frames = call_frames(kwargs.get(FRAMES_COND), noise.shape[2], video)
        mask = kwargs.get("concat_mask", kwargs.get("denoise_mask"))
        if mask is not None:
            mask = select_frames(pad_frames(mask, video, 1.0), frames)
        return super().concat_cond(
            **{**kwargs, "concat_latent_image": select_frames(image, frames), "concat_mask": mask}
        )

    def extra_conds(self, **kwargs):
        import comfy.conds

        out = super().extra_conds(**kwargs)
        trajectory = kwargs.get(TRAJECTORY_COND)
        if trajectory is not None:
            out[TRAJECTORY_COND] = comfy.conds.CONDConstant(trajectory)
        frames = kwargs.get(FRAMES_COND)
        if frames is not None:
            out[FRAMES_COND] = comfy.conds.CONDConstant(tuple(int(f) for f in frames))
        return out


class _ConfigMixin:
    """core's ``supported_models.HunyuanVideo15`` for WorldPlay: shift 5 and the WorldPlay model."""

    model_class: type = None  # set by classes()
    sampling_settings = {"shift": SHIFT}

    def get_model(self, state_dict, prefix="", device=None):
        return self.model_class(self, device=device)

    def process_unet_state_dict(self, state_dict):
        return state_dict  # the loader hands over core names already (runtime.families.worldplay.model.keys.to_core)


@functools.cache
def classes() -> SimpleNamespace:
    """The concrete WorldPlay classes on this ComfyUI: ``block``, ``transformer``, ``model`` (model_base) and
    ``config`` (supported_models)."""
    import comfy.ldm.flux.layers
    import comfy.ldm.hunyuan_video.model
    import comfy.model_base
    import comfy.supported_models

    block = type("WorldPlayDoubleBlock", (_BlockMixin, comfy.ldm.flux.layers.DoubleStreamBlock), {})
    transformer = type(
        "WorldPlayTransformer", (_TransformerMixin, comfy.ldm.hunyuan_video.model.HunyuanVideo), {"block_class": block}
    )
    model = type("WorldPlay", (_ModelBaseMixin, comfy.model_base.HunyuanVideo15), {"transformer_class": transformer})
    config = type(
        "WorldPlayConfig",
        (_ConfigMixin, comfy.supported_models.HunyuanVideo15),
        {"model_class": model},
    )
    for cls in (block, transformer, model, config):
        cls.__module__ = __name__
    return SimpleNamespace(block=block, transformer=transformer, model=model, config=config)


def is_worldplay(model_patcher) -> bool:
    """The MODEL holds the pack's WorldPlay transformer."""
    dm = getattr(getattr(model_patcher, "model", None), "diffusion_model", None)
    return isinstance(dm, _TransformerMixin)


__all__ = [
    "CALL_KEY",
    "FRAMES_COND",
    "SHIFT",
    "TRAJECTORY_COND",
    "WorldPlayCall",
    "WorldPlayInputError",
    "classes",
    "is_worldplay",
]
