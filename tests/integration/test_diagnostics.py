"""KV Cache Diagnostics in ComfyUI: the nodes in-process on a tiny Wan, and a whole workflow in a live server.

In-process: the node schemas, a run with diagnostics (INT2 keys steal attention, the correction gives
it back), zero cost and no trace without the node, shadow copies freed after success and errors, and
the plot node's IMAGE/STRING. Live server: UNETLoader -> Quantize -> Jensen -> Diagnostics -> Chunked AR
sampler -> Diagnostics Plot -> SaveImage, checked through ``/history`` and ``/view``.
"""

from __future__ import annotations

import asyncio
import importlib
import io as stdio
import json
import re
import uuid

import pytest
import torch
from support import comfyui as support_comfyui
from support import wan_tiny
from support.workflow_api import chunked_sampler, wan_t2v_head

pytestmark = [
    pytest.mark.comfyui,
    pytest.mark.skipif(support_comfyui.find_comfyui() is None, reason=support_comfyui.SKIP_REASON),
]

STEPS = 2
FRAMES = 8
CHUNK = 2


@pytest.fixture(scope="module")
def diag_nodes(pack):
    return importlib.import_module(f"{pack.__name__}.nodes")  # both diagnostics nodes, one file each


@pytest.fixture(scope="module")
def diag_obs(pack):
    return importlib.import_module(f"{pack.__name__}.runtime.shift_observer")


def _sigmas(model, steps=STEPS):
    import comfy.samplers

    return comfy.samplers.calculate_sigmas(model.get_model_object("model_sampling"), "simple", steps)


def _inputs(model, euler, *, cfg=1.0, window=0, frames=FRAMES):
    return dict(
        positive=wan_tiny.conditioning(1, 13, 32),
        negative=wan_tiny.conditioning(2, 13, 32),
        latent=wan_tiny.video_latent(frames),
        seed=3,
        cfg=cfg,
        sampler=euler,
        sigmas=_sigmas(model),
        chunk_frames=CHUNK,
        window_chunks=window,
        context_noise=0.0,
    )


def _quantized(nodes, model, correction="taylor", bits="2", group="16", rotation="hadamard"):
    m = nodes.JensenKVQuantizeKVCache.execute(model, bits, bits, group, rotation, "fp8_e4m3", 0).args[0]
    return nodes.JensenKVBiasCorrection.execute(m, correction, 1.0).args[0]


def _with_diag(diag_nodes, model, layers="all", heads="all", steps="all", stride=1):
    return diag_nodes.JensenKVDiagnostics.execute(model, layers, heads, steps, stride).args[0]


# ------------------------------------------------------------------------------------------- schemas
def test_nodes_are_registered_with_tooltips(nodes, diag_nodes):
    listed = asyncio.run(nodes.JensenKVExtension().get_node_list())
    ids = {n.define_schema().node_id for n in listed}
    assert {"JensenKVDiagnostics", "JensenKVDiagnosticsPlot"} <= ids
    for cls, display, inputs, outputs in (
        (
            diag_nodes.JensenKVDiagnostics,
            "KV Cache Diagnostics",
            ["model", "layers", "heads", "steps", "query_stride"],
            ["MODEL"],
        ),
        (
            diag_nodes.JensenKVDiagnosticsPlot,
            "KV Cache Diagnostics Plot",
            ["report", "width", "height"],
            ["IMAGE", "STRING"],
        ),
    ):
        s = cls.define_schema()
        s.finalize()
        assert s.display_name == display and s.category == "jensen_kv"
        assert [i.id for i in s.inputs] == inputs and [o.io_type for o in s.outputs] == outputs
        for i in s.inputs:
            assert i.tooltip and len(i.tooltip) > 20, f"{s.node_id}.{i.id} needs a tooltip"
    plot = diag_nodes.JensenKVDiagnosticsPlot.define_schema()
    assert plot.is_output_node and plot.inputs[0].io_type == "JENSEN_KV_REPORT"


def test_diagnostics_node_marks_a_clone_and_checks_indices(diag_nodes, diag_obs, tiny):
    out = diag_nodes.JensenKVDiagnostics.execute(tiny, "every 2", "1", "last", 3)
    m = out.args[0]
    assert m is not tiny and diag_obs.REQUEST_KEY not in tiny.model_options.get("transformer_options", {})
    req = m.model_options["transformer_options"][diag_obs.REQUEST_KEY]
    assert (req.layers, req.heads, req.steps, req.query_stride) == ("every 2", "1", "last", 3)
    assert "layers every 2" in out.ui.as_dict()["text"][0]
    with pytest.raises(ValueError, match=r"layers='5' asks for index 5, but this run has 2 layers \(0-1\)"):
        diag_nodes.JensenKVDiagnostics.execute(tiny, "5", "all", "all", 1)
    with pytest.raises(ValueError, match=r"heads='2' asks for index 2, but this run has 2 heads"):
        diag_nodes.JensenKVDiagnostics.execute(tiny, "all", "2", "all", 1)
    with pytest.raises(ValueError, match="steps='most' is not a selection"):
        diag_nodes.JensenKVDiagnostics.execute(tiny, "all", "all", "most", 1)


# ------------------------------------------------------------------------------------------- runs
class Recorder:
    """A plain observer next to the diagnostics (the chunk loop tees them): keeps what attention_shift needs."""

    def __init__(self):
        self.fp, self.events = {}, []

    def __call__(self, e):
        if e.phase == "write":
            self.fp[(e.layer, e.chunk)] = (e.k.clone(), e.v.clone())
        elif e.chunk > 0:
            self.events.append((e.layer, e.chunk, e.q.clone(), e.k.clone(), e.v.clone(), list(e.cache.entries)))


def test_sampler_with_diagnostics_int2_steals_and_taylor_gives_back(nodes, diag_nodes, jk, tiny, euler):
    model = _with_diag(diag_nodes, _quantized(nodes, tiny, "taylor"))
    out = nodes.JensenKVChunkedARSampler.execute(model, **_inputs(tiny, euler))
    report = out.args[1]
    d = report["diagnostics"]
    assert d["modes"] == ["off", "taylor"] and d["applied"] == "taylor" and not d["what_if"]
    assert d["layers"] == [0, 1] and d["heads"] == [0, 1] and d["steps"] == [0, 1] and d["chunks"] == [1, 2, 3]
    assert d["calls"] == 2 * STEPS * 3  # layers x steps x chunks 1-3 (cfg 1: one branch)
    none, fixed = d["stats"]["off"], d["stats"]["taylor"]
    assert none["samples"] == d["calls"] * 2 * 32  # heads x (2 frames x 16 tokens), every query
    # INT2 keys steal attention, and the correction brings most of it back
    assert none["median_delta_ps"] > 0.005
    assert abs(fixed["median_delta_ps"]) < 0.5 * none["median_delta_ps"], (none, fixed)
    assert fixed["mean_jsd"] < none["mean_jsd"]
    assert out.ui["jensen_kv_report"][0]["diagnostics"]["calls"] == d["calls"]  # the UI gets it too
    json.dumps(report, allow_nan=False)  # what the server sends to the browser


def test_diagnostics_match_attention_shift_on_recorded_calls(loop, nodes, diag_nodes, jk, tiny, euler):
    """The same run, an explicit observer teed with the diagnostics: recompute ΔP_S from what it recorded."""
    rec = Recorder()
    model = _with_diag(diag_nodes, _quantized(nodes, tiny, "taylor"), layers="1", steps="last", stride=2)
    res = loop.run_chunked_ar(
        model,
        **{k: v for k, v in _inputs(tiny, euler).items() if k != "latent"},
        latent=wan_tiny.video_latent(FRAMES),
        observer=rec,
        progress=False,
    )
    d = res.report["diagnostics"]
    assert d["layers"] == [1] and d["steps"] == [STEPS - 1] and d["calls"] == 3
    quant = importlib.import_module(f"{jk.__name__}.quant")
    diagnostics = importlib.import_module(f"{jk.__name__}.attention_shift")
    deltas = []
    last_step_calls = [ev for ev in rec.events if ev[0] == 1][STEPS - 1 :: STEPS]  # the last step of each chunk
    assert len(last_step_calls) == 3
    for layer, chunk, q, k, v, entries in last_step_calls:
        k_ref = torch.cat([rec.fp[(layer, c)][0] for c in range(chunk)], dim=-2)
        v_ref = torch.cat([rec.fp[(layer, c)][1] for c in range(chunk)], dim=-2)
        kq = quant.cat_quantized([e.k for e in entries])
        vq = quant.cat_quantized([e.v for e in entries])
        deltas.append(
            diagnostics.attention_shift(q, k_ref, v_ref, k, v, kq, vq, correction="taylor", query_stride=2).delta_ps
        )
    med = float(torch.cat(deltas).double().quantile(0.5))
    assert d["stats"]["taylor"]["median_delta_ps"] == pytest.approx(med, abs=1e-7)


def test_no_diagnostics_node_no_cost_and_identical_samples(loop, nodes, diag_nodes, diag_obs, tiny, euler, monkeypatch):
    made = []
    real = loop.make_diagnostics

    def spy(*a, **kw):
        obs = real(*a, **kw)
        made.append(obs)
        return obs

    monkeypatch.setattr(loop, "make_diagnostics", spy)
    model = _quantized(nodes, tiny, "taylor")
    plain = nodes.JensenKVChunkedARSampler.execute(model, **_inputs(tiny, euler))
    assert made == [None] and "diagnostics" not in plain.args[1]
    with_d = nodes.JensenKVChunkedARSampler.execute(_with_diag(diag_nodes, model), **_inputs(tiny, euler))
    obs = made[-1]
    assert isinstance(obs, diag_obs.DiagnosticsObserver) and not obs._shadow  # freed in finally
    # diagnostics watch; they never change what is sampled
    assert torch.equal(plain.args[0]["samples"], with_d.args[0]["samples"])


def test_shadow_copies_are_freed_after_an_error(loop, nodes, diag_nodes, tiny, euler, monkeypatch):
    made = []
    real = loop.make_diagnostics
    monkeypatch.setattr(loop, "make_diagnostics", lambda *a, **kw: made.append(real(*a, **kw)) or made[-1])

    def boom(chunk, step, steps):
        if chunk == 2:
            assert made[-1]._shadow  # mid-run: the shadows exist
            raise RuntimeError("boom")

    model = _with_diag(diag_nodes, _quantized(nodes, tiny, "taylor"))
    with pytest.raises(RuntimeError, match="boom"):
        loop.run_chunked_ar(model, **_inputs(tiny, euler), step_callback=boom, progress=False)
    assert made and not made[-1]._shadow


def test_cfg_window_and_a_run_without_correction(nodes, diag_nodes, tiny, euler):
    model = _with_diag(diag_nodes, _quantized(nodes, tiny, "off"), layers="0", heads="1", steps="first")
    report = nodes.JensenKVChunkedARSampler.execute(model, **_inputs(tiny, euler, cfg=2.0, window=1)).args[1]
    d = report["diagnostics"]
    assert d["modes"] == ["off", "taylor"] and d["what_if"] and d["applied"] == "off"
    assert d["calls"] == 1 * 1 * 3 * 2  # layer 0 x first step x chunks 1-3 x two CFG branches
    assert d["stats"]["off"]["samples"] == d["calls"] * 1 * 32  # one head, 2 frames x 16 tokens


def test_plot_node_returns_image_text_and_preview(nodes, diag_nodes, tiny, euler, tmp_path):
    import folder_paths

    old = folder_paths.get_temp_directory()
    folder_paths.set_temp_directory(str(tmp_path))
    try:
        model = _with_diag(diag_nodes, _quantized(nodes, tiny, "taylor"))
        report = nodes.JensenKVChunkedARSampler.execute(model, **_inputs(tiny, euler)).args[1]
        out = diag_nodes.JensenKVDiagnosticsPlot.execute(report, 640, 360)
    finally:
        folder_paths.set_temp_directory(old)
    image, text = out.args
    assert image.shape == (1, 360, 640, 3) and image.dtype == torch.float32
    assert 0 <= float(image.min()) and float(image.max()) <= 1 and float(image.std()) > 0.05
    st = report["diagnostics"]["stats"]
    assert f"median dP_S {st['off']['median_delta_ps']:+.5f}" in text
    assert f"median dP_S {st['taylor']['median_delta_ps']:+.5f}" in text
    ui = out.ui
    assert ui["text"] == [text] and len(ui["images"]) == 1 and ui["images"][0]["type"] == "temp"
    assert (tmp_path / ui["images"][0]["subfolder"] / ui["images"][0]["filename"]).is_file()


def test_plot_node_without_diagnostics_names_the_fix(nodes, diag_nodes, tiny, euler):
    report = nodes.JensenKVChunkedARSampler.execute(_quantized(nodes, tiny), **_inputs(tiny, euler)).args[1]
    with pytest.raises(ValueError, match="Put KV Cache Diagnostics on the MODEL before the Chunked AR sampler"):
        diag_nodes.JensenKVDiagnosticsPlot.execute(report)
    with pytest.raises(ValueError, match="report must be a Chunked AR sampler's report"):
        diag_nodes.JensenKVDiagnosticsPlot.execute("nope")


# ------------------------------------------------------------------------------------------- live server
UNET = "jensen_kv_tiny_wan_diag.safetensors"


@pytest.fixture(scope="module")
def server(comfy_server):
    """The session's shared server, with a tiny Wan checkpoint written for this module."""
    support_comfyui.setup_inprocess_comfyui()
    wan_tiny.write_file(comfy_server.base_dir / "models" / "diffusion_models" / UNET)
    return comfy_server


def diagnostics_workflow(prefix: str) -> dict:
    return {
        **wan_t2v_head(UNET),
        "11": {
            "class_type": "JensenKVDiagnostics",
            "inputs": {"model": ["3", 0], "layers": "all", "heads": "all", "steps": "all", "query_stride": 1},
        },
        "6": {
            "class_type": "EmptyHunyuanLatentVideo",
            "inputs": {"width": 64, "height": 64, "length": 21, "batch_size": 1},
        },
        "7": {"class_type": "KSamplerSelect", "inputs": {"sampler_name": "euler"}},
        "8": {
            "class_type": "BasicScheduler",
            "inputs": {"model": ["1", 0], "scheduler": "simple", "steps": 2, "denoise": 1.0},
        },
        "9": chunked_sampler(["11", 0]),
        "12": {"class_type": "JensenKVDiagnosticsPlot", "inputs": {"report": ["9", 1], "width": 960, "height": 540}},
        "13": {"class_type": "SaveImage", "inputs": {"images": ["12", 0], "filename_prefix": prefix}},
    }


@pytest.mark.server
def test_workflow_with_diagnostics_in_a_live_server(server):
    from PIL import Image

    info = server.get("/object_info")
    for node_id in ("JensenKVDiagnostics", "JensenKVDiagnosticsPlot"):
        assert node_id in info, f"{node_id} missing; server log:\n{server.log_tail()}"
        assert info[node_id]["category"] == "jensen_kv"
        for name, spec in info[node_id]["input"]["required"].items():
            assert spec[1].get("tooltip"), f"{node_id}.{name} has no tooltip"
    assert info["JensenKVDiagnosticsPlot"]["output"] == ["IMAGE", "STRING"]
    assert info["JensenKVDiagnosticsPlot"]["output_node"] is True

    prefix = f"jensen_kv_diag/{uuid.uuid4().hex[:8]}"
    entry = server.run_prompt(diagnostics_workflow(prefix), timeout=300)
    outputs = entry["outputs"]

    report = outputs["9"]["jensen_kv_report"][0]
    d = report["diagnostics"]
    assert report["chunks"] == 6 and d["chunks"] == [1, 2, 3, 4, 5]
    assert d["calls"] == 2 * 2 * 5  # layers x steps x chunks 1-5
    none, fixed = d["stats"]["off"], d["stats"]["taylor"]
    assert none["median_delta_ps"] > 0 and abs(fixed["median_delta_ps"]) < none["median_delta_ps"], (none, fixed)

    plot = outputs["12"]
    text = plot["text"][0]
    assert (
        f"median dP_S {none['median_delta_ps']:+.5f}" in text and f"median dP_S {fixed['median_delta_ps']:+.5f}" in text
    )
    assert re.search(r"mean JSD \d\.\d{3}e[-+]\d\d", text)
    preview = plot["images"][0]
    assert preview["type"] == "temp"
    saved = outputs["13"]["images"][0]
    assert saved["type"] == "output"
    path = server.base_dir / "output" / saved["subfolder"] / saved["filename"]
    img = Image.open(path)
    assert img.size == (960, 540) and len(img.convert("RGB").getcolors(maxcolors=1 << 20)) > 50
    # the preview is served like any ComfyUI image
    import urllib.parse
    import urllib.request

    q = urllib.parse.urlencode({"filename": preview["filename"], "subfolder": preview["subfolder"], "type": "temp"})
    with urllib.request.urlopen(f"{server.url}/view?{q}", timeout=30) as r:
        assert r.status == 200
        served = Image.open(stdio.BytesIO(r.read()))
    assert served.size == (960, 540)
