"""Quantizing a slice of the heads equals slicing the quantization of all heads (a sequence-parallel rank holds heads
[h0, h0 + n) of every layer): RTN's groups, the Hadamard signs and QVG's seeded k-means are all per head.

QVG starts each (batch, head) row's k-means from (seed, global head index, stage) only and stops each row on its
own, so ``quantize(x[:, h0:h0+n], spec, head_offset=h0)`` stores exactly ``quantize(x, spec)[:, h0:h0+n]``.
"""

from __future__ import annotations

import pytest
import torch

from jensen_core import ChunkCache, QuantSpec, quantize
from jensen_core.qvg import head_seed, initial_picks, kmeans
from jensen_core.tiers import AgeTiers

SLICES = [(0, 2), (2, 3), (5, 1), (1, 4)]


def _parts(t) -> dict[str, torch.Tensor]:
    """Every stored tensor of a quantized side (RTN parts, plus QVG's centroids and ids)."""
    r = getattr(t, "residual", t)
    parts = {"packed": r.packed, "scale": r.scale.view(torch.uint8), "minimum": r.minimum.view(torch.uint8)}
    if hasattr(t, "centroids"):
        parts.update(centroids=t.centroids.view(torch.uint8), ids=t.ids)
    return parts


def _x(seed=0, B=2, H=6, T=90, D=64):
    gen = torch.Generator().manual_seed(seed)
    centers = torch.randn(H, 5, D, generator=gen) * 3
    pick = torch.randint(0, 5, (B, H, T), generator=gen)
    return torch.gather(centers.expand(B, H, 5, D), 2, pick.unsqueeze(-1).expand(B, H, T, D)) + torch.randn(
        B, H, T, D, generator=gen
    )


SPECS = {
    "rtn": QuantSpec(bits=2, group_size=32),
    "rtn-hadamard": QuantSpec(bits=3, group_size=16, rotation="hadamard", seed=7),
    "qvg": QuantSpec(bits=2, method="qvg", qvg_centroids=6, qvg_iters=8, seed=3),
    "qvg-hadamard-2-stages": QuantSpec(
        bits=4, method="qvg", rotation="hadamard", qvg_stages=2, qvg_centroids=4, qvg_iters=20, seed=1
    ),
    "qvg-auto-k": QuantSpec(bits=2, method="qvg", qvg_iters=3),
}


@pytest.mark.parametrize("name", SPECS)
@pytest.mark.parametrize("h0,n", SLICES)
def test_a_slice_of_the_heads_is_the_slice_of_all_heads(name, h0, n):
    spec = SPECS[name]
    x = _x(T=12150 // 40 if name == "qvg-auto-k" else 90)  # auto K: 6 centroids on 303-token chunks
    full = quantize(x, spec)
    part = quantize(x[:, h0 : h0 + n], spec, head_offset=h0)
    whole, mine = _parts(full[:, h0 : h0 + n]), _parts(part)
    assert whole.keys() == mine.keys()
    for key in whole:
        assert torch.equal(whole[key], mine[key]), key
    assert torch.equal(full[:, h0 : h0 + n].dequantize(), part.dequantize())


def test_long_chunks_where_a_head_stops_while_others_still_move():
    """On chunks of 20,000 tokens the tolerance lets a row stop with one token still changing cluster (1e-4 of its
    tokens): there each head's early stop matters, and the slice still equals the slice of all heads."""
    spec = QuantSpec(bits=2, group_size=8, method="qvg", qvg_centroids=6, qvg_iters=60, seed=2)
    gen = torch.Generator().manual_seed(0)
    centers = torch.randn(4, 6, 16, generator=gen) * 3
    pick = torch.randint(0, 6, (4, 20000), generator=gen)
    x = torch.gather(centers, 1, pick.unsqueeze(-1).expand(4, 20000, 16)) + 3 * torch.randn(4, 20000, 16, generator=gen)
    x = x.unsqueeze(0)
    rounds = [kmeans(x[0, h : h + 1], 6, 60, init=initial_picks(2, 0, range(h, h + 1), 20000, 6))[2] for h in range(4)]
    assert len(set(rounds)) == 4 and max(rounds) < 60, rounds  # every head stops on its own, at its own round
    full = quantize(x, spec)
    for h0, n in ((1, 2), (3, 1)):
        part = quantize(x[:, h0 : h0 + n], spec, head_offset=h0)
        assert torch.equal(part.centroids, full[:, h0 : h0 + n].centroids)
        assert torch.equal(part.ids, full[:, h0 : h0 + n].ids)


def test_without_its_offset_a_slice_gets_other_heads_centroids():
    """The positive control: the same heads quantized as if they were heads 0.. start from other tokens."""
    spec = SPECS["qvg"]
    x = _x()
    full = quantize(x, spec)
    assert not torch.equal(quantize(x[:, 2:4], spec).centroids, full[:, 2:4].centroids)


def test_the_start_depends_on_seed_head_and_stage_only():
    a = initial_picks(3, 0, range(0, 6), 90, 6)
    assert torch.equal(initial_picks(3, 0, range(2, 4), 90, 6), a[2:4])  # whatever other heads are drawn with
    assert all(len(set(r.tolist())) == 6 for r in a)  # distinct tokens per head
    assert not torch.equal(a[0], a[1])
    assert not torch.equal(initial_picks(3, 1, range(0, 6), 90, 6), a)  # another stage
    assert not torch.equal(initial_picks(4, 0, range(0, 6), 90, 6), a)  # another seed
    seeds = {head_seed(s, h, st) for s in range(3) for h in range(64) for st in range(3)}
    assert len(seeds) == 3 * 64 * 3 and all(0 <= v < 2**63 for v in seeds)
    # the batch items of one head start alike, so a batch slice is the slice of the batch too
    spec, x = SPECS["qvg"], _x()
    assert torch.equal(quantize(x[1:], spec).centroids, quantize(x, spec)[1:].centroids)


def test_kmeans_stops_every_row_on_its_own():
    """A row that settles after one round stops there even while another row keeps moving: each row's result is what
    it gets alone."""
    gen = torch.Generator().manual_seed(0)
    easy = torch.cat([torch.zeros(30, 8), torch.ones(30, 8) * 10]) + 0.01 * torch.randn(60, 8, generator=gen)
    hard = torch.randn(60, 8, generator=gen)
    x = torch.stack([easy, hard])
    init = torch.stack([torch.tensor([0, 1]), torch.tensor([0, 1])])  # easy: both starts in the first cluster
    ids, c, n = kmeans(x, 2, iters=50, tol=0.02, init=init)  # a row stops with at most 1 of its 60 tokens moving
    for r in range(2):
        ids_r, c_r, n_r = kmeans(x[r : r + 1], 2, iters=50, tol=0.02, init=init[r : r + 1])
        assert torch.equal(ids[r], ids_r[0]) and torch.equal(c[r], c_r[0])
        if r == 0:
            easy_rounds = n_r
    assert easy_rounds < n  # the easy row stopped before the batch did
    with pytest.raises(ValueError, match=r"kmeans init must be \(rows, min\(k, tokens\)\) = \(2, 2\) int64"):
        kmeans(x, 2, iters=5, init=init[:1])


@pytest.mark.parametrize("name", ["qvg", "rtn-hadamard"])
def test_a_cache_of_a_slice_of_the_heads_with_tiers_holds_the_slice(name, tmp_path):
    """Appends, demotions (a requantization: QVG's k-means again) and a file round trip of a rank's cache."""
    spec = SPECS[name]
    tiers = AgeTiers(recent_bits=4, recent_chunks=1, sink_bits=8)
    full = ChunkCache(spec, spec, window_chunks=2, sink_chunks=1, tiers=tiers)
    part = ChunkCache(spec, spec, window_chunks=2, sink_chunks=1, tiers=tiers, head_offset=2)
    for seed in range(4):
        x = _x(seed, B=1)
        full.append(x, x * 0.5)
        part.append(x[:, 2:5], x[:, 2:5] * 0.5)
    assert part.chunks_demoted == full.chunks_demoted > 0
    for ef, ep in zip(full.entries, part.entries):
        for a, b in ((ef.k[:, 2:5], ep.k), (ef.v[:, 2:5], ep.v)):
            assert a.spec == b.spec
            assert all(torch.equal(u, v) for u, v in zip(_parts(a).values(), _parts(b).values()))
    path = str(tmp_path / "rank1.safetensors")
    part.save(path)
    back = ChunkCache(spec, spec, window_chunks=2, sink_chunks=1, tiers=tiers, head_offset=2)
    back.load(path)
    assert back.head_offset == 2 and back.nbytes == part.nbytes
    with pytest.raises(ValueError, match=r"heads from global index 2 but this cache's start at 0; .*head_offset=2"):
        ChunkCache(spec, spec, window_chunks=2, sink_chunks=1, tiers=tiers).load(path)
    whole_file = str(tmp_path / "whole.safetensors")  # a cache of every head records no offset, as before
    full.save(whole_file)
    assert "head_offset" not in full._meta()
    assert part.copy().head_offset == 2
    with pytest.raises(ValueError, match="head_offset=-1 must be a whole number >= 0"):
        ChunkCache(spec, spec, head_offset=-1)
    with pytest.raises(ValueError, match="head_offset=True must be a whole number >= 0"):
        quantize(_x(), SPECS["qvg"], head_offset=True)
