"""Shared pytest set-up: makes ``tests/support`` importable from every test folder, loads the CI rule that a
skipped ComfyUI / server / browser test fails a ``CI=true`` run (``support/ci_skips.py``), and holds the one
ComfyUI server of the session that the server tests share (``comfy_server``)."""

import sys
from pathlib import Path

import pytest

_TESTS = Path(__file__).resolve().parent
if str(_TESTS) not in sys.path:
    sys.path.insert(0, str(_TESTS))

from support.ci_skips import pytest_configure  # noqa: E402,F401  (registers the CI skip collector)


def pytest_collection_modifyitems(config, items):
    """A test that talks to a ComfyUI server is slow (the server's start alone takes 12-15 s): out of the fast
    lane, ``python -m pytest -q -m "not slow"``."""
    for item in items:
        if item.get_closest_marker("server") is not None:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def _comfy_server_process(tmp_path_factory):
    """One ComfyUI server for the whole session (``main.py --cpu`` on a free loopback port), started the first
    time a test asks for it (support.shared_server.start_shared_server)."""
    from support import shared_server

    if shared_server.find_comfyui() is None:
        pytest.skip(shared_server.SKIP_REASON)
    with shared_server.start_shared_server(tmp_path_factory.mktemp("comfy_shared")) as server:
        yield server


@pytest.fixture(scope="module")
def comfy_server(_comfy_server_process):
    """The session's ComfyUI server, for one test module: whatever the module adds under the base directory's
    input/, output/, models/, temp/ and user/ (models it writes, latents its prompts save) is removed after it,
    so no module sees another's files, whichever order they run in."""
    from support.shared_server import FolderSnapshot

    snapshot = FolderSnapshot(_comfy_server_process.base_dir)
    try:
        yield _comfy_server_process
    finally:
        snapshot.remove_added()
