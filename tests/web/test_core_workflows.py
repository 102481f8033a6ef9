"""The shipped workflows on ComfyUI's own AR sampler (v0.27+: SamplerCustomAdvanced + SamplerARVideo over a causal-AR
Wan), ``workflow_specs.CORE_WORKFLOWS``:

- offline: each wires what its Note promises (the pack's nodes in front of the guider, the block size, the
  schedule, the start image, KV Cache Report on the guider's MODEL and the sampler's output), and the tiny
  CPU demo mirrors the Chunked-AR one (prompt, size, steps, seed, window 3, the three caches);
- in one live v0.27 server: each is valid against ``/object_info`` (test_workflows.py's validator), loads
  in the real front end (headless Chromium) without missing nodes and with every widget value kept, and
  the tiny CPU demo, turned into the API prompt the front end would queue, runs to the end: three
  columns, INT2 away from full precision, each KV Cache Report equal to the planner.

All marked ``core_ar``: deselected against ComfyUI without core's AR path (v0.3.64), never skipped.
"""

from __future__ import annotations

import json
import time

import pytest
from support.comfyui import PACK_ROOT
from support.workflow_api import frontend_defaults, ui_to_api
from test_workflows import Graph, validate
from workflow_specs import (
    CAUSAL_FORCING_FRAMEWISE,
    CORE_WORKFLOWS,
    SELF_FORCING_CAUSAL,
    START_IMAGE,
    TINY_AR,
)

pytestmark = pytest.mark.core_ar

WORKFLOW_DIR = PACK_ROOT / "example_workflows"
ARTIFACTS = PACK_ROOT / "artifacts" / "browser"  # screenshots of the loaded workflows
CORE_FILES = [WORKFLOW_DIR / f"{spec['name']}.json" for spec in CORE_WORKFLOWS]
CORE_NODES = ("SamplerARVideo", "EmptyARVideoLatent", "ARVideoI2V")
PACK_CHAIN = [
    "JensenKVARCacheWindow",
    "JensenKVBiasCorrection",
    "JensenKVQuantizeKVCache",
    "ModelSamplingSD3",
]
TINY_COLUMN, TINY_GAP = 128, 4  # Tiny AR Decode scale 8 on 16x16 latents; ImageStitch spacing


def graph(name: str) -> Graph:
    return Graph(json.loads((WORKFLOW_DIR / f"{name}.json").read_text()))


def only(g: Graph, node_type: str) -> dict:
    (node,) = g.of_type(node_type)
    return node


def outputs_to(g: Graph, node: dict) -> list[tuple[dict, str]]:
    """(target node, input name) of every link leaving ``node``."""
    return [(g.nodes[lk[3]], g.nodes[lk[3]]["inputs"][lk[4]]["name"]) for lk in g.links.values() if lk[1] == node["id"]]


# ------------------------------------------------------------------------------------------------ offline
def test_every_core_workflow_is_shipped():
    missing = [p.name for p in CORE_FILES if not p.is_file()]
    assert not missing, (
        f"{missing}: run COMFYUI_PATH=/opt/comfyui/v0.27 .ci/venvs/comfyui-v0.27/bin/python tests/web/build_workflows.py"
    )


@pytest.mark.parametrize(
    "name,unet,block,i2v",
    [
        ("13 Core AR sampler, chunk-wise", SELF_FORCING_CAUSAL, 3, False),
        ("14 Core AR sampler, frame-wise", CAUSAL_FORCING_FRAMEWISE, 1, False),
        ("15 Core AR sampler, image to video", CAUSAL_FORCING_FRAMEWISE, 1, True),
    ],
)
def test_wan_core_workflows_wire_the_pack_in_front_of_core_sampler(name, unet, block, i2v):
    g = graph(name)
    sampler = only(g, "SamplerCustomAdvanced")
    guider = g.upstream(sampler, "guider")
    assert guider["type"] == "CFGGuider" and guider["widgets_values"] == [1]
    assert g.upstream(guider, "negative")["type"] == "CLIPTextEncode"
    chain = [g.upstream(guider, "model")["type"], *g.model_chain(g.upstream(guider, "model"))]
    # Self-Forcing as published: Load AR Video Checkpoint with causal on; Causal Forcing frame-wise: ComfyUI's file
    loader = "JensenKVLoadARCheckpoint" if block == 3 else "UNETLoader"
    assert chain == (["ARVideoI2V"] if i2v else []) + PACK_CHAIN + [loader], chain
    if loader == "UNETLoader":
        assert only(g, "UNETLoader")["widgets_values"][0] == unet
    else:  # ckpt_name, lora_name, weights, weight_dtype, causal
        assert only(g, loader)["widgets_values"] == [unet, "none", "auto", "default", True]
    assert only(g, "ModelSamplingSD3")["widgets_values"] == [5]
    assert only(g, "JensenKVQuantizeKVCache")["widgets_values"][:4] == ["2", "2", "32", "hadamard"]
    assert only(g, "JensenKVBiasCorrection")["widgets_values"][:2] == ["taylor", 1]  # then guard (on), if saved
    assert only(g, "JensenKVARCacheWindow")["widgets_values"] == [0, 0]
    assert g.upstream(sampler, "sampler")["type"] == "SamplerARVideo"
    assert g.upstream(sampler, "sampler")["widgets_values"] == [block]
    sched = g.upstream(sampler, "sigmas")
    assert sched["type"] == "JensenKVARSchedule" and sched["widgets_values"][0] == "self_forcing_4step"
    assert g.upstream(sampler, "noise")["widgets_values"] == [42, "fixed"]
    latent = g.upstream(sampler, "latent_image")
    if i2v:  # ARVideoI2V gives the guider's MODEL (with the start latent) and the sampler's LATENT
        assert latent["id"] == g.upstream(guider, "model")["id"]
        assert latent["widgets_values"] == [832, 480, 81, 1]
        image = g.upstream(latent, "start_image")
        assert image["type"] == "LoadImage" and image["widgets_values"][0] == START_IMAGE
        assert g.upstream(latent, "vae")["type"] == "VAELoader"
        assert not g.of_type("EmptyARVideoLatent")
    else:
        assert latent["type"] == "EmptyARVideoLatent" and latent["widgets_values"] == [832, 480, 81, 1]
    report = only(g, "JensenKVCacheReport")
    assert g.upstream(report, "model")["id"] == g.upstream(guider, "model")["id"], "the MODEL the guider was given"
    assert g.upstream(report, "samples")["id"] == sampler["id"]
    decode = only(g, "VAEDecode")
    assert g.upstream(decode, "samples")["id"] == sampler["id"]
    assert outputs_to(g, decode) == [(only(g, "SaveAnimatedWEBP"), "images")]
    note = g.note_text()
    for fact in (
        "v0.27",
        "--causal",
        f"models/diffusion_models/{unet}",
        "num_frame_per_block",
        "KV Cache Report",
        "t = 1000, 937.5, 833.3, 625",
    ):
        assert fact in note, fact
    if i2v:
        assert START_IMAGE in note and "before ARVideoI2V" in note


def test_tiny_core_demo_mirrors_the_chunked_ar_demo_with_three_caches():
    g = graph("02 Tiny AR, core sampler - runs on a CPU, no download")
    old = graph("01 Tiny AR demo - runs on a CPU, no download")
    assert only(g, "UNETLoader")["widgets_values"][0] == TINY_AR
    assert only(g, "ModelSamplingSD3")["widgets_values"] == only(old, "ModelSamplingSD3")["widgets_values"] == [3]
    assert only(g, "JensenKVTinyARPrompt")["widgets_values"] == only(old, "JensenKVTinyARPrompt")["widgets_values"]
    assert only(g, "EmptyARVideoLatent")["widgets_values"] == only(old, "EmptyHunyuanLatentVideo")["widgets_values"]
    assert only(g, "BasicScheduler")["widgets_values"] == only(old, "BasicScheduler")["widgets_values"]
    assert g.upstream(only(g, "BasicScheduler"), "model")["type"] == "ModelSamplingSD3"
    old_sampler = old.of_type("JensenKVChunkedARSampler")[0]["widgets_values"]  # seed, control, cfg, chunk, window
    assert only(g, "RandomNoise")["widgets_values"] == [old_sampler[0], "fixed"]
    assert only(g, "SamplerARVideo")["widgets_values"] == [old_sampler[3]]
    assert only(g, "JensenKVARCacheWindow")["widgets_values"] == [old_sampler[4], 0]
    samplers = g.of_type("SamplerCustomAdvanced")
    assert len(samplers) == 3
    for name in ("noise", "sampler", "sigmas", "latent_image"):
        assert len({g.upstream(s, name)["id"] for s in samplers}) == 1, f"one {name} for all three"
    arms = []
    for s in samplers:
        guider = g.upstream(s, "guider")
        assert guider["type"] == "BasicGuider" and g.upstream(guider, "conditioning")["type"] == "JensenKVTinyARPrompt"
        model = g.upstream(guider, "model")
        chain = [model["type"], *g.model_chain(model)]
        arms.append(tuple(t for t in chain if t.startswith("JensenKV")))
        targets = outputs_to(g, s)
        assert {(t["type"], n) for t, n in targets} == {
            ("JensenKVTinyARDecode", "samples"),
            ("JensenKVCacheReport", "samples"),
        }
        report = next(t for t, _ in targets if t["type"] == "JensenKVCacheReport")
        assert g.upstream(report, "model")["id"] == model["id"]
    assert sorted(arms) == [
        ("JensenKVARCacheWindow",),
        ("JensenKVBiasCorrection", "JensenKVQuantizeKVCache", "JensenKVARCacheWindow"),
        ("JensenKVQuantizeKVCache", "JensenKVARCacheWindow"),
    ]
    assert len(g.of_type("ImageStitch")) == 2 and g.of_type("SaveAnimatedWEBP")
    note = g.note_text()
    for fact in ("v0.27", "bundled", "models/tiny_ar", "AR Cache Window 3", "WAN21_CausalAR"):
        assert fact in note, fact


# ------------------------------------------------------------------------------------------- live v0.27
@pytest.mark.comfyui
@pytest.mark.server
@pytest.mark.parametrize("path", CORE_FILES, ids=lambda p: p.stem)
def test_core_workflow_is_valid_against_live_object_info(path, server):
    info = server.object_info
    for node in (*CORE_NODES, "JensenKVARCacheWindow", "JensenKVCacheReport"):
        assert node in info, f"{node} is not on the server"
    problems = validate(json.loads(path.read_text()), info)
    assert not problems, "\n".join(problems)


@pytest.mark.comfyui
@pytest.mark.server
def test_tiny_core_demo_runs_three_different_caches_in_a_live_server(server):
    """The CPU demo on core's path, queued as the front end would: three columns, INT2 away from full precision."""
    import numpy as np
    from PIL import Image

    wf = json.loads((WORKFLOW_DIR / "02 Tiny AR, core sampler - runs on a CPU, no download.json").read_text())
    unets = server.object_info["UNETLoader"]["input"]["required"]["unet_name"][0]
    assert TINY_AR in unets  # the pack registered its bundled model folder
    prompt = ui_to_api(wf, server.object_info)
    t0 = time.monotonic()
    entry = server.run_prompt(prompt, timeout=600)
    elapsed = time.monotonic() - t0

    reports = {int(k): o["jensen_kv_report"][0] for k, o in entry["outputs"].items() if "jensen_kv_report" in o}
    g = Graph(wf)
    arm_of = {"JensenKVARCacheWindow": "fp", "JensenKVQuantizeKVCache": "int2", "JensenKVBiasCorrection": "jensen"}
    by_arm = {arm_of[g.model_chain(g.nodes[node_id])[0]]: rep for node_id, rep in reports.items()}
    assert sorted(by_arm) == ["fp", "int2", "jensen"]
    for arm, rep in by_arm.items():
        assert rep["sampler"] == "core sample_ar_video", arm
        assert (rep["window_chunks"], rep["sink_chunks"], rep["chunk_frames"]) == (3, 0, 3), arm
        assert rep["cache_bytes"] == rep["planned_bytes"] > 0, arm  # the planner's figure, measured
    assert by_arm["fp"]["key_bits"] == "off" and by_arm["int2"]["key_bits"] == by_arm["jensen"]["key_bits"] == 2
    assert (by_arm["int2"]["correction"], by_arm["jensen"]["correction"]) == ("off", "taylor")
    assert by_arm["int2"]["cache_bytes"] * 5 < by_arm["fp"]["cache_bytes"]

    (webp,) = (server.base_dir / "output" / "jensen_kv").glob("tiny_core_ab_*.webp")
    im = Image.open(webp)
    assert im.n_frames == 24 and im.size == (3 * TINY_COLUMN + 2 * TINY_GAP, TINY_COLUMN)
    frames = []
    for i in range(im.n_frames):
        im.seek(i)
        frames.append(np.asarray(im.convert("RGB"), dtype=np.float64))
    video = np.stack(frames)
    step = TINY_COLUMN + TINY_GAP
    fp, int2, jensen = (video[:, :, i * step : i * step + TINY_COLUMN] for i in range(3))
    err_int2, err_jensen = np.abs(int2 - fp).mean(), np.abs(jensen - fp).mean()
    print(
        f"\ntiny core demo: {elapsed:.1f} s; mean |pixel - full precision|: INT2 {err_int2:.2f}, "
        f"INT2 + Jensen {err_jensen:.2f} (of 255)"
    )
    assert fp.std() > 10, "the full-precision column is flat"
    assert err_int2 > 1.0, "INT2 did not change the video"
    assert err_jensen < err_int2, "the correction did not bring INT2 back towards full precision"
    # ~15-20 s on one thread of a 2-core machine (see the server fixture); the bound leaves room for a busy one
    assert elapsed <= 180, f"the CPU demo on core's path took {elapsed:.1f} s"


@pytest.fixture(scope="module")
def page(server):
    from support.browser import VIEWPORT, browser_skip_reason, launch_chromium, open_comfyui

    reason = browser_skip_reason()
    if reason:
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    errors: list[str] = []
    with sync_playwright() as p:
        browser = launch_chromium(p)
        pg = browser.new_page(viewport=VIEWPORT)
        pg.on("pageerror", lambda e: errors.append(f"{e}\n{e.stack}"))
        pg.on("console", lambda m: errors.append(f"console.{m.type}: {m.text}") if m.type == "error" else None)
        open_comfyui(pg, server.url)
        pg.jensen_errors = errors
        yield pg
        browser.close()


@pytest.mark.comfyui
@pytest.mark.server
@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.parametrize("path", CORE_FILES, ids=lambda p: p.stem)
def test_core_workflow_loads_in_the_front_end_without_missing_nodes(path, page, server):
    from test_browser import MISSING_NODES_TITLE, our_errors

    wf = json.loads(path.read_text())
    page.evaluate("async (wf) => { await app.loadGraphData(wf); }", wf)
    page.wait_for_timeout(1000)
    assert page.get_by_text(MISSING_NODES_TITLE).count() == 0, f"{path.name}: the front end reports missing nodes"
    assert page.get_by_text("Invalid workflow").count() == 0, f"{path.name}: fails the front end's schema check"
    loaded = page.evaluate("""() => app.graph.nodes.map((n) => ({ type: n.type, ok: n.type in LiteGraph.registered_node_types,
                               widgets: (n.widgets ?? []).filter((w) => w.serialize !== false).map((w) => w.value) }))""")
    assert [n["type"] for n in loaded] == [n["type"] for n in wf["nodes"]]
    assert all(n["ok"] for n in loaded), [n["type"] for n in loaded if not n["ok"]]
    for n_file, n_ui in zip(wf["nodes"], loaded):  # nothing reset as invalid, nothing shifted
        info = server.object_info.get(n_file["type"])
        filled = list(frontend_defaults(n_file, info).values()) if info else []
        assert n_ui["widgets"] == (n_file.get("widgets_values") or []) + filled, n_file["type"]
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.evaluate(
        "() => { app.canvas.ds.scale = 0.62; app.canvas.ds.offset = [30, 60]; app.canvas.setDirty(true, true); }"
    )
    page.wait_for_timeout(300)
    page.screenshot(path=str(ARTIFACTS / f"core_ar_loaded_{path.stem}.png"))
    assert not our_errors(page.jensen_errors), our_errors(page.jensen_errors)
