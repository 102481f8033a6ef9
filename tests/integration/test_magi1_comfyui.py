"""MAGI-1 in ComfyUI: the loader node's MODEL, fp8 storage, refusals, the VAE and text glue, and the sampler inside
a ModelPatcher equal to the pure-torch run.

Files are synthetic: the tiny MAGI-1 (``runtime.families.magi1.model.config.TINY``) and a tiny ViT VAE with seeded weights
(``jensen_testing.magi1_tiny``), under the reference's tensor names, written where ComfyUI's folders point.
"""

from __future__ import annotations

import importlib
import json
import logging
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file, save_file
from support import comfyui as support_comfyui

from jensen_testing.magi1_tiny import build, seeded_weights
from runtime.families.magi1.model import config as pure_config
from runtime.families.magi1.model.caption import chunk_captions
from runtime.families.magi1.model.sampler import MagiSettings, sample
from runtime.families.magi1.model.vae import MagiVAE, VAEConfig, decoder_shapes

VAE_TINY = VAEConfig(video_size=32, video_length=8, embed_dim=256, depth=2, num_heads=4)
VAE_DD = dict(
    video_size=32, video_length=8, patch_size=8, patch_length=4, in_chans=3, z_chans=16, double_z=True, embed_dim=256,
    depth=2, num_heads=4, mlp_ratio=4.0, qkv_bias=True, with_cls_token=True, ln_in_attn=True, conv_last_layer=True,
)  # fmt: skip


def pack_module(name):
    return importlib.import_module(f"{support_comfyui.PACK_MODULE}.{name}")


def tiny_dit_weights(cfg=pure_config.TINY, special=True) -> dict[str, torch.Tensor]:
    sd = seeded_weights(pure_config.expected_shapes(cfg))
    if special:
        g = torch.Generator().manual_seed(5)
        for name in ("HQ_TOKEN", *(f"DURATION_TOKEN_{i + 1}" for i in range(8))):
            sd[f"special_tokens.{name}"] = torch.randn(cfg.caption_channels, generator=g).half()
    return sd


@pytest.fixture
def model_dir(comfy, tmp_path):
    import folder_paths

    for kind in ("diffusion_models", "vae"):
        (tmp_path / kind).mkdir()
        folder_paths.add_model_folder_path(kind, str(tmp_path / kind))
    yield tmp_path
    for kind in ("diffusion_models", "vae"):
        paths = folder_paths.folder_names_and_paths[kind][0]
        if str(tmp_path / kind) in paths:
            paths.remove(str(tmp_path / kind))


def write_file(path, sd, distill=None):
    meta = {} if distill is None else {"magi1_config": replace(pure_config.TINY, distill=distill).to_json()}
    save_file({k: v.contiguous() for k, v in sd.items()}, str(path), metadata=meta)


def write_shards(folder, sd, n=3):
    folder.mkdir(parents=True)
    names = sorted(sd)
    wmap = {}
    for i in range(n):
        shard = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        part = {k: sd[k].contiguous() for k in names[i::n]}
        save_file(part, str(folder / shard))
        wmap.update({k: shard for k in part})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wmap}))


@pytest.fixture
def load_node(nodes):
    return nodes.magi1.JensenKVLoadMagi1


def test_loader_builds_a_model_with_every_tensor_of_the_file(load_node, model_dir, caplog):
    sd = tiny_dit_weights()
    write_file(model_dir / "diffusion_models" / "tiny-magi.safetensors", sd, distill=True)
    with caplog.at_level(logging.WARNING):
        patcher = load_node.execute("tiny-magi.safetensors", "default", "auto").args[0]
    assert not [r for r in caplog.records if "unet missing" in r.getMessage() or "unet unexpected" in r.getMessage()]
    dm = patcher.model.diffusion_model
    loaded = dm.state_dict()
    want = {k: v for k, v in sd.items() if not k.startswith("special_tokens.")}
    assert set(loaded) == set(want)  # 0 missing, 0 unexpected
    assert all(torch.equal(loaded[k].float(), want[k]) for k in want)
    assert dm.config.distill and dm.config.num_query_groups == 2
    assert set(dm.special_tokens) == {"HQ_TOKEN", *(f"DURATION_TOKEN_{i + 1}" for i in range(8))}
    model_mod = pack_module("runtime.families.magi1.comfy_model")
    assert model_mod.is_magi1(patcher) and patcher.model.latent_format.scale_factor == 0.18215


def test_loader_reads_a_sharded_folder_and_lists_it(load_node, model_dir):
    sd = tiny_dit_weights(special=False)
    write_shards(model_dir / "diffusion_models" / "4.5B_distill" / "inference_weight.distill", sd)
    files = pack_module("runtime.families.magi1.files")
    name = "4.5B_distill/inference_weight.distill/"
    assert name in files.choices()
    assert not [c for c in files.choices() if c.startswith(name) and c != name]  # its shards are not listed
    patcher = load_node.execute(name, "default", "auto").args[0]
    dm = patcher.model.diffusion_model
    assert dm.config.distill and dm.variant_from == "path name"  # from the folder's name, as Sand AI names it
    assert torch.equal(dm.state_dict()["rope.bands"], sd["rope.bands"])


def test_fp8_storage_loads_and_stays_close(load_node, model_dir):
    write_file(model_dir / "diffusion_models" / "tiny-magi.safetensors", tiny_dit_weights(), distill=False)
    fp8 = load_node.execute("tiny-magi.safetensors", "fp8_e4m3fn", "auto").args[0]
    full = load_node.execute("tiny-magi.safetensors", "default", "auto").args[0]
    layer = fp8.model.diffusion_model.videodit_blocks.layers[0]
    assert layer.self_attention.linear_qkv.q.weight.dtype == torch.float8_e4m3fn
    assert fp8.model.diffusion_model.x_embedder.weight.dtype == torch.float32  # embedders stay float32
    model_mod = pack_module("runtime.families.magi1.comfy_model")
    x = torch.randn(1, 16, 6, 8, 8, generator=torch.Generator().manual_seed(0))
    ctx = torch.randn(1, 9, 32, generator=torch.Generator().manual_seed(1))
    outs = [model_mod.diffusion_model(p)(x, torch.tensor([0.6]), ctx) for p in (fp8, full)]
    assert torch.isfinite(outs[0]).all()
    assert float((outs[0] - outs[1]).norm() / outs[1].norm()) > 1e-3  # the fp8 rounding shows
    # and is all that differs: the same weights rounded to fp8, computed in float32 by the pure model
    rounded = build(pure_config.TINY)
    rounded.load_state_dict({k: v.float() for k, v in fp8.model.diffusion_model.state_dict().items()})
    torch.testing.assert_close(outs[0], _ksampler_call(rounded, x, ctx), atol=1e-4, rtol=1e-4)


def _ksampler_call(dit, x, ctx):
    """What ComfyMagiDiT.forward computes, on the pure model: all chunks at t = 1 - sigma, block-causal."""
    from runtime.families.magi1.model.attention import ChunkPlan
    from runtime.families.magi1.model.dit import Forward

    spec = Forward(
        t=torch.full((1, 1), 0.4),
        captions=[ctx[0]],
        caption_dropped=torch.tensor([False]),
        first_frame=0,
        plan=ChunkPlan.block_causal(96, 1),
    )
    return -dit.forward_chunks(x, spec)


def test_non_magi_files_are_refused_with_the_way_on(load_node, model_dir):
    d = model_dir / "diffusion_models"
    save_file(
        {"blocks.0.self_attn.q.weight": torch.zeros(4, 4), "head.modulation": torch.zeros(1, 2, 4)},
        str(d / "wan.safetensors"),
    )
    with pytest.raises(ValueError, match="is not a MAGI-1 DiT"):
        load_node.execute("wan.safetensors", "default", "auto")
    vae = {"decoder." + k: v for k, v in seeded_weights(decoder_shapes(VAE_TINY)).items()}
    save_file(vae, str(d / "vae.safetensors"))
    with pytest.raises(ValueError, match="Load MAGI-1 VAE"):
        load_node.execute("vae.safetensors", "default", "auto")
    quant = tiny_dit_weights(special=False)
    quant["videodit_blocks.layers.1.mlp.linear_fc1.weight_scale"] = torch.ones(1)
    write_file(d / "quant.safetensors", quant)
    with pytest.raises(ValueError, match="distill_quant.*fp8_e4m3fn"):
        load_node.execute("quant.safetensors", "default", "auto")
    shards = d / "zst"
    write_shards(shards, tiny_dit_weights(special=False), n=2)
    first = shards / "model-00001-of-00002.safetensors"
    first.rename(shards / (first.name + ".zst"))
    with pytest.raises(ValueError, match=r"zstd -d --keep model-00001-of-00002.safetensors.zst"):
        load_node.execute("zst/", "default", "auto")


def test_the_sampler_inside_a_model_patcher_equals_the_pure_torch_run(load_node, model_dir):
    sd = tiny_dit_weights()
    write_file(model_dir / "diffusion_models" / "tiny-magi.safetensors", sd, distill=True)
    patcher = load_node.execute("tiny-magi.safetensors", "default", "auto").args[0]
    patched = patcher.clone()
    model_mod = pack_module("runtime.families.magi1.comfy_model")
    dm = model_mod.diffusion_model(patched)
    special = {k: v.float() for k, v in dm.special_tokens.items()}
    settings = MagiSettings(num_steps=8, window_size=2, chunk_width=2, cfg_number=1, distill=True)
    caption = torch.randn(6, 32, generator=torch.Generator().manual_seed(3))
    noise = torch.randn(1, 16, 6, 8, 8, generator=torch.Generator().manual_seed(4))
    captions = chunk_captions(caption, 3, special)
    inside = sample(dm, noise, captions, settings)
    pure = sample(build(replace(pure_config.TINY, distill=True)), noise, captions, settings)
    assert torch.equal(inside, pure)
    assert float((inside - noise).abs().max()) > 0.1


# ------------------------------------------------------------------------------------------ the VAE
@pytest.fixture
def vae_folder(model_dir):
    folder = model_dir / "vae" / "magi_vae"
    folder.mkdir()
    sd = {"decoder." + k: v for k, v in seeded_weights(decoder_shapes(VAE_TINY)).items()}
    sd["encoder.last_layer.weight"] = torch.zeros(32, 256)  # the encoder half is read past
    save_file(sd, str(folder / "diffusion_pytorch_model.safetensors"))
    (folder / "config.json").write_text(json.dumps({"_class_name": "ViTVAE", "ddconfig": VAE_DD, "model_type": "vit"}))
    return folder


def test_vae_loader_and_decode_node_match_the_pure_decoder(nodes, vae_folder, monkeypatch):
    from support.progress import record_progress

    vae = nodes.magi1.JensenKVLoadMagi1VAE.execute("magi_vae/", "fp32").args[0]
    z = torch.randn(1, 16, 3, 5, 5, generator=torch.Generator().manual_seed(2))
    with record_progress() as progress:
        images = nodes.magi1.JensenKVMagi1VAEDecode.execute(vae, {"samples": z}, 32, 8, 0.25).args[0]
    updates = [(value, total) for value, total, _ in progress.sent]
    pure = MagiVAE(VAE_TINY)
    pure.load_state_dict({"decoder." + k: v for k, v in seeded_weights(decoder_shapes(VAE_TINY)).items()})
    video = pure.decode(z, tile_pixels=32, tile_frames=8)
    assert images.shape == (9, 40, 40, 3)
    torch.testing.assert_close(images, ((video + 1) / 2).clamp(0, 1)[0].permute(1, 2, 3, 0))
    assert updates[-1] == (8, 8)


def test_vae_loader_refuses_a_dit(nodes, model_dir):
    write_file(model_dir / "vae" / "dit.safetensors", tiny_dit_weights(special=False))
    with pytest.raises(ValueError, match="Load MAGI-1 Model"):
        nodes.magi1.JensenKVLoadMagi1VAE.execute("dit.safetensors", "auto")


# ------------------------------------------------------------------------------------------ text
class FakeClip:
    """A CLIP with ComfyUI's real tokenizer of one type and an encoder that returns the token ids."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def tokenize(self, text):
        return self.tokenizer.tokenize_with_weights(text)

    def encode_from_tokens(self, tokens, return_dict=False):
        (seq,) = tokens["t5xxl"]
        ids = torch.tensor([float(t[0]) for t in seq])
        return {"cond": ids.reshape(1, -1, 1).expand(1, -1, 4096).clone()}


def test_text_glue_with_the_pixart_tokenizer(comfy, nodes):
    import comfy.text_encoders.pixart_t5 as pixart

    clip = FakeClip(pixart.PixArtTokenizer())
    cond = nodes.magi1.JensenKVMagi1TextEncode.execute(clip, "  A  Cat\n ON a Mat ", True).args[0]
    ids = cond[0][0][0, :, 0].long().tolist()
    want = [t[0] for t in pixart.PixArtTokenizer().tokenize_with_weights("a cat on a mat")["t5xxl"][0]]
    assert ids == want and ids[-1] == 1 and 0 not in ids  # lower-cased, EOS, no padding
    long = nodes.magi1.JensenKVMagi1TextEncode.execute(clip, "word " * 900, True).args[0]
    assert long[0][0].shape[1] == 800 and int(long[0][0][0, -1, 0]) == 1  # 799 tokens + EOS


@pytest.mark.parametrize("kind", ["sd3", "ltxv"])
def test_text_glue_refuses_a_padding_or_mixed_clip(comfy, nodes, kind):
    if kind == "sd3":
        import comfy.text_encoders.sd3_clip as m

        tok, match = m.SD3Tokenizer(), "pixart"
    else:
        import comfy.text_encoders.lt as m

        tok, match = m.LTXVT5Tokenizer(), "pads the prompt"
    with pytest.raises(ValueError, match=match):
        nodes.magi1.JensenKVMagi1TextEncode.execute(FakeClip(tok), "a cat", True)


def test_the_magi1_nodes_are_registered(pack, nodes):
    import asyncio

    ext = asyncio.run(pack.comfy_entrypoint())
    ids = {n.define_schema().node_id for n in asyncio.run(ext.get_node_list())}
    assert {
        "JensenKVLoadMagi1", "JensenKVLoadMagi1VAE", "JensenKVMagi1VAEDecode", "JensenKVMagi1TextEncode",
        "JensenKVMagi1ARSampler",
    } <= ids  # fmt: skip
    for cls in nodes.FAMILY_NODES["magi1"]:
        assert all(inp.tooltip for inp in cls.define_schema().inputs), cls


def test_converted_vae_file_loads_too(nodes, model_dir, vae_folder):
    """The VAE folder as one file (its config in the metadata) loads the same decoder."""
    sd = load_file(str(vae_folder / "diffusion_pytorch_model.safetensors"))
    save_file(
        sd,
        str(model_dir / "vae" / "magi_vae.safetensors"),
        metadata={"magi1_vae_config": json.dumps(VAE_TINY.to_dict())},
    )
    vae = nodes.magi1.JensenKVLoadMagi1VAE.execute("magi_vae.safetensors", "fp32").args[0]
    assert vae.config == pack_module("runtime.families.magi1.model.vae").VAEConfig(**VAE_TINY.to_dict())


def test_a_converted_folder_loads_through_the_node(load_node, model_dir, tmp_path):
    from support.pack import load_tool

    sd = tiny_dit_weights(special=False)
    src = tmp_path / "src" / "4.5B_distill" / "inference_weight.distill"
    write_shards(src, sd)
    out = model_dir / "diffusion_models" / "magi-tiny-distill.safetensors"
    assert load_tool("convert_checkpoint").main([str(src), str(out), "--magi1"]) == 0
    dm = load_node.execute(out.name, "bf16", "auto").args[0].model.diffusion_model
    assert dm.config.distill and dm.videodit_blocks.layers[1].mlp.linear_fc2.weight.dtype == torch.bfloat16
    got = dm.state_dict()
    assert all(torch.equal(got[k].float(), sd[k].to(got[k].dtype).float()) for k in sd)


def test_auto_refuses_to_guess_a_variant_nothing_names_and_the_loader_says_what_it_loaded(load_node, model_dir, caplog):
    """No metadata, no 'base' or 'distill' in the path: variant auto names the fix instead of running base; a chosen
    variant loads, and the log says which and what said so."""
    write_file(model_dir / "diffusion_models" / "magi-unnamed.safetensors", tiny_dit_weights())
    with pytest.raises(ValueError, match="Set variant to base or distill") as err:
        load_node.execute("magi-unnamed.safetensors", "default", "auto")
    assert str(err.value).startswith("Load MAGI-1 Model: ") and "magi-unnamed.safetensors" in str(err.value)
    with caplog.at_level(logging.INFO, logger="jensen_kv"):
        dm = load_node.execute("magi-unnamed.safetensors", "default", "distill").args[0].model.diffusion_model
    assert dm.config.distill and dm.variant_from == "variant input"
    assert any("distill from variant input" in r.getMessage() for r in caplog.records)
    write_file(model_dir / "diffusion_models" / "magi-meta.safetensors", tiny_dit_weights(), distill=False)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="jensen_kv"):
        dm = load_node.execute("magi-meta.safetensors", "default", "auto").args[0].model.diffusion_model
    assert not dm.config.distill and dm.variant_from == "file metadata"
    assert any("base from file metadata" in r.getMessage() for r in caplog.records)


def test_shards_downloaded_side_by_side_list_as_one_and_load_with_the_tokens_beside(load_node, model_dir):
    """The MAGI-1 workflow's model entries save Sand AI's two shards as ``magi1_4.5b_distill-0000k-of-00002`` in
    models/diffusion_models and the Note puts ``special_tokens.npz`` beside them: the list shows the set once (its
    first shard), and the node loads every tensor with the caption's tokens, as from a converted file."""
    import numpy as np

    sd = tiny_dit_weights(special=False)
    folder = model_dir / "diffusion_models"
    names = sorted(sd)
    for i in range(2):
        save_file(
            {k: sd[k].contiguous() for k in names[i::2]},
            str(folder / f"magi1_4.5b_distill-{i + 1:05d}-of-00002.safetensors"),
        )
    files = pack_module("runtime.families.magi1.files")
    listed = [c for c in files.choices() if c.startswith("magi1_4.5b_distill")]
    assert listed == ["magi1_4.5b_distill-00001-of-00002.safetensors"]
    rng = np.random.default_rng(1)
    width = pure_config.TINY.caption_channels
    np.savez(folder / "special_tokens.npz", caption_token=rng.standard_normal((1, width)),
             logo_token=rng.standard_normal((1, width)), other_tokens=rng.standard_normal((100, width)))  # fmt: skip
    dm = load_node.execute(listed[0], "default", "auto").args[0].model.diffusion_model
    got = dm.state_dict()
    assert set(got) == set(sd) and all(torch.equal(got[k].float(), sd[k]) for k in sd)
    assert dm.config.distill and dm.variant_from == "path name"
    assert {"HQ_TOKEN", "DURATION_TOKEN_1"} <= set(dm.special_tokens)
    (folder / "magi1_4.5b_distill-00002-of-00002.safetensors").unlink()
    with pytest.raises(ValueError, match="magi1_4.5b_distill-00002-of-00002.safetensors is not beside it"):
        load_node.execute(listed[0], "default", "auto")
