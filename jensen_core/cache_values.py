"""The two values that describe a KV cache before anything is stored: its shape and its precision.

:class:`CacheShape` is what the model family and the run say about the tensors (layers, query and K/V heads,
head_dim, the latent layout, CFG branches, batch, the model's element size, sequence-parallel ranks);
:class:`CachePrecision` is how they are stored (the key and value :class:`~jensen_core.spec.QuantSpec`, QVG's knobs
inside them, and the age tiers). The planner (:func:`~jensen_core.planner.plan_cache`,
:func:`~jensen_core.planner.block_in_flight_bytes`), :class:`~jensen_core.cache.ChunkCache` and the runtime's report
and saved runs take these two instead of a dozen loose arguments. Both are frozen and check themselves.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .geometry import LatentGeometry
from .head_bits import HeadBits
from .spec import QuantSpec
from .tiers import AgeTiers


def _is(value, cls: type, *members: str) -> bool:
    """``value`` is a ``cls``, or the same class of another import of this package (ComfyUI imports the pack as
    ``comfyui_jensen_kv.jensen_core``, tests and tools as ``jensen_core``): same name, the same members."""
    return isinstance(value, cls) or (type(value).__name__ == cls.__name__ and all(hasattr(value, m) for m in members))


def check_head_bits(spec_k: QuantSpec | None, tiers: AgeTiers | None, head_bits: HeadBits) -> None:
    """ValueError naming the fix when precision by head cannot go with these keys and age tiers."""
    head_bits.check_spec(spec_k)
    if tiers is not None:
        raise ValueError(
            "head_bits (precision by head) and the age tiers (recent_chunks_bits / sink_bits) cannot be combined yet; "
            "set one of them off"
        )


def _whole(name: str, value, lo: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise ValueError(f"{name}={value!r} must be a whole number >= {lo}")


@dataclass(frozen=True)
class CacheShape:
    """What is cached, per (layer, CFG branch): ``layers`` self-attention layers of ``heads`` query heads and
    ``kv_heads`` K/V heads (None: as many as ``heads``; grouped-query attention: fewer, dividing ``heads``) of
    ``head_dim`` channels; ``geometry`` turns a latent frame into tokens (the planner needs it; the bytes of one block
    in flight do not). The run adds ``cfg_branches`` (1 at cfg 1,
    else 2), ``batch``, ``full_bytes`` (the element size of a side kept unquantized: the model's dtype) and
    ``ranks`` (sequence-parallel ranks sharing every layer's heads; each holds ``heads / ranks``)."""

    layers: int
    heads: int
    head_dim: int
    geometry: LatentGeometry | None = None
    kv_heads: int | None = None
    cfg_branches: int = 1
    batch: int = 1
    full_bytes: int = 2
    ranks: int = 1

    def __post_init__(self) -> None:
        for name in ("layers", "heads", "head_dim", "cfg_branches", "batch", "full_bytes", "ranks"):
            _whole(name, getattr(self, name))
        if self.geometry is not None and not _is(self.geometry, LatentGeometry, "tokens_per_frame", "latent_channels"):
            raise TypeError(
                f"geometry must be a LatentGeometry (the model family's), got {type(self.geometry).__name__}"
            )
        kv = self.kv_heads
        if kv is not None and (isinstance(kv, bool) or not isinstance(kv, int) or kv < 1 or self.heads % kv):
            raise ValueError(
                f"kv_heads={kv!r} must be a whole number >= 1 that divides heads={self.heads} (grouped-query attention: "
                "each K/V head serves heads / kv_heads query heads); leave it unset when there are as many K/V heads"
            )

    @property
    def cached_heads(self) -> int:
        """The heads the cache stores (the K/V heads)."""
        return self.kv_heads or self.heads

    def tokens_per_frame(self, latent_height: int, latent_width: int) -> int:
        if self.geometry is None:
            raise TypeError("this CacheShape has no geometry (the model family's latent layout): give geometry=")
        return self.geometry.tokens_per_frame(latent_height, latent_width)

    def for_run(self, *, cfg_branches: int, batch: int, full_bytes: int) -> CacheShape:
        """This shape with a run's CFG branches, batch and unquantized element size."""
        return replace(self, cfg_branches=cfg_branches, batch=batch, full_bytes=full_bytes)


@dataclass(frozen=True)
class CachePrecision:
    """How cached keys and values are stored: ``spec_k`` / ``spec_v`` (None keeps that side in the model's dtype;
    QVG's stages, centroids and iterations are the specs' ``qvg_*`` fields), ``tiers`` (precision by age, None for
    every chunk at the specs' bits) and ``head_bits`` (precision by head, :class:`~jensen_core.head_bits.HeadBits`:
    the keys of the heads with the largest predicted bias at more bits; None for every head at the keys' spec)."""

    spec_k: QuantSpec | None = None
    spec_v: QuantSpec | None = None
    tiers: AgeTiers | None = None
    head_bits: HeadBits | None = None

    def __post_init__(self) -> None:
        for name in ("spec_k", "spec_v"):
            s = getattr(self, name)
            if s is not None and not _is(s, QuantSpec, "bits", "group_size", "check_head_dim"):
                raise TypeError(f"{name} must be a QuantSpec or None, got {type(s).__name__}")
        if self.tiers is not None and not _is(self.tiers, AgeTiers, "specs_for", "recent_bits"):
            raise TypeError(f"tiers must be an AgeTiers or None, got {type(self.tiers).__name__}")
        if self.head_bits is not None:
            if not _is(self.head_bits, HeadBits, "count", "spec_for"):
                raise TypeError(f"head_bits must be a HeadBits or None, got {type(self.head_bits).__name__}")
            check_head_bits(self.spec_k, self.tiers, self.head_bits)

    @property
    def quantized(self) -> bool:
        return self.spec_k is not None or self.spec_v is not None

    @property
    def spec(self) -> QuantSpec | None:
        """The spec that names the scheme (group size, rotation, method): the keys', else the values'."""
        return self.spec_k or self.spec_v

    def sides(self) -> tuple[tuple[str, QuantSpec | None], tuple[str, QuantSpec | None]]:
        return (("k", self.spec_k), ("v", self.spec_v))
