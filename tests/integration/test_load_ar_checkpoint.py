"""Load AR Video Checkpoint (nodes/wan.py, runtime/families/wan/loader.py) on a real tiny Wan: the checkpoints as
published give the MODEL UNETLoader gives on the file tools/convert_checkpoint.py writes, bit for bit; the LoRA merge
is the CLI's --lora; causal picks core's WAN21_CausalAR (v0.27+) or is refused with the version and the fix (v0.3.64);
refusals name the file and the fix. Runs on all three ComfyUI versions."""

from __future__ import annotations

import asyncio
import importlib
import zipfile

import pytest
import torch
from support import comfyui as support_comfyui
from support import wan_tiny
from support.pack import load_tool

cc = load_tool("convert_checkpoint")


def pack_module(name: str):
    return importlib.import_module(f"{support_comfyui.PACK_MODULE}.{name}")


def fsdp(k: str) -> str:
    """Self-Forcing's FSDP layout: ``model._fsdp_wrapped_module.blocks.0._fsdp_wrapped_module.x``."""
    if k.startswith("blocks."):
        i, rest = k.split(".", 2)[1:]
        return f"model._fsdp_wrapped_module.blocks.{i}._fsdp_wrapped_module.{rest}"
    return f"model.{k}"


@pytest.fixture(scope="module")
def weights(comfy):
    """EMA and non-EMA weights of one tiny detectable Wan (two seeds, so picking the wrong one shows)."""
    return wan_tiny.state_dict_for_file(seed=0), wan_tiny.state_dict_for_file(seed=1)


@pytest.fixture
def self_forcing_pt(weights, tmp_path):
    ema, gen = weights
    path = tmp_path / "self_forcing_dmd.pt"
    torch.save(
        {
            "generator": {fsdp(k): v for k, v in gen.items()},
            "generator_ema": {f"model.{k}": v for k, v in ema.items()},
            "critic": {"model.head.head.weight": torch.zeros(4, 4)},
        },
        path,
    )
    return path


@pytest.fixture
def folders(comfy, tmp_path, monkeypatch):
    """models/diffusion_models of this test only (the node reads ComfyUI's folder list; LongLive's lora.pt goes there
    too, beside its base)."""
    import folder_paths

    dm = tmp_path / "diffusion_models"
    dm.mkdir()
    exts = folder_paths.supported_pt_extensions
    monkeypatch.setitem(folder_paths.folder_names_and_paths, "diffusion_models", ([str(dm)], exts))
    monkeypatch.setattr(folder_paths, "filename_list_cache", {})
    return dm


def unetloader(path, weight_dtype: str = "default"):
    """What core's UNETLoader does with ``path`` (its widget mapped as it maps it)."""
    import folder_paths

    import nodes as comfy_nodes

    name = path.name
    old = folder_paths.folder_names_and_paths["diffusion_models"]
    folder_paths.folder_names_and_paths["diffusion_models"] = ([str(path.parent)], old[1])
    try:
        folder_paths.filename_list_cache.clear()
        return comfy_nodes.UNETLoader().load_unet(name, weight_dtype)[0]
    finally:
        folder_paths.folder_names_and_paths["diffusion_models"] = old
        folder_paths.filename_list_cache.clear()


def assert_bitwise_equal(a, b):
    sa, sb = a.model.diffusion_model.state_dict(), b.model.diffusion_model.state_dict()
    assert sorted(sa) == sorted(sb)
    for k in sa:
        assert sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]), k
    assert type(a.model) is type(b.model) and type(a.model.model_config) is type(b.model.model_config)


def run_node(node_cls, **inputs):
    return node_cls.execute(**inputs).result[0]


def test_the_node_is_registered_with_a_tooltip_on_every_input(pack, nodes):
    ext = asyncio.run(pack.comfy_entrypoint())
    ids = {n.define_schema().node_id for n in asyncio.run(ext.get_node_list())}
    assert "JensenKVLoadARCheckpoint" in ids
    (cls,) = nodes.FAMILY_NODES["wan"]
    schema = cls.define_schema()
    assert schema.display_name == "Load AR Video Checkpoint"
    assert [i.id for i in schema.inputs] == ["ckpt_name", "lora_name", "weights", "weight_dtype", "causal"]
    assert all(inp.tooltip for inp in schema.inputs)


@pytest.mark.parametrize("weight_dtype", ["default", "fp8_e4m3fn"])
def test_a_self_forcing_pt_loads_as_unetloader_loads_the_converted_file(
    nodes, weights, self_forcing_pt, folders, tmp_path, capsys, weight_dtype
):
    """generator_ema by default (auto), generator on request: each the MODEL UNETLoader gives on the CLI's file."""
    dm = folders
    (dm / self_forcing_pt.name).write_bytes(self_forcing_pt.read_bytes())
    (cls,) = nodes.FAMILY_NODES["wan"]
    for weights_choice, key in (("auto", None), ("generator", "generator")):
        out = tmp_path / f"converted-{weights_choice}.safetensors"
        assert cc.main([str(self_forcing_pt), str(out), *(["--key", key] if key else [])]) == 0
        reference = unetloader(out, weight_dtype)
        model = run_node(cls, ckpt_name=self_forcing_pt.name, weights=weights_choice, weight_dtype=weight_dtype)
        assert_bitwise_equal(model, reference)
    capsys.readouterr()
    ema, gen = weights
    auto = run_node(cls, ckpt_name=self_forcing_pt.name).model.diffusion_model.state_dict()
    picked = run_node(cls, ckpt_name=self_forcing_pt.name, weights="generator").model.diffusion_model.state_dict()
    k = "blocks.0.self_attn.q.weight"
    assert torch.equal(auto[k].float(), ema[k].bfloat16().float())
    assert torch.equal(picked[k].float(), gen[k].bfloat16().float()) and not torch.equal(auto[k], picked[k])


def test_a_longlive_base_and_lora_merge_as_the_clis_lora(nodes, weights, folders, tmp_path):
    base = weights[0]
    g = torch.Generator().manual_seed(3)
    targets = [k for k in base if k.startswith("blocks.") and base[k].ndim == 2]
    lora = {}
    for k in targets:
        module = k.removesuffix(".weight")
        out_f, in_f = base[k].shape
        lora[f"base_model.model.{module}.lora_A.weight"] = torch.randn(2, in_f, generator=g)
        lora[f"base_model.model.{module}.lora_B.weight"] = torch.randn(out_f, 2, generator=g) / 8
    dm = folders
    src, lora_path = dm / "longlive_base.pt", dm / "longlive_lora.pt"
    torch.save({"generator": {f"model.{k}": v for k, v in base.items()}}, src)
    torch.save({"generator_lora": lora}, lora_path)
    out = tmp_path / "longlive.safetensors"
    assert cc.main([str(src), str(out), "--lora", str(lora_path)]) == 0
    (cls,) = nodes.FAMILY_NODES["wan"]
    model = run_node(cls, ckpt_name=src.name, lora_name=lora_path.name)
    assert_bitwise_equal(model, unetloader(out))
    plain = run_node(cls, ckpt_name=src.name).model.diffusion_model.state_dict()
    merged = model.model.diffusion_model.state_dict()
    assert not torch.equal(plain[targets[0]], merged[targets[0]])  # the LoRA changed the weights
    assert cls.validate_inputs(ckpt_name=src.name, lora_name="nope.pt").startswith("'nope.pt' is not in")
    # ComfyUI caches the node's output: a changed LoRA file (or checkpoint) must change the fingerprint
    before = cls.fingerprint_inputs(ckpt_name=src.name, lora_name=lora_path.name)
    assert before == cls.fingerprint_inputs(ckpt_name=src.name, lora_name=lora_path.name)
    torch.save({"generator_lora": {k: v * 2 for k, v in lora.items()}, "x": torch.zeros(3)}, lora_path)
    assert cls.fingerprint_inputs(ckpt_name=src.name, lora_name=lora_path.name) != before
    assert cls.fingerprint_inputs(ckpt_name=src.name, lora_name="none") != before


def test_causal_gives_core_causal_wan_or_a_clear_refusal(pack, weights, self_forcing_pt, tmp_path):
    """v0.27+: WAN21_CausalAR with the weights of the CLI's --causal file; v0.3.64: one error naming the version and
    the fix, nothing loaded."""
    import comfy.model_base

    loader = pack_module("runtime.families.wan.loader")
    if loader.takes_metadata():
        assert hasattr(comfy.model_base, "WAN21_CausalAR")
        out = tmp_path / "causal.safetensors"
        assert cc.main([str(self_forcing_pt), str(out), "--causal"]) == 0
        model, text = loader.load_ar_checkpoint(self_forcing_pt, causal=True)
        assert type(model.model) is comfy.model_base.WAN21_CausalAR and "WAN21_CausalAR" in text
        assert_bitwise_equal(model, unetloader(out))
        plain, _ = loader.load_ar_checkpoint(self_forcing_pt)
        assert type(plain.model) is comfy.model_base.WAN21
    else:
        assert not hasattr(comfy.model_base, "WAN21_CausalAR")
        with pytest.raises(ValueError) as e:
            loader.load_ar_checkpoint(self_forcing_pt, causal=True)
        text = str(e.value)
        assert "self_forcing_dmd.pt" in text and "ComfyUI v0.27 or newer" in text and "ComfyUI 0.3.64" in text, text
        assert "Set causal to false" in text
        plain, _ = loader.load_ar_checkpoint(self_forcing_pt)
        assert type(plain.model) is comfy.model_base.WAN21


class _Payload:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_refusals_name_the_file_and_the_fix(pack, weights, tmp_path, monkeypatch):
    loader = pack_module("runtime.families.wan.loader")
    ck = pack_module("runtime.families.wan.model.checkpoint")

    def refused(path, *pattern, **kw):
        with pytest.raises(ck.ConversionError) as e:
            loader.load_ar_checkpoint(path, **kw)
        text = str(e.value)
        assert text.startswith(path.name + ":") and text.count(path.name) >= 1, text
        for p in pattern:
            assert p in text, (p, text)
        assert text.endswith(loader.FIX), text  # and what to do

    not_wan = tmp_path / "sdxl_unet.pt"
    torch.save({"generator": {"model.input_blocks.0.0.weight": torch.zeros(4, 4)}}, not_wan)
    refused(not_wan, "not a Wan 2.1 diffusion model")

    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.pt"
    torch.save({"generator": {f"model.{k}": v for k, v in weights[0].items()}, "x": _Payload(marker)}, evil)
    refused(evil, "holds Python objects other than tensors", "get the file from its official source")
    assert not marker.exists()

    packed = tmp_path / "packed.pt"
    src = tmp_path / "plain.pt"
    torch.save({"generator": weights[0]}, src)
    with zipfile.ZipFile(src) as z, zipfile.ZipFile(packed, "w") as out:
        for info in z.infolist():
            out.writestr(info.filename, z.read(info.filename), compress_type=zipfile.ZIP_DEFLATED)
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("torch.load ran"))
    refused(packed, "is compressed", "refused before loading")
    monkeypatch.undo()

    refused(tmp_path / "missing.pt", "does not exist")
    refused(src, "weights 'generator_ema': the checkpoint has no such entry (it has 'generator')", "set weights to auto",
            weights="generator_ema")  # fmt: skip


def test_a_krea_style_safetensors_loads_with_its_prefix_stripped(pack, weights, tmp_path):
    """Krea Realtime 14B's layout: one safetensors file, ``model.`` in front of every key; the node gives the MODEL
    UNETLoader gives on the CLI's copy (tensor bytes unchanged)."""
    from safetensors.torch import save_file

    loader = pack_module("runtime.families.wan.loader")
    src = tmp_path / "krea-realtime-video-14b.safetensors"
    save_file({f"model.{k}": v.bfloat16() for k, v in weights[0].items()}, str(src))
    out = tmp_path / "krea.safetensors"
    assert cc.main([str(src), str(out)]) == 0
    model, text = loader.load_ar_checkpoint(src)
    assert "model. stripped" in text
    assert_bitwise_equal(model, unetloader(out))
