"""ComfyUI nodes of comfyui-jensen-kv (V3 schema), one file per node, registered by the root ``comfy_entrypoint``.

Imported only inside ComfyUI: every module here may import ``comfy`` and ``comfy_api``. Node modules
hold schemas and hand the work to ``runtime/`` (which never imports them back). Pack code uses
relative imports (ComfyUI has its own top-level ``nodes`` module).
"""
from __future__ import annotations

import logging

from comfy_api.latest import ComfyExtension, io

from .bias_correction import JensenKVBiasCorrection
from .chunked_ar_sampler import JensenKVChunkedARSampler
from .chunked_ar_sampler_simple import JensenKVChunkedARSamplerSimple
from .diagnostics import JensenKVDiagnostics
from .diagnostics_plot import JensenKVDiagnosticsPlot
from .quantize_kv_cache import JensenKVQuantizeKVCache

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
#: attention diagnostics (issue 5): KV Cache Diagnostics on the MODEL path, its plot on the sampler's report
DIAGNOSTICS_NODES: list[type[io.ComfyNode]] = [JensenKVDiagnostics, JensenKVDiagnosticsPlot]


class JensenKVExtension(ComfyExtension):
    async def get_node_list(self) -> list[type[io.ComfyNode]]:
        return [*NODES, *DIAGNOSTICS_NODES]


__all__ = ["DIAGNOSTICS_NODES", "NODES", "JensenKVExtension"]
