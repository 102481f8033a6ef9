"""The house rules: which room may import which (docs/design.md, "The rooms, and which way imports go").

    jensen_core/      pure torch             -> imports no ComfyUI module and nothing else of the pack
    runtime/          runs during sampling   -> may import jensen_core and ComfyUI, never nodes/ or routes/, and
                                                (outside runtime/families/<key>/) never a model family's package
    runtime/families/<key>/         one model family -> imports no other family
    runtime/families/<key>/model/   its pure torch   -> imports no ComfyUI module and nothing of the pack outside
                                                itself (it imports both on its own and inside the pack)
    runtime/core_ar/  core's AR sampler path -> may import runtime/ and jensen_core; nothing else in runtime/
                                                imports it
    routes/           HTTP routes            -> may import jensen_core and runtime/, never nodes/
    web/              static files only      -> no Python at all (ComfyUI serves the folder whole)
    nodes/            one file per node      -> may import everything above but a family's package, which only
                                                its own node file (nodes/<key>.py, all its nodes) imports

Checked statically (every import statement of every file, including those inside functions) and,
for jensen_core, dynamically in a fresh interpreter. No circle of imports of any length among the pack's modules
(a pair, or a -> b -> c -> a).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COMFY_MODULES = {
    "comfy",
    "comfy_api",
    "comfy_extras",
    "comfy_execution",
    "nodes",
    "server",
    "folder_paths",
    "latent_preview",
    "node_helpers",
    "execution",
    "comfyui_version",
}


def _imports(path: Path) -> list[tuple[int, str, int]]:
    """(line, module, level) of every import in ``path``; level > 0 for relative imports."""
    tree = ast.parse(path.read_text(), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name, 0) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level and not mod:  # from . import x / from .. import x
                out += [(node.lineno, a.name, node.level) for a in node.names]
            else:
                out.append((node.lineno, mod, node.level))
    return out


def _resolve(path: Path, module: str, level: int) -> str:
    """A relative import as a pack-root dotted path (``runtime.config``); absolute imports unchanged."""
    if level == 0:
        return module
    pkg = path.parent.relative_to(ROOT).parts
    base = pkg[: len(pkg) - (level - 1)] if level > 1 else pkg
    return ".".join([*base, module] if module else base)


def _py_files(room: str) -> list[Path]:
    return sorted((ROOT / room).rglob("*.py"))


def violations(room: str, forbidden_pack_rooms: set[str], allow_comfy: bool) -> list[str]:
    found = []
    for path in _py_files(room):
        for line, module, level in _imports(path):
            top = module.split(".")[0]
            where = f"{path.relative_to(ROOT)}:{line}"
            if level == 0 and not allow_comfy and top in COMFY_MODULES:
                found.append(f"{where} imports ComfyUI module {module!r}")
            if level > 0:
                target = _resolve(path, module, level)
                if target.split(".")[0] in forbidden_pack_rooms:
                    found.append(f"{where} imports {target!r} (room {target.split('.')[0]}/)")
    return found


def test_jensen_core_imports_no_comfyui_and_no_other_room():
    assert violations("jensen_core", {"nodes", "runtime", "web", "tools"}, allow_comfy=False) == []


FAMILIES_DIR = ("runtime", "families")


def family_keys(root: Path | None = None) -> list[str]:
    """The family packages under runtime/families/ (each a folder with an ``__init__.py``)."""
    folder = (root or ROOT).joinpath(*FAMILIES_DIR)
    return sorted(p.name for p in folder.iterdir() if p.is_dir() and (p / "__init__.py").is_file())


def model_violations(key: str) -> list[str]:
    """Where family ``key``'s pure-torch ``model/`` imports ComfyUI, a pack room absolutely, or anything relative
    above ``model/`` itself (it imports on its own as ``runtime.families.<key>.model`` and inside the pack)."""
    found = []
    model = ROOT.joinpath(*FAMILIES_DIR, key, "model")
    for path in sorted(model.rglob("*.py")):
        depth = len(path.relative_to(model).parts) - 1  # 0 for model/x.py
        for line, module, level in _imports(path):
            where = f"{path.relative_to(ROOT)}:{line}"
            top = module.split(".")[0]
            if level == 0 and top in COMFY_MODULES:
                found.append(f"{where} imports ComfyUI module {module!r}")
            elif level == 0 and top in (*PACK_ROOMS, "jensen_testing", "tools", "tests"):
                found.append(f"{where} imports the pack's {module!r}")
            elif level > depth + 1:
                found.append(f"{where} imports {'.' * level}{module} (outside model/)")
    return found


def test_every_familys_model_imports_no_comfyui_and_nothing_outside_itself():
    keys = [k for k in family_keys() if ROOT.joinpath(*FAMILIES_DIR, k, "model").is_dir()]
    assert {"magi1", "worldplay"} <= set(keys)
    assert {k: model_violations(k) for k in keys} == {k: [] for k in keys}


def test_the_model_check_sees_comfyui_a_room_and_a_way_out(tmp_path, monkeypatch):
    """Positive control: a ComfyUI import, an absolute import of a pack room, a relative import above model/."""
    model = tmp_path.joinpath(*FAMILIES_DIR, "fam", "model")
    model.mkdir(parents=True)
    (model / "ok.py").write_text("from .other import x\nimport torch\n")
    (model / "bad.py").write_text("import comfy.ops\nfrom jensen_core import quant\nfrom ..family import F\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert [v.split(" ", 1)[1] for v in model_violations("fam")] == [
        "imports ComfyUI module 'comfy.ops'",
        "imports the pack's 'jensen_core'",
        "imports ..family (outside model/)",
    ]


def test_runtime_never_imports_a_node_module():
    assert violations("runtime", {"nodes"}, allow_comfy=True) == []


def test_routes_never_import_a_node_module():
    assert violations("routes", {"nodes"}, allow_comfy=True) == []


def test_runtime_never_imports_routes():
    assert violations("runtime", {"routes"}, allow_comfy=True) == []


def test_web_holds_static_files_only():
    """ComfyUI serves WEB_DIRECTORY whole: a .py there (server code, a secret) could be downloaded."""
    served = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "web").rglob("*") if p.is_file())
    assert served and not [p for p in served if p.endswith((".py", ".pyc"))], served
    # .md: the node help pages the front end reads (web/docs/<node id>.md)
    assert all(p.endswith((".js", ".css", ".svg", ".png", ".json", ".md")) for p in served), served
    assert all(p.startswith("web/docs/") for p in served if p.endswith(".md")), served


def test_only_core_ar_imports_core_ar():
    """runtime/core_ar/ serves core's sampler beside the pack's own loop: the rest of runtime/ never reaches into it."""
    found = []
    for path in _py_files("runtime"):
        if "core_ar" in path.relative_to(ROOT).parts:
            continue
        for line, module, level in _imports(path):
            if level and "core_ar" in _resolve(path, module, level).split("."):
                found.append(f"{path.relative_to(ROOT)}:{line}")
    assert found == []


FAMILY_PACKAGE = FAMILIES_DIR
#: the model families: the packages of runtime/families/
FAMILY_MODULES = family_keys()


def family_module_imports(path: Path, keys: list[str] | None = None) -> list[str]:
    """Where ``path`` imports a family's package or a module in it (``runtime.families.wan``,
    ``from ..families import wan``, ``from ..runtime.families.magi1.recipe import run``)."""
    keys = FAMILY_MODULES if keys is None else keys
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.ImportFrom):
            base = _resolve(path, node.module or "", node.level) if node.level else (node.module or "")
            targets.append(base)
            targets += [f"{base}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            targets += [a.name for a in node.names]
        for t in targets:
            parts = t.split(".")
            # a pack-relative target (runtime.families.wan) or an absolute one (comfyui_jensen_kv.runtime.families.wan)
            for i in range(len(parts) - 2):
                if tuple(parts[i : i + 2]) == FAMILY_PACKAGE and parts[i + 2] in keys:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {'.'.join(parts[: i + 3])}")
                    break
            else:
                continue
            break  # one finding per import statement
    return found


def own_family(path: Path, keys: list[str]) -> str | None:
    """The family whose package holds ``path`` (runtime/families/<key>/...), or whose node file it is
    (nodes/<key>.py); None for every other file."""
    rel = path.relative_to(ROOT).parts
    if rel[:2] == FAMILY_PACKAGE and len(rel) > 3 and rel[2] in keys:
        return rel[2]
    if rel[0] == "nodes" and len(rel) == 2 and path.stem in keys:
        return path.stem
    return None


def foreign_family_imports(keys: list[str] | None = None) -> list[str]:
    """Every import of a family's package by a file that is not its own (its package or its node file)."""
    keys = FAMILY_MODULES if keys is None else keys
    found = []
    for room in ("jensen_core", "runtime", "routes", "nodes"):
        for path in _py_files(room):
            own = own_family(path, keys)
            found += [f for f in family_module_imports(path, keys) if f.rsplit(".", 1)[-1] != own]
    return found


def test_only_a_familys_own_package_and_node_file_import_it():
    """A family is one room: runtime/ (its loops, the registry, core's path), routes/ and every node file but its own
    ask the registry (``runtime.families``: ModelFamily and detect), never a family's package; no family imports
    another; its nodes (nodes/<key>.py) import its package."""
    assert FAMILY_MODULES and {"wan", "magi1", "worldplay"} <= set(FAMILY_MODULES)
    assert foreign_family_imports() == []
    assert family_module_imports(ROOT / "nodes" / "magi1.py")  # the check sees a node file's own imports


def test_the_family_import_check_sees_each_form(tmp_path):
    """Positive control: every way of reaching a family's package is seen; the registry's names are not."""
    room = tmp_path / "runtime" / "core_ar"
    room.mkdir(parents=True)
    bad = room / "x.py"
    bad.write_text(
        "from ..families.wan import GEOMETRY\nfrom ..families import wan\nimport comfyui_jensen_kv.runtime.families.wan\n"
        "from ..families import detect, FAMILIES\nfrom ..families.wan.family import WanFamily\n"
    )
    global ROOT  # _resolve and the finding's path are relative to the pack root: the sandbox's here
    old, ROOT = ROOT, tmp_path
    try:
        found = family_module_imports(bad, ["wan"])
    finally:
        ROOT = old
    assert [f.split(" imports ")[1] for f in found] == [
        "runtime.families.wan",
        "runtime.families.wan",
        "comfyui_jensen_kv.runtime.families.wan",
        "runtime.families.wan",
    ]


def test_the_foreign_family_check_sees_each_way_in(tmp_path, monkeypatch):
    """Positive control: a family importing another, the chunk loop importing a family, a node file importing
    another family's package and a shared node importing one are found; a family's own modules and node file not."""
    for key in ("aa", "bb"):
        pkg = tmp_path.joinpath(*FAMILIES_DIR, key)
        pkg.mkdir(parents=True)
        (pkg / "__init__.py").write_text("")
    (tmp_path / "jensen_core").mkdir()
    (tmp_path / "routes").mkdir()
    (tmp_path / "nodes").mkdir()
    fam = tmp_path.joinpath(*FAMILIES_DIR)
    (fam / "aa" / "recipe.py").write_text("from .family import A\nfrom ..bb.family import B\n")
    (fam / "aa" / "family.py").write_text("from ..base import ModelFamily\n")
    (tmp_path / "runtime" / "chunk_loop.py").write_text("from .families.aa.family import A\n")
    (tmp_path / "nodes" / "aa.py").write_text("from ..runtime.families.aa.recipe import run\n")
    (tmp_path / "nodes" / "bb.py").write_text("from ..runtime.families.aa.recipe import run\n")
    (tmp_path / "nodes" / "common.py").write_text("from ..runtime.families.bb import x\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert family_keys() == ["aa", "bb"]
    assert sorted(foreign_family_imports(["aa", "bb"])) == [
        "nodes/bb.py:1 imports runtime.families.aa",
        "nodes/common.py:1 imports runtime.families.bb",
        "runtime/chunk_loop.py:1 imports runtime.families.aa",
        "runtime/families/aa/recipe.py:2 imports runtime.families.bb",
    ]


def _strings(path: Path) -> list[str]:
    """The string constants of ``path`` that are not docstrings."""
    tree = ast.parse(path.read_text())
    docs = {
        id(n.body[0].value)
        for n in ast.walk(tree)
        if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and n.body
        and isinstance(n.body[0], ast.Expr)
        and isinstance(n.body[0].value, ast.Constant)
    }
    return [
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
    ]


def test_the_registry_names_no_family():
    """runtime/families' own files (the interface, the registry) name no family: they find the packages there, and
    each registers itself in one line (``register(...)`` in its family.py)."""
    import re

    for name in ("__init__.py", "base.py", "registry.py"):
        path = ROOT.joinpath(*FAMILIES_DIR, name)
        named = [s for s in _strings(path) for key in FAMILY_MODULES if re.search(rf"\b{key}\b", s)]
        assert named == [], (name, named)
    for key in FAMILY_MODULES:
        family = ROOT.joinpath(*FAMILIES_DIR, key, "family.py").read_text()
        lines = [line for line in family.splitlines() if line.startswith("register(")]
        assert len(lines) == 1, (key, lines)


def test_the_checker_sees_a_violation(tmp_path, monkeypatch):
    """Positive control: the checker flags a relative import into nodes/ and a ComfyUI import."""
    fake_root = tmp_path
    (fake_root / "runtime").mkdir()
    (fake_root / "runtime" / "bad.py").write_text("def f():\n    from ..nodes import common\n    import comfy.utils\n")
    (fake_root / "jensen_core").mkdir()
    (fake_root / "jensen_core" / "bad.py").write_text("import comfy.model_management\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", fake_root)
    assert violations("runtime", {"nodes"}, allow_comfy=True) == ["runtime/bad.py:2 imports 'nodes' (room nodes/)"]
    assert violations("jensen_core", {"nodes"}, allow_comfy=False) == [
        "jensen_core/bad.py:1 imports ComfyUI module 'comfy.model_management'"
    ]


@pytest.mark.parametrize(
    "room",
    [
        "jensen_core",
        "runtime",
        "runtime/core_ar",
        "runtime/families",
        "runtime/families/wan",
        "runtime/families/worldplay",
        "runtime/families/worldplay/model",
        "runtime/families/magi1",
        "runtime/families/magi1/model",
        "nodes",
        "routes",
    ],
)
def test_rooms_exist_as_packages(room):
    assert (ROOT / room / "__init__.py").is_file()


@pytest.mark.parametrize(
    "imports",
    [
        "jensen_core, jensen_core.planner, jensen_core.toy_video, jensen_core.demo",
        "runtime.families.worldplay.model.prope, runtime.families.worldplay.model.trajectory, "
        "runtime.families.worldplay.model.context, runtime.families.worldplay.model.condition, "
        "runtime.families.worldplay.model.attention, runtime.families.worldplay.model.keys",
        "runtime.families.magi1.model.dit, runtime.families.magi1.model.sampler, runtime.families.magi1.model.vae, "
        "runtime.families.magi1.model.checkpoint, runtime.families.magi1.model.caption",
    ],
)
def test_importing_the_pure_rooms_loads_no_comfyui_module(imports):
    """Each imports on its own (the pack root on sys.path, as tests and tools import them): no ComfyUI module, and a
    family's model/ nothing of the pack outside itself (not the registry, not the family's ComfyUI glue)."""
    code = (
        f"import sys, {imports}\n"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {sorted(COMFY_MODULES)!r})\n"
        "bad += sorted(m for m in sys.modules if m.startswith('runtime.') and '.model' not in m\n"
        "              and m not in ('runtime.families',) and not m.endswith(('.magi1', '.worldplay')))\n"
        "print(bad)\nsys.exit(1 if bad else 0)"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_node_modules_are_one_node_each():
    """nodes/: every module defines at most one io.ComfyNode class (plus shared helpers in common.py), but a model
    family's node file (nodes/<key>.py), which holds all the family's nodes."""
    for path in _py_files("nodes"):
        if path.stem in FAMILY_MODULES:
            continue
        tree = ast.parse(path.read_text())
        classes = [
            n.name
            for n in tree.body
            if isinstance(n, ast.ClassDef)
            and any(getattr(b, "attr", getattr(b, "id", "")) == "ComfyNode" for b in n.bases)
        ]
        assert len(classes) <= 1, f"{path.relative_to(ROOT)} defines {classes}: one node per file"


# --------------------------------------------------------------------------------------- no import pairs
PACK_ROOMS = ("jensen_core", "runtime", "routes", "nodes")


def _module_name(path: Path) -> str:
    """``jensen_core/quant.py`` -> ``jensen_core.quant``; a package's ``__init__.py`` -> the package; the root -> ``""``."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _pack_modules() -> dict[str, Path]:
    files = [ROOT / "__init__.py", *(p for room in PACK_ROOMS for p in _py_files(room))]
    return {_module_name(p): p for p in files if p.is_file()}


def _imported_modules(path: Path, modules: dict[str, Path]) -> set[str]:
    """Pack modules ``path`` imports anywhere in it (function-level too), relative imports resolved.

    ``from .pkg import name`` counts the module ``pkg.name`` where there is one, else ``pkg``."""
    pkg = _module_name(path).split(".") if path.name == "__init__.py" else _module_name(path).split(".")[:-1]
    pkg = [p for p in pkg if p]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg[: len(pkg) - (node.level - 1)]
                if len(base) < len(pkg) - (node.level - 1):  # above the pack root
                    continue
                mod = ".".join([*base, *(node.module.split(".") if node.module else [])])
            else:
                mod = node.module or ""
            subs = [f"{mod}.{a.name}" if mod else a.name for a in node.names]
            # names that are modules import those modules; any other name is taken from ``mod`` itself
            targets = subs + ([mod] if any(s not in modules for s in subs) else [])
        else:
            continue
        found.update(t for t in targets if t in modules)
    found.discard(_module_name(path))
    return found


def mutual_imports() -> list[str]:
    modules = _pack_modules()
    graph = {name: _imported_modules(path, modules) for name, path in modules.items()}
    return sorted(
        f"{a or '(root)'} <-> {b or '(root)'}"
        for a, targets in graph.items()
        for b in targets
        if a < b and a in graph.get(b, ())
    )


def test_no_two_pack_modules_import_each_other():
    """Imports run one way: a pair that imports each other (even inside a function) is one module split in two."""
    assert mutual_imports() == []


def test_the_pair_checker_sees_a_pair(tmp_path, monkeypatch):
    """Positive control: a function-level relative import back, across rooms and from a package, is a pair."""
    (tmp_path / "__init__.py").write_text("from .nodes import n\n")
    for room in PACK_ROOMS:
        (tmp_path / room).mkdir()
        (tmp_path / room / "__init__.py").write_text("")
    (tmp_path / "jensen_core" / "a.py").write_text("from .b import x\n")
    (tmp_path / "jensen_core" / "b.py").write_text("def f():\n    from . import a\n")
    (tmp_path / "jensen_core" / "c.py").write_text("from .b import x\n")  # one way only: no pair
    (tmp_path / "runtime" / "r.py").write_text("from ..routes.u import y\n")
    (tmp_path / "routes" / "u.py").write_text("def g():\n    from ..runtime import r\n")
    (tmp_path / "nodes" / "n.py").write_text("from .. import something\n")
    (tmp_path / "nodes" / "m.py").write_text("from . import n\n")  # the submodule n, not nodes/__init__.py
    (tmp_path / "nodes" / "__init__.py").write_text("from .m import z\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert mutual_imports() == ["(root) <-> nodes.n", "jensen_core.a <-> jensen_core.b", "routes.u <-> runtime.r"]


def _import_graph() -> dict[str, set[str]]:
    modules = _pack_modules()
    return {name: _imported_modules(path, modules) for name, path in modules.items()}


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of ``graph`` (iterative), each sorted; components of one module too."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                found.append(sorted(component))
    return found


def _a_circle(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """One shortest circle through the first module of ``component`` (a strongly connected set), as a path."""
    start, inside = component[0], set(component)
    paths = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for child in sorted(graph.get(node, ())):
            if child == start:
                return [*paths[node], start]
            if child in inside and child not in paths:
                paths[child] = [*paths[node], child]
                queue.append(child)
    raise AssertionError(f"{component} is not strongly connected")


def import_circles() -> list[str]:
    """Every circle of imports among the pack's modules, of any length (one path per strongly connected set)."""
    graph = _import_graph()
    return sorted(
        " -> ".join(m or "(root)" for m in _a_circle(graph, component))
        for component in _strongly_connected(graph)
        if len(component) > 1
    )


def test_no_circle_of_imports_of_any_length():
    """Imports run one way, also through a third module: a -> b -> c -> a (even inside a function) is a circle,
    which a pair check does not see."""
    assert import_circles() == []


def test_the_circle_checker_sees_a_circle_of_three_and_of_four(tmp_path, monkeypatch):
    """Positive control: a circle of three modules in one room (one import inside a function), one of four across
    rooms through a package's ``__init__.py``, and a pair are each found; a chain that does not close is not."""
    (tmp_path / "__init__.py").write_text("")
    for room in PACK_ROOMS:
        (tmp_path / room).mkdir()
        (tmp_path / room / "__init__.py").write_text("")
    (tmp_path / "jensen_core" / "a.py").write_text("from .b import x\n")
    (tmp_path / "jensen_core" / "b.py").write_text("from .c import y\n")
    (tmp_path / "jensen_core" / "c.py").write_text("def f():\n    from .a import z\n")
    (tmp_path / "jensen_core" / "d.py").write_text("from .a import x\n")  # into the circle, not out of it
    (tmp_path / "runtime" / "loop.py").write_text("from .families import detect\n")
    (tmp_path / "runtime" / "families").mkdir()
    (tmp_path / "runtime" / "families" / "__init__.py").write_text("from .wp import recipe\n")
    (tmp_path / "runtime" / "families" / "wp").mkdir()
    (tmp_path / "runtime" / "families" / "wp" / "__init__.py").write_text("")
    (tmp_path / "runtime" / "families" / "wp" / "recipe.py").write_text("from ....routes.u import seed\n")
    (tmp_path / "routes" / "u.py").write_text("from ..runtime.loop import seed\n")
    (tmp_path / "nodes" / "p.py").write_text("from .q import x\n")
    (tmp_path / "nodes" / "q.py").write_text("from . import p\n")
    (tmp_path / "routes" / "one.py").write_text("from .two import x\n")  # a chain: no circle
    (tmp_path / "routes" / "two.py").write_text("from .three import y\n")
    (tmp_path / "routes" / "three.py").write_text("import torch\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert import_circles() == [
        "jensen_core.a -> jensen_core.b -> jensen_core.c -> jensen_core.a",
        "nodes.p -> nodes.q -> nodes.p",
        "routes.u -> runtime.loop -> runtime.families -> runtime.families.wp.recipe -> routes.u",
    ]
    assert mutual_imports() == ["nodes.p <-> nodes.q"]  # what the pair check alone sees


# ---------------------------------------------------------------------------------------------- RunCaches' fields
RUN_CACHES = ("runtime", "run_caches.py")


def run_caches_fields(root: Path | None = None) -> set[str]:
    """The fields of ``RunCaches``: every attribute its methods assign on ``self``."""
    path = (root or ROOT).joinpath(*RUN_CACHES)
    tree = ast.parse(path.read_text(), filename=str(path))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "RunCaches")
    fields = set()
    for node in ast.walk(cls):
        for target in _assigned(node):
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
                fields.add(target.attr)
    return fields


def _assigned(node: ast.AST) -> list[ast.expr]:
    """The targets ``node`` assigns, augments, annotates or deletes (tuple and starred targets unpacked)."""
    if isinstance(node, ast.Assign):
        targets = list(node.targets)
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        targets = [node.target]
    elif isinstance(node, ast.Delete):
        targets = list(node.targets)
    elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
        targets = [node.target]
    elif isinstance(node, ast.withitem) and node.optional_vars is not None:
        targets = [node.optional_vars]
    elif isinstance(node, ast.NamedExpr):
        targets = [node.target]
    else:
        return []
    out = []
    while targets:
        t = targets.pop()
        if isinstance(t, (ast.Tuple, ast.List)):
            targets += t.elts
        elif isinstance(t, ast.Starred):
            targets.append(t.value)
        else:
            out.append(t)
    return out


def run_caches_field_writes(path: Path, fields: set[str]) -> list[str]:
    """Where ``path`` assigns a field of RunCaches: ``x.<field> = ...`` (also ``+=``, annotated, ``del``, a tuple
    target), ``x.<field>[key] = ...`` (into it), ``setattr(x, "<field>", ...)`` / ``object.__setattr__``, or a class
    that subclasses RunCaches. ``self.<field>`` in a method of the file's own classes is that class's field, not one
    of RunCaches' (the names are private, and other classes may use the same)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []

    def where(node, what):
        found.append(f"{path.relative_to(ROOT)}:{node.lineno} {what}")

    def visit(node, in_method: bool) -> None:
        if isinstance(node, ast.ClassDef):
            if any(getattr(b, "id", getattr(b, "attr", None)) == "RunCaches" for b in node.bases):
                where(node, f"subclasses RunCaches ({node.name})")
            for child in node.body:  # a method's body (nested functions too) is the class's own
                visit(child, isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))
            return
        for target in _assigned(node):
            while isinstance(target, ast.Subscript):  # x._caches[key] = ...: assigns into the field
                target = target.value
            if not isinstance(target, ast.Attribute) or target.attr not in fields:
                continue
            if in_method and isinstance(target.value, ast.Name) and target.value.id == "self":
                continue
            where(node, f"assigns .{target.attr}")
        if isinstance(node, ast.Call):
            fn = node.func
            name = fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else ""
            if name in ("setattr", "__setattr__") and len(node.args) >= 2:
                attr = node.args[1]
                if isinstance(attr, ast.Constant) and attr.value in fields:
                    where(node, f"sets .{attr.value}")
        for child in ast.iter_child_nodes(node):
            visit(child, in_method)

    visit(tree, False)
    return found


def _python_files() -> list[Path]:
    skip = {".git", ".ci", "node_modules", "__pycache__", ".venv"}
    return sorted(p for p in ROOT.rglob("*.py") if not skip & set(p.relative_to(ROOT).parts[:-1]))


def test_only_run_caches_assigns_its_fields():
    """RunCaches speaks through events (``at``, ``write``, ``finish_write``, ...): its fields are private and no
    other file of the pack, its tests, tools or benchmarks assigns one."""
    fields = run_caches_fields()
    assert {"_caches", "_chunk", "_step", "_phase", "_peak_bytes", "_timeline"} <= fields
    assert all(f.startswith("_") for f in fields), sorted(f for f in fields if not f.startswith("_"))
    found = [w for p in _python_files() if p.parts[-2:] != RUN_CACHES for w in run_caches_field_writes(p, fields)]
    assert found == []


def run_caches_private(root: Path | None = None) -> set[str]:
    """RunCaches' private members: its fields and its ``_methods``."""
    path = (root or ROOT).joinpath(*RUN_CACHES)
    cls = next(n for n in ast.parse(path.read_text()).body if isinstance(n, ast.ClassDef) and n.name == "RunCaches")
    methods = {n.name for n in cls.body if isinstance(n, ast.FunctionDef) and n.name.startswith("_")}
    return run_caches_fields(root) | {m for m in methods if not m.endswith("__")}


def run_caches_private_reads(source: str, private: set[str]) -> list[tuple[int, str]]:
    """(line, member) where ``source`` reaches a private member of RunCaches on something other than ``self`` /
    ``cls`` (``run._record_peak()``, ``run._wants``): the low-level calls its events replace."""
    found = [
        (n.lineno, n.col_offset, n.attr)
        for n in ast.walk(ast.parse(source))
        if isinstance(n, ast.Attribute)
        and n.attr in private
        and not (isinstance(n.value, ast.Name) and n.value.id in ("self", "cls"))
    ]
    return [(line, attr) for line, _, attr in sorted(found)]


def test_no_file_reaches_into_run_caches():
    """Other files call RunCaches' events and read its properties, never its private fields or methods (positive
    control: a planted call of ``_record_peak``, a read of ``_caches`` and ``_new_cache``; a class's own
    ``self._step`` is its own)."""
    private = run_caches_private()
    assert {"_begin", "_end_write", "_record_peak", "_new_cache", "_wants", "_caches"} <= private
    found = [
        f"{p.relative_to(ROOT)}:{line} reaches .{attr}"
        for p in _python_files()
        if p.parts[-2:] != RUN_CACHES
        for line, attr in run_caches_private_reads(p.read_text(), private)
    ]
    assert found == []
    planted = (
        "def f(run):\n    run._record_peak()\n    c = run._caches.get((0, 0)) or run._new_cache()\n    self._step = 1\n"
    )
    assert run_caches_private_reads(planted, private) == [(2, "_record_peak"), (3, "_caches"), (3, "_new_cache")]


def test_the_run_caches_check_sees_every_way_of_assigning(tmp_path, monkeypatch):
    """Positive control: a copy of run_caches.py and a planted file that assigns its fields every way; a class's own
    ``self._step`` is not one of them."""
    (tmp_path / "runtime").mkdir()
    (tmp_path / "runtime" / "run_caches.py").write_text(ROOT.joinpath(*RUN_CACHES).read_text())
    planted = tmp_path / "runtime" / "planted.py"
    planted.write_text(
        "from .run_caches import RunCaches\n"
        "def f(run, c):\n"
        "    run._chunk = 3\n"
        "    run._peak_bytes += 1\n"
        "    a, run._phase = 1, 'write'\n"
        "    run._caches[(0, 0)] = c\n"
        "    setattr(run, '_step', 2)\n"
        "    object.__setattr__(run, '_joint', None)\n"
        "    del run._evicted\n"
        "class Job:\n"
        "    def __init__(self, run):\n"
        "        self._step = 0\n"
        "        self.run = run\n"
        "        self.run._frame_offset: int = 4\n"
        "class Mine(RunCaches):\n"
        "    pass\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    fields = run_caches_fields()
    assert [w.split(" ", 1)[1] for w in run_caches_field_writes(planted, fields)] == [
        "assigns ._chunk",
        "assigns ._peak_bytes",
        "assigns ._phase",
        "assigns ._caches",
        "sets ._step",
        "sets ._joint",
        "assigns ._evicted",
        "assigns ._frame_offset",
        "subclasses RunCaches (Mine)",
    ]
    # RunCaches' own methods assign its fields on self only: the rule passes the file, as it passes Job's _step
    assert run_caches_field_writes(tmp_path / "runtime" / "run_caches.py", fields) == []


# ---------------------------------------------------------------------------------------------- `nodes` shadowing
_IMPORT_NODES = (
    "import sys\n"
    "sys.path[:0] = {path!r}\n"
    "try:\n"
    "    import nodes\n"
    "except ImportError as exc:\n"
    "    print('REFUSED', exc)\n"
    "else:\n"
    "    print('IMPORTED', nodes.__file__)\n"
)


def _import_nodes_with(path: list[str]) -> str:
    """What ``import nodes`` gives in a fresh interpreter whose sys.path starts with ``path`` (run outside ROOT)."""
    r = subprocess.run(
        [sys.executable, "-c", _IMPORT_NODES.format(path=path)], cwd="/", capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout.strip()


@pytest.fixture
def fake_comfyui(tmp_path) -> Path:
    """A folder that stands in for ComfyUI's: a top-level ``nodes.py``."""
    (tmp_path / "nodes.py").write_text("NODE_CLASS_MAPPINGS = {}\n")
    return tmp_path


def test_import_nodes_never_gives_the_packs_package_silently(fake_comfyui):
    """Pack root ahead of ComfyUI's folder: ``import nodes`` fails and names the fix; never the pack's package."""
    out = _import_nodes_with([str(ROOT), str(fake_comfyui)])
    assert out.startswith("REFUSED"), out
    assert "shadowing ComfyUI's own nodes.py" in out and "ahead of the pack root" in out, out


def test_import_nodes_gives_comfyuis_module_when_its_folder_comes_first(fake_comfyui):
    out = _import_nodes_with([str(fake_comfyui), str(ROOT)])
    assert out == f"IMPORTED {fake_comfyui / 'nodes.py'}", out


@pytest.mark.comfyui
def test_with_real_comfyui_import_nodes_is_comfyuis_or_refused():
    """The real ComfyUI folder beside the pack root, in both orders: ComfyUI's nodes.py or a loud refusal."""
    from support.comfyui import SKIP_REASON, find_comfyui

    comfy = find_comfyui()
    if comfy is None:
        pytest.skip(SKIP_REASON)
    code = (
        "import importlib.util, sys\n"
        f"sys.path[:0] = [{str(comfy)!r}, {str(ROOT)!r}]\n"
        "print(importlib.util.find_spec('nodes').origin)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd="/", capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and Path(r.stdout.strip()) == comfy / "nodes.py", r.stdout + r.stderr
    out = _import_nodes_with([str(ROOT), str(comfy)])
    assert out.startswith("REFUSED") and "ahead of the pack root" in out, out


# ---------------------------------------------------------------------------------------------- family interface
def _family_interface() -> set[str]:
    """Public members ModelFamily declares (methods, class attributes, annotated instance attributes)."""
    tree = ast.parse((ROOT / "runtime" / "families" / "base.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ModelFamily")
    names = set()
    for n in cls.body:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(n.name)
        elif isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name):
            names.add(n.target.id)
        elif isinstance(n, ast.Assign):
            names |= {t.id for t in n.targets if isinstance(t, ast.Name)}
    return {n for n in names if not n.startswith("_")}


def adapter_members_used(source: str) -> list[tuple[int, str]]:
    """(line, member) of every ``adapter.<member>`` / ``<x>.adapter.<member>`` in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Attribute):
            continue
        v = node.value
        if (isinstance(v, ast.Name) and v.id == "adapter") or (isinstance(v, ast.Attribute) and v.attr == "adapter"):
            found.append((node.lineno, node.attr))
    return sorted(found)


FAMILY_USERS = [
    "runtime/chunk_loop.py",
    "runtime/report.py",
    *(p.relative_to(ROOT).as_posix() for p in sorted((ROOT / "runtime" / "core_ar").glob("*.py"))),
]


@pytest.mark.parametrize("path", FAMILY_USERS)
def test_loops_use_only_the_model_family_interface(path):
    """The chunk loop, the report and core's AR path reach the model's family through ModelFamily only
    (never a family's internals such as Wan's ``dm`` or ``model_class``)."""
    interface = _family_interface()
    assert {"num_layers", "heads", "head_dim", "geometry", "install", "remove", "weights_digest"} <= interface
    used = adapter_members_used((ROOT / path).read_text())
    assert [f"{path}:{line} adapter.{m}" for line, m in used if m not in interface] == []


def test_chunk_loop_never_touches_family_internals():
    tree = ast.parse((ROOT / "runtime" / "chunk_loop.py").read_text())
    bad = [
        f"line {n.lineno}: .{n.attr}"
        for n in ast.walk(tree)
        if isinstance(n, ast.Attribute) and n.attr in {"dm", "model_class", "diffusion_model", "blocks"}
    ]
    assert bad == []
    assert adapter_members_used((ROOT / "runtime" / "chunk_loop.py").read_text())  # the check sees the loop's uses


def test_the_interface_check_sees_a_family_internal():
    """Positive control: ``adapter.dm`` and ``self.s.adapter.model_class`` are outside the interface."""
    used = adapter_members_used("x = weights(adapter.dm)\ny = self.s.adapter.model_class\nz = adapter.heads\n")
    assert used == [(1, "dm"), (2, "model_class"), (3, "heads")]
    interface = _family_interface()
    assert "dm" not in interface and "model_class" not in interface and "heads" in interface


def node_model_probes(source: str) -> list[str]:
    """Where a node module reads the model's blocks itself (attribute or object-path string)."""
    found = []
    for n in ast.walk(ast.parse(source)):
        if isinstance(n, ast.Attribute) and n.attr in {"blocks", "self_attn", "diffusion_model"}:
            found.append(f"line {n.lineno}: .{n.attr}")
        elif (
            isinstance(n, ast.Constant)
            and isinstance(n.value, str)
            and ("diffusion_model.blocks" in n.value or "self_attn" in n.value)
        ):
            found.append(f"line {n.lineno}: {n.value!r}")
    return sorted(found)


def test_nodes_ask_the_family_for_model_facts():
    """Node modules never probe ``diffusion_model.blocks.0.self_attn``; runtime/families answers (attention_shape)."""
    assert {
        p.relative_to(ROOT).as_posix(): node_model_probes(p.read_text())
        for p in _py_files("nodes")
        if node_model_probes(p.read_text())
    } == {}
    assert node_model_probes(
        'm.get_model_object("diffusion_model.blocks.0.self_attn").head_dim\nn = len(dm.blocks)\n'
    ) == ["line 1: 'diffusion_model.blocks.0.self_attn'", "line 2: .blocks"]


# ---------------------------------------------------------------------------------------------- dataclass fields
MAX_DATACLASS_FIELDS = 16


def dataclass_fields(source: str) -> dict[str, int]:
    """Fields of every dataclass in ``source`` (``@dataclass`` or ``@dataclass(...)``, at any depth; a ClassVar
    annotation is no field): class name -> count."""
    found = {}
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ClassDef):
            continue
        decorators = [d.func if isinstance(d, ast.Call) else d for d in node.decorator_list]
        if not any(getattr(d, "id", getattr(d, "attr", None)) == "dataclass" for d in decorators):
            continue
        found[node.name] = sum(
            1
            for s in node.body
            if isinstance(s, ast.AnnAssign)
            and isinstance(s.target, ast.Name)
            and "ClassVar" not in ast.unparse(s.annotation)
        )
    return found


def test_no_dataclass_under_runtime_or_nodes_has_more_than_16_fields():
    """A request or record of more than 16 fields is several values in one: group them (runtime/options.py's
    Sampling, Chunking, Continuation, Hooks, and one options value per family)."""
    found = [
        f"{path.relative_to(ROOT)}: {name} has {n} fields"
        for room in ("runtime", "nodes")
        for path in _py_files(room)
        for name, n in dataclass_fields(path.read_text()).items()
        if n > MAX_DATACLASS_FIELDS
    ]
    assert found == []


def test_the_field_count_sees_every_dataclass_form():
    """Positive control: a bare and a called decorator, ``dataclasses.dataclass``, a nested class; ClassVars and
    methods are no fields."""
    fields = "\n".join(f"    f{i}: int = {i}" for i in range(17))
    source = (
        "import dataclasses\nfrom dataclasses import dataclass\nfrom typing import ClassVar\n"
        f"@dataclass\nclass A:\n{fields}\n"
        f"@dataclass(frozen=True)\nclass B:\n    c: ClassVar[int] = 1\n    x: int\n    def f(self): pass\n"
        f"class Outer:\n    @dataclasses.dataclass(eq=False)\n    class C:\n    {fields.replace(chr(10), chr(10) + '    ')}\n"
    )
    assert dataclass_fields(source) == {"A": 17, "B": 1, "C": 17}
