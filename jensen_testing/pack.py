"""Import one module of the pack the way ComfyUI does (as a package), without ComfyUI.

Modules under ``nodes/`` use relative imports (``from ..jensen_core import ...``), so they only
import as part of the pack's package. ComfyUI imports the pack folder as a package; here the pack
root is registered under :data:`PACK_PACKAGE` and ``nodes`` as a bare namespace (its
``__init__.py``, which needs ComfyUI, is not run), so a ComfyUI-free module such as
``routes/ui.py`` can be unit-tested.
"""

from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys
import types

from .comfyui import PACK_ROOT

PACK_PACKAGE = "jensen_kv_pack_under_test"


def _package(name: str, path) -> types.ModuleType:
    mod = sys.modules.get(name)
    if mod is None:
        mod = types.ModuleType(name)
        mod.__path__ = [str(path)]
        mod.__package__ = name
        sys.modules[name] = mod
    return mod


#: the packages whose ``__init__.py`` is never run here (it needs ComfyUI): a bare stand-in takes their place
BARE_PACKAGES = ("nodes",)


def load_pack_module(dotted: str) -> types.ModuleType:
    """``load_pack_module("routes.ui")`` -> that module, imported inside a stand-in pack package. The packages on the
    way are the pack's own (their ``__init__.py`` runs: ``runtime.families`` answers the registry's names), but
    ``nodes`` (:data:`BARE_PACKAGES`), a bare stand-in."""
    _package(PACK_PACKAGE, PACK_ROOT)
    parts = dotted.split(".")
    for i in range(1, len(parts)):
        sub = ".".join(parts[:i])
        if parts[0] in BARE_PACKAGES:
            _package(f"{PACK_PACKAGE}.{sub}", PACK_ROOT.joinpath(*parts[:i]))
        else:
            importlib.import_module(f"{PACK_PACKAGE}.{sub}")
    return importlib.import_module(f"{PACK_PACKAGE}.{dotted}")


def load_script(path: str) -> types.ModuleType:
    """``load_script("benchmarks/sweep.py")`` -> that script of the pack as a module (benchmarks/ and tools/ are no
    packages), loaded once; registered in ``sys.modules`` first, as dataclasses look their module up."""
    mod_name = "jensen_kv_script_" + path.removesuffix(".py").replace("/", "_")
    if mod_name in sys.modules:
        return sys.modules[mod_name]
    spec = importlib.util.spec_from_file_location(mod_name, PACK_ROOT / path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[mod_name]
        raise
    return module


def load_tool(name: str) -> types.ModuleType:
    """``load_tool("convert_checkpoint")`` -> ``tools/convert_checkpoint.py`` as a module (tools/ is no package)."""
    return load_script(f"tools/{name}.py")


def run_script(path: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run the pack's script ``path`` (e.g. ``benchmarks/sweep.py``) with ``args`` in a fresh interpreter from the
    pack's root, as its docstring's command does; AssertionError with its output's tail when it fails."""
    proc = subprocess.run(
        [sys.executable, str(PACK_ROOT / path), *args], cwd=PACK_ROOT, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return proc
