"""MAGI-1's DiT as Sand AI publishes it, downloaded file by file into models/diffusion_models (what the MAGI-1
workflow's model entries do): the shards of ``ckpt/magi/4.5B_distill/inference_weight.distill`` saved side by side as
``<stem>-0000k-of-0000N.safetensors`` and ``special_tokens.npz`` (github SandAI-org/MAGI-1, example/assets) beside
them. No index, no conversion: the loader reads the set from its first shard's name.

Synthetic files: the tiny MAGI-1 (``runtime.families.magi1.model.config.TINY``, seeded weights in bf16) split into
shards, and an npz of random rows shaped like Sand AI's.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from support.pack import load_tool

from jensen_testing.magi1_tiny import seeded_weights
from runtime.families.magi1 import files as magi_files
from runtime.families.magi1.model import checkpoint as ck
from runtime.families.magi1.model.caption import SPECIAL_TOKEN_ROWS
from runtime.families.magi1.model.config import TINY, expected_shapes

STEM = "magi1_4.5b_distill"


def tiny_sd() -> dict[str, torch.Tensor]:
    return {k: v.to(torch.bfloat16) for k, v in seeded_weights(expected_shapes(TINY)).items()}


def save_shards(folder, sd, n=2, stem=STEM) -> list:
    """``sd`` over ``n`` files named as the workflow saves Sand AI's shards (no index)."""
    folder.mkdir(parents=True, exist_ok=True)
    names = sorted(sd)
    paths = []
    for i in range(n):
        path = folder / f"{stem}-{i + 1:05d}-of-{n:05d}.safetensors"
        save_file({k: sd[k].contiguous() for k in names[i::n]}, str(path))
        paths.append(path)
    return paths


def save_npz(path, seed=0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    arrays = {
        "caption_token": rng.standard_normal((1, TINY.caption_channels)),
        "logo_token": rng.standard_normal((1, TINY.caption_channels)),
        "other_tokens": rng.standard_normal((100, TINY.caption_channels)),
    }
    np.savez(path, **arrays)
    return arrays


def test_the_shards_saved_side_by_side_load_as_one_checkpoint(tmp_path):
    sd = tiny_sd()
    first, second = save_shards(tmp_path, sd)
    for name in (first, second):  # any shard of the set names the whole set
        info = ck.inspect_dit(name)
        assert info.files.files == [first, second]
        got = info.state_dict()
        assert set(got) == set(sd) and all(torch.equal(got[k], sd[k]) for k in sd)
        assert info.config.distill and info.variant_from == "path name"  # 'distill' in the saved name


def test_a_missing_shard_is_named_with_the_way_on(tmp_path):
    first, second = save_shards(tmp_path, tiny_sd())
    second.unlink()
    with pytest.raises(ck.CheckpointError) as err:
        ck.inspect_dit(first)
    message = str(err.value)
    assert f"{STEM}-00002-of-00002.safetensors is not beside it" in message
    assert "inference_weight[.distill]/model-0000k-of-0000N.safetensors" in message
    save_shards(tmp_path / "odd", tiny_sd(), n=1, stem="x")
    (tmp_path / "odd" / "x-00001-of-00001.safetensors").rename(tmp_path / "odd" / "x-00003-of-00002.safetensors")
    with pytest.raises(ck.CheckpointError, match="shard 3 of 2 is no shard"):
        ck.inspect_dit(tmp_path / "odd" / "x-00003-of-00002.safetensors")


def test_special_tokens_npz_beside_the_shards_equals_the_converted_file(tmp_path):
    """The tokens read from the npz beside the shards are the ones tools/convert_checkpoint.py --special-tokens
    stores in a converted file (the reference's float16 rows), and without the npz there are none."""
    sd = tiny_sd()
    first, _ = save_shards(tmp_path / "models", sd)
    assert ck.inspect_dit(first).special() == {}
    arrays = save_npz(tmp_path / "models" / ck.SPECIAL_NPZ)
    info = ck.inspect_dit(first)
    special = info.special()
    assert info.special_npz == tmp_path / "models" / ck.SPECIAL_NPZ and set(special) == set(SPECIAL_TOKEN_ROWS)
    for name, (array, row) in SPECIAL_TOKEN_ROWS.items():
        assert torch.equal(special[name], torch.from_numpy(arrays[array][row].astype(np.float16)).float()), name

    src = tmp_path / "src" / "4.5B_distill" / "inference_weight.distill"
    save_shards(src, sd, n=1, stem="model")  # one file of the folder, converted with the same npz
    (src / "model-00001-of-00001.safetensors").rename(src / ck.SINGLE)
    out = tmp_path / "converted.safetensors"
    cc = load_tool("convert_checkpoint")
    assert cc.main([str(src), str(out), "--magi1", "--special-tokens", str(tmp_path / "models" / ck.SPECIAL_NPZ)]) == 0
    converted = ck.inspect_dit(out).special()
    assert set(converted) == set(special) and all(torch.equal(converted[k], special[k]) for k in special)


def test_tokens_in_the_file_win_and_a_damaged_npz_is_refused_at_load(tmp_path):
    sd = tiny_sd()
    sd["special_tokens.HQ_TOKEN"] = torch.ones(TINY.caption_channels, dtype=torch.float16)
    first, _ = save_shards(tmp_path / "carries", sd)
    save_npz(tmp_path / "carries" / ck.SPECIAL_NPZ)
    info = ck.inspect_dit(first)
    assert info.special_npz is None and set(info.special()) == {"HQ_TOKEN"}

    first, _ = save_shards(tmp_path / "damaged", tiny_sd())
    np.savez(tmp_path / "damaged" / ck.SPECIAL_NPZ, caption_token=np.zeros((1, 4)))
    with pytest.raises(ck.CheckpointError, match="not Sand AI's special_tokens.npz .*logo_token"):
        ck.inspect_dit(first)


def test_the_fingerprint_changes_when_a_shard_or_the_tokens_arrive(tmp_path):
    first, second = save_shards(tmp_path, tiny_sd())
    second_bytes = second.read_bytes()
    second.unlink()
    without = magi_files.version(str(first))
    second.write_bytes(second_bytes)
    with_shard = magi_files.version(str(first))
    save_npz(tmp_path / ck.SPECIAL_NPZ)
    with_tokens = magi_files.version(str(first))
    assert len({without, with_shard, with_tokens}) == 3
    assert f"{second.name}:" in with_shard and f"{ck.SPECIAL_NPZ}:" in with_tokens
