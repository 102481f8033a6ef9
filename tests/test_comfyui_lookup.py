"""Where the tests look for ComfyUI (``jensen_testing.comfyui.locate_comfyui``) and ComfyUI-GGUF
(``support.gguf_wan.locate_comfyui_gguf``): the order ``.ci/run`` uses, never ``../shared/``."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import gguf_wan

import jensen_testing.comfyui as jc


def fake_comfyui(path: Path) -> Path:
    (path / "comfy").mkdir(parents=True)
    (path / "comfy" / "model_patcher.py").write_text("")
    (path / "main.py").write_text("")
    return path


@pytest.fixture
def trees(tmp_path, monkeypatch):
    monkeypatch.delenv("COMFYUI_PATH", raising=False)
    monkeypatch.delenv("COMFYUI_GGUF_PATH", raising=False)
    monkeypatch.setenv("COMFYUI_TREES", str(tmp_path / "trees"))
    return tmp_path / "trees"


def test_the_laid_out_trees_are_found_newest_first(trees):
    if jc.locate_comfyui() is not None:
        pytest.skip("this checkout lives inside a ComfyUI, which wins over the trees")
    old = fake_comfyui(trees / "v0.3.64")
    assert jc.locate_comfyui() == old.resolve()
    middle = fake_comfyui(trees / "v0.27")
    assert jc.locate_comfyui() == middle.resolve()
    new = fake_comfyui(trees / "v0.33")
    assert jc.locate_comfyui() == new.resolve()


def test_comfyui_path_wins_and_shared_is_never_looked_at(trees, tmp_path, monkeypatch):
    fake_comfyui(trees / "v0.33")
    chosen = fake_comfyui(tmp_path / "mine")
    monkeypatch.setenv("COMFYUI_PATH", str(chosen))
    assert jc.locate_comfyui() == chosen.resolve()
    monkeypatch.setenv("COMFYUI_PATH", str(tmp_path / "nonexistent"))
    assert jc.locate_comfyui() == (trees / "v0.33").resolve()
    assert "shared" not in jc.locate_comfyui.__code__.co_names
    assert not any("shared" in str(c) for c in jc.locate_comfyui.__code__.co_consts if isinstance(c, str))


def test_the_skip_reason_names_lay_out_sh():
    assert "lay-out.sh" in jc.LAY_OUT_HINT
    assert jc.SKIP_REASON.startswith("ComfyUI found") or "lay-out.sh" in jc.SKIP_REASON


def test_comfyui_gguf_comes_from_the_variable_then_comfyui_then_the_trees(trees, tmp_path, monkeypatch):
    def pack(p: Path) -> Path:
        p.mkdir(parents=True)
        for f in ("loader.py", "nodes.py", "ops.py"):
            (p / f).write_text("")
        return p

    monkeypatch.setattr(gguf_wan, "find_comfyui", lambda: None)
    assert gguf_wan.locate_comfyui_gguf() is None
    tree = pack(trees / "ComfyUI-GGUF")
    assert gguf_wan.locate_comfyui_gguf() == tree.resolve()
    comfy = fake_comfyui(tmp_path / "ComfyUI")
    own = pack(comfy / "custom_nodes" / "ComfyUI-GGUF")
    monkeypatch.setattr(gguf_wan, "find_comfyui", lambda: comfy)
    assert gguf_wan.locate_comfyui_gguf() == own.resolve()
    chosen = pack(tmp_path / "gguf")
    monkeypatch.setenv("COMFYUI_GGUF_PATH", str(chosen))
    assert gguf_wan.locate_comfyui_gguf() == chosen.resolve()
