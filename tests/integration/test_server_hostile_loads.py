"""Cache files from strangers loaded in a live ComfyUI server (hostile metadata, half-true state).

Anyone who reaches a server can put a file in input/ (``/upload/image``). Re-signed files (the SHA-256
has no key) that repeat one (layer, branch) pair 100,000 times or claim a million frames before them
are listed (their header says they are cache files), and a prompt loading one fails in seconds with the
loader's reason, while ``/system_stats`` keeps answering; then a good file loads. Every file is built
here, after the server started, in the session's shared server (``comfy_server``), which removes them after
this module.
"""

from __future__ import annotations

import shutil
import threading
import time
import urllib.error

import pytest
from support.saved_run_files import craft, make_state

pytestmark = [pytest.mark.comfyui, pytest.mark.server]

NODE = "JensenKVLoadKVCache"
#: generous: a refusal takes milliseconds here; the unchecked loader took minutes on the first file
REFUSED_WITHIN_S = 60.0
ANSWER_WITHIN_S = 15.0


@pytest.fixture(scope="module")
def server(comfy_server):
    return comfy_server


def _prompt(name: str) -> dict:
    return {
        "1": {"class_type": NODE, "inputs": {"cache_file": name}},
        "2": {"class_type": "JensenKVSaveKVCache", "inputs": {"kv_cache": ["1", 0], "filename_prefix": "kv"}},
    }


def _run_while_answering(server, name: str) -> tuple[dict, float]:
    """Queue a prompt loading ``name``; poll /system_stats until it ends. Returns its history entry and seconds."""
    status, body = server.post("/prompt", {"prompt": _prompt(name)}, timeout=ANSWER_WITHIN_S)
    assert status == 200 and body["node_errors"] == {}, body
    t0 = time.monotonic()
    result: dict = {}
    waiter = threading.Thread(
        target=lambda: result.setdefault("entry", server.wait_for_prompt(body["prompt_id"], timeout=REFUSED_WITHIN_S)),
        daemon=True,
    )
    waiter.start()
    try:
        while waiter.is_alive():
            t = time.monotonic()
            assert "system" in server.get("/system_stats", timeout=ANSWER_WITHIN_S)
            assert time.monotonic() - t < ANSWER_WITHIN_S
            time.sleep(0.05)
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        pytest.fail(f"/system_stats did not answer while {name} loaded ({exc})\n{server.log_tail()}")
    waiter.join()
    assert "entry" in result, f"{name} was still loading after {REFUSED_WITHIN_S:.0f} s\n{server.log_tail()}"
    return result["entry"], time.monotonic() - t0


def _error(entry: dict) -> str:
    errors = [m[1] for m in entry["status"]["messages"] if m[0] == "execution_error"]
    assert errors, entry["status"]
    return str(errors[0].get("exception_message"))


def test_hostile_cache_files_are_refused_in_seconds_and_the_server_keeps_answering(server, tmp_path):
    inp = server.base_dir / "input"
    saved_before = set((server.base_dir / "output").glob("kv_*.safetensors"))
    repeat = craft(
        tmp_path,
        lambda st, t: st.update(caches=st["caches"] + [[0, 0]] * (100_000 - len(st["caches"]))),
        name="repeat.safetensors",
    )
    far = craft(tmp_path, lambda st, t: st.update(next_frame=10**6), name="far.safetensors")
    for path in (repeat, far):
        shutil.copy(path, inp)  # as an upload to input/ would leave it
    make_state().save(str(inp / "good.safetensors"))
    listed = server.get(f"/object_info/{NODE}")[NODE]["input"]["required"]["cache_file"]
    listed = listed[0] if isinstance(listed[0], list) else listed[1]["options"]
    assert {"input/repeat", "input/far", "input/good"} <= set(listed)  # listed without the extension

    for name, reason in (
        ("input/repeat.safetensors", "caches lists 100000 entries"),
        ("input/far.safetensors", "next_frame=1000000 does not follow the retained chunks"),
    ):
        entry, seconds = _run_while_answering(server, name)
        assert entry["status"]["status_str"] == "error", entry["status"]
        assert reason in _error(entry), _error(entry)
        assert seconds < REFUSED_WITHIN_S
    entry, _ = _run_while_answering(server, "input/good.safetensors")
    assert entry["status"]["status_str"] == "success", f"{entry['status']}\n{server.log_tail()}"
    # Save KV Cache wrote the loaded state
    assert set((server.base_dir / "output").glob("kv_*.safetensors")) - saved_before
