"""Record or check the golden runs (jensen_testing/golden_runs.py) against the ComfyUI found as the tests find it.

    python tools/golden_runs.py            # check: every run's output against its recording, within float32 rounding
    python tools/golden_runs.py --record   # rewrite this ComfyUI version's entry (a change meant to alter outputs)
    python tools/golden_runs.py --plants   # also: how far each planted bug moves each run, against the bound

Needs ComfyUI (COMFYUI_PATH, a ComfyUI above the checkout, or /opt/comfyui/<version>) and its requirements.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the pack's jensen_testing; appended, so ComfyUI's folder stays first
    sys.path.append(str(ROOT))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--record", action="store_true", help="rewrite this ComfyUI version's recordings")
    ap.add_argument("--plants", action="store_true", help="also run every planted bug on every run")
    ap.add_argument("--only", nargs="*", help="run names")
    args = ap.parse_args(argv)

    from jensen_testing import comfyui
    from jensen_testing.golden_runs import (
        PLANTS,
        RUNS,
        compute,
        differences,
        load_recorded,
        planted,
        record,
        version_key,
    )
    from jensen_testing.numerics import relative_error

    comfy = comfyui.setup_inprocess_comfyui()
    comfyui.import_pack()
    version = version_key(comfy)
    recorded = load_recorded(version)
    got, bad = {}, 0
    for run in RUNS:
        if args.only and run.name not in args.only:
            continue
        if run.core_ar and not (comfy / "comfy" / "ldm" / "wan" / "ar_model.py").is_file():
            continue
        got[run.name] = c = compute(run)
        want = recorded.get(run.name)
        if want is None:
            print(f"{run.name}: not recorded (depth {c.depth})")
            bad += not args.record
            continue
        diff = differences(c, want)
        errs = ", ".join(
            f"{k} {relative_error(t, want.outputs[k]):.2e}" for k, t in c.outputs.items() if k in want.outputs
        )
        print(
            f"{'DIFFERS' if diff else 'same'} {run.name}: depth {c.depth}, relative error {errs}, bound {want.bound().value:.2e}"
        )
        for line in diff:
            print(f"    {line}")
        bad += bool(diff)
        if args.plants:
            for plant in PLANTS:
                with planted(plant):
                    p = compute(run)
                worst = max(relative_error(p.outputs[k], want.outputs[k]) for k in want.outputs)
                print(f"    planted {plant}: {worst:.2e} ({worst / want.bound().value:.1f}x the bound)")
    if args.record:
        record(version, got)
        print(f"recorded {len(got)} runs for ComfyUI {version}")
        return 0
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
