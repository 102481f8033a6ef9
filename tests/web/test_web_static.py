"""Static checks of the web extension: it parses, uses the front-end API it should, and holds no formula."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from support.comfyui import PACK_ROOT

JS = PACK_ROOT / "web" / "jensen_kv.js"


def source() -> str:
    return JS.read_text()


def test_root_module_points_comfyui_at_the_web_folder():
    text = (PACK_ROOT / "__init__.py").read_text()
    assert 'WEB_DIRECTORY = "./web"' in text
    assert sorted(p.name for p in (PACK_ROOT / "web").glob("*.js")) == ["jensen_kv.js"]


def test_uses_the_frontend_shims_and_the_routes():
    src = source()
    assert 'import { app } from "../../scripts/app.js";' in src
    assert 'import { api } from "../../scripts/api.js";' in src
    assert "app.registerExtension(" in src
    for route in ("/jensen_kv/options", "/jensen_kv/spec", "/jensen_kv/plan"):
        assert route in src
    assert "jensen_kv_report" in src  # the sampler's ui key (nodes/common.py UI_REPORT_KEY)


def test_no_second_copy_of_the_formula_in_js():
    """Bits, bytes and tokens come from the server; the JS may only format them."""
    src = re.sub(r"//.*", "", source())
    forbidden = {
        "arithmetic on group size": r"group_size\s*\)?\s*[-+*/]|[-+*/]\s*\(?\s*[\w.]*group_size",
        "scale / zero bit counts": r"\b(scale_bits|zero_bits)\b\s*[-+*/]",
        "bits arithmetic": r"\bbits\s*[-+*/]\s*\w",
        "head_dim / layers / heads products": r"\b(head_dim|layers|heads)\s*\*\s*\w|\w\s*\*\s*(head_dim|layers|heads)\b",
        "Wan latent strides": r"/\s*(4|8|16)\b|\*\s*(4|8)\b",
    }
    for what, pattern in forbidden.items():
        hits = re.findall(pattern, src)
        assert not hits, f"web/jensen_kv.js computes {what} ({hits}); ask the server (routes/ui.py) instead"


def test_javascript_parses_as_an_es_module():
    node = shutil.which("node")
    if node is None:
        pytest.skip("Node.js not installed (the browser test loads the extension anyway)")
    r = subprocess.run([node, "--experimental-default-type=module", "--check", str(JS)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


HELP_PAGES = {
    "JensenKVQuantizeKVCache": "Quantize KV Cache",
    "JensenKVBiasCorrection": "Jensen Bias Correction",
    "JensenKVChunkedARSampler": "Chunked AR Video Sampler",
}


def test_the_three_main_nodes_have_a_help_page_where_the_front_end_looks():
    """ComfyUI's front end (1.2x+, ComfyUI 0.33) asks ``/extensions/<pack>/docs/<node id>/<locale>.md``, then
    ``/extensions/<pack>/docs/<node id>.md``: ``web/docs/<node id>.md`` (served from WEB_DIRECTORY)."""
    for node_id, title in HELP_PAGES.items():
        page = PACK_ROOT / "web" / "docs" / f"{node_id}.md"
        text = page.read_text(encoding="utf-8")
        assert text.startswith(f"# {title}\n"), page
        assert len(text) > 600
    jensen = (PACK_ROOT / "web" / "docs" / "JensenKVBiasCorrection.md").read_text(encoding="utf-8")
    assert "sinh" in jensen and "24" in jensen  # the maths the tooltip left out lives here
