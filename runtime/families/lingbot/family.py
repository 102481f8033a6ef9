"""LingBot-World 2.0 as a model family: the pack's quantized store and correction on every block's self-attention.

What the family knows (the loop lives in :mod:`.recipe`):

- **which models**: the pack's LingBot transformer (``Load LingBot-World``: core's Wan 2.1 blocks plus the camera
  layers, 36 input channels, 1536 camera features per token). The same file through ``UNETLoader`` is a plain Wan 2.1
  model without its camera layers: the Wan 2.1 family refuses it (36 input channels), and LingBot-World AR Sampler
  names the loader to use. LingBot-World 1.0 Fast's action variant (7-channel camera map, 1792 features) is refused.
- **cache layers**: one per block (its self-attention); post-RoPE keys at their absolute frame positions.
- **the attention route** (:meth:`LingBotFamily.install`, on a clone, undone by :meth:`LingBotFamily.remove`): one
  object patch on ``diffusion_model._forward`` (:class:`LingBotLoopForward`) gives every model call a
  :class:`~runtime.families.lingbot.comfy_model.LingBotCall` whose attention is
  :meth:`runtime.run_caches.RunCaches.attend`, with the RoPE frame and camera features the recipe set
  (:meth:`LingBotRoute.set_call`).
- **geometry**: Wan 2.1's latents (16 channels, 8 x 8 pixels and 4 frames per latent, 1 x 2 x 2 patches).
- **the planner's rule** (:meth:`LingBotFamily.plan_chunks`): the reference's window and sink in latent frames
  (``local_attn_size`` 18, ``sink_size`` 6) are kept as cache entries of ``gcd(chunk, sink, window)`` frames
  (``model.window.cache_rule``: 2 frames, a sink of 3 entries and a window of 4 at chunk 4).
"""

from __future__ import annotations

from ....jensen_core.geometry import LatentGeometry
from ...model_loading import shaped
from ...options import Chunking
from ..base import (
    AttentionShape,
    ModelPreset,
    PlannerFieldError,
    Probe,
    RoutedForwardFamily,
    register,
)
from .comfy_model import CALL_KEY, SAMPLER_NODE, LingBotCall, LingBotInputError, is_lingbot
from .model import keys as lb_keys
from .model.camera import camera_features
from .model.keys import CAMERA_BLOCK, RELEASED
from .model.window import DEFAULT_CHUNK, DEFAULT_LOCAL_ATTN, DEFAULT_SINK, cache_rule

FORWARD_KEY = "diffusion_model._forward"
SUPPORTED = (
    "LingBot-World 2.0 (robbyant/lingbot-world-v2 causal-fast, 1.3B or 14B: Wan 2.1 blocks with 36 input channels and "
    f"the camera layers), loaded with Load LingBot-World and sampled with {SAMPLER_NODE}"
)
GEOMETRY = LatentGeometry(patch=(1, 2, 2), latent_channels=16, vae_time_stride=4, vae_space_stride=8)


def _preset(label: str, key: str) -> ModelPreset:
    s = RELEASED[key]
    return ModelPreset(label, s.num_layers, s.num_heads, s.dim // s.num_heads)


def _whole(fields, name: str, default: int) -> int:
    raw = str((fields or {}).get(name) or "").strip() or str(default)
    try:
        return int(raw)
    except ValueError:
        raise PlannerFieldError(
            name, raw, "is not a whole number of latent frames", f"give e.g. {name}={default}"
        ) from None


class LingBotFamily(RoutedForwardFamily):
    name = "LingBot-World"
    key = "lingbot"
    supported = SUPPORTED
    geometry = GEOMETRY
    latent_channels = GEOMETRY.latent_channels
    latent_help = ("a LingBot-World latent", "make it with WanImageToVideo", "1 x 2 x 2 patches")
    presets = {
        "lingbot-world-1.3b": _preset("LingBot-World 2.0 1.3B (causal-fast)", "lingbot-world-1.3b"),
        "lingbot-world-14b": _preset("LingBot-World 2.0 14B (causal-fast)", "lingbot-world-14b"),
    }
    sampler_node = SAMPLER_NODE
    sampler_node_id = "JensenKVLingBotARSampler"
    planner_fields = {
        "local_attn_size": "LingBot-World AR Sampler's window in latent frames, sink and chunk included, e.g. "
        "local_attn_size=18 (-1: every frame)",
        "sink_size": "LingBot-World AR Sampler's sink in latent frames, e.g. sink_size=6",
    }
    planner_inputs = ("chunk_frames",)
    planner_fixed = {"cfg_branches": 1}
    saves_runs = False
    order = 12

    @classmethod
    def plan_chunks(cls, asked, latent_frames, fields=None, preset=None):
        """The reference's window and sink in latent frames (the sampler's ``local_attn_size`` and ``sink_size``, 18
        and 6 when absent) as cache entries: ``model.window.cache_rule`` of the asked chunk (4 when 0)."""
        chunk = asked.chunk_frames or DEFAULT_CHUNK
        local, sink = _whole(fields, "local_attn_size", DEFAULT_LOCAL_ATTN), _whole(fields, "sink_size", DEFAULT_SINK)
        try:
            rule = cache_rule(chunk, local, sink)
        except ValueError as exc:
            name = "sink_size" if "sink_size=" in str(exc).split(":")[0] else "local_attn_size"
            raise PlannerFieldError(
                name, local if name == "local_attn_size" else sink, "does not fit", str(exc)
            ) from None
        notes = []
        if rule.window:
            notes.append(
                f"{SAMPLER_NODE} keeps the reference's window of {local} latent frames (sink {sink}, the chunk of {chunk} "
                f"being made included) as cache entries of {rule.entry_frames} frames: sink {rule.sink}, window "
                f"{rule.window} (the window and sink in chunks given do not apply)"
            )
        else:
            notes.append(f"{SAMPLER_NODE} with local_attn_size -1 keeps every frame")
        return Chunking(rule.entry_frames, rule.window, rule.sink), tuple(notes)

    @classmethod
    def probe(cls, model_patcher) -> Probe:
        if not is_lingbot(model_patcher):
            return Probe(False)
        dm = model_patcher.model.diffusion_model
        if int(dm.camera_in) != camera_features(dm.patch_size):
            return Probe(
                True,
                f"takes {dm.camera_in} camera features per token (LingBot-World 1.0 Fast's action variant adds 4 WASD "
                f"channels: 1792); LingBot-World 2.0 takes the 6-channel camera map ({camera_features(dm.patch_size)})",
            )
        if tuple(dm.patch_size) != GEOMETRY.patch or int(dm.out_dim) != GEOMETRY.latent_channels:
            return Probe(
                True, f"has patch {tuple(dm.patch_size)} / {dm.out_dim} output channels (LingBot: 1 x 2 x 2, 16)"
            )
        for i, blk in enumerate(dm.blocks):
            missing = [n for n in (*CAMERA_BLOCK, "self_attn", "forward_lingbot") if not hasattr(blk, n)]
            if missing:
                return Probe(True, f"has a block ({i}) without {missing}")
        return Probe(True)

    @classmethod
    def preset_from_shapes(cls, shapes, metadata):
        if not lb_keys.is_lingbot(shapes):
            return None
        try:  # the heads as the loader takes them: the file's num_heads metadata, else dim // 128
            s = lb_keys.read_shape(shaped(shapes), metadata.get("num_heads") or None)
        except (lb_keys.CheckpointError, ValueError):
            return None
        return cls.preset_like(
            f"LingBot-World ({s.num_layers} blocks, width {s.dim})", s.num_layers, s.num_heads, s.dim // s.num_heads
        )

    @classmethod
    def attention_shape(cls, model_patcher) -> AttentionShape | None:
        try:
            dm = model_patcher.model.diffusion_model
            return AttentionShape(len(dm.blocks), int(dm.num_heads), int(dm.dim) // int(dm.num_heads))
        except (AttributeError, TypeError, ZeroDivisionError):
            return None

    def __init__(self, model_patcher):
        self.read_model(model_patcher)
        self.num_layers = len(self.dm.blocks)
        self.heads = int(self.dm.num_heads)
        self.head_dim = int(self.dm.dim) // self.heads
        self.route: LingBotRoute | None = None

    def fingerprint(self) -> dict:
        return {**super().fingerprint(), "dim": int(self.dm.dim), "camera_in": int(self.dm.camera_in)}


class LingBotRoute:
    """What one run's model calls share: the run's caches and what the recipe decided for the next call (the RoPE
    frame of its first latent frame and its camera features)."""

    def __init__(self, run):
        self.run = run
        self.frame_offset: int | None = None
        self.camera = None
        self.closed = False
        self.calls = 0
        self._options: dict = {}

    def set_call(self, frame_offset: int, camera) -> None:
        self.frame_offset, self.camera = int(frame_offset), camera

    def close(self) -> None:
        self.closed, self.camera, self.frame_offset = True, None, None

    def attention(self, layer: int, q, k, v):
        return self.run.attend(layer, q, k, v, self._options)


class LingBotLoopForward:
    """Stands in for the LingBot transformer's ``_forward`` on the run's clone: attention, RoPE frame and camera from
    the route."""

    jensen_kv_patch = True

    def __init__(self, dm, route: LingBotRoute):
        self.dm, self.route = dm, route

    def __call__(self, x, timestep, context, clip_fea=None, time_dim_concat=None, transformer_options=None, **kwargs):
        route = self.route
        if route.closed or route.frame_offset is None:
            raise LingBotInputError(
                f"LingBot-World is sampled by {SAMPLER_NODE} (each chunk's camera features, RoPE frame and window); "
                f"connect this MODEL to {SAMPLER_NODE}"
            )
        opts = dict(transformer_options or {})
        route._options = opts
        route.calls += 1
        call = LingBotCall(attention=route.attention, frame_offset=route.frame_offset, camera=route.camera)
        return self.dm.forward_lingbot(x, timestep, context, call, {**opts, CALL_KEY: call})


__all__ = ["FORWARD_KEY", "GEOMETRY", "SUPPORTED", "LingBotFamily", "LingBotLoopForward", "LingBotRoute"]

LingBotFamily.forward_key, LingBotFamily.routes = FORWARD_KEY, "LingBot-World's forward"
LingBotFamily.loop_forward, LingBotFamily.route_type = LingBotLoopForward, LingBotRoute
register(LingBotFamily)
