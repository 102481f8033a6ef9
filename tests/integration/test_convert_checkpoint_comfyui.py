"""tools/convert_checkpoint.py on a real tiny Wan: every training layout comes out as a file ComfyUI loads as WAN21 T2V.

The checkpoints are built from ComfyUI's own Wan classes (``wan_tiny.state_dict_for_file``, which
ComfyUI's detection recognises), wrapped as Self-Forcing and CausVid save them, converted by the
command line, then loaded by ``comfy.sd.load_diffusion_model`` (what UNETLoader calls).
"""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file
from support import wan_tiny
from support.pack import load_tool

cc = load_tool("convert_checkpoint")


def with_prefix(sd, fn):
    return {fn(k): v for k, v in sd.items()}


def causvid_key(k: str) -> str:
    if k.startswith("blocks."):
        i, rest = k.split(".", 2)[1:]
        return f"model._fsdp_wrapped_module.blocks.{i}._fsdp_wrapped_module.{rest}"
    return f"model._fsdp_wrapped_module.{k}"


@pytest.fixture(scope="module")
def weights(comfy):
    """EMA and non-EMA weights of one tiny detectable Wan (two seeds, so picking the wrong one shows)."""
    return wan_tiny.state_dict_for_file(seed=0), wan_tiny.state_dict_for_file(seed=1)


def layouts(ema, gen):
    return {
        "self_forcing": {"generator": with_prefix(gen, lambda k: f"model.{k}"),
                         "generator_ema": with_prefix(ema, lambda k: f"model.{k}"),
                         "critic": {"model.head.head.weight": torch.zeros(4, 4)}},
        "causvid": {"generator": with_prefix(ema, causvid_key)},
        "bare": dict(ema),
    }


def load_like_unetloader(path):
    import comfy.sd

    return comfy.sd.load_diffusion_model(str(path))


@pytest.mark.parametrize("layout,dtype", [("self_forcing", "bf16"), ("causvid", "bf16"), ("bare", "fp16")])
def test_converted_file_loads_as_wan21_t2v_with_the_same_weights(comfy, weights, tmp_path, capsys, layout, dtype):
    ema, gen = weights
    src, out = tmp_path / f"{layout}.pt", tmp_path / f"{layout}.safetensors"
    torch.save(layouts(ema, gen)[layout], src)
    args = [str(src), str(out), "--comfyui", str(comfy)] + ([] if dtype == "bf16" else ["--dtype", dtype])
    assert cc.main(args) == 0
    report = capsys.readouterr().out
    assert "ComfyUI detection: WAN21_T2V (image_model 'wan2.1', model_type 't2v')" in report, report

    target = cc.DTYPES[dtype]
    written = load_file(str(out))
    assert sorted(written) == sorted(ema)
    for k, v in ema.items():
        assert written[k].dtype == target and torch.equal(written[k], v.to(target)), k

    patcher = load_like_unetloader(out)
    import comfy.model_base
    import comfy.supported_models

    assert type(patcher.model.model_config) is comfy.supported_models.WAN21_T2V
    assert isinstance(patcher.model, comfy.model_base.WAN21)
    loaded = patcher.model.diffusion_model.state_dict()
    assert sorted(loaded) == sorted(ema)
    for k, v in ema.items():  # ComfyUI may load in another dtype: compare through float32, exactly
        assert torch.equal(loaded[k].float(), v.to(target).float()), k


def test_comfyuis_loader_cannot_use_the_training_checkpoint_itself(comfy, weights, tmp_path):
    """Why the tool exists: UNETLoader lists .pt files, but finds no model in the CausVid nesting."""
    src = tmp_path / "causvid.pt"
    torch.save(layouts(*weights)["causvid"], src)
    with pytest.raises(RuntimeError, match="Could not detect model type"):
        load_like_unetloader(src)


def test_comfyui_detection_refuses_what_it_does_not_see_as_wan_t2v(comfy, weights):
    """ComfyUI's own detection runs on the result: a state dict ComfyUI reads as image-to-video is refused."""
    sd = cc.convert({"generator": weights[0]})
    assert cc.comfyui_detect(sd, comfy).startswith("WAN21_T2V")
    i2v = dict(sd, **{"img_emb.proj.0.bias": torch.zeros(1280), "img_emb.proj.0.weight": torch.zeros(1280),
                      "img_emb.proj.1.weight": torch.zeros(128, 1280), "img_emb.proj.1.bias": torch.zeros(128),
                      "img_emb.proj.3.weight": torch.zeros(128, 128), "img_emb.proj.3.bias": torch.zeros(128),
                      "img_emb.proj.4.weight": torch.zeros(128), "img_emb.proj.4.bias": torch.zeros(128)})
    with pytest.raises(cc.ConversionError, match="model_type 'i2v'.*would not load as Wan 2.1 T2V"):
        cc.comfyui_detect(i2v, comfy)
