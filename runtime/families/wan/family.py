"""Wan 2.1 text-to-video: routes every self-attention layer of a Wan model through a per-run KV cache.

How it reaches the model (all on a *clone* of the ModelPatcher, undone in :meth:`WanFamily.remove`):

- self-attention: ``add_object_patch("diffusion_model.blocks.{i}.self_attn.forward", fn)``; ``fn``
  recomputes q, k, v exactly like ``WanSelfAttention.forward`` (projections, RMS norms, RoPE) and
  hands them to :meth:`runtime.run_caches.RunCaches.attend`. Cross-attention to the text is left alone.
- RoPE offset: a ``WrappersMP.DIFFUSION_MODEL`` wrapper recomputes the rotary frequencies with the
  current chunk's absolute first frame (``rope_encode(..., t_start=offset)``) and calls
  ``forward_orig``; ComfyUI v0.3.64's ``_forward`` always starts the time axis at 0.
- CFG: ``transformer_options["cond_or_uncond"]`` says which batch slot is cond (0) or uncond (1).
- ComfyUI's own AR sampler (v0.27+, ``CausalWanModel``): :meth:`WanFamily.attach_core_ar` puts the core-path
  patches on a clone (``init_kv_caches``, ``init_crossattn_caches``, every block's self-attention; see the end
  of this file), which hand core's per-layer caches to the pack's session while one runs.

Which models: ComfyUI's ``WAN21`` / ``WanModel`` and their subclasses (e.g. newer ComfyUI's
``WAN21_CausalAR`` / ``CausalWanModel`` for Causal Forcing checkpoints), when their self-attention
modules have the parts the patch uses (probed, not assumed from the class name). Variants that feed
extra latents into the token sequence (reference latents, time-concatenated latents, Bernini's
``context_latents``) are refused: their extra tokens have no place in a cache of finished chunks.
"""

from __future__ import annotations

import inspect
import logging

import torch
from torch import Tensor

from ....jensen_core.geometry import LatentGeometry
from ...model_loading import count_blocks
from ..base import (
    AttentionShape,
    DiffusionModelFamily,
    ModelPreset,
    Probe,
    UnusedSettingsError,
    register,
)

logger = logging.getLogger("jensen_kv")

WRAPPER_KEY = "jensen_kv_rope_offset"
SELF_ATTN_KEY = "diffusion_model.blocks.{}.self_attn.forward"
SUPPORTED = (
    "Wan 2.1 text-to-video (ComfyUI model class WAN21 or a subclass such as WAN21_CausalAR, model_type 't2v', "
    "16 latent channels): Wan 2.1 T2V 1.3B / 14B and the chunk-wise autoregressive checkpoints built on it "
    "(Self-Forcing, CausVid, SkyReels-V2 T2V / DF, Causal Forcing), loaded as wan2.1 through UNETLoader"
)
#: what the self-attention patch reads from each block's self-attention module
ATTN_PARTS = ("q", "k", "v", "o", "norm_q", "norm_k", "num_heads", "head_dim")
#: extra latent inputs that would add tokens to the sequence (refused at run time)
EXTRA_LATENT_INPUTS = ("reference_latent", "context_latents", "time_dim_concat")
#: Wan 2.1's latents: 1 x 2 x 2 patches of 16 channels; its VAE keeps 4k + 1 frames and 8 x 8 pixels per latent pixel
GEOMETRY = LatentGeometry(patch=(1, 2, 2), latent_channels=16, vae_time_stride=4, vae_space_stride=8)
#: (layers, heads, head_dim) of the Wan 2.1 models users run; head_dim 128 as ComfyUI's Wan detection sets it
PRESETS: dict[str, tuple[int, int, int]] = {
    "wan2.1-1.3b": (30, 12, 128),
    "wan2.1-14b": (40, 40, 128),
}


def _probe_attention(dm) -> str | None:
    """None when every block's self-attention has what the patch uses, else the finding."""
    blocks = getattr(dm, "blocks", None)
    if blocks is None or len(blocks) == 0:
        return "has no transformer blocks (diffusion_model.blocks)"
    for i, blk in enumerate(blocks):
        attn = getattr(blk, "self_attn", None)
        if attn is None:
            return f"has no self_attn in block {i}"
        missing = [p for p in ATTN_PARTS if not hasattr(attn, p)]
        if missing:
            return (
                f"has a self-attention ({type(attn).__name__}, block {i}) without {missing}, which the Jensen KV "
                "patch recomputes q, k, v from"
            )
        if int(attn.num_heads) * int(attn.head_dim) != int(getattr(dm, "dim", attn.num_heads * attn.head_dim)):
            return f"has a self-attention whose heads x head_dim ({attn.num_heads} x {attn.head_dim}) is not the model width"
    for name in ("rope_encode", "forward_orig"):
        if not callable(getattr(dm, name, None)):
            return f"has no {name}() (the RoPE frame offset needs it)"
    try:
        params = inspect.signature(dm.rope_encode).parameters
    except (TypeError, ValueError):
        params = {}
    if "t_start" not in params:
        return "has a rope_encode() without t_start (the RoPE frame offset needs it)"
    return None


#: Wan 2.1's head_dim: ComfyUI's model detection makes dim // 128 heads of a Wan 2.1 checkpoint
WAN_HEAD_DIM = 128


class WanFamily(DiffusionModelFamily):
    name = "Wan 2.1 T2V"
    key = "wan"
    order = 0
    supported = SUPPORTED
    geometry = GEOMETRY
    presets = {
        "wan2.1-1.3b": ModelPreset("Wan 2.1 1.3B", *PRESETS["wan2.1-1.3b"]),
        "wan2.1-14b": ModelPreset("Wan 2.1 14B", *PRESETS["wan2.1-14b"]),
        # the pack's bundled demo model (models/tiny_ar/MODEL_CARD.md: 4 blocks, 2 heads x 128), v1 and v2
        "tiny-ar": ModelPreset(
            "tiny AR (bundled demo)",
            4,
            2,
            128,
            files=("jensen-kv-tiny-ar.safetensors", "jensen-kv-tiny-ar-v2.safetensors"),
        ),
    }
    latent_channels = GEOMETRY.latent_channels
    latent_help = (
        "a Wan video latent",
        "make it with EmptyHunyuanLatentVideo (or Wan's image-to-video nodes' latent output)",
        "Wan patches 2x2",
    )
    checks_channels = False
    patch = GEOMETRY.patch

    @classmethod
    def probe(cls, model_patcher) -> Probe:
        import comfy.model_base
        from comfy.ldm.wan.model import WanModel

        base = getattr(model_patcher, "model", None)
        dm = getattr(base, "diffusion_model", None)
        is_base, is_dm = isinstance(base, comfy.model_base.WAN21), isinstance(dm, WanModel)
        if not (is_base or is_dm):
            return Probe(False)
        if not (is_base and is_dm):
            return Probe(True, f"pairs {type(base).__name__} with {type(dm).__name__}, which is not a WAN21 + WanModel")
        if getattr(base, "image_to_video", False) or getattr(dm, "model_type", None) != "t2v":
            return Probe(
                True, f"is an image-to-video or other variant (model_type {getattr(dm, 'model_type', None)!r})"
            )
        if getattr(dm, "in_dim", None) != 16 or tuple(getattr(dm, "patch_size", ())) != cls.patch:
            return Probe(
                True,
                f"has {getattr(dm, 'in_dim', '?')} input channels / patch {getattr(dm, 'patch_size', '?')} "
                "(a control or Fun variant)",
            )
        if getattr(dm, "ref_conv", None) is not None:
            return Probe(True, "has a reference-latent input (ref_conv), whose tokens have no place in a chunk cache")
        if type(dm).forward_orig is not WanModel.forward_orig:
            return Probe(
                True,
                f"is a WanModel subclass with its own forward_orig ({type(dm).__name__}: VACE, camera, "
                "audio or another variant with extra inputs a chunk cache cannot hold)",
            )
        if type(base).extra_conds is not comfy.model_base.WAN21.extra_conds:
            return Probe(
                True,
                f"adds conditioning inputs of its own ({type(base).__name__}.extra_conds, e.g. control "
                "or reference latents a chunk cache cannot hold)",
            )
        problem = _probe_attention(dm)
        if problem is not None:
            return Probe(True, f"{problem}; probed {type(dm).__name__}")
        return Probe(True)

    @classmethod
    def preset_from_shapes(cls, shapes, metadata):
        pe = shapes.get("patch_embedding.weight")
        if "head.modulation" not in shapes or pe is None or len(pe) != 5:
            return None
        if pe[1] != 16 or tuple(pe[2:]) != cls.patch:  # image-to-video, control or Fun variants: not this family's
            return None
        dim = shapes["head.modulation"][-1]
        layers, heads = count_blocks(shapes, "blocks.{}.self_attn.q.weight"), dim // WAN_HEAD_DIM
        if not layers or heads < 1:
            return None
        # the heads as ComfyUI's model detection makes them for Wan 2.1 (num_heads = dim // 128)
        return cls.preset_like(f"Wan 2.1 ({layers} blocks, width {dim})", layers, heads, dim // heads)

    @classmethod
    def attention_shape(cls, model_patcher) -> AttentionShape | None:
        try:
            blocks = model_patcher.get_model_object("diffusion_model.blocks")
            first = blocks[0].self_attn
            return AttentionShape(len(blocks), int(first.num_heads), int(first.head_dim))
        except (AttributeError, IndexError, TypeError, KeyError):
            return None

    def __init__(self, model_patcher):
        self.read_model(model_patcher)
        self.num_layers = len(self.dm.blocks)
        first = self.dm.blocks[0].self_attn
        self.heads, self.head_dim = int(first.num_heads), int(first.head_dim)
        self.keys = [SELF_ATTN_KEY.format(i) for i in range(self.num_layers)]

    # ------------------------------------------------------------------ latent geometry
    def fingerprint(self) -> dict:
        return {
            **super().fingerprint(),
            "dim": int(getattr(self.dm, "dim", self.heads * self.head_dim)),
            "ffn_dim": int(getattr(self.dm, "ffn_dim", 0)),
            "text_dim": int(getattr(self.dm, "text_dim", 0)),
        }

    # ------------------------------------------------------------------ whose patch, core's AR path
    @classmethod
    def is_loop_patch(cls, patch) -> bool:
        return isinstance(patch, CachedSelfAttention)

    @classmethod
    def core_ar_model(cls, model_patcher):
        """ComfyUI's ``CausalWanModel`` (v0.27+: ``init_kv_caches``), which ``sample_ar_video`` drives."""
        return causal_diffusion_model(model_patcher)

    @classmethod
    def attach_core_ar(cls, model_patcher, active_session) -> None:
        attach_core_ar(model_patcher, active_session)

    @classmethod
    def check_core_ar_patched(cls, model_patcher) -> None:
        check_core_ar_patched(model_patcher)

    # ------------------------------------------------------------------ patches
    def install(self, work, run) -> None:
        """Patch ``work`` (a clone made for this run only); refuses to replace another pack's patch."""
        import comfy.patcher_extension

        # the pack's own patches (core's AR path, runtime/core_ar) are replaced for this run, not foreign
        foreign = [
            (k, work.object_patches[k])
            for k in self.keys
            if k in work.object_patches and not getattr(work.object_patches[k], "jensen_kv_patch", False)
        ]
        if foreign:
            key, patch = foreign[0]
            what = getattr(patch, "__qualname__", None) or type(patch).__qualname__
            module = getattr(patch, "__module__", None) or type(patch).__module__
            raise ValueError(
                f"the MODEL already carries an object patch on {key} ({what} from {module}"
                f"{f', and {len(foreign) - 1} more blocks' if len(foreign) > 1 else ''}), put there by another node "
                "pack. The Chunked AR sampler must replace every Wan self-attention with its cached attention and will "
                "not silently drop that patch: remove the node that adds it (or apply it after sampling)."
            )
        for i, key in enumerate(self.keys):
            module = work.get_model_object(f"diffusion_model.blocks.{i}.self_attn")
            work.add_object_patch(key, CachedSelfAttention(run, i, module))
        work.add_wrapper_with_key(
            comfy.patcher_extension.WrappersMP.DIFFUSION_MODEL, WRAPPER_KEY, make_rope_offset_wrapper(run)
        )

    def remove(self, work) -> None:
        """Undo this run's object patches on the shared model (ComfyUI keeps it loaded, patched).

        Only our keys are restored from the shared backup, so patches of other packs stay as
        ComfyUI left them; the next load re-applies whatever patcher is used then.
        """
        import comfy.patcher_extension
        import comfy.utils

        backup = work.object_patches_backup
        for key in self.keys:
            if key in backup:
                comfy.utils.set_attr(work.model, key, backup.pop(key))
            work.object_patches.pop(key, None)
        work.remove_wrappers_with_key(comfy.patcher_extension.WrappersMP.DIFFUSION_MODEL, WRAPPER_KEY)


class CachedSelfAttention:
    """Stands in for ``WanSelfAttention.forward`` of one layer (installed as an object patch).

    Takes (and ignores) extra keyword arguments such as ``kv_cache=None``, with which newer
    ComfyUI's ``CausalWanModel`` calls its self-attention outside its own AR sampler.
    """

    jensen_kv_patch = True

    def __init__(self, run, layer: int, module: torch.nn.Module):
        self.run, self.layer, self.module = run, layer, module

    def __call__(self, x: Tensor, freqs: Tensor, transformer_options: dict | None = None, **kwargs) -> Tensor:
        if kwargs.get("kv_cache") is not None:
            raise ValueError(
                "this Wan model was called with its own kv_cache (ComfyUI's AR video sampler) while "
                "patched by the Chunked AR sampler; use one of the two samplers, not both"
            )
        return self_attention_via(
            self.module, x, freqs, lambda q, k, v: self.run.attend(self.layer, q, k, v, transformer_options)
        )


def self_attention_via(m: torch.nn.Module, x: Tensor, freqs: Tensor, attend) -> Tensor:
    """``WanSelfAttention.forward`` with its attention replaced by ``attend(q, k, v)``.

    q, k, v are exactly Wan's (projections, RMS norms, RoPE with ``freqs``), handed over in SDPA layout
    (batch, heads, tokens, head_dim); ``attend`` returns the attention output in that layout.
    """
    from comfy.ldm.flux.math import apply_rope1

    b, s = x.shape[:2]
    n, d = m.num_heads, m.head_dim
    q = apply_rope1(m.norm_q(m.q(x)).view(b, s, n, d), freqs).transpose(1, 2)
    k = apply_rope1(m.norm_k(m.k(x)).view(b, s, n, d), freqs).transpose(1, 2)
    v = m.v(x).view(b, s, n, d).transpose(1, 2)
    out = attend(q, k, v)
    return m.o(out.transpose(1, 2).reshape(b, s, n * d))


def _rope_accepts_options(dm) -> bool:
    try:
        return "transformer_options" in inspect.signature(dm.rope_encode).parameters
    except (TypeError, ValueError):
        return False


def make_rope_offset_wrapper(run):
    """A DIFFUSION_MODEL wrapper: Wan's ``_forward`` with the time axis of RoPE starting at the chunk's frame."""
    import comfy.ldm.common_dit

    def rope_offset_wrapper(
        executor, x, timestep, context, clip_fea=None, time_dim_concat=None, transformer_options=None, **kwargs
    ):
        dm = executor.class_obj
        extra = {"time_dim_concat": time_dim_concat, **kwargs}
        given = [name for name in EXTRA_LATENT_INPUTS if extra.get(name) is not None]
        if given:
            raise ValueError(
                f"this Wan model receives extra latent inputs ({', '.join(given)}), which add tokens that a cache of "
                "finished chunks cannot hold; Chunked AR sampling supports plain text-to-video Wan 2.1 only"
            )
        transformer_options = {} if transformer_options is None else transformer_options
        if transformer_options.get("ar_state") is not None:
            raise ValueError(
                "transformer_options carries ComfyUI's own ar_state (its AR video sampler); the Chunked AR "
                "sampler keeps its own cache: use one of the two samplers, not both"
            )
        _, _, t, h, w = x.shape
        x = comfy.ldm.common_dit.pad_to_patch_size(x, dm.patch_size)
        opts = {"transformer_options": transformer_options} if _rope_accepts_options(dm) else {}
        # float32 positions: exact integers (bf16 would round frame indices above 256)
        freqs = dm.rope_encode(t, h, w, t_start=run.position.frame_offset, device=x.device, dtype=torch.float32, **opts)
        out = dm.forward_orig(
            x,
            timestep,
            context,
            clip_fea=clip_fea,
            freqs=freqs,
            transformer_options=transformer_options,
            **{k: v for k, v in kwargs.items() if k not in EXTRA_LATENT_INPUTS},
        )
        return out[:, :, :t, :h, :w]

    return rope_offset_wrapper


# ============================================================================ core's AR path (v0.27+)
# ComfyUI's own AR video sampler (``sample_ar_video`` over ``CausalWanModel``): on a causal model, on the clone
# the pack's nodes return, object patches on ``diffusion_model.init_kv_caches`` (the session's small per-layer
# dicts instead of the whole-video K/V), ``diffusion_model.init_crossattn_caches`` (the text K/V per CFG branch,
# so cond and uncond run as separate calls do not share it) and every block's ``self_attn.forward`` (the pack's
# cache, with core's own q, k, v and absolute RoPE). Each calls core's own code when no session is running
# (``active_session()`` is None). The session and its ``end`` protocol are family-free (``runtime/core_ar/``,
# never imported here: the session comes through ``active_session``, core's per-layer dicts carry a
# ``jensen_kv_layer`` marker).
INIT_KEY = "diffusion_model.init_kv_caches"
CROSS_INIT_KEY = "diffusion_model.init_crossattn_caches"


def causal_diffusion_model(model_patcher):
    """The model's ``CausalWanModel``-like diffusion model (has ``init_kv_caches``), else None."""
    dm = getattr(getattr(model_patcher, "model", None), "diffusion_model", None)
    if dm is None or not callable(getattr(dm, "init_kv_caches", None)) or getattr(dm, "blocks", None) is None:
        return None
    return dm


class InitKVCaches:
    """Stands in for ``CausalWanModel.init_kv_caches``: the session's small dicts while one runs, else core's."""

    jensen_kv_patch = True

    def __init__(self, dm, active_session):
        self.dm, self.active_session = dm, active_session

    def __call__(self, batch_size, max_seq_len, device, dtype):
        session = self.active_session()
        if session is None:
            return type(self.dm).init_kv_caches(self.dm, batch_size, max_seq_len, device, dtype)
        return session.init_caches(int(batch_size), int(max_seq_len))


class InitCrossAttnCaches:
    """Stands in for ``CausalWanModel.init_crossattn_caches``: per-CFG-branch text K/V while a session runs."""

    jensen_kv_patch = True

    def __init__(self, dm, active_session):
        self.dm, self.active_session = dm, active_session

    def __call__(self, batch_size, device, dtype):
        session = self.active_session()
        if session is None:
            return type(self.dm).init_crossattn_caches(self.dm, batch_size, device, dtype)
        return session.init_crossattn_caches()


class CoreARSelfAttention:
    """Stands in for ``CausalWanSelfAttention.forward`` of one layer: the pack's cache when core hands it one."""

    jensen_kv_patch = True

    def __init__(self, layer: int, module: torch.nn.Module):
        self.layer, self.module = layer, module

    def __call__(self, x, freqs, kv_cache=None, transformer_options=None):
        if not getattr(kv_cache, "jensen_kv_layer", False):
            return type(self.module).forward(
                self.module,
                x,
                freqs,
                kv_cache=kv_cache,
                transformer_options={} if transformer_options is None else transformer_options,
            )
        session = kv_cache.session
        labels = session.labels if session.labels is not None else [0]
        # exactly core's q, k, v (RoPE with core's absolute frequencies); the pack's cache instead of core's
        return self_attention_via(self.module, x, freqs, lambda q, k, v: session.attend(self.layer, q, k, v, labels))


#: the ON_LOAD callback that composes with a sequence-parallel injection (Raylight's Ulysses)
COMPOSE_KEY = "jensen_kv_sequence_parallel"


def compose_sequence_parallel(model_patcher, *_load_args) -> None:
    """ON_LOAD (and again in :func:`check_core_ar_patched`): where Raylight's Ulysses injection replaced the pack's
    self-attention patch, put the composition over it (:mod:`.raylight`; a no-op without Raylight's forward).

    ComfyUI runs ON_LOAD callbacks after the object patches, in the order they were added; Raylight adds its own
    when the model loads, before the pack's nodes clone it, so this one runs after Raylight's injection.
    """
    dm = causal_diffusion_model(model_patcher)
    if dm is not None:
        from .raylight import compose, pack_attention

        compose(dm, pack_attention)


def _foreign_name(fn) -> str:
    what = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    module = getattr(fn, "__module__", None) or type(fn).__module__
    return f"{what} (from {module})"


def check_core_ar_patched(model_patcher) -> None:
    """The model as loaded must carry the pack's patches, and they must not have displaced another pack's.

    A patch another pack put on the module itself (``types.MethodType`` on the instance, as Raylight's
    sequence-parallel patch does) is what ComfyUI backed up when it applied the pack's object patch:
    the pack would silently drop it, so it refuses instead.
    """
    dm = causal_diffusion_model(model_patcher)
    compose_sequence_parallel(model_patcher)  # again here: whatever order the ON_LOAD callbacks ran in
    backup = getattr(model_patcher, "object_patches_backup", {}) or {}
    for i, block in enumerate(dm.blocks):
        old = backup.get(SELF_ATTN_KEY.format(i))
        if getattr(block.self_attn.__dict__.get("forward"), "serves_core_ar", False):
            continue  # Raylight's sequence-parallel forward, routed through the pack's session (raylight.py)
        if (
            old is not None
            and not getattr(old, "jensen_kv_patch", False)
            and getattr(old, "__func__", None) is not type(block.self_attn).forward
        ):
            raise UnusedSettingsError(
                f"block {i}'s self-attention carried {_foreign_name(getattr(old, '__func__', old))}, put on the module by "
                "another node pack (e.g. a sequence-parallel patch of CausalWanSelfAttention.forward); the Jensen KV "
                "cache replaces that attention on core's AR path and will not silently drop the other patch. Use one "
                "of the two on this MODEL."
            )
    init = getattr(dm, "init_kv_caches", None)
    if not isinstance(init, InitKVCaches):
        raise UnusedSettingsError(
            f"the causal model's init_kv_caches is {getattr(init, '__qualname__', type(init).__qualname__)}, not the "
            "Jensen KV cache's: another node replaced it, and core's AR sampler would keep its own full-precision cache. "
            "Remove that node or the Jensen KV nodes."
        )
    for i, block in enumerate(dm.blocks):
        fwd = block.self_attn.__dict__.get("forward")
        if not isinstance(fwd, CoreARSelfAttention) and not getattr(fwd, "serves_core_ar", False):
            what = getattr(fwd, "__qualname__", None) or (type(fwd).__qualname__ if fwd is not None else "core's own")
            module = getattr(fwd, "__module__", None) or (type(fwd).__module__ if fwd is not None else "comfy")
            raise UnusedSettingsError(
                f"block {i}'s self-attention runs {what} (from {module}), not the Jensen KV cache's: another node pack "
                "patches the same attention (e.g. a sequence-parallel patch of CausalWanSelfAttention.forward), and the "
                "pack's cache would be ignored there. Use one of the two on this MODEL."
            )


def attach_core_ar(model_patcher, active_session) -> None:
    """Add the core-path object patches to ``model_patcher`` (idempotent); ValueError naming another pack's patch
    on the same attention."""
    dm = causal_diffusion_model(model_patcher)
    if dm is None:
        return
    import comfy.patcher_extension as pe

    model_patcher.remove_callbacks_with_key(pe.CallbacksMP.ON_LOAD, COMPOSE_KEY)
    model_patcher.add_callback_with_key(pe.CallbacksMP.ON_LOAD, COMPOSE_KEY, compose_sequence_parallel)
    keys = [INIT_KEY, CROSS_INIT_KEY] + [SELF_ATTN_KEY.format(i) for i in range(len(dm.blocks))]
    ours = (InitKVCaches, InitCrossAttnCaches, CoreARSelfAttention)
    foreign = [
        (k, model_patcher.object_patches[k])
        for k in keys
        if k in model_patcher.object_patches and not isinstance(model_patcher.object_patches[k], ours)
    ]
    if foreign:
        key, patch = foreign[0]
        what = getattr(patch, "__qualname__", None) or type(patch).__qualname__
        raise ValueError(
            f"the MODEL already carries an object patch on {key} ({what}), put there by another node pack; the Jensen "
            "KV cache must serve that attention on core's AR path and will not silently drop the other patch. Apply "
            "the Jensen KV nodes to the MODEL before that node's patch is added, or remove one of the two."
        )
    if INIT_KEY not in model_patcher.object_patches:
        model_patcher.add_object_patch(INIT_KEY, InitKVCaches(dm, active_session))
    if CROSS_INIT_KEY not in model_patcher.object_patches and callable(getattr(dm, "init_crossattn_caches", None)):
        model_patcher.add_object_patch(CROSS_INIT_KEY, InitCrossAttnCaches(dm, active_session))
    for i in range(len(dm.blocks)):
        key = SELF_ATTN_KEY.format(i)
        if key not in model_patcher.object_patches:
            module = model_patcher.get_model_object(f"diffusion_model.blocks.{i}.self_attn")
            model_patcher.add_object_patch(key, CoreARSelfAttention(i, module))


register(WanFamily)
