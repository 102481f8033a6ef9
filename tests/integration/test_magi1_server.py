"""The MAGI-1 nodes in a live ComfyUI server: /object_info lists them (with the checkpoints found in the model
folders), an API prompt decodes a latent through Load MAGI-1 VAE -> MAGI-1 VAE Decode -> PreviewImage, and one samples
a tiny MAGI-1 through Quantize KV Cache (INT2) -> Jensen Bias Correction -> MAGI-1 AR Sampler -> MAGI-1 VAE Decode."""

from __future__ import annotations

import json
import uuid

import pytest
from support import comfyui as support_comfyui
from support.workflow_api import int2_jensen

pytestmark = [
    pytest.mark.comfyui,
    pytest.mark.server,
    pytest.mark.skipif(support_comfyui.find_comfyui() is None, reason=support_comfyui.SKIP_REASON),
]
NODES = (
    "JensenKVLoadMagi1",
    "JensenKVLoadMagi1VAE",
    "JensenKVMagi1VAEDecode",
    "JensenKVMagi1TextEncode",
    "JensenKVMagi1ARSampler",
)
VAE_DD = {"video_size": 32, "video_length": 8, "embed_dim": 256, "depth": 2, "num_heads": 4, "z_chans": 16}


@pytest.fixture(scope="module")
def server(comfy_server):
    from safetensors.torch import save_file

    from jensen_testing import magi1_tiny
    from jensen_testing.magi1_tiny import seeded_weights
    from runtime.families.magi1.model.config import TINY, expected_shapes
    from runtime.families.magi1.model.vae import VAEConfig, decoder_shapes

    models = comfy_server.base_dir / "models"
    dit = seeded_weights(expected_shapes(TINY))
    save_file(dit, str(models / "diffusion_models" / "magi-tiny.safetensors"))
    # with the special tokens (HQ, DURATION) the sampler puts in front of each chunk's caption
    magi1_tiny.write_file(models / "diffusion_models" / "magi-tiny-tokens.safetensors")
    folder = models / "vae" / "magi_vae_tiny"
    folder.mkdir(parents=True)
    cfg = VAEConfig(video_size=32, video_length=8, embed_dim=256, depth=2, num_heads=4)
    save_file(
        {"decoder." + k: v for k, v in seeded_weights(decoder_shapes(cfg)).items()},
        str(folder / "diffusion_pytorch_model.safetensors"),
    )
    (folder / "config.json").write_text(json.dumps({"_class_name": "ViTVAE", "ddconfig": VAE_DD}))
    return comfy_server


def test_the_nodes_and_their_checkpoints_are_listed(server):
    info = server.get("/object_info")
    for node_id in NODES:
        assert node_id in info, f"{node_id} missing; server log:\n{server.log_tail()}"
        assert info[node_id]["category"] == "jensen_kv/MAGI-1"
        for name, spec in info[node_id]["input"]["required"].items():
            assert spec[1].get("tooltip"), f"{node_id}.{name} has no tooltip"

    def options(spec):
        return spec[0] if isinstance(spec[0], list) else spec[1]["options"]

    assert "magi-tiny.safetensors" in options(info["JensenKVLoadMagi1"]["input"]["required"]["model_name"])
    assert "magi_vae_tiny/" in options(info["JensenKVLoadMagi1VAE"]["input"]["required"]["vae_name"])
    assert info["JensenKVLoadMagi1"]["output"] == ["MODEL"]
    assert info["JensenKVLoadMagi1VAE"]["output"] == ["MAGI1_VAE"]


def test_a_prompt_decodes_a_latent_through_the_magi1_vae(server):
    prompt = {
        "1": {"class_type": "JensenKVLoadMagi1VAE", "inputs": {"vae_name": "magi_vae_tiny/", "dtype": "fp32"}},
        "2": {
            "class_type": "EmptyHunyuanLatentVideo",
            "inputs": {"width": 32, "height": 32, "length": 5, "batch_size": 1},
        },
        "3": {
            "class_type": "JensenKVMagi1VAEDecode",
            "inputs": {
                "magi1_vae": ["1", 0],
                "samples": ["2", 0],
                "tile_pixels": 256,
                "tile_frames": 12,
                "overlap": 0.25,
            },
        },
        "4": {"class_type": "PreviewImage", "inputs": {"images": ["3", 0]}},
    }
    entry = server.run_prompt(prompt, timeout=300, client_id=uuid.uuid4().hex)
    images = entry["outputs"]["4"]["images"]
    assert len(images) == 8  # 2 latent frames -> 8 frames


def test_a_prompt_samples_magi1_through_int2_and_jensen(server):
    """Load MAGI-1 Model -> Quantize KV Cache (INT2) -> Jensen Bias Correction -> MAGI-1 AR Sampler (a random
    caption from the test conditioning node, marked as MAGI-1 Text Encode marks its output) -> MAGI-1 VAE Decode."""
    prompt = {
        "1": {
            "class_type": "JensenKVLoadMagi1",
            "inputs": {"model_name": "magi-tiny-tokens.safetensors", "weight_dtype": "default", "variant": "auto"},
        },
        **int2_jensen(["1", 0]),
        "4": {
            "class_type": "JensenKVTestConditioning",
            "inputs": {"seed": 0, "tokens": 7, "width": 32, "magi1_caption": True},
        },
        "5": {
            "class_type": "JensenKVMagi1ARSampler",
            "inputs": {
                "model": ["3", 0],
                "positive": ["4", 0],
                "width": 64,
                "height": 64,
                "frames": 48,
                "seed": 1234,
                "steps": 4,
                "window_size": 4,
                "cfg": "auto",
                "kv_ranges": "5,4,3,2",
                "window_chunks": 0,
                "sink_chunks": 0,
                "special_tokens": True,
            },
        },  # fmt: skip
        "6": {"class_type": "JensenKVLoadMagi1VAE", "inputs": {"vae_name": "magi_vae_tiny/", "dtype": "fp32"}},
        "7": {
            "class_type": "JensenKVMagi1VAEDecode",
            "inputs": {
                "magi1_vae": ["6", 0],
                "samples": ["5", 0],
                "tile_pixels": 256,
                "tile_frames": 12,
                "overlap": 0.25,
            },
        },
        "8": {"class_type": "PreviewImage", "inputs": {"images": ["7", 0]}},
    }
    entry = server.run_prompt(prompt, timeout=600, client_id=uuid.uuid4().hex)
    report = entry["outputs"]["5"]["jensen_kv_report"][0]
    assert (report["key_bits"], report["correction"], report["chunks"]) == (2, "taylor", 2)
    assert report["kv_heads"] == 2 and report["heads"] == 4 and report["cfg_number"] == 3  # the tiny file is base
    assert 0 < report["cache_bytes"] == report["planned_bytes"] < report["bf16_bytes"]
    assert "K/V heads" in entry["outputs"]["5"]["text"][0]
    assert len(entry["outputs"]["8"]["images"]) == 12 * 4  # 2 chunks of 6 latent frames, 4 frames each


def test_a_bad_kv_range_is_refused_before_it_runs(server):
    prompt = {
        "1": {
            "class_type": "JensenKVLoadMagi1",
            "inputs": {"model_name": "magi-tiny-tokens.safetensors", "weight_dtype": "default", "variant": "auto"},
        },
        "4": {"class_type": "JensenKVTestConditioning", "inputs": {"seed": 0, "tokens": 7, "width": 32}},
        "5": {
            "class_type": "JensenKVMagi1ARSampler",
            "inputs": {
                "model": ["1", 0],
                "positive": ["4", 0],
                "width": 64,
                "height": 64,
                "frames": 24,
                "seed": 0,
                "steps": 16,
                "window_size": 4,
                "cfg": "auto",
                "kv_ranges": "5,4,three",
                "window_chunks": 0,
                "sink_chunks": 0,
                "special_tokens": True,
            },
        },  # fmt: skip
        "6": {"class_type": "JensenKVMagi1VAEDecode", "inputs": {"magi1_vae": ["7", 0], "samples": ["5", 0]}},
        "7": {"class_type": "JensenKVLoadMagi1VAE", "inputs": {"vae_name": "magi_vae_tiny/", "dtype": "fp32"}},
        "8": {"class_type": "PreviewImage", "inputs": {"images": ["6", 0]}},
    }
    status, body = server.post("/prompt", {"prompt": prompt, "client_id": uuid.uuid4().hex})
    assert status == 400 and "5" in body["node_errors"], body
    assert "'all'" in json.dumps(body["node_errors"]["5"])
