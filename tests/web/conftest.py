"""tests/web: the per-file tests over workflows/*.json (test_workflows.py, test_browser.py) take the ``core_ar``
marker for the workflows on ComfyUI's own AR sampler (``workflow_specs.CORE_WORKFLOWS``: SamplerARVideo,
EmptyARVideoLatent and ARVideoI2V exist from ComfyUI v0.27 on). Against an older ComfyUI those items are
deselected with the other core_ar tests (``-m "not core_ar"``), never skipped; against v0.27 they run."""

from __future__ import annotations

from pathlib import Path

import pytest
from workflow_specs import CORE_WORKFLOW_NAMES


def is_core_workflow_item(item) -> bool:
    """A test parametrized with a workflow file (``path``) of a core-AR workflow."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    path = params.get("path")
    return isinstance(path, Path) and path.suffix == ".json" and path.stem in CORE_WORKFLOW_NAMES


def pytest_collection_modifyitems(config, items):
    for item in items:
        if is_core_workflow_item(item):
            item.add_marker(pytest.mark.core_ar)
