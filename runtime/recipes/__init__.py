"""The reference recipes of the pack's chunk loop, one class per file (:class:`base.Recipe`: a check of the request
and the hooks prefill / before_chunk / write / on_prompt_switch), and :func:`recipe_for`, which picks a run's.

| recipe | file | what the reference does around the loop |
|---|---|---|
| ``plain`` | plain.py | Self-Forcing / CausVid: each finished chunk written once, relabelled at the context noise |
| ``longlive`` | longlive.py | LongLive: a prompt switch keeps the old prompt's sink, recomputes the rest in one forward |
| ``krea`` | krea.py | Krea Realtime: the cache rebuilt from the last frames before every chunk; attention bias |
| ``skyreels`` | skyreels.py | SkyReels-V2 DF: the cache written noised, redrawn every denoising step |
| ``causal_forcing`` | causal_forcing.py | Causal Forcing++: the video's first frame on its own schedule |

Every pack-loop recipe re-caches on a prompt switch as ``recache_mode`` says: LongLive's (:class:`LongLiveRecache`,
the default) or the pack's own causal one (:class:`CausalRecache`). No ComfyUI import here.
"""

from __future__ import annotations

from .base import ChunkStep, Recipe
from .causal_forcing import CausalForcing, lost_first_schedule
from .krea import Krea
from .longlive import LongLive, LongLiveRecache
from .plain import CausalRecache, SelfForcing
from .skyreels import SKYREELS_WRAPPER_KEY, SkyReels

RECACHES = {"longlive": LongLiveRecache, "causal": CausalRecache}


def recipe_type(request) -> type[SelfForcing]:
    """The recipe class of ``request``: Krea's recompute, SkyReels' context noise, Causal Forcing's first chunk,
    LongLive's re-cache (a prompt schedule re-cached as LongLive does), else the plain recipe."""
    o = request.recipe
    if o.recompute_frames:
        return Krea
    if o.context_noise_mode == "skyreels":
        return SkyReels
    if request.sampling.first_chunk_sigmas is not None or lost_first_schedule(request) is not None:
        return CausalForcing
    positive = request.positive
    if o.recache_mode == "longlive" and o.recache_on_switch and isinstance(positive, list) and len(positive) > 1:
        return LongLive
    return SelfForcing


def recipe_for(request) -> SelfForcing:
    """A fresh recipe for one run of ``request`` (checked: :meth:`Recipe.check` raised already when it clashes)."""
    cls = recipe_type(request)
    recache = RECACHES[request.recipe.recache_mode]()
    if cls is CausalForcing:
        return cls(request.recipe, recache, request)
    return cls(request.recipe, recache)


__all__ = [
    "RECACHES",
    "SKYREELS_WRAPPER_KEY",
    "CausalForcing",
    "CausalRecache",
    "ChunkStep",
    "Krea",
    "LongLive",
    "LongLiveRecache",
    "Recipe",
    "SelfForcing",
    "SkyReels",
    "recipe_for",
    "recipe_type",
]
