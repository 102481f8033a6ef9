"""The planner with a cache's shape and precision stated field by field, as many tests and benchmarks state them.

:func:`jensen_core.planner.plan_cache` takes one signature: the run's chunking and a
:class:`~jensen_core.cache_values.CacheShape` and :class:`~jensen_core.cache_values.CachePrecision`. :func:`plan` puts
the fields given one by one (``layers=..., heads=..., spec_k=...``) into those two values and calls it, so a test's
table of settings stays one flat dict.
"""

from __future__ import annotations

from jensen_core.cache_values import CachePrecision, CacheShape
from jensen_core.planner import CachePlan, plan_cache

#: the fields of :class:`CacheShape` and of :class:`CachePrecision`
SHAPE_FIELDS = ("layers", "heads", "head_dim", "geometry", "kv_heads", "cfg_branches", "batch", "full_bytes", "ranks")
PRECISION_FIELDS = ("spec_k", "spec_v", "tiers", "head_bits")


def values(**fields) -> dict:
    """``fields`` with the shape's and the precision's fields taken out into ``shape=`` and ``precision=``;
    ``latent=(frames, height, width)`` stands for ``latent_frames``, ``latent_height`` and ``latent_width`` (each
    given by name wins)."""
    for name, v in zip(("latent_frames", "latent_height", "latent_width"), fields.pop("latent", ())):
        fields.setdefault(name, v)
    shape = {k: fields.pop(k) for k in SHAPE_FIELDS if k in fields}
    precision = {k: fields.pop(k) for k in PRECISION_FIELDS if k in fields}
    return {**fields, "shape": CacheShape(**shape), "precision": CachePrecision(**precision)}


def plan_by_fields(**fields) -> CachePlan:
    """:func:`plan_cache` of the chunking and the shape's and precision's fields, all given by name."""
    return plan_cache(**values(**fields))


def plan_video(
    latent: tuple[int, int, int],
    chunk_frames: int,
    window_chunks: int,
    shape: CacheShape,
    spec=None,
    **options,
) -> CachePlan:
    """:func:`plan_cache` of a latent video of ``latent`` (frames, height, width) in chunks of ``chunk_frames``,
    keeping ``window_chunks``, for caches of ``shape``; ``spec`` stores keys and values alike (None: the model's
    dtype) unless ``options`` give a ``precision``; the rest of ``options`` as :func:`plan_cache` takes them
    (``sink_chunks``, ``write_last``, ``prefix_frames``)."""
    frames, height, width = latent
    options.setdefault("precision", CachePrecision(spec, spec))
    return plan_cache(
        latent_frames=frames, latent_height=height, latent_width=width, chunk_frames=chunk_frames,
        window_chunks=window_chunks, shape=shape, **options,
    )  # fmt: skip
