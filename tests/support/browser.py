"""Headless Chromium (Playwright) against a throwaway ComfyUI server: shared set-up for browser tests.

Playwright cannot download browsers on this kind of machine; it drives the system Chromium
(``apt-get install -y chromium``) through ``executable_path``.
"""

from __future__ import annotations

import json
from pathlib import Path

from .comfyui import which_chromium

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-dev-shm-usage"]
VIEWPORT = {"width": 1600, "height": 1000}

# Front-end settings of the test user: no first-run template gallery; everything else default.
FRONTEND_SETTINGS = {
    "Comfy.TutorialCompleted": True,
    "Comfy.Workflow.ShowMissingNodesWarning": True,
    "Comfy.Workflow.ShowMissingModelsWarning": True,
}


def browser_skip_reason() -> str | None:
    """Why browser tests cannot run here (None when they can)."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return (
            "Playwright is not installed: pip install playwright (browsers come from apt: apt-get install -y chromium)"
        )
    if which_chromium() is None:
        return "Chromium not found at /usr/bin/chromium: apt-get install -y chromium (Playwright drives the system browser)"
    return None


def write_frontend_settings(base_dir: Path, extra: dict | None = None) -> None:
    """Settings file of ComfyUI's default user in a ``--base-directory`` made by ``make_base_dir``."""
    user = base_dir / "user" / "default"
    user.mkdir(parents=True, exist_ok=True)
    (user / "comfy.settings.json").write_text(json.dumps({**FRONTEND_SETTINGS, **(extra or {})}, indent=1))


def write_placeholder_models(base_dir: Path, files: dict[str, tuple[str, ...]]) -> None:
    """Empty files with the names the workflows use, so the loaders' combo lists contain them."""
    for folder, names in files.items():
        for name in names:
            p = base_dir / "models" / folder / name
            p.parent.mkdir(parents=True, exist_ok=True)
            p.touch()


def launch_chromium(playwright):
    return playwright.chromium.launch(executable_path=which_chromium(), headless=True, args=CHROMIUM_ARGS)


APP_READY_JS = """() => !!(window.app && window.app.graph && window.app.canvas && window.LiteGraph
    && window.LiteGraph.registered_node_types && window.LiteGraph.registered_node_types['JensenKVQuantizeKVCache'])"""


def open_comfyui(page, url: str, timeout_ms: int = 90_000) -> None:
    """Open the front end and wait until the app runs and the pack's nodes are registered."""
    page.goto(url, wait_until="domcontentloaded", timeout=timeout_ms)
    page.wait_for_function(APP_READY_JS, timeout=timeout_ms)
    # extensions finish their setup after the graph exists
    page.wait_for_function(
        "() => !!document.querySelector('.graph-canvas-container, canvas#graph-canvas, canvas')", timeout=timeout_ms
    )
