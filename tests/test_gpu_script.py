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
    assert listed == ["tests", "layouts", "op", "memory", "e2e", "family_ops", "families"]
    for what in (
        "-m pytest -q -m cuda tests/",
        "bf16, fp16, fp32",
        "SDPA unquantized; INT2; INT2 + Taylor per layout (pad, split, flex",
        "INT2 + chunk_mean",
        "Triton kernel",
        "peak CUDA memory",
        "Wan 1.3B geometry (30 layers) and a 14B-geometry slice",
        "480x832 (3-frame chunks, window 4",
        "MAGI-1 4.5B (GQA 24/8 x 128, 4 chunks in flight, 1 finished chunk read)",
        "HY-WorldPlay (16 x 128, one stream",
        "chunk_cost.py cases wan/plain, magi1, worldplay, lingbot",
        "the report's peak memory",
    ):
        assert what in r.stdout, what
    assert "cuda available here: False" in r.stdout


def test_a_skipped_section_says_so_in_the_dry_run():
    r = _run("--dry-run", "--skip-tests", "--skip-e2e", "--skip-families")
    assert r.returncode == 0, r.stderr
    lines = {line.split()[0]: line for line in r.stdout.splitlines() if line.startswith("  ")}
    assert "(skipped)" in lines["tests"] and "(skipped)" in lines["e2e"] and "(skipped)" not in lines["op"]
    assert "(skipped)" in lines["families"] and "(skipped)" not in lines["family_ops"]


def test_without_cuda_a_real_run_stops_with_a_message_and_exit_2():
    r = _run()
    assert r.returncode == 2
    assert "needs a CUDA device (none here); --dry-run lists what it would run" in r.stderr


def _gpu_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("jensen_kv_gpu_bench", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_family_attends_time_the_keys_the_pack_reads_grouped_query_heads_included(monkeypatch):
    """family_ops' SDPA baseline attends each query head to the K/V head the pack's grouped-query path gives it
    (MAGI-1: 24 query heads over 8): on a CPU at small sizes, the pack's INT2 output is far nearer that baseline
    than one paired the other way (``repeat``, head h to K/V head h mod 8)."""
    import torch
    import torch.nn.functional as F

    gpu = _gpu_module()
    small = {"gqa": (6, 2, 64, 1, 32), "mha": (4, 4, 32, 3, 32)}
    monkeypatch.setattr(gpu, "FAMILY_OPS", small)
    assert set(gpu.FAMILY_OPS) == set(small)
    for name, (heads, kv_heads, query, cached, tokens) in small.items():
        calls, window_bytes = gpu.family_op_calls(name, torch.float32, "cpu")
        assert window_bytes == 2 * kv_heads * (query + cached * tokens) * 128 * 4
        out = {label: fn() for label, fn in calls.items()}
        base = out["SDPA BF16, unquantized"]
        assert all(o.shape == (1, heads, query, 128) for o in out.values())
        err = float((out["INT2 (no correction)"] - base).norm() / base.norm())
        if heads == kv_heads:
            continue
        q, _, _, k_all, v_all, _ = gpu._window(torch.float32, "cpu", heads, kv_heads, query, cached, tokens)
        rep = heads // kv_heads
        wrong = F.scaled_dot_product_attention(q, k_all.repeat(1, rep, 1, 1), v_all.repeat(1, rep, 1, 1))
        wrong_err = float((out["INT2 (no correction)"] - wrong).norm() / wrong.norm())
        assert err < 0.8 * wrong_err, (err, wrong_err)
