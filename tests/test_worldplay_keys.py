"""HY-WorldPlay's checkpoint format (runtime/families/worldplay/model/keys.py) against the reference's model definition
(tests/data/worldplay/official_keys.json: the names and shapes of HY-WorldPlay's transformer, HunyuanVideo 1.5
480p I2V with ``add_action_parameters()``, listed by instantiating it on the meta device), and the image
condition cut to a call's frames (runtime/families/worldplay/model/condition.py)."""

from __future__ import annotations

import pytest
import torch
from support.stored import stored_json

from runtime.families.worldplay.model.condition import call_frames, pad_frames, select_frames
from runtime.families.worldplay.model.keys import (
    RELEASED,
    CheckpointError,
    check_keys,
    core_name,
    official_keys,
    official_shapes,
    read_config,
    to_core,
    worldplay_only_keys,
)

REF = stored_json("worldplay", "official_keys.json")


def meta_sd(shapes):
    return {k: torch.empty(tuple(s), device="meta") for k, s in shapes.items()}


def test_the_key_list_is_the_references():
    ref = {k: tuple(v) for k, v in REF["keys"].items()}
    assert official_shapes(RELEASED) == ref
    assert len(ref) == 1905
    assert sum(torch.Size(s).numel() for s in ref.values()) == 8_557_933_856


def test_the_released_shape_reads_off_the_tensors():
    assert read_config(meta_sd(REF["keys"])) == RELEASED
    assert RELEASED.rope_axes == REF["config"]["rope_dim_list"] == [16, 56, 56]
    assert (RELEASED.depth, RELEASED.heads, RELEASED.head_dim) == (54, 16, 128)


def test_worldplay_adds_112_keys_to_hunyuanvideo_15():
    added = worldplay_only_keys(54)
    assert len(added) == 112 and set(added) <= set(REF["keys"])
    assert {k.split(".")[0] for k in added} == {"action_in", "double_blocks"}


def test_core_names_fuse_q_k_v_and_follow_core():
    assert core_name("double_blocks.3.img_attn_k.weight") == "double_blocks.3.img_attn.qkv.weight"
    assert core_name("double_blocks.3.txt_attn_q_norm.weight") == "double_blocks.3.txt_attn.norm.query_norm.weight"
    assert core_name("double_blocks.0.img_mlp.fc2.bias") == "double_blocks.0.img_mlp.2.bias"
    assert core_name("double_blocks.0.img_attn_prope_proj.weight") == "double_blocks.0.img_attn_prope_proj.weight"
    assert core_name("action_in.mlp.2.weight") == "action_in.out_layer.weight"
    assert core_name("txt_in.individual_token_refiner.blocks.1.self_attn_qkv.bias") == (
        "txt_in.individual_token_refiner.blocks.1.self_attn.qkv.bias"
    )
    assert core_name("vision_in.proj.3.weight") == "vision_in.proj.3.weight"
    names = {core_name(k) for k in REF["keys"]}
    assert (
        len(names) == 1905 - 54 * 2 * 2 * 2
    )  # q, k, v -> qkv: two of three names go, for weight and bias, img and txt


def test_to_core_concatenates_q_k_v_in_that_order():
    sd = {f"double_blocks.0.img_attn_{p}.weight": torch.full((2, 2), float(i)) for i, p in enumerate("qkv")}
    sd["double_blocks.0.img_attn_proj.weight"] = torch.zeros(2, 2)
    out = to_core(sd)
    assert set(out) == {"double_blocks.0.img_attn.qkv.weight", "double_blocks.0.img_attn.proj.weight"}
    assert out["double_blocks.0.img_attn.qkv.weight"][:, 0].tolist() == [0, 0, 1, 1, 2, 2]
    del sd["double_blocks.0.img_attn_v.weight"]
    with pytest.raises(CheckpointError, match=r"only \['k', 'q'\]"):
        to_core(sd)


def test_a_missing_or_unexpected_key_is_named():
    sd = meta_sd(REF["keys"])
    check_keys(sd, RELEASED)
    del sd["double_blocks.17.img_attn_prope_proj.bias"]
    sd["double_blocks.17.img_attn_prope.bias"] = torch.empty(2048, device="meta")
    with pytest.raises(CheckpointError) as exc:
        check_keys(sd, RELEASED)
    msg = str(exc.value)
    assert "1 missing key(s): double_blocks.17.img_attn_prope_proj.bias" in msg
    assert "1 unexpected key(s): double_blocks.17.img_attn_prope.bias" in msg


def test_files_that_are_not_worldplay_are_refused_with_the_reason():
    plain = {k: v for k, v in REF["keys"].items() if k not in set(worldplay_only_keys(54))}
    with pytest.raises(CheckpointError, match="plain HunyuanVideo 1.5.*UNETLoader"):
        read_config(meta_sd(plain))
    fused = {core_name(k): v for k, v in REF["keys"].items()}
    with pytest.raises(CheckpointError, match="ComfyUI's layout"):
        read_config(meta_sd(fused))
    with pytest.raises(CheckpointError, match="not a HunyuanVideo 1.5 / HY-WorldPlay transformer.*blocks.0"):
        read_config(meta_sd({"blocks.0.self_attn.q.weight": (4, 4), "patch_embedding.weight": (4, 16, 1, 2, 2)}))
    single = dict(REF["keys"]) | {"single_blocks.0.linear1.weight": (4, 4)}
    with pytest.raises(CheckpointError, match="1 single-stream blocks"):
        read_config(meta_sd(single))


def test_the_key_list_depends_on_the_shape():
    small = read_config(meta_sd(official_shapes(RELEASED.__class__(**{**RELEASED.__dict__, "depth": 2}))))
    assert small.depth == 2
    assert len(official_keys(small)) == 1905 - 52 * 34
    no_byt5 = RELEASED.__class__(**{**RELEASED.__dict__, "byt5": False, "cond_type_embedding": False})
    assert not any(k.startswith(("byt5_in", "cond_type")) for k in official_keys(no_byt5))


# ---------------------------------------------------------------------------------------------- the image condition
def test_a_call_takes_its_own_frames_of_the_condition():
    video = torch.arange(8.0).reshape(1, 1, 8, 1, 1).expand(2, 3, 8, 2, 2)
    assert call_frames(None, 8, 8) == tuple(range(8))
    frames = call_frames([0, 1, 2, 3, 9, 10, 11, 12][:4] + [4, 5, 6, 7], 8, 13)
    assert frames == (0, 1, 2, 3, 4, 5, 6, 7)
    picked = select_frames(video, [5, 0, 7])
    assert picked.shape == (2, 3, 3, 2, 2) and picked[0, 0, :, 0, 0].tolist() == [5, 0, 7]
    mask = torch.zeros(1, 1, 2, 2, 2)
    assert pad_frames(mask, 5, 1.0)[0, 0, :, 0, 0].tolist() == [0, 0, 1, 1, 1]


@pytest.mark.parametrize(
    "frames, n, video, match",
    [(None, 4, 32, "no frame indices"), ([0, 1], 4, 32, "one per frame"), ([30, 31, 32, 33], 4, 32, r"\[32, 33\]")],
)
def test_bad_call_frames_are_named(frames, n, video, match):
    with pytest.raises(ValueError, match=match):
        call_frames(frames, n, video)
