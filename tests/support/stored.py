"""The tests' stored data (``tests/data``): expected outputs of the references, kept as data."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parents[1] / "data"


def stored_json(*parts: str) -> Any:
    """``tests/data/<parts...>``, read as JSON (e.g. ``stored_json("worldplay", "context.json")``)."""
    return json.loads(DATA.joinpath(*parts).read_text())
