"""tools/convert_checkpoint.py --magi1 / --magi1-vae without ComfyUI: Sand AI's folders into one checked file.

The folders are synthetic: a tiny MAGI-1 DiT (``runtime.families.magi1.model.config.TINY``, seeded weights in bf16, the reference's
tensor names) split into shards with a ``model.safetensors.index.json``, and a tiny ViT VAE folder.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from support.pack import load_tool

from jensen_testing.magi1_tiny import seeded_weights
from runtime.families.magi1.model import checkpoint as ck
from runtime.families.magi1.model.caption import SPECIAL_TOKEN_ROWS
from runtime.families.magi1.model.config import TINY, MagiConfig, expected_shapes
from runtime.families.magi1.model.dit import MagiDiT
from runtime.families.magi1.model.vae import VAEConfig, decoder_shapes

cc = load_tool("convert_checkpoint")
VAE_TINY = VAEConfig(video_size=32, video_length=8, embed_dim=256, depth=2, num_heads=4)


def tiny_sd(cfg=TINY) -> dict[str, torch.Tensor]:
    return {k: v.to(torch.bfloat16) for k, v in seeded_weights(expected_shapes(cfg)).items()}


def shard(folder, sd, n=3, zst=(), index_extra=None):
    folder.mkdir(parents=True, exist_ok=True)
    names = sorted(sd)
    wmap = {}
    for i in range(n):
        name = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        part = {k: sd[k] for k in names[i::n]}
        save_file(part, str(folder / name))
        if i in zst:
            (folder / name).rename(folder / (name + ".zst"))
        wmap.update({k: name for k in part})
    wmap.update(index_extra or {})
    (folder / ck.INDEX).write_text(json.dumps({"metadata": {"total_size": 0}, "weight_map": wmap}))
    return folder


def run(*args) -> int:
    return cc.main([str(a) for a in args])


def test_a_sharded_folder_becomes_one_file_with_the_same_bytes(tmp_path, capsys):
    sd = tiny_sd()
    src = shard(tmp_path / "4.5B_distill" / "inference_weight.distill", sd)
    out = tmp_path / "magi.safetensors"
    assert run(src, out, "--magi1") == 0
    assert "MAGI-1 DiT (2 layers, hidden 256, 4 query / 2 K/V heads, distill)" in capsys.readouterr().out
    got = load_file(str(out))
    assert set(got) == set(sd) and all(torch.equal(got[k], sd[k]) and got[k].dtype == torch.bfloat16 for k in sd)
    with safe_open(str(out), "pt") as f:
        meta = f.metadata()
    cfg = MagiConfig.from_json(meta["magi1_config"])
    assert cfg.distill and cfg.num_query_groups == 2 and meta["converted_from"] == "inference_weight.distill"
    info = ck.inspect_dit(out)
    assert info.config == cfg and info.variant_from == "file metadata"
    model = MagiDiT(info.config)
    missing, unexpected = model.load_state_dict({k: v.float() for k, v in info.state_dict().items()}, strict=True)
    assert not missing and not unexpected


def test_special_tokens_are_stored_as_the_reference_uses_them(tmp_path):
    rng = np.random.default_rng(0)
    npz = tmp_path / "special_tokens.npz"
    arrays = {
        "caption_token": rng.standard_normal((1, 32)),
        "logo_token": rng.standard_normal((1, 32)),
        "other_tokens": rng.standard_normal((100, 32)),
    }
    np.savez(npz, **arrays)
    out = tmp_path / "magi.safetensors"
    assert run(shard(tmp_path / "base", tiny_sd()), out, "--magi1", "--special-tokens", npz) == 0
    special = ck.inspect_dit(out).special()
    assert set(special) == set(SPECIAL_TOKEN_ROWS)
    for name, (array, row) in SPECIAL_TOKEN_ROWS.items():
        want = torch.from_numpy(arrays[array][row].astype(np.float16)).float()
        assert torch.equal(special[name], want), name
    assert not ck.inspect_dit(out).config.distill  # no 'distill' in the folder name: base


def test_zst_shards_are_refused_with_the_way_on(tmp_path, capsys):
    src = shard(tmp_path / "w", tiny_sd(), zst=(1,))
    assert run(src, tmp_path / "o.safetensors", "--magi1") == 2
    err = capsys.readouterr().err
    assert "zstd-compressed" in err and "zstd -d --keep model-00002-of-00003.safetensors.zst" in err
    assert not (tmp_path / "o.safetensors").exists()


def test_distill_quant_fp8_is_refused(tmp_path, capsys):
    sd = tiny_sd()
    sd["videodit_blocks.layers.1.self_attention.linear_qkv.q.weight"] = sd[
        "videodit_blocks.layers.1.self_attention.linear_qkv.q.weight"
    ].to(torch.float8_e4m3fn)[None]
    sd["videodit_blocks.layers.1.self_attention.linear_qkv.q.weight_scale"] = torch.ones(1)
    assert (
        run(
            shard(tmp_path / "4.5B_distill_quant" / "inference_weight.fp8.distill", sd),
            tmp_path / "o.safetensors",
            "--magi1",
        )
        == 2
    )
    assert "distill_quant" in capsys.readouterr().err


@pytest.mark.parametrize(
    "damage,message",
    [
        ("outside", "is not a .safetensors file name inside the folder"),
        ("phantom", "the index lists 1 tensors it does not hold"),
        ("missing", "an incomplete MAGI-1 DiT: 1 tensors missing"),
        ("shape", "shapes that do not fit"),
        ("extra", "tensors no MAGI-1 DiT has"),
        ("wan", "is not a MAGI-1 DiT"),
    ],
)
def test_damaged_folders_are_refused(tmp_path, capsys, damage, message):
    sd = tiny_sd()
    extra = None
    if damage == "outside":
        extra = {"rope.bands": "../elsewhere.safetensors"}
    elif damage == "phantom":
        extra = {"videodit_blocks.layers.0.mlp.linear_fc9.weight": "model-00001-of-00003.safetensors"}
    elif damage == "missing":
        del sd["videodit_blocks.layers.1.mlp_post_norm.bias"]
    elif damage == "shape":
        sd["rope.bands"] = torch.zeros(9, dtype=torch.bfloat16)
    elif damage == "extra":
        sd["videodit_blocks.layers.1.mlp.linear_fc3.weight"] = torch.zeros(4, 4, dtype=torch.bfloat16)
    elif damage == "wan":
        sd = {"blocks.0.self_attn.q.weight": torch.zeros(4, 4), "head.modulation": torch.zeros(1, 2, 4)}
    assert run(shard(tmp_path / "w", sd, index_extra=extra), tmp_path / "o.safetensors", "--magi1") == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o.safetensors").exists()


def test_a_reference_config_is_checked_and_stored(tmp_path, capsys):
    src = shard(tmp_path / "w", tiny_sd())
    model_config = {
        "num_layers": 2, "hidden_size": 256, "ffn_hidden_size": 512, "num_attention_heads": 4, "num_query_groups": 2,
        "kv_channels": 64, "caption_channels": 32, "caption_max_length": 800, "x_rescale_factor": 0.5,
    }  # fmt: skip
    ref = tmp_path / "cfg.json"
    ref.write_text(json.dumps({"model_config": model_config, "engine_config": {"distill": True}}))
    assert run(src, tmp_path / "o.safetensors", "--magi1", "--config", ref) == 0
    cfg = ck.inspect_dit(tmp_path / "o.safetensors").config
    assert cfg.distill and cfg.x_rescale_factor == 0.5
    ref.write_text(json.dumps({"model_config": {**model_config, "num_layers": 3}, "engine_config": {}}))
    assert run(src, tmp_path / "p.safetensors", "--magi1", "--config", ref) == 2
    assert "another architecture" in capsys.readouterr().err
    ref.write_text(json.dumps({"model_config": model_config, "engine_config": {"fp8_quant": True}}))
    assert run(src, tmp_path / "p.safetensors", "--magi1", "--config", ref) == 2
    assert "bmm_fp8" in capsys.readouterr().err


def test_the_vae_folder_becomes_one_file(tmp_path):
    folder = tmp_path / "vae"
    folder.mkdir()
    sd = {"decoder." + k: v for k, v in seeded_weights(decoder_shapes(VAE_TINY)).items()}
    sd["encoder.patch_embed.proj.weight"] = torch.randn(256, 3, 4, 8, 8)
    save_file(sd, str(folder / "diffusion_pytorch_model.safetensors"))
    dd = {
        "video_size": 32,
        "video_length": 8,
        "embed_dim": 256,
        "depth": 2,
        "num_heads": 4,
        "z_chans": 16,
        "double_z": True,
    }
    (folder / "config.json").write_text(json.dumps({"_class_name": "ViTVAE", "ddconfig": dd}))
    out = tmp_path / "magi_vae.safetensors"
    assert run(folder, out, "--magi1-vae") == 0
    got = load_file(str(out))
    assert set(got) == set(sd) and all(torch.equal(got[k], sd[k]) for k in sd)
    assert ck.inspect_vae(out).config == VAE_TINY
    (folder / "config.json").write_text(json.dumps({"_class_name": "ViTVAE", "ddconfig": {**dd, "use_rope": True}}))
    assert run(folder, tmp_path / "v2.safetensors", "--magi1-vae") == 2


def test_wan_options_do_not_mix_with_magi1(tmp_path, capsys):
    src = shard(tmp_path / "w", tiny_sd())
    assert run(src, tmp_path / "o.safetensors", "--magi1", "--dtype", "fp16") == 2
    assert "does not apply to MAGI-1" in capsys.readouterr().err
    assert run(src, tmp_path / "o.safetensors", "--variant", "distill") == 2
    assert "apply to --magi1" in capsys.readouterr().err


def test_auto_reads_the_variant_from_metadata_or_path_and_never_guesses(tmp_path, capsys):
    plain = tmp_path / "plain"
    plain.mkdir()
    save_file(tiny_sd(), str(plain / "magi.safetensors"))  # no metadata, no variant in its names
    with pytest.raises(ck.VariantUnknownError, match="Set variant to base or distill"):
        ck.inspect_dit(plain / "magi.safetensors")
    chosen = ck.inspect_dit(plain / "magi.safetensors", "distill")
    assert chosen.config.distill and chosen.variant_from == "variant input"
    base = shard(tmp_path / "4.5B_base" / "inference_weight", tiny_sd())
    info = ck.inspect_dit(base)
    assert not info.config.distill and info.variant_from == "path name"
    assert ck.variant_in_path(tmp_path / "database" / "m.safetensors") is None  # a word with 'base' inside: no
    # the converter refuses too, naming its own flag, rather than writing a guess into the metadata
    assert run(plain / "magi.safetensors", tmp_path / "o.safetensors", "--magi1") == 2
    assert "--variant base or --variant distill" in capsys.readouterr().err
    assert run(plain / "magi.safetensors", tmp_path / "o.safetensors", "--magi1", "--variant", "base") == 0
    assert ck.inspect_dit(tmp_path / "o.safetensors").variant_from == "file metadata"
