"""example_workflows/ as ComfyUI's template browser shows it (issue 41, item 4), checked without a server.

The front end (1.27 in ComfyUI v0.3.64, 1.45 in v0.27, 1.49 in 0.33) titles a custom node pack's template with its
file name, uses the name with ``-`` and ``_`` as spaces as its description, shows ``<name>.jpg`` beside it as the
thumbnail, and keeps the server's order (its Alphabetical sort, 1.45+, compares the titles numerically). So: every
workflow has its picture and every picture its workflow, the names read as titles with a two-digit order, and the
two CPU demos come first and say so. ``tests/web/test_browser.py`` checks the same through a live front end.
"""

from __future__ import annotations

import json
import re

from PIL import Image
from support.pack import PACK_ROOT, load_tool

FOLDER = PACK_ROOT / "example_workflows"
CPU_DEMO = "runs on a CPU, no download"
#: a title and a URL path segment at once: no '/', '#', '?', '%', quotes or characters Windows refuses
TITLE = re.compile(r"^(\d\d) [A-Za-z0-9][A-Za-z0-9 ,.+\-]*[A-Za-z0-9]$")


def test_every_workflow_has_its_thumbnail_and_every_thumbnail_its_workflow():
    files = sorted(p.name for p in FOLDER.iterdir())
    workflows = {p.stem for p in FOLDER.glob("*.json")}
    thumbnails = {p.stem for p in FOLDER.glob("*.jpg")}
    assert workflows, FOLDER
    assert workflows - thumbnails == set(), "run: python tools/make_thumbnails.py"
    assert thumbnails - workflows == set(), "a thumbnail without its workflow: remove it"
    assert all(name.endswith((".json", ".jpg")) for name in files), files  # the folder ships whole
    assert not (PACK_ROOT / "workflows").exists(), "one folder of workflows: example_workflows/"


def test_thumbnails_are_small_square_jpegs():
    for path in sorted(FOLDER.glob("*.jpg")):
        assert path.stat().st_size < 60_000, f"{path.name}: {path.stat().st_size} bytes"
        with Image.open(path) as img:
            assert (img.format, img.size, img.mode) == ("JPEG", (400, 400), "RGB"), path.name


def test_names_read_as_titles_in_order_with_the_cpu_demos_first():
    stems = sorted(p.stem for p in FOLDER.glob("*.json"))
    for stem in stems:
        assert TITLE.match(stem), f"{stem!r}: a two-digit number, a space, then letters, digits and ' ,.+-'"
        assert len(stem) <= 56, f"{stem!r}: the card shows one line of the title"
    numbers = [int(TITLE.match(s).group(1)) for s in stems]
    assert numbers == list(range(1, len(stems) + 1)), numbers
    cpu = [s for s in stems if s.endswith(f" - {CPU_DEMO}")]
    assert cpu == stems[:2], cpu
    for stem in cpu:  # and their Note opens with it too
        wf = json.loads((FOLDER / f"{stem}.json").read_text(encoding="utf-8"))
        note = next(n["widgets_values"][0] for n in wf["nodes"] if n["type"] == "Note")
        assert CPU_DEMO in note.split("\n", 1)[0], stem


def test_the_script_draws_each_card_from_its_workflow(tmp_path):
    tool = load_tool("make_thumbnails")
    infos = {p.stem: tool.describe(p) for p in sorted(FOLDER.glob("*.json"))}
    assert [s for s, i in infos.items() if i["cpu"]] == sorted(infos)[:2]
    assert all(i["line"] and i["family"] and i["cache"] for i in infos.values()), infos
    demo = infos[sorted(infos)[0]]
    assert (demo["family"], demo["cache"]) == (
        "tiny AR model (bundled, 6M)",
        "A/B: full precision · INT2 · INT2 + Jensen",
    )
    assert infos["03 Self-Forcing text to video"]["cache"] == "INT2 K/V · group 32 · Hadamard + Jensen"
    assert infos["10 MAGI-1 4.5B distill text to video"]["family"] == "MAGI-1"
    assert infos["13 Core AR sampler, chunk-wise"]["newer"] and not infos["03 Self-Forcing text to video"]["newer"]
    # a distinct picture per workflow, drawn again here as the committed ones were
    path = FOLDER / f"{sorted(infos)[0]}.json"
    out = tool.write_thumbnail(path, tmp_path)
    with Image.open(out) as img:
        assert (img.format, img.size) == ("JPEG", (400, 400))
    digests = {(FOLDER / f"{s}.jpg").read_bytes() for s in infos}
    assert len(digests) == len(infos), "two workflows share a thumbnail"
