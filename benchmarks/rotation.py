"""Rotation cost: the randomized Hadamard transform as log2(n) butterfly passes vs one matmul.

    python benchmarks/rotation.py

Both compute the same orthogonal map (``tests/test_attention.py`` checks it); this shows why
``jensen_core.hadamard`` applies it as a matmul up to ``MATMUL_MAX_DIM``.
"""

import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the pack's jensen_core and jensen_testing; appended, so ComfyUI's folder stays first
    sys.path.append(str(ROOT))
from jensen_core import hadamard  # noqa: E402


def _time(fn, rounds=9):
    fn()
    ts = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1000


def main():
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; tensor (1, 12, 1560, n)")
    for n in (64, 128, 256):
        for dtype in (torch.float32, torch.bfloat16):
            x = torch.randn(1, 12, 1560, n).to(dtype)
            mm = _time(lambda x=x: hadamard.rotate(x, 0))
            old = hadamard.MATMUL_MAX_DIM
            hadamard.MATMUL_MAX_DIM = 0
            try:
                bf = _time(lambda x=x: hadamard.rotate(x, 0))
            finally:
                hadamard.MATMUL_MAX_DIM = old
            print(
                f"  n={n:<4}{str(dtype).removeprefix('torch.'):<9} butterflies {bf:7.2f} ms   matmul {mm:7.2f} ms   ratio {bf / mm:5.2f}"
            )


if __name__ == "__main__":
    main()
