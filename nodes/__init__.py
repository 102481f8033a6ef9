"""ComfyUI nodes of comfyui-jensen-kv (V3 schema), one file per node, registered by the root ``comfy_entrypoint``.

Imported only inside ComfyUI: every module here may import ``comfy`` and ``comfy_api``. Node modules
hold schemas and hand the work to ``runtime/`` (which never imports them back). Pack code uses
relative imports (ComfyUI has its own top-level ``nodes`` module).
"""
from __future__ import annotations

import logging

from comfy_api.latest import ComfyExtension, io

from .ar_schedule import JensenKVARSchedule
from .bias_correction import JensenKVBiasCorrection
from .chunked_ar_sampler import JensenKVChunkedARSampler
from .chunked_ar_sampler_simple import JensenKVChunkedARSamplerSimple
from .diagnostics import JensenKVDiagnostics
from .diagnostics_plot import JensenKVDiagnosticsPlot
from .load_kv_cache import JensenKVLoadKVCache
from .prompt_schedule import JensenKVPromptSchedule
from .quantize_kv_cache import JensenKVQuantizeKVCache
from .save_kv_cache import JensenKVSaveKVCache

logger = logging.getLogger("jensen_kv")

try:
    from ..web import routes  # noqa: F401 - registers the pack's HTTP routes (cache planner) on import
except ImportError:
    logger.warning("jensen_kv: the HTTP routes (web/routes.py) did not load; the web planner is unavailable",
                   exc_info=True)

NODES: list[type[io.ComfyNode]] = [
    JensenKVQuantizeKVCache,
    JensenKVBiasCorrection,
    JensenKVChunkedARSampler,
    JensenKVChunkedARSamplerSimple,
]
#: long videos and faithful schedules (issues 8 and 10)
AR_NODES: list[type[io.ComfyNode]] = [JensenKVARSchedule, JensenKVPromptSchedule, JensenKVSaveKVCache,
                                      JensenKVLoadKVCache]
#: attention diagnostics (issue 5): KV Cache Diagnostics on the MODEL path, its plot on the sampler's report
DIAGNOSTICS_NODES: list[type[io.ComfyNode]] = [JensenKVDiagnostics, JensenKVDiagnosticsPlot]


class JensenKVExtension(ComfyExtension):
    async def get_node_list(self) -> list[type[io.ComfyNode]]:
        return [*NODES, *AR_NODES, *DIAGNOSTICS_NODES]


__all__ = ["AR_NODES", "DIAGNOSTICS_NODES", "NODES", "JensenKVExtension"]
