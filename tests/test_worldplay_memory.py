"""benchmarks/worldplay_memory.py: the planner's figures for HY-WorldPlay at 480p against the issue's numbers,
worked out by hand (54 blocks x 2 streams x 16 heads x 128, 20 context frames of 1,560 tokens, K and V)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_bench():
    spec = importlib.util.spec_from_file_location("worldplay_memory_bench", ROOT / "benchmarks" / "worldplay_memory.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_planner_gives_the_issues_276_gb_bf16_and_47_gb_int2():
    bench = load_bench()
    rows = {(r["frames"], r["setting"]): r for r in bench.rows()}
    elements = 20 * 1560 * 16 * 128 * 2 * 54 * 2  # tokens x heads x head_dim x (K, V) x blocks x streams
    for frames in (125, 253):
        bf16, int4, int2 = (rows[(frames, s)] for s in ("BF16 (the reference)", "INT4 g32", "INT2 g32"))
        assert bf16["tokens"] == 31_200 and bf16["bytes"] == elements * 2 == 27_603_763_200
        # INT2 g32: 8 bytes of codes + an FP8 step + a BF16 origin per 32 elements = 11 bytes; INT4: 19 bytes
        assert int2["bytes"] == elements * 11 // 32 == 4_744_396_800
        assert int4["bytes"] == elements * 19 // 32
        assert (round(bf16["bytes"] / 1e9, 1), round(int2["bytes"] / 1e9, 1)) == (27.6, 4.7)
    assert bench.prefix_bytes(1000) == 1000 * 16 * 128 * 2 * 54 * 2


def test_the_table_has_the_reference_and_the_pack_with_and_without_the_correction_at_the_same_bytes():
    bench = load_bench()
    table = bench.table()
    for frames in (125, 253):
        rows = {(r["setting"], r["correction"]): r["bytes"] for r in table if r["frames"] == frames}
        assert set(rows) == {
            ("reference (BF16)", "-"),
            ("pack, BF16", "-"),
            *((f"pack, INT{b} g32", c) for b in (4, 2) for c in ("off", "taylor")),
        }
        assert rows[("pack, BF16", "-")] == rows[("reference (BF16)", "-")]
        for b in (4, 2):  # the correction stores nothing
            assert rows[(f"pack, INT{b} g32", "off")] == rows[(f"pack, INT{b} g32", "taylor")]
    # the prompt prefix at INT2 g32: 11 bytes per 32 elements, against 64 in BF16
    assert bench.prefix_bytes_int2(1241) * 64 == bench.prefix_bytes(1241) * 11
