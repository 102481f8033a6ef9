"""MAGI-1 as a model family of the pack: its probe, geometry, presets and the route of its self-attention through the
pack's quantized cache (:class:`Magi1Family`).

MAGI-1's DiT (``runtime.families.magi1.model.dit.MagiDiT``) takes its self-attention as an argument of ``forward_chunks(x, spec, attention)``:
every call is ``attention(layer, q, k, v, plan)`` with the post-norm, post-RoPE q (query heads) and k, v (K/V heads)
of the chunks in this forward and a :class:`runtime.families.magi1.model.attention.ChunkPlan` (which finished chunks and which chunks of the
forward each query chunk reads, which chunk the forward writes). :meth:`Magi1Family.install` puts one object patch on
a clone, ``diffusion_model.forward_chunks`` -> :class:`CachedForward`, which hands the DiT a
:class:`Magi1CacheAttention` over the run's :class:`runtime.run_caches.RunCaches` instead of the caller's attention:

- finished chunks (``plan.cached``) are read from the run's cache, one ``(layer, branch 0)`` cache per layer (MAGI-1
  writes its buffer from one pass only: the conditional pass at cfg 1, the context pass at cfg 3), quantized and
  corrected as the MODEL's Quantize KV Cache / Jensen Bias Correction say; a query chunk whose key range starts at
  finished chunk ``s`` reads the held chunks from ``s`` on (a suffix of the cache: ``last_chunks``);
- the chunks of this forward in the query chunk's key range (the chunks still in flight, and the clean chunk in
  front on the forward that writes it) are attended in full precision as context tokens (``k_ctx``/``v_ctx``), never
  stored; the query chunk's own keys are the current chunk;
- after the attention, the chunks ``plan.store`` names (the clean chunk) are stored into the cache, quantized.

The MAGI-1 AR Sampler's recipe (:mod:`.recipe`) arms the patch for its run; any other sampler that calls the patched
model (the Chunked AR Video Sampler, KSampler) gets an error that names the MAGI-1 sampler.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ....jensen_core.geometry import LatentGeometry
from ..base import (
    AttentionShape,
    DiffusionModelFamily,
    ModelPreset,
    Probe,
    check_patch_free,
    register,
    restore_object_patch,
)
from .comfy_model import CHUNK_FRAMES, ComfyMagiDiT
from .model import checkpoint as ck
from .model.attention import ChunkPlan
from .model.config import ConfigError, MagiConfig, config_from_shapes
from .model.dit import MagiDiT
from .window import plan_chunks

FORWARD_KEY = "diffusion_model.forward_chunks"
SUPPORTED = (
    "MAGI-1 text-to-video (Sand AI: 4.5B or 24B, base or distill, loaded with Load MAGI-1 Model, 16 latent "
    "channels, 2 x 2 patches, one latent frame per token row) sampled with MAGI-1 AR Sampler"
)
#: MAGI-1's VAE: 16 channels, 8 x 8 pixels and 4 frames per latent pixel (no causal first frame); patches 1 x 2 x 2
GEOMETRY = LatentGeometry(
    patch=(1, 2, 2), latent_channels=16, vae_time_stride=4, vae_space_stride=8, causal_first_frame=False
)
#: (layers, query heads, head_dim, K/V heads) of the published DiTs (runtime.families.magi1.model.config.PUBLISHED)
PRESETS = {
    "magi1-4.5b": ModelPreset("MAGI-1 4.5B", 34, 24, 128, kv_heads=8, chunk_frames=CHUNK_FRAMES),
    "magi1-24b": ModelPreset("MAGI-1 24B", 48, 48, 128, kv_heads=8, chunk_frames=CHUNK_FRAMES),
}
#: the only branch MAGI-1 writes: one buffer per layer, read by every conditional pass
BRANCH = 0


class MagiLoopError(RuntimeError):
    """The patched MAGI-1 was called by something other than the MAGI-1 AR Sampler's run."""


class Magi1Family(DiffusionModelFamily):
    name = "MAGI-1"
    key = "magi1"
    supported = SUPPORTED
    sampler_node = "MAGI-1 AR Sampler"
    sampler_node_id = "JensenKVMagi1ARSampler"
    order = 20
    saves_runs = False  # several chunks are denoised at once: no state between two chunks to save
    geometry = GEOMETRY
    presets = PRESETS
    latent_channels = GEOMETRY.latent_channels
    latent_help = (
        "a MAGI-1 video latent",
        "MAGI-1 AR Sampler makes it from the video size",
        "MAGI-1 patches 2x2",
    )
    planner_fields = {
        "window_size": "MAGI-1 AR Sampler's chunks denoised together, 1 to 4, e.g. window_size=4",
        "kv_ranges": "MAGI-1 AR Sampler's key ranges, e.g. kv_ranges=5,4,3,2 (or all)",
        "steps": "MAGI-1 AR Sampler's steps per chunk, e.g. steps=16",
    }
    #: the video is on the sampler (no latent input), with the window and the sink; one cached branch, batch 1
    planner_inputs = ("width", "height", "frames", "window_chunks", "sink_chunks")
    planner_fixed = {"batch": 1, "cfg_branches": 1}

    @classmethod
    def plan_chunks(cls, asked, latent_frames, fields=None, preset=None):
        """The MAGI-1 AR Sampler's chunk (its preset's 6 latent frames) and window 0: as many finished chunks as its
        key ranges reach (every chunk with kv_ranges 'all'), from its window_size, kv_ranges and steps."""
        return plan_chunks(asked, latent_frames, fields, preset)

    @classmethod
    def preset_from_shapes(cls, shapes, metadata):
        if ck.PROBE_KEY not in shapes:
            return None
        try:  # as the loader reads it: the file's magi1_config metadata, else the architecture its shapes describe
            meta = metadata.get(ck.META_CONFIG)
            weights = {k: v for k, v in shapes.items() if not k.startswith(ck.SPECIAL_PREFIX)}
            cfg = MagiConfig.from_json(meta) if meta else config_from_shapes(weights)
        except (ConfigError, ValueError):
            return None
        return cls.preset_like(
            f"MAGI-1 ({cfg.num_layers} blocks, width {cfg.hidden_size})",
            cfg.num_layers,
            cfg.num_attention_heads,
            cfg.kv_channels,
            kv_heads=cfg.num_query_groups,
        )

    @classmethod
    def probe(cls, model_patcher) -> Probe:
        dm = getattr(getattr(model_patcher, "model", None), "diffusion_model", None)
        if not isinstance(dm, MagiDiT):
            return Probe(False)
        if not isinstance(dm, ComfyMagiDiT):
            return Probe(True, f"is a bare {type(dm).__name__}, not one Load MAGI-1 Model built")
        cfg = dm.config
        found = []
        if cfg.t_patch_size != GEOMETRY.patch[0] or cfg.patch_size != GEOMETRY.patch[1]:
            found.append(
                f"patches {cfg.t_patch_size} x {cfg.patch_size} x {cfg.patch_size} (t_patch_size {cfg.t_patch_size})"
            )
        if cfg.latent_channels != GEOMETRY.latent_channels:
            found.append(f"takes {cfg.latent_channels} latent channels")
        if found:
            return Probe(
                True,
                f"{' and '.join(found)}, where MAGI-1's VAE gives 16 channels per latent pixel and the published DiTs "
                "patch 1 x 2 x 2",
            )
        return Probe(True)

    @classmethod
    def attention_shape(cls, model_patcher) -> AttentionShape | None:
        try:
            cfg = model_patcher.get_model_object("diffusion_model").config
            return AttentionShape(int(cfg.num_layers), int(cfg.num_attention_heads), int(cfg.kv_channels))
        except (AttributeError, KeyError, TypeError):
            return None

    def __init__(self, model_patcher):
        self.read_model(model_patcher)
        cfg = self.config = self.dm.config
        self.num_layers = int(cfg.num_layers)
        self.heads = int(cfg.num_attention_heads)
        self.kv_heads = int(cfg.num_query_groups)
        self.head_dim = int(cfg.kv_channels)
        self.attention: Magi1CacheAttention | None = None

    # ------------------------------------------------------------------ latent geometry
    def fingerprint(self) -> dict:
        cfg = self.config
        return {
            **super().fingerprint(),
            "dim": int(cfg.hidden_size),
            "ffn_dim": int(cfg.ffn_hidden_size),
            "text_dim": int(cfg.caption_channels),
            "distill": bool(cfg.distill),
        }

    # ------------------------------------------------------------------ the patch
    def install(self, work, run) -> None:
        """Put :class:`CachedForward` on ``work`` (a clone for this run); refuses another pack's patch there."""
        check_patch_free(work, FORWARD_KEY, CachedForward, "MAGI-1 AR Sampler", "the DiT's self-attention")
        self.attention = Magi1CacheAttention(run, self.num_layers)
        work.add_object_patch(FORWARD_KEY, CachedForward(work.get_model_object("diffusion_model"), self.attention))

    def remove(self, work) -> None:
        restore_object_patch(work, FORWARD_KEY)
        if self.attention is not None:
            self.attention.armed = False


class CachedForward:
    """Stands in for ``MagiDiT.forward_chunks`` on the run's clone: the DiT with :class:`Magi1CacheAttention`.

    The caller's ``attention`` argument is ignored: on this clone every self-attention goes through the pack's
    cache. Only a run that armed the attention may call it."""

    jensen_kv_patch = True
    jensen_kv_loop_of = Magi1Family

    def __init__(self, dm: MagiDiT, attention: Magi1CacheAttention):
        self.dm, self.attention = dm, attention

    def __call__(self, x: Tensor, spec, attention=None) -> Tensor:
        if not self.attention.armed:
            raise MagiLoopError(
                "this MAGI-1 MODEL is patched for a MAGI-1 AR Sampler run but was called by another sampler (its "
                "KSampler forward, or the Chunked AR Video Sampler): sample MAGI-1 with MAGI-1 AR Sampler"
            )
        return MagiDiT.forward_chunks(self.dm, x, spec, self.attention)


class Magi1CacheAttention:
    """``attention(layer, q, k, v, plan)`` of the DiT over the run's caches (see the module docstring).

    ``run`` is a :class:`runtime.run_caches.RunCaches` (one cache per layer, branch 0). ``stored`` lists the
    (absolute chunk, layer) pairs written since the run last asked (:meth:`take_stored`)."""

    def __init__(self, run, num_layers: int):
        self.run, self.num_layers = run, num_layers
        self.armed = False
        self.chunk_frames = 1  # latent frames per chunk (the write events' frame offsets); the recipe sets it
        self.stored: list[tuple[int, int]] = []

    def held(self, layer: int) -> list[int]:
        """Absolute indices of the finished chunks the layer's cache holds, oldest first (appended in order)."""
        cache = self.run.layer_cache(layer, BRANCH)
        return [] if cache is None else cache.retention.indices(cache.chunks_appended)

    def __call__(self, layer: int, q: Tensor, k: Tensor, v: Tensor, plan: ChunkPlan) -> Tensor:
        n, cached = plan.chunk_tokens, plan.cached
        # every layer's (empty) cache from the first call on: layer 1 reads before the writing forward reaches it
        self.run.layer_cache(layer, BRANCH, create=True)
        held = self.held(layer)
        outs = []
        for j, (start, end) in enumerate(plan.key_ranges):
            if end != cached + j + 1:
                raise ValueError(
                    f"chunk {j}'s key range {(start, end)} does not end at the chunk itself ({cached + j + 1}); "
                    "MAGI-1's pipeline gives every chunk the chunks before it and itself"
                )
            first = max(start, cached) - cached  # the first chunk of this forward in range
            sl = slice(j * n, (j + 1) * n)
            # the chunks of this forward before it in range: in flight (or the clean chunk being written), in
            # full precision, never stored
            ctx = (k[:, :, first * n : j * n], v[:, :, first * n : j * n]) if j > first else None
            # the held chunks in range: a suffix of the cache (held chunks are in order, and every chunk stored so far
            # is before ``cached`` in a forward that reads the cache; the unconditional pass reads none: cached 0)
            reads = sum(1 for c in held if start <= c < cached)
            self.run.at(cached + j)
            outs.append(
                self.run.attend(layer, q[:, :, sl], k[:, :, sl], v[:, :, sl], None, context=ctx, last_chunks=reads)
            )
        out = torch.cat(outs, dim=2)
        for cur, absolute in plan.store:
            self._store(layer, q, k, v, out, cur * n, (cur + 1) * n, absolute)
        return out

    def _store(self, layer, q, k, v, out, a: int, b: int, absolute: int) -> None:
        run = self.run
        appended = run.layer_cache(layer, BRANCH).chunks_appended
        if absolute != appended:  # held() counts on chunk i being the i-th appended
            raise RuntimeError(
                f"chunk {absolute} is written to layer {layer}'s cache after {appended} chunks; MAGI-1 writes its "
                "finished chunks once each, in order"
            )
        run.at(absolute)
        # observers see the chunk's full-precision K/V, just before the cache stores them
        run.store(
            layer, BRANCH, k[:, :, a:b], v[:, :, a:b], q=q[:, :, a:b], out=out[:, :, a:b],
            frame_offset=absolute * self.chunk_frames,
        )  # fmt: skip
        self.stored.append((absolute, layer))

    def take_stored(self) -> list[int]:
        """The chunks written since the last call (each checked to have reached every layer), oldest first."""
        chunks = sorted({c for c, _ in self.stored})
        for c in chunks:
            layers = {layer for cc, layer in self.stored if cc == c}
            if layers != set(range(self.num_layers)):
                missing = sorted(set(range(self.num_layers)) - layers)
                raise RuntimeError(f"chunk {c} was written to layers {sorted(layers)} only (missing {missing})")
        self.stored.clear()
        return chunks


register(Magi1Family)
