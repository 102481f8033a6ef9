"""Krea Realtime 14B's single-file layout through the converter and ComfyUI's own loader, on a real tiny Wan.

A tiny detectable Wan saved as one bf16 safetensors file with every key under ``model.`` (the layout scope
strips before loading) is converted by the command line, detected by ComfyUI as WAN21 T2V and loaded by
``comfy.sd.load_diffusion_model`` (what UNETLoader calls) with the same weights.
"""

from __future__ import annotations

import torch
from safetensors.torch import save_file
from support import wan_tiny
from support.pack import load_tool

cc = load_tool("convert_checkpoint")


def test_a_krea_style_file_loads_as_wan21_t2v_with_its_bytes(comfy, tmp_path, capsys):
    from comfy import model_base
    from comfy import sd as comfy_sd

    sd = {k: v.to(torch.bfloat16) for k, v in wan_tiny.state_dict_for_file(seed=2).items()}
    src, out = tmp_path / "krea-realtime-video-14b.safetensors", tmp_path / "krea.safetensors"
    save_file({f"model.{k}": v for k, v in sd.items()}, str(src))
    assert cc.main([str(src), str(out), "--comfyui", str(comfy)]) == 0
    report = capsys.readouterr().out
    assert "key prefixes 'model.' stripped" in report
    assert "ComfyUI detection: WAN21_T2V (image_model 'wan2.1', model_type 't2v')" in report, report
    patcher = comfy_sd.load_diffusion_model(str(out))
    assert isinstance(patcher.model, model_base.WAN21)
    loaded = patcher.model.diffusion_model.state_dict()
    assert sorted(loaded) == sorted(sd)
    for k, v in sd.items():
        assert torch.equal(loaded[k].float(), v.float()), k
    # the same file without the converter: ComfyUI does not find the model under the prefix
    src_detect = cc.meta_state_dict(cc.read_safetensors_header(src)[0])
    try:
        found = cc.comfyui_detect(src_detect, comfy)
    except cc.ConversionError:
        found = None
    assert found is None or "WAN21_T2V" not in found
