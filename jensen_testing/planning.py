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
PRECISION_FIELDS = ("spec_k", "spec_v", "tiers")


def values(**fields) -> dict:
    """``fields`` with the shape's and the precision's fields taken out into ``shape=`` and ``precision=``."""
    shape = {k: fields.pop(k) for k in SHAPE_FIELDS if k in fields}
    precision = {k: fields.pop(k) for k in PRECISION_FIELDS if k in fields}
    return {**fields, "shape": CacheShape(**shape), "precision": CachePrecision(**precision)}


def plan_by_fields(**fields) -> CachePlan:
    """:func:`plan_cache` of the chunking and the shape's and precision's fields, all given by name."""
    return plan_cache(**values(**fields))
