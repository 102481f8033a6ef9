"""Shared pytest set-up: makes ``tests/support`` importable from every test folder, and loads the
CI rule that a skipped ComfyUI / server / browser test fails a ``CI=true`` run (``support/ci_skips.py``)."""
import sys
from pathlib import Path

_TESTS = Path(__file__).resolve().parent
if str(_TESTS) not in sys.path:
    sys.path.insert(0, str(_TESTS))

from support.ci_skips import pytest_configure  # noqa: E402,F401  (registers the CI skip collector)
