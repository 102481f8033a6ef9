"""How far the tiny AR models' rollouts drift from the true trajectories: the teacher-forced model against its successor.

    python benchmarks/tiny_ar_drift.py                  # 4 held-out videos x 32 chunks, both models (~10 min, 1 core)
    python benchmarks/tiny_ar_drift.py --seeds 8        # more videos

Both models run the same rollouts (the pack's chunk loop, full-precision cache, window 3, 8 euler
steps at shift 3, 2 ground-truth prefix chunks, noise seed 100 + i: ``benchmarks/rollout.py``'s
settings), so the rows differ by the weights alone. Prints the object-position error against the
ground-truth continuation (latent px, mean ± standard error over videos) after 1, 8, 16 and 32 chunks,
and the cache dependence of each model (``jensen_testing.tiny_ar.cache_dependence``).

The last row is a physics oracle on the same videos (``jensen_testing.tiny_ar.oracle_position_errors``):
the objects found in the same 2 prefix chunks, their start and velocity fitted with the data's exact
dynamics and radii. It shows how much of the drift the prefix alone leaves (``--oracle-only``: that row
alone, in seconds).
"""

from __future__ import annotations

import argparse
import math
import shlex
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the pack's jensen_core and jensen_testing; appended, so ComfyUI's folder stays first
    sys.path.append(str(ROOT))

from jensen_testing import comfyui as support_comfyui  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--chunks", type=int, default=32)
    ap.add_argument("--models", type=Path, nargs="+", default=None, help="checkpoints (default: v1 and v2)")
    ap.add_argument("--no-cache-dependence", action="store_true")
    ap.add_argument("--oracle-only", action="store_true", help="only the physics oracle's row (no model runs)")
    args = ap.parse_args(argv)
    support_comfyui.setup_inprocess_comfyui()
    import torch

    from jensen_testing import tiny_ar

    models = args.models or [tiny_ar.MODEL_PATH, tiny_ar.MODEL_V2_PATH]
    marks = [c for c in (1, 8, 16, 32) if c <= args.chunks]
    t0 = time.perf_counter()
    rows = []
    for path in [] if args.oracle_only else models:
        m = tiny_ar.load_model(path)
        err = tiny_ar.position_errors(m, args.seeds, args.chunks)
        cd = None if args.no_cache_dependence else tiny_ar.cache_dependence(m, n=6)
        rows.append((Path(path).name, err, cd))
        print(f"{Path(path).name} done at {time.perf_counter() - t0:.0f} s", flush=True)
    oracle = tiny_ar.oracle_position_errors(args.seeds, args.chunks)
    rows.append(("physics oracle (fit to the prefix)", oracle, None))
    cmd = "python benchmarks/tiny_ar_drift.py" + (" " + shlex.join(argv if argv is not None else sys.argv[1:]))
    print(f"\n`{cmd.strip()}`: {args.seeds} held-out videos, {time.perf_counter() - t0:.0f} s\n")
    print("| model | " + " | ".join(f"after {c} chunk{'s' * (c > 1)}" for c in marks) + " | cache dependence |")
    print("|---|" + "---|" * len(marks) + "---|")
    for name, err, cd in rows:
        cells = []
        for c in marks:
            v = err[:, c - 1]
            v = v[torch.isfinite(v)]
            se = float(v.std() / math.sqrt(len(v))) if len(v) > 1 else 0.0
            cells.append(f"{float(v.mean()):.2f} ± {se:.2f} px")
        dep = "" if cd is None else f"{cd['ratio']:.1f}x ({cd['true_loss']:.3f} / {cd['swapped_loss']:.3f})"
        print(f"| {name} | " + " | ".join(cells) + f" | {dep} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
