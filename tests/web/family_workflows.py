"""What the world-model families' workflow tests share (test_lingbot_workflow.py, test_worldplay_workflow.py,
test_core_workflows.py): the shipped graph, its INT2 + Jensen chain, and a tiny two-armed run (INT2 + Jensen beside full precision) queued as the front end would, with the checks every
family's run must pass."""

from __future__ import annotations

import json
import time

from safetensors.torch import load_file
from support.comfyui import PACK_ROOT
from test_workflows import Graph

WORKFLOW_DIR = PACK_ROOT / "example_workflows"


def shipped(name: str) -> Graph:
    """The shipped workflow ``name`` (its file stem)."""
    return Graph(json.loads((WORKFLOW_DIR / f"{name}.json").read_text()))


def only(g: Graph, node_type: str) -> dict:
    """The one node of ``node_type`` (an error when there are none or several)."""
    (node,) = g.of_type(node_type)
    return node


def int2_jensen_sampler(g: Graph, sampler_type: str, loader_type: str, unet: str) -> dict:
    """The sampler of ``sampler_type``, after asserting its MODEL comes from ``loader_type`` (reading ``unet``) through
    Quantize KV Cache (INT2 keys and values, g32, Hadamard) and Jensen Bias Correction (taylor, strength 1)."""
    sampler = only(g, sampler_type)
    assert g.model_chain(sampler) == ["JensenKVBiasCorrection", "JensenKVQuantizeKVCache", loader_type]
    assert only(g, loader_type)["widgets_values"] == [unet, "default"]
    assert only(g, "JensenKVQuantizeKVCache")["widgets_values"][:4] == ["2", "2", "32", "hadamard"]
    assert only(g, "JensenKVBiasCorrection")["widgets_values"][:2] == ["taylor", 1]  # the guard after: its defaults
    return sampler


def add_arms(prompt: dict, sampler_type: str, inputs: dict, arms: dict[str, str]) -> dict:
    """Two samplers (nodes 12 and 13) of ``sampler_type`` with ``inputs``, each on the MODEL of ``arms``' key (a node
    id) and saving its latent under ``jensen_kv/<arms' value>`` (nodes 22 and 23)."""
    for node_id, (model, prefix) in zip(("12", "13"), arms.items()):
        prompt[node_id] = {"class_type": sampler_type, "inputs": {"model": [model, 0], **inputs}}
        prompt[str(int(node_id) + 10)] = {
            "class_type": "SaveLatent",
            "inputs": {"samples": [node_id, 0], "filename_prefix": f"jensen_kv/{prefix}"},
        }
    return prompt


def run_arms(server, prompt: dict, arms: dict[str, str], sampler: str, chunks: int, shape: tuple) -> tuple[dict, dict]:
    """Queue ``prompt`` (made by :func:`add_arms`, INT2 + Jensen first) and check what every family's run must give:
    the reports say INT2 + taylor and full precision, from ``sampler`` over ``chunks`` chunks, each with its measured
    cache peak equal to the planner's; both latents have ``shape`` and INT2 moves the video. Returns both reports."""
    t0 = time.monotonic()
    entry = server.run_prompt(prompt, timeout=600)
    reports = {k: o["jensen_kv_report"][0] for k, o in entry["outputs"].items() if "jensen_kv_report" in o}
    int2, full = reports["12"], reports["13"]
    assert (int2["key_bits"], int2["value_bits"], int2["correction"]) == (2, 2, "taylor")
    assert (full["key_bits"], full["correction"]) == ("off", "off")
    for rep in (int2, full):
        assert rep["sampler"] == sampler and rep["chunks"] == chunks
        assert rep["cache_bytes"] == rep["planned_bytes"] > 0
    out = server.base_dir / "output" / "jensen_kv"
    (a,), (b,) = (list(out.glob(f"{prefix}_*.latent")) for prefix in arms.values())
    la, lb = load_file(str(a))["latent_tensor"], load_file(str(b))["latent_tensor"]
    assert la.shape == lb.shape == shape
    assert float((la - lb).abs().max()) > 1e-4
    print(f"\ntiny {sampler} workflow, INT2 + Jensen and full precision: {time.monotonic() - t0:.1f} s")
    return int2, full
