"""Files from strangers in a live ComfyUI server: the Load KV Cache listing cannot freeze it.

The listing runs on the server's event loop for every ``/object_info`` and ``/prompt``. With a FIFO
named ``x.safetensors`` in output/ and input/ (anyone who reaches the server can put files in input/),
symlinks that lead out of the folders, a device and 3,000 other ``.safetensors`` files, the server
keeps answering ``/system_stats``, the listing holds only the real cache files, and a prompt naming a
hostile file is refused with a 400. Save KV Cache refuses a dot-only prefix at validation. Every file
is built here, after the server started. This module starts its own server rather than the session's shared
one: it needs an output/ without any cache file to start from, and a FIFO that a server thread may block on
must not outlive the module in a server other tests use.
"""

from __future__ import annotations

import json
import os
import struct
import threading
import time
import urllib.error

import pytest
from support import comfyui as support_comfyui

pytestmark = [
    pytest.mark.comfyui,
    pytest.mark.server,
    pytest.mark.skipif(support_comfyui.find_comfyui() is None, reason=support_comfyui.SKIP_REASON),
]

FORMAT = "jensen_kv_run_state"  # what Save KV Cache writes in the metadata (runtime/saved_run.py FORMAT)
NODE = "JensenKVLoadKVCache"
#: generous: /system_stats takes milliseconds; a frozen event loop never answers
ANSWER_WITHIN_S = 15.0


def safetensors_bytes(metadata: dict | None) -> bytes:
    """A tiny valid safetensors file: one float32 tensor ``x`` of 2 zeros, ``metadata`` first in the header."""
    header = {
        **({"__metadata__": metadata} if metadata else {}),
        "x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
    }
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    return struct.pack("<Q", len(blob)) + blob + b"\0" * 8


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    comfy_dir = support_comfyui.find_comfyui()
    root = tmp_path_factory.mktemp("hostile")
    base = support_comfyui.make_base_dir(root / "comfy_base")
    with support_comfyui.ComfyServer(comfy_dir, base) as srv:
        srv.outside = root / "outside"
        srv.outside.mkdir()
        srv.fifos = []
        try:
            yield srv
        finally:
            for fifo in srv.fifos:  # release a server thread stuck opening a FIFO, should there be one
                try:
                    os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
                except OSError:
                    pass


def system_stats_time(server) -> float:
    t0 = time.monotonic()
    stats = server.get("/system_stats", timeout=ANSWER_WITHIN_S)
    assert "system" in stats
    return time.monotonic() - t0


def options(info: dict) -> list[str]:
    spec = info[NODE]["input"]["required"]["cache_file"]
    return spec[0] if isinstance(spec[0], list) else spec[1]["options"]


def test_hostile_files_are_not_listed_and_the_server_keeps_answering(server):
    out, inp, outside = server.base_dir / "output", server.base_dir / "input", server.outside
    assert options(server.get(f"/object_info/{NODE}")) == ["(no saved KV cache yet)"]
    # the folders, as a stranger (or a careless link) leaves them
    (out / "jensen_kv").mkdir()
    (out / "jensen_kv" / "kv_cache_00001_.safetensors").write_bytes(safetensors_bytes({"format": FORMAT}))
    (outside / "secret.safetensors").write_bytes(safetensors_bytes({"format": FORMAT}))
    for folder in (out, inp):
        fifo = str(folder / "x.safetensors")
        os.mkfifo(fifo)
        server.fifos.append(fifo)
    os.symlink(outside / "secret.safetensors", out / "outside.safetensors")
    os.symlink(outside, inp / "linked")
    os.symlink("/dev/zero", inp / "zero.safetensors")
    not_cache = safetensors_bytes({"format": "pt"})
    for i in range(3000):
        (inp / f"upload_{i:04}.safetensors").write_bytes(not_cache)

    # the listing (first: every header read once) in the background; the server answers meanwhile
    result: dict = {}

    def listing():
        try:
            result["info"] = server.get(f"/object_info/{NODE}", timeout=120)
        except (urllib.error.URLError, TimeoutError, OSError) as exc:
            result["error"] = exc

    t = threading.Thread(target=listing, daemon=True)
    t.start()
    times = []
    try:
        while t.is_alive() or not times:
            times.append(system_stats_time(server))
            time.sleep(0.05)
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        pytest.fail(
            f"/system_stats did not answer within {ANSWER_WITHIN_S:.0f} s while the cache files were "
            f"listed ({type(exc).__name__}: {exc}): the event loop is blocked\n{server.log_tail()}"
        )
    t.join(130)
    assert "error" not in result, result
    assert options(result["info"]) == ["output/jensen_kv/kv_cache_00001_"]
    # cached now: the whole /object_info (which builds every node's schema) lists them again, and answers
    full = server.get("/object_info", timeout=60)
    assert options({NODE: full[NODE]}) == ["output/jensen_kv/kv_cache_00001_"]
    times.append(system_stats_time(server))
    assert max(times) < ANSWER_WITHIN_S, times

    # a prompt naming a hostile file: refused at validation, quickly, and the server still answers
    for name in (
        "output/x.safetensors",
        "input/x.safetensors",
        "output/outside.safetensors",
        "input/linked/secret.safetensors",
        "input/zero.safetensors",
    ):
        status, body = server.post(
            "/prompt", {"prompt": {"1": {"class_type": NODE, "inputs": {"cache_file": name}}}}, timeout=ANSWER_WITHIN_S
        )
        assert status == 400, (name, body)
        assert system_stats_time(server) < ANSWER_WITHIN_S


def test_a_dot_only_prefix_is_refused_at_validation(server):
    """Save KV Cache's filename_prefix "." (which would write a hidden ``._00001_`` file) is a 400 naming the
    field; nothing is written."""
    out = server.base_dir / "output"
    (out / "kv.safetensors").write_bytes(safetensors_bytes({"format": FORMAT}))
    before = sorted(p.name for p in out.iterdir())
    for prefix in ("", ".", ".."):
        prompt = {
            "1": {"class_type": NODE, "inputs": {"cache_file": "output/kv.safetensors"}},
            "2": {"class_type": "JensenKVSaveKVCache", "inputs": {"kv_cache": ["1", 0], "filename_prefix": prefix}},
        }
        status, body = server.post("/prompt", {"prompt": prompt})
        assert status == 400, (prefix, body)
        errors = body["node_errors"]["2"]["errors"]
        assert any("filename_prefix" in e["details"] and "only dots" in e["details"] for e in errors), errors
    assert sorted(p.name for p in out.iterdir()) == before
