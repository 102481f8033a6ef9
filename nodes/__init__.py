"""ComfyUI nodes of comfyui-jensen-kv (V3 schema), one file per node (a model family's nodes in one file,
``<family key>.py``), registered by the root ``comfy_entrypoint``.

Imported only inside ComfyUI: every module here may import ``comfy`` and ``comfy_api``. Node modules
hold schemas and hand the work to ``runtime/`` (which never imports them back). Pack code uses
relative imports (ComfyUI has its own top-level ``nodes`` module).
"""

from __future__ import annotations

if "." not in __name__:
    # the pack root stood ahead of ComfyUI's folder on sys.path, so ``import nodes`` found this package
    # instead of ComfyUI's nodes.py: refuse loudly rather than hand ComfyUI (or a test) the wrong module
    raise ImportError(
        f"the pack's nodes/ package ({__file__}) was imported as the top-level module {__name__!r}, shadowing "
        "ComfyUI's own nodes.py. Put ComfyUI's folder ahead of the pack root on sys.path (or drop the pack root "
        "from it) and import the pack as a package, as ComfyUI does (tests/support/comfyui.py: import_pack)."
    )

import importlib
import importlib.util
import logging

from comfy_api.latest import ComfyExtension, io

from .ar_cache_window import JensenKVARCacheWindow
from .ar_schedule import JensenKVARSchedule
from .bias_correction import JensenKVBiasCorrection
from .chunked_ar_ksampler import JensenKVChunkedARKSampler
from .chunked_ar_sampler import JensenKVChunkedARSampler
from .compare_panels import JensenKVComparePanels
from .kv_cache_diagnostics import JensenKVDiagnostics
from .kv_cache_diagnostics_plot import JensenKVDiagnosticsPlot
from .kv_cache_report import JensenKVCacheReport
from .load_kv_cache import JensenKVLoadKVCache
from .prompt_schedule import JensenKVPromptSchedule
from .quantize_kv_cache import JensenKVQuantizeKVCache
from .ray_actors_kv import JensenKVRayActors
from .save_kv_cache import JensenKVSaveKVCache
from .tiny_ar_decode import JensenKVTinyARDecode
from .tiny_ar_prompt import JensenKVTinyARPrompt

logger = logging.getLogger("jensen_kv")

NODES: list[type[io.ComfyNode]] = [
    JensenKVQuantizeKVCache,
    JensenKVBiasCorrection,
    JensenKVChunkedARSampler,
    JensenKVChunkedARKSampler,
]
#: long videos and faithful schedules
AR_NODES: list[type[io.ComfyNode]] = [
    JensenKVARSchedule,
    JensenKVPromptSchedule,
    JensenKVSaveKVCache,
    JensenKVLoadKVCache,
]
#: the bundled tiny AR model: its prompts and its latent -> RGB map; labelled panels of an A/B with their PSNR
DEMO_NODES: list[type[io.ComfyNode]] = [JensenKVTinyARPrompt, JensenKVTinyARDecode, JensenKVComparePanels]
#: attention diagnostics: KV Cache Diagnostics on the MODEL path, its plot on the sampler's report
DIAGNOSTICS_NODES: list[type[io.ComfyNode]] = [JensenKVDiagnostics, JensenKVDiagnosticsPlot]
#: ComfyUI's own AR sampler (v0.27+): the cache window there and the run's report
CORE_AR_NODES: list[type[io.ComfyNode]] = [JensenKVARCacheWindow, JensenKVCacheReport]
#: the pack's settings inside Raylight's Ray actors (sequence parallelism over GPUs)
RAY_NODES: list[type[io.ComfyNode]] = [JensenKVRayActors]


def family_node_files() -> dict[str, list[type[io.ComfyNode]]]:
    """Every registered model family's nodes: its node file ``nodes/<key>.py`` (its ``NODES``), found by the
    family's key, so adding a family adds no line here."""
    from ..runtime.families import FAMILIES

    found = {}
    for family in FAMILIES:
        if importlib.util.find_spec(f"{__name__}.{family.key}") is not None:
            found[family.key] = list(importlib.import_module(f".{family.key}", __name__).NODES)
    return found


#: each family's nodes by family key (MAGI-1: its model, VAE, text and sampler; HY-WorldPlay, v0.27+: its loader,
#: camera path, the path's picture and sampler)
FAMILY_NODES: dict[str, list[type[io.ComfyNode]]] = family_node_files()


def register_routes() -> bool:
    """Attach the pack's HTTP routes (routes/ui.py: the web planner's numbers) to the running server; idempotent."""
    try:
        from ..routes import ui as routes_ui

        return routes_ui.register()
    except Exception:  # noqa: BLE001 - the planner is a nicety; the nodes must load without it
        logger.warning(
            "jensen_kv: the HTTP routes (routes/ui.py) did not load; the web planner is unavailable", exc_info=True
        )
        return False


class JensenKVExtension(ComfyExtension):
    async def on_load(self) -> None:
        register_routes()

    async def get_node_list(self) -> list[type[io.ComfyNode]]:
        register_bundled_models()
        register_routes()  # ComfyUI v0.3.64 never calls on_load; registering twice is a no-op
        return [
            *NODES,
            *AR_NODES,
            *DIAGNOSTICS_NODES,
            *CORE_AR_NODES,
            *RAY_NODES,
            *(node for nodes in FAMILY_NODES.values() for node in nodes),
            *DEMO_NODES,
        ]


def register_bundled_models() -> bool:
    """Make ComfyUI's diffusion_models list the pack's bundled tiny AR model (models/tiny_ar); idempotent."""
    import os

    try:
        import folder_paths
    except ImportError:
        return False
    folder = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "models", "tiny_ar")
    if os.path.isdir(folder):
        folder_paths.add_model_folder_path("diffusion_models", folder)
        return True
    return False


__all__ = [
    "AR_NODES",
    "DEMO_NODES",
    "DIAGNOSTICS_NODES",
    "FAMILY_NODES",
    "NODES",
    "RAY_NODES",
    "JensenKVExtension",
    "register_bundled_models",
]
