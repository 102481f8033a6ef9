"""The documentation holds together: every relative link and image resolves, the README stays short.

Checked files: README.md, CHANGELOG.md, docs/**/*.md, tools/README.md and models/tiny_ar/MODEL_CARD.md.
A relative link must name an existing file or folder; an anchor (``page.md#heading`` or ``#heading``)
must name a heading of the target page, spelled as GitHub spells heading anchors.
"""

from __future__ import annotations

import re
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
README_MAX_LINES = 250

_FENCE = re.compile(r"^\s*(```|~~~)")
_INLINE_CODE = re.compile(r"`+[^`]*`+")
# [text](target) and ![alt](target); the text may hold one level of brackets (an image inside a link)
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HTML_REF = re.compile(r"<(?:img|a)\b[^>]*\b(?:src|href)=\"([^\"]+)\"", re.IGNORECASE)
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def doc_files() -> list[Path]:
    files = [
        ROOT / "README.md",
        ROOT / "CHANGELOG.md",
        ROOT / "tools" / "README.md",
        ROOT / "models" / "tiny_ar" / "MODEL_CARD.md",
    ]
    return files + sorted((ROOT / "docs").rglob("*.md"))


def _prose_lines(text: str, keep_code: bool = False) -> list[tuple[int, str]]:
    """(line number, line) of every line outside fenced code blocks, inline code dropped unless ``keep_code``."""
    out, fence = [], False
    for no, line in enumerate(text.splitlines(), 1):
        if _FENCE.match(line):
            fence = not fence
            continue
        if not fence:
            out.append((no, line.replace("`", "") if keep_code else _INLINE_CODE.sub("", line)))
    return out


def links(text: str) -> list[tuple[int, str]]:
    """(line number, target) of every markdown link, image and HTML src/href outside code."""
    return [
        (no, m.group(1))
        for no, line in _prose_lines(text)
        for pattern in (_LINK, _HTML_REF)
        for m in pattern.finditer(line)
    ]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading anchor of a page, with GitHub's -1, -2 suffixes for repeated headings."""
    seen: dict[str, int] = {}
    out = set()
    for _, line in _prose_lines(text, keep_code=True):
        m = _HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def broken_links(path: Path) -> list[str]:
    """'file:line: target (why)' for every relative link of ``path`` that does not resolve."""
    text = path.read_text()
    problems = []
    for no, target in links(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):  # https:, mailto:, ...
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        where = f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{no}: {target}"
        if not dest.exists():
            problems.append(f"{where} (no such file)")
        elif anchor and dest.is_file() and dest.suffix == ".md" and anchor not in anchors(dest.read_text()):
            problems.append(f"{where} (no heading #{anchor})")
    return problems


def test_every_relative_link_and_image_in_the_docs_resolves():
    files = doc_files()
    assert all(f.is_file() for f in files), [str(f) for f in files if not f.is_file()]
    assert len(files) > 10  # the README, the changelog, the tools page, the model card and the docs pages
    problems = [p for f in files for p in broken_links(f)]
    assert problems == []


def test_the_link_check_finds_what_is_broken(tmp_path):
    (tmp_path / "there.md").write_text("# A heading, with `code` (v0.27+)\n\n## Twice\n\n## Twice\n")
    (tmp_path / "img.png").write_bytes(b"png")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n"
        "[ok](there.md) [ok](there.md#a-heading-with-code-v027) [ok](there.md#twice-1) ![ok](img.png)\n"
        "[ok](#page) [web](https://example.com/missing.md) `[code](missing.md)`\n"
        "```\n[in a fence](missing-in-fence.md)\n```\n"
        "[gone](missing.md) ![gone](missing.png) [bad anchor](there.md#nowhere) [bad](#nowhere)\n"
        '<img src="missing.svg">\n'
    )
    problems = broken_links(page)
    assert [p.split(": ", 1)[1] for p in problems] == [
        "missing.md (no such file)",
        "missing.png (no such file)",
        "there.md#nowhere (no heading #nowhere)",
        "#nowhere (no heading #nowhere)",
        "missing.svg (no such file)",
    ]
    assert ":8: missing.md" in problems[0] and ":9: missing.svg" in problems[-1]  # line numbers count fences


def test_github_heading_anchors():
    assert slug("On ComfyUI's own AR sampler (v0.27+)") == "on-comfyuis-own-ar-sampler-v027"
    assert anchors("# Nodes (category `jensen_kv`)\n") == {"nodes-category-jensen_kv"}
    assert slug("Long videos: change the prompt, continue later, extend a clip") == (
        "long-videos-change-the-prompt-continue-later-extend-a-clip"
    )
    assert anchors("# A\n```\n# not a heading\n```\n## A\n") == {"a", "a-1"}


def test_the_readme_fits_on_a_few_screens():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move detail to docs/"


def test_the_readme_names_the_two_commands_and_the_fast_lane():
    """The test command is the one .ci/run runs as its main run (tests/test_ci_run.py checks that side)."""
    text = (ROOT / "README.md").read_text()
    assert "python -m jensen_core demo" in text
    assert re.search(r"^pip install -e \"\.\[test\]\" && python -m pytest -q\s", text, re.MULTILINE)
    main_run = re.search(r'^MAIN_RUN = "([^"]+)"', (ROOT / "tests" / "test_ci_run.py").read_text(), re.MULTILINE)
    assert main_run and f"&& python {main_run.group(1)}  " in text  # the command CI's main run is checked against
    assert 'python -m pytest -q -m "not slow"' in text


def test_every_tool_has_an_entry_with_its_command():
    page = (ROOT / "tools" / "README.md").read_text()
    tools = sorted(p.name for p in (ROOT / "tools").glob("*.py"))
    assert tools
    for name in tools:
        assert f"python tools/{name}" in page, f"tools/README.md has no command for {name}"


def test_the_version_lives_in_pyproject_only():
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    import jensen_core

    assert jensen_core.__version__ == version
    assert f"## {version}" in (ROOT / "CHANGELOG.md").read_text()
    copies = [
        str(p.relative_to(ROOT))
        for p in (ROOT / "jensen_core").rglob("*.py")
        if re.search(r"__version__\s*=\s*[\"']\d", p.read_text())
    ]
    assert copies == [], f"a hard-coded version besides pyproject.toml: {copies}"


def test_the_version_is_read_from_pyproject(tmp_path):
    from jensen_core._version import read_version

    ours = tmp_path / "pyproject.toml"
    ours.write_text(
        '[build-system]\nrequires = []\n\n[project]\nname = "comfyui-jensen-kv"\nversion = "9.8.7"\n'
        '\n[tool.x]\nversion = "1.1.1"\n'
    )
    assert read_version(ours) == "9.8.7"
    other = tmp_path / "other.toml"  # another project's file beside the package is not ours
    other.write_text('[project]\nname = "something-else"\nversion = "9.8.7"\n')
    assert read_version(other) != "9.8.7"


def test_no_doc_calls_the_dropped_skyreels_fps_embedding_harmless():
    """SkyReels-V2 adds its fps embedding to every block's modulation (transformer.py:685-692): not harmless."""
    for path in doc_files():
        text = " ".join(path.read_text(encoding="utf-8").split())
        assert "the text-to-video path does not use it" not in text, path
        assert "the T2V path does not use it" not in text, path
    ref = " ".join((ROOT / "docs" / "reference-samplers.md").read_text(encoding="utf-8").split())
    assert "to every block's modulation" in ref and "experimental causal variant" in ref
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    assert "experimental causal variant" in readme and "fps embedding" in readme


def test_web_ui_doc_lists_every_shipped_workflow():
    """docs/web-ui.md's table names each file of example_workflows/ and no other (issue 41: it listed 15 of 18)."""
    doc = (ROOT / "docs" / "web-ui.md").read_text()
    listed = set(re.findall(r"^\| `(\d\d [^`]+)` \|", doc, flags=re.M))
    shipped = {p.stem for p in (ROOT / "example_workflows").glob("*.json")}
    assert listed == shipped, {"not in the doc": shipped - listed, "not shipped": listed - shipped}
