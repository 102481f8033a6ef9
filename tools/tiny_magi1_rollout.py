"""Check the trained tiny MAGI-1's rollouts: per-chunk statistics of 16-step rollouts against the data's, and the
one-step loss per chunk position on held-out videos with the true context and with another video's.

    python tools/tiny_magi1_rollout.py --threads 1                     # 16 chunks, windows 4 and 1, prompts 0-5
    python tools/tiny_magi1_rollout.py --untrained --prompts 1 --chunks 4   # the same check on untrained weights

Rollouts: the pack's pure-torch MAGI-1 sampler (``runtime.families.magi1.model.sampler``: distilled, cfg 1, key ranges 5, 4, 3, 2, full
precision K/V buffer), text to video from ``torch.randn`` after ``manual_seed(seed)``. Each finished chunk's
``std``, ``motion`` (mean absolute change between consecutive latent frames) and ``detail`` (mean absolute spatial
Laplacian) over the same statistic of held-out videos of the prompt; a rollout is stable when every chunk's ratios
lie within ``jensen_testing.magi1_trained.BOUNDS`` (``tests/test_tiny_magi1.py`` asserts it for two rollouts).
Pure torch, no ComfyUI. ``--json`` writes every number.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

import torch  # noqa: E402

from jensen_testing import magi1_trained as mt  # noqa: E402


def untrained():
    """The training tool's step-0 model (its initialisation; the file's special tokens)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("jensen_kv_train_tiny_magi1", ROOT / "tools" / "train_tiny_magi1.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod.build(0).eval(), mt.special_tokens()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", type=Path, default=mt.MODEL_PATH)
    ap.add_argument("--untrained", action="store_true", help="the training tool's initial weights instead")
    ap.add_argument("--chunks", type=int, default=16)
    ap.add_argument("--windows", default="4,1")
    ap.add_argument("--prompts", default="0,1,2,3,4,5")
    ap.add_argument("--seed", type=int, default=11, help="noise seed of every rollout")
    ap.add_argument("--steps", type=int, default=mt.STEPS)
    ap.add_argument("--context-videos", type=int, default=6, help="held-out videos for the one-step loss (0: skip)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.untrained:
        model, special = untrained()
        meta = {"model": "untrained (tools/train_tiny_magi1.py initialisation)"}
    else:
        model, special = mt.load(args.model)
        from safetensors import safe_open

        with safe_open(str(args.model), framework="pt") as f:
            m = f.metadata()
        meta = {"model": str(args.model), "step": m.get("step"), "steps": m.get("steps")}
    print(f"{meta}", flush=True)
    windows = [int(w) for w in args.windows.split(",")]
    prompts = [int(p) for p in args.prompts.split(",")]
    report = {**meta, "chunks": args.chunks, "steps": args.steps, "seed": args.seed, "bounds": mt.BOUNDS, "runs": []}
    all_stable = True
    for window in windows:
        for prompt in prompts:
            t0 = time.perf_counter()
            video = mt.rollout(model, special, prompt, args.chunks, window, args.seed, steps=args.steps)
            res = mt.stability(video, prompt, window)
            all_stable &= res.stable
            print(f"{res.line()}\n  ({time.perf_counter() - t0:.0f} s)", flush=True)
            report["runs"].append(
                {
                    "prompt": prompt,
                    "window": window,
                    "stable": res.stable,
                    "first_bad_chunk": res.first_bad_chunk,
                    "ratios": res.ratios,
                    "values": res.values,
                }
            )
    if args.context_videos:
        videos = mt.held_out(args.context_videos)
        chunks = min(args.chunks, 16)
        own = mt.context_loss(model, special, videos, chunks=chunks)
        other = mt.context_loss(model, special, videos, chunks=chunks, other=True)
        none = mt.context_loss(model, special, videos, chunks=chunks, context=0)
        print("one-step loss per chunk position (held-out videos; t = 0.05, 0.2, 0.5):")
        print("  own context:   " + " ".join(f"{x:.3f}" for x in own.tolist()))
        print("  other context: " + " ".join(f"{x:.3f}" for x in other.tolist()))
        print("  no context:    " + " ".join(f"{x:.3f}" for x in none.tolist()))
        ratio = float(other[1:].mean() / own[1:].mean())
        print(f"  context dependence (other / own, chunks 1..{chunks - 1}): {ratio:.2f}x")
        report["context_loss"] = {
            "own": own.tolist(),
            "other": other.tolist(),
            "none": none.tolist(),
            "ratio": ratio,
        }
    stable_runs = sum(r["stable"] for r in report["runs"])
    print(f"stable rollouts: {stable_runs} of {len(report['runs'])}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1))
    return 0 if all_stable else 1


if __name__ == "__main__":
    raise SystemExit(main())
