"""The Krea Realtime 14B workflow carries Krea's settings (daydreamlive/scope 68b0f95 ``krea_realtime_video``).

``tests/web/test_workflows.py`` validates it against both ComfyUI versions with the other workflows; this
checks what it promises: blocks of 3, the cache rebuilt from 3 frames with the VAE wired in, attention bias 0.3,
Krea's unwarped timesteps, 576 x 320, INT2 + Jensen.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from support.pack import load_pack_module
from support.workflow_api import sampler_widgets

from jensen_core.bias import KREA_ATTENTION_BIAS

WF = Path(__file__).resolve().parents[1] / "example_workflows" / "09 Krea Realtime 14B text to video.json"


def _graph():
    wf = json.loads(WF.read_text())
    nodes = {n["id"]: n for n in wf["nodes"]}
    links = {lk[0]: lk for lk in wf["links"]}  # id, from node, from slot, to node, to slot, type

    def of_type(t):
        return [n for n in wf["nodes"] if n["type"] == t]

    def upstream(node, name):
        (inp,) = [i for i in node["inputs"] if i["name"] == name]
        return nodes[links[inp["link"]][1]]

    return wf, of_type, upstream


def test_the_krea_workflow_runs_krea_settings():
    wf, of_type, upstream = _graph()
    (sampler,) = of_type("JensenKVChunkedARSampler")
    w = sampler_widgets(sampler)
    assert (w["cfg"], w["chunk_frames"], w["window_chunks"], w["sink_chunks"]) == (1, 3, 0, 0)
    assert (w["recompute_frames"], w["kv_cache_attention_bias"]) == (3, KREA_ATTENTION_BIAS)
    assert upstream(sampler, "vae")["type"] == "VAELoader"
    (decode,) = of_type("VAEDecode")
    assert upstream(decode, "vae") is upstream(sampler, "vae")
    sched = upstream(sampler, "sigmas")
    assert sched["type"] == "JensenKVARSchedule" and sched["widgets_values"][0] == "manual"
    sigmas = load_pack_module("runtime.schedules").ar_sigmas("manual", manual=sched["widgets_values"][3])
    torch.testing.assert_close(sigmas, torch.tensor([1.0, 0.75, 0.5, 0.25, 0.0]))
    assert upstream(sampler, "sampler")["widgets_values"] == ["lcm"]
    (latent,) = of_type("EmptyHunyuanLatentVideo")
    assert latent["widgets_values"][:2] == [576, 320]
    jensen = upstream(sampler, "model")
    assert jensen["type"] == "JensenKVBiasCorrection" and jensen["widgets_values"][0] == "taylor"
    quant = upstream(jensen, "model")
    assert quant["type"] == "JensenKVQuantizeKVCache" and quant["widgets_values"][:2] == ["2", "2"]
    loader = upstream(quant, "model")  # the file as published, its model. prefix stripped at load
    assert loader["type"] == "JensenKVLoadARCheckpoint"
    assert loader["widgets_values"] == ["krea-realtime-video-14b.safetensors", "none", "auto", "default", False]
    (note,) = of_type("Note")
    text = note["widgets_values"][0]
    assert "convert_checkpoint.py krea-realtime-video-14b.safetensors" in text
    assert "models/diffusion_models/krea-realtime-video-14b.safetensors" in text and "no conversion step" in text
    assert "kv_cache_attention_bias 0.3" in text and "recompute_frames = kv_cache_num_frames 3" in text
