"""The pack's cache under Raylight's Ulysses sequence parallelism, in real processes (two gloo CPU ranks).

Raylight's own injection (``USPInjectRegistry.inject`` as the ON_LOAD callback its ``patch_usp``
registers) on a tiny random ``WAN21_CausalAR``, sampled with core's ``sample_ar_video``; xDiT's
parallel groups set up as Raylight's worker does, over gloo (its worker hard-requires CUDA and NCCL).
``jensen_testing/raylight.py`` runs every case in two ranks (Ulysses 2) and, as the reference, in one
process holding every head (Ulysses 1: the same pack and Raylight's same float32 arithmetic); the
CPU workarounds are listed there and in docs/raylight.md.

Exactness: every part of the pack (RTN groups, Hadamard signs, corrections) is per head, so the
sharded run computes the same numbers as the one-process run, up to float32 rounding in a different
order (measured <= 1.2e-6 on outputs of magnitude ~7; INT2's own effect is ~4e-2). The model has one
text token: Raylight's cross-attention hands each rank N copies of the text keys, and a softmax over
copies of one key is exact, so nothing but the sharding differs. (With 16 text tokens the copies
change float32 rounding by ulps, and an INT2 key that close to a rounding boundary can flip a code:
seen once, 8e-5 off. Quantization is discontinuous; the sharding is not what moves it.)
"""

from __future__ import annotations

import importlib
import sys

import pytest
import torch
from support import comfyui as support_comfyui

from jensen_testing import raylight as jr

pytestmark = [pytest.mark.core_ar, pytest.mark.raylight]

MISSING = jr.missing()
#: float32 rounding in another order (the sharded run against the one-process run)
TOL = 5e-6
CASES = {c["name"]: c for c in jr.cases()}
EXACT = [n for n in CASES if n.startswith("pack_")]
MODES = ("taylor", "chunk_mean", "exact", "per_channel", "off")


@pytest.fixture(scope="module")
def runs(nodes, tmp_path_factory):
    """Every case in two ranks and in one process, plus core's own runs (no Raylight, no pack) in this process."""
    if MISSING:
        pytest.skip(MISSING)
    out = tmp_path_factory.mktemp("raylight")
    procs = jr.start(out)
    try:
        importlib.import_module(f"{support_comfyui.PACK_MODULE}.runtime.core_ar")
        core = {hw: jr.run_single({"pack": False, "hw": hw}, nodes)["out"] for hw in (jr.EVEN_HW, jr.ODD_HW)}
        core["fp_odd"] = jr.run_single({**CASES["pack_fp_odd"], "pack": False})["out"]
    finally:
        results = jr.collect(procs, out)
    return {"ranks": [results[(2, 0)], results[(2, 1)]], "one": results[(1, 0)], "core": core}


def _ok(result: dict, what: str) -> dict:
    assert "error" not in result, f"{what}: {result.get('error')}\n{result.get('traceback', '')}"
    return result


def test_raylight_alone_equals_core_and_attends_its_padding_when_tokens_do_not_divide(runs):
    """Raylight's own path (no pack) against core's single process: equal where tokens per frame divide by the
    ranks (16 over 2); with 9 tokens per frame it caches and attends its zero padding (Raylight c0495710)."""
    even = _ok(runs["ranks"][0]["raylight_even"], "raylight_even")["out"]
    odd = _ok(runs["ranks"][0]["raylight_odd"], "raylight_odd")["out"]
    torch.testing.assert_close(even, runs["core"][jr.EVEN_HW], atol=TOL, rtol=0)
    assert (odd - runs["core"][jr.ODD_HW]).abs().max() > 1e-3  # measured 2.2e-2


def test_the_composition_drops_raylights_padding(runs):
    """A full-precision pack cache on 9 tokens per frame under Ulysses 2 gives core's own video."""
    for rank in runs["ranks"]:
        out = _ok(rank["pack_fp_odd"], "pack_fp_odd")["out"]
        torch.testing.assert_close(out, runs["core"]["fp_odd"], atol=TOL, rtol=0)


@pytest.mark.parametrize("name", EXACT)
def test_head_sharded_pack_equals_the_one_process_pack(runs, name):
    """Every correction mode with INT2 + Hadamard, age tiers, window 2 + sink 1, cfg 2 with strength 0.5 and blocks
    of 2 frames, the pack's ON_LOAD callback before Raylight's, and 9 tokens per frame: each rank's video is the
    one-process one."""
    one = _ok(runs["one"][name], f"{name} in one process")["out"]
    r0, r1 = (_ok(r[name], f"{name} on rank {i}")["out"] for i, r in enumerate(runs["ranks"]))
    assert torch.equal(r0, r1)  # Raylight gathers the same tokens on every rank
    torch.testing.assert_close(r0, one, atol=TOL, rtol=0)


def test_the_modes_differ_far_beyond_the_tolerance(runs):
    """The check above could fail: the corrections give videos far apart compared with TOL (but exact and taylor,
    the same bias to second order in the step size: 5e-6 apart here)."""
    outs = {m: runs["one"][f"pack_{m}"]["out"] for m in MODES}
    gaps = {(a, b): float((outs[a] - outs[b]).abs().max()) for a in MODES for b in MODES if a < b}
    gaps.pop(("exact", "taylor"))
    assert min(gaps.values()) > 100 * TOL, gaps  # measured >= 7.9e-4
    int2 = runs["one"]["pack_int2_even"]["out"]
    assert (int2 - runs["core"][jr.EVEN_HW]).abs().max() > 100 * TOL  # INT2's own effect (measured 3.5e-2)


@pytest.mark.parametrize("name", EXACT)
def test_each_rank_holds_exactly_half_the_cache_and_the_report_says_so(runs, name):
    one = runs["one"][name]["report"]
    for rank, result in enumerate(runs["ranks"]):
        rep = result[name]["report"]
        assert 2 * rep["cache_bytes"] == one["cache_bytes"] > 0
        assert 2 * rep["bf16_bytes"] == one["bf16_bytes"]
        assert rep["planned_bytes"] == rep["cache_bytes"]  # the planner's per-rank bytes (ranks=2)
        assert rep["planned_bytes_all_ranks"] == rep["cache_bytes_all_ranks"] == one["cache_bytes"]
        assert (rep["ranks"], rep["rank"], rep["heads_per_rank"], rep["head_offset"]) == (2, rank, 1, rank)
        assert rep["heads"] == 2 and "ranks" not in one


def test_every_rank_runs_rank_0s_taylor_layout(runs):
    """Rank 1 asked for FlexAttention (set_layout_preference); it adopted the layout rank 0 chose."""
    r0, r1 = (r["_kernel_choices"] for r in runs["ranks"])
    assert r0 and r1 == r0, (r0, r1)
    assert all("flex" not in v.lower() for v in r1.values()), r1


@pytest.mark.parametrize(
    "name,error,words",
    [
        ("refuse_ring", "RaylightCompositionError", ["Ring attention (ring_degree 2)", "all-reduce", "ring_degree 1"]),
        ("refuse_no_seq_len", "RaylightCompositionError", ["usp_ar_block_seq_len", "padding"]),
        ("refuse_heads", "RaylightCompositionError", ["3 attention heads do not divide", "Ulysses degree 2", "(1, 3)"]),
        ("refuse_foreign", "UnusedSettingsError", ["other_packs_forward", "Use one of the two"]),
    ],
)
def test_what_is_not_exact_is_refused_alike_on_every_rank(runs, name, error, words):
    errors = [r[name].get("error", "") for r in runs["ranks"]]
    assert errors[0] == errors[1], errors  # both ranks stop at the same point: neither waits in a collective
    assert errors[0].startswith(error + ":"), errors[0]
    for w in words:
        assert w in errors[0], (w, errors[0])


def test_head_sharded_qvg_equals_the_one_process_pack(runs):
    """QVG seeds its initial centroids per global head (ChunkCache(head_offset=...)): rank 1's head draws head 1's."""
    one = _ok(runs["one"]["qvg"], "qvg in one process")
    for i, r in enumerate(runs["ranks"]):
        # the guard (on by default) acts on QVG's chunks here: its factor comes from a float32 matmul of sampled
        # queries over the chunk's keys, summed in another order when a process holds 1 head instead of 2, so the
        # ranks agree with one process to float32 rounding through that factor (measured 1.3e-5; 5e-6 unguarded)
        torch.testing.assert_close(_ok(r["qvg"], f"qvg on rank {i}")["out"], one["out"], atol=5e-5, rtol=0)
        assert 2 * r["qvg"]["report"]["cache_bytes"] == one["report"]["cache_bytes"]


def test_without_raylight_the_pack_is_unchanged_and_imports_none_of_it(comfy, nodes, monkeypatch):
    """xfuser, yunchang and Raylight absent (their imports fail): the pack's core-path run still equals core's,
    and nothing tried to import them."""

    blocked = ("raylight", "xfuser", "yunchang")
    tried = []

    class Block:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in blocked:
                tried.append(name)
                raise ModuleNotFoundError(f"No module named {name!r}")
            return None

    for m in [m for m in sys.modules if m.split(".")[0] in blocked]:
        monkeypatch.delitem(sys.modules, m)
    monkeypatch.setattr(sys, "meta_path", [Block(), *sys.meta_path])
    case = {"hw": jr.ODD_HW, "frames": 3}
    ref = jr.run_single({**case, "pack": False})["out"]
    out = _ok(jr.run_single({**case, "bits": "off"}, nodes), "pack without Raylight")
    torch.testing.assert_close(out["out"], ref, atol=2e-5, rtol=0)
    assert out["report"]["cache_bytes"] > 0 and "ranks" not in out["report"]
    assert tried == []
