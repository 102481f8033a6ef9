"""Jensen KV Cache (Ray): the settings reach a model that lives in another process, as in Raylight's Ray actors.

A stand-in for Ray's actor API records what the node sends (``actor.model_function_runner.remote(fn,
payload)``), pickles it with cloudpickle as Ray does, and a fresh Python process (ComfyUI importable,
the pack not imported: what a Raylight actor is) unpickles it and runs it on its own tiny causal Wan
as Raylight's ``RayWorker.model_function_runner`` does (``self.model = fn(self.model, *args)``), then
samples with core's AR sampler. The result must be the in-process chain Quantize KV Cache -> Jensen Bias
Correction -> AR Cache Window on the same model.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import textwrap
import types

import pytest
import torch
from support import comfyui as support_comfyui

from jensen_testing import raylight as jr

pytestmark = [pytest.mark.core_ar]
cloudpickle = pytest.importorskip("cloudpickle", reason="cloudpickle (Ray's pickler; the raylight extra) is missing")

CASE = dict(bits="2", group="16", rotation="hadamard", mode="chunk_mean", strength=0.5, window=2, sink=1, tiers=True)
CASE.update(frames=5, hw=jr.ODD_HW)
SETTINGS = dict(
    key_bits="2",
    value_bits="2",
    group_size="16",
    rotation="hadamard",
    scale_format="fp8_e4m3",
    rotation_seed=0,
    method="rtn",
    qvg_stages=1,
    qvg_centroids=4,
    qvg_iters=2,
    recent_chunks_bits="4",
    recent_chunks=1,
    sink_bits="8",
    recent_chunks_key_bits="same",
    mode="chunk_mean",
    strength=0.5,
    window_chunks=2,
    sink_chunks=1,
)

ACTOR = textwrap.dedent(
    """
    import sys, torch, cloudpickle
    from jensen_testing import comfyui as jc, raylight as jr, causal_wan as cw
    jc.setup_inprocess_comfyui()
    assert jc.PACK_MODULE not in sys.modules  # the actor has not imported the pack
    fn, args = cloudpickle.loads(open(sys.argv[1], "rb").read())
    model = cw.build_causal_patcher(seed=0, **jr._arch({}))
    model = fn(model, *args)  # RayWorker.model_function_runner
    core_ar = sys.modules[jc.PACK_MODULE + ".runtime.core_ar"]
    out = jr.sample(model, jr.CASE_FOR_ACTOR)
    torch.save({"out": out, "report": core_ar.last_report(model)}, sys.argv[2])
    """
)


@pytest.fixture(scope="module")
def ray_node(nodes):
    return importlib.import_module(f"{support_comfyui.PACK_MODULE}.nodes.ray_actors_kv").JensenKVRayActors


class FakeActor:
    """Ray's actor handle as the node uses it: ``model_function_runner.remote(fn, *args)``."""

    def __init__(self):
        self.sent = []
        self.model_function_runner = types.SimpleNamespace(remote=lambda fn, *args: self.sent.append((fn, args)))


def test_the_schema_is_the_three_nodes_inputs_on_ray_actors(ray_node, nodes):
    s = ray_node.define_schema()
    ids = [i.id for i in s.inputs]
    want = ["ray_actors"]
    for node in (nodes.JensenKVQuantizeKVCache, nodes.JensenKVBiasCorrection, nodes.JensenKVARCacheWindow):
        want += [i.id for i in node.define_schema().inputs if i.id != "model"]
    assert ids == want and len(set(ids)) == len(ids)
    assert [o.io_type for o in s.outputs] == ["RAY_ACTORS"] and s.inputs[0].io_type == "RAY_ACTORS"
    assert all(i.tooltip and len(i.tooltip) > 20 for i in s.inputs)


def test_settings_sent_to_an_actor_process_give_the_nodes_result_there(ray_node, nodes, monkeypatch, tmp_path):
    actors = [FakeActor(), FakeActor()]
    monkeypatch.setitem(sys.modules, "ray", types.SimpleNamespace(get=lambda futures: list(futures)))
    out = ray_node.execute({"workers": actors}, **SETTINGS)
    assert out.args[0] == {"workers": actors}
    assert all(len(a.sent) == 1 for a in actors)
    fn, args = actors[1].sent[0]
    assert fn.__qualname__.endswith("<locals>.apply_jensen_kv")  # a closure: cloudpickle sends it by value
    blob = tmp_path / "sent.pkl"
    blob.write_bytes(cloudpickle.dumps((fn, args)))
    code = ACTOR.replace("jr.CASE_FOR_ACTOR", repr(CASE))
    r = subprocess.run(
        [sys.executable, "-c", code, str(blob), str(tmp_path / "out.pt")],
        cwd=support_comfyui.PACK_ROOT,
        env={**__import__("os").environ, "OMP_NUM_THREADS": "1", "COMFYUI_PATH": str(support_comfyui.find_comfyui())},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    actor = torch.load(tmp_path / "out.pt", weights_only=False)
    here = jr.run_single(CASE, nodes)
    torch.testing.assert_close(actor["out"], here["out"], atol=1e-6, rtol=0)
    for key in ("cache_bytes", "correction", "strength", "window_chunks", "sink_chunks", "tiers", "key_bits"):
        assert actor["report"][key] == here["report"][key], key
    assert actor["report"]["correction"] == "chunk_mean" and actor["report"]["sink_chunks"] == 1


def test_without_actors_it_says_what_to_connect(ray_node):
    with pytest.raises(ValueError, match="Load Diffusion Model \\(Ray\\)"):
        ray_node.execute({"workers": []}, **SETTINGS)
    with pytest.raises(ValueError, match="group_size='48'"):
        ray_node.execute({"workers": [FakeActor()]}, **{**SETTINGS, "group_size": "48"})
