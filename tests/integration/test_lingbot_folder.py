"""LingBot-World 2.0 as Robbyant publishes it (issue 41: workflows whose files need no conversion): the release is a
diffusers folder (``transformers/``: ``config.json``, ``diffusion_pytorch_model.safetensors.index.json`` and the
shards, float32, official names), what ``huggingface-cli download robbyant/lingbot-world-v2-1.3b-causal-fast`` puts
on disk. Load LingBot-World lists it as ``name/`` and reads it as it is: the same model as the merged file. The
planner reads the folder's headers and config.

Files are synthetic: the tiny LingBot-World (``jensen_testing.lingbot_tiny``) split into shards with an index.
"""

from __future__ import annotations

import importlib
import json

import pytest
import torch
from safetensors.torch import save_file
from support import comfyui as support_comfyui

from jensen_testing import lingbot_tiny as lt

FOLDER = "lingbot-world-v2-1.3b-causal-fast/transformers/"


def pack_module(name: str):
    return importlib.import_module(f"{support_comfyui.PACK_MODULE}.{name}")


def write_release(folder, sd, shards=3, config=None) -> list:
    """``sd`` as diffusers saves a sharded model: shards, their index and config.json."""
    folder.mkdir(parents=True, exist_ok=True)
    names = sorted(sd)
    wmap, paths = {}, []
    for i in range(shards):
        shard = f"diffusion_pytorch_model-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_file({k: sd[k].contiguous() for k in names[i::shards]}, str(folder / shard))
        wmap.update(dict.fromkeys(names[i::shards], shard))
        paths.append(folder / shard)
    (folder / "diffusion_pytorch_model.safetensors.index.json").write_text(json.dumps({"weight_map": wmap}))
    cfg = {
        "_class_name": "WanModelFast",
        "dim": lt.TINY.dim,
        "num_heads": lt.TINY.num_heads,
        "text_len": lt.TINY.text_len,
    }
    (folder / "config.json").write_text(json.dumps(config or cfg))
    return paths


@pytest.fixture
def models(comfy, tmp_path):
    import folder_paths

    (tmp_path / "diffusion_models").mkdir()
    folder_paths.add_model_folder_path("diffusion_models", str(tmp_path / "diffusion_models"))
    yield tmp_path / "diffusion_models"
    paths = folder_paths.folder_names_and_paths["diffusion_models"][0]
    if str(tmp_path / "diffusion_models") in paths:
        paths.remove(str(tmp_path / "diffusion_models"))


def test_the_release_folder_is_listed_once_and_loads_as_the_merged_file(pack, nodes, models):
    sd = lt.tiny_state_dict()
    shards = write_release(models / FOLDER, sd)
    keys = pack_module("runtime.families.lingbot.model.keys")
    plain = {k: v for k, v in sd.items() if k not in keys.dropped_by_comfyui(sd)}
    write_release(models / "wan-2.1-diffusers" / "transformer", plain)  # a Wan folder: not LingBot's
    save_file(sd, str(models / "merged.safetensors"), metadata={"num_heads": "4", "text_len": "16"})
    ln = pack_module("nodes.lingbot")
    listed = ln.lingbot_choices()
    assert FOLDER in listed and "merged.safetensors" in listed
    assert not [n for n in listed if n.startswith(FOLDER) and n != FOLDER]  # its shards are not listed as files
    assert not [n for n in listed if n.startswith("wan-2.1-diffusers")]
    assert ln.JensenKVLoadLingBot.validate_inputs(FOLDER) is True
    node = ln.JensenKVLoadLingBot
    from_folder = node.execute(FOLDER, "fp32").args[0].model.diffusion_model
    from_file = node.execute("merged.safetensors", "fp32").args[0].model.diffusion_model
    a, b = from_folder.state_dict(), from_file.state_dict()
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    assert (from_folder.num_heads, from_folder.text_len) == (4, 16)  # from config.json

    before = node.fingerprint_inputs(FOLDER, "fp32")
    shards[1].unlink()
    assert node.fingerprint_inputs(FOLDER, "fp32") != before
    with pytest.raises(ValueError, match=r"lacks 1 of its 3 shards \(diffusion_pytorch_model-00002-of-00003"):
        node.execute(FOLDER, "fp32")


def test_the_planner_reads_the_folder_as_its_loader_does(pack, models):
    write_release(models / FOLDER, lt.tiny_state_dict())
    ui = pack_module("routes.ui")
    family, _, preset, note = ui.model_of_file({"model_file": FOLDER})
    assert note is None and family.__name__ == "LingBotFamily"
    assert (preset.dims, preset.heads) == ((lt.TINY.num_layers, lt.TINY.num_heads, lt.TINY.dim // lt.TINY.num_heads), 4)
    outside = ui.model_of_file({"model_file": "../../etc/"})
    assert outside[0] is None and "not in models/diffusion_models" in outside[3]
