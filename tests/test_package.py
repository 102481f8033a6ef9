"""The pack's root imports without ComfyUI, and the registry metadata is complete."""
import importlib.util
import subprocess
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]


def test_root_package_imports_without_comfyui():
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('comfyui_jensen_kv', {str(ROOT / '__init__.py')!r}, "
        f"submodule_search_locations=[{str(ROOT)!r}])\n"
        "m = importlib.util.module_from_spec(spec); sys.modules['comfyui_jensen_kv'] = m; spec.loader.exec_module(m)\n"
        "assert m.WEB_DIRECTORY == './web' and callable(m.comfy_entrypoint)\n"
        "assert not any(k == 'comfy' or k.startswith('comfy.') for k in sys.modules), 'imported ComfyUI'\n"
        "import jensen_core\n"
        "assert not any(k == 'comfy' or k.startswith('comfy.') for k in sys.modules)\n"
        "print('ok')\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_jensen_core_never_imports_comfyui():
    for path in (ROOT / "jensen_core").glob("*.py"):
        text = path.read_text()
        for banned in ("import comfy", "from comfy", "import nodes", "from nodes", "import server", "from server"):
            assert banned not in text, f"{path.name} contains {banned!r}"


def test_pyproject_is_registry_ready():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    project, comfy = meta["project"], meta["tool"]["comfy"]
    assert project["name"] == "comfyui-jensen-kv"
    deps = " ".join(project["dependencies"])
    for dep in ("torch", "einops", "safetensors"):
        assert dep in deps
    assert "test" in project["optional-dependencies"]
    for key in ("PublisherId", "DisplayName", "Icon", "requires-comfyui"):
        assert comfy.get(key), key
    assert (ROOT / "web" / "icon.svg").is_file()
    assert importlib.util.find_spec("jensen_core") is not None
