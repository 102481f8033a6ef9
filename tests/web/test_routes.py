"""The numbers the web UI shows: routes/ui.py, tested without a server.

The route functions must agree with jensen_core (one source for the formula), reject bad query
values with a message that names the value and the fix, and project exactly the bytes a real
``ChunkCache`` holds.
"""

from __future__ import annotations

import asyncio
import json
import math

import pytest
import torch
from support.pack import load_pack_module

from jensen_core import ChunkCache, QuantSpec, method_of
from jensen_core.planner import CachePrecision, CacheShape, plan_cache

routes = load_pack_module("routes.ui")
wan = load_pack_module("runtime.families.wan.family")
MODEL_PRESETS, WAN = wan.PRESETS, wan.GEOMETRY


# ------------------------------------------------------------------------------------------- spec
@pytest.mark.parametrize("bits", ["2", "3", "4", "8"])
@pytest.mark.parametrize("group", ["8", "32", "128"])
@pytest.mark.parametrize("scale", ["fp8_e4m3", "bf16", "fp32"])
def test_spec_effective_bits_come_from_quantspec(bits, group, scale):
    out = routes.spec_summary({"key_bits": bits, "value_bits": bits, "group_size": group, "scale_format": scale})
    expected = QuantSpec(bits=int(bits), group_size=int(group), scale_format=scale).effective_bits
    assert out["key"]["effective_bits"] == expected
    assert out["value"]["effective_bits"] == expected
    assert out["compression"] == pytest.approx(16.0 / expected)


def test_spec_defaults_are_the_node_defaults_int2_g32_fp8():
    out = routes.spec_summary({})
    assert out["effective_bits"] == 2.75  # paper Eq. 21: 2 + (8 + 16) / 32
    assert out["compression"] == pytest.approx(16 / 2.75)
    assert out["errors"] == []


def test_spec_off_side_counts_as_bf16():
    out = routes.spec_summary({"key_bits": "2", "value_bits": "off"})
    assert out["value"] == {
        "quantized": False,
        "bits": None,
        "effective_bits": 16.0,
        "note": "kept at the model's precision (counted as BF16)",
    }
    assert out["effective_bits"] == pytest.approx((2.75 + 16) / 2)


def test_spec_head_dim_check_names_the_fix():
    out = routes.spec_summary({"group_size": "256", "head_dim": "128"})
    assert out["errors"] == [
        "key and value cache: group_size 256 does not divide head_dim 128; use 8, 16, 32, 64 or 128"
    ]
    out = routes.spec_summary({"group_size": "256", "head_dim": "128", "value_bits": "off"})
    assert out["errors"] == ["key cache: group_size 256 does not divide head_dim 128; use 8, 16, 32, 64 or 128"]
    assert routes.spec_summary({"group_size": "32", "head_dim": "128"})["errors"] == []
    # a setting that cannot run has no compression ratio to show (the planner's top line names none)
    assert out["compression"] is None
    assert routes.spec_summary({"group_size": "32", "head_dim": "128"})["compression"] == pytest.approx(16 / 2.75)
    plan = routes.plan_summary({"group_size": "256", "preset": "wan2.1-1.3b"})
    assert not plan["runnable"] and plan["spec"]["compression"] is None and plan["bytes_ratio"] is None


def test_spec_qvg_is_exact_with_head_dim_and_chunk_tokens_and_says_what_it_leaves_out():
    q = {"method": "qvg", "group_size": "64", "qvg_centroids": "256", "qvg_stages": "1", "value_bits": "off"}
    spec = QuantSpec(bits=2, group_size=64, rotation="hadamard", method="qvg", qvg_centroids=256)
    bare = routes.spec_summary(q)["key"]
    assert bare["method"] == "qvg" and bare["exact"] is False and bare["effective_bits"] == spec.effective_bits
    assert "head_dim and chunk_tokens" in bare["note"] and "centroids" in bare["note"]
    partial = routes.spec_summary({**q, "head_dim": "128"})["key"]
    assert partial["effective_bits"] == pytest.approx(2.375 + 8 / 128) and partial["exact"] is False
    out = routes.spec_summary({**q, "head_dim": "128", "chunk_tokens": "4680"})
    k = out["key"]
    assert k["exact"] is True and "note" not in k
    assert (
        k["effective_bits"]
        == method_of(spec).effective_bits_for(spec, 128, 4680)
        == pytest.approx(2.375 + 0.0625 + 16 * 256 / 4680)
    )
    assert k["centroid_bits"] == pytest.approx(16 * 256 / 4680) and k["id_bits"] == 8 / 128
    assert out["effective_bits"] == pytest.approx((k["effective_bits"] + 16) / 2)


def test_spec_rtn_ignores_the_qvg_widgets_the_node_always_sends():
    out = routes.spec_summary({"method": "rtn", "qvg_centroids": "17", "qvg_stages": "3", "qvg_iters": "9"})
    assert out["effective_bits"] == 2.75 and out["key"]["method"] == "rtn"


# ------------------------------------------------------------------------------------------- plan
def test_plan_qvg_counts_centroids_per_chunk_exactly_and_its_spec_is_exact():
    out = routes.plan_summary({"method": "qvg", "group_size": "64", "qvg_centroids": "256"})
    spec = QuantSpec(2, 64, "hadamard", method="qvg", qvg_centroids=256)
    ref = plan_cache(
        latent_frames=21,
        latent_height=60,
        latent_width=104,
        chunk_frames=3,
        window_chunks=0,
        shape=CacheShape(layers=30, heads=12, head_dim=128, geometry=WAN),
        precision=CachePrecision(spec_k=spec, spec_v=spec),
    )
    assert out["quantized_bytes"] == ref.quantized_bytes
    # 6 cached chunks x 30 layers x 12 heads x (4680 tokens x (32 B codes + 2 x 3 B metadata + 1 B id) + 256 x 128 x 2 B)
    assert ref.quantized_bytes == 2 * 6 * 30 * 12 * (4680 * (32 + 6 + 1) + 256 * 128 * 2)
    assert out["spec"]["key"]["exact"] and out["spec"]["key"]["effective_bits"] == method_of(spec).effective_bits_for(
        spec, 128, 4680
    )
    assert out["effective_bits_k"] == pytest.approx(out["spec"]["key"]["effective_bits"])
    assert out["bytes_ratio"] == pytest.approx(16 / method_of(spec).effective_bits_for(spec, 128, 4680))
    small = routes.plan_summary(
        {"method": "qvg", "qvg_centroids": "256", "width": "64", "height": "48", "chunk_frames": "1"}
    )
    assert any("keeps every token as a BF16 centroid" in w and "lower K" in w for w in small["warnings"])


def test_plan_qvg_projection_equals_bytes_a_real_cache_holds():
    q = {
        "preset": "custom",
        "layers": "2",
        "heads": "2",
        "head_dim": "32",
        "width": "64",
        "height": "64",
        "frames": "17",
        "chunk_frames": "2",
        "window_chunks": "0",
        "cfg_branches": "1",
        "group_size": "16",
        "key_bits": "2",
        "value_bits": "4",
        "method": "qvg",
        "qvg_centroids": "20",
        "qvg_stages": "2",
    }
    out = routes.plan_summary(q)
    spec_k = QuantSpec(2, 16, "hadamard", method="qvg", qvg_centroids=20, qvg_stages=2)
    spec_v = QuantSpec(4, 16, "hadamard", method="qvg", qvg_centroids=20, qvg_stages=2)
    tokens = 2 * out["tokens_per_latent_frame"]
    g = torch.Generator().manual_seed(0)
    caches = [ChunkCache(spec_k, spec_v) for _ in range(2)]
    for cache in caches:
        for _ in range(out["cached_chunks_peak"]):
            cache.append(*(torch.randn(1, 2, tokens, 32, generator=g) for _ in range(2)))
    assert sum(c.nbytes for c in caches) == out["quantized_bytes"]


def test_plan_matches_plan_cache_for_wan_1_3b_defaults():
    out = routes.plan_summary({})
    ref = plan_cache(
        latent_frames=21,
        latent_height=60,
        latent_width=104,
        chunk_frames=3,
        window_chunks=0,
        shape=CacheShape(layers=30, heads=12, head_dim=128, geometry=WAN),
        precision=CachePrecision(spec_k=QuantSpec(2, 32, "hadamard"), spec_v=QuantSpec(2, 32, "hadamard")),
    )
    assert out["bf16_bytes"] == ref.bf16_bytes
    assert out["quantized_bytes"] == ref.quantized_bytes
    assert out["tokens_per_latent_frame"] == 1560 and out["chunks"] == 7 and out["cached_chunks_peak"] == 6
    assert out["model"] == {
        "preset": "wan2.1-1.3b",
        "family": "wan",
        "layers": 30,
        "heads": 12,
        "kv_heads": 12,
        "head_dim": 128,
    }
    assert out["runnable"] and out["errors"] == [] and out["warnings"] == []
    assert out["bytes_ratio"] == pytest.approx(16 / 2.75, rel=1e-6)


def test_plan_14b_preset_and_cfg_branches_scale_linearly():
    one = routes.plan_summary({"preset": "wan2.1-14b"})
    two = routes.plan_summary({"preset": "wan2.1-14b", "cfg_branches": "2"})
    m = one["model"]
    assert (m["layers"], m["heads"], m["head_dim"]) == MODEL_PRESETS["wan2.1-14b"]
    assert two["bf16_bytes"] == 2 * one["bf16_bytes"]
    assert two["quantized_bytes"] == 2 * one["quantized_bytes"]


def test_plan_explicit_dims_override_preset_and_are_echoed():
    out = routes.plan_summary({"preset": "wan2.1-14b", "layers": "30", "heads": "12", "head_dim": "128"})
    assert out["model"]["preset"] == "wan2.1-1.3b"  # the dimensions are the 1.3B's
    out = routes.plan_summary({"preset": "custom", "layers": "2", "heads": "2", "head_dim": "32"})
    assert out["model"] == {"preset": "custom", "family": "wan", "layers": 2, "heads": 2, "kv_heads": 2, "head_dim": 32}


def test_plan_counts_kv_heads_for_grouped_query_attention():
    """Fewer K/V heads than query heads: the cache holds the K/V heads only (jensen_core's planner counts them)."""
    mha = routes.plan_summary({"preset": "custom", "layers": "2", "heads": "24", "head_dim": "128"})
    gqa = routes.plan_summary({"preset": "custom", "layers": "2", "heads": "24", "kv_heads": "8", "head_dim": "128"})
    assert gqa["model"]["kv_heads"] == 8
    assert gqa["bf16_bytes"] * 3 == mha["bf16_bytes"] and gqa["quantized_bytes"] * 3 == mha["quantized_bytes"]
    with pytest.raises(routes.ParamError, match="does not divide heads=24"):
        routes.plan_summary({"preset": "custom", "layers": "2", "heads": "24", "kv_heads": "7", "head_dim": "128"})
    with pytest.raises(routes.ParamError, match="not a model family"):
        routes.plan_summary({"preset": "custom", "family": "nope", "layers": "2", "heads": "2", "head_dim": "32"})


def test_the_magi1_presets_count_its_8_kv_heads():
    """MAGI-1 4.5B (24 query heads over 8 K/V heads) and 24B (48 over 8): the planner counts the 8 the cache holds,
    and MAGI-1's VAE (4 frames per latent frame, no causal first frame: 96 frames are 24 latent frames)."""
    small = routes.plan_summary({"preset": "magi1-4.5b", "width": "1280", "height": "720", "frames": "96"})
    big = routes.plan_summary({"preset": "magi1-24b", "width": "1280", "height": "720", "frames": "96"})
    assert small["model"] == {"preset": "magi1-4.5b", "family": "magi1", "layers": 34, "heads": 24, "kv_heads": 8,
                              "head_dim": 128}  # fmt: skip
    assert big["model"]["kv_heads"] == 8 and big["model"]["heads"] == 48
    assert small["latent_frames"] == 24 and small["tokens_per_latent_frame"] == 45 * 80
    # 34 layers x K and V x 8 heads x 128 x 2 bytes per token; 48 layers for the 24B
    per_token = 34 * 2 * 8 * 128 * 2
    assert small["bf16_bytes"] == small["cached_tokens_peak"] * per_token
    assert big["bf16_bytes"] * 34 == small["bf16_bytes"] * 48


def test_a_presets_own_dimensions_keep_its_kv_heads():
    """The web planner sends layers, heads and head_dim with every preset: the same numbers keep the preset (and its
    8 K/V heads for MAGI-1, not 24: three times the bytes); other query heads make a custom model with as many K/V
    heads as query heads."""
    base = {"preset": "magi1-4.5b", "width": "1280", "height": "720", "frames": "96"}
    bare = routes.plan_summary(base)
    sent = routes.plan_summary({**base, "layers": "34", "heads": "24", "head_dim": "128"})
    assert sent["model"] == bare["model"] and sent["model"]["kv_heads"] == 8
    assert sent["bf16_bytes"] == bare["bf16_bytes"] == bare["cached_tokens_peak"] * 34 * 2 * 8 * 128 * 2
    other = routes.plan_summary({**base, "heads": "16"})
    assert other["model"]["preset"] == "custom" and other["model"]["kv_heads"] == 16


@pytest.mark.parametrize("window_size,held", [(4, 1), (3, 2), (2, 3), (1, 4)])
def test_a_magi1_plan_holds_what_its_samplers_key_ranges_reach(window_size, held):
    """MAGI-1 AR Sampler's chunk is 6 latent frames, and its window 0 keeps the finished chunks its key ranges
    (5,4,3,2 over the quarters of a chunk's steps) reach: a chunk denoised with W-1 younger ones in flight reaches
    back 5 chunks, W-1 of them in flight, so at its first quarter it reads 5-W finished ones (at least 1). The
    bytes are those chunks' tokens (6 x 45 x 80 at 720p) x 34 layers x K and V x 8 K/V heads x 128 x 2 bytes."""
    steps = "12" if window_size == 3 else "16"  # steps divide by the window and by the 4 stages
    out = routes.plan_summary(
        {"preset": "magi1-4.5b", "width": "1280", "height": "720", "frames": "240", "window_size": str(window_size),
         "steps": steps}
    )  # fmt: skip
    assert held == max(1, 5 - window_size)
    assert out["chunk_frames"] == 6 and out["cached_chunks_peak"] == held
    assert out["bf16_bytes"] == held * 6 * 45 * 80 * 34 * 2 * 8 * 128 * 2
    assert any(f"{held} finished chunk(s) at window_size {window_size}" in n for n in out["warnings"])
    # a window typed by the user is the user's; kv_ranges 'all' keeps every finished chunk (9 of 10 at 240 frames)
    typed = routes.plan_summary({"preset": "magi1-4.5b", "frames": "240", "window_chunks": "2"})
    assert typed["cached_chunks_peak"] == 2
    every = routes.plan_summary({"preset": "magi1-4.5b", "frames": "240", "kv_ranges": "all"})
    assert every["cached_chunks_peak"] == 9 and every["chunks"] == 10


@pytest.mark.parametrize(
    "query,param,fix",
    [
        ({"preset": "wan2.1-1.3b", "window_size": "4"}, "window_size", "plan a MAGI-1 model (preset=magi1-4.5b)"),
        ({"preset": "magi1-4.5b", "window_size": "5"}, "window_size", "MAGI-1 keeps 1 to 4 chunks in flight"),
        ({"preset": "magi1-4.5b", "steps": "15"}, "steps", "steps that divide by 4"),
        ({"preset": "magi1-4.5b", "kv_ranges": "5;4"}, "kv_ranges", "the reference's 5,4,3,2"),
        ({"preset": "magi1-4.5b", "steps": "many"}, "steps", "steps=16"),
    ],
)
def test_magi1_sampler_fields_that_the_sampler_would_refuse_are_named(query, param, fix):
    with pytest.raises(routes.ParamError) as err:
        routes.plan_summary(query)
    assert err.value.param == param and fix in str(err.value)


def test_only_families_that_save_runs_get_a_state_file_size():
    """MAGI-1 and HY-WorldPlay refuse Save KV Cache: their plans size no file; Wan's does."""
    assert routes.plan_summary({"preset": "wan2.1-1.3b"})["state_file_bytes"] > 0
    for preset in ("magi1-4.5b", "hy-worldplay"):
        out = routes.plan_summary({"preset": preset})
        assert out["state_file_bytes"] is None and out["state_file_mib"] is None


def test_a_chunk_given_to_a_magi1_plan_is_replaced_by_its_samplers_and_said_so():
    out = routes.plan_summary({"preset": "magi1-24b", "chunk_frames": "3"})
    assert out["chunk_frames"] == 6
    assert any("makes chunks of 6 latent frames" in n for n in out["warnings"])
    assert not any("makes chunks" in n for n in routes.plan_summary({"preset": "magi1-24b"})["warnings"])


def test_the_presets_come_from_every_family_in_the_registry():
    """routes/ui.py knows no model: each family's presets, labelled, with the family's key."""
    fams = load_pack_module("runtime.families")
    opt = routes.options()
    want = {n: (f.key, p.label, p.dims) for f in fams.FAMILIES for n, p in f.presets.items()}
    got = {n: (v["family"], v["label"], (v["layers"], v["heads"], v["head_dim"])) for n, v in opt["presets"].items()}
    assert got == want and want
    assert opt["families"] == {f.key: f.name for f in fams.FAMILIES}


def test_plan_of_hy_worldplay_counts_both_streams_and_the_20_frame_context():
    """HY-WorldPlay's preset: 54 blocks x 2 streams (RoPE and PRoPE) of 16 heads x 128, chunks of 4, and a context of
    up to 20 frames rebuilt before every chunk: at 480p, 125 frames, 27.6 GB in BF16 and 4.7 GB at INT2 g32
    (benchmarks/worldplay_memory.py), whatever chunk, window and sink the query gives."""
    family = load_pack_module("runtime.families.worldplay.family").WorldPlayFamily
    preset = family.presets["hy-worldplay"]
    assert (preset.layers, preset.streams, preset.heads, preset.head_dim) == (54, 2, 16, 128)
    assert (preset.chunk_frames, preset.context_frames, preset.context_chunks) == (4, 20, 5)
    q = {"preset": "hy-worldplay", "width": "832", "height": "480", "frames": "125"}
    out = routes.plan_summary({**q, "chunk_frames": "3", "window_chunks": "0", "sink_chunks": "1"})
    ref = plan_cache(
        latent_frames=32,
        latent_height=30,
        latent_width=52,
        chunk_frames=4,
        window_chunks=5,
        shape=CacheShape(layers=108, heads=16, head_dim=128, geometry=family.geometry),
        precision=CachePrecision(spec_k=QuantSpec(2, 32, "hadamard"), spec_v=QuantSpec(2, 32, "hadamard")),
    )
    assert out["bf16_bytes"] == ref.bf16_bytes == 27_603_763_200
    assert out["quantized_bytes"] == ref.quantized_bytes == 4_744_396_800
    assert out["tokens_per_latent_frame"] == 1560 and out["cached_tokens_peak"] == 20 * 1560
    assert (out["chunk_frames"], out["window_chunks"], out["sink_chunks"]) == (4, 5, 0)
    assert out["model"] == {
        "preset": "hy-worldplay",
        "family": "worldplay",
        "layers": 54,
        "heads": 16,
        "kv_heads": 16,
        "head_dim": 128,
        "streams": 2,
        "cache_layers": 108,
        "context_frames": 20,
    }
    assert any("rebuilds its cache before every chunk from up to 20 latent frames" in w for w in out["warnings"])
    # the planner's own chunk and window give the same figure, with no note; one stream would be half
    same = routes.plan_summary({**q, "chunk_frames": "4", "window_chunks": "5"})
    assert same["quantized_bytes"] == out["quantized_bytes"] and not any("rebuilds" in w for w in same["warnings"])
    custom = routes.plan_summary(
        {**q, "preset": "custom", "family": "worldplay", "layers": "54", "heads": "16", "head_dim": "128"}
    )
    assert custom["model"]["preset"] == "hy-worldplay" and custom["bf16_bytes"] == out["bf16_bytes"]
    opt = routes.options()["presets"]["hy-worldplay"]
    assert (opt["streams"], opt["chunk_frames"], opt["context_frames"]) == (2, 4, 20)


def test_plan_window_smaller_than_video_caps_the_peak():
    full = routes.plan_summary({"window_chunks": "0"})
    win = routes.plan_summary({"window_chunks": "2"})
    assert win["cached_chunks_peak"] == 2
    assert win["quantized_bytes"] * 3 == full["quantized_bytes"]  # 2 of the 6 cached chunks


def test_plan_warns_when_window_exceeds_the_video():
    out = routes.plan_summary({"window_chunks": "7"})
    assert any("window of 7 chunks is not smaller than the video's 7 chunks" in w for w in out["warnings"])
    assert out["runnable"]


def test_plan_group_size_not_dividing_head_dim_is_an_error_not_a_number():
    out = routes.plan_summary({"preset": "custom", "layers": "2", "heads": "2", "head_dim": "32", "group_size": "64"})
    assert not out["runnable"]
    assert out["quantized_bytes"] is None and out["quantized_mib"] is None
    assert out["errors"] == ["key and value cache: group_size 64 does not divide head_dim 32; use 8, 16 or 32"]
    assert not any("does not divide" in w for w in out["warnings"])  # listed once, as an error


def test_plan_notes_odd_sizes_and_frame_counts():
    out = routes.plan_summary({"width": "850", "frames": "82"})
    joined = " ".join(out["warnings"])
    assert "850x480 is not a multiple of 16" in joined
    assert "82 frames" in joined and "21 latent frames" in joined


def test_plan_projection_equals_bytes_a_real_cache_holds():
    """Fill real ChunkCaches with the shapes the plan describes: the bytes must agree exactly."""
    q = {
        "preset": "custom",
        "layers": "2",
        "heads": "2",
        "head_dim": "32",
        "width": "64",
        "height": "48",
        "frames": "17",
        "chunk_frames": "2",
        "window_chunks": "0",
        "cfg_branches": "2",
        "group_size": "16",
        "key_bits": "2",
        "value_bits": "3",
    }
    out = routes.plan_summary(q)
    assert out["latent_frames"] == 5 and out["chunks"] == 3 and out["cached_chunks_peak"] == 2
    spec_k, spec_v = QuantSpec(2, 16, "hadamard"), QuantSpec(3, 16, "hadamard")
    tokens = 2 * out["tokens_per_latent_frame"]
    g = torch.Generator().manual_seed(0)
    caches = [ChunkCache(spec_k, spec_v) for _ in range(2 * 2)]  # layers x cfg branches
    for cache in caches:
        for _ in range(out["cached_chunks_peak"]):
            k, v = (torch.randn(1, 2, tokens, 32, generator=g) for _ in range(2))
            cache.append(k, v)
    assert sum(c.nbytes for c in caches) == out["quantized_bytes"]
    assert sum(c.bf16_nbytes for c in caches) == out["bf16_bytes"]


# ------------------------------------------------------------------------------------- bad values
@pytest.mark.parametrize(
    "params, param, words",
    [
        ({"width": "abc"}, "width", ["width='abc' is not an integer", "video width in pixels"]),
        ({"width": "8"}, "width", ["out of range 16..16384"]),
        ({"key_bits": "5"}, "key_bits", ["key_bits='5' is not supported", "2, 3, 4, 8, off"]),
        ({"group_size": "48"}, "group_size", ["group_size=48 is not supported", "8, 16, 32, 64, 128, 256"]),
        ({"scale_format": "fp8"}, "scale_format", ["fp8_e4m3, bf16, fp16, fp32"]),
        ({"rotation": "random"}, "rotation", ["none, hadamard"]),
        (
            {"preset": "wan2.2"},
            "preset",
            [
                "wan2.1-1.3b, wan2.1-14b, tiny-ar, hy-worldplay, lingbot-world-1.3b, lingbot-world-14b, magi1-4.5b, magi1-24b, custom"
            ],
        ),
        ({"preset": "custom"}, "layers", ["layers is missing", "preset=custom needs layers, heads and head_dim"]),
        ({"cfg_branches": "3"}, "cfg_branches", ["out of range 1..2", "cfg > 1"]),
        ({"window_chunks": "-1"}, "window_chunks", ["0 = all"]),
        ({"chunk_frame": "3"}, "chunk_frame", ["not a known parameter", "chunk_frames"]),
        ({"method": "vq"}, "method", ["method='vq' is not supported", "rtn, qvg"]),
        ({"method": "qvg", "qvg_centroids": "300"}, "qvg_centroids", ["out of range 0..256", "0 = auto"]),
        ({"method": "qvg", "qvg_stages": "x"}, "qvg_stages", ["is not an integer"]),
        ({"chunk_tokens": "5"}, "chunk_tokens", ["not a known parameter"]),
    ],
)
def test_plan_rejects_bad_values_naming_value_and_fix(params, param, words):
    with pytest.raises(routes.ParamError) as exc:
        routes.plan_summary(params)
    body = exc.value.to_json()
    assert body["param"] == param
    for w in words:
        assert w in body["error"], body["error"]
    assert body["fix"] and body["fix"] in body["error"]


def test_options_lists_the_node_choices_and_presets():
    from jensen_kv_pack_under_test.runtime import config

    opt = routes.options()
    assert opt["bits"] == list(config.BITS_CHOICES)
    assert [str(g) for g in opt["group_size"]] == list(config.GROUP_SIZE_CHOICES)
    assert opt["scale_format"] == list(config.SCALE_FORMAT_CHOICES)
    assert opt["method"] == list(config.METHOD_CHOICES) == ["rtn", "qvg"]
    assert opt["defaults"]["method"] == "rtn" and opt["ranges"]["qvg_centroids"]["max"] == 256
    wan_presets = {k: v for k, v in opt["presets"].items() if v["family"] == "wan"}
    # the real Wan sizes, and the bundled demo model (4 blocks, 2 heads x 128) with the files that are it
    assert {k: (v["layers"], v["heads"], v["head_dim"]) for k, v in wan_presets.items()} == {
        **MODEL_PRESETS,
        "tiny-ar": (4, 2, 128),
    }
    assert wan_presets["tiny-ar"]["files"] == ["jensen-kv-tiny-ar.safetensors", "jensen-kv-tiny-ar-v2.safetensors"]
    assert all(v["files"] == [] for k, v in opt["presets"].items() if k != "tiny-ar")
    json.dumps(opt)  # served as JSON
    with pytest.raises(routes.ParamError):
        routes.options({"x": "1"})


# ---------------------------------------------------------------------------------- aiohttp glue
@pytest.mark.comfyui  # aiohttp comes with ComfyUI's requirements: CI must not skip this
def test_registered_handlers_answer_json_and_400():
    pytest.importorskip("aiohttp", reason="aiohttp (a ComfyUI requirement) is not installed")
    from aiohttp import web
    from aiohttp.test_utils import make_mocked_request

    table = web.RouteTableDef()
    assert routes.register(table)
    assert routes.register(table)  # idempotent: no duplicate routes
    paths = [r.path for r in table]
    assert sorted(paths) == ["/jensen_kv/options", "/jensen_kv/plan", "/jensen_kv/spec"]
    handlers = {r.path: r.handler for r in table}

    async def call(path, query=""):
        resp = await handlers[path](make_mocked_request("GET", f"{path}?{query}"))
        return resp.status, json.loads(resp.body)

    status, body = asyncio.run(call("/jensen_kv/spec", "key_bits=4&group_size=64"))
    assert status == 200 and body["key"]["effective_bits"] == 4 + 24 / 64
    status, body = asyncio.run(call("/jensen_kv/plan", "group_size=12"))
    assert status == 400 and body["param"] == "group_size" and "group_size=12" in body["error"]
    status, body = asyncio.run(call("/jensen_kv/plan", "frames=81&width=832&height=480"))
    assert status == 200 and math.isclose(body["quantized_mib"], body["quantized_bytes"] / 2**20)


def test_register_without_a_server_is_a_no_op():
    assert routes.register() is False


def test_plan_counts_the_sink_and_reports_the_cache_file_size():
    base = {"preset": "wan2.1-1.3b", "width": "832", "height": "480", "frames": "81", "chunk_frames": "3"}
    windowed = routes.plan_summary({**base, "window_chunks": "2"})
    sunk = routes.plan_summary({**base, "window_chunks": "2", "sink_chunks": "1"})
    assert (windowed["cached_chunks_peak"], sunk["cached_chunks_peak"]) == (2, 3)
    assert sunk["quantized_bytes"] * 2 == windowed["quantized_bytes"] * 3
    assert sunk["sink_chunks"] == 1 and sunk["state_file_bytes"] > sunk["quantized_bytes"]
    with pytest.raises(routes.ParamError, match="sink_chunks=-1"):
        routes.plan_summary({**base, "sink_chunks": "-1"})


# ------------------------------------------------------------------------------------- precision by age
def test_plan_with_age_tiers_counts_each_chunk_at_its_bits_as_a_real_cache_does():
    """The sink at 8 bits, the newest 2 chunks at 4, the rest at 2: the route's bytes, average bits and bits per
    chunk are those of real ChunkCaches fed the chunks the run writes (last chunk included: the cache file)."""
    from jensen_core.tiers import AgeTiers

    q = {
        "preset": "custom",
        "layers": "2",
        "heads": "2",
        "head_dim": "32",
        "width": "64",
        "height": "48",
        "frames": "29",
        "chunk_frames": "1",
        "window_chunks": "3",
        "sink_chunks": "1",
        "group_size": "16",
        "key_bits": "2",
        "value_bits": "2",
        "recent_chunks_bits": "4",
        "recent_chunks": "2",
        "sink_bits": "8",
    }
    out = routes.plan_summary(q)
    assert out["tiers"] == "recent2@4+sink@8" and out["chunk_bits_k"] == [8, 2, 4, 4] == out["chunk_bits_v"]
    spec = QuantSpec(2, 16, "hadamard")
    tokens = out["tokens_per_latent_frame"]
    g = torch.Generator().manual_seed(0)
    caches = [ChunkCache(spec, spec, 3, 1, AgeTiers(4, 2, 8)) for _ in range(2)]  # layers x 1 cfg branch
    for cache in caches:
        for _ in range(out["chunks"] - 1):  # the last chunk is not written (the kv_cache output is not connected)
            k, v = (torch.randn(1, 2, tokens, 32, generator=g) for _ in range(2))
            cache.append(k, v)
    assert [e.k.spec.bits for e in caches[0].entries] == out["chunk_bits_k"]
    assert sum(c.nbytes for c in caches) == out["quantized_bytes"]
    assert out["effective_bits"] == pytest.approx(16 * out["quantized_bytes"] / out["bf16_bytes"])
    uniform = routes.plan_summary({k: v for k, v in q.items() if k not in ("recent_chunks_bits", "sink_bits")})
    assert uniform["tiers"] is None and uniform["quantized_bytes"] < out["quantized_bytes"]
    assert uniform["chunk_bits_k"] == [2, 2, 2, 2]
    # recent_chunks counts only with recent_chunks_bits on (the node sends it always)
    assert routes.plan_summary({**q, "recent_chunks_bits": "off", "recent_chunks": "0"})["tiers"] == "sink@8"
    # a values-only recent tier: the keys stay at INT2 but the sink's, and the bytes are a real cache's
    vo = routes.plan_summary({**q, "recent_chunks_key_bits": "off"})
    assert (
        vo["tiers"] == "recent2@4k0+sink@8"
        and vo["chunk_bits_k"] == [8, 2, 2, 2]
        and vo["chunk_bits_v"] == [8, 2, 4, 4]
    )
    caches = [ChunkCache(spec, spec, 3, 1, AgeTiers(4, 2, 8, recent_key_bits=0)) for _ in range(2)]
    g = torch.Generator().manual_seed(1)
    for cache in caches:
        for _ in range(out["chunks"] - 1):
            k, v = (torch.randn(1, 2, tokens, 32, generator=g) for _ in range(2))
            cache.append(k, v)
    assert sum(c.nbytes for c in caches) == vo["quantized_bytes"] < out["quantized_bytes"]


@pytest.mark.parametrize(
    "params, param, words",
    [
        (
            {"recent_chunks_bits": "2"},
            "recent_chunks_bits",
            ["recent_chunks_bits='2' is not supported", "off, 3, 4, 8"],
        ),
        (
            {"recent_chunks_bits": "4", "recent_chunks_key_bits": "2"},
            "recent_chunks_key_bits",
            ["recent_chunks_key_bits='2' is not supported", "same, off, 3, 4, 8"],
        ),
        ({"recent_chunks_bits": "4", "recent_chunks": "0"}, "recent_chunks", ["keep 1 to 64 of the newest"]),
        ({"recent_chunks_bits": "4", "recent_chunks": "99"}, "recent_chunks", ["out of range 0..64"]),
        (
            {"key_bits": "4", "value_bits": "4", "recent_chunks_bits": "4"},
            "recent_chunks_bits",
            ["keep no chunk above"],
        ),
        ({"key_bits": "off", "value_bits": "off", "sink_bits": "8"}, "sink_bits", ["both off"]),
    ],
)
def test_plan_rejects_bad_tiers_naming_value_and_fix(params, param, words):
    with pytest.raises(routes.ParamError) as exc:
        routes.plan_summary(params)
    body = exc.value.to_json()
    assert body["param"] == param
    for w in words:
        assert w in body["error"], body["error"]


def test_plan_counts_precision_by_head_and_names_bad_values():
    """head_bits 4 on a quarter of Wan 1.3B's 12 heads (3 per layer) over INT2 g32: the keys' bits rise by 3/12 x 2 =
    0.5, the bytes are the planner's; a bad value names the input and the fix."""
    q = {"preset": "wan2.1-1.3b", "key_bits": "2", "value_bits": "2", "group_size": "32"}
    uniform = routes.plan_summary(q)
    out = routes.plan_summary({**q, "head_bits": "4", "head_fraction": "0.25"})
    assert out["head_bits"] == "0.25@4" and out["promoted_heads"] == 3 and uniform["promoted_heads"] == 0
    assert out["effective_bits_k"] == pytest.approx(uniform["effective_bits_k"] + 0.5)
    assert out["effective_bits_v"] == uniform["effective_bits_v"]
    assert out["quantized_bytes"] > uniform["quantized_bytes"]
    assert routes.plan_summary({**q, "head_bits": "off", "head_fraction": "7"})["head_bits"] is None
    for params, param, words in (
        ({"head_bits": "5"}, "head_bits", "head_bits='5' is not supported"),
        ({"head_bits": "4", "head_fraction": "0"}, "head_fraction", "from 0.01 to 1"),
        ({"head_bits": "4", "key_bits": "4"}, "head_bits", "not above key_bits=4"),
        ({"head_bits": "4", "recent_chunks_bits": "4"}, "head_bits", "cannot be combined"),
    ):
        with pytest.raises(routes.ParamError) as exc:
            routes.plan_summary({**q, **params})
        body = exc.value.to_json()
        assert body["param"] == param and words in body["error"], body


def test_the_lingbot_presets_plan_the_reference_window_as_2_frame_entries():
    """LingBot-World's window of 18 latent frames with a sink of 6 (the sampler's local_attn_size / sink_size, its
    defaults when absent) is planned as 2-frame entries (sink 3, window 4: 14 cached frames) at chunk 4, whatever window
    in chunks was typed; the README's 480x832 figures (88 latent frames, the CLI's 361-frame run as whole chunks)."""
    base = {"preset": "lingbot-world-14b", "width": "832", "height": "480", "frames": "349", "chunk_frames": "4"}
    bf16 = routes.plan_summary({**base, "key_bits": "off", "value_bits": "off"})
    assert bf16["model"]["family"] == "lingbot" and bf16["latent_frames"] == 88
    assert bf16["bf16_bytes"] == 17_891_328_000 == 40 * 2 * 40 * 128 * 2 * 14 * 1560
    int2 = routes.plan_summary({**base, "key_bits": "2", "value_bits": "2", "group_size": "32", "window_chunks": "7"})
    assert int2["quantized_bytes"] == 3_075_072_000
    small = routes.plan_summary({**base, "preset": "lingbot-world-1.3b", "key_bits": "4", "value_bits": "4"})
    assert small["quantized_bytes"] == 1_195_084_800
    wider = routes.plan_summary({**base, "local_attn_size": "26", "sink_size": "6"})
    assert wider["bf16_bytes"] * 14 == bf16["bf16_bytes"] * 22
    with pytest.raises(routes.ParamError, match="local_attn_size"):
        routes.plan_summary({**base, "local_attn_size": "9"})


# ----------------------------------------------------------------------------- the loader's file (issue 41, item 1)
def _header_file(path, shapes: dict, metadata: dict | None = None):
    """A safetensors file of ``shapes`` (zeros of float16: only the header matters) at ``path``."""
    from safetensors.torch import save_file

    save_file({k: torch.zeros(v, dtype=torch.float16) for k, v in shapes.items()}, str(path), metadata=metadata)
    return path


def _wan_shapes(layers: int, dim: int, in_dim: int = 16) -> dict:
    shapes = {"head.modulation": (1, 2, dim), "patch_embedding.weight": (dim, in_dim, 1, 2, 2)}
    shapes |= {f"blocks.{i}.self_attn.q.weight": (dim, dim) for i in range(layers)}
    return shapes


def _plan_file(tmp_path, name: str, **params):
    def resolve(folder, file):
        assert folder == params.get("model_folder", "diffusion_models")
        return str(tmp_path / file) if (tmp_path / file).is_file() else None

    return routes.model_of_file({"model_file": name, **params}, resolve=resolve)


def test_the_plan_takes_the_dimensions_of_the_loaders_file_from_its_header(tmp_path, monkeypatch):
    """A Wan file of 3 blocks of width 384 (not a preset): 3 layers x 3 heads x 128, as ComfyUI's detection builds
    it (dim // 128 heads); the bundled tiny file is the tiny preset; both read from the header alone."""
    _header_file(tmp_path / "odd_wan.safetensors", _wan_shapes(3, 384))
    family, preset, shape, note = _plan_file(tmp_path, "odd_wan.safetensors")
    assert (family.key, preset, shape.dims, note) == ("wan", routes.CUSTOM_PRESET, (3, 3, 128), None)
    monkeypatch.setattr(routes, "_file_path", lambda folder, name: str(tmp_path / name))
    plan = routes.plan_summary({"preset": "wan2.1-14b", "layers": "40", "model_file": "odd_wan.safetensors"})
    m = plan["model"]
    assert (m["layers"], m["heads"], m["head_dim"], m["source"]) == (3, 3, 128, "odd_wan.safetensors's header")
    by_hand = routes.plan_summary(
        {"preset": routes.CUSTOM_PRESET, "family": "wan", "layers": "3", "heads": "3", "head_dim": "128"}
    )
    assert plan["bf16_bytes"] == by_hand["bf16_bytes"] and plan["quantized_bytes"] == by_hand["quantized_bytes"]
    from pathlib import Path

    tiny = Path(routes.__file__).resolve().parents[1] / "models" / "tiny_ar" / "jensen-kv-tiny-ar-v2.safetensors"
    monkeypatch.setattr(routes, "_file_path", lambda folder, name: str(tiny))
    m = routes.plan_summary({"preset": "wan2.1-1.3b", "model_file": tiny.name})["model"]
    assert (m["preset"], m["label"], m["layers"], m["heads"]) == ("tiny-ar", "tiny AR (bundled demo)", 4, 2)


def test_each_familys_file_is_recognised_by_that_family_only(tmp_path):
    """LingBot-World (Wan's blocks plus camera layers, 36 input channels), HY-WorldPlay, MAGI-1 and Wan files: each
    header names one family and its released dimensions."""
    lb_keys = load_pack_module("runtime.families.lingbot.model.keys")
    wp_keys = load_pack_module("runtime.families.worldplay.model.keys")
    cases = {
        "lingbot-1.3b": (lb_keys.official_shapes(lb_keys.RELEASED["lingbot-world-1.3b"]), "lingbot", (30, 12, 128), 1),
        "worldplay": (wp_keys.official_shapes(wp_keys.RELEASED), "worldplay", (54, 16, 128), 2),
        "wan-1.3b": (_wan_shapes(30, 1536), "wan", (30, 12, 128), 1),
        "wan-i2v": (_wan_shapes(2, 256, in_dim=36), None, None, None),
    }
    for name, (shapes, family, dims, streams) in cases.items():
        found = [(f.key, p) for f in routes.FAMILIES if (p := f.preset_from_shapes(shapes, {})) is not None]
        if family is None:
            assert found == [], name  # a Wan image-to-video file: no family of the pack runs it
            continue
        assert [k for k, _ in found] == [family], name
        assert found[0][1].dims == dims and found[0][1].streams == streams, name
    from pathlib import Path

    magi = Path(routes.__file__).resolve().parents[1] / "models" / "tiny_magi1" / "jensen-kv-tiny-magi1.safetensors"
    family, _, shape, _ = routes.model_of_file({"model_file": magi.name}, resolve=lambda folder, name: str(magi))
    assert family.key == "magi1" and shape.dims == (4, 4, 64) and shape.kv_heads == 2 and shape.chunk_frames == 6


def test_a_file_the_planner_cannot_read_is_said_and_the_preset_stays(tmp_path):
    (tmp_path / "notes.safetensors").write_bytes(b"not a model at all")
    _header_file(tmp_path / "vae.safetensors", {"decoder.conv_in.weight": (4, 4, 3, 3)})
    for name, words in (
        ("missing.safetensors", "missing.safetensors is not in models/diffusion_models"),
        ("notes.safetensors", "is not a safetensors file"),
        ("vae.safetensors", "no model the pack's families run"),
    ):
        family, preset, shape, note = _plan_file(tmp_path, name)
        assert family is None and words in note, note
    # in a plan: the preset stays, and the model says why the file was not read (no warning: a placeholder or a
    # GGUF is not a problem of the run)
    plan = routes.plan_summary({"preset": "wan2.1-1.3b", "model_file": "notes.safetensors"})
    assert plan["model"]["preset"] == "wan2.1-1.3b" and plan["model"]["layers"] == 30 and plan["warnings"] == []
    assert "not a safetensors file" in plan["model"]["file_note"] or "is not in models" in plan["model"]["file_note"]
    with pytest.raises(routes.ParamError, match="model_folder='loras'.*diffusion_models"):
        _plan_file(tmp_path, "x.safetensors", model_folder="loras")
