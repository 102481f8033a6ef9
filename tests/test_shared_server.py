"""The session's shared ComfyUI server (tests/conftest.py ``comfy_server``): what a test module adds to its folders
is removed after the module, and only the modules that need a server of their own start one."""

from __future__ import annotations

import os
import re
from pathlib import Path

from support.shared_server import SCRATCH_FOLDERS, FolderSnapshot, make_base_dir

TESTS = Path(__file__).resolve().parent
#: the files that may start a ComfyServer: the shared one, the hostile-files module (an output/ with no cache file
#: to start from; FIFOs a server thread may block on), and the workflow builder (a tool, not a test)
OWN_SERVERS = {"support/shared_server.py", "integration/test_server_hostile_files.py", "web/build_workflows.py"}


def test_folder_snapshot_removes_what_was_added_and_keeps_what_was_there(tmp_path):
    base = make_base_dir(tmp_path / "base")
    kept = base / "input" / "kept.png"
    kept.write_bytes(b"old")
    (base / "output" / "jensen_kv").mkdir()
    kept_in_folder = base / "output" / "jensen_kv" / "kept.latent"
    kept_in_folder.write_bytes(b"x")
    outside = tmp_path / "outside"
    (outside / "deep").mkdir(parents=True)
    (outside / "deep" / "secret").write_bytes(b"s")

    snap = FolderSnapshot(base)
    kept.write_bytes(b"changed")  # changed, not added: stays
    added = [
        base / "models" / "diffusion_models" / "tiny.safetensors",
        base / "output" / "jensen_kv" / "new.latent",
        base / "output" / "run" / "a" / "b.latent",
        base / "user" / "default" / "workflows" / "w.json",
    ]
    for p in added:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"n")
    os.mkfifo(base / "input" / "x.safetensors")
    os.symlink(outside, base / "input" / "linked")
    removed = snap.remove_added()

    assert base / "output" / "run" in removed and base / "input" / "linked" in removed
    assert all(not p.exists() for p in added)
    assert not (base / "output" / "run").exists() and not (base / "user" / "default").exists()
    assert not os.path.lexists(base / "input" / "x.safetensors") and not os.path.lexists(base / "input" / "linked")
    assert kept.read_bytes() == b"changed" and kept_in_folder.exists()
    assert (outside / "deep" / "secret").exists()  # a link is removed, never followed
    assert (base / "custom_nodes").is_dir() and all((base / f).is_dir() for f in SCRATCH_FOLDERS)
    assert FolderSnapshot(base).added() == [] and snap.added() == []


def test_server_tests_use_the_shared_server():
    starts = {str(p.relative_to(TESTS)) for p in TESTS.rglob("*.py") if re.search(r"\bComfyServer\(", p.read_text())}
    assert starts <= OWN_SERVERS, sorted(starts - OWN_SERVERS)
    assert "support/shared_server.py" in starts


def test_the_fast_lane_leaves_out_server_and_integration_tests():
    """``-m "not slow"`` collects no test under tests/integration and none that talks to a server, but keeps the
    static workflow checks of a module that has both."""
    import subprocess
    import sys

    files = ["tests/integration/test_nodes.py", "tests/web/test_workflows.py"]
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only", "-m", "not slow", *files],
        cwd=TESTS.parent,
        capture_output=True,
        text=True,
        timeout=300,
    )
    ids = [line for line in r.stdout.splitlines() if "::" in line]
    assert ids, r.stdout + r.stderr
    assert not [i for i in ids if i.startswith("tests/integration/")]
    assert not [i for i in ids if "live_object_info" in i or "templates" in i], ids
    assert any(i.startswith("tests/web/test_workflows.py::") for i in ids)
