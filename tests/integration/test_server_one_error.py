"""One bad value, one error, on the input that is wrong (issue 41, item 2), read off a live server's /prompt answer.

ComfyUI attaches a ``validate_inputs`` failure to every input that function's signature names (and leaves its own
checks of those inputs out), so a node that checked all its dropdowns there showed one bad ``key_bits`` as one error
per input. The pack leaves plain dropdowns to ComfyUI's own check (on v0.3.64, which skips V3 combos, they are
published as V1 lists, which it checks) and names in ``validate_inputs`` only the inputs that depend on each other.
Runs on every ComfyUI the tests know (v0.3.64, v0.27, 0.33).
"""

from __future__ import annotations

import uuid

import pytest
from support import comfyui as support_comfyui
from support.workflow_api import int2_jensen

pytestmark = [
    pytest.mark.comfyui,
    pytest.mark.server,
    pytest.mark.skipif(support_comfyui.find_comfyui() is None, reason=support_comfyui.SKIP_REASON),
]

#: the bundled tiny AR model (models/tiny_ar), which the pack registers in diffusion_models
TINY = "jensen-kv-tiny-ar.safetensors"


def post(server, prompt) -> dict:
    status, body = server.post("/prompt", {"prompt": prompt, "client_id": uuid.uuid4().hex})
    assert status == 400, body
    return body["node_errors"]


def wan_prompt(**quant_widgets) -> dict:
    return {
        "1": {"class_type": "UNETLoader", "inputs": {"unet_name": TINY, "weight_dtype": "default"}},
        **int2_jensen(["1", 0], **quant_widgets),
        "4": {"class_type": "JensenKVTestConditioning", "inputs": {"seed": 1, "tokens": 16, "width": 4096}},
        "6": {"class_type": "EmptyHunyuanLatentVideo", "inputs": {"width": 32, "height": 32, "length": 9, "batch_size": 1}},
        "9": {
            "class_type": "JensenKVChunkedARSamplerSimple",
            "inputs": {
                "model": ["3", 0], "positive": ["4", 0], "negative": ["4", 0], "latent": ["6", 0], "seed": 0,
                "cfg": 1.0, "chunk_frames": 1, "window_chunks": 0, "context_noise": 0.0, "steps": 2,
                "sampler_name": "euler", "scheduler": "simple",
            },
        },
        "10": {"class_type": "SaveLatent", "inputs": {"samples": ["9", 0], "filename_prefix": "jensen_kv/one_error"}},
    }  # fmt: skip


def magi1_prompt(model_name="no_such_magi1.safetensors", **sampler) -> dict:
    inputs = {
        "model": ["1", 0], "positive": ["4", 0], "width": 64, "height": 64, "frames": 24, "seed": 0, "steps": 16,
        "window_size": 4, "cfg": "auto", "kv_ranges": "5,4,3,2", "window_chunks": 0, "sink_chunks": 0,
        "special_tokens": True,
    }  # fmt: skip
    return {
        "1": {
            "class_type": "JensenKVLoadMagi1",
            "inputs": {"model_name": model_name, "weight_dtype": "default", "variant": "auto"},
        },
        "4": {"class_type": "JensenKVTestConditioning", "inputs": {"seed": 1, "tokens": 16, "width": 4096}},
        "5": {"class_type": "JensenKVMagi1ARSampler", "inputs": {**inputs, **sampler}},
        "10": {"class_type": "SaveLatent", "inputs": {"samples": ["5", 0], "filename_prefix": "jensen_kv/one_error"}},
    }


def only_error(node_errors: dict, node_id: str) -> dict:
    """The one error of the prompt: on ``node_id``, and nowhere else."""
    assert list(node_errors) == [node_id], node_errors
    errors = node_errors[node_id]["errors"]
    assert len(errors) == 1, errors
    return errors[0]


@pytest.mark.parametrize(("widget", "value"), [("key_bits", "5"), ("group_size", "48"), ("recent_chunks_bits", "6")])
def test_one_bad_quantize_value_is_one_error_on_that_input(comfy_server, widget, value):
    error = only_error(post(comfy_server, wan_prompt(**{widget: value})), "2")
    assert error["extra_info"]["input_name"] == widget, error
    assert error["type"] == "value_not_in_list" and repr(value) in error["details"], error


def test_one_missing_magi1_file_is_one_error_on_model_name(comfy_server):
    error = only_error(post(comfy_server, magi1_prompt()), "1")
    assert error["extra_info"]["input_name"] == "model_name", error
    assert "no_such_magi1.safetensors" in error["details"] and "models/diffusion_models" in error["details"], error


def test_one_bad_magi1_dropdown_is_one_error_on_that_input(comfy_server):
    prompt = magi1_prompt()
    prompt["1"]["inputs"]["variant"] = "turbo"
    errors = post(comfy_server, prompt)["1"]["errors"]
    # the missing file and the bad variant: two inputs at fault, one error each
    assert sorted(e["extra_info"]["input_name"] for e in errors) == ["model_name", "variant"], errors


def test_magi1_sampler_names_only_the_inputs_that_depend_on_each_other(comfy_server):
    errors = post(comfy_server, magi1_prompt(steps=10))["5"]["errors"]
    assert {e["extra_info"]["input_name"] for e in errors} == {"steps", "window_size", "kv_ranges"}, errors
    assert all("not a multiple of window_size 4" in e["details"] for e in errors), errors
    # a plain dropdown of the sampler: ComfyUI's own check, one error (the missing model stays the loader's own)
    errors = post(comfy_server, magi1_prompt(cfg="7"))["5"]["errors"]
    assert [(e["type"], e["extra_info"]["input_name"]) for e in errors] == [("value_not_in_list", "cfg")], errors
