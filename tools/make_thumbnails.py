"""Draw the template browser's thumbnail of each shipped workflow: ``example_workflows/<name>.jpg``.

    python tools/make_thumbnails.py            # every example_workflows/*.json
    python tools/make_thumbnails.py --out DIR  # write elsewhere (the test draws into a temporary folder)

ComfyUI's front end (1.27 in ComfyUI v0.3.64, 1.45 in v0.27, 1.49 in 0.33) shows a custom node pack's
``example_workflows/<name>.json`` as a card titled ``<name>`` with the picture
``/api/workflow_templates/<pack>/<name>.jpg``: a missing picture is a 404 in the browser console and a broken image.

Each card is read off its workflow, so it stays true when the workflow changes: the number and title (the file
name), the first line of the workflow's Note, the model family (from the loader nodes), the cache (bits, group
size and rotation of Quantize KV Cache, and whether Jensen Bias Correction follows it; an A/B when the workflow
has several samplers), which sampler runs it (the pack's or ComfyUI's own AR sampler, v0.27+), and a green
"runs on a CPU, no download" band on the demos whose name says so. 400 x 400 JPEG, about 20 KB.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = ROOT / "example_workflows"
SIZE = 400
QUALITY = 85
MAX_BYTES = 60_000
CPU_DEMO = "runs on a CPU, no download"

#: (node type that says so, family shown, card colour); the first match wins, Wan 2.1 otherwise
FAMILIES = (
    ("JensenKVTinyARPrompt", "tiny AR model (bundled, 6M)", (22, 101, 52)),
    ("JensenKVLoadMagi1", "MAGI-1", (110, 48, 120)),
    ("JensenKVLoadLingBot", "LingBot-World 2.0 (Wan 2.1)", (30, 90, 140)),
    ("JensenKVLoadWorldPlay", "HY-WorldPlay (HunyuanVideo 1.5)", (150, 70, 30)),
)
WAN = ("Wan 2.1", (40, 56, 110))
#: nodes of ComfyUI's own AR sampler and of HunyuanVideo 1.5: ComfyUI v0.27 or later
NEWER_COMFYUI = {"SamplerARVideo", "EmptyARVideoLatent", "ARVideoI2V", "JensenKVLoadWorldPlay"}
SAMPLERS = {
    "JensenKVChunkedARSampler",
    "JensenKVChunkedARSamplerSimple",
    "JensenKVMagi1ARSampler",
    "JensenKVLingBotARSampler",
    "JensenKVWorldPlayARSampler",
    "SamplerCustomAdvanced",
}
FONT_DIRS = ("/usr/share/fonts/truetype/dejavu", "/usr/share/fonts/dejavu", "/Library/Fonts", "C:/Windows/Fonts")


def font(size: int, bold: bool = False) -> ImageFont.ImageFont:
    names = ("DejaVuSans-Bold.ttf", "arialbd.ttf") if bold else ("DejaVuSans.ttf", "arial.ttf")
    for d in FONT_DIRS:
        for name in names:
            if (Path(d) / name).is_file():
                return ImageFont.truetype(str(Path(d) / name), size)
    return ImageFont.load_default(size)


def describe(path: Path) -> dict:
    """What the card says, read off the workflow file."""
    wf = json.loads(path.read_text(encoding="utf-8"))
    nodes = wf["nodes"]
    types = {n["type"] for n in nodes}
    number, _, title = path.stem.partition(" ")
    cpu = title.endswith(f" - {CPU_DEMO}")
    title = title.removesuffix(f" - {CPU_DEMO}")
    note = next((n["widgets_values"][0] for n in nodes if n["type"] in ("Note", "MarkdownNote")), "")
    line = note.split("\n", 1)[0].strip()
    if CPU_DEMO in line.partition(": ")[0]:  # the band at the bottom says it
        line = line.partition(": ")[2]
    family, colour = next(((f, c) for t, f, c in FAMILIES if t in types), WAN)
    quant = next((n["widgets_values"] for n in nodes if n["type"] == "JensenKVQuantizeKVCache"), None)
    cache = "full-precision cache"
    if quant:
        k, v, group, rotation = quant[:4]
        bits = f"INT{k} K/V" if k == v else f"INT{k} K · INT{v} V"
        cache = f"{bits} · group {group}" + (" · Hadamard" if rotation == "hadamard" else "")
        if "JensenKVBiasCorrection" in types:
            cache += " + Jensen"
    samplers = sum(n["type"] in SAMPLERS for n in nodes)
    if samplers > 1:
        cache = f"A/B: full precision · INT{quant[0]} · INT{quant[0]} + Jensen"
    sampler = "ComfyUI's AR sampler (v0.27+)" if "SamplerARVideo" in types else "the pack's AR sampler"
    return {
        "number": number,
        "title": title,
        "line": line,
        "family": family,
        "colour": colour,
        "cache": cache,
        "sampler": sampler,
        "cpu": cpu,
        "newer": bool(NEWER_COMFYUI & types),
    }


def _wrap(draw: ImageDraw.ImageDraw, text: str, f, width: int, max_lines: int) -> list[str]:
    """Greedy word wrap to ``width`` pixels, at most ``max_lines`` lines (the last one cut with an ellipsis)."""
    lines: list[str] = []
    for word in text.split():
        if lines and draw.textlength(f"{lines[-1]} {word}", font=f) <= width:
            lines[-1] += f" {word}"
        else:
            lines.append(word)
    if len(lines) > max_lines:
        lines = lines[:max_lines]
        while draw.textlength(lines[-1] + " …", font=f) > width and " " in lines[-1]:
            lines[-1] = lines[-1].rsplit(" ", 1)[0]
        lines[-1] += " …"
    return lines


def draw_card(info: dict) -> Image.Image:
    img = Image.new("RGB", (SIZE, SIZE), info["colour"])
    d = ImageDraw.Draw(img)
    pad, width = 24, SIZE - 48
    white, soft = (255, 255, 255), (220, 226, 240)
    # the top left stays plain: 1.45 and 1.49 lay a "Node graph" badge over it (the title under the card has the
    # number)
    d.text((SIZE - pad, 24), f"jensen-kv  {info['number']}", font=font(20, bold=True), fill=soft, anchor="ra")
    y = 78
    f = font(30, bold=True)
    for line in _wrap(d, info["title"], f, width, 3):
        d.text((pad, y), line, font=f, fill=white)
        y += 36
    y += 8
    f = font(17)
    for line in _wrap(d, info["line"], f, width, 3):
        d.text((pad, y), line, font=f, fill=soft)
        y += 22
    # the facts, on a darker band at the bottom
    band_top = SIZE - (150 if info["cpu"] else 112)
    d.rectangle((0, band_top, SIZE, SIZE), fill=tuple(int(c * 0.55) for c in info["colour"]))
    y = band_top + 12
    f = font(17, bold=True)
    for text in (info["family"], *_wrap(d, info["cache"], font(17), width, 2)[:2], info["sampler"]):
        d.text((pad, y), text, font=f if text == info["family"] else font(17), fill=white)
        y += 23
    if info["cpu"]:
        d.rectangle((0, SIZE - 40, SIZE, SIZE), fill=(46, 160, 67))
        d.text((SIZE // 2, SIZE - 20), CPU_DEMO, font=font(20, bold=True), fill=white, anchor="mm")
    elif info["newer"]:
        d.text((SIZE - pad, 50), "ComfyUI v0.27+", font=font(17, bold=True), fill=(255, 214, 102), anchor="ra")
    return img


def write_thumbnail(path: Path, out_dir: Path) -> Path:
    target = out_dir / f"{path.stem}.jpg"
    draw_card(describe(path)).save(target, "JPEG", quality=QUALITY, optimize=True, progressive=False)
    size = target.stat().st_size
    if size > MAX_BYTES:
        raise SystemExit(f"{target.name}: {size} bytes, over {MAX_BYTES}: lower QUALITY or simplify the card")
    return target


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=WORKFLOWS, help="folder for the .jpg files (default: beside the JSON)")
    p.add_argument("workflows", nargs="*", type=Path, help="workflow files (default: every example_workflows/*.json)")
    args = p.parse_args(argv)
    paths = args.workflows or sorted(WORKFLOWS.glob("*.json"))
    args.out.mkdir(parents=True, exist_ok=True)
    for path in paths:
        target = write_thumbnail(path, args.out)
        print(f"{target.stat().st_size:>6} B  {target}")
    if not args.workflows and args.out == WORKFLOWS:
        stale = {p.stem for p in WORKFLOWS.glob("*.jpg")} - {p.stem for p in paths}
        for stem in sorted(stale):
            print(f"no workflow for {stem}.jpg: remove it", file=sys.stderr)
        return 1 if stale else 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
