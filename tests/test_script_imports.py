"""Benchmarks and tools import the pack's shared helpers (``jensen_testing``), never ``tests/``; the pack's rooms
never import ``jensen_testing``; and a script's header puts the pack's folder after ComfyUI's on ``sys.path``, so
ComfyUI's top-level ``nodes`` module wins over the pack's ``nodes`` package."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted([*(ROOT / "benchmarks").glob("*.py"), *(ROOT / "tools").glob("*.py")])
ROOMS = ("jensen_core", "runtime", "nodes", "routes")


def _imported_tops(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module.split(".")[0])
    return out


def _sys_path_edits(path: Path) -> list[str]:
    """The source of every ``sys.path.insert`` / ``sys.path.append`` call in ``path``."""
    src = path.read_text()
    return [
        ast.get_source_segment(src, n)
        for n in ast.walk(ast.parse(src))
        if isinstance(n, ast.Call) and ast.unparse(n.func) in ("sys.path.insert", "sys.path.append")
    ]


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_scripts_never_reach_into_tests(path):
    assert "support" not in _imported_tops(path), f"{path.name} imports tests/support: use jensen_testing"
    for edit in _sys_path_edits(path):
        assert "tests" not in edit, edit
        assert not edit.startswith("sys.path.insert(0, str(ROOT))"), f"{path.name}: append the pack's folder"


def test_no_room_of_the_pack_imports_jensen_testing():
    found = [
        f"{p.relative_to(ROOT)}"
        for room in ROOMS
        for p in (ROOT / room).rglob("*.py")
        if "jensen_testing" in _imported_tops(p)
    ]
    assert found == []


def test_a_script_header_keeps_comfyuis_nodes_module_first(tmp_path):
    """A script's header run with a stand-in ComfyUI already on ``sys.path`` (``PYTHONPATH``, or a script that set
    ComfyUI up first): jensen_testing imports, and ``import nodes`` is still ComfyUI's."""
    comfy = tmp_path / "ComfyUI"
    comfy.mkdir()
    (comfy / "nodes.py").write_text("WHO = 'comfyui'\n")
    header = (ROOT / "benchmarks" / "sampler.py").read_text().split("from jensen_testing", 1)[0]
    assert "Path(__file__).resolve().parents[1]" in header
    header = header.replace("Path(__file__).resolve().parents[1]", f"Path({str(ROOT)!r})")
    code = f"""{header}
import jensen_testing
import nodes
print(nodes.WHO, sys.path.index({str(ROOT)!r}) > sys.path.index({str(comfy)!r}))
"""
    script = tmp_path / "benchmarks" / "probe.py"  # sys.path[0] is the script's folder, as for benchmarks/x.py
    script.parent.mkdir()
    script.write_text(code)
    env = {**os.environ, "PYTHONPATH": str(comfy)}
    r = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["comfyui", "True"]
