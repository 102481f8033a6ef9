"""tools/convert_checkpoint.py without ComfyUI: layouts, prefixes, dtypes, errors, refused pickles, atomic writes.

The state dicts here are Wan-shaped stand-ins (the keys and shapes the checks read, tiny widths);
``tests/integration/test_convert_checkpoint_comfyui.py`` converts a real tiny Wan and loads it through
ComfyUI's own detection and loader.
"""

from __future__ import annotations

import json
import os
import re

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file
from support.pack import load_tool

cc = load_tool("convert_checkpoint")

DIM = 8
FFN = 2 * DIM


def fake_wan(seed: int = 0, in_channels: int = 16, layers: int = 2) -> dict[str, torch.Tensor]:
    """Every key of a Wan 2.1 T2V diffusion model (ComfyUI's names, as ComfyUI's WanModel has them) with tiny random
    fp32 tensors: dim 8, ffn 16; the text (4096), time (256), patch (1, 2, 2) and output (16) sizes of every Wan."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, generator=g)

    sd = {
        "patch_embedding.weight": r(DIM, in_channels, 1, 2, 2),
        "patch_embedding.bias": r(DIM),
        "text_embedding.0.weight": r(DIM, 4096),
        "text_embedding.0.bias": r(DIM),
        "text_embedding.2.weight": r(DIM, DIM),
        "text_embedding.2.bias": r(DIM),
        "time_embedding.0.weight": r(DIM, 256),
        "time_embedding.0.bias": r(DIM),
        "time_embedding.2.weight": r(DIM, DIM),
        "time_embedding.2.bias": r(DIM),
        "time_projection.1.weight": r(6 * DIM, DIM),
        "time_projection.1.bias": r(6 * DIM),
        "head.head.weight": r(16 * 4, DIM),
        "head.head.bias": r(16 * 4),
        "head.modulation": r(1, 2, DIM),
    }
    for i in range(layers):
        for attn in ("self_attn", "cross_attn"):
            for name in ("q", "k", "v", "o"):
                sd[f"blocks.{i}.{attn}.{name}.weight"] = r(DIM, DIM)
                sd[f"blocks.{i}.{attn}.{name}.bias"] = r(DIM)
            sd[f"blocks.{i}.{attn}.norm_q.weight"] = r(DIM)
            sd[f"blocks.{i}.{attn}.norm_k.weight"] = r(DIM)
        sd[f"blocks.{i}.norm3.weight"], sd[f"blocks.{i}.norm3.bias"] = r(DIM), r(DIM)
        sd[f"blocks.{i}.ffn.0.weight"], sd[f"blocks.{i}.ffn.0.bias"] = r(FFN, DIM), r(FFN)
        sd[f"blocks.{i}.ffn.2.weight"], sd[f"blocks.{i}.ffn.2.bias"] = r(DIM, FFN), r(DIM)
        sd[f"blocks.{i}.modulation"] = r(1, 6, DIM)
    return sd


def prefixed(sd: dict, fn) -> dict:
    return {fn(k): v for k, v in sd.items()}


def fsdp_key(k: str) -> str:
    """CausVid-style: FSDP around the model and around every block."""
    if k.startswith("blocks."):
        i, rest = k.split(".", 2)[1:]
        return f"model._fsdp_wrapped_module.blocks.{i}._fsdp_wrapped_module.{rest}"
    return f"model._fsdp_wrapped_module.{k}"


def self_forcing(ema: dict, gen: dict) -> dict:
    return {
        "generator_ema": prefixed(ema, lambda k: f"model.{k}"),
        "generator": prefixed(gen, lambda k: f"model.{k}"),
        "critic": {"model.x": torch.zeros(1)},
    }


@pytest.fixture(autouse=True)
def _no_comfyui(monkeypatch):
    """Pure tests: the CLI finds no ComfyUI and reports that only the key check ran."""
    monkeypatch.setattr(cc, "find_comfyui", lambda explicit=None: None)


def assert_converted(out: dict, ref: dict, dtype=torch.bfloat16):
    assert sorted(out) == sorted(ref)
    for k, v in ref.items():
        assert out[k].dtype == dtype, k
        assert out[k].is_contiguous(), k
        assert torch.equal(out[k], v.to(dtype)), k


@pytest.mark.parametrize("layout", ["self_forcing", "causvid", "bare", "bare_module_compiled"])
def test_every_layout_converts_to_comfyui_keys(layout):
    ema, gen = fake_wan(0), fake_wan(1)
    state = {
        "self_forcing": lambda: self_forcing(ema, gen),
        "causvid": lambda: {"generator": prefixed(ema, fsdp_key)},
        "bare": lambda: dict(ema),
        "bare_module_compiled": lambda: prefixed(ema, lambda k: f"module._orig_mod.{k}"),
    }[layout]()
    assert_converted(cc.convert(state), ema)


def test_auto_detection_prefers_the_ema_weights_and_key_picks_the_other():
    ema, gen = fake_wan(0), fake_wan(1)
    state = self_forcing(ema, gen)
    assert cc.select_state_dict(state)[0] == "generator_ema"
    assert_converted(cc.convert(state), ema)
    assert_converted(cc.convert(state, key="generator"), gen)


@pytest.mark.parametrize(
    "dtype,torch_dtype", [("fp16", torch.float16), ("fp32", torch.float32), (torch.float16, torch.float16)]
)
def test_dtype_is_cast_and_non_contiguous_inputs_come_out_contiguous(dtype, torch_dtype):
    ema = fake_wan(0)
    ema["blocks.0.self_attn.q.weight"] = torch.randn(DIM, DIM).t()  # a transposed view
    assert not ema["blocks.0.self_attn.q.weight"].is_contiguous()
    assert_converted(cc.convert({"generator": ema}, dtype=dtype), ema, torch_dtype)


def test_integer_tensors_keep_their_dtype():
    ema = fake_wan(0)
    ema["blocks.0.counter"] = torch.arange(3)
    out = cc.convert({"generator": ema})
    assert out["blocks.0.counter"].dtype == torch.int64


def test_unknown_structure_lists_the_top_level_keys():
    state = {"optimizer": {"state": {}}, "step": 1200, "weights": [torch.zeros(1)]}
    with pytest.raises(cc.ConversionError, match="unknown checkpoint structure") as e:
        cc.convert(state)
    msg = str(e.value)
    assert "'optimizer' (dict" in msg and "'step' (int)" in msg and "'weights' (list)" in msg and "--key" in msg


def test_a_bad_key_names_the_keys_available():
    state = self_forcing(fake_wan(0), fake_wan(1))
    with pytest.raises(cc.ConversionError, match="--key 'ema' is not in the checkpoint") as e:
        cc.convert(state, key="ema")
    assert "'generator_ema' (dict of" in str(e.value) and "'generator' (dict of" in str(e.value)
    with pytest.raises(cc.ConversionError, match=r"--key 'step' is not a state dict of tensors \(int\)"):
        cc.convert({"step": 3, "generator": fake_wan(0)}, key="step")


@pytest.mark.parametrize(
    "mutate,match",
    [
        (lambda sd: sd.pop("head.modulation"), "head.modulation missing"),
        (lambda sd: sd.pop("blocks.0.self_attn.q.weight"), r"blocks\.0\.self_attn\.q\.weight missing"),
        (lambda sd: sd.update({"img_emb.proj.0.bias": torch.zeros(4)}), "not text-to-video.*img_emb"),
        (lambda sd: sd.update({"patch_embedding.weight": torch.zeros(DIM, 36, 1, 2, 2)}), "36 input channels"),
    ],
)
def test_the_wan_t2v_key_check_refuses_other_models(mutate, match):
    sd = fake_wan(0)
    mutate(sd)
    with pytest.raises(cc.ConversionError, match=match):
        cc.convert({"generator": sd})


def test_two_keys_that_collide_once_stripped_are_refused():
    sd = fake_wan(0)
    state = {**prefixed(sd, lambda k: f"model.{k}"), "head.modulation": torch.zeros(1, 2, DIM)}
    with pytest.raises(cc.ConversionError, match="both become 'head.modulation'"):
        cc.convert(state)


def test_a_component_named_model_inside_a_key_is_kept():
    assert list(cc.strip_wrappers({"model.blocks.0.model.w": torch.zeros(1)})) == ["blocks.0.model.w"]


# ----------------------------------------------------------------------------- the command line
def test_cli_writes_a_safetensors_file_with_the_cast_weights(tmp_path, capsys):
    ema, gen = fake_wan(0), fake_wan(1)
    src, out = tmp_path / "self_forcing_dmd.pt", tmp_path / "models" / "sf.safetensors"
    torch.save(self_forcing(ema, gen), src)
    assert cc.main([str(src), str(out)]) == 0
    assert_converted(load_file(str(out)), ema)
    with safe_open(str(out), "pt") as f:
        meta = f.metadata()
    assert meta["source_key"] == "generator_ema" and meta["dtype"] == "bf16"
    text = capsys.readouterr().out
    assert "from 'generator_ema' of self_forcing_dmd.pt" in text and "ComfyUI detection: skipped" in text
    assert sorted(p.name for p in out.parent.iterdir()) == ["sf.safetensors"]  # no temporary file left


def test_cli_refuses_to_overwrite_unless_asked(tmp_path, capsys):
    src, out = tmp_path / "in.pt", tmp_path / "out.safetensors"
    torch.save({"generator": fake_wan(0)}, src)
    out.write_bytes(b"keep me")
    assert cc.main([str(src), str(out)]) == 2
    assert "exists; pass --overwrite" in capsys.readouterr().err
    assert out.read_bytes() == b"keep me"
    assert cc.main([str(src), str(out), "--overwrite", "--dtype", "fp32"]) == 0
    assert_converted(load_file(str(out)), fake_wan(0), torch.float32)


def test_cli_reports_an_unknown_structure_and_writes_nothing(tmp_path, capsys):
    src, out = tmp_path / "in.pt", tmp_path / "out.safetensors"
    torch.save({"net": {"a": torch.zeros(1), "b": 3}, "epoch": 4}, src)
    assert cc.main([str(src), str(out)]) == 2
    err = capsys.readouterr().err
    assert "unknown checkpoint structure" in err and "'net' (dict of 2 entries, 1 tensors)" in err and "'epoch'" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.pt"]


class _Payload:
    """Unpickling this would create a file: what an attacker's checkpoint could do instead."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_pickle_with_an_arbitrary_object_is_refused_and_never_executed(tmp_path, capsys):
    marker = tmp_path / "pwned"
    src, out = tmp_path / "evil.pt", tmp_path / "out.safetensors"
    torch.save({"generator": fake_wan(0), "extra": _Payload(marker)}, src)
    assert not marker.exists()
    assert cc.main([str(src), str(out)]) == 2
    err = capsys.readouterr().err
    assert "holds Python objects other than tensors" in err and "could run arbitrary code" in err
    assert "open" in err  # names the refused global
    assert not marker.exists() and not out.exists()


def test_a_file_that_is_no_torch_checkpoint_gets_an_error(tmp_path, capsys):
    src = tmp_path / "notes.pt"
    src.write_text("hello")
    assert cc.main([str(src), str(tmp_path / "o.safetensors")]) == 2
    assert "could not read" in capsys.readouterr().err


def test_a_failure_while_writing_leaves_neither_a_partial_file_nor_a_temporary_one(tmp_path, monkeypatch):
    import safetensors.torch

    src, out = tmp_path / "in.pt", tmp_path / "out.safetensors"
    torch.save({"generator": fake_wan(0)}, src)
    out.write_bytes(b"previous version")

    def half_write(sd, path, metadata=None):
        with open(path, "wb") as f:
            f.write(b"\0" * 100)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(safetensors.torch, "save_file", half_write)
    with pytest.raises(OSError, match="No space left"):
        cc.main([str(src), str(out), "--overwrite"])
    assert out.read_bytes() == b"previous version"
    assert sorted(os.listdir(tmp_path)) == ["in.pt", "out.safetensors"]


# ----------------------------------------------------------------------------- --causal: the flag ComfyUI v0.27 reads
def comfyui_reads(meta: dict) -> dict:
    """What ComfyUI's model_detection merges into a Wan's config: ``json.loads(config).get("transformer", {})``."""
    return json.loads(meta["config"]).get("transformer", {})


def st_metadata(path) -> dict:
    with safe_open(str(path), "pt") as f:
        return f.metadata() or {}


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
def test_causal_writes_the_config_comfyui_reads_and_keeps_the_rest(tmp_path, capsys, causal):
    src, out = tmp_path / "in.pt", tmp_path / "out.safetensors"
    torch.save({"generator": fake_wan(0)}, src)
    assert cc.main([str(src), str(out)] + (["--causal"] if causal else [])) == 0
    meta = st_metadata(out)
    assert meta["source_key"] == "generator" and meta["dtype"] == "bf16" and meta["format"] == "pt"
    if causal:
        assert json.loads(meta["config"]) == {"transformer": {"causal_ar": True}}
        assert comfyui_reads(meta) == {"causal_ar": True} and cc.is_causal(meta)
        assert "flagged causal_ar" in capsys.readouterr().out
    else:
        assert "config" not in meta and not cc.is_causal(meta)
    assert_converted(load_file(str(out)), fake_wan(0))  # the flag changes no weight


def test_the_causal_config_merges_into_an_existing_one():
    meta = {"format": "pt", "config": json.dumps({"vae": {"x": 1}, "transformer": {"rope_theta": 10000.0}})}
    out = cc.with_causal_config(meta)
    assert out["format"] == "pt" and meta["config"] != out["config"]  # the input dict is not modified
    assert json.loads(out["config"]) == {"vae": {"x": 1}, "transformer": {"rope_theta": 10000.0, "causal_ar": True}}
    assert cc.with_causal_config(out) == out  # idempotent
    assert json.loads(
        cc.with_causal_config({"config": json.dumps({"transformer": {"causal_ar": False}})})["config"]
    ) == {"transformer": {"causal_ar": True}}
    assert cc.with_causal_config(None) == {"config": '{"transformer": {"causal_ar": true}}'}


@pytest.mark.parametrize(
    "config,match",
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "not a JSON object"),
        ('{"transformer": 3}', "not a JSON object with an object 'transformer'"),
    ],
)
def test_a_config_comfyui_could_not_read_is_refused(config, match):
    with pytest.raises(cc.ConversionError, match=match):
        cc.with_causal_config({"config": config})


def test_is_causal_reads_the_flag_as_comfyui_does():
    assert not cc.is_causal({}) and not cc.is_causal(None) and not cc.is_causal({"config": "{bad"})
    assert not cc.is_causal({"config": '{"transformer": {"causal_ar": false}}'})
    assert not cc.is_causal({"config": '{"causal_ar": true}'})  # not under "transformer": ComfyUI ignores it
    assert cc.is_causal({"config": '{"vae": {}, "transformer": {"causal_ar": true}}'})


# ----------------------------------------------------------------------------- a .safetensors input: copied + flagged
def _safetensors_wan(path, dtype=torch.float16, metadata=None):
    from safetensors.torch import save_file

    sd = {k: v.to(dtype) for k, v in fake_wan(3).items()}
    save_file(sd, str(path), metadata=metadata)
    return sd


def test_a_safetensors_input_is_copied_byte_for_byte_with_the_flag(tmp_path, capsys):
    src, out = tmp_path / "tiny.safetensors", tmp_path / "out" / "tiny-causal.safetensors"
    sd = _safetensors_wan(src, metadata={"format": "jensen_kv_tiny_ar", "steps": "2400"})
    before = src.read_bytes()
    assert cc.main([str(src), str(out), "--causal"]) == 0
    assert src.read_bytes() == before  # the input is left as it was
    meta = st_metadata(out)
    assert meta["format"] == "jensen_kv_tiny_ar" and meta["steps"] == "2400"
    assert comfyui_reads(meta) == {"causal_ar": True}
    written = load_file(str(out))
    assert sorted(written) == sorted(sd)
    for k, v in sd.items():
        assert written[k].dtype == torch.float16 and torch.equal(written[k], v), k
    # the tensor bytes are the input's, unchanged; only the header differs (padded to 8 bytes)
    _, data_in = cc.read_safetensors_header(src)
    _, data_out = cc.read_safetensors_header(out)
    assert out.read_bytes()[data_out:] == before[data_in:] and data_out % 8 == 0
    text = capsys.readouterr().out
    assert "tensors copied unchanged" in text and "ComfyUI detection: skipped" in text
    assert sorted(p.name for p in out.parent.iterdir()) == ["tiny-causal.safetensors"]


def _rewrite_header(src, dst, edit, data_edit=None):
    """``src`` written to ``dst`` with its JSON header changed by ``edit(header)`` (and its data by ``data_edit``)."""
    header, start = cc.read_safetensors_header(src)
    raw = src.read_bytes()
    edit(header)
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    data = raw[start:] if data_edit is None else data_edit(raw[start:])
    dst.write_bytes(len(blob).to_bytes(8, "little") + blob + data)


def _shift_after(header, name, by):
    """Every tensor stored after ``name`` starts ``by`` bytes later (a gap or an overlap before them)."""
    begin = header[name]["data_offsets"][0]
    for k, info in header.items():
        if k != "__metadata__" and info["data_offsets"][0] > begin:
            info["data_offsets"] = [o + by for o in info["data_offsets"]]


#: (field of a safetensors input, the edit of its header (and data), the error it must meet)
HEADER_PLANTS = [
    (
        "data_offsets span",
        lambda h: h["head.modulation"]["data_offsets"].__setitem__(1, h["head.modulation"]["data_offsets"][1] - 4),
        None,
        r"head.modulation: a F16 tensor of shape \[1, 2, 8\] needs 32 bytes, but its data_offsets .* span 28",
    ),
    (
        "dtype against the bytes",
        lambda h: h["head.modulation"].update(dtype="F32"),
        None,
        r"head.modulation: a F32 tensor of shape \[1, 2, 8\] needs 64 bytes, but its data_offsets .* span 32",
    ),
    (
        "shape against the bytes",
        lambda h: h["head.modulation"].update(shape=[1, 2, 4]),
        None,
        r"head.modulation: a F16 tensor of shape \[1, 2, 4\] needs 16 bytes",
    ),
    (
        "offsets of the next tensor (a gap)",
        lambda h: _shift_after(h, "head.modulation", 2),
        lambda d: d + b"\0\0",
        r"its data starts at byte \d+ of the data, but the tensor before it ends at \d+",
    ),
    (
        "the file's length (trailing bytes)",
        lambda h: None,
        lambda d: d + b"\0" * 8,
        r"the tensors' data end at byte \d+, but the file has \d+ bytes: it is longer than its header says",
    ),
    (
        "the file's length (truncated)",
        lambda h: None,
        lambda d: d[:-8],
        r"the tensors' data end at byte \d+, but the file has \d+ bytes: it is truncated",
    ),
    (
        "the recorded dtype",
        lambda h: h.update(
            __metadata__={"converted_by": "comfyui-jensen-kv tools/convert_checkpoint.py", "dtype": "bf16"}
        ),
        None,
        r"is float16, but the file's metadata records dtype bf16 for every floating tensor",
    ),
]


@pytest.mark.parametrize("field,edit,data_edit,match", HEADER_PLANTS, ids=[p[0] for p in HEADER_PLANTS])
def test_a_header_field_that_disagrees_with_the_others_is_refused(tmp_path, capsys, field, edit, data_edit, match):
    """Readers take nothing on trust: a safetensors input's dtype, shape and data_offsets of every tensor, their
    extents against one another and the file's length, and the dtype this tool recorded, each planted wrong alone;
    nothing is written."""
    src, bad, out = tmp_path / "in.safetensors", tmp_path / "bad.safetensors", tmp_path / "out.safetensors"
    _safetensors_wan(src)
    assert cc.main([str(src), str(tmp_path / "control.safetensors"), "--causal"]) == 0  # the control converts
    capsys.readouterr()
    _rewrite_header(src, bad, edit, data_edit)
    assert cc.main([str(bad), str(out), "--causal"]) == 2
    err = capsys.readouterr().err
    assert re.search(match, err), err
    assert not out.exists()


def test_a_safetensors_input_needs_causal_and_takes_no_key_or_dtype(tmp_path, capsys):
    src, out = tmp_path / "tiny.safetensors", tmp_path / "o.safetensors"
    _safetensors_wan(src)
    assert cc.main([str(src), str(out)]) == 2
    assert "pass --causal" in capsys.readouterr().err
    assert cc.main([str(src), str(out), "--causal", "--dtype", "bf16"]) == 2
    assert "--key and --dtype apply to .pt" in capsys.readouterr().err
    assert not out.exists()
    assert cc.main([str(src), str(src), "--causal", "--overwrite"]) == 2
    assert "would replace the input" in capsys.readouterr().err


def test_a_safetensors_input_that_is_not_wan_t2v_or_not_safetensors_is_refused(tmp_path, capsys):
    from safetensors.torch import save_file

    src, out = tmp_path / "x.safetensors", tmp_path / "o.safetensors"
    sd = fake_wan(0)
    sd["img_emb.proj.0.bias"] = torch.zeros(4)
    save_file(sd, str(src))
    assert cc.main([str(src), str(out), "--causal"]) == 2
    assert "not text-to-video" in capsys.readouterr().err
    src.write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00{oops")
    assert cc.main([str(src), str(out), "--causal"]) == 2
    assert "is not a safetensors file" in capsys.readouterr().err
    assert not out.exists()


def test_help_describes_causal():
    text = cc._parser().format_help()
    assert "--causal" in text and "causal_ar" in text and "WAN21_CausalAR" in text
    assert "--causal" in cc.__doc__ and '{"transformer": {"causal_ar": true}}' in cc.__doc__


# ----------------------------------------------------------------------------- wrappers
@pytest.mark.parametrize(
    "prefix",
    ["model.diffusion_model.", "module.model.", "module.model.diffusion_model.", "model._orig_mod.diffusion_model."],
)
def test_every_leading_wrapper_is_stripped_not_only_the_first(prefix):
    sd = fake_wan(0)
    assert_converted(cc.convert({"generator": prefixed(sd, lambda k: prefix + k)}), sd)
    assert list(cc.strip_wrappers({prefix + "blocks.0.ffn.0.weight": torch.zeros(1)})) == ["blocks.0.ffn.0.weight"]


# ----------------------------------------------------------------------------- checkpoints from strangers
def run_cli(tmp_path, capsys, state, *args) -> tuple[int, str]:
    """``main`` on ``state`` saved as a .pt: (exit status, stderr); asserts nothing was written on a refusal."""
    src, out = tmp_path / "in.pt", tmp_path / "out.safetensors"
    torch.save(state, src)
    status = cc.main([str(src), str(out), *args])
    err = capsys.readouterr().err
    if status != 0:
        assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["in.pt"]
    return status, err


def test_an_expanded_tensor_is_refused_not_written_out(tmp_path, capsys):
    """The review's case: zeros(1).expand(30000, 30000) in place of blocks.0.ffn.0.weight is 4 bytes of storage
    in the .pt and was written as a 1.8 GB bf16 tensor with exit 0."""
    sd = fake_wan(0)
    sd["blocks.0.ffn.0.weight"] = torch.zeros(1).expand(30000, 30000)
    status, err = run_cli(tmp_path, capsys, {"generator": sd})
    assert (tmp_path / "in.pt").stat().st_size < 2**20
    assert status == 2 and "blocks.0.ffn.0.weight" in err and "repeats its data" in err


@pytest.mark.parametrize(
    "key,tensor",
    [
        ("blocks.0.ffn.0.weight", lambda: torch.zeros(1).expand(FFN, DIM)),  # the shape a Wan has
        ("head.modulation", lambda: torch.zeros(1).expand(1, 2, DIM)),
        ("blocks.1.self_attn.q.weight", lambda: torch.randn(DIM).expand(DIM, DIM)),  # stride 0 on one dim
        ("extra.buffer", lambda: torch.zeros(1).expand(30000, 30000)),  # a key no Wan has
        ("blocks.0.modulation", lambda: torch.randn(64).as_strided((1, 6, DIM), (0, 1, 1))),  # overlapping rows
    ],
    ids=["wan_shaped", "head_modulation", "row_repeated", "extra_key", "as_strided"],
)
def test_tensors_whose_storage_is_smaller_than_their_size_are_refused(tmp_path, capsys, key, tensor):
    sd = fake_wan(0)
    sd[key] = tensor()
    with pytest.raises(cc.ConversionError, match=f"{key}: a .* tensor .* repeats its data"):
        cc.convert({"generator": sd})
    status, err = run_cli(tmp_path, capsys, {"generator": sd})
    assert status == 2 and "repeats its data" in err


def test_one_storage_under_many_keys_is_refused_but_a_flat_buffer_is_not(tmp_path, capsys):
    sd = fake_wan(0)
    shared = torch.randn(DIM, DIM)
    for k in [k for k in sd if k.endswith((".q.weight", ".k.weight", ".v.weight", ".o.weight"))]:
        sd[k] = shared  # saved once, loaded as 16 tensors over one storage: 16 x its bytes once written
    status, err = run_cli(tmp_path, capsys, {"generator": sd})
    assert status == 2 and "share one storage" in err
    # FSDP's flat parameters: every tensor a separate slice of one buffer, as much data as the buffer holds
    ref = fake_wan(1)
    flat = torch.cat([v.reshape(-1) for v in ref.values()])
    views, at = {}, 0
    for k, v in ref.items():
        views[k] = flat[at : at + v.numel()].view(v.shape)
        at += v.numel()
    assert cc.main([str(_saved(tmp_path / "flat.pt", {"generator": views})), str(tmp_path / "flat.safetensors")]) == 0
    assert_converted(load_file(str(tmp_path / "flat.safetensors")), ref)


def _saved(path, state):
    torch.save(state, path)
    return path


def _rezip(src, dst, compress=(), patch=None):
    """``src`` (a torch.save zip) rewritten: members whose name ends with one of ``compress`` deflated."""
    import zipfile

    with zipfile.ZipFile(src) as z, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as out:
        for info in z.infolist():
            deflate = info.filename.endswith(tuple(compress))
            out.writestr(
                info.filename,
                z.read(info.filename),
                compress_type=zipfile.ZIP_DEFLATED if deflate else zipfile.ZIP_STORED,
            )
    return dst


@pytest.fixture
def no_torch_load(monkeypatch):
    """torch.load inside the tool fails the test: what is refused must be refused before anything is unpickled."""

    def refuse(*a, **k):
        raise AssertionError("torch.load ran")

    monkeypatch.setattr(cc.torch, "load", refuse)


@pytest.mark.parametrize("member", ["data.pkl", "data/0"])
def test_a_compressed_member_is_refused_before_loading(tmp_path, capsys, member):
    """The review's case: a deflated pickle (262 KB) unpickled for 98 s into 2.8 GB before a refusal. torch.load
    reads compressed members; torch.save never writes them."""
    src = _saved(tmp_path / "plain.pt", {"generator": fake_wan(0)})
    packed = _rezip(src, tmp_path / "packed.pt", compress=(member,))
    import zipfile

    with zipfile.ZipFile(packed) as z:
        assert any(i.compress_type == zipfile.ZIP_DEFLATED for i in z.infolist())
    assert torch.load(packed, weights_only=True)["generator"].keys() == fake_wan(0).keys()  # torch would load it
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cc.torch, "load", lambda *a, **k: pytest.fail("torch.load ran"))
        assert cc.main([str(packed), str(tmp_path / "o.safetensors")]) == 2
    err = capsys.readouterr().err
    assert "is compressed" in err and member in err and "refused before loading" in err
    assert not (tmp_path / "o.safetensors").exists()


def test_a_pickle_over_the_cap_is_refused_before_loading(tmp_path, capsys, monkeypatch, no_torch_load):
    src = _saved(tmp_path / "in.pt", {"generator": fake_wan(0)})
    monkeypatch.setattr(cc.wan_checkpoint, "MAX_PICKLE_BYTES", 256)  # the real cap is 16 MiB; this pickle is a few KiB
    assert cc.main([str(src), str(tmp_path / "o.safetensors")]) == 2
    err = capsys.readouterr().err
    assert "data.pkl" in err and "refused before loading" in err


def test_a_member_size_the_archive_cannot_hold_is_refused_before_loading(tmp_path, capsys, no_torch_load):
    """A central directory that claims a 4 GB member in a file of some KB (edited in place)."""
    import zipfile

    src = _saved(tmp_path / "in.pt", {"generator": fake_wan(0)})
    raw = bytearray(src.read_bytes())
    with zipfile.ZipFile(src) as z:
        name = next(i.filename for i in z.infolist() if i.filename.endswith("data/0")).encode()
    at = raw.find(b"PK\x01\x02", raw.find(b"PK\x01\x02"))
    while raw[at + 46 : at + 46 + len(name)] != name:  # the central directory entry of data/0
        at = raw.find(b"PK\x01\x02", at + 4)
    raw[at + 24 : at + 28] = (0xFFFFFFF0).to_bytes(4, "little")  # uncompressed size
    src.write_bytes(bytes(raw))
    assert cc.main([str(src), str(tmp_path / "o.safetensors")]) == 2
    err = capsys.readouterr().err
    assert "claims 4294967280 bytes" in err and "refused before loading" in err


def test_a_zero_d_head_modulation_is_a_conversion_error(tmp_path, capsys):
    """Was an uncaught IndexError (head.modulation.shape[-1])."""
    sd = fake_wan(0)
    sd["head.modulation"] = torch.tensor(1.0)
    with pytest.raises(
        cc.ConversionError,
        match=r"head.modulation has shape \(\) where a Wan 2.1 model has "
        r"\(1, 2, dim\)",
    ):
        cc.convert({"generator": sd})
    status, err = run_cli(tmp_path, capsys, {"generator": sd})
    assert status == 2 and "head.modulation has shape ()" in err


def _drop(*keys):
    return lambda sd: [sd.pop(k) for k in keys]


def _drop_block(i):
    return lambda sd: [sd.pop(k) for k in [k for k in sd if k.startswith(f"blocks.{i}.")]]


@pytest.mark.parametrize(
    "mutate,match",
    [
        (_drop("head.head.weight"), r"incomplete Wan 2.1 T2V .* missing: head.head.weight"),  # ComfyUI: KeyError
        (_drop("blocks.0.ffn.0.weight"), r"incomplete .* blocks.0.ffn.0.weight"),  # ComfyUI: KeyError
        (
            _drop("blocks.1.cross_attn.k.weight", "blocks.1.norm3.bias"),
            r"2 of its 96 keys are missing: blocks.1.(norm3.bias, blocks.1.cross_attn.k.weight|cross_attn.k.weight, "
            r"blocks.1.norm3.bias)$",
        ),
        (_drop("text_embedding.0.weight"), "missing: text_embedding.0.weight"),
        (_drop_block(1), r"its blocks are numbered up to 2, but block 1 is missing"),
        (lambda sd: sd.update({"blocks.x.ffn.0.weight": torch.zeros(FFN, DIM)}), "block numbers must be integers"),
        (lambda sd: sd.update({f"blocks.{'9' * 5000}.ffn.0.weight": torch.zeros(1)}), "block numbers must be integers"),
        (lambda sd: sd.update({"blocks.99999.ffn.0.weight": torch.zeros(1)}), "block count 100000 is larger"),
        (
            lambda sd: sd.update({"blocks.1.ffn.2.weight": torch.zeros(DIM, FFN + 1)}),
            r"blocks.1.ffn.2.weight \(8, 17\) \(expected \(8, 16\)\)",
        ),
        (lambda sd: sd.update({"text_embedding.0.weight": torch.zeros(DIM, 77)}), r"text_embedding.0.weight \(8, 77\)"),
        (lambda sd: sd.update({"head.modulation": torch.zeros(1, 2, 6144)}), "dim 6144 is larger than any Wan 2.1 T2V"),
        (lambda sd: sd.update({"blocks.0.ffn.0.weight": torch.zeros(14000, DIM)}), "ffn_dim 14000 is larger"),
        (
            lambda sd: sd.update(
                {
                    f"blocks.{i}.{k.split('.', 2)[2]}": v
                    for i in range(2, 41)
                    for k, v in fake_wan(0, layers=1).items()
                    if k.startswith("blocks.0.")
                }
            ),
            "block count 41 is larger",
        ),
        (lambda sd: sd.update({"extra.buffer": torch.zeros(300_000)}), "keys no Wan 2.1 T2V has hold 300000 elements"),
    ],
    ids=[
        "head_head",
        "ffn0",
        "two_keys",
        "text_embedding",
        "block_gap",
        "block_name",
        "block_number_digits",
        "block_number_big",
        "ffn2_shape",
        "text_dim",
        "dim_too_big",
        "ffn_too_big",
        "too_many_blocks",
        "extra_keys",
    ],
)
def test_an_incomplete_or_oversized_model_is_a_conversion_error(tmp_path, capsys, mutate, match):
    sd = fake_wan(0, layers=3)
    mutate(sd)
    with pytest.raises(cc.ConversionError, match=match):
        cc.convert({"generator": sd})
    status, err = run_cli(tmp_path, capsys, {"generator": sd})
    assert status == 2 and err.startswith("error: ")


def test_the_output_is_capped_relative_to_the_input(tmp_path, capsys, monkeypatch):
    sd = fake_wan(0)
    need = sum(v.numel() for v in sd.values()) * 2  # bf16
    with pytest.raises(cc.ConversionError, match=f"would take {need} bytes, more than the {need - 1} allowed"):
        cc.convert({"generator": sd}, max_output_bytes=need - 1)
    assert cc.convert({"generator": sd}, max_output_bytes=need).keys() == sd.keys()
    # main allows OUTPUT_FACTOR x the input: an fp16 file written as fp32 (2x) converts; with the factor and slack
    # at 1/4 and 0 it is refused
    half = {k: v.half() for k, v in sd.items()}
    assert run_cli(tmp_path, capsys, half, "--dtype", "fp32")[0] == 0
    monkeypatch.setattr(cc, "OUTPUT_FACTOR", 0.25)
    monkeypatch.setattr(cc, "OUTPUT_SLACK", 0)
    (tmp_path / "out.safetensors").unlink()
    status, err = run_cli(tmp_path, capsys, half, "--dtype", "fp32")
    assert status == 2 and "more than the" in err and "x the input file" in err


def test_a_safetensors_header_with_a_bad_entry_is_a_conversion_error(tmp_path, capsys):
    for entry in ('"shape":[-1]', '"shape":"big"', '"shape":[1e30]'):
        header = b'{"head.modulation":{"dtype":"F32",' + entry.encode() + b',"data_offsets":[0,4]}}'
        src = tmp_path / "x.safetensors"
        src.write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 4)
        assert cc.main([str(src), str(tmp_path / "o.safetensors"), "--causal"]) == 2
        assert "is not a list of sizes" in capsys.readouterr().err
    header = b'{"head.modulation":[1,2]}'
    src.write_bytes(len(header).to_bytes(8, "little") + header)
    assert cc.main([str(src), str(tmp_path / "o.safetensors"), "--causal"]) == 2
    assert "not an object" in capsys.readouterr().err


# ----------------------------------------------------------------------------- a PEFT LoRA merged in (LongLive)
#: the nn.Linear modules of each block LongLive's LoRA targets (every Linear of a CausalWanAttentionBlock)
LORA_MODULES = [f"{a}.{p}" for a in ("self_attn", "cross_attn") for p in "qkvo"] + ["ffn.0", "ffn.2"]


def fake_lora(rank: int = 3, seed: int = 7, layers: int = 2, modules=LORA_MODULES) -> dict[str, torch.Tensor]:
    """A PEFT state dict as LongLive saves it: base_model.model.<module>.lora_A.weight (r, in) / .lora_B.weight
    (out, r), <module> named in the CausalWanModel (``blocks.0.self_attn.q``); B non-zero (a trained LoRA)."""
    g = torch.Generator().manual_seed(seed)
    ref = fake_wan(0, layers=layers)
    sd = {}
    for i in range(layers):
        for m in modules:
            out_f, in_f = ref[f"blocks.{i}.{m}.weight"].shape
            sd[f"base_model.model.blocks.{i}.{m}.lora_A.weight"] = torch.randn(rank, in_f, generator=g)
            sd[f"base_model.model.blocks.{i}.{m}.lora_B.weight"] = torch.randn(out_f, rank, generator=g)
    return sd


def merged_reference(base: dict, lora: dict, alpha: float | None) -> dict:
    """W + (alpha / r) B A in float64, from the test's own reading of the PEFT keys."""
    out = {k: v.double() for k, v in base.items()}
    for k, a in lora.items():
        if not k.endswith(".lora_A.weight"):
            continue
        module = k.removeprefix("base_model.model.").removesuffix(".lora_A.weight")
        b = lora[k.replace("lora_A", "lora_B")]
        r = a.shape[0]
        out[f"{module}.weight"] = out[f"{module}.weight"] + ((alpha or r) / r) * (b.double() @ a.double())
    return out


def assert_merged(out: dict, ref: dict, dtype=torch.bfloat16):
    assert sorted(out) == sorted(ref)
    for k, v in ref.items():
        assert out[k].dtype == dtype, k
        # one rounding to dtype of the float64 value, plus the fp32 merge's error
        tol = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 1e-3}[dtype]
        torch.testing.assert_close(out[k].double(), v, atol=tol * (1 + v.abs().max().item()), rtol=tol, msg=k)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("alpha", [None, 1.5])
def test_a_lora_is_merged_as_w_plus_alpha_over_r_b_a(dtype, alpha):
    base, lora = fake_wan(0), fake_lora(rank=3)
    out = cc.convert(
        {"generator": prefixed(base, lambda k: f"model.{k}")},
        dtype=dtype,
        lora=cc.read_lora({"generator_lora": lora}),
        lora_alpha=alpha,
    )
    ref = merged_reference(base, lora, alpha)
    assert_merged(out, ref, cc.DTYPES[dtype])
    q = "blocks.1.self_attn.q.weight"
    assert not torch.allclose(out[q].double(), base[q].double(), atol=1e-2)  # the LoRA did change the weights
    assert torch.equal(out["blocks.0.modulation"], base["blocks.0.modulation"].to(cc.DTYPES[dtype]))  # no LoRA there


def test_alpha_defaults_to_the_rank_and_scales_the_update():
    base, lora = fake_wan(0), fake_lora(rank=4)
    state = {"generator": base}
    w = "blocks.0.ffn.0.weight"
    default = cc.convert(state, dtype="fp32", lora=cc.read_lora(lora))[w].double()
    same = cc.convert(state, dtype="fp32", lora=cc.read_lora(lora), lora_alpha=4.0)[w].double()
    double = cc.convert(state, dtype="fp32", lora=cc.read_lora(lora), lora_alpha=8.0)[w].double()
    torch.testing.assert_close(default, same)  # alpha = r: a scale of 1
    delta = (
        lora["base_model.model.blocks.0.ffn.0.lora_B.weight"].double()
        @ lora["base_model.model.blocks.0.ffn.0.lora_A.weight"].double()
    )
    torch.testing.assert_close(default - base[w].double(), delta, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(double - base[w].double(), 2 * delta, atol=1e-5, rtol=1e-5)


def test_the_generator_lora_and_the_bare_layout_merge_the_same():
    lora = fake_lora()
    a, b = cc.read_lora({"generator_lora": lora}), cc.read_lora(lora)
    assert (a.source_key, b.source_key) == ("generator_lora", None)
    assert a.pairs.keys() == b.pairs.keys() == {f"blocks.{i}.{m}.weight" for i in range(2) for m in LORA_MODULES}
    assert a.ranks == b.ranks == [3]


def test_lora_modules_that_match_no_weight_are_refused_with_their_names():
    lora = fake_lora()
    lora["base_model.model.blocks.7.self_attn.q.lora_A.weight"] = torch.randn(3, DIM)
    lora["base_model.model.blocks.7.self_attn.q.lora_B.weight"] = torch.randn(DIM, 3)
    lora["base_model.model.blocks.0.attn2.to_q.lora_A.weight"] = torch.randn(3, DIM)
    lora["base_model.model.blocks.0.attn2.to_q.lora_B.weight"] = torch.randn(DIM, 3)
    with pytest.raises(cc.ConversionError, match="2 LoRA module.s. match no weight") as e:
        cc.convert({"generator": fake_wan(0)}, lora=cc.read_lora(lora))
    assert "blocks.0.attn2.to_q" in str(e.value) and "blocks.7.self_attn.q" in str(e.value)


@pytest.mark.parametrize(
    "mutate,match",
    [
        (
            lambda sd: sd.pop("base_model.model.blocks.1.ffn.2.lora_B.weight"),
            r"blocks\.1\.ffn\.2\.lora_A.* \(no lora_B\)",
        ),
        (
            lambda sd: sd.pop("base_model.model.blocks.0.self_attn.k.lora_A.weight"),
            r"self_attn\.k\.lora_B.* \(no lora_A\)",
        ),
        (
            lambda sd: sd.update({"base_model.model.blocks.0.self_attn.q.lora_magnitude_vector": torch.ones(DIM)}),
            "lora_magnitude_vector.*not merged",
        ),
        (
            lambda sd: sd.update({"base_model.model.blocks.0.ffn.0.lora_A.weight": torch.randn(3, FFN)}),
            r"blocks\.0\.ffn\.0: B·A is \(16, 16\), the weight \(16, 8\)",
        ),
        (
            lambda sd: sd.update({"base_model.model.blocks.0.ffn.0.lora_B.weight": torch.randn(FFN, 4)}),
            "B's 4 columns should be A's 3 rows",
        ),
        (
            lambda sd: sd["base_model.model.blocks.0.ffn.0.lora_B.weight"].__setitem__((0, 0), float("nan")),
            "ffn.0.lora_B.weight holds non-finite",
        ),
        (
            lambda sd: sd.update(
                {"base_model.model.blocks.0.ffn.0.lora_A.weight": torch.ones(3, DIM, dtype=torch.int64)}
            ),
            "a non-empty 2-D floating tensor",
        ),
        (
            lambda sd: sd.update(
                {"base_model.model._fsdp_wrapped_module.blocks.0.ffn.0.lora_A.weight": torch.randn(3, DIM)}
            ),
            "are the same LoRA factor once the wrapper prefixes are stripped",
        ),
    ],
    ids=["a_without_b", "b_without_a", "dora", "wrong_in", "rank_mismatch", "nan", "integer", "collision"],
)
def test_a_lora_that_does_not_fit_is_refused(mutate, match):
    lora = fake_lora()
    mutate(lora)
    with pytest.raises(cc.ConversionError, match=match):
        cc.convert({"generator": fake_wan(0)}, lora=cc.read_lora(lora))


@pytest.mark.parametrize("alpha", [0.0, -256.0, float("nan"), float("inf")])
def test_a_non_finite_or_non_positive_alpha_is_refused(tmp_path, tmp_path_factory, capsys, alpha):
    with pytest.raises(cc.ConversionError, match="must be a finite number above 0"):
        cc.convert({"generator": fake_wan(0)}, lora=cc.read_lora(fake_lora()), lora_alpha=alpha)
    lora_path = _saved(tmp_path_factory.mktemp("lora") / "lora.pt", fake_lora())
    status, err = run_cli(
        tmp_path, capsys, {"generator": fake_wan(0)}, "--lora", str(lora_path), f"--lora-alpha={alpha}"
    )
    assert status == 2 and "must be a finite number above 0" in err


def test_cli_merges_a_lora_and_records_it_in_the_metadata(tmp_path, capsys):
    import hashlib

    base, lora = fake_wan(0), fake_lora(rank=3)
    src, lora_path, out = tmp_path / "longlive_base.pt", tmp_path / "lora.pt", tmp_path / "longlive.safetensors"
    torch.save({"generator": prefixed(base, lambda k: f"model.{k}")}, src)
    torch.save({"generator_lora": lora}, lora_path)
    assert cc.main([str(src), str(out), "--key", "generator", "--lora", str(lora_path), "--dtype", "fp32"]) == 0
    assert_merged(load_file(str(out)), merged_reference(base, lora, None), torch.float32)
    meta = st_metadata(out)
    assert meta["lora_file"] == "lora.pt" and meta["lora_sha256"] == hashlib.sha256(lora_path.read_bytes()).hexdigest()
    assert meta["lora_rank"] == "3" and meta["lora_alpha"].startswith("3 ") and meta["lora_modules"] == "20"
    assert meta["lora_source_key"] == "generator_lora" and meta["source_key"] == "generator"
    assert "merged LoRA lora.pt (20 modules, rank 3" in capsys.readouterr().out
    # --lora-alpha: recorded, and it scales
    out2 = tmp_path / "x.safetensors"
    assert cc.main([str(src), str(out2), "--lora", str(lora_path), "--lora-alpha", "6", "--dtype", "fp32"]) == 0
    assert st_metadata(out2)["lora_alpha"] == "6"
    assert_merged(load_file(str(out2)), merged_reference(base, lora, 6.0), torch.float32)
    # a refused LoRA writes nothing; --lora-alpha alone and --lora on a .safetensors input are errors
    bad = fake_lora()
    bad["base_model.model.blocks.9.ffn.0.lora_A.weight"] = torch.randn(3, DIM)
    bad["base_model.model.blocks.9.ffn.0.lora_B.weight"] = torch.randn(FFN, 3)
    torch.save(bad, tmp_path / "bad.pt")
    assert cc.main([str(src), str(tmp_path / "bad.safetensors"), "--lora", str(tmp_path / "bad.pt")]) == 2
    assert "blocks.9.ffn.0" in capsys.readouterr().err and not (tmp_path / "bad.safetensors").exists()
    assert cc.main([str(src), str(tmp_path / "y.safetensors"), "--lora-alpha", "2"]) == 2
    assert "--lora-alpha applies to a --lora" in capsys.readouterr().err
    assert cc.main([str(out), str(tmp_path / "z.safetensors"), "--causal", "--lora", str(lora_path)]) == 2
    assert "as do --lora and --lora-alpha" in capsys.readouterr().err


def test_a_lora_goes_into_generator_not_generator_ema_without_a_key(tmp_path, capsys):
    """LongLive's inference and its LoRA training put the LoRA on ``generator``: with --lora and no --key the
    converter takes it even when the checkpoint also has ``generator_ema`` (which it takes without a LoRA), and a
    checkpoint with only ``generator_ema`` is refused instead of guessed."""
    ema, gen, lora = fake_wan(0), fake_wan(1), fake_lora(rank=3)
    both = {"generator_ema": prefixed(ema, lambda k: f"model.{k}"), "generator": prefixed(gen, lambda k: f"model.{k}")}
    assert cc.select_state_dict(both)[0] == "generator_ema"
    assert cc.select_state_dict(both, lora=True)[0] == "generator"
    out = cc.convert(both, dtype="fp32", lora=cc.read_lora({"generator_lora": lora}))
    assert_merged(out, merged_reference(gen, lora, None), torch.float32)
    # --key still picks what it names
    out = cc.convert(both, key="generator_ema", dtype="fp32", lora=cc.read_lora(lora))
    assert_merged(out, merged_reference(ema, lora, None), torch.float32)
    with pytest.raises(cc.ConversionError, match="no 'generator' state dict.*--key generator_ema"):
        cc.convert({"generator_ema": ema}, lora=cc.read_lora(lora))
    # the command line: the written file says which entry it came from
    src, lora_path, dst = tmp_path / "longlive_base.pt", tmp_path / "lora.pt", tmp_path / "longlive.safetensors"
    torch.save(both, src)
    torch.save({"generator_lora": lora}, lora_path)
    assert cc.main([str(src), str(dst), "--lora", str(lora_path), "--dtype", "fp32"]) == 0
    assert st_metadata(dst)["source_key"] == "generator"
    assert_merged(load_file(str(dst)), merged_reference(gen, lora, None), torch.float32)
    torch.save({"generator_ema": ema}, src)
    assert cc.main([str(src), str(tmp_path / "no.safetensors"), "--lora", str(lora_path)]) == 2
    assert "no 'generator' state dict" in capsys.readouterr().err and not (tmp_path / "no.safetensors").exists()


def test_the_lora_file_gets_the_same_hostile_file_checks(tmp_path, capsys, monkeypatch):
    src = _saved(tmp_path / "base.pt", {"generator": fake_wan(0)})

    def cli(lora_path):
        status = cc.main([str(src), str(tmp_path / "o.safetensors"), "--lora", str(lora_path)])
        err = capsys.readouterr().err
        assert status == 2 and not (tmp_path / "o.safetensors").exists()
        return err

    # an expanded (repeating) factor: a few bytes in the file
    lora = fake_lora()
    lora["base_model.model.blocks.0.ffn.0.lora_A.weight"] = torch.zeros(1).expand(3, DIM)
    err = cli(_saved(tmp_path / "expanded.pt", {"generator_lora": lora}))
    assert "blocks.0.ffn.0.lora_A.weight" in err and "repeats its data" in err
    # one storage under two keys
    lora = fake_lora()
    shared = torch.randn(3, DIM)
    lora["base_model.model.blocks.0.self_attn.q.lora_A.weight"] = shared
    lora["base_model.model.blocks.0.self_attn.k.lora_A.weight"] = shared
    assert "share one storage" in cli(_saved(tmp_path / "shared.pt", lora))
    # a pickle that would run code
    marker = tmp_path / "pwned"
    err = cli(_saved(tmp_path / "evil.pt", {"generator_lora": fake_lora(), "x": _Payload(marker)}))
    assert "could run arbitrary code" in err and not marker.exists()
    # an unknown structure
    assert "unknown LoRA structure" in cli(_saved(tmp_path / "odd.pt", {"lora": {"a": torch.zeros(1)}, "step": 3}))
    # a compressed member, refused before torch.load
    packed = _rezip(_saved(tmp_path / "plain.pt", fake_lora()), tmp_path / "packed.pt", compress=("data.pkl",))
    monkeypatch.setattr(cc, "load_checkpoint", _loads_only(cc.load_checkpoint, allowed=src))
    assert "is compressed" in cli(packed)


def _loads_only(load, allowed):
    """load_checkpoint with torch.load refused for every file but ``allowed``: the LoRA's zip check must come first."""

    def wrapped(path):
        if str(path) != str(allowed):
            cc.check_zip_members(path)
            pytest.fail(f"{path} passed the zip check")
        return load(path)

    return wrapped
