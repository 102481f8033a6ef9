"""The family conformance suite runs every family in ``runtime.families.FAMILIES`` through the same checks, each with
its tiny model from ``jensen_testing.families.TINY``. Like tests/integration/, every test here needs ComfyUI: it is
marked ``comfyui`` and ``slow`` (and, under CI=true, a skip fails the run); the fixtures are the integration ones."""

from __future__ import annotations

import pytest
from integration.conftest import _reset_interrupt, comfy, euler, jk, loop, nodes, pack  # noqa: F401
from support import comfyui as support_comfyui

HAVE_COMFYUI = support_comfyui.find_comfyui() is not None


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "/tests/families/" in str(item.fspath):
            item.add_marker(pytest.mark.comfyui)
            item.add_marker(pytest.mark.slow)
            if not HAVE_COMFYUI:
                item.add_marker(pytest.mark.skip(reason=support_comfyui.SKIP_REASON))
