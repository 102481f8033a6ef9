"""Build example_workflows/*.json with the real front end (run by hand after changing workflow_specs.py).

    COMFYUI_PATH=/opt/comfyui/v0.3.64 .ci/venvs/comfyui-oldest/bin/python tests/web/build_workflows.py

Starts a throwaway ComfyUI server with the pack (and placeholder model files, so the loaders list
the names), opens the UI in headless Chromium, builds each spec with LiteGraph and writes what
``app.graph.serialize()`` returns - the same JSON as the UI's Save. A spec's ``name`` is the file name, which
ComfyUI's template browser shows as the title; after a build, ``python tools/make_thumbnails.py`` draws the
template browser's pictures again (``tests/test_example_workflows.py`` checks that each workflow has one).

It builds with the oldest ComfyUI the pack supports (``requires-comfyui`` in pyproject.toml) and that
version's front end (``.ci/run`` makes the environment above), so the files load on every supported
version: a newer front end would save widgets the older ComfyUI does not have (v0.27's CreateVideo
``bit_depth``), while a newer one gives a widget missing at the end of a node its default.
``--any-comfyui`` builds with whatever ComfyUI the tests would use.

The workflows on ComfyUI's own AR sampler (``CORE_WORKFLOWS``: SamplerARVideo, EmptyARVideoLatent and
ARVideoI2V exist from v0.27 on) are built with a ComfyUI that has core's AR path and its front end, and
only there; the others only with the oldest ComfyUI (or ``--any-comfyui``). So each ComfyUI rewrites
only its own files:

    COMFYUI_PATH=/opt/comfyui/v0.27 .ci/venvs/comfyui-v0.27/bin/python tests/web/build_workflows.py

The HY-WorldPlay workflows (``WORLDPLAY_WORKFLOWS``: HunyuanVideo15ImageToVideo and DualCLIPLoader's
``hunyuan_video_15`` exist from v0.27 on) are built like the core ones, with a ComfyUI that has HunyuanVideo 1.5.
``--only NAME`` (repeatable) builds only the named workflows.

Every build ends with ``add_model_entries`` (workflow_specs.MODEL_SOURCES: each loader's ``properties.models``, what
ComfyUI's missing-models dialog reads). ``--models-only`` runs that step alone on the shipped files (no server, no
browser): what changed in MODEL_SOURCES reaches every file, the rest of each file stays as its last build wrote it.
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
if str(HERE.parents[1]) not in sys.path:  # jensen_testing (behind support.comfyui), after ComfyUI's folder
    sys.path.append(str(HERE.parents[1]))

from support.browser import (  # noqa: E402
    browser_skip_reason,
    launch_chromium,
    open_comfyui,
    write_frontend_settings,
)
from support.ci_skips import has_core_ar, has_hunyuan15  # noqa: E402
from support.comfyui import PACK_ROOT, ComfyServer, comfyui_version, find_comfyui, make_base_dir  # noqa: E402
from workflow_specs import (  # noqa: E402
    BUILD_JS,
    CORE_WORKFLOW_NAMES,
    WORKFLOWS,
    WORLDPLAY_WORKFLOW_NAMES,
    add_model_entries,
    write_placeholder_files,
)


def write_workflow(path: Path, data: dict) -> None:
    path.write_text(json.dumps(add_model_entries(data), indent=2, ensure_ascii=False) + "\n")


def models_only() -> int:
    for path in sorted((PACK_ROOT / "example_workflows").glob("*.json")):
        write_workflow(path, json.loads(path.read_text()))
        print(f"wrote the model entries of {path.relative_to(PACK_ROOT)}")
    return 0


def oldest_supported() -> tuple[int, ...]:
    """The minimum of ``requires-comfyui`` in pyproject.toml, e.g. (0, 3, 64)."""
    m = re.search(r'requires-comfyui\s*=\s*">=\s*([0-9.]+)"', (PACK_ROOT / "pyproject.toml").read_text())
    return tuple(int(x) for x in m.group(1).split("."))


def main() -> int:
    if "--models-only" in sys.argv[1:]:
        return models_only()
    reason = browser_skip_reason()
    comfy = find_comfyui()
    if reason or comfy is None:
        print(reason or "ComfyUI not found", file=sys.stderr)
        return 2
    version, oldest = comfyui_version(comfy), oldest_supported()
    specs = []
    newer = CORE_WORKFLOW_NAMES | WORLDPLAY_WORKFLOW_NAMES
    if version == oldest or "--any-comfyui" in sys.argv[1:]:
        specs += [spec for spec in WORKFLOWS if spec["name"] not in newer]
    else:
        print(
            f"ComfyUI {version} at {comfy}: the workflows of the Chunked AR sampler are built with the oldest "
            f"supported ComfyUI {oldest} and its front end, so they load on every supported version:\n  "
            "COMFYUI_PATH=/opt/comfyui/v0.3.64 .ci/venvs/comfyui-oldest/bin/python tests/web/build_workflows.py\n"
            "(--any-comfyui builds them anyway)",
            file=sys.stderr,
        )
    if has_core_ar(comfy):
        specs += [spec for spec in WORKFLOWS if spec["name"] in CORE_WORKFLOW_NAMES]
    else:
        print(
            f"ComfyUI {version} at {comfy} has no core AR path (comfy/ldm/wan/ar_model.py): the workflows on "
            "SamplerARVideo are built with ComfyUI v0.27+:\n  COMFYUI_PATH=/opt/comfyui/v0.27 .ci/venvs/comfyui-v0.27/bin/python "
            "tests/web/build_workflows.py",
            file=sys.stderr,
        )
    if has_hunyuan15(comfy):
        specs += [spec for spec in WORKFLOWS if spec["name"] in WORLDPLAY_WORKFLOW_NAMES]
    else:
        print(
            f"ComfyUI {version} at {comfy} has no HunyuanVideo 1.5: the HY-WorldPlay workflows are built with ComfyUI "
            "v0.27+ (as the core ones)",
            file=sys.stderr,
        )
    args = sys.argv[1:]
    only = {args[i + 1] for i, a in enumerate(args[:-1]) if a == "--only"}
    if only:
        specs = [spec for spec in specs if spec["name"] in only]
    if not specs:
        return 2
    from playwright.sync_api import sync_playwright

    out_dir = PACK_ROOT / "example_workflows"
    out_dir.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        base = make_base_dir(Path(tmp))
        write_frontend_settings(base)
        write_placeholder_files(base)
        with ComfyServer(comfy, base) as server, sync_playwright() as p:
            browser = launch_chromium(p)
            page = browser.new_page()
            open_comfyui(page, server.url)
            for spec in specs:
                if spec["name"] in newer:
                    # a fresh page for each: v0.27's front end finishes work of the previous graph late (a Load
                    # Image preview resized the node that took its id in the next graph)
                    page.close()
                    page = browser.new_page()
                    open_comfyui(page, server.url)
                data = page.evaluate(BUILD_JS, spec)
                data["id"] = str(uuid.uuid5(uuid.NAMESPACE_URL, f"comfyui-jensen-kv/{spec['name']}"))  # stable
                path = out_dir / f"{spec['name']}.json"
                write_workflow(path, data)
                print(f"wrote {path.relative_to(PACK_ROOT)}: {len(data['nodes'])} nodes, {len(data['links'])} links")
            browser.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
