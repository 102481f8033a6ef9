"""Issue 41 item 3: what ComfyUI's missing-models dialog shows for each shipped workflow when its model files are
absent (headless Chromium against the session's shared server, which holds none of them in this module: the
placeholder files the other browser tests write are removed after their module, ``comfy_server``).

What the front end does with the workflows' model entries (``properties.models`` {name, url, directory}):

- comfyui-frontend-package 1.45 (ComfyUI v0.27) and 1.49 (0.33) scan every combo widget whose value looks like a
  model file (.safetensors, ...) and is not among its options; the folder is the one the "model to node" registry
  (Pinia store ``modelToNode``) gives the node type (core's loaders only), else the one of a model entry of that
  name; the URL is the entry's. The Errors panel lists them under "Missing Models" with the folder (``Unknown``
  without one) and a Download button where there is a URL. The web extension registers the pack's loaders with
  that registry (``web/jensen_kv.js``: ``LOADER_FOLDERS``), so the folder shows even where an entry is absent
  (every shipped workflow's files have one: the test asserts each found file's URL and folder).
- 1.27 (ComfyUI v0.3.64) reads only the entries with a URL, checks each against its folder's listing and shows the
  missing ones in the "Missing Models" dialog as "<folder> / <name>" with a Download button; node types play no
  part, and a file with no entry is not listed.
- Every version reads only the entries whose name a widget of the node shows ("selected" models): the second
  shard of MAGI-1's pair (workflow_specs.COMPANIONS) has its entry on the loader for the record, but no dialog lists
  it; the Note names it, and Load MAGI-1 Model names it with the way on when only the first is there.

The HY-WorldPlay and core-AR workflows are deselected against v0.3.64 with the other ``hunyuan15`` / ``core_ar``
tests (tests/web/conftest.py); every other workflow runs on every version.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from support.browser import VIEWPORT, browser_skip_reason, launch_chromium, open_comfyui
from support.comfyui import PACK_ROOT
from workflow_specs import BUNDLED_MODELS, MODEL_FILES, MODEL_LOADERS, MODEL_SOURCES, STORY_CACHE

pytestmark = [pytest.mark.comfyui, pytest.mark.server, pytest.mark.browser, pytest.mark.slow]

ARTIFACTS = PACK_ROOT / "artifacts" / "browser"
WORKFLOWS = sorted((PACK_ROOT / "example_workflows").glob("*.json"))
#: loader node -> {widget: the folder it lists}: the workflows' loaders (workflow_specs.MODEL_LOADERS) and LingBot's,
#: whose workflow names the release's folder as downloaded (a folder: no front end takes it for a model file)
LOADERS = {**MODEL_LOADERS, "JensenKVLoadLingBot": {"unet_name": "diffusion_models"}}
#: Load KV Cache's output/jensen_kv/... (written by the story workflow) is listed without its .safetensors, so the
#: front end does not take it for a model: no workflow shows a missing entry in folder "Unknown" (the test fails
#: when it does)
BUNDLED = {n for names in BUNDLED_MODELS.values() for n in names}
#: what the front end takes for a model file name (1.45+: isModelFileName)
MODEL_SUFFIXES = (".safetensors", ".ckpt", ".pt", ".pth", ".bin", ".sft", ".onnx", ".gguf")

#: the front end's store of the missing models it found (1.45+), or null (1.27)
CANDIDATES_JS = """() => {
  const vueApp = (document.querySelector('#vue-app') ?? document.querySelector('[data-v-app]'))?.__vue_app__;
  const store = vueApp?.config?.globalProperties?.$pinia?._s?.get?.('missingModel');
  if (!store || !('missingModelCandidates' in store)) return null;
  return (store.missingModelCandidates ?? []).map((c) => ({ nodeType: c.nodeType, widget: c.widgetName,
    name: c.name, directory: c.directory ?? null, url: c.url ?? null }));
}"""
#: the "model to node" registry: the folder of each given node type (null without getCategoryForNodeType: 1.27),
#: the pack's node types registered in it, and the first loader of diffusion_models
REGISTRY_JS = """(types) => {
  const vueApp = (document.querySelector('#vue-app') ?? document.querySelector('[data-v-app]'))?.__vue_app__;
  const store = vueApp?.config?.globalProperties?.$pinia?._s?.get?.('modelToNode');
  if (!store) return null;
  const categories = typeof store.getCategoryForNodeType === 'function'
    ? Object.fromEntries(types.map((t) => [t, store.getCategoryForNodeType(t) ?? null])) : null;
  const ours = Object.values(store.modelToNodeMap ?? {}).flat().map((p) => p?.nodeDef?.name)
    .filter((n) => n?.startsWith('JensenKV'));
  return { categories, ours, first: store.getNodeProvider?.('diffusion_models')?.nodeDef?.name ?? null };
}"""
LEGACY_DIALOG = ".comfy-missing-models"  # 1.27's MissingModelsWarning list: one option per missing entry


def expected_missing(wf: dict) -> list[dict]:
    """Every model file the workflow's loaders name (the bundled tiny model aside), with the folder its loader
    lists and the URL of its entry (None for a file to convert first: it has no entry)."""
    out = []
    for node in wf["nodes"]:
        widgets = LOADERS.get(node["type"], {})
        for widget, name in zip(widgets, node.get("widgets_values") or [], strict=False):
            if name in BUNDLED or not name.lower().endswith(MODEL_SUFFIXES):  # "none": no file (Load AR Video
                continue  # Checkpoint's lora_name), which the front end does not take for a model
            source = MODEL_SOURCES.get(name)
            url = source[1] if source and source[2] else None
            out.append(
                {"nodeType": node["type"], "widget": widget, "name": name, "directory": widgets[widget], "url": url}
            )
    return out


def _key(c: dict) -> tuple:
    return c["nodeType"], c["widget"], c["name"]


@pytest.fixture(scope="module")
def page(comfy_server):
    """A page of the shared server with none of the workflows' model files in its folders."""
    reason = browser_skip_reason()
    if reason:
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    present = [
        f"{d}/{n}"
        for d, names in MODEL_FILES.items()
        for n in names
        if (comfy_server.base_dir / "models" / d / n).exists()
    ]
    for folder in MODEL_FILES:  # an earlier module's snapshot may have removed a folder ComfyUI had listed (e.g.
        # models/clip_vision): its cached listing then fails on the folder's mtime and CLIPVisionLoader drops out of
        # /object_info; an empty folder again makes ComfyUI list it afresh
        (comfy_server.base_dir / "models" / folder).mkdir(parents=True, exist_ok=True)
    if (comfy_server.base_dir / STORY_CACHE).exists():
        present.append(STORY_CACHE)
    assert not present, f"files left in the shared server's folders by another module: {present}"
    errors: list[str] = []
    with sync_playwright() as p:
        browser = launch_chromium(p)
        pg = browser.new_page(viewport=VIEWPORT)
        pg.on("pageerror", lambda e: errors.append(f"{e}\n{e.stack}") if "jensen" in f"{e}{e.stack}".lower() else None)
        pg.on(
            "console",
            lambda m: (
                errors.append(f"console.{m.type}: {m.text}")
                if m.type == "error" and "jensen" in m.text.lower()
                else None
            ),
        )
        pg.on("response", lambda r: errors.append(f"{r.status} {r.url}") if r.status >= 400 and _ours(r.url) else None)
        open_comfyui(pg, comfy_server.url)
        pg.jkv_errors = errors
        yield pg
        browser.close()


def _ours(url: str) -> bool:
    """A request to the pack's routes, its extension or its templates (a missing start image the Note asks for is
    the user's file, not the pack's: its preview fails with a 404 here, as it would for a user)."""
    return "/jensen_kv/" in url or "comfyui-jensen-kv" in url


def _load(page, wf: dict) -> None:
    page.evaluate("async () => { app.graph.clear(); }")
    page.evaluate("async (wf) => { await app.loadGraphData(wf); }", wf)


def _shot(page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"))


def _open_errors_panel(page) -> None:
    """Show the Errors panel the missing-models toast points to (1.49: "View details"; 1.45: the toast's button)."""
    if page.locator('[data-testid="missing-model-actions"]').count():
        return
    for name in ("View details", "See Errors", "Show missing models", "Show errors"):
        button = page.get_by_role("button", name=name)
        if button.count():
            button.first.click()
            break
    page.locator('[data-testid="missing-model-actions"]').first.wait_for(timeout=10_000)


def test_the_pack_registers_its_loaders_folders(page):
    """The web extension's LOADER_FOLDERS: where the missing-model scan asks the registry (1.45+: its
    getCategoryForNodeType), each pack loader is known for the folder it lists and core's loaders keep their place;
    1.27's registry (no getCategoryForNodeType; its dialog reads only the entries) is left as it is."""
    pack_loaders = sorted(t for t in LOADERS if t.startswith("JensenKV"))
    registry = page.evaluate(REGISTRY_JS, pack_loaders)
    assert registry is not None, "the front end has no modelToNode store"
    if registry["categories"] is None:  # 1.27
        assert not registry["ours"], registry["ours"]
        return
    assert registry["categories"] == {t: next(iter(LOADERS[t].values())) for t in pack_loaders}
    assert sorted(registry["ours"]) == pack_loaders
    # the first loader of diffusion_models (what the model library adds for such a file) is still core's
    assert registry["first"] == "UNETLoader"


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.stem)
def test_every_missing_model_shows_its_folder_and_a_download_where_it_has_a_url(page, path):
    wf = json.loads(path.read_text())
    expected = expected_missing(wf)
    _load(page, wf)
    if page.evaluate(CANDIDATES_JS) is None:  # 1.27: the dialog of the entries with a URL
        _check_legacy_dialog(page, path, [e for e in expected if e["url"]])
        return
    # the front end surfaces its candidates once it has the folder paths: wait for the set
    want = sorted(_key(e) for e in expected)
    try:
        page.wait_for_function(
            f"() => JSON.stringify(({CANDIDATES_JS})().map((c) => [c.nodeType, c.widget, c.name]).sort()) === "
            f"{json.dumps(json.dumps(want, separators=(',', ':')))}",
            timeout=15_000,
        )
    except Exception:  # a timeout: the assertion below says what differs
        pass
    found = {_key(c): c for c in page.evaluate(CANDIDATES_JS)}
    assert sorted(found) == want, {"missing": set(want) - set(found), "extra": set(found) - set(want)}
    # issue 41's bar: every missing model the front end finds has its download URL and its folder
    assert not [c for c in found.values() if not (c["url"] and c["directory"])], found
    for e in expected:
        c = found[_key(e)]
        assert (c["directory"], c["url"]) == (e["directory"], e["url"]), (e["name"], c)
    if not expected:
        return
    _open_errors_panel(page)
    page.wait_for_timeout(300)
    _shot(page, f"07_missing_models_{path.stem}")
    for e in expected:
        download = page.get_by_role("button", name=f"Download {e['name']}", exact=True)
        assert download.count() == (1 if e["url"] else 0), (e["name"], download.count())
    unknown = page.get_by_text(re.compile(r"^\s*Unknown(\s*\(\d+\))?\s*$"))
    assert unknown.count() == len({e["name"] for e in expected if e["directory"] is None}), "a folder shows as Unknown"
    assert not page.jkv_errors, page.jkv_errors


def _check_legacy_dialog(page, path: Path, expected: list[dict]) -> None:
    """1.27: one option per missing entry, labelled "<folder> / <name>", each with a Download button."""
    if not expected:
        page.wait_for_timeout(700)
        assert page.locator(LEGACY_DIALOG).count() == 0, f"{path.name}: a missing-models dialog with nothing missing"
        return
    page.locator(LEGACY_DIALOG).first.wait_for(timeout=15_000)
    _shot(page, f"07_missing_models_{path.stem}")
    options = page.locator(f"{LEGACY_DIALOG} [role=option]")
    labels = sorted(" ".join(t.split()) for t in options.all_inner_texts())
    want = sorted({f"{e['directory']} / {e['name']}" for e in expected})
    assert len(labels) == len(want), (labels, want)
    for label, w in zip(labels, want, strict=True):
        assert label.startswith(w), (label, w)
        assert "Download" in label, f"{w}: no Download button ({label!r})"
    page.keyboard.press("Escape")
    page.locator(LEGACY_DIALOG).first.wait_for(state="detached", timeout=10_000)


def test_no_errors_from_the_extension(page):
    assert not page.jkv_errors, page.jkv_errors
