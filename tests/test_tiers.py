"""Precision by age (jensen_core.tiers): which chunks the cache keeps at more bits, demotion by requantization,
the bias correction of each chunk with its own step sizes, and cache files that record each chunk's bits."""

from __future__ import annotations

import math

import pytest
import torch

from jensen_core import ChunkCache, QuantSpec, attention, jensen_bias, quantize, rotate
from jensen_core.cache import read_meta
from jensen_core.tiers import AgeTiers, parse_tiers, requantize
from jensen_testing.planning import plan_by_fields

SPEC = QuantSpec(bits=2, group_size=16, rotation="hadamard", seed=3)


def _chunks(n, B=1, H=2, T=12, D=64, seed=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    return [
        ((torch.randn(B, H, T, D, generator=gen) * 2).to(dtype), torch.randn(B, H, T, D, generator=gen).to(dtype))
        for _ in range(n)
    ]


# ----------------------------------------------------------------------------- the policy
def test_positions_keep_the_sink_and_the_newest_chunks_at_their_bits():
    t = AgeTiers(recent_bits=4, recent_chunks=2, sink_bits=8)
    for side in ("k", "v"):
        assert t.position_bits(2, 5, 1, side) == [8, 2, 2, 4, 4]
        assert t.position_bits(2, 2, 1, side) == [8, 4]  # the sink is also the newest but one: the higher bits win
        assert t.position_bits(4, 5, 0, side) == [4, 4, 4, 4, 4]  # no sink; a tier never lowers a side
        assert AgeTiers(sink_bits=4).position_bits(2, 3, 2, side) == [4, 4, 2]
        assert t.side_bits(2, side) == (2, 4, 8) and t.side_bits(8, side) == (8,)
    with pytest.raises(ValueError, match="side='q'"):
        t.position_bits(2, 5, 1, "q")


def test_the_recent_tier_can_set_its_keys_apart():
    """recent_key_bits: the newest chunks' keys at other bits than their values (0: a values-only tier)."""
    values_only = AgeTiers(recent_bits=4, recent_chunks=1, recent_key_bits=0)
    assert values_only.position_bits(2, 3, 0, "v") == [2, 2, 4]
    assert values_only.position_bits(2, 3, 0, "k") == [2, 2, 2]
    assert values_only.side_bits(2, "k") == (2,) and values_only.side_bits(2, "v") == (2, 4)
    assert values_only.newest_bits(2, "k", False) == 2 and values_only.newest_bits(2, "v", False) == 4
    k3 = AgeTiers(4, 1, recent_key_bits=3, sink_bits=8)
    assert k3.position_bits(2, 3, 1, "k") == [8, 2, 3] and k3.position_bits(2, 3, 1, "v") == [8, 2, 4]
    assert k3.newest_bits(2, "k", True) == 8 and k3.newest_bits(2, "k", False) == 3
    keys_only = AgeTiers(0, 2, recent_key_bits=8)
    assert keys_only.position_bits(2, 3, 0, "k") == [2, 8, 8] and keys_only.position_bits(2, 3, 0, "v") == [2, 2, 2]
    # one form per tier: keys at the values' bits is the plain tier, and it compares equal
    assert AgeTiers(4, 1, recent_key_bits=4) == AgeTiers(4, 1) and AgeTiers(4, 1, recent_key_bits=4).to_dict() == {
        "recent_bits": 4,
        "recent_chunks": 1,
        "sink_bits": 0,
    }
    assert "values at 4 bits (keys not tiered)" in values_only.describe()
    assert "values at 4 bits, keys at 3" in k3.describe()


@pytest.mark.parametrize(
    "text,tiers",
    [
        ("recent2@4", AgeTiers(4, 2)),
        ("sink@8", AgeTiers(sink_bits=8)),
        ("recent1@8+sink@4", AgeTiers(8, 1, 4)),
        (" Recent3@4 + sink@8 ", AgeTiers(4, 3, 8)),
        ("recent1@4k0", AgeTiers(4, 1, recent_key_bits=0)),
        ("recent2@4k3+sink@8", AgeTiers(4, 2, 8, recent_key_bits=3)),
        ("recent1@0k8", AgeTiers(0, 1, recent_key_bits=8)),
        ("recent1@3", AgeTiers(3, 1)),
        ("recent1@4k4", AgeTiers(4, 1)),
    ],
)
def test_the_string_form_reads_back(text, tiers):
    assert parse_tiers(text) == tiers and parse_tiers(str(tiers)) == tiers
    assert AgeTiers.from_dict(tiers.to_dict()) == tiers
    assert parse_tiers("off") is None and parse_tiers("") is None and parse_tiers(None) is None


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"recent_bits": 2, "recent_chunks": 1}, "recent_bits=2 is not supported; use 3, 4 or 8"),
        ({"recent_bits": 4, "recent_chunks": 1, "recent_key_bits": 5}, "recent_key_bits=5 is not supported"),
        ({"recent_bits": 0, "recent_chunks": 1, "recent_key_bits": 0}, "recent_bits=0 with recent_chunks=1: set both"),
        ({"recent_bits": 4}, "recent_bits=4 with recent_chunks=0: set both"),
        ({"recent_chunks": 2}, "recent_bits=0 with recent_chunks=2: set both"),
        ({"sink_bits": 2}, "sink_bits=2 is not supported"),
        ({"recent_bits": 4, "recent_chunks": -1}, "recent_chunks=-1 must be a whole number"),
        ({}, "no tier on"),
    ],
)
def test_bad_tiers_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        AgeTiers(**kwargs)


@pytest.mark.parametrize(
    "text", ["recent@4", "recent2@2", "sink8", "recent2@4+recent1@8", "sink@8+sink@4", "recent1@4v3", "recent1@4k2"]
)
def test_unreadable_strings_are_refused(text):
    with pytest.raises(ValueError, match="tiers="):
        parse_tiers(text)


# ----------------------------------------------------------------------------- the cache
def test_the_cache_stores_each_chunk_at_its_tier_and_demotes_by_requantizing():
    tiers = AgeTiers(recent_bits=4, recent_chunks=2, sink_bits=8)
    cache = ChunkCache(SPEC, SPEC, window_chunks=3, sink_chunks=1, tiers=tiers)
    chunks = _chunks(6)
    history = []
    snapshot = None
    for i, (k, v) in enumerate(chunks):
        cache.append(k, v)
        history.append([e.k.spec.bits for e in cache.entries])
        if i == 2:
            snapshot = cache.copy()
            high = cache.entries[1].k  # chunk 1, at 4 bits: demoted by the next append
    assert history == [[8], [8, 4], [8, 4, 4], [8, 2, 4, 4], [8, 2, 4, 4], [8, 2, 4, 4]]
    assert all(e.k.spec.bits == e.v.spec.bits for e in cache.entries)
    assert cache.chunks_demoted == 3  # chunks 1, 2, 3 left the recent tier
    # chunk 1 at 2 bits is its 4-bit form requantized, bit for bit (in the rotated space of the codes)
    snapshot_after = snapshot.copy()
    snapshot_after.append(*chunks[3])
    demoted = snapshot_after.entries[1].k
    expect = requantize(high, SPEC)
    assert demoted.spec == SPEC and torch.equal(demoted.packed, expect.packed)
    assert torch.equal(demoted.scale, expect.scale) and torch.equal(demoted.minimum, expect.minimum)
    assert not torch.equal(demoted.packed, quantize(chunks[1][0], SPEC).packed)  # not the original's codes
    assert snapshot.entries[1].k.spec.bits == 4  # a copy taken before keeps its chunk as it was
    # the bytes are each chunk's own
    widths = {b: quantize(chunks[0][0], QuantSpec(bits=b, group_size=16)).nbytes for b in (2, 4, 8)}
    assert cache.nbytes == 2 * (widths[8] + widths[2] + 2 * widths[4])


def test_a_values_only_tier_keeps_the_newest_values_high_and_every_key_at_the_spec():
    tiers = AgeTiers(recent_bits=4, recent_chunks=1, recent_key_bits=0)
    cache = ChunkCache(SPEC, SPEC, window_chunks=3, tiers=tiers)
    history = []
    for k, v in _chunks(5):
        cache.append(k, v)
        history.append(([e.k.spec.bits for e in cache.entries], [e.v.spec.bits for e in cache.entries]))
    assert history[-1] == ([2, 2, 2], [2, 2, 4])
    assert all(keys == [2] * len(keys) for keys, _ in history)
    assert cache.chunks_demoted == 4  # each chunk's values, once, as the next chunk arrives
    # its bytes: the newest chunk's values at INT4, everything else at INT2
    (k, v) = _chunks(1)[0]
    w2, w4 = (quantize(v, QuantSpec(bits=b, group_size=16)).nbytes for b in (2, 4))
    assert cache.nbytes == 5 * w2 + w4
    p = cache.prepare(k, v)
    assert (p.entry.k.spec.bits, p.entry.v.spec.bits) == (2, 4)


def test_a_tier_with_its_keys_apart_reloads_and_refuses_bits_its_side_cannot_hold(tmp_path):
    tiers = AgeTiers(4, 1, recent_key_bits=3)
    a = ChunkCache(SPEC, SPEC, window_chunks=3, tiers=tiers)
    for k, v in _chunks(4):
        a.append(k, v)
    sd = a.state_dict()
    meta = read_meta(sd["__jensen_kv_meta__"])
    assert meta.tiers == tiers and [c["k"]["bits"] for c in meta.chunks] == [2, 2, 3]
    assert [c["v"]["bits"] for c in meta.chunks] == [2, 2, 4]
    path = str(tmp_path / "c.safetensors")
    a.save(path)
    b = ChunkCache(SPEC, SPEC, window_chunks=3, tiers=tiers)
    b.load(path)
    assert [(e.k.spec.bits, e.v.spec.bits) for e in b.entries] == [(2, 2), (2, 2), (3, 4)]
    q = _chunks(1)[0][0][:, :, :5]
    assert torch.equal(a.attend(q, q, q), b.attend(q, q, q))
    # a key part that claims the values' bits is not what these tiers hold on the key side
    import json

    raw = json.loads(bytes(sd["__jensen_kv_meta__"].tolist()))
    raw["chunks"][2]["k"]["bits"] = 4
    bad = dict(sd, __jensen_kv_meta__=torch.frombuffer(bytearray(json.dumps(raw).encode()), dtype=torch.uint8))
    with pytest.raises(
        ValueError, match=r"chunk2.k bits=4: a side at INT2 under age tiers 'recent1@4k3' holds chunks of 2 or 3"
    ):
        ChunkCache(SPEC, SPEC, window_chunks=3, tiers=tiers).load_state_dict(bad)


def test_without_tiers_every_chunk_keeps_the_spec():
    cache = ChunkCache(SPEC, None, window_chunks=2, sink_chunks=1)
    for k, v in _chunks(4):
        cache.append(k, v)
    assert [e.k.spec.bits for e in cache.entries] == [2, 2, 2] and cache.chunks_demoted == 0


def test_a_prepared_chunk_is_held_at_the_newest_chunks_bits():
    cache = ChunkCache(SPEC, None, tiers=AgeTiers(recent_bits=8, recent_chunks=1))
    (k, v), (k2, v2) = _chunks(2)
    p = cache.prepare(k, v)
    assert p.entry.k.spec.bits == 8 and not isinstance(p.entry.v, type(p.entry.k))
    cache.append_prepared(p)
    cache.append(k2, v2)
    assert [e.k.spec.bits for e in cache.entries] == [2, 8]


# ----------------------------------------------------------------------------- attention: each chunk's own steps
def _reference64(cache, q, kc, vc, strength, mode):
    """softmax(q k^T / sqrt(d) - lambda b) v in float64, b built chunk by chunk from that chunk's own step sizes."""
    D = q.shape[-1]
    seed = SPEC.seed
    q64 = rotate(q.double(), seed)
    g = SPEC.group_size
    nu = q64.reshape(*q64.shape[:-1], D // g, g).square().sum(-1)  # (B, H, M, G)
    scores, values = [], []
    for e in cache.entries:
        k_hat = e.k.dequantize(dtype=torch.float64, rotated=True)
        w = e.k.step_sizes().double().square() / (24.0 * D)  # this chunk's own steps
        if mode == "chunk_mean":
            w = w.mean(-2, keepdim=True)
        b = nu @ w.transpose(-1, -2)
        scores.append(q64 @ k_hat.transpose(-1, -2) / math.sqrt(D) - strength * b)
        values.append(e.v.dequantize(torch.float64))
    scores.append(q.double() @ kc.double().transpose(-1, -2) / math.sqrt(D))
    values.append(vc.double())
    return torch.softmax(torch.cat(scores, -1), -1) @ torch.cat(values, -2)


@pytest.mark.parametrize("concat", [False, True], ids=["streamed", "one-buffer"])
@pytest.mark.parametrize("mode", ["taylor", "chunk_mean"])
def test_each_chunk_is_corrected_with_its_own_step_sizes(monkeypatch, concat, mode):
    """A cache of a 4-bit recent chunk and 2-bit older ones: the correction of each chunk uses its own steps."""
    monkeypatch.setattr(attention, "_FORCE_CONCAT", concat)
    cache = ChunkCache(SPEC, SPEC, tiers=AgeTiers(recent_bits=4, recent_chunks=1))
    for k, v in _chunks(3, T=16, seed=5):
        cache.append(k, v)
    assert [e.k.spec.bits for e in cache.entries] == [2, 2, 4]
    steps = [float(e.k.step_sizes().mean()) for e in cache.entries]
    assert steps[2] < steps[0] / 3  # the 4-bit chunk's steps are much finer
    gen = torch.Generator().manual_seed(9)
    q = torch.randn(1, 2, 10, 64, generator=gen) * 3
    kc, vc = torch.randn(1, 2, 8, 64, generator=gen), torch.randn(1, 2, 8, 64, generator=gen)
    out = cache.attend(q, kc, vc, correction=mode, strength=1.5)
    ref = _reference64(cache, q, kc, vc, 1.5, mode)
    torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=2e-5)
    # the correction matters here: without it (or with the 2-bit steps for every chunk) the output is elsewhere
    assert (cache.attend(q, kc, vc, correction="off").double() - ref).abs().max() > 1e-3
    wrong = _reference64_uniform_steps(cache, q, kc, vc, 1.5, mode)
    assert (out.double() - wrong).abs().max() > 1e-4


def _reference64_uniform_steps(cache, q, kc, vc, strength, mode):
    """The reference with the oldest chunk's steps used for every chunk (what per-chunk correction must not do)."""

    class _Steps:
        def __init__(self, t, steps):
            self._t, self._s = t, steps

        def dequantize(self, *a, **kw):
            return self._t.dequantize(*a, **kw)

        def step_sizes(self):
            return self._s

    first = cache.entries[0].k.step_sizes()

    class _Cache:
        entries = [type("E", (), {"k": _Steps(e.k, first), "v": e.v})() for e in cache.entries]

    return _reference64(_Cache, q, kc, vc, strength, mode)


def test_the_exact_mode_reads_each_chunks_own_steps_too():
    """The exact bias (Eq. 12) of a tiered cache: each chunk's bias from that chunk alone (jensen_bias per chunk)."""
    cache = ChunkCache(SPEC, SPEC, tiers=AgeTiers(recent_bits=8, recent_chunks=1, sink_bits=4), sink_chunks=1)
    for k, v in _chunks(3, T=8, seed=2):
        cache.append(k, v)
    assert [e.k.spec.bits for e in cache.entries] == [4, 2, 8]
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(1, 2, 6, 64, generator=gen) * 3
    kc, vc = torch.randn(1, 2, 4, 64, generator=gen), torch.randn(1, 2, 4, 64, generator=gen)
    D = 64
    scores = [
        q.double() @ e.k.dequantize(torch.float64).transpose(-1, -2) / math.sqrt(D)
        - jensen_bias(q, e.k, "exact").double()
        for e in cache.entries
    ]
    scores.append(q.double() @ kc.double().transpose(-1, -2) / math.sqrt(D))
    values = torch.cat([e.v.dequantize(torch.float64) for e in cache.entries] + [vc.double()], -2)
    ref = torch.softmax(torch.cat(scores, -1), -1) @ values
    out = cache.attend(q, kc, vc, correction="exact")
    torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=2e-5)
    assert (cache.attend(q, kc, vc, correction="off").double() - ref).abs().max() > 1e-3


def test_chunks_differing_in_more_than_bits_are_still_refused():
    other = QuantSpec(bits=4, group_size=32, rotation="hadamard", seed=3)
    (k, v), (k2, v2) = _chunks(2)
    from jensen_core import CacheEntry, cached_attention

    entries = [CacheEntry(quantize(k, SPEC), quantize(v, SPEC)), CacheEntry(quantize(k2, other), quantize(v2, other))]
    with pytest.raises(ValueError, match="same quantization spec"):
        cached_attention(k[:, :, :3], k[:, :, :3], v[:, :, :3], entries)


# ----------------------------------------------------------------------------- files
def test_a_tiered_cache_file_reloads_bit_exactly_and_continues(tmp_path):
    tiers = AgeTiers(recent_bits=4, recent_chunks=2, sink_bits=8)
    chunks = _chunks(7, dtype=torch.bfloat16)
    a = ChunkCache(SPEC, SPEC, window_chunks=3, sink_chunks=1, tiers=tiers)
    for k, v in chunks[:5]:
        a.append(k, v)
    path = str(tmp_path / "c.safetensors")
    a.save(path)
    meta = read_meta(a.state_dict()["__jensen_kv_meta__"])
    assert meta.version == 4 and meta.tiers == tiers
    assert [c["k"]["bits"] for c in meta.chunks] == [8, 2, 4, 4]
    b = ChunkCache(SPEC, SPEC, window_chunks=3, sink_chunks=1, tiers=tiers)
    b.load(path)
    assert b.nbytes == a.nbytes and [e.k.spec for e in b.entries] == [e.k.spec for e in a.entries]
    for ea, eb in zip(a.entries, b.entries):
        assert torch.equal(ea.k.packed, eb.k.packed) and torch.equal(ea.v.scale, eb.v.scale)
    for k, v in chunks[5:]:  # both continue the same way: the loaded chunks demote as the originals do
        a.append(k, v)
        b.append(k, v)
    q = chunks[0][0][:, :, :5]
    assert torch.equal(a.attend(q, q, q), b.attend(q, q, q))
    for ea, eb in zip(a.entries, b.entries):
        assert ea.k.spec == eb.k.spec and torch.equal(ea.k.packed, eb.k.packed)


def test_a_file_with_other_tiers_or_bad_bits_is_refused(tmp_path):
    tiers = AgeTiers(recent_bits=4, recent_chunks=1)
    a = ChunkCache(SPEC, None, tiers=tiers)
    for k, v in _chunks(2):
        a.append(k, v)
    sd = a.state_dict()
    with pytest.raises(ValueError, match=r"age tiers 'recent1@4' but this cache uses off"):
        ChunkCache(SPEC, None).load_state_dict(sd)
    with pytest.raises(ValueError, match=r"age tiers 'recent1@4' but this cache uses 'recent1@8'"):
        ChunkCache(SPEC, None, tiers=AgeTiers(recent_bits=8, recent_chunks=1)).load_state_dict(sd)
    import json

    meta = json.loads(bytes(sd["__jensen_kv_meta__"].tolist()))
    meta["chunks"][1]["k"]["bits"] = 8
    bad = dict(sd, __jensen_kv_meta__=torch.frombuffer(bytearray(json.dumps(meta).encode()), dtype=torch.uint8))
    with pytest.raises(ValueError, match=r"chunk1.k bits=8: a side at INT2 under age tiers 'recent1@4' holds chunks"):
        ChunkCache(SPEC, None, tiers=tiers).load_state_dict(bad)
    meta["chunks"][1]["k"]["bits"] = 2  # bits its side may hold, not at its position (the newest: 4)
    bad = dict(sd, __jensen_kv_meta__=torch.frombuffer(bytearray(json.dumps(meta).encode()), dtype=torch.uint8))
    with pytest.raises(ValueError, match=r"chunk1.k bits=2: under age tiers 'recent1@4' .* kept at 4 bits"):
        ChunkCache(SPEC, None, tiers=tiers).load_state_dict(bad)
    # a cache without tiers still writes version 3 (older packs read it)
    plain = ChunkCache(SPEC, None)
    plain.append(*_chunks(1)[0])
    assert read_meta(plain.state_dict()["__jensen_kv_meta__"]).version == 3


def test_the_planner_names_tiers_that_change_nothing_or_requantize_badly():
    from jensen_core.planner import LatentGeometry

    def plan(spec_k, tiers, **kw):
        args = dict(latent_frames=12, latent_height=2, latent_width=2, chunk_frames=1, window_chunks=3, layers=1)
        return plan_by_fields(
            **args, heads=1, head_dim=64, spec_k=spec_k, spec_v=None, geometry=GEOMETRY, tiers=tiers, **kw
        )

    GEOMETRY = LatentGeometry(patch=(1, 2, 2), latent_channels=16)
    int3, int8 = QuantSpec(bits=3, group_size=16), QuantSpec(bits=8, group_size=16)
    assert any("does not nest" in w for w in plan(int3, AgeTiers(4, 1)).warnings)
    assert not any("does not nest" in w for w in plan(int3, AgeTiers(8, 1)).warnings)
    assert any("change nothing" in w for w in plan(int8, AgeTiers(4, 1)).warnings)
    assert any("no effect without a sink" in w for w in plan(SPEC, AgeTiers(sink_bits=8)).warnings)
    assert any("keep all 3 chunks" in w for w in plan(SPEC, AgeTiers(4, 3)).warnings)
    assert any("keep all 4 chunks" in w for w in plan(SPEC, AgeTiers(4, 3, 8), sink_chunks=1).warnings)
    assert not any("keep all" in w for w in plan(SPEC, AgeTiers(4, 3), sink_chunks=1).warnings)  # the sink at INT2
    assert plan(SPEC, AgeTiers(4, 1), sink_chunks=1).warnings == ()
    # per side: a 3-bit tier over INT2 does not nest either; keys set apart are checked as keys
    assert any("keys at INT2 with a 3-bit recent tier" in w for w in plan(SPEC, AgeTiers(3, 1)).warnings)
    assert any("keys at INT3 with a 4-bit" in w for w in plan(int3, AgeTiers(8, 1, recent_key_bits=4)).warnings)
    assert not any("does not nest" in w for w in plan(int3, AgeTiers(4, 1, recent_key_bits=8)).warnings)
    # a values-only tier over a cache whose values are not quantized changes nothing
    assert any("change nothing" in w for w in plan(SPEC, AgeTiers(4, 1, recent_key_bits=0)).warnings)
    assert not any("change nothing" in w for w in plan(SPEC, AgeTiers(4, 1, recent_key_bits=8)).warnings)


def test_diagnostics_read_a_tiered_cache_as_its_chunks_joined():
    """KV Cache Diagnostics concatenate the cached chunks: chunks of different bits join as a TieredTensor whose
    steps and values are each chunk's, and the diagnostics' corrected attention equals the cache's own."""
    import torch.nn.functional as F

    from jensen_core.attention_shift import attention_shift
    from jensen_core.quant import cat_quantized
    from jensen_core.tiers import TieredTensor

    cache = ChunkCache(SPEC, SPEC, tiers=AgeTiers(recent_bits=4, recent_chunks=1))
    chunks = _chunks(3, T=8, seed=4)
    for k, v in chunks:
        cache.append(k, v)
    kt = cat_quantized([e.k for e in cache.entries])
    vt = cat_quantized([e.v for e in cache.entries])
    assert isinstance(kt, TieredTensor) and kt.tokens == 24 and kt.nbytes == sum(e.k.nbytes for e in cache.entries)
    torch.testing.assert_close(kt.step_sizes(), torch.cat([e.k.step_sizes() for e in cache.entries], -2))
    torch.testing.assert_close(kt[:, 1].dequantize(), torch.cat([e.k[:, 1].dequantize() for e in cache.entries], -2))
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(1, 2, 6, 64, generator=gen) * 3
    kc, vc = torch.randn(1, 2, 4, 64, generator=gen), torch.randn(1, 2, 4, 64, generator=gen)
    k_ref = torch.cat([k for k, _ in chunks], -2)
    v_ref = torch.cat([v for _, v in chunks], -2)
    stats = attention_shift(q, k_ref, v_ref, kc, vc, kt, vt, correction="taylor", chunk_tokens=[8, 8, 8])
    ref = F.scaled_dot_product_attention(q, torch.cat([k_ref, kc], -2), torch.cat([v_ref, vc], -2))
    mse = float((cache.attend(q, kc, vc, correction="taylor") - ref).square().mean())
    assert stats.output_mse == pytest.approx(mse, rel=1e-4)
