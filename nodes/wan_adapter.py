"""Wan 2.1 adapter: routes every self-attention layer of a Wan model through a per-run KV cache.

How it reaches the model (all on a *clone* of the ModelPatcher, undone in :meth:`WanKVAdapter.remove`):

- self-attention: ``add_object_patch("diffusion_model.blocks.{i}.self_attn.forward", fn)``; ``fn``
  recomputes q, k, v exactly like ``WanSelfAttention.forward`` (projections, RMS norms, RoPE) and
  attends over [this layer's cached chunks, current chunk] with :meth:`jensen_core.ChunkCache.attend`.
  Cross-attention to the text is left alone.
- RoPE offset: a ``WrappersMP.DIFFUSION_MODEL`` wrapper recomputes the rotary frequencies with the
  current chunk's absolute first frame (``rope_encode(..., t_start=offset)``) and calls
  ``forward_orig``; ComfyUI v0.3.64's ``_forward`` always starts the time axis at 0.
- CFG: ``transformer_options["cond_or_uncond"]`` says which batch slot is cond (0) or uncond (1);
  each (layer, branch) has its own :class:`jensen_core.ChunkCache`.

The run state (:class:`WanCacheRun`) lives in the closures of these patches, never on the input
MODEL, so two samplers fed the same MODEL share nothing.
"""
from __future__ import annotations

import inspect
import logging

import torch
import torch.nn.functional as F
from torch import Tensor

from ..jensen_core import ChunkCache
from .config import JensenKVConfig, mode_to_correction
from .observer import BRANCH_NAMES, PHASE_DENOISE, PHASE_WRITE, AttentionEvent

logger = logging.getLogger("jensen_kv")

WRAPPER_KEY = "jensen_kv_rope_offset"
SELF_ATTN_KEY = "diffusion_model.blocks.{}.self_attn.forward"
SUPPORTED_MODELS = (
    "Wan 2.1 text-to-video (ComfyUI model class WAN21, model_type 't2v', 16 latent channels): "
    "Wan 2.1 T2V 1.3B / 14B and the chunk-wise autoregressive checkpoints built on it "
    "(Self-Forcing, CausVid, SkyReels-V2 T2V / DF), loaded as wan2.1 through UNETLoader"
)
_ATTN_PARTS = ("q", "k", "v", "o", "norm_q", "norm_k", "num_heads", "head_dim")


def describe_model(model_patcher) -> str:
    base = getattr(model_patcher, "model", None)
    name = type(base).__name__
    dm = getattr(base, "diffusion_model", None)
    extra = []
    if dm is not None:
        extra.append(type(dm).__name__)
        mt = getattr(dm, "model_type", None)
        if mt is not None:
            extra.append(f"model_type {mt!r}")
    return name + (f" ({', '.join(extra)})" if extra else "")


def check_supported(model_patcher):
    """Return the Wan diffusion model of ``model_patcher`` or raise a ValueError naming what is supported."""
    import comfy.model_base
    from comfy.ldm.wan.model import WanModel

    base = getattr(model_patcher, "model", None)
    dm = getattr(base, "diffusion_model", None)
    problem = None
    if type(base) is not comfy.model_base.WAN21 or type(dm) is not WanModel:
        problem = "is not one"
    elif getattr(base, "image_to_video", False) or getattr(dm, "model_type", None) != "t2v":
        problem = "is an image-to-video variant"
    elif getattr(dm, "in_dim", None) != 16 or tuple(getattr(dm, "patch_size", ())) != (1, 2, 2):
        problem = f"has {getattr(dm, 'in_dim', '?')} input channels / patch {getattr(dm, 'patch_size', '?')} (a control or Fun variant)"
    elif getattr(dm, "ref_conv", None) is not None:
        problem = "has a reference-latent input"
    if problem is not None:
        raise ValueError(
            f"Chunked AR Video Sampler supports {SUPPORTED_MODELS}. This MODEL ({describe_model(model_patcher)}) "
            f"{problem}; load a supported checkpoint with UNETLoader instead."
        )
    return dm


class WanCacheRun:
    """Per-run state: the caches of every (layer, CFG branch), the current chunk and phase."""

    def __init__(self, config: JensenKVConfig, window_chunks: int, num_layers: int, observer=None):
        self.config = config
        self.num_layers = num_layers
        self.window_chunks = window_chunks or None
        self.correction = config.effective_correction
        self.strength = float(config.strength)
        self.observer = observer
        self._wants = getattr(observer, "wants", None)
        self.caches: dict[tuple[int, int], ChunkCache] = {}
        self._written: dict[tuple[int, int], int] = {}
        self.branches_written: set[int] = set()
        self.phase = PHASE_DENOISE
        self.chunk = 0
        self.frame_offset = 0
        self.step = 0
        self.peak_bytes = 0
        self.peak_bf16_bytes = 0
        self.active = True

    # ------------------------------------------------------------ chunk lifecycle
    def begin(self, chunk: int, frame_offset: int, phase: str) -> None:
        self.chunk, self.frame_offset, self.phase, self.step = chunk, frame_offset, phase, 0

    def end_write(self) -> None:
        """After a write pass: check every layer got the chunk for every branch, and record the peak size."""
        now = {key for key, c in self._written.items() if c == self.chunk}
        branches = {b for _, b in now} or {0}
        expected = {(layer, b) for layer in range(self.num_layers) for b in branches | self.branches_written}
        missing = sorted(expected - now)
        if missing:
            raise RuntimeError(
                f"the cache-writing pass of chunk {self.chunk} did not reach every self-attention layer and CFG "
                f"branch (missing (layer, branch) {missing[:4]}{' ...' if len(missing) > 4 else ''}); another "
                "patch may skip Wan blocks or model calls (e.g. a step cache); remove it for chunked AR sampling"
            )
        total = sum(c.nbytes for c in self.caches.values())
        bf16 = sum(c.bf16_nbytes for c in self.caches.values())
        if total > self.peak_bytes:
            self.peak_bytes, self.peak_bf16_bytes = total, bf16
        self.phase = PHASE_DENOISE

    @property
    def branches(self) -> list[int]:
        """The CFG branches that were cached (0 = cond, 1 = uncond); survives :meth:`free`."""
        return sorted(self.branches_written)

    def free(self) -> None:
        """Drop every cached chunk (called in ``finally``; safe to call twice)."""
        for cache in self.caches.values():
            cache.clear()
        self.caches.clear()
        self._written.clear()
        self.active = False

    # ------------------------------------------------------------ attention
    def _slots(self, batch: int, transformer_options: dict | None) -> list[tuple[int, slice]]:
        labels = (transformer_options or {}).get("cond_or_uncond") or [0]
        n = len(labels)
        if batch % n:
            raise RuntimeError(f"batch {batch} does not split into the {n} CFG slots {labels}")
        if len(set(labels)) != n:
            raise ValueError(
                f"the Chunked AR sampler keeps one KV cache per CFG branch, but this call batches the branches "
                f"{[BRANCH_NAMES.get(b, b) for b in labels]}: use a single conditioning entry for positive and one "
                "for negative (merge them with ConditioningConcat / ConditioningAverage first)"
            )
        per = batch // n
        return [(label, slice(i * per, (i + 1) * per)) for i, label in enumerate(labels)]

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor, transformer_options: dict | None) -> Tensor:
        """Attention of the current chunk for every CFG slot; in the write phase also caches k, v."""
        if not self.active:
            raise RuntimeError("this Chunked AR run has finished; its cache is freed")
        outs = []
        for branch, sl in self._slots(q.shape[0], transformer_options):
            key = (layer, branch)
            cache = self.caches.get(key)
            if cache is None and self.chunk > 0 and self.phase == PHASE_DENOISE:
                raise RuntimeError(
                    f"CFG branch {BRANCH_NAMES.get(branch, branch)!r} reached layer {layer} at chunk {self.chunk} "
                    "but no cache was written for it (the cache-writing pass ran without that branch); "
                    "keep cfg the same for the whole run"
                )
            qb, kb, vb = q[sl], k[sl], v[sl]
            if cache is None or cache.num_chunks == 0:
                out = F.scaled_dot_product_attention(qb, kb, vb)
            else:
                out = cache.attend(qb, kb, vb, correction=self.correction, strength=self.strength)
            if self.observer is not None and (
                self._wants is None or self._wants(layer, self.chunk, self.phase, self.step)
            ):
                self.observer(AttentionEvent(
                    layer=layer, branch=branch, chunk=self.chunk, frame_offset=self.frame_offset,
                    phase=self.phase, step=self.step, q=qb, k=kb, v=vb, cache=cache, out=out,
                    correction=mode_to_correction(self.correction), strength=self.strength,
                ))
            if self.phase == PHASE_WRITE:
                if self._written.get(key) == self.chunk:
                    raise RuntimeError(
                        f"layer {layer}, branch {BRANCH_NAMES.get(branch, branch)!r} was written twice for chunk "
                        f"{self.chunk}; the cache-writing pass must run the model exactly once"
                    )
                if cache is None:
                    cache = self.caches[key] = ChunkCache(self.config.spec_k, self.config.spec_v, self.window_chunks)
                cache.append(kb, vb)
                self._written[key] = self.chunk
                self.branches_written.add(branch)
            outs.append(out)
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)


class CachedSelfAttention:
    """Stands in for ``WanSelfAttention.forward`` of one layer (installed as an object patch)."""

    def __init__(self, run: WanCacheRun, layer: int, module: torch.nn.Module):
        missing = [p for p in _ATTN_PARTS if not hasattr(module, p)]
        if missing:
            raise ValueError(
                f"block {layer}'s self-attention ({type(module).__name__}) lacks {missing}: this ComfyUI's Wan "
                "attention differs from the one the Jensen KV adapter was written for (v0.3.64)"
            )
        self.run, self.layer, self.module = run, layer, module

    def __call__(self, x: Tensor, freqs: Tensor, transformer_options: dict | None = None, **kwargs) -> Tensor:
        from comfy.ldm.flux.math import apply_rope1

        m = self.module
        b, s = x.shape[:2]
        n, d = m.num_heads, m.head_dim
        q = apply_rope1(m.norm_q(m.q(x)).view(b, s, n, d), freqs).transpose(1, 2)
        k = apply_rope1(m.norm_k(m.k(x)).view(b, s, n, d), freqs).transpose(1, 2)
        v = m.v(x).view(b, s, n, d).transpose(1, 2)
        out = self.run.attend(self.layer, q, k, v, transformer_options)
        return m.o(out.transpose(1, 2).reshape(b, s, n * d))


def _rope_accepts_options(dm) -> bool:
    try:
        return "transformer_options" in inspect.signature(dm.rope_encode).parameters
    except (TypeError, ValueError):
        return False


def make_rope_offset_wrapper(run: WanCacheRun):
    """A DIFFUSION_MODEL wrapper: Wan's ``_forward`` with the time axis of RoPE starting at the chunk's frame."""
    import comfy.ldm.common_dit

    def rope_offset_wrapper(executor, x, timestep, context, clip_fea=None, time_dim_concat=None,
                            transformer_options=None, **kwargs):
        dm = executor.class_obj
        if time_dim_concat is not None or (getattr(dm, "ref_conv", None) is not None and "reference_latent" in kwargs):
            raise ValueError("Chunked AR sampling does not support time-concatenated or reference latents")
        transformer_options = {} if transformer_options is None else transformer_options
        _, _, t, h, w = x.shape
        x = comfy.ldm.common_dit.pad_to_patch_size(x, dm.patch_size)
        extra = {"transformer_options": transformer_options} if _rope_accepts_options(dm) else {}
        # float32 positions: exact integers (bf16 would round frame indices above 256)
        freqs = dm.rope_encode(t, h, w, t_start=run.frame_offset, device=x.device, dtype=torch.float32, **extra)
        out = dm.forward_orig(x, timestep, context, clip_fea=clip_fea, freqs=freqs,
                              transformer_options=transformer_options, **kwargs)
        return out[:, :, :t, :h, :w]

    return rope_offset_wrapper


class WanKVAdapter:
    """Installs the cached self-attention on a clone and removes every trace of it afterwards."""

    def __init__(self, model_patcher):
        self.dm = check_supported(model_patcher)
        self.num_layers = len(self.dm.blocks)
        first = self.dm.blocks[0].self_attn
        self.heads, self.head_dim = int(first.num_heads), int(first.head_dim)
        self.keys = [SELF_ATTN_KEY.format(i) for i in range(self.num_layers)]

    def install(self, work, run: WanCacheRun) -> None:
        """Patch ``work`` (a clone made for this run only)."""
        import comfy.patcher_extension

        for i, key in enumerate(self.keys):
            if key in work.object_patches:
                logger.warning("jensen_kv: %s was already patched upstream; the Chunked AR sampler replaces it", key)
            module = work.get_model_object(f"diffusion_model.blocks.{i}.self_attn")
            work.add_object_patch(key, CachedSelfAttention(run, i, module))
        work.add_wrapper_with_key(comfy.patcher_extension.WrappersMP.DIFFUSION_MODEL, WRAPPER_KEY,
                                  make_rope_offset_wrapper(run))

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
