"""The one ComfyUI server of a pytest session, shared by the server tests (fixtures in ``tests/conftest.py``:
``comfy_server``), and the snapshot that removes what a test module added to its folders."""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

from jensen_testing.comfyui import SKIP_REASON, TEST_NODES_DIR, ComfyServer, find_comfyui, make_base_dir

#: the folders of a base directory that tests write into; what a test module adds there is removed after it
SCRATCH_FOLDERS = ("input", "output", "models", "temp", "user")
#: one torch thread in the server: torch's OpenMP threads spin-wait, and on a 2-core machine shared with other jobs
#: two of them made the tiny demo workflow 10x slower (~200 s against ~17 s with one; ~15 s with two when idle)
SHARED_SERVER_ENV = {"OMP_NUM_THREADS": "1"}


def shared_custom_nodes() -> list[Path]:
    """The packs beside this one in the shared server: the test-only nodes, and ComfyUI-GGUF where it can load."""
    from . import gguf_wan

    extra = [TEST_NODES_DIR]
    if gguf_wan.gguf_skip_reason() is None:
        extra.append(gguf_wan.locate_comfyui_gguf())
    return extra


def start_shared_server(base: Path) -> ComfyServer:
    """The one ComfyUI server of a pytest session (``tests/conftest.py``: ``comfy_server``), not yet entered.

    Its base directory has this pack, :func:`shared_custom_nodes` and the browser tests' front-end settings;
    test modules put the files they need (models, inputs) into it and :class:`FolderSnapshot` removes them after.
    """
    from .browser import write_frontend_settings

    comfy_dir = find_comfyui()
    if comfy_dir is None:
        raise RuntimeError(SKIP_REASON)
    make_base_dir(base, shared_custom_nodes())
    write_frontend_settings(base)
    return ComfyServer(comfy_dir, base, env=SHARED_SERVER_ENV)


class FolderSnapshot:
    """The entries under a base directory's :data:`SCRATCH_FOLDERS` at one moment; :meth:`remove_added` deletes
    every file, link, FIFO and folder made after it (what existed stays, changed or not)."""

    def __init__(self, base: Path):
        self.base = base
        self.before = self._entries()

    def _entries(self) -> set[Path]:
        out = set()
        for folder in SCRATCH_FOLDERS:
            for dirpath, dirnames, filenames in os.walk(self.base / folder):  # links are not followed
                out.update(Path(dirpath) / n for n in (*dirnames, *filenames))
        return out

    def added(self) -> list[Path]:
        return sorted(self._entries() - self.before, key=lambda p: len(p.parts), reverse=True)

    def remove_added(self) -> list[Path]:
        added = self.added()
        for path in added:  # deepest first: a new folder is empty when its turn comes
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
        return added
