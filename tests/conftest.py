"""Shared pytest set-up: makes ``tests/support`` importable from every test folder."""
import sys
from pathlib import Path

_TESTS = Path(__file__).resolve().parent
if str(_TESTS) not in sys.path:
    sys.path.insert(0, str(_TESTS))
