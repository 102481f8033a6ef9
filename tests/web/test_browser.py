"""The web extension and the workflows in the real front end: headless Chromium against a live ComfyUI.

One ComfyUI server (the pack, the test-only node pack, placeholder model files and a tiny Wan
checkpoint in a temporary base directory) and one browser page serve every test in this module.
Screenshots go to ``artifacts/browser/``.
"""

from __future__ import annotations

import json
import re
import time
import urllib.parse
from pathlib import Path

import pytest
from support.browser import (
    VIEWPORT,
    browser_skip_reason,
    launch_chromium,
    open_comfyui,
)
from support.comfyui import PACK_ROOT, TEST_NODES_DIR
from support.workflow_api import frontend_defaults
from workflow_specs import BUILD_JS, TINY_UNET, tiny_workflow, write_placeholder_files

from jensen_testing.planning import plan_by_fields

pytestmark = [pytest.mark.comfyui, pytest.mark.server, pytest.mark.browser, pytest.mark.slow]

ARTIFACTS = PACK_ROOT / "artifacts" / "browser"
WORKFLOW_DIR = PACK_ROOT / "example_workflows"
WORKFLOWS = sorted(WORKFLOW_DIR.glob("*.json"))
QUANT = "JensenKVQuantizeKVCache"
SAMPLERS = ("JensenKVChunkedARSampler", "JensenKVChunkedARSamplerSimple")
# the missing-nodes notice: the LoadWorkflowWarning dialog's title in comfyui-frontend-package 1.27 (ComfyUI
# v0.3.64), the start of the error toast "Some nodes are missing and need to be installed" in 1.45 (v0.27);
# Playwright's get_by_text matches either (a substring, case ignored)
MISSING_NODES_TITLE = "Some Nodes Are Missing"
#: 1.49's (ComfyUI 0.33's) toast for a workflow with errors: "Missing node: <type>" for one missing node, "N errors
#: found" for several errors (missing nodes or models)
ERRORS_FOUND = re.compile(r"^Missing node: |\b\d+ errors? found\b")


class UI:
    def __init__(self, page, server, base: Path, errors: list[str]):
        self.page, self.server, self.base, self.errors = page, server, base, errors

    def shot(self, name: str) -> Path:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / f"{name}.png"
        self.page.screenshot(path=str(path))
        return path

    def load(self, workflow: dict) -> None:
        self.page.evaluate("async (wf) => { await app.loadGraphData(wf); }", workflow)
        self.page.wait_for_timeout(300)

    def focus(self, node_type: str, scale: float = 1.0) -> None:
        """Zoom to 100% on the first node of this type (DOM widgets hide when zoomed far out)."""
        self.page.evaluate(
            """([t, scale]) => { const n = app.graph.nodes.find((n) => n.type === t);
                 app.canvas.ds.scale = scale; app.canvas.centerOnNode(n); app.canvas.setDirty(true, true); }""",
            [node_type, scale],
        )
        self.page.wait_for_timeout(300)

    def panel(self, node_type: str = QUANT, name: str = "jensen_kv_panel"):
        """The DOM element of the pack's panel on the first node of this type."""
        return self.page.evaluate_handle(
            """([t, name]) => app.graph.nodes.find((n) => n.type === t)?.widgets?.find((w) => w.name === name)?.element""",
            [node_type, name],
        ).as_element()

    def read_planner(self) -> dict:
        el = self.panel()
        assert el is not None, "no planner panel on Quantize KV Cache"

        def q(sel):
            return el.query_selector(f"[data-jkv='{sel}']")

        return {
            "bits_text": q("bits").text_content(),
            "effective_bits": float(q("bits").get_attribute("data-effective-bits") or "nan"),
            "compression": float(q("bits").get_attribute("data-compression") or "nan"),
            "warnings": q("warnings").text_content(),
            "bf16_bytes": int(q("bf16").get_attribute("data-bytes")) if q("bf16") else None,
            "quant_bytes": int(q("quant").get_attribute("data-bytes"))
            if q("quant") and q("quant").get_attribute("data-bytes")
            else None,
            "quant_text": q("quant").text_content() if q("quant") else None,
            "summary": q("planner-summary").text_content(),
            "measured": q("measured").text_content(),
        }

    def run(self, timeout: float = 600) -> dict:
        """Queue the loaded workflow with the Run button, as a user does: the server takes it without node errors and
        it finishes successfully; its history entry."""
        with self.page.expect_response(lambda r: r.url.endswith("/prompt") and r.request.method == "POST") as queued:
            self.page.get_by_role("button", name="Run").first.click()
        body = queued.value.json()
        assert queued.value.status == 200 and not body.get("node_errors"), body
        entry = self.server.wait_for_prompt(body["prompt_id"], timeout=timeout)
        assert entry["status"]["status_str"] == "success", (entry["status"], self.server.log_tail())
        return entry

    def wait_planner(self, predicate_js: str, timeout_ms: int = 10_000) -> dict:
        """Wait until ``predicate_js`` (a JS expression over ``el``, the panel) holds, then read the panel."""
        self.page.wait_for_function(
            f"""(t) => {{ const el = app.graph.nodes.find((n) => n.type === t)?.widgets
                         ?.find((w) => w.name === 'jensen_kv_panel')?.element; return !!el && ({predicate_js}); }}""",
            arg=QUANT,
            timeout=timeout_ms,
        )
        return self.read_planner()

    def set_widget(self, node_type: str, name: str, value) -> None:
        """Change a widget as the canvas does: new value, then the widget's callback."""
        self.page.evaluate(
            """([t, name, value]) => { const n = app.graph.nodes.find((n) => n.type === t);
                 const w = n.widgets.find((w) => w.name === name); w.value = value;
                 w.callback?.(w.value, app.canvas, n); app.graph.setDirtyCanvas(true, true); }""",
            [node_type, name, value],
        )

    def missing_nodes_dialog_shown(self) -> bool:
        """Whether the front end says the loaded workflow has missing nodes: 1.27 (v0.3.64) shows a dialog and
        1.45 (v0.27) a toast titled "Some Nodes Are Missing"; 1.49 (0.33) shows a "Missing node: <type>" toast, or
        "N errors found" for several errors (missing nodes or models; the tests' loaders have their placeholder
        files, so an error there is a missing node)."""
        return self.page.get_by_text(MISSING_NODES_TITLE).count() > 0 or self.page.get_by_text(ERRORS_FOUND).count() > 0

    def wait_missing_nodes_shown(self, timeout_ms: int = 10_000) -> None:
        self.page.get_by_text(MISSING_NODES_TITLE).or_(self.page.get_by_text(ERRORS_FOUND)).first.wait_for(
            timeout=timeout_ms
        )

    def show_missing_node_types(self) -> None:
        """Make the front end list the missing node types: 1.27's dialog lists them already; 1.45's toast opens
        the Workflow Overview panel ("Show missing nodes"), which lists them under a collapsed "Unknown pack";
        1.49's toast opens it with "View details", where "Missing Node Packs" lists them under "Unknown pack"."""
        show = self.page.get_by_role("button", name="Show missing nodes")
        if show.count():
            show.first.click()
            self.page.locator("div:has(> p:has-text('Unknown pack')) button[aria-label='Expand']").first.click()
            self.page.wait_for_timeout(300)
            return
        details = self.page.get_by_role("button", name="View details")
        if self.page.get_by_text(ERRORS_FOUND).count() and details.count():
            details.first.click()
            self.page.get_by_text("Missing Node Packs").first.wait_for(timeout=10_000)
            self.page.wait_for_timeout(300)

    def close_missing_nodes(self) -> None:
        """Close what :meth:`show_missing_node_types` left open (1.27: the dialog; 1.45 and 1.49: the side
        panel), then load an empty graph so no error toast stays."""
        if self.page.get_by_text("Missing Node Packs").count():
            self.page.get_by_role("button", name="Toggle properties panel").click()
            self.page.get_by_text("Missing Node Packs").first.wait_for(state="detached", timeout=10_000)
        else:
            self.page.keyboard.press("Escape")
        self.page.get_by_text(MISSING_NODES_TITLE).first.wait_for(state="detached", timeout=10_000)
        self.page.evaluate("async () => { app.graph.clear(); }")
        self.page.get_by_text(ERRORS_FOUND).first.wait_for(state="detached", timeout=10_000)

    def object_info(self, node_type: str) -> dict | None:
        if not hasattr(self, "_object_info"):
            self._object_info = {}
        if node_type not in self._object_info:
            self._object_info[node_type] = self.server.get(f"/object_info/{node_type}").get(node_type)
        return self._object_info[node_type]


@pytest.fixture(scope="module")
def ui(request):
    """A page of the session's shared server (``comfy_server``: its front-end settings skip the first-run
    gallery) in headless Chromium, with the workflows' placeholder files and a tiny checkpoint in its folders."""
    reason = browser_skip_reason()
    if reason:
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    server = request.getfixturevalue("comfy_server")
    base = server.base_dir
    write_placeholder_files(base)
    tiny_checkpoint = write_tiny_checkpoint(base)
    errors: list[str] = []
    with sync_playwright() as p:
        browser = launch_chromium(p)
        page = browser.new_page(viewport=VIEWPORT)
        page.on("pageerror", lambda e: errors.append(f"{e}\n{e.stack}"))
        page.on("console", lambda m: errors.append(f"console.{m.type}: {m.text}") if m.type == "error" else None)
        open_comfyui(page, server.url)
        ui = UI(page, server, base, errors)
        ui.tiny_checkpoint = tiny_checkpoint
        yield ui
        browser.close()


def write_tiny_checkpoint(base: Path) -> str | None:
    """A random tiny Wan that UNETLoader detects as wan2.1 (None when the test-node pack is absent)."""
    if not (TEST_NODES_DIR / "__init__.py").is_file():
        return None
    from support import comfyui as support_comfyui
    from support import wan_tiny

    support_comfyui.setup_inprocess_comfyui()
    wan_tiny.write_file(base / "models" / "diffusion_models" / TINY_UNET)
    return TINY_UNET


def our_errors(errors: list[str]) -> list[str]:
    """Page errors that come from this pack's extension (the front end logs unrelated ones here)."""
    return [e for e in errors if "jensen" in e.lower()]


# ---------------------------------------------------------------------------------------------- tests
def test_extension_is_served_and_its_routes_answer_through_the_page(ui):
    ext = ui.server.get("/extensions")
    assert "/extensions/comfyui-jensen-kv/jensen_kv.js" in ext
    body = ui.page.evaluate("""async () => {
        const { api } = await import('/scripts/api.js');
        const ok = await (await api.fetchApi('/jensen_kv/spec?key_bits=4&value_bits=4&group_size=64')).json();
        const bad = await api.fetchApi('/jensen_kv/plan?group_size=12');
        return { ok, status: bad.status, bad: await bad.json() };
    }""")
    assert body["ok"]["effective_bits"] == 4 + 24 / 64
    assert body["status"] == 400 and body["bad"]["param"] == "group_size"


def test_missing_node_dialog_is_detected(ui):
    """Positive control for the check below: a workflow with an unknown node does show the dialog."""
    wf = json.loads(WORKFLOWS[0].read_text())
    wf["nodes"][1]["type"] = "JensenKVNodeThatDoesNotExist"
    ui.load(wf)
    ui.wait_missing_nodes_shown()
    assert ui.missing_nodes_dialog_shown()
    ui.show_missing_node_types()
    assert ui.page.get_by_text("JensenKVNodeThatDoesNotExist").count() > 0
    ui.shot("00_missing_node_dialog_positive_control")
    ui.close_missing_nodes()


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.stem)
def test_workflow_loads_without_missing_nodes(ui, path):
    wf = json.loads(path.read_text())
    ui.load(wf)
    ui.page.wait_for_timeout(700)
    assert not ui.missing_nodes_dialog_shown(), f"{path.name}: the front end reports missing nodes"
    assert ui.page.get_by_text("Invalid workflow").count() == 0, f"{path.name}: fails the front end's schema check"
    ui.shot(f"01_loaded_{path.stem}")
    loaded = ui.page.evaluate("""() => app.graph.nodes.map((n) => ({ type: n.type, ok: n.type in LiteGraph.registered_node_types,
                                   widgets: (n.widgets ?? []).filter((w) => w.serialize !== false).map((w) => w.value) }))""")
    assert [n["type"] for n in loaded] == [n["type"] for n in wf["nodes"]]
    assert all(n["ok"] for n in loaded), [n["type"] for n in loaded if not n["ok"]]
    # the front end kept every widget value of the file (nothing reset as invalid, nothing shifted), and gave a
    # widget the node gained after the file was saved its default (v0.27's CreateVideo bit_depth), as
    # test_workflows.py's validator assumes
    for n_file, n_ui in zip(wf["nodes"], loaded):
        info = ui.object_info(n_file["type"])
        filled = list(frontend_defaults(n_file, info).values()) if info else []
        assert n_ui["widgets"] == (n_file.get("widgets_values") or []) + filled, n_file["type"]
    if any(n["type"] == QUANT for n in loaded):
        ui.wait_planner("el.querySelector('[data-jkv=quant]')")
        ui.focus(QUANT, 0.9)
        ui.shot(f"01_loaded_{path.stem}_quantize_node")
    assert not our_errors(ui.errors), our_errors(ui.errors)


def _plan_bytes(**kw):
    """The projection, straight from jensen_core (what the UI must display)."""
    from support.pack import load_pack_module

    from jensen_core import QuantSpec

    wan = load_pack_module("runtime.families.wan.family").GEOMETRY
    lf, lh, lw = wan.latent_shape(kw.pop("width"), kw.pop("height"), kw.pop("frames"))
    bits_k, bits_v, g = kw.pop("key_bits"), kw.pop("value_bits"), kw.pop("group_size")
    spec = lambda b: None if b == "off" else QuantSpec(bits=int(b), group_size=g, rotation="hadamard")  # noqa: E731
    p = plan_by_fields(
        latent_frames=lf,
        latent_height=lh,
        latent_width=lw,
        spec_k=spec(bits_k),
        spec_v=spec(bits_v),
        geometry=wan,
        **kw,
    )
    return p.bf16_bytes, p.quantized_bytes


def test_planner_follows_bits_group_size_and_window(ui):
    ui.load(json.loads((WORKFLOW_DIR / "03 Self-Forcing text to video.json").read_text()))
    ui.focus(QUANT)
    wan13 = dict(width=832, height=480, frames=81, chunk_frames=3, window_chunks=0, layers=30, heads=12, head_dim=128)
    r = ui.wait_planner("el.querySelector('[data-jkv=quant]')?.dataset.bytes")
    assert r["bits_text"].startswith("K 2.75 bits · V 2.75 bits → 5.82× smaller than BF16"), r["bits_text"]
    assert (r["bf16_bytes"], r["quant_bytes"]) == _plan_bytes(key_bits="2", value_bits="2", group_size=32, **wan13)
    assert r["warnings"] == ""
    print("\nplanner, Self-Forcing 832x480x81, INT2 g32:", r["summary"])
    ui.shot("02_planner_int2_g32")

    ui.set_widget(QUANT, "key_bits", "4")
    r = ui.wait_planner("el.querySelector('[data-jkv=bits]').textContent.includes('K 4.75 bits')")
    assert r["effective_bits"] == pytest.approx((4.75 + 2.75) / 2)
    assert (r["bf16_bytes"], r["quant_bytes"]) == _plan_bytes(key_bits="4", value_bits="2", group_size=32, **wan13)
    print("planner, K INT4 / V INT2:", r["summary"])

    ui.set_widget(QUANT, "group_size", "128")
    r = ui.wait_planner("el.querySelector('[data-jkv=bits]').textContent.includes('K 4.188 bits')")
    assert (r["bf16_bytes"], r["quant_bytes"]) == _plan_bytes(key_bits="4", value_bits="2", group_size=128, **wan13)
    print("planner, group 128:", r["summary"])
    ui.shot("03_planner_int4_int2_g128")

    ui.set_widget(QUANT, "group_size", "256")
    r = ui.wait_planner("el.querySelector('[data-jkv=warnings]').textContent.includes('does not divide')")
    assert "group_size 256 does not divide head_dim 128; use 8, 16, 32, 64 or 128" in r["warnings"]
    assert r["quant_bytes"] is None and "cannot run" in r["quant_text"]
    # the top line shows no ratio for a group size that cannot run
    assert "smaller than BF16" not in r["bits_text"] and "×" not in r["bits_text"], r["bits_text"]
    assert "cannot run" in r["bits_text"]
    assert ui.page.locator("[data-jkv=warnings]").first.is_visible()
    ui.shot("04_warning_group_size_does_not_divide_head_dim")

    ui.set_widget(QUANT, "group_size", "32")
    ui.set_widget("JensenKVChunkedARSampler", "window_chunks", 9)  # the video has 7 chunks
    r = ui.wait_planner("el.querySelector('[data-jkv=warnings]').textContent.includes('window of 9 chunks')")
    assert "not smaller than the video's 7 chunks" in r["warnings"]
    ui.focus(QUANT)
    ui.shot("05_warning_window_exceeds_video")

    ui.set_widget("JensenKVChunkedARSampler", "window_chunks", 2)
    r = ui.wait_planner("!el.querySelector('[data-jkv=warnings]').textContent.includes('window of')")
    assert (r["bf16_bytes"], r["quant_bytes"]) == _plan_bytes(
        key_bits="4", value_bits="2", group_size=32, **{**wan13, "window_chunks": 2}
    )

    # model preset from the planner's own select: Wan 14B
    el = ui.panel()
    el.query_selector("[data-jkv=preset]").select_option("wan2.1-14b")
    r = ui.wait_planner("el.querySelector('[data-jkv=in-layers]').value === '40'")
    assert (r["bf16_bytes"], r["quant_bytes"]) == _plan_bytes(
        key_bits="4", value_bits="2", group_size=32, **{**wan13, "window_chunks": 2, "layers": 40, "heads": 40}
    )
    print("planner, Wan 14B, window 2:", r["summary"])
    ui.shot("06_planner_wan14b_window2")

    # a bad planner value: the server's message (value and fix) shows on the node
    el.query_selector("[data-jkv=follow]").uncheck()
    width = el.query_selector("[data-jkv=in-width]")
    ui.page.wait_for_function("(w) => !w.disabled", arg=width)
    width.fill("5")
    width.press("Tab")
    r = ui.wait_planner("el.querySelector('[data-jkv=warnings]').textContent.includes('width=5')")
    assert "width=5 is out of range 16..16384; give the video width in pixels, e.g. width=832" in r["warnings"]
    ui.shot("06b_planner_bad_value_message")
    width.fill("832")
    width.press("Tab")
    ui.wait_planner("!el.querySelector('[data-jkv=warnings]').textContent.includes('width=5')")
    assert not our_errors(ui.errors), our_errors(ui.errors)


def test_planner_ranks_field_gives_one_gpus_bytes_and_all_gpus(ui):
    """ranks (Raylight's Ulysses degree): the rows are one GPU's heads' share; a row gives all GPUs together."""
    ui.load(json.loads((WORKFLOW_DIR / "03 Self-Forcing text to video.json").read_text()))
    ui.focus(QUANT)
    wan13 = dict(width=832, height=480, frames=81, chunk_frames=3, window_chunks=0, layers=30, heads=12, head_dim=128)
    ui.wait_planner("el.querySelector('[data-jkv=quant]')?.dataset.bytes")
    assert ui.panel().query_selector("[data-jkv=all-ranks]") is None
    ranks = ui.panel().query_selector("[data-jkv=in-ranks]")
    assert ranks.input_value() == "1"
    ranks.fill("4")
    ranks.press("Tab")
    r = ui.wait_planner("el.querySelector('[data-jkv=all-ranks]')?.dataset.bytes")
    per_rank = _plan_bytes(key_bits="2", value_bits="2", group_size=32, **wan13, ranks=4)
    one = _plan_bytes(key_bits="2", value_bits="2", group_size=32, **wan13)
    assert (r["bf16_bytes"], r["quant_bytes"]) == per_rank and 4 * per_rank[1] == one[1]
    total = ui.panel().query_selector("[data-jkv=all-ranks]")
    assert int(total.get_attribute("data-bytes")) == one[1] and "on 4 GPUs" in total.text_content()
    ranks.fill("5")  # 12 heads
    ranks.press("Tab")
    r = ui.wait_planner("el.querySelector('[data-jkv=warnings]').textContent.includes('5 ranks')")
    assert "12 heads do not divide by 5 ranks" in r["warnings"] and r["quant_bytes"] is None
    assert not our_errors(ui.errors), our_errors(ui.errors)


def test_planner_shows_the_k_qvg_auto_picks_for_the_chosen_chunks(ui):
    """method qvg with K auto (0, the default): the bits line names the K picked for the run's chunks, exactly."""
    ui.load(json.loads((WORKFLOW_DIR / "03 Self-Forcing text to video.json").read_text()))
    ui.focus(QUANT)
    ui.wait_planner("el.querySelector('[data-jkv=quant]')?.dataset.bytes")
    ui.set_widget(QUANT, "group_size", "64")
    ui.set_widget(QUANT, "method", "qvg")
    # Self-Forcing 480p: 3 latent frames of 52 x 30 tokens = 4,680 tokens per chunk -> K = 98, 2.773 bits
    r = ui.wait_planner("el.querySelector('[data-jkv=bits]').textContent.includes('K=98 (auto)')")
    assert r["bits_text"].startswith("K 2.773 bits QVG K=98 (auto) · V 2.773 bits QVG K=98 (auto)"), r["bits_text"]
    ui.set_widget("JensenKVChunkedARSampler", "chunk_frames", 1)  # 1,560 tokens per chunk -> K = 32
    r = ui.wait_planner("el.querySelector('[data-jkv=bits]').textContent.includes('K=32 (auto)')")
    assert r["bits_text"].startswith("K 2.766 bits QVG K=32 (auto)"), r["bits_text"]
    ui.set_widget(QUANT, "qvg_centroids", 256)  # an explicit K is shown as given
    r = ui.wait_planner("el.querySelector('[data-jkv=bits]').textContent.includes('K=256')")
    assert "(auto)" not in r["bits_text"], r["bits_text"]
    ui.shot("06c_planner_qvg_auto_k")
    assert not our_errors(ui.errors), our_errors(ui.errors)


def test_planner_counts_both_cfg_branches_for_skyreels(ui):
    ui.load(json.loads((WORKFLOW_DIR / "07 SkyReels-V2 DF with cfg 6.json").read_text()))
    ui.focus(QUANT)
    r = ui.wait_planner(
        "el.querySelector('[data-jkv=in-cfg_branches]')?.value === '2'"
        " && el.querySelector('[data-jkv=quant]')?.dataset.bytes"
    )
    assert (r["bf16_bytes"], r["quant_bytes"]) == _plan_bytes(
        key_bits="2",
        value_bits="2",
        group_size=32,
        width=960,
        height=544,
        frames=97,
        chunk_frames=5,
        window_chunks=0,
        layers=30,
        heads=12,
        head_dim=128,
        cfg_branches=2,
    )
    print("\nplanner, SkyReels-V2 DF 960x544x97, cfg 6:", r["summary"])
    ui.shot("07_planner_skyreels_cfg2")


@pytest.mark.hunyuan15
def test_planner_follows_hy_worldplay_with_both_streams_and_the_20_frame_context(ui):
    """The HY-WorldPlay workflow: connected to HY-WorldPlay AR Sampler the planner takes the HY-WorldPlay preset, the
    video's 832x480x125 from HunyuanVideo15ImageToVideo, and shows the 2 streams and the 20-frame context: 27.6 GB in
    BF16, 4.74 GB at INT2 g32 (benchmarks/worldplay_memory.py)."""
    ui.load(json.loads((WORKFLOW_DIR / "12 HY-WorldPlay image to video.json").read_text()))
    ui.focus(QUANT)
    r = ui.wait_planner(
        "el.querySelector('[data-jkv=streams]')?.dataset.streams === '2'"
        " && el.querySelector('[data-jkv=quant]')?.dataset.bytes"
    )
    assert (r["bf16_bytes"], r["quant_bytes"]) == (27_603_763_200, 4_744_396_800)
    row = ui.panel().query_selector("[data-jkv='streams']")
    assert row.get_attribute("data-context") == "20"
    assert "54 blocks × 2 attention streams = 108 cached layers" in row.text_content()
    assert ui.panel().query_selector("[data-jkv='state-file']") is None  # HY-WorldPlay saves no KV cache
    assert ui.panel().query_selector("[data-jkv='kv-heads']") is None  # as many K/V heads as query heads
    print("\nplanner, HY-WorldPlay 832x480x125:", r["summary"])
    ui.shot("09_planner_worldplay")


def test_planner_follows_magi1_ar_sampler_and_its_window(ui):
    """The MAGI-1 workflow: connected to MAGI-1 AR Sampler the planner takes the MAGI-1 4.5B preset the loader's file
    names (8 K/V heads), the sampler's 720x720x96 and its 6-frame chunks, and what its window 0 keeps: one finished
    chunk at window_size 4 (the key ranges 5,4,3,2 reach no further), three at window_size 1 (of the 3 a 4-chunk
    video has before its last)."""
    from support.pack import load_pack_module

    routes = load_pack_module("routes.ui")
    per_chunk = 6 * 45 * 45 * 34 * 2 * 8 * 128 * 2  # tokens of a chunk x layers x K and V x K/V heads x dim x BF16
    ui.load(json.loads((WORKFLOW_DIR / "10 MAGI-1 4.5B distill text to video.json").read_text()))
    ui.focus(QUANT)
    for window_size, held in ((4, 1), (1, 3)):
        ui.set_widget("JensenKVMagi1ARSampler", "window_size", window_size)
        r = ui.wait_planner(f"el.querySelector('[data-jkv=bf16]')?.dataset.bytes === '{held * per_chunk}'")
        assert f"{held} finished chunk(s) at window_size {window_size}" in r["warnings"]
        want = routes.plan_summary(
            {"preset": "magi1-4.5b", "width": "720", "height": "720", "frames": "96", "window_size": str(window_size),
             "key_bits": "2", "value_bits": "2", "group_size": "32", "rotation": "hadamard", "scale_format": "fp8_e4m3"}
        )  # fmt: skip
        assert r["quant_bytes"] == want["quantized_bytes"] and want["cached_chunks_peak"] == held
    assert ui.panel().query_selector("[data-jkv='state-file']") is None  # MAGI-1 saves no KV cache
    kv = ui.panel().query_selector("[data-jkv='kv-heads']")  # the bytes are 8 K/V heads', and the panel says so
    assert kv.get_attribute("data-kv-heads") == "8" and "8 of 24" in kv.text_content()
    print("\nplanner, MAGI-1 4.5B 720x720x96, window_size 1:", r["summary"])
    ui.shot("10_planner_magi1")


def test_planner_counts_age_tiers_to_the_byte(ui):
    """Precision by age on the node: the panel shows the tiers' bytes and average bits, as jensen_core plans them."""
    from jensen_core.tiers import AgeTiers

    ui.load(json.loads((WORKFLOW_DIR / "03 Self-Forcing text to video.json").read_text()))
    ui.focus(QUANT)
    wan13 = dict(width=832, height=480, frames=81, chunk_frames=3, window_chunks=0, layers=30, heads=12, head_dim=128)
    ui.wait_planner("el.querySelector('[data-jkv=quant]')?.dataset.bytes")
    ui.set_widget(QUANT, "recent_chunks_bits", "4")
    ui.set_widget(QUANT, "recent_chunks", 2)
    r = ui.wait_planner("el.querySelector('[data-jkv=tiers]')")
    tiers_text = ui.panel().query_selector("[data-jkv=tiers]").text_content()
    assert tiers_text.startswith("recent2@4: keys 2 2 2 2 4 4 · values 2 2 2 2 4 4 bits"), tiers_text
    assert (r["bf16_bytes"], r["quant_bytes"]) == _plan_bytes(
        key_bits="2", value_bits="2", group_size=32, tiers=AgeTiers(recent_bits=4, recent_chunks=2), **wan13
    )
    assert "tiers recent2@4 → 3.417 bits on average" in r["bits_text"], r["bits_text"]
    ui.shot("07b_planner_age_tiers")
    ui.set_widget(QUANT, "recent_chunks_key_bits", "off")  # values only: the keys stay at INT2
    r = ui.wait_planner("el.querySelector('[data-jkv=tiers]')?.textContent.startsWith('recent2@4k0')")
    tiers_text = ui.panel().query_selector("[data-jkv=tiers]").text_content()
    assert tiers_text.startswith("recent2@4k0: keys 2 2 2 2 2 2 · values 2 2 2 2 4 4 bits"), tiers_text
    assert (r["bf16_bytes"], r["quant_bytes"]) == _plan_bytes(
        key_bits="2", value_bits="2", group_size=32, tiers=AgeTiers(4, 2, recent_key_bits=0), **wan13
    )
    ui.set_widget(QUANT, "recent_chunks_key_bits", "same")
    ui.set_widget(QUANT, "recent_chunks_bits", "off")
    ui.wait_planner("!el.querySelector('[data-jkv=tiers]')")
    assert not our_errors(ui.errors), our_errors(ui.errors)


def test_queue_tiny_model_and_report_matches_planner(ui):
    """Run the tiny-model workflow from the UI: the report lands on the sampler and equals the plan."""
    if ui.tiny_checkpoint is None:
        pytest.skip(f"the test-only node pack {TEST_NODES_DIR} is absent (it provides the random conditioning)")
    t0 = time.monotonic()
    wf = ui.page.evaluate(BUILD_JS, tiny_workflow())  # build with LiteGraph, save as the UI would ...
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "tiny_workflow.json").write_text(json.dumps(wf, indent=1))
    ui.load(wf)  # ... and load it like a user's file
    assert not ui.missing_nodes_dialog_shown()

    # the planner reads the tiny model's dimensions (2 layers, 1 head of 128: no preset has them) from the loader's
    # file's header, and locks them (issue 41, item 1)
    ui.focus(QUANT)
    el = ui.panel()
    ui.wait_planner("el.querySelector('[data-jkv=model-file]')?.dataset.layers === '2'")
    for name, value in (("layers", "2"), ("heads", "1"), ("head_dim", "128")):
        box = el.query_selector(f"[data-jkv=in-{name}]")
        assert box.input_value() == value and box.is_disabled(), (name, box.input_value())
    planned = ui.wait_planner(
        "el.querySelector('[data-jkv=preset]').value === 'custom'"
        " && el.querySelector('[data-jkv=in-cfg_branches]').value === '2'"
        " && el.querySelector('[data-jkv=quant]')?.dataset.bytes"
    )
    expected = _plan_bytes(
        key_bits="2",
        value_bits="2",
        group_size=32,
        width=32,
        height=32,
        frames=13,
        chunk_frames=2,
        window_chunks=0,
        layers=2,
        heads=1,
        head_dim=128,
        cfg_branches=2,
    )
    assert (planned["bf16_bytes"], planned["quant_bytes"]) == expected
    ui.shot("08_tiny_planner_before_run")

    # queue it with the Run button and wait for the sampler's report to appear on the node
    with ui.page.expect_response(lambda r: r.url.endswith("/prompt") and r.request.method == "POST") as queued:
        ui.page.get_by_role("button", name="Run").first.click()
    body = queued.value.json()
    assert queued.value.status == 200 and not body.get("node_errors"), body
    ui.page.wait_for_function(
        """() => !!app.graph.nodes.find((n) => n.type === 'JensenKVChunkedARSampler')?.widgets
               ?.find((w) => w.name === 'jensen_kv_report')?.element?.querySelector('[data-jkv=report-text]')""",
        timeout=240_000,
    )
    entry = ui.server.wait_for_prompt(body["prompt_id"], timeout=120)
    assert entry["status"]["status_str"] == "success", (entry["status"], ui.server.log_tail())
    report = entry["outputs"][str(_node_id(wf, "JensenKVChunkedARSampler"))]["jensen_kv_report"][0]

    box = ui.panel("JensenKVChunkedARSampler", "jensen_kv_report").query_selector("[data-jkv=report-text]")
    shown = box.text_content()
    assert int(box.get_attribute("data-cache-bytes")) == report["cache_bytes"]
    assert shown.startswith(
        f"KV cache {report['cache_bytes'] / 2**10:.1f} KiB (BF16 {report['bf16_bytes'] / 2**10:.1f} KiB)"
    )
    assert "s/chunk:" in shown and len(report["seconds_per_chunk"]) == report["chunks"] == 2
    for secs in report["seconds_per_chunk"]:
        assert f"{secs:.2f}" in shown
    # the planner's projection is what the cache really held
    assert report["cache_bytes"] == planned["quant_bytes"], (report, planned)
    assert report["bf16_bytes"] == planned["bf16_bytes"]
    after = ui.wait_planner("el.querySelector('[data-jkv=measured]').dataset.bytes")
    assert int(ui.panel().query_selector("[data-jkv=measured]").get_attribute("data-bytes")) == report["cache_bytes"]
    print(f"\ntiny run ({_elapsed(t0)}): report on the sampler: {shown!r}")
    print(f"planner: {planned['summary']}; measured line: {after['measured']!r}")
    ui.focus("JensenKVChunkedARSampler")
    ui.shot("09_tiny_report_on_sampler")
    ui.focus(QUANT)
    ui.shot("10_tiny_planner_with_measured")
    assert not our_errors(ui.errors), our_errors(ui.errors)


def test_cpu_demo_planner_follows_the_bundled_model_and_agrees_with_the_run_to_the_byte(ui):
    """Issue 41, item 1: the shipped CPU demo opens its planner on the bundled model (tiny AR, 4 x 2 x 128), not on
    Wan 1.3B; after a run the measured bytes equal the plan's, and when they differ the planner says why."""
    demo = json.loads((WORKFLOW_DIR / "01 Tiny AR demo - runs on a CPU, no download.json").read_text())
    ui.load(demo)
    assert not ui.missing_nodes_dialog_shown()
    ui.focus(QUANT)
    planned = ui.wait_planner(
        "el.querySelector('[data-jkv=preset]').value === 'tiny-ar' && el.querySelector('[data-jkv=quant]')?.dataset.bytes"
    )
    el = ui.panel()
    dims = [el.query_selector(f"[data-jkv=in-{n}]").input_value() for n in ("layers", "heads", "head_dim")]
    assert dims == ["4", "2", "128"], dims
    # the dimensions are the loader's file's, read from its header (not the preset a file name points at)
    loader_file = next(n for n in demo["nodes"] if n["type"] == "UNETLoader")["widgets_values"][0]
    row = ui.wait_planner("el.querySelector('[data-jkv=model-file]')?.textContent")
    shown = el.query_selector("[data-jkv=model-file]")
    assert [shown.get_attribute(f"data-{k}") for k in ("layers", "heads", "head-dim")] == ["4", "2", "128"], row
    assert f"read from {loader_file}'s header" in shown.text_content(), shown.text_content()
    assert el.query_selector("[data-jkv=in-layers]").is_disabled()
    ui.run()
    after = ui.wait_planner("el.querySelector('[data-jkv=measured]')?.dataset.agrees", timeout_ms=60_000)
    measured = el.query_selector("[data-jkv=measured]")
    assert int(measured.get_attribute("data-bytes")) == planned["quant_bytes"], (after, planned)
    assert measured.get_attribute("data-agrees") == "true" and "as planned, to the byte" in after["measured"], after
    ui.shot("11_cpu_demo_planner_agrees")
    # the settings changed after the run: the measured line says why run and plan differ
    ui.set_widget(QUANT, "key_bits", "4")
    after = ui.wait_planner("el.querySelector('[data-jkv=measured]')?.dataset.agrees === 'false'")
    assert "not the plan's" in after["measured"] and "the run's keys were INT2" in after["measured"], after
    assert not our_errors(ui.errors), our_errors(ui.errors)


REPORT_TEXT_JS = """() => app.graph.nodes.map((n) => n.jensenKvReportBox?.querySelector('[data-jkv=report-text]'))
    .find(Boolean)?.textContent ?? null"""


def test_the_report_survives_a_workflow_tab_switch(ui):
    """Issue 41, item 6: run the CPU demo in its own tab, open another workflow in a second tab, switch back: the
    sampler's report is shown again (the front end restores the outputs it keeps with the tab, the report among
    them), not the empty "run the workflow" line."""
    demo = json.loads((WORKFLOW_DIR / "01 Tiny AR demo - runs on a CPU, no download.json").read_text())
    for node in demo["nodes"]:  # a seed of its own: the first run executes (another test may have run seed 42)
        if node["type"] in SAMPLERS:
            node["widgets_values"][0] = 4141
    other = json.loads((WORKFLOW_DIR / "03 Self-Forcing text to video.json").read_text())
    ui.page.evaluate("async (wf) => { await app.loadGraphData(wf, true, true, 'jkv_report_demo'); }", demo)
    ui.page.wait_for_timeout(500)
    ui.run()
    ui.page.wait_for_function(f"() => !!({REPORT_TEXT_JS})()", timeout=60_000)
    shown = ui.page.evaluate(REPORT_TEXT_JS)
    assert shown.startswith("KV cache ") and "chunks" in shown, shown
    ui.page.evaluate("async (wf) => { await app.loadGraphData(wf, true, true, 'jkv_report_other'); }", other)
    ui.page.wait_for_timeout(500)
    assert ui.page.evaluate(REPORT_TEXT_JS) is None  # the other tab has no report of its own
    ui.page.get_by_text("jkv_report_demo").first.click()  # the demo's workflow tab
    # leave the tab: hovering it opens a preview popover (1.45) over the Run button
    ui.page.mouse.move(VIEWPORT["width"] // 2, VIEWPORT["height"] // 2)
    ui.page.locator(".workflow-popover-fade").first.wait_for(state="detached", timeout=10_000)
    ui.page.wait_for_function(f"() => !!({REPORT_TEXT_JS})()", timeout=20_000)
    assert ui.page.evaluate(REPORT_TEXT_JS) == shown
    ui.shot("12_report_after_tab_switch")
    # a cached rerun (the same prompt, every node cached) brings the report to a fresh copy of the workflow too,
    # where ComfyUI resends a non-output node's ui (has_intermediate_output, v0.27+; v0.3.64's /object_info has no
    # such field, and its cached rerun runs nothing upstream of the output node)
    knows = "has_intermediate_output" in ui.object_info("KSampler")
    for sampler in SAMPLERS:
        assert ui.object_info(sampler).get("has_intermediate_output") is (True if knows else None), sampler
    assert not our_errors(ui.errors), our_errors(ui.errors)
    if not knows:
        return
    ui.page.evaluate("async (wf) => { await app.loadGraphData(wf, true, true, 'jkv_report_again'); }", demo)
    ui.page.wait_for_timeout(500)
    assert ui.page.evaluate(REPORT_TEXT_JS) is None
    with ui.page.expect_response(lambda r: r.url.endswith("/prompt") and r.request.method == "POST") as queued:
        ui.page.get_by_role("button", name="Run").first.click()
    ui.server.wait_for_prompt(queued.value.json()["prompt_id"], timeout=600)
    ui.page.wait_for_function(f"() => !!({REPORT_TEXT_JS})()", timeout=20_000)
    assert ui.page.evaluate(REPORT_TEXT_JS) == shown
    assert not our_errors(ui.errors), our_errors(ui.errors)


def _template_module(ui) -> str:
    """This pack's key in ``/api/workflow_templates`` (its folder under custom_nodes)."""
    listed = ui.server.get("/api/workflow_templates")
    return next(k for k in listed if k.endswith("comfyui-jensen-kv"))


#: the sort the template browser keeps (1.45+, ComfyUI v0.27 and 0.33; 1.27 has none and keeps the server's order)
SORT_SETTING = "Comfy.Templates.SortBy"
#: whether a card shows its picture (the front end loads it when the card scrolls into view, through a blob URL)
CARD_PICTURE_SHOWN_JS = """(n) => { const img = document.querySelector(`[data-testid="template-workflow-${n}"] img`);
    return !!img && img.complete && img.naturalWidth > 0; }"""


def _template_cards(page, names: list[str]) -> dict[str, str]:
    """The cards of ``names`` the template browser shows, in its order, with their text; each card is scrolled into
    view and waited for until its picture shows (1.27 renders the cards near the view only, 1.45 and 1.49 load the
    pictures of those in view)."""
    seen: dict[str, str] = {}
    idle = 0
    while idle < 4 and len(seen) < len(names):
        cards = page.eval_on_selector_all(
            "[data-testid^='template-workflow-']",
            "(els) => els.map((e) => [e.dataset.testid.slice('template-workflow-'.length), e.innerText])",
        )
        new = [(n, text) for n, text in cards if n in names and n not in seen]
        for name, text in new:
            seen[name] = text
            page.locator(f'[data-testid="template-workflow-{name}"]').scroll_into_view_if_needed()
            page.wait_for_function(f"() => ({CARD_PICTURE_SHOWN_JS})({json.dumps(name)})", timeout=15_000)
        idle = 0 if new else idle + 1
        if cards:
            last = page.locator(f'[data-testid="template-workflow-{cards[-1][0]}"]')
            last.scroll_into_view_if_needed()
            last.hover()
            page.mouse.wheel(0, 400)
        page.wait_for_timeout(300)
    return seen


def test_template_browser_shows_each_workflow_titled_with_its_thumbnail_and_no_404(ui):
    """Issue 41 item 4, as a user meets it: ComfyUI's template browser lists example_workflows/ under the pack,
    each card titled with its file name and showing ``<name>.jpg`` (the URL the front end builds:
    ``/api/workflow_templates/<pack>/<name>.jpg``), the two CPU demos first where the browser sorts (1.45+: its
    Alphabetical sort compares the titles numerically; 1.27 shows the server's order, which is the file system's),
    the first card loads its workflow, every template's JSON the page fetches is the file the other tests check,
    and no request for the pack's templates fails: no 404 in the console."""
    module, page = _template_module(ui), ui.page
    names = sorted(p.stem for p in WORKFLOWS)
    assert [n for n in names if n.endswith("runs on a CPU, no download")] == names[:2]
    failed: list[str] = []
    console: list[str] = []
    served: list[str] = []  # paths of the pack's templates the page fetched

    def on_response(r):
        if r.status >= 400:
            failed.append(f"{r.status} {r.url}")
        elif "/workflow_templates/" in r.url:
            served.append(urllib.parse.unquote(urllib.parse.urlparse(r.url).path))

    on_failed = lambda r: failed.append(f"failed {r.url}: {r.failure}")  # noqa: E731
    on_console = lambda m: console.append(f"{m.text} @ {m.location.get('url')}") if m.type == "error" else None  # noqa: E731
    page.on("response", on_response)
    page.on("requestfailed", on_failed)
    page.on("console", on_console)
    sortable = page.evaluate(f"() => app.extensionManager.setting.get('{SORT_SETTING}') !== undefined")
    try:
        if sortable:
            page.evaluate(
                f"async () => {{ await app.extensionManager.setting.set('{SORT_SETTING}', 'alphabetical'); }}"
            )
        page.evaluate("async () => { await app.extensionManager.command.execute('Comfy.BrowseTemplates'); }")
        nav = page.get_by_text(module, exact=True).first
        if not nav.is_visible():  # 1.45 / 1.49: the pack is an item of the collapsed "Extensions" group
            nav.wait_for(state="attached", timeout=30_000)
            if not nav.is_visible():
                page.get_by_text("Extensions", exact=True).first.click()
        nav.click()
        first = page.locator(f'[data-testid="template-workflow-{names[0]}"]')
        first.wait_for(timeout=30_000)
        shown = _template_cards(page, names)  # name -> the card's text, in the order shown
        assert sorted(shown) == names, {"missing": set(names) - set(shown), "shown": list(shown)}
        if sortable:
            assert list(shown) == names, list(shown)
        for name, text in shown.items():  # the title on each card is its file name
            assert name in " ".join(text.split()), (name, text)
        missing = [f for f in failed if "/workflow_templates" in f]  # a missing picture: a 404 here
        assert not missing, missing
        pictures = {f"/api/workflow_templates/{module}/{n}.jpg" for n in names}
        assert pictures <= set(served), sorted(pictures - set(served))  # the URL the front end builds
        first.scroll_into_view_if_needed()
        page.wait_for_function(f"() => ({CARD_PICTURE_SHOWN_JS})({json.dumps(names[0])})", timeout=15_000)
        page.wait_for_timeout(1000)  # the pictures fade in
        ui.shot("06_template_browser")
        first.click()  # the front end fetches the template and loads it
        wf = json.loads((WORKFLOW_DIR / f"{names[0]}.json").read_text())
        page.wait_for_function(f"() => app.graph.nodes.length === {len(wf['nodes'])}", timeout=30_000)
        page.wait_for_timeout(500)
        assert not ui.missing_nodes_dialog_shown()
        assert page.evaluate("() => app.graph.nodes.map((n) => n.type)") == [n["type"] for n in wf["nodes"]]
        ui.shot("06_template_browser_loaded_the_cpu_demo")
        fetched = page.evaluate(
            """async ([module, names]) => { const { api } = await import('/scripts/api.js'); const out = {};
                 for (const n of names) {
                   const base = api.apiURL(`/workflow_templates/${module}/${n}`);
                   const j = await fetch(`${base}.json`), p = await fetch(`${base}.jpg`);
                   out[n] = [j.status, j.ok ? await j.json() : null, p.status, p.headers.get('content-type')];
                 } return out; }""",
            [module, names],
        )
        for name in names:
            status, body, picture, kind = fetched[name]
            assert (status, picture, kind) == (200, 200, "image/jpeg"), (name, fetched[name][0], picture, kind)
            assert body == json.loads((WORKFLOW_DIR / f"{name}.json").read_text()), name
    finally:
        page.remove_listener("response", on_response)
        page.remove_listener("requestfailed", on_failed)
        page.remove_listener("console", on_console)
        if sortable:
            page.evaluate(f"async () => {{ await app.extensionManager.setting.set('{SORT_SETTING}', 'default'); }}")
        page.keyboard.press("Escape")
        page.evaluate("async () => { app.graph.clear(); }")
    ours = [f for f in failed if "/workflow_templates" in f]
    assert not ours, ours
    assert not [c for c in console if "workflow_templates" in c or "404" in c], console
    others = [f for f in failed if f not in ours]
    if others:
        print("\nfailed requests of the front end itself (not the pack's):", others)


def _node_id(wf: dict, node_type: str) -> int:
    return next(n["id"] for n in wf["nodes"] if n["type"] == node_type)


def test_no_errors_from_the_extension(ui):
    assert not our_errors(ui.errors), our_errors(ui.errors)


def _elapsed(t0: float) -> str:
    return f"{time.monotonic() - t0:.1f} s"
