"""The interface a model family implements so the Chunked AR sampler can drive it.

A family adapter knows these things about its models, and nothing about caches or samplers:

- **detection**: :meth:`ModelFamily.probe` looks at a ModelPatcher and says whether the family
  applies and, if it does, what (if anything) stops the pack from supporting this variant;
  :meth:`ModelFamily.attention_shape` reads layers, heads and head_dim without changing the model
  (the nodes check their settings against it before a run);
- **self-attention**: :meth:`ModelFamily.install` routes every self-attention layer of a *clone*
  through :meth:`runtime.run_caches.RunCaches.attend` (object patches, wrappers), and
  :meth:`ModelFamily.remove` undoes exactly that;
- **RoPE frame offset**: the chunk's absolute first latent frame (``run.position.frame_offset``) must reach
  the rotary embedding, so cached keys and the current chunk sit at their true positions;
- **latent geometry**: :attr:`ModelFamily.geometry` (patch size, channels, VAE strides: what the
  planner in ``jensen_core`` takes), how latent frames become tokens (:meth:`tokens_per_frame`) and
  which latents it can take (:meth:`check_latent`);
- **identity**: the architecture facts a saved cache must match (:meth:`fingerprint`), a digest
  of its weights (:meth:`weights_digest`) and a label for the run's records (:meth:`describe`);
- **the planner's presets** (:attr:`ModelFamily.presets`: the models users run, as the web planner lists them) and
  **its rule** (:meth:`ModelFamily.plan_chunks`: the chunk, window and sink its sampler's cache really keeps, which
  the web planner's route and the family's own loop both ask);
- **core's AR path** (ComfyUI's own ``sample_ar_video``, v0.27+), where the family has one:
  :meth:`ModelFamily.core_ar_model` (the causal model core's sampler drives, or None),
  :meth:`ModelFamily.attach_core_ar` (the object patches that hand core's per-layer caches to the pack's
  session) and :meth:`ModelFamily.check_core_ar_patched` (refuse when another pack replaced them);
  ``runtime/core_ar/`` keeps only the family-free ``end`` protocol;
- **whose patch it is**: :meth:`ModelFamily.is_loop_patch` says whether an object patch is the family's own
  patch of the pack's sampler (core's path then lets that sampling through untouched).

The chunk loop (``runtime/chunk_loop.py``), core's AR path (``runtime/core_ar/``), the routes and the nodes use
only these members, through the registry (``runtime.families``, ``registry.py``); only a family's own node file
(``nodes/<key>.py``) imports its package (tests/test_layout.py checks both).

Adding a family is one package ``runtime/families/<key>/`` (its pure-torch ``model/``, ``family.py`` ending in the
one registration line ``register(TheFamily)``, a ``recipe.py`` where its loop differs), its nodes in
``nodes/<key>.py``, its tiny model in ``jensen_testing.families`` (the conformance suite, ``tests/families/``, runs
every registered family and fails one without it) and a workflow.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

from ...jensen_core.cache_values import CacheShape
from ...jensen_core.geometry import LatentGeometry
from ..options import Chunking
from ..saved_run import weights_digest

#: the pack's own sampler node; a family whose recipe owns its loop names its own node in ``sampler_node``
CHUNKED_AR_SAMPLER = "Chunked AR Video Sampler"


def attention_override_notice(model_options: dict | None) -> str | None:
    """What to tell the user when the MODEL carries an attention backend override (ComfyUI 0.33's Model Attention
    Backend node, or another pack's ``optimized_attention_override``), else None. Every family replaces its
    models' self-attention with the pack's cached attention, which never calls ComfyUI's attention function, so
    the override still serves cross-attention but no self-attention: the quantized cache is used either way."""
    fn = ((model_options or {}).get("transformer_options") or {}).get("optimized_attention_override")
    if fn is None:
        return None
    name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    module = getattr(fn, "__module__", None) or type(fn).__module__
    return (
        f"this MODEL carries an attention backend override ({name} from {module}: Model Attention Backend or "
        "another pack). Jensen KV's quantized cache replaces every self-attention layer, so the override serves "
        "cross-attention only; self-attention runs the pack's own corrected attention"
    )


class UnusedSettingsError(RuntimeError):
    """A MODEL with the pack's settings was sent to a sampler (or through a patch) that would ignore them."""


@dataclass(frozen=True)
class ModelPreset:
    """One model users run, as the planner lists it: its blocks (``layers``), heads (query and K/V) and head_dim.

    ``streams``: attention streams per block that each keep their own K/V (HY-WorldPlay: 2, its RoPE stream and
    its PRoPE camera stream), so the cache holds ``layers * streams`` layers. ``chunk_frames`` (0: the user's) is the
    chunk the family's own sampler fixes (MAGI-1: 6 latent frames), which the planner takes instead of the user's.
    ``context_frames`` (0: none) is for a recipe that rebuilds its cache before every chunk from at most
    ``context_frames`` latent frames in chunks of ``chunk_frames`` (HY-WorldPlay: 20 in chunks of 4): the planner
    then holds ``context_frames / chunk_frames`` chunks, whatever window the user typed."""

    label: str
    layers: int
    heads: int
    head_dim: int
    kv_heads: int | None = None  # None: as many as query heads
    streams: int = 1
    chunk_frames: int = 0
    context_frames: int = 0
    #: model files that are this model (the bundled tiny AR files): the web planner takes this preset when the
    #: sampler's loader names one of them
    files: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.streams < 1 or self.chunk_frames < 0 or self.context_frames < 0:
            raise ValueError(f"{self.label}: streams >= 1, chunk_frames and context_frames >= 0")
        if self.context_frames and (not self.chunk_frames or self.context_frames % self.chunk_frames):
            raise ValueError(f"{self.label}: context_frames {self.context_frames} needs a chunk_frames that divides it")

    @property
    def dims(self) -> tuple[int, int, int]:
        return (self.layers, self.heads, self.head_dim)

    @property
    def cache_layers(self) -> int:
        """The K/V layers the cache holds: blocks x streams."""
        return self.layers * self.streams

    @property
    def context_chunks(self) -> int:
        """Chunks the rebuilt context holds at most (0: no rebuilt context, the user's window applies)."""
        return self.context_frames // self.chunk_frames if self.context_frames else 0


class PlannerFieldError(ValueError):
    """A field of a family's own sampler that the planner cannot use: the field, its value, what is wrong with it,
    and the fix (the routes answer it as a 400 naming that field)."""

    def __init__(self, param: str, value: object, problem: str, fix: str):
        self.param, self.value, self.problem, self.fix = param, value, problem, fix
        super().__init__(f"{param}={value!r} {problem}; {fix}")


class UnsupportedModelError(ValueError):
    """The MODEL is not one the Chunked AR sampler supports (the message names the supported ones)."""


@dataclass(frozen=True)
class Probe:
    """What a family's probe found: ``applies`` (it is this family), ``problem`` (why it is not supported)."""

    applies: bool
    problem: str | None = None

    @property
    def supported(self) -> bool:
        return self.applies and self.problem is None


class AttentionShape(NamedTuple):
    """The self-attention facts the nodes check settings against before a run."""

    layers: int
    heads: int
    head_dim: int


class ModelFamily(ABC):
    """One model family (Wan 2.1 T2V, ...). Instances belong to one ModelPatcher and one run."""

    #: short name, e.g. "Wan 2.1 T2V"
    name: ClassVar[str]
    #: a key for URLs and files, e.g. "wan"
    key: ClassVar[str]
    #: one sentence for errors: which checkpoints this family covers and how they are loaded
    supported: ClassVar[str]
    #: the family's latent layout (the planner's geometry)
    geometry: ClassVar[LatentGeometry]
    latent_channels: ClassVar[int]

    #: the models of this family users run, for the planner (name -> preset)
    presets: ClassVar[dict[str, ModelPreset]] = {}
    #: the node that samples this family: the Chunked AR Video Sampler, or the family's own (its recipe owns the loop)
    sampler_node: ClassVar[str] = CHUNKED_AR_SAMPLER
    #: whether a run's cache can be saved and continued (Save KV Cache / Load KV Cache); a family whose recipe
    #: rebuilds or shares its cache across chunks in flight refuses both, and the planner shows no file size
    saves_runs: ClassVar[bool] = True
    #: inputs of the family's own sampler that decide what its cache holds, which the planner takes besides its own
    #: fields (name -> what it is, with an example); read by :meth:`plan_chunks`
    planner_fields: ClassVar[dict[str, str]] = {}
    #: the node id of :attr:`sampler_node` where the family has its own (a workflow's node type; None: the Chunked AR
    #: sampler's), which the web planner follows
    sampler_node_id: ClassVar[str | None] = None
    #: the planner's fields the web planner reads from that node's widgets (MAGI-1: the video size on the sampler)
    planner_inputs: ClassVar[tuple[str, ...]] = ()
    #: the planner's fields that node fixes (name -> value: one cached CFG branch, a batch of one)
    planner_fixed: ClassVar[dict[str, int]] = {}
    #: where the registry lists the family (probe order, the planner's model list, the refusals' list of families)
    order: ClassVar[int] = 100

    num_layers: int
    heads: int
    head_dim: int

    @property
    def kv_heads(self) -> int:
        """K/V heads of the self-attention: ``heads`` unless a family sets fewer (grouped-query attention, where
        ``heads`` is a multiple of them). The caches hold these; the planner counts them."""
        return getattr(self, "_kv_heads", None) or self.heads

    @kv_heads.setter
    def kv_heads(self, value: int) -> None:
        self._kv_heads = int(value)

    def cache_shape(self) -> CacheShape:
        """What the caches of this model hold per (layer, CFG branch): layers, query and K/V heads, head_dim, and the
        latent geometry (a run sets its CFG branches, batch and element size with :meth:`CacheShape.for_run`)."""
        kv = self.kv_heads
        return CacheShape(
            self.num_layers, self.heads, self.head_dim, self.geometry, kv_heads=None if kv == self.heads else kv
        )

    @classmethod
    def plan_chunks(
        cls,
        asked: Chunking,
        latent_frames: int,
        fields: Mapping[str, object] | None = None,
        preset: ModelPreset | None = None,
    ) -> tuple[Chunking, tuple[str, ...]]:
        """The family's planner rule: the chunk, window and sink the cache of a run of this family's sampler really
        keeps, with a note wherever that differs from what was asked. ``asked``: the chunk, window and sink a user
        typed (the web planner) or a run's request carries; ``latent_frames``: the video's; ``fields``: the inputs of
        the family's own sampler that decide what a window of 0 keeps (its :attr:`planner_fields`, as the node's
        values or as query strings; absent: the node's defaults), :class:`PlannerFieldError` for a value the sampler
        would refuse; ``preset``: the model planned, where its sampler fixes the chunk (``ModelPreset.chunk_frames``).
        The web planner's route and the family's own loop both ask this. The default: as asked."""
        return asked, ()

    @classmethod
    @abstractmethod
    def probe(cls, model_patcher) -> Probe:
        """Inspect ``model_patcher`` without changing it."""

    @classmethod
    def preset_from_shapes(
        cls, shapes: Mapping[str, tuple[int, ...]], metadata: Mapping[str, str]
    ) -> ModelPreset | None:
        """The model a checkpoint's tensor shapes describe (``shapes``: a safetensors header's, prefix stripped;
        ``metadata``: its ``__metadata__``), as this family's loader would build it: a :class:`ModelPreset` with the
        file's blocks, heads and head_dim (and the family's streams and chunk), or None when the file is not one of
        this family's. The planner reads it from the loader's file, before anything is loaded."""
        return None

    @classmethod
    def preset_like(
        cls, label: str, layers: int, heads: int, head_dim: int, kv_heads: int | None = None
    ) -> ModelPreset:
        """A preset of these dimensions: the family's preset that has them (its name and label), else one labelled
        ``label`` with the family's streams, chunk and context (those of its first preset)."""
        for p in cls.presets.values():
            if p.dims == (layers, heads, head_dim) and (p.kv_heads or p.heads) == (kv_heads or heads):
                return p
        first = next(iter(cls.presets.values()), None)
        extra = {} if first is None else {
            "streams": first.streams, "chunk_frames": first.chunk_frames, "context_frames": first.context_frames
        }  # fmt: skip
        return ModelPreset(label, layers, heads, head_dim, kv_heads=kv_heads, **extra)

    @classmethod
    @abstractmethod
    def attention_shape(cls, model_patcher) -> AttentionShape | None:
        """Layers, heads and head_dim of a model this family applies to (supported or not), without changing
        it; None when the model lacks the parts they are read from."""

    @abstractmethod
    def install(self, work, run) -> None:
        """Patch ``work`` (a clone made for one run) so its self-attention goes through ``run``."""

    @abstractmethod
    def remove(self, work) -> None:
        """Undo :meth:`install` on ``work``; safe after a partial install or an error."""

    def tokens_per_frame(self, latent_shape: tuple[int, ...]) -> int:
        """Self-attention tokens of one latent frame of a latent of this shape."""
        return self.geometry.tokens_per_frame(latent_shape[-2], latent_shape[-1])

    @abstractmethod
    def check_latent(self, samples) -> None:
        """ValueError naming the fix when this family cannot take ``samples`` (channels, size)."""

    def fingerprint(self) -> dict:
        """The architecture facts a saved cache must match (see ``runtime.saved_run``); ``kv_heads`` only where the
        K/V heads are fewer than the query heads (a fingerprint without it reads as ``kv_heads == heads``)."""
        fp = {"family": self.name, "layers": self.num_layers, "heads": self.heads, "head_dim": self.head_dim}
        if self.kv_heads != self.heads:
            fp["kv_heads"] = self.kv_heads
        return fp

    @abstractmethod
    def weights_digest(self) -> str:
        """A digest of the model's weights: a saved cache continues only on the weights that wrote it."""

    @abstractmethod
    def describe(self) -> str:
        """Which model classes this run drives, for the saved state's records (``WAN21/WanModel``)."""

    # ------------------------------------------------------------------ whose patch, core's AR path
    @classmethod
    def is_loop_patch(cls, patch) -> bool:
        """Whether ``patch`` (an object patch on a ModelPatcher) is this family's patch of the pack's own sampler."""
        return getattr(patch, "jensen_kv_loop_of", None) is cls

    @classmethod
    def core_ar_model(cls, model_patcher):
        """The causal diffusion model ComfyUI's ``sample_ar_video`` drives on this MODEL when this family serves
        core's AR path there, else None (the default: the family has no core path)."""
        return None

    @classmethod
    def attach_core_ar(cls, model_patcher, active_session) -> None:
        """Add the object patches that serve core's AR path on ``model_patcher`` (a clone carrying the pack's
        settings; idempotent): they call core's own code when ``active_session()`` is None, else hand core's
        per-layer caches and self-attention to that session (``session.init_caches``,
        ``session.init_crossattn_caches``, ``session.attend(layer, q, k, v, labels)``). ValueError when another
        pack already patches what they must replace."""
        raise NotImplementedError(f"{cls.name} has no core AR path")

    @classmethod
    def check_core_ar_patched(cls, model_patcher) -> None:
        """The MODEL as loaded carries :meth:`attach_core_ar`'s patches and they displaced nobody's:
        :class:`UnusedSettingsError` naming the other patch otherwise."""
        raise NotImplementedError(f"{cls.name} has no core AR path")


class DiffusionModelFamily(ModelFamily):
    """A family whose instance drives ``model_patcher.model.diffusion_model`` (:attr:`dm`): its weights digest and
    its description are that model's (``WAN21/WanModel``)."""

    dm: object
    model_class: str

    #: how :meth:`check_latent`'s errors word the latent, the node that makes one and the patches
    #: (``("a Wan video latent", "make it with ...", "Wan patches 2x2")``: see :func:`check_even_latent`)
    latent_help: ClassVar[tuple[str, str, str]]
    #: whether :meth:`check_latent` checks the latent's channels (:attr:`latent_channels`)
    checks_channels: ClassVar[bool] = True

    def read_model(self, model_patcher) -> None:
        """Set :attr:`dm` and :attr:`model_class` from ``model_patcher``."""
        self.dm = model_patcher.model.diffusion_model
        self.model_class = f"{type(model_patcher.model).__name__}/{type(self.dm).__name__}"

    def check_latent(self, samples) -> None:
        check_even_latent(samples, self.latent_channels if self.checks_channels else None, *self.latent_help)

    def weights_digest(self) -> str:
        return weights_digest(self.dm)

    def describe(self) -> str:
        return self.model_class


class RoutedForwardFamily(DiffusionModelFamily):
    """A family whose run replaces the diffusion model's forward (:attr:`forward_key`) by one object patch,
    ``loop_forward(dm, route)``, with a ``route_type(run)`` the run's model calls share (``route.close()`` ends it)."""

    forward_key: ClassVar[str]
    loop_forward: ClassVar[type]
    route_type: ClassVar[type]
    #: what the sampler routes through its cache, for the refusal of another pack's patch (``HY-WorldPlay's forward``)
    routes: ClassVar[str]
    route = None

    @classmethod
    def is_loop_patch(cls, patch) -> bool:
        return isinstance(patch, cls.loop_forward)

    def install(self, work, run) -> None:
        """Put the route on ``work`` (a clone made for one run); refuses to replace another pack's forward."""
        check_patch_free(work, self.forward_key, self.loop_forward, self.sampler_node, self.routes)
        self.route = self.route_type(run)
        work.add_object_patch(self.forward_key, self.loop_forward(self.dm, self.route))

    def remove(self, work) -> None:
        restore_object_patch(work, self.forward_key)
        if self.route is not None:
            self.route.close()


def check_even_latent(samples, channels: int | None, model: str, make_it: str, patches: str) -> None:
    """ValueError naming the fix unless ``samples`` is a 5-D video latent (with ``channels`` channels where given)
    of even height and width; ``model`` (``a Wan video latent``), ``make_it`` (the node that makes one) and
    ``patches`` (``Wan patches 2x2``) word the errors."""
    if samples.ndim != 5 or (channels is not None and samples.shape[1] != channels):
        raise ValueError(
            f"the latent has shape {tuple(samples.shape)}; {model} is (batch, 16, frames, height, width): {make_it}"
        )
    if samples.shape[-1] % 2 or samples.shape[-2] % 2:
        raise ValueError(
            f"latent height {samples.shape[-2]} and width {samples.shape[-1]} must be even ({patches}): use a video "
            "width and height that are multiples of 16"
        )


def check_patch_free(work, key: str, ours: type, sampler_node: str, routes: str) -> None:
    """ValueError unless the object patch on ``key`` of ``work`` is absent or of type ``ours``: ``sampler_node``
    must route ``routes`` (``LingBot-World's forward``) through its cache and drops no other pack's patch."""
    other = work.object_patches.get(key)
    if other is not None and not isinstance(other, ours):
        what = getattr(other, "__qualname__", None) or type(other).__qualname__
        raise ValueError(
            f"the MODEL already carries an object patch on {key} ({what}), put there by another node pack; "
            f"{sampler_node} must route {routes} through its cache and will not silently drop that patch: remove the "
            "node that adds it"
        )


def restore_object_patch(work, key: str) -> None:
    """Undo one run's object patch on ``key`` of ``work`` (the shared model: only this key is restored from the
    shared backup, so other packs' patches stay as ComfyUI left them)."""
    import comfy.utils

    backup = work.object_patches_backup
    if key in backup:
        comfy.utils.set_attr(work.model, key, backup.pop(key))
    work.object_patches.pop(key, None)


#: the families registered so far; ``runtime.families.registry`` lists them in :attr:`ModelFamily.order`
REGISTERED: list[type[ModelFamily]] = []


def register(family: type[ModelFamily]) -> type[ModelFamily]:
    """Add ``family`` to the registry: the one registration line a family's ``family.py`` ends with (idempotent)."""
    if not (isinstance(family, type) and issubclass(family, ModelFamily)):
        raise TypeError(f"register() takes a ModelFamily subclass, got {family!r}")
    if family not in REGISTERED:
        REGISTERED.append(family)
    return family
