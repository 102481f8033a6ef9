"""tools/convert_checkpoint.py on Krea Realtime 14B's single-file safetensors (small synthetic stand-ins).

scope (daydreamlive/scope 68b0f95, ``wan2_1/components/generator.py``) loads
``krea-realtime-video-14b.safetensors`` as a flat state dict and drops a ``model.`` in front of every key
when all keys carry it; the converter detects such wrapper prefixes, strips them by rewriting the header
only, and refuses a prefix it does not know with a listing of every prefix found.
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file
from support.pack import load_tool
from test_convert_checkpoint import comfyui_reads, fake_wan, st_metadata

cc = load_tool("convert_checkpoint")


def _krea_file(path, prefix="model.", extra=None, dtype=torch.bfloat16):
    sd = {k: v.to(dtype) for k, v in fake_wan(5).items()}
    save_file({prefix + k: v for k, v in {**sd, **(extra or {})}.items()}, str(path))
    return sd


@pytest.mark.parametrize("prefix", ["model.", "diffusion_model.", "model._fsdp_wrapped_module.", "module._orig_mod."])
def test_a_prefixed_single_file_is_stripped_with_its_bytes_unchanged(tmp_path, capsys, prefix):
    src, out = tmp_path / "krea-realtime-video-14b.safetensors", tmp_path / "krea.safetensors"
    sd = _krea_file(src, prefix)
    assert cc.main([str(src), str(out)]) == 0  # no --causal needed: there is something to convert
    written = load_file(str(out))
    assert sorted(written) == sorted(sd)
    for k, v in sd.items():
        assert written[k].dtype == torch.bfloat16 and torch.equal(written[k], v), k
    _, data_in = cc.read_safetensors_header(src)
    _, data_out = cc.read_safetensors_header(out)
    assert out.read_bytes()[data_out:] == src.read_bytes()[data_in:]
    meta = st_metadata(out)
    assert meta["stripped_prefixes"] == prefix and meta["converted_from"] == src.name
    assert "config" not in meta  # not flagged causal unless asked
    assert f"key prefixes {prefix!r} stripped" in capsys.readouterr().out


def test_causal_flags_a_prefixed_file_too(tmp_path):
    src, out = tmp_path / "k.safetensors", tmp_path / "o.safetensors"
    _krea_file(src)
    assert cc.main([str(src), str(out), "--causal"]) == 0
    assert comfyui_reads(st_metadata(out)) == {"causal_ar": True}


@pytest.mark.parametrize(
    "prefix,unknown", [("net.", "'net.'"), ("generator.model.", "'generator.model.'"), ("model.ema.", "'model.ema.'")]
)
def test_an_unknown_prefix_is_refused_with_a_listing_of_every_prefix(tmp_path, capsys, prefix, unknown):
    src, out = tmp_path / "k.safetensors", tmp_path / "o.safetensors"
    _krea_file(src, prefix)
    assert cc.main([str(src), str(out)]) == 2
    err = capsys.readouterr().err
    assert f"unknown key prefix {unknown}" in err
    assert f"{unknown}: " in err and "keys, e.g. " in err and "Known wrappers: model., module." in err
    assert not out.exists()


def test_mixed_prefixes_list_each_with_its_count(tmp_path, capsys):
    src, out = tmp_path / "k.safetensors", tmp_path / "o.safetensors"
    sd = fake_wan(1)
    save_file({("model." if i % 2 else "vendor.") + k: v for i, (k, v) in enumerate(sorted(sd.items()))}, str(src))
    assert cc.main([str(src), str(out)]) == 2
    err = capsys.readouterr().err
    n = len(sd)
    assert f"'model.': {n // 2} keys" in err and f"'vendor.': {n - n // 2} keys" in err


def test_key_prefixes_finds_the_path_before_the_wan_module():
    keys = ["model.blocks.0.ffn.0.weight", "model.head.modulation", "blocks.1.x", "freqs", "a.b.patch_embedding.weight"]
    assert cc.key_prefixes(keys) == {
        "model.": ["model.blocks.0.ffn.0.weight", "model.head.modulation"],
        "": ["blocks.1.x"],
        "a.b.": ["a.b.patch_embedding.weight"],
    }
    assert cc.check_prefixes(["model.blocks.0.w", "model._fsdp_wrapped_module.head.w"]) == [
        "model.",
        "model._fsdp_wrapped_module.",
    ]


def test_a_prefixed_file_that_is_no_wan_t2v_is_still_refused(tmp_path, capsys):
    src, out = tmp_path / "k.safetensors", tmp_path / "o.safetensors"
    _krea_file(src, extra={"img_emb.proj.0.bias": torch.zeros(4)})
    assert cc.main([str(src), str(out)]) == 2
    assert "not text-to-video" in capsys.readouterr().err
    assert not out.exists()
