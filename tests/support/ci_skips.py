"""Under ``CI=true`` a skipped ComfyUI, server or browser test fails the run (a pytest plugin).

Locally these tests skip, saying why, when ComfyUI, its requirements, ComfyUI-GGUF, Playwright or
Chromium are missing. On CI a skip there means the CI machine is set up wrong and the tests that
matter most did not run, while the run would still look green. So, when the environment variable
``CI`` is ``true`` (or ``1`` / ``yes``), every skip of such a test is collected, listed with its
reason in the terminal summary, and the session's exit status is set to 1.

Which tests count: those marked ``comfyui``, ``server`` or ``browser``, and everything under
``tests/integration/`` (a module there that skips as a whole counts too).
Which skips are allowed: a test marked ``cuda``, or one whose reason says that CUDA is absent: CI
machines have no GPU.

Tests marked ``core_ar`` need ComfyUI's own AR video path (``comfy/ldm/wan/ar_model.py``, v0.27+), and
tests marked ``hunyuan15`` need ComfyUI's HunyuanVideo 1.5 (``class HunyuanVideo15`` in
``comfy/supported_models.py``, v0.27+; HY-WorldPlay is built on it). On an older ComfyUI they are
deselected (``-m "not core_ar and not hunyuan15"``, as ``.ci/run`` does for v0.3.64), never skipped:
when one is selected and the ComfyUI the tests use lacks what it needs, the session stops before
running anything, with an error that says so (CI or not).

``tests/conftest.py`` loads it (it re-exports :func:`pytest_configure`, which registers one
:class:`CISkipCollector` per run); ``-p support.ci_skips`` loads it into another pytest run
(``tests/test_ci_skips.py`` does that with ``pytester``).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

#: markers of tests that CI must run
REQUIRED_MARKERS = ("comfyui", "server", "browser", "core_ar", "hunyuan15")
#: test folders (relative to the rootdir) whose tests all need ComfyUI
REQUIRED_DIRS = ("tests/integration/", "tests/families/")
#: skip reasons that only say CUDA is absent (CI machines are CPU-only)
CUDA_REASON = re.compile(
    r"(needs|requires|without|no)\s+(a\s+)?(CUDA|GPU)\b|\bCUDA\b.*\b(not available|unavailable|absent|missing)\b",
    re.IGNORECASE,
)


#: marker of the tests that need ComfyUI's own AR video path, and the file that has it
CORE_AR_MARKER = "core_ar"
CORE_AR_FILE = ("comfy", "ldm", "wan", "ar_model.py")


def has_core_ar(comfy_dir) -> bool:
    """This ComfyUI checkout has core's AR video path (``comfy/ldm/wan/ar_model.py``)."""
    return Path(comfy_dir).joinpath(*CORE_AR_FILE).is_file()


#: marker of the tests that need ComfyUI's HunyuanVideo 1.5, and where it is defined
HUNYUAN15_MARKER = "hunyuan15"
HUNYUAN15_FILE = ("comfy", "supported_models.py")
HUNYUAN15_CLASS = "class HunyuanVideo15("


def has_hunyuan15(comfy_dir) -> bool:
    """This ComfyUI checkout has HunyuanVideo 1.5 (``class HunyuanVideo15`` in ``comfy/supported_models.py``)."""
    try:
        return HUNYUAN15_CLASS in Path(comfy_dir).joinpath(*HUNYUAN15_FILE).read_text(errors="replace")
    except OSError:
        return False


@dataclass(frozen=True)
class VersionFeature:
    """A part of newer ComfyUI some tests need: their marker, what it is, and how to tell a checkout has it."""

    marker: str
    what: str
    lacks: str
    present: object  # (comfy_dir) -> bool


FEATURES = (
    VersionFeature(
        CORE_AR_MARKER, "ComfyUI's own AR video path, v0.27+", f"has no {'/'.join(CORE_AR_FILE)}", has_core_ar
    ),
    VersionFeature(
        HUNYUAN15_MARKER,
        "ComfyUI's HunyuanVideo 1.5, v0.27+",
        f"has no {HUNYUAN15_CLASS.removesuffix('(')} in {'/'.join(HUNYUAN15_FILE)}",
        has_hunyuan15,
    ),
)


def feature_error(items, comfy_dir, feature: VersionFeature) -> str | None:
    """Why these selected tests cannot run against ``comfy_dir`` (tests of ``feature`` where it is absent), or None."""
    needing = [item.nodeid for item in items if item.get_closest_marker(feature.marker) is not None]
    if not needing or comfy_dir is None or feature.present(comfy_dir):
        return None
    shown = "\n  ".join(needing[:5]) + (f"\n  ... and {len(needing) - 5} more" if len(needing) > 5 else "")
    return (
        f"{len(needing)} selected test(s) are marked {feature.marker} (they need {feature.what}), but the ComfyUI "
        f'they would run against, {comfy_dir}, {feature.lacks}. Deselect them with -m "not {feature.marker}" '
        f"(never skip them), or point COMFYUI_PATH at a newer ComfyUI:\n  {shown}"
    )


def core_ar_error(items, comfy_dir) -> str | None:
    """Why these selected tests cannot run against ``comfy_dir`` (core_ar tests without core's AR path), or None."""
    return feature_error(items, comfy_dir, FEATURES[0])


def ci_enabled(environ=None) -> bool:
    """``CI`` is set to true (GitHub Actions, GitLab and ``.ci/run`` set ``CI=true``)."""
    return (environ if environ is not None else os.environ).get("CI", "").strip().lower() in ("true", "1", "yes")


@dataclass(frozen=True)
class CISkip:
    nodeid: str
    reason: str


def _reason(report) -> str:
    longrepr = report.longrepr
    text = str(longrepr[2]) if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return text.removeprefix("Skipped: ")


def _in_required_dir(nodeid: str) -> bool:
    return any(nodeid.startswith(d) or nodeid == d.rstrip("/") for d in REQUIRED_DIRS)


def is_required(item, nodeid: str) -> bool:
    """A test CI must run: in a required folder or marked comfyui / server / browser."""
    if _in_required_dir(nodeid):
        return True
    return item is not None and any(item.get_closest_marker(m) is not None for m in REQUIRED_MARKERS)


def is_cuda_skip(item, reason: str) -> bool:
    """A skip CI allows: the test is marked ``cuda`` or its reason says CUDA / a GPU is absent."""
    if item is not None and item.get_closest_marker("cuda") is not None:
        return True
    return bool(CUDA_REASON.search(reason))


class CISkipCollector:
    """Collects the skips of required tests of one pytest run (one instance per config)."""

    def __init__(self, config):
        self.config = config
        self.items: dict = {}
        self.skips: list[CISkip] = []

    def _record(self, nodeid: str, item, report) -> None:
        reason = _reason(report)
        if is_required(item, nodeid) and not is_cuda_skip(item, reason):
            self.skips.append(CISkip(nodeid, reason))

    def pytest_collection_modifyitems(self, session, config, items):
        self.items.update({item.nodeid: item for item in items})

    def pytest_collection_finish(self, session):
        """core_ar / hunyuan15 tests selected against a ComfyUI without what they need: stop, loudly (never skip)."""
        from .comfyui import locate_comfyui

        comfy_dir = locate_comfyui()
        errors = [e for f in FEATURES if (e := feature_error(session.items, comfy_dir, f))]
        if errors:
            raise pytest.UsageError("\n".join(errors))

    def pytest_collectreport(self, report):
        """A whole module under a required folder that skips at import (``pytest.importorskip`` at the top)."""
        if report.skipped and _in_required_dir(report.nodeid):
            self._record(report.nodeid, None, report)

    def pytest_runtest_logreport(self, report):
        if report.skipped and not hasattr(report, "wasxfail"):
            self._record(report.nodeid, self.items.get(report.nodeid), report)

    def pytest_sessionfinish(self, session, exitstatus):
        if self.skips and ci_enabled() and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter, exitstatus, config):
        if not self.skips or not ci_enabled():
            return
        tr = terminalreporter
        tr.write_sep(
            "=", f"CI=true: {len(self.skips)} ComfyUI / server / browser test(s) skipped, so the run fails", red=True
        )
        for s in self.skips:
            tr.write_line(f"SKIPPED {s.nodeid}: {s.reason}")
        tr.write_line(
            "Install what the reasons name (bash .ci/run does it on a fresh machine); a test that needs a "
            "GPU is marked @pytest.mark.cuda."
        )


PLUGIN_NAME = "jensen_kv_ci_skips"


def pytest_configure(config):
    if not any(line.split(":")[0].strip() == "cuda" for line in config.getini("markers")):
        config.addinivalue_line("markers", "cuda: needs a CUDA device (skipping it is allowed under CI=true)")
    for feature in FEATURES:
        if not any(line.split(":")[0].strip() == feature.marker for line in config.getini("markers")):
            config.addinivalue_line(
                "markers", f"{feature.marker}: needs {feature.what}: deselected on older ComfyUI, never skipped"
            )
    if not config.pluginmanager.has_plugin(PLUGIN_NAME):
        config.pluginmanager.register(CISkipCollector(config), PLUGIN_NAME)
