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
        "self_forcing": {
            "generator": with_prefix(gen, lambda k: f"model.{k}"),
            "generator_ema": with_prefix(ema, lambda k: f"model.{k}"),
            "critic": {"model.head.head.weight": torch.zeros(4, 4)},
        },
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
    i2v = dict(
        sd,
        **{
            "img_emb.proj.0.bias": torch.zeros(1280),
            "img_emb.proj.0.weight": torch.zeros(1280),
            "img_emb.proj.1.weight": torch.zeros(128, 1280),
            "img_emb.proj.1.bias": torch.zeros(128),
            "img_emb.proj.3.weight": torch.zeros(128, 128),
            "img_emb.proj.3.bias": torch.zeros(128),
            "img_emb.proj.4.weight": torch.zeros(128),
            "img_emb.proj.4.bias": torch.zeros(128),
        },
    )
    with pytest.raises(cc.ConversionError, match="model_type 'i2v'.*would not load as Wan 2.1 T2V"):
        cc.comfyui_detect(i2v, comfy)


@pytest.mark.parametrize("drop", ["head.head.weight", "blocks.0.ffn.0.weight", "blocks.1.cross_attn.o.bias"])
def test_an_incomplete_model_is_a_conversion_error_not_a_keyerror(comfy, weights, tmp_path, capsys, drop):
    """ComfyUI's detection indexes head.head.weight and blocks.0.ffn.0.weight, so an incomplete model
    ended in an uncaught KeyError; a missing key elsewhere loaded with the weight left random. Now the tool's
    own check refuses it (exit 2, nothing written), and its detection step turns whatever ComfyUI raises into
    a ConversionError."""
    sd = dict(weights[0])
    sd.pop(drop)
    src, out = tmp_path / "in.pt", tmp_path / "out.safetensors"
    torch.save({"generator": sd}, src)
    assert cc.main([str(src), str(out), "--comfyui", str(comfy)]) == 2
    err = capsys.readouterr().err
    assert "an incomplete Wan 2.1 T2V" in err and drop in err and not out.exists()
    if drop != "blocks.1.cross_attn.o.bias":  # what ComfyUI's detection itself does with it: a KeyError, wrapped
        with pytest.raises(cc.ConversionError, match=f"ComfyUI's model detection failed .*KeyError.*{drop}"):
            cc.comfyui_detect(sd, comfy)


def test_a_longlive_base_with_its_lora_merged_loads_as_wan21_t2v(comfy, weights, tmp_path, capsys):
    """LongLive's layout: ``generator`` with ``model.`` keys, and a PEFT LoRA (``generator_lora``) on every Linear of
    every block; the merged file loads through UNETLoader's loader with W + B A (alpha = r) in every target."""
    base = weights[0]
    g = torch.Generator().manual_seed(3)
    targets = [k for k in base if k.startswith("blocks.") and base[k].ndim == 2]  # q, k, v, o, ffn.0, ffn.2
    assert {k.split(".", 2)[2] for k in targets} >= {"self_attn.q.weight", "cross_attn.o.weight", "ffn.2.weight"}
    lora = {}
    for k in targets:
        module = k.removesuffix(".weight")
        out_f, in_f = base[k].shape
        lora[f"base_model.model.{module}.lora_A.weight"] = torch.randn(2, in_f, generator=g)
        lora[f"base_model.model.{module}.lora_B.weight"] = torch.randn(out_f, 2, generator=g) / 8
    src, lora_path, out = tmp_path / "longlive_base.pt", tmp_path / "lora.pt", tmp_path / "longlive.safetensors"
    torch.save({"generator": with_prefix(base, lambda k: f"model.{k}")}, src)
    torch.save({"generator_lora": lora}, lora_path)
    args = [str(src), str(out), "--key", "generator", "--lora", str(lora_path), "--dtype", "fp32"]
    assert cc.main([*args, "--comfyui", str(comfy)]) == 0
    report = capsys.readouterr().out
    assert "ComfyUI detection: WAN21_T2V" in report and f"merged LoRA lora.pt ({len(targets)} modules, rank 2" in report
    ref = dict(base)
    for k in targets:
        m = k.removesuffix(".weight")
        delta = (
            lora[f"base_model.model.{m}.lora_B.weight"].double() @ lora[f"base_model.model.{m}.lora_A.weight"].double()
        )
        ref[k] = base[k].double() + delta
    loaded = load_like_unetloader(out).model.diffusion_model.state_dict()
    assert sorted(loaded) == sorted(base)
    for k, v in ref.items():
        torch.testing.assert_close(loaded[k].double(), v.double(), atol=1e-5, rtol=1e-5, msg=k)
    assert not torch.allclose(loaded[targets[0]].double(), base[targets[0]].double(), atol=1e-3)


# ----------------------------------------------------------------------------- --causal: core's AR model class (v0.27+)
def has_core_ar() -> bool:
    """Whether this ComfyUI has core's causal AR path (v0.27+: WAN21_CausalAR, chosen from the metadata flag)."""
    import comfy.model_base

    return hasattr(comfy.model_base, "WAN21_CausalAR")


def convert_bare(comfy, ema, tmp_path, capsys, *flags) -> tuple:
    src, out = tmp_path / "bare.pt", tmp_path / "bare.safetensors"
    torch.save(dict(ema), src)
    assert cc.main([str(src), str(out), "--comfyui", str(comfy), "--dtype", "fp32", *flags]) == 0
    return out, capsys.readouterr().out


def assert_same_weights(patcher, ref: dict):
    loaded = patcher.model.diffusion_model.state_dict()
    assert sorted(loaded) == sorted(ref)
    for k, v in ref.items():
        assert torch.equal(loaded[k].float(), v.float()), k


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
def test_causal_flag_picks_the_model_class_this_comfyui_has(comfy, weights, tmp_path, capsys, causal):
    """Without --causal: WAN21 T2V on every ComfyUI. With it: WAN21_CausalAR where ComfyUI has core's AR path
    (v0.27+), else (v0.3.64) still plain WAN21 T2V: older ComfyUI ignores the flag."""
    comfy_dir = comfy  # the fixture's folder: "import comfy.x" below rebinds the name to the package
    import comfy.model_base
    import comfy.supported_models
    from comfy.ldm.wan.model import WanModel

    out, report = convert_bare(comfy_dir, weights[0], tmp_path, capsys, *(["--causal"] if causal else []))
    patcher = load_like_unetloader(out)
    if causal and has_core_ar():
        from comfy.ldm.wan.ar_model import CausalWanModel

        assert type(patcher.model) is comfy.model_base.WAN21_CausalAR
        assert type(patcher.model.model_config) is comfy.supported_models.WAN21_CausalAR_T2V
        assert type(patcher.model.diffusion_model) is CausalWanModel
        assert "ComfyUI detection: WAN21_CausalAR_T2V (image_model 'wan2.1', model_type 't2v')" in report, report
    else:
        assert type(patcher.model) is comfy.model_base.WAN21
        assert type(patcher.model.model_config) is comfy.supported_models.WAN21_T2V
        assert type(patcher.model.diffusion_model) is WanModel
        assert "ComfyUI detection: WAN21_T2V (image_model 'wan2.1', model_type 't2v')" in report, report
        assert ("has no causal AR model class" in report) == causal
    assert not patcher.model.image_to_video and patcher.model.diffusion_model.model_type == "t2v"
    assert_same_weights(patcher, weights[0])


@pytest.mark.core_ar
def test_causal_copy_of_a_plain_file_loads_as_core_causal_wan(comfy, weights, tmp_path, capsys):
    """v0.27: a plain converted file, copied with --causal (the .safetensors path), loads through UNETLoader's
    loader as WAN21_CausalAR / CausalWanModel with the plain file's weights; only the metadata differs."""
    comfy_dir = comfy  # the fixture's folder: "import comfy.x" below rebinds the name to the package
    import comfy.model_base

    assert has_core_ar(), "this ComfyUI has no comfy.model_base.WAN21_CausalAR (core's AR path, v0.27+)"
    from comfy.ldm.wan.ar_model import CausalWanModel, CausalWanSelfAttention

    plain, _ = convert_bare(comfy_dir, weights[0], tmp_path, capsys)
    causal = tmp_path / "bare-causal.safetensors"
    assert cc.main([str(plain), str(causal), "--causal", "--comfyui", str(comfy_dir)]) == 0
    assert "ComfyUI detection: WAN21_CausalAR_T2V" in capsys.readouterr().out
    p, c = load_like_unetloader(plain), load_like_unetloader(causal)
    assert type(p.model) is comfy.model_base.WAN21 and type(c.model) is comfy.model_base.WAN21_CausalAR
    dm = c.model.diffusion_model
    assert type(dm) is CausalWanModel and all(type(b.self_attn) is CausalWanSelfAttention for b in dm.blocks)
    assert_same_weights(p, weights[0])
    assert_same_weights(c, weights[0])
    # core's causal config samples at shift 5, Wan 2.1's at 8 (a sampling default, not part of the weights)
    assert float(c.model.model_sampling.shift) == 5.0 and float(p.model.model_sampling.shift) == 8.0


# ----------------------------------------------------------------------------- the pack's tiny AR model
def _tiny_model_path():
    from support import tiny_ar

    return tiny_ar.MODEL_PATH


def test_the_committed_tiny_model_carries_the_causal_flag_and_loads_on_both_paths(comfy):
    """models/tiny_ar/jensen-kv-tiny-ar.safetensors carries the training tool's metadata plus the causal flag (written
    with ``convert_checkpoint.py --causal``: tensors unchanged): UNETLoader loads it as WAN21_CausalAR on ComfyUI
    v0.27+ (core's SamplerARVideo runs it) and as plain WAN21 T2V on older ComfyUI (dim 256 = 2 heads of 128,
    4096-wide text)."""
    import comfy.model_base

    header, _ = cc.read_safetensors_header(_tiny_model_path())
    meta = header["__metadata__"]
    assert meta["format"] == "jensen_kv_tiny_ar" and cc.is_causal(meta)
    patcher = load_like_unetloader(_tiny_model_path())
    expected = getattr(comfy.model_base, "WAN21_CausalAR", comfy.model_base.WAN21)
    assert type(patcher.model) is expected
    dm = patcher.model.diffusion_model
    assert (dm.dim, dm.num_heads, len(dm.blocks), dm.model_type) == (256, 2, 4, "t2v")


def test_a_causal_copy_of_the_tiny_model_leaves_the_committed_file_alone(comfy, tmp_path, capsys):
    comfy_dir = comfy  # the fixture's folder: "import comfy.x" below rebinds the name to the package
    import hashlib

    import comfy.model_base

    src = _tiny_model_path()
    digest = hashlib.sha256(src.read_bytes()).hexdigest()
    out = tmp_path / "jensen-kv-tiny-ar-causal.safetensors"
    assert cc.main([str(src), str(out), "--causal", "--comfyui", str(comfy_dir)]) == 0
    report = capsys.readouterr().out
    assert hashlib.sha256(src.read_bytes()).hexdigest() == digest
    h_in, d_in = cc.read_safetensors_header(src)
    h_out, d_out = cc.read_safetensors_header(out)
    assert h_out["__metadata__"] == h_in["__metadata__"]  # already causal: the copy changes nothing but the file
    assert cc.is_causal(h_out["__metadata__"])
    assert out.read_bytes()[d_out:] == src.read_bytes()[d_in:]  # every tensor byte as committed
    patcher = load_like_unetloader(out)
    plain = load_like_unetloader(src)
    expect = comfy.model_base.WAN21_CausalAR if has_core_ar() else comfy.model_base.WAN21
    assert type(patcher.model) is expect
    assert ("WAN21_CausalAR_T2V" in report) == has_core_ar(), report
    assert_same_weights(patcher, plain.model.diffusion_model.state_dict())
