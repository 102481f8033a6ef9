"""tests/web: the per-file tests over example_workflows/*.json (test_workflows.py, test_browser.py) take the ``core_ar``
marker for the workflows on ComfyUI's own AR sampler (``workflow_specs.CORE_WORKFLOWS``: SamplerARVideo,
EmptyARVideoLatent and ARVideoI2V exist from ComfyUI v0.27 on), and the ``hunyuan15`` marker for the HY-WorldPlay
workflows (``workflow_specs.WORLDPLAY_WORKFLOWS``: HunyuanVideo15ImageToVideo and DualCLIPLoader's
``hunyuan_video_15`` exist from v0.27 on). Against an older ComfyUI (v0.3.64) those items are deselected with the
other core_ar / hunyuan15 tests (``-m "not core_ar and not hunyuan15"``), never skipped; against v0.27 and 0.33
they run."""

from __future__ import annotations

from pathlib import Path

import pytest
from workflow_specs import CORE_WORKFLOW_NAMES, WORLDPLAY_WORKFLOW_NAMES, write_placeholder_files


def _workflow_item_in(item, names) -> bool:
    params = getattr(getattr(item, "callspec", None), "params", {})
    path = params.get("path")
    return isinstance(path, Path) and path.suffix == ".json" and path.stem in names


def is_core_workflow_item(item) -> bool:
    """A test parametrized with a workflow file (``path``) of a core-AR workflow."""
    return _workflow_item_in(item, CORE_WORKFLOW_NAMES)


def is_worldplay_workflow_item(item) -> bool:
    """A test parametrized with a workflow file (``path``) of a HY-WorldPlay workflow."""
    return _workflow_item_in(item, WORLDPLAY_WORKFLOW_NAMES)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if is_core_workflow_item(item):
            item.add_marker(pytest.mark.core_ar)
        if is_worldplay_workflow_item(item):
            item.add_marker(pytest.mark.hunyuan15)


@pytest.fixture(scope="module")
def server(comfy_server):
    """The session's shared server (one torch thread: support.shared_server.SHARED_SERVER_ENV) with the loaders' file
    names and the I2V start image in its folders, and its ``/object_info``: the workflow tests' server."""
    write_placeholder_files(comfy_server.base_dir)
    comfy_server.object_info = comfy_server.get("/object_info")
    return comfy_server
