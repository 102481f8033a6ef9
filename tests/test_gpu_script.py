"""``benchmarks/gpu.py``, the one command for a GPU: its dry run works on a CPU-only machine and lists every section."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu.py"


def _run(*args):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # as on a CPU-only machine, even where a GPU is present
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True, env=env, timeout=120
    )


def test_the_dry_run_lists_every_section_and_exits_0():
    r = _run("--dry-run")
    assert r.returncode == 0, r.stderr
    listed = [line.split()[0] for line in r.stdout.splitlines() if line.startswith("  ")]
    assert listed == ["tests", "layouts", "op", "memory", "e2e"]
    for what in (
        "-m pytest -q -m cuda tests/",
        "bf16, fp16, fp32",
        "SDPA unquantized; INT2; INT2 + Taylor per layout (pad, split, flex",
        "INT2 + chunk_mean",
        "Triton kernel",
        "peak CUDA memory",
        "Wan 1.3B geometry (30 layers) and a 14B-geometry slice",
        "480x832 (3-frame chunks, window 4",
    ):
        assert what in r.stdout, what
    assert "cuda available here: False" in r.stdout


def test_a_skipped_section_says_so_in_the_dry_run():
    r = _run("--dry-run", "--skip-tests", "--skip-e2e")
    assert r.returncode == 0, r.stderr
    lines = {line.split()[0]: line for line in r.stdout.splitlines() if line.startswith("  ")}
    assert "(skipped)" in lines["tests"] and "(skipped)" in lines["e2e"] and "(skipped)" not in lines["op"]


def test_without_cuda_a_real_run_stops_with_a_message_and_exit_2():
    r = _run()
    assert r.returncode == 2
    assert "needs a CUDA device (none here); --dry-run lists what it would run" in r.stderr
