"""This machine's CPU class (AMX, AVX-512, AVX2 or other) from its feature flags.

The correction layouts ask it (the CPU flash kernel packs its operands for AMX), and benchmarks
print it so that figures from different machines compare.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path


def cpu_class_from_flags(flags: set[str] | frozenset[str]) -> str:
    """``AMX`` (amx_bf16), ``AVX-512`` (avx512f), ``AVX2`` (avx2) or ``other``, from /proc/cpuinfo flags."""
    if "amx_bf16" in flags:
        return "AMX"
    if "avx512f" in flags:
        return "AVX-512"
    if "avx2" in flags:
        return "AVX2"
    return "other"


@lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags from /proc/cpuinfo (empty where there is none, e.g. macOS)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def cpu_class() -> str:
    """This machine's CPU class, so figures from different machines compare (see :func:`cpu_class_from_flags`)."""
    return cpu_class_from_flags(cpu_flags())
