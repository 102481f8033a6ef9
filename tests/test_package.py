"""The pack's root imports without ComfyUI, and the registry metadata is complete."""

import importlib.util
import re
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


# ----------------------------------------------------------------------------- installable the usual ways
def _requirement_names(reqs) -> dict[str, str]:
    """{normalised name: whole requirement without spaces} of PEP 508 lines (comments and blanks dropped)."""
    out = {}
    for line in reqs:
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", line).group(0)
        out[re.sub(r"[-_.]+", "-", name).lower()] = line.replace(" ", "")
    return out


def test_requirements_txt_matches_pyproject_dependencies():
    """ComfyUI-Manager installs requirements.txt, pip and the registry read pyproject: the same runtime deps."""
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    from_pyproject = _requirement_names(meta["project"]["dependencies"])
    from_txt = _requirement_names((ROOT / "requirements.txt").read_text().splitlines())
    assert from_txt == from_pyproject


def test_the_requirement_parser_sees_a_difference():
    assert _requirement_names(["torch>=2.4", "einops"]) != _requirement_names(["torch>=2.4", "einops>=0.7"])
    assert _requirement_names(["# c", "", "Safe_Tensors >= 0.4  # x"]) == {"safe-tensors": "Safe_Tensors>=0.4"}


# what `comfy node validate` (comfy-cli 1.23) and the registry's specification check
REGISTRY_NAME = re.compile(r"^[a-z][a-z0-9]*([-_.][a-z0-9]+)*$")  # we also keep it lowercase
SEMVER = re.compile(r"^\d+\.\d+\.\d+$")
COMFY_VERSION_PART = re.compile(r"^(?:(==|>=|<=|!=|~=|>|<|<>|=)\s*)?(\d+\.\d+\.\d+(?:-[a-zA-Z0-9]+)?)?$")
OS_PREFIXES = ("Microsoft", "POSIX", "MacOS", "OS Independent")
ACCELERATORS = {
    "GPU :: NVIDIA CUDA",
    "GPU :: AMD ROCm",
    "GPU :: Intel Arc",
    "NPU :: Huawei Ascend",
    "GPU :: Apple Metal",
}


def test_pyproject_fields_the_registry_requires():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    project, comfy = meta["project"], meta["tool"]["comfy"]
    name = project["name"]
    assert REGISTRY_NAME.match(name) and len(name) < 100, name
    assert SEMVER.match(project["version"]), project["version"]
    lic = project["license"]
    assert isinstance(lic, dict) and (lic.get("text") or (ROOT / lic.get("file", "-")).is_file()), lic
    assert project["urls"]["Repository"].startswith("https://")
    assert project["description"]
    for c in project.get("classifiers", []):
        if c.startswith("Operating System :: "):
            assert c.removeprefix("Operating System :: ").startswith(OS_PREFIXES), c
        if c.startswith("Environment ::"):
            assert c.removeprefix("Environment :: ") in ACCELERATORS, c
    assert re.match(r"^[a-z0-9][a-z0-9-]*$", comfy["PublisherId"]), comfy["PublisherId"]
    assert comfy["DisplayName"].strip()
    parts = [p.strip() for p in comfy["requires-comfyui"].split(",")]
    assert all(COMFY_VERSION_PART.match(p) for p in parts), comfy["requires-comfyui"]
    icon = comfy["Icon"]
    assert icon.startswith("https://") and icon.lower().endswith((".svg", ".png", ".jpg", ".jpeg", ".gif")), icon
    # the icon URL points at a file of this repository (main branch), at most 800 x 400
    rel = icon.split("/main/", 1)[1]
    svg = (ROOT / rel).read_text()
    w, h = (float(re.search(rf'\b{a}="([\d.]+)"', svg).group(1)) for a in ("width", "height"))
    assert w <= 800 and h <= 400


def test_the_registry_checks_reject_what_comfy_cli_warns_about():
    assert not REGISTRY_NAME.match("ComfyUI-Jensen") and not REGISTRY_NAME.match("1-tool")
    assert not REGISTRY_NAME.match("a--b") and REGISTRY_NAME.match("comfyui-jensen-kv")
    assert not COMFY_VERSION_PART.match(">=0.3") and COMFY_VERSION_PART.match(">=0.3.64")
    assert not SEMVER.match("0.1")


_PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9]*(_[A-Z0-9]+)+$")


def _placeholders(text: str) -> list[str]:
    return [line for line in text.splitlines() if _PLACEHOLDER.match(line.strip())]


def test_no_placeholder_is_left_in_the_docs():
    """A results table written as ``SOME_TABLE`` until a benchmark fills it must not ship unfilled."""
    assert _placeholders("text\nQVG_TABLE\n| a | b |\n") == ["QVG_TABLE"]  # the check itself sees one
    docs = [ROOT / "README.md", ROOT / "models" / "tiny_ar" / "MODEL_CARD.md", *sorted((ROOT / "docs").rglob("*.md"))]
    assert len(docs) > 2  # the results tables moved from the README to docs/
    for doc in docs:
        assert _placeholders(doc.read_text()) == [], doc
