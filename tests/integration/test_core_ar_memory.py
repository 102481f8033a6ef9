"""``benchmarks/core_ar_memory.py``'s measuring function on a very small video: the relations its table rests on.

On ComfyUI v0.27's own AR sampler (``sample_ar_video``) with a tiny causal Wan of Wan's head geometry (1 head x 128,
2 layers, BF16): core's ``init_kv_caches`` really allocates the formula's bytes; the pack's cache on the same path
stores exactly the planner's figure at its peak; the block in flight is the formula's; and INT2 g32 is smaller than
core's preallocation by at least 16 / 2.75 x (frames core allocates / frames the pack holds).

Needs v0.27's core AR path: ``core_ar`` (deselected on ComfyUI without it).
"""

from __future__ import annotations

import importlib.util
import sys

import pytest
from support import comfyui as support_comfyui

pytestmark = pytest.mark.core_ar


def _load_benchmark():
    spec = importlib.util.spec_from_file_location(
        "core_ar_memory_bench", support_comfyui.PACK_ROOT / "benchmarks" / "core_ar_memory.py"
    )
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def bench(pack):
    import comfy.model_base

    assert hasattr(comfy.model_base, "WAN21_CausalAR"), "this ComfyUI has no core AR path (WAN21_CausalAR, v0.27+)"
    return _load_benchmark()


@pytest.fixture
def one_thread():
    """One torch thread: a run of tiny calls on a shared machine is many times slower with more."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


FRAMES, H, W, BLOCK, LAYERS, HEADS = 5, 4, 6, 1, 2, 1  # 6 tokens a frame, 5 blocks of 1 frame


def test_core_allocation_pack_peak_and_planner_agree(bench, one_thread):
    S = bench.Setting
    settings = [S("off"), S("2", "none"), S("2", "hadamard", window=2, sink=1), S("4", "hadamard")]
    res = bench.measure(
        latent_frames=FRAMES,
        height=H,
        width=W,
        block_frames=BLOCK,
        layers=LAYERS,
        heads=HEADS,
        dtype="bf16",
        settings=settings,
    )
    core, g = res["core"], res["geometry"]
    tokens = bench.tokens_per_frame(H, W)
    assert tokens == 6 and g["frame_tokens"] == tokens
    # core's measured allocation is the formula: 2 x layers x batch x frames x tokens x heads x 128 x 2 B
    assert core["batch"] == 1 and core["max_seq_len"] == FRAMES * tokens and core["tensors"] == 2 * LAYERS
    assert core["shape"] == (1, FRAMES * tokens, HEADS, 128)
    assert core["bytes"] == core["formula_bytes"] == 2 * LAYERS * 1 * FRAMES * tokens * HEADS * 128 * 2
    rows = {r["setting"]: r for r in res["rows"]}
    for s, r in rows.items():
        # the pack's stored peak is the planner's figure, and the block in flight is the formula's
        assert r["cache_bytes"] == r["planned_bytes"] > 0, s.label
        # the block in flight, at the cache's bits: measured = planner = report (full precision: the BF16 formula)
        assert r["pending_bytes"] == r["in_flight_formula"] == r["reported_in_flight"] == r["planned_in_flight"], (
            s.label
        )
        if s.bits == "off":
            assert r["pending_bytes"] == res["in_flight_formula"] == 2 * LAYERS * BLOCK * tokens * HEADS * 128 * 2
        else:
            assert r["pending_bytes"] * 16 <= res["in_flight_formula"] * (int(s.bits) + 1), s.label
        assert r["total_bytes"] == r["cache_bytes"] + r["pending_bytes"], s.label
    # full precision without a window: every block but the last (nothing reads it), in BF16
    fp = rows[settings[0]]
    assert fp["cache_bytes"] == core["bytes"] * (FRAMES - 1) // FRAMES
    assert fp["rel_rms_vs_core"] < 0.02  # the same video as core's (BF16 rounding apart)
    # INT2 g32: 2.75 bits against core's 16, over the frames the pack holds against all of core's
    held = {settings[1]: FRAMES - 1, settings[2]: 3}  # no window: 4 blocks; window 2 + sink 1: 3 blocks
    for s, frames in held.items():
        factor = (16 / 2.75) * FRAMES / frames
        ratio = core["bytes"] / rows[s]["cache_bytes"]
        assert ratio >= factor * (1 - 1e-9), (s.label, ratio, factor)
        assert rows[s]["effective_bits"] == pytest.approx(2.75)
    assert core["bytes"] / rows[settings[2]]["cache_bytes"] > core["bytes"] / rows[settings[1]]["cache_bytes"]
    assert rows[settings[3]]["effective_bits"] == pytest.approx(4.75)


def test_planner_part_uses_core_formula_and_wan_geometry(bench):
    rows = bench.planner_rows()
    assert len(rows) == 2 * 2 * 2
    r = next(r for r in rows if r["model"] == "Wan 14B" and r["res"] == "720p" and r["frames"] == 81)
    assert r["latent"] == (21, 90, 160) and r["frame_tokens"] == 45 * 80
    assert r["core"] == 2 * 40 * 21 * 3600 * 40 * 128 * 2
    bf16, int2w = r["pack"]["BF16"], r["pack"]["INT2 w4+s1"]
    assert bf16[2] == 6 and int2w[2] == 5 and bf16[0] == r["core"] * 18 // 21
    assert int2w[1] == pytest.approx(2.75)
    assert "\n".join(bench.format_planner(rows)).count("Wan 1.3B") == 4
