"""The pack's version, read from its one home: ``[project] version`` in pyproject.toml."""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

DIST_NAME = "comfyui-jensen-kv"
PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def read_version(pyproject: Path = PYPROJECT) -> str:
    """``[project] version`` of the checkout's pyproject.toml (a ComfyUI custom_nodes folder or a clone),
    else the installed distribution's version, else ``"unknown"``."""
    try:
        text = pyproject.read_text(encoding="utf-8")
    except OSError:
        text = ""
    # the [project] table up to the next table header; tomllib is not in Python 3.10
    table = re.search(r"^\[project\]\s*$(.*?)(?=^\[|\Z)", text, re.MULTILINE | re.DOTALL)
    if table and re.search(rf"^name\s*=\s*\"{DIST_NAME}\"", table.group(1), re.MULTILINE):
        found = re.search(r"^version\s*=\s*\"([^\"]+)\"", table.group(1), re.MULTILINE)
        if found:
            return found.group(1)
    try:
        return metadata.version(DIST_NAME)
    except metadata.PackageNotFoundError:
        return "unknown"


__version__ = read_version()
