"""HY-WorldPlay as a model family: the pack's quantized store and correction on both vision streams of every block.

What the family knows (the loop lives in :mod:`.recipe`):

- **which models**: the pack's WorldPlay transformer (``Load HY-WorldPlay``: core's HunyuanVideo 1.5 classes plus
  the action embedding and the PRoPE stream in every double block). Plain HunyuanVideo 1.5 (core's
  ``model_base.HunyuanVideo15``, e.g. from ``UNETLoader``) belongs to this lineage and is refused by name: it has
  neither the action embedding nor the camera stream. Wan and every other model are not this family.
- **cache layers**: every double block attends twice (stream ``img``, with 3-D RoPE, and stream ``prope``, PRoPE's
  camera-projected q, k, v), over the same keys: each stream keeps its own K/V, so block ``i`` is cache layers
  ``2 i`` (img) and ``2 i + 1`` (prope). ``num_layers`` counts those (what the planner and the report count).
- **the attention route** (:meth:`WorldPlayFamily.install`, on a clone, undone by :meth:`WorldPlayFamily.remove`): one
  object patch on ``diffusion_model._forward`` (:class:`WorldPlayLoopForward`) gives every model call a
  :class:`~runtime.families.worldplay.model.WorldPlayCall` whose attention is :meth:`WorldPlayRoute.attention`,
  i.e. :meth:`runtime.run_caches.RunCaches.attend` for both streams: the cached (quantized, corrected) context
  chunks, the prompt's K/V as context tokens (full precision, never stored), and the call's own tokens. The route
  also carries what the recipe decides per call (the RoPE time positions, the re-encode timestep) and computes the
  prompt's text prefix once per prompt, from the first call's own text inputs.
- **geometry**: HunyuanVideo 1.5's latents (32 channels, 16 x 16 pixels and 4 frames per latent), patch size from
  the model (1 x 1 x 1 for the released one).

Its recipe owns its loop (``HY-WorldPlay AR Sampler``): the Chunked AR Video Sampler cannot drive it, and the route
says so at the first model call rather than run the model wrongly.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from ....jensen_core.geometry import LatentGeometry
from ...model_loading import shaped
from ...options import Chunking
from ..base import (
    AttentionShape,
    ModelPreset,
    Probe,
    RoutedForwardFamily,
    register,
)
from .comfy_model import CALL_KEY, WorldPlayCall, WorldPlayInputError, is_worldplay
from .model import keys as wp_keys
from .model.attention import STREAMS, TextPrefix
from .model.context import MEMORY_FRAMES
from .model.trajectory import CHUNK_LATENTS

#: the object patch of the route
FORWARD_KEY = "diffusion_model._forward"
SAMPLER_NODE = "HY-WorldPlay AR Sampler"
SUPPORTED = (
    "HY-WorldPlay (Tencent-Hunyuan/HY-WorldPlay's AR distilled 480p image-to-video action model, built on ComfyUI's "
    "HunyuanVideo 1.5: 32 latent channels, the action embedding and the PRoPE camera stream), loaded with Load "
    f"HY-WorldPlay and sampled with {SAMPLER_NODE}"
)
#: HunyuanVideo 1.5's latent layout: 32 channels, 16 x 16 pixels and 4 frames per latent frame, 1 x 1 x 1 patches
GEOMETRY = LatentGeometry(patch=(1, 1, 1), latent_channels=32, vae_time_stride=4, vae_space_stride=16)
#: the context holds at most this many chunks (20 frames in chunks of 4)
CONTEXT_CHUNKS = MEMORY_FRAMES // CHUNK_LATENTS
#: what the route reads from every double block
BLOCK_PARTS = ("img_attn", "img_attn_prope_proj", "forward_vision", "forward_text")


def stream_layer(block: int, stream: str) -> int:
    """The cache layer of ``stream`` of double block ``block``: ``2 block`` (img), ``2 block + 1`` (prope)."""
    return 2 * int(block) + STREAMS.index(stream)


def _hunyuan15_base(base) -> bool:
    """``base`` is core's ``model_base.HunyuanVideo15`` (or a subclass); False on a ComfyUI without it."""
    import comfy.model_base

    cls = getattr(comfy.model_base, "HunyuanVideo15", None)
    return cls is not None and isinstance(base, cls)


class WorldPlayFamily(RoutedForwardFamily):
    name = "HY-WorldPlay"
    key = "worldplay"
    supported = SUPPORTED
    geometry = GEOMETRY
    latent_channels = GEOMETRY.latent_channels
    #: the released model (runtime.families.worldplay.model.keys.RELEASED): 54 double blocks x 2 streams, 16 heads x 128; the reference's
    #: chunks of 4 latent frames and its context of up to 20 re-encoded frames
    presets = {
        "hy-worldplay": ModelPreset(
            "HY-WorldPlay 8B (480p I2V)",
            54,
            16,
            128,
            streams=len(STREAMS),
            chunk_frames=CHUNK_LATENTS,
            context_frames=MEMORY_FRAMES,
        )
    }
    #: the pack's node that samples this family (its recipe owns the loop)
    sampler_node = SAMPLER_NODE
    sampler_node_id = "JensenKVWorldPlayARSampler"
    planner_fixed = {"cfg_branches": 1}  # cfg 1: one cached branch (the video's size is on its latent)
    order = 10
    saves_runs = False  # the cache is rebuilt from the chosen context frames before every chunk

    @classmethod
    def plan_chunks(cls, asked, latent_frames, fields=None, preset=None):
        """The cache is rebuilt before every chunk from up to 20 context frames in chunks of 4: chunk 4, window 5,
        sink 0, whatever was asked (a note says so where the ask differs)."""
        rule = Chunking(CHUNK_LATENTS, CONTEXT_CHUNKS, 0)
        if (asked.chunk_frames, asked.window_chunks, asked.sink_chunks) == (rule.chunk_frames, rule.window_chunks, 0):
            return rule, ()
        return rule, (
            f"{cls.name} rebuilds its cache before every chunk from up to {MEMORY_FRAMES} latent frames in chunks of "
            f"{CHUNK_LATENTS}: planned with chunk {CHUNK_LATENTS}, window {CONTEXT_CHUNKS}, sink 0 (the chunk, window "
            "and sink given do not apply)",
        )

    @classmethod
    def probe(cls, model_patcher) -> Probe:
        base = getattr(model_patcher, "model", None)
        dm = getattr(base, "diffusion_model", None)
        if not is_worldplay(model_patcher):
            if base is not None and _hunyuan15_base(base):
                return Probe(
                    True,
                    f"is plain HunyuanVideo 1.5 ({type(base).__name__} / {type(dm).__name__}: no action embedding, no "
                    "PRoPE camera stream), e.g. HY-WorldPlay's file loaded with UNETLoader, which drops both; load "
                    "it with Load HY-WorldPlay",
                )
            return Probe(False)
        if not _hunyuan15_base(base):
            return Probe(True, f"pairs the WorldPlay transformer with {type(base).__name__}, not HunyuanVideo15")
        if len(getattr(dm, "single_blocks", ()) or ()) or not len(getattr(dm, "double_blocks", ()) or ()):
            return Probe(True, "has single-stream blocks or no double blocks (WorldPlay has double blocks only)")
        for i, blk in enumerate(dm.double_blocks):
            missing = [p for p in BLOCK_PARTS if not hasattr(blk, p)]
            if missing:
                return Probe(True, f"has a double block ({i}) without {missing}, which the WorldPlay route uses")
        if getattr(dm, "action_in", None) is None:
            return Probe(True, "has no action embedding (action_in)")
        if tuple(dm.patch_size)[0] != 1 or int(dm.out_channels) != GEOMETRY.latent_channels:
            return Probe(
                True,
                f"has patch {tuple(dm.patch_size)} / {dm.out_channels} latent channels (WorldPlay: one latent frame "
                f"per token row, {GEOMETRY.latent_channels} channels)",
            )
        return Probe(True)

    @classmethod
    def preset_from_shapes(cls, shapes, metadata):
        if not any(k.startswith("double_blocks.") for k in shapes):
            return None
        try:
            s = wp_keys.read_config(shaped(shapes))
        except (wp_keys.CheckpointError, ValueError):
            return None
        return cls.preset_like(f"HY-WorldPlay ({s.depth} blocks, width {s.hidden_size})", s.depth, s.heads, s.head_dim)

    @classmethod
    def attention_shape(cls, model_patcher) -> AttentionShape | None:
        try:
            dm = model_patcher.model.diffusion_model
            heads = int(dm.num_heads)
            return AttentionShape(len(STREAMS) * len(dm.double_blocks), heads, int(dm.hidden_size) // heads)
        except (AttributeError, TypeError, ZeroDivisionError):
            return None

    def __init__(self, model_patcher):
        self.read_model(model_patcher)
        self.blocks = len(self.dm.double_blocks)
        self.num_layers = len(STREAMS) * self.blocks
        self.heads = int(self.dm.num_heads)
        self.head_dim = int(self.dm.hidden_size) // self.heads
        self.geometry = dataclasses.replace(GEOMETRY, patch=tuple(int(p) for p in self.dm.patch_size))
        self.route: WorldPlayRoute | None = None

    # ------------------------------------------------------------------ latents, identity
    def check_latent(self, samples) -> None:
        if samples.ndim != 5 or samples.shape[1] != GEOMETRY.latent_channels:
            raise ValueError(
                f"the latent has shape {tuple(samples.shape)}; a HY-WorldPlay latent is (batch, 32, frames, height, "
                "width): make it with HunyuanVideo15ImageToVideo"
            )
        _, ph, pw = self.geometry.patch
        if samples.shape[-2] % ph or samples.shape[-1] % pw:
            raise ValueError(
                f"latent height {samples.shape[-2]} and width {samples.shape[-1]} must be multiples of the patch "
                f"{ph} x {pw}"
            )

    def fingerprint(self) -> dict:
        return {
            **super().fingerprint(),
            "blocks": self.blocks,
            "streams": len(STREAMS),
            "hidden_size": int(self.dm.hidden_size),
        }


class WorldPlayRoute:
    """What one run's model calls share: the run's caches, the call the recipe is making, the prompt's K/V.

    The recipe sets :attr:`positions` (the call's RoPE time positions) and, for the context re-encode,
    :attr:`timestep` before every model call; the model call (:class:`WorldPlayLoopForward`) reads them."""

    def __init__(self, run):
        self.run = run
        self.positions: tuple[int, ...] | None = None
        self.timestep: float | None = None
        self.text: dict[tuple[int, ...], TextPrefix] = {}
        self.calls = 0
        self.closed = False
        self._options: dict = {}

    def set_call(self, positions, timestep: float | None = None) -> None:
        self.positions, self.timestep = tuple(int(p) for p in positions), timestep

    def clear_text(self) -> None:
        """Forget the prompt's K/V (a new prompt: the next call computes it again)."""
        self.text.clear()

    @property
    def text_prefix(self) -> TextPrefix | None:
        return next(iter(self.text.values()), None)

    def close(self) -> None:
        self.closed = True
        self.text.clear()
        self.positions = None

    def attention(self, layer: int, stream: str, q: Tensor, k: Tensor, v: Tensor, text_k: Tensor, text_v: Tensor):
        """The one attention both vision streams of every block go through (``runtime.families.worldplay.model.attention.VisionAttention``)."""
        return self.run.attend(stream_layer(layer, stream), q, k, v, self._options, context=(text_k, text_v))

    def prefix(self, dm, opts: dict, context, attention_mask, txt_byt5, clip_fea) -> TextPrefix:
        """The prompt's K/V per block, computed at the first call of each CFG slot layout and kept (text runs once)."""
        key = tuple(opts.get("cond_or_uncond") or [0])
        prefix = self.text.get(key)
        if prefix is None:
            with torch.no_grad():
                prefix = self.text[key] = dm.text_prefix(context, attention_mask, txt_byt5, clip_fea, opts)
        return prefix


class WorldPlayLoopForward:
    """Stands in for ``WorldPlayTransformer._forward`` on the run's clone: the call's attention, RoPE positions,
    text prefix and timestep come from the route (:class:`WorldPlayRoute`), the rest is the model's own."""

    jensen_kv_patch = True

    def __init__(self, dm, route: WorldPlayRoute):
        self.dm, self.route = dm, route

    def __call__(
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
        route, dm = self.route, self.dm
        if route.closed or route.positions is None:
            raise WorldPlayInputError(
                f"HY-WorldPlay is sampled by {SAMPLER_NODE}: its context is re-encoded before every chunk with RoPE "
                "positions renumbered, which the Chunked AR Video Sampler does not do. Connect this MODEL to "
                f"{SAMPLER_NODE} (KSampler without the pack's cache runs the model's own block-causal forward)"
            )
        if len(route.positions) != x.shape[2]:
            raise RuntimeError(
                f"the WorldPlay call has {x.shape[2]} latent frames but the recipe set {len(route.positions)} RoPE "
                "positions (a bug of the recipe)"
            )
        opts = dict(transformer_options or {})
        route._options = opts
        prefix = route.prefix(dm, opts, context, attention_mask, txt_byt5, clip_fea)
        steps = None
        if route.timestep is not None:
            steps = torch.full((x.shape[0],), float(route.timestep), device=x.device, dtype=torch.float32)
        call = WorldPlayCall(attention=route.attention, positions=route.positions, text_prefix=prefix, timesteps=steps)
        route.calls += 1
        return type(dm)._forward(
            dm,
            x,
            timestep,
            context,
            y,
            txt_byt5,
            clip_fea,
            guidance,
            attention_mask,
            guiding_frame_index,
            ref_latent,
            disable_time_r,
            control,
            transformer_options={**opts, CALL_KEY: call},
            **kwargs,
        )


__all__ = [
    "FORWARD_KEY",
    "GEOMETRY",
    "SAMPLER_NODE",
    "SUPPORTED",
    "WorldPlayFamily",
    "WorldPlayLoopForward",
    "WorldPlayRoute",
    "stream_layer",
]

WorldPlayFamily.forward_key, WorldPlayFamily.routes = FORWARD_KEY, "HY-WorldPlay's forward"
WorldPlayFamily.loop_forward, WorldPlayFamily.route_type = WorldPlayLoopForward, WorldPlayRoute
register(WorldPlayFamily)
