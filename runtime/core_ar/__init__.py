"""The pack on ComfyUI's own AR video path (v0.27+: SamplerARVideo -> ``sample_ar_video`` over ``CausalWanModel``).

``session.py``: core's ``end`` protocol over the pack's caches (no ComfyUI import);
``patches.py``: what the nodes attach to a MODEL so core's sampler reads the pack's cache, and the
refusals when a sampler would ignore the pack's settings.
"""

from .patches import (
    CacheWindow,
    UnusedSettingsError,
    attach,
    carries_settings,
    get_window,
    last_report,
    set_window,
)
from .session import CoreARProtocolError, CoreARSession, CoreLayerCache

__all__ = [
    "CacheWindow",
    "CoreARProtocolError",
    "CoreARSession",
    "CoreLayerCache",
    "UnusedSettingsError",
    "attach",
    "carries_settings",
    "get_window",
    "last_report",
    "set_window",
]
