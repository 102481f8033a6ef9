"""Record or check the golden runs (jensen_testing/golden_runs.py) against the ComfyUI found as the tests find it.

    python tools/golden_runs.py            # check: every run's output against tests/data/golden_runs.json
    python tools/golden_runs.py --record   # rewrite this ComfyUI version's entry (a change meant to alter outputs)

Needs ComfyUI (COMFYUI_PATH, a ComfyUI above the checkout, or /opt/comfyui/<version>) and its requirements.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the pack's jensen_testing; appended, so ComfyUI's folder stays first
    sys.path.append(str(ROOT))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--record", action="store_true", help="rewrite this ComfyUI version's digests")
    ap.add_argument("--only", nargs="*", help="run names")
    args = ap.parse_args(argv)

    from jensen_testing import comfyui
    from jensen_testing.golden_runs import GOLDEN_FILE, RUNS, compute, version_key

    comfy = comfyui.setup_inprocess_comfyui()
    comfyui.import_pack()
    version = version_key(comfy)
    data = json.loads(GOLDEN_FILE.read_text()) if GOLDEN_FILE.is_file() else {}
    mine = data.setdefault(version, {})
    bad = 0
    for run in RUNS:
        if args.only and run.name not in args.only:
            continue
        if run.core_ar and not (comfy / "comfy" / "ldm" / "wan" / "ar_model.py").is_file():
            continue
        got = compute(run)
        if args.record:
            mine[run.name] = got
            shown = ", ".join(f"{k} {v['sha256'][:12]}" for k, v in got.items())
            print(f"recorded {run.name}: {shown}")
        elif mine.get(run.name) != got:
            bad += 1
            print(f"DIFFERS {run.name}: {mine.get(run.name)} != {got}")
        else:
            print(f"same {run.name}")
    if args.record:
        GOLDEN_FILE.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        print(f"wrote {GOLDEN_FILE} [{version}]")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
