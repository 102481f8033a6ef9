"""Run-state files from strangers (hostile metadata, half-true state, refusals), without ComfyUI.

The SHA-256 of a cache file has no key: anyone can edit a file and record the new digest. So every
crafted file here is *re-signed* (its digest recomputed) and must still be refused, by the
structure checks, with one ValueError naming the field and what was expected, and before any
tensor work where the metadata alone is wrong. Each file is built in the test from a real state of
a tiny model-free run (``support/saved_run_files.py``).
"""

from __future__ import annotations

import json
import os
import re
import time
import tracemalloc

import pytest
import torch
from safetensors.torch import save_file
from support.saved_run_files import (
    HEADS,
    INT2,
    INT4,
    LAYERS,
    META,
    AgeTiers,
    ChunkCache,
    QuantSpec,
    cache_meta,
    cache_mod,
    craft,
    make_state,
    read_file,
    resign,
    rs,
    set_cache_meta,
)

RAW_ERRORS = (
    "AttributeError",
    "IndexError",
    "RecursionError",
    "KeyError",
    "TypeError",
    "OverflowError",
    "dictionary update sequence",
    "not enough values to unpack",
    "object is not",
    "Traceback",
)


def refused(path, match, **kw) -> str:
    """The ValueError a load raises; it must name ``match`` and carry none of Python's raw error texts."""
    with pytest.raises(ValueError) as info:
        rs.load_saved_run(str(path), **kw)
    message = str(info.value)
    assert type(info.value) is ValueError, type(info.value)
    assert os.path.basename(str(path)) in message
    assert not any(raw in message for raw in RAW_ERRORS), message
    assert re.search(match, message), message
    return message


class Counting:
    """Counts the loader's tensor reads and cache records decoded (monkeypatched in)."""

    def __init__(self, monkeypatch):
        self.reads = self.records = 0
        read, read_meta = rs._CacheFile.read, rs.read_meta

        def counted_read(f, t):
            self.reads += 1
            return read(f, t)

        def counted_meta(t):
            self.records += 1
            return read_meta(t)

        monkeypatch.setattr(rs._CacheFile, "read", counted_read)
        monkeypatch.setattr(rs, "read_meta", counted_meta)


# ------------------------------------------------------------------------------------------------ what still loads
@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"window": 0, "sink": 0, "chunks": 3},
        {"window": 2, "sink": 0, "chunks": 5, "branches": (0,)},
        {"window": 1, "sink": 2, "chunks": 5, "spec_k": INT4, "spec_v": None},
        {"window": 1, "sink": 3, "chunks": 2},  # the sink not full yet
        {"chunks": 5, "frames_of": lambda c: 1 if c in (1, 3) else 2},  # short chunks (a run ended mid-chunk, a prefix)
        {"spec_k": QuantSpec(method="qvg", bits=2, group_size=16, qvg_centroids=4), "spec_v": None},
        # precision by age: the sink at 8 bits, the newest chunk at 4, the rest at 2 (each chunk records its bits)
        {"window": 2, "sink": 1, "chunks": 5, "tiers": AgeTiers(recent_bits=4, recent_chunks=1, sink_bits=8)},
        {"window": 0, "sink": 0, "chunks": 4, "spec_v": None, "tiers": AgeTiers(recent_bits=8, recent_chunks=2)},
    ],
)
def test_a_saved_state_loads_back_bit_for_bit(tmp_path, kw):
    state = make_state(**kw)
    path = str(tmp_path / "s.safetensors")
    state.save(path)
    back = rs.load_saved_run(path)
    assert (back.next_chunk, back.next_frame, back.branches) == (state.next_chunk, state.next_frame, state.branches)
    assert [(r.chunk, r.frame_offset) for r in back.retained] == [(r.chunk, r.frame_offset) for r in state.retained]
    assert all(torch.equal(a.latent, b.latent) for a, b in zip(back.retained, state.retained))
    assert back.caches.keys() == state.caches.keys()
    for key, cache in state.caches.items():
        assert back.caches[key].state_dict().keys() == cache.state_dict().keys()
        assert all(
            torch.equal(a.view(torch.uint8), b.view(torch.uint8))
            for a, b in zip(back.caches[key].state_dict().values(), cache.state_dict().values())
        )
    assert back.nbytes == state.nbytes and back.info == state.info and back.tiers == state.tiers
    for key, cache in state.caches.items():  # every chunk at its own bits, and continuing demotes the same way
        assert [e.k.spec for e in back.caches[key].entries] == [e.k.spec for e in cache.entries]
        k = torch.randn(1, 2, 8, 32, generator=torch.Generator().manual_seed(7))
        a, b = cache.copy(), back.caches[key]
        a.append(k, k)
        b.append(k, k)
        assert [e.k.spec.bits for e in a.entries] == [e.k.spec.bits for e in b.entries]
        sa, sb = a.state_dict(), b.state_dict()
        assert sa.keys() == sb.keys()
        assert all(torch.equal(sa[n].view(torch.uint8), sb[n].view(torch.uint8)) for n in sa)


def test_the_digest_is_unchanged_so_files_saved_before_still_load(tmp_path):
    """The SHA-256 is computed as it always was (state JSON, then per tensor: name, (shape, dtype), bytes)."""
    import hashlib

    state = make_state(chunks=2)
    path = str(tmp_path / "s.safetensors")
    state.save(path)
    meta, tensors = read_file(path)
    h = hashlib.sha256(meta["state"].encode())
    for name in sorted(tensors):
        t = tensors[name]
        h.update(name.encode())
        h.update(str((tuple(t.shape), str(t.dtype))).encode())
        h.update(t.contiguous().view(torch.uint8).numpy().tobytes())
    assert meta["sha256"] == h.hexdigest() == rs._digest(tensors, meta["state"])


@pytest.mark.parametrize(
    "kw",
    [
        {"window": 1, "sink": 1, "chunks": 4},
        {"spec_k": QuantSpec(method="qvg", bits=2, group_size=16, qvg_centroids=4), "spec_v": INT4, "chunks": 3},
    ],
)
def test_a_file_written_before_the_minima_were_renamed_loads_bit_for_bit(tmp_path, kw):
    """Cache records of version 2 stored each part's grid origins as ``.zero`` (version 3: ``.minimum``).

    The old layout is built here from a new file: names and record versions put back, re-signed as it was."""
    state = make_state(**kw)
    new_path = str(tmp_path / "new.safetensors")
    state.save(new_path)
    meta, tensors = read_file(new_path)
    assert any(k.endswith(".minimum") for k in tensors) and not any(k.endswith(".zero") for k in tensors)
    old = {k.removesuffix(".minimum") + ".zero" if k.endswith(".minimum") else k: t for k, t in tensors.items()}
    for layer, branch in state.caches:
        record = cache_meta(old, layer, branch)
        assert record["version"] == 3
        set_cache_meta(old, {**record, "version": 2}, layer, branch)
    back = rs.load_saved_run(resign(tmp_path / "old.safetensors", meta, old))
    assert back.caches.keys() == state.caches.keys()
    for key, cache in state.caches.items():
        mine, theirs = back.caches[key].state_dict(), cache.state_dict()
        assert mine.keys() == theirs.keys()
        assert all(torch.equal(mine[k].view(torch.uint8), theirs[k].view(torch.uint8)) for k in theirs), key
    assert all(torch.equal(a.latent, b.latent) for a, b in zip(back.retained, state.retained))
    # the old name under a version 3 record is refused (each version reads its own names)
    for layer, branch in state.caches:
        set_cache_meta(old, {**cache_meta(old, layer, branch), "version": 3}, layer, branch)
    refused(resign(tmp_path / "mixed.safetensors", meta, old), r"holds tensors its record does not describe")


# ------------------------------------------------------------------------------------------------ item 1: repetition
def test_a_hundred_thousand_repeated_caches_are_refused_by_the_structure_check(tmp_path, monkeypatch):
    # every (layer, branch) once, then (0, 0) again and again: 100,000 entries, ~0.6 MB of header
    path = craft(tmp_path, lambda st, t: st.update(caches=st["caches"] + [[0, 0]] * (100_000 - len(st["caches"]))))
    assert os.path.getsize(path) > 600_000
    count = Counting(monkeypatch)
    t0 = time.perf_counter()
    refused(path, r"caches lists 100000 entries; a model of 2 layers with CFG branches \[0, 1\] has 4 caches")
    elapsed = time.perf_counter() - t0
    assert (count.reads, count.records) == (0, 0)  # refused before any tensor or cache record was read
    assert elapsed < 5.0, elapsed  # ~0.1 s; a loop over the entries (re-reading a cache each) took minutes


@pytest.mark.parametrize(
    "caches,match",
    [
        ([[0, 0], [0, 0], [1, 0], [1, 1]], r"\(layer, branch\) \(0, 0\) twice"),
        ([[0, 0], [0, 1], [1, 0], [2, 1]], r"caches\[3\] layer=2 must be a whole number from 0 to 1"),
        ([[0.0, 0], [0, 1], [1, 0], [1, 1]], r"caches\[0\] layer=0.0 must be a whole number"),
        ([[0, 0], [0, 1.0], [1, 0], [1, 1]], r"caches\[1\] branch=1.0 must be one of the branches \[0, 1\]"),
        ([[0, 0], [0, True], [1, 0], [1, 1]], r"caches\[1\] branch=True must be one of the branches"),
        ([[0, 0], [0, 1], [1, 0], [1]], r"caches\[3\]=\[1\] must be a \[layer, branch\] pair"),
        ([[0, 0], [0, 1], [1, 0], 7], r"caches\[3\]=7 must be a \[layer, branch\] pair"),
        ("all", r"caches lists str; a model of 2 layers"),
    ],
)
def test_cache_pairs_are_unique_whole_numbers_one_per_layer_and_branch(tmp_path, monkeypatch, caches, match):
    path = craft(tmp_path, lambda st, t: st.update(caches=caches))
    count = Counting(monkeypatch)
    refused(path, match)
    assert (count.reads, count.records) == (0, 0)


def test_an_interrupt_stops_a_load_between_reads(tmp_path):
    path = str(tmp_path / "s.safetensors")
    make_state().save(path)
    calls = []
    rs.load_saved_run(path, check_interrupt=lambda: calls.append(1))
    assert len(calls) > 10  # per block hashed, per cache, per tensor read

    class Interrupted(Exception):
        pass

    def interrupt_at(n):
        def check():
            calls.append(1)
            if len(calls) >= n:
                raise Interrupted

        return check

    for n in (1, 5, 30):
        calls.clear()
        with pytest.raises(Interrupted):
            rs.load_saved_run(path, check_interrupt=interrupt_at(n))
        assert len(calls) == n  # it stopped at once


# ------------------------------------------------------------------------------------------------ item 2: half-true state
def test_next_frame_must_follow_the_retained_chunks(tmp_path):
    # window 1 + sink 1 at chunk 4: retained chunks 0 and 3; chunk 3 starts at frame 6 and holds 2
    refused(
        craft(tmp_path, lambda st, t: st.update(next_frame=10**6)),
        r"next_frame=1000000 does not follow the retained chunks: the last one \(chunk 3\) starts at frame 6 "
        r"and holds 2, so next_frame is 8",
    )
    refused(craft(tmp_path, lambda st, t: st.update(next_frame=7)), r"next_frame=7 does not follow")


@pytest.mark.parametrize(
    "field,value",
    [
        ("next_chunk", 10**30),
        ("next_frame", 10**30),
        ("chunk_frames", 2**64),
        ("window_chunks", 10**20),
        ("sink_chunks", -1),
        ("latent_shape", [1, 16, 10**25, 4]),
    ],
)
def test_huge_values_are_a_clear_error(tmp_path, field, value):
    path = craft(tmp_path, lambda st, t: st.update({field: value}))
    refused(path, rf"{field}.*must be a whole number from")


def test_huge_values_in_a_cache_record_are_a_clear_error(tmp_path):
    def edit(st, tensors):
        m = cache_meta(tensors)
        m["chunks"][0]["k"]["shape"][2] = 10**30
        m["layout"]["heads"] = 2**70
        set_cache_meta(tensors, m)

    refused(craft(tmp_path, edit), r"cache of layer 0, branch 0: cache file layout heads=\d+ must be a whole number")


@pytest.mark.parametrize("what,dim,value", [("batch", 0, 2), ("heads", 1, 1), ("head_dim", 3, 16)])
def test_chunks_of_another_batch_heads_or_head_dim_are_refused_at_load(tmp_path, what, dim, value):
    """The cache record's layout is left as it was; one chunk's tensors (and its record) have another shape."""

    def edit(st, tensors):
        m = cache_meta(tensors, 1, 0)
        for side in ("k", "v"):
            m["chunks"][1][side]["shape"][dim] = value
            name = f"cache.1.0.chunk1.{side}"
            t = tensors[name]
            tensors[name] = (torch.cat([t, t], dim) if value > t.shape[dim] else t.narrow(dim, 0, value)).contiguous()
        set_cache_meta(tensors, m, 1, 0)

    message = refused(
        craft(tmp_path, edit, make_state(spec_k=None, spec_v=None)),
        r"cache of layer 1, branch 0: .*chunk1 holds \(batch, heads, head_dim, dtype\)",
    )
    assert "not the layout's (1, 2, 32, float32)" in message


def test_a_cache_whose_every_chunk_has_other_heads_than_the_fingerprint_is_refused(tmp_path):
    state = make_state(heads_of=lambda layer, b, c: 1 if (layer, b) == (1, 1) else HEADS)
    path = str(tmp_path / "heads.safetensors")
    state.save(path)  # signed by save itself
    refused(path, r"cache of layer 1, branch 1 holds \(batch, heads, head_dim\) = \(1, 1, 32\), not \(1, 2, 32\)")


def test_a_window_1_cache_holding_6_chunks_is_refused(tmp_path):
    """The state says window 1 + sink 1 and lists the 2 chunks that keeps; a cache holds all 6 chunks."""

    def edit(st, tensors):
        st["window_chunks"] = 1
        st["retained"] = [st["retained"][0], st["retained"][-1]]
        for c in range(1, 5):
            del tensors[f"latent.{c}"]
        for layer in range(LAYERS):
            for b in (0, 1):
                m = cache_meta(tensors, layer, b)
                m["window_chunks"] = 1
                set_cache_meta(tensors, m, layer, b)

    refused(
        craft(tmp_path, edit, make_state(window=0, sink=1, chunks=6)),
        r"cache of layer 0, branch 0: cache file metadata lists 6 chunks, but a cache with window_chunks=1 and "
        r"sink_chunks=1 holds at most 2",
    )


def test_a_cache_holding_other_chunks_than_the_state_retains_is_refused(tmp_path, monkeypatch):
    # each cache keeps its own 2 chunks (window 1, sink 1), but the state says window 2: it retains 3
    def edit(st, tensors):
        st["window_chunks"] = 2
        st["retained"] = [st["retained"][0], {**st["retained"][1], "chunk": 2, "frame_offset": 4}, st["retained"][1]]
        tensors["latent.2"] = tensors["latent.3"].clone()

    refused(
        craft(tmp_path, edit),
        r"cache of layer 0, branch 0 keeps window_chunks=1, sink_chunks=1, but the state "
        r"says 2, 1",
    )

    # the cache records agree with the state but hold one chunk fewer than it retains
    def edit_records(st, tensors):
        edit(st, tensors)
        for layer in range(LAYERS):
            for b in (0, 1):
                m = cache_meta(tensors, layer, b)
                m["window_chunks"] = 2
                set_cache_meta(tensors, m, layer, b)

    refused(
        craft(tmp_path, edit_records, name="b.safetensors"),
        r"cache of layer 0, branch 0 holds 2 chunks, but the state retains 3",
    )


@pytest.mark.parametrize(
    "retained,match",
    [
        (
            [1, 3],
            r"retained\[0\] is chunk 1, but at chunk 4 with window_chunks=1 and sink_chunks=1 the retained chunks "
            r"are \[0, 3\]",
        ),  # the sink evicted instead of the window
        ([0, 2], r"retained\[1\] is chunk 2"),
        ([0], r"retained lists 1 chunks; a state at chunk 4 with window_chunks=1 and sink_chunks=1 retains 2"),
        ([0, 3, 3], r"retained lists 3 chunks"),
    ],
)
def test_retained_chunks_are_exactly_those_the_window_and_sink_keep(tmp_path, retained, match):
    def edit(st, tensors):
        by_chunk = {r["chunk"]: r for r in st["retained"]}
        st["retained"] = [{**by_chunk.get(c, by_chunk[3]), "chunk": c, "frame_offset": 2 * c} for c in retained]
        for c in set(retained) - set(by_chunk):
            tensors[f"latent.{c}"] = tensors["latent.3"].clone()

    refused(craft(tmp_path, edit), match)


@pytest.mark.parametrize(
    "index,offset,match",
    [
        # chunk 0 ends at frame 2; chunks 1 and 2 (evicted) hold 1 or 2 frames each: chunk 3 starts at frame 4 to 6
        (
            1,
            3,
            r"retained\[1\] \(chunk 3\) frame_offset=3 must be from 4 to 6: each chunk holds 1 to chunk_frames=2 "
            r"frames and chunk 0 ends at frame 2",
        ),
        (1, 7, r"retained\[1\] \(chunk 3\) frame_offset=7 must be from 4 to 6"),
        (0, 1, r"retained\[0\] \(chunk 0\) frame_offset=1 must be from 0 to 0"),
    ],
)
def test_frame_offsets_must_fit_chunks_of_one_to_chunk_frames_frames(tmp_path, index, offset, match):
    def edit(st, tensors):
        st["retained"][index]["frame_offset"] = offset
        st["next_frame"] = st["retained"][-1]["frame_offset"] + 2

    refused(craft(tmp_path, edit), match)


def test_a_first_retained_chunk_starts_after_the_frames_of_the_chunks_evicted_before_it(tmp_path):
    # window 1, no sink, at chunk 4: only chunk 3 is retained; chunks 0 to 2 held 1 or 2 frames each
    def edit(st, tensors):
        st["retained"][0]["frame_offset"] = 2
        st["next_frame"] = 4

    refused(
        craft(tmp_path, edit, make_state(window=1, sink=0)),
        r"retained\[0\] \(chunk 3\) frame_offset=2 must be from 3 to 6: each chunk holds 1 to chunk_frames=2 frames$",
    )


@pytest.mark.parametrize(
    "edit,match",
    [
        (
            lambda st, t: st.update(branches=[0]),
            r"caches lists 4 entries; a model of 2 layers with CFG branches \[0\] "
            r"has 2 caches",
        ),
        (lambda st, t: st.update(branches=[0, 1, 1]), r"branches=\[0, 1, 1\] must be \[0\] \(cfg 1\) or \[0, 1\]"),
        (lambda st, t: st.update(branches=[0.0, 1]), r"branches=\[0.0, 1\] must be"),
        (lambda st, t: st.update(branches=[1, 0]), r"branches=\[1, 0\] must be"),
    ],
)
def test_the_branches_list_must_match_the_caches(tmp_path, edit, match):
    refused(craft(tmp_path, edit), match)


def test_branches_that_list_more_caches_than_the_file_holds_are_refused(tmp_path):
    def edit(st, tensors):
        st["branches"] = [0, 1]
        st["caches"] = [[layer, b] for layer in range(LAYERS) for b in (0, 1)]

    refused(
        craft(tmp_path, edit, make_state(branches=(0,))),
        r"the cache of layer 0, branch 1 has no __jensen_kv_meta__ record",
    )


@pytest.mark.parametrize(
    "edit,match",
    [
        (
            lambda st, t: (
                st["retained"][0].update(dtype="int64"),
                t.update({"latent.0": t["latent.0"].to(torch.int64)}),
            ),
            r"retained\[0\] dtype='int64' must be one of float32, float16, bfloat16, float64",
        ),
        (
            lambda st, t: (
                st["retained"][1]["shape"].__setitem__(2, 500),
                t.update({"latent.3": t["latent.3"][:, :, :1].repeat(1, 1, 500, 1, 1)}),
            ),
            r"retained\[1\] shape=\[1, 16, 500, 4, 4\] is not a latent of 1 to chunk_frames=2 frames",
        ),
        (
            lambda st, t: st["retained"][1]["shape"].__setitem__(2, 3),  # one frame past chunk_frames
            r"retained\[1\] shape=\[1, 16, 3, 4, 4\] is not a latent of 1 to chunk_frames=2 frames",
        ),
        (
            lambda st, t: (
                st["retained"][1].update(shape=[1, 16, 2, 8, 4]),
                t.update({"latent.3": t["latent.3"].repeat(1, 1, 1, 2, 1)}),
            ),
            r"retained\[1\] shape=\[1, 16, 2, 8, 4\] is not a latent of .* \(batch, channels, height, width\) \(1, 16, 4, 4\)",
        ),
        (
            lambda st, t: (
                st["retained"][1].update(shape=[1, 16, 2, 4, 8]),
                t.update({"latent.3": t["latent.3"].repeat(1, 1, 1, 1, 2)}),
            ),
            r"retained\[1\] shape=\[1, 16, 2, 4, 8\] is not a latent",
        ),
        (
            lambda st, t: t.update({"latent.3": t["latent.3"].repeat(1, 1, 1, 1, 2)}),
            r"tensor latent.3 is missing or does not match its recorded shape \[1, 16, 2, 4, 4\]",
        ),
        (lambda st, t: t.update({"latent.9": t["latent.3"].clone()}), r"tensor 'latent.9' is not one the state record"),
        (
            lambda st, t: t.update({"cache.0.0.chunk7.k.packed": t["cache.0.0.chunk0.k.packed"].clone()}),
            r"cache of layer 0, branch 0 holds tensors its record does not describe \(\['chunk7.k.packed'\]\)",
        ),
        (
            lambda st, t: t.update({"cache.00.0.x": torch.zeros(1)}),
            r"tensor 'cache.00.0.x' belongs to no \(layer, branch\)",
        ),
    ],
)
def test_retained_latents_and_tensors_must_match_the_record(tmp_path, edit, match):
    refused(craft(tmp_path, edit), match)


def test_chunks_whose_tokens_do_not_match_their_frames_are_refused(tmp_path):
    """A cache whose chunk 3 holds 1 frame's tokens while the state's latent of chunk 3 has 2 frames."""
    state = make_state()
    odd = make_state(frames_of=lambda c: 1 if c == 3 else 2, seed=1)
    state.caches[(1, 1)] = odd.caches[(1, 1)]
    path = str(tmp_path / "tokens.safetensors")
    state.save(path)
    refused(path, r"cache of layer 1, branch 1 holds 4 tokens in chunk 3, whose latent has 2 frames; expected 8")


def test_a_zero_size_tensor_of_absurd_shape_is_a_clear_error(tmp_path):
    """No bytes, but dimensions whose product overflows torch's strides: refused from the header."""
    import hashlib

    src = tmp_path / "s.safetensors"
    make_state().save(str(src))
    meta, tensors = read_file(src)
    entries = {
        k: (str(t.dtype).removeprefix("torch."), list(t.shape), t.contiguous().view(torch.uint8).numpy().tobytes())
        for k, t in tensors.items()
    }
    entries["cache.0.0.chunk0.k.packed"] = ("uint8", [0] + [2**31 - 1] * 3, b"")
    names = {"uint8": "U8", "float32": "F32", "float8_e4m3fn": "F8_E4M3", "bfloat16": "BF16"}
    h = hashlib.sha256(meta["state"].encode())
    header, data = {"__metadata__": meta}, b""
    for name in sorted(entries):
        dtype, shape, raw = entries[name]
        h.update(name.encode() + str((tuple(shape), f"torch.{dtype}")).encode() + raw)
        header[name] = {"dtype": names[dtype], "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    meta["sha256"] = h.hexdigest()
    head = json.dumps(header).encode()
    path = tmp_path / "absurd.safetensors"
    path.write_bytes(len(head).to_bytes(8, "little") + head + data)
    refused(
        path,
        r"tensor 'cache.0.0.chunk0.k.packed' has shape \[0, 2147483647, 2147483647, 2147483647\], larger "
        r"than any tensor can be",
    )


# ------------------------------------------------------------------------------------------------ item 5: clear errors
def _meta_edit(fn):
    def edit(st, tensors):
        m = cache_meta(tensors)
        fn(m)
        set_cache_meta(tensors, m)

    return edit


@pytest.mark.parametrize(
    "edit,match",
    [
        # the state record
        (lambda st, t: st.update(info=[["a"]]), r"info must be a JSON object, got list"),
        (lambda st, t: st.update(info="abc"), r"info must be a JSON object, got str"),
        (lambda st, t: st.update(retained=[5, 6]), r"retained\[0\] must be a JSON object"),
        (lambda st, t: st.update(retained=[[0], [3]]), r"retained\[0\] must be a JSON object"),
        (
            lambda st, t: st.update(caches=[[0], [0, 1], [1, 0], [1, 1]]),
            r"caches\[0\]=\[0\] must be a \[layer, branch\]",
        ),
        (lambda st, t: st.update(fingerprint=[1, 2]), r"fingerprint must be a JSON object, got list"),
        (lambda st, t: st["fingerprint"].update(layers="2"), r"fingerprint layers='2' must be a whole number"),
        (lambda st, t: st["fingerprint"].update(heads=None), r"fingerprint heads=None must be a whole number"),
        (
            lambda st, t: st["fingerprint"].update(extra={"a": 1}),
            r"fingerprint extra=\{'a': 1\} must be text, a number",
        ),
        (lambda st, t: st.update(spec_k="int2"), r"spec_k must be a quantization spec \(a JSON object\) or null"),
        (lambda st, t: st.update(spec_k={"bits": 5}), r"spec_k is not a quantization spec for head_dim 32: bits=5"),
        (lambda st, t: st.update(spec_v={"bits": 2, "group_size": 64}), r"spec_v .*group_size 64 does not divide"),
        (lambda st, t: st.update(latent_shape=[1, 16, 4]), r"latent_shape=\[1, 16, 4\] must be \[batch, channels"),
        (lambda st, t: st.update(latent_shape="1x16x4x4"), r"latent_shape='1x16x4x4' must be"),
        (lambda st, t: st.update(active_prompt=3), r"active_prompt=3 must be text"),
        (lambda st, t: st.pop("next_chunk"), r"the state record lacks next_chunk"),
        (lambda st, t: st.update(surprise=1), r"has fields format version 1 does not know: \['surprise'\]"),
        (lambda st, t: st["retained"][0].pop("shape"), r"retained\[0\] must be a JSON object of chunk, frame_offset"),
        (lambda st, t: st["retained"][0].update(chunk="0"), r"retained\[0\] chunk='0' must be a whole number"),
        # a cache's own record
        (
            _meta_edit(lambda m: m.update(chunks=[5])),
            r"cache of layer 0, branch 0: cache file metadata lists 1 chunks"
            r"|cache file entry chunk0 must be a JSON object",
        ),
        (
            _meta_edit(lambda m: m["chunks"][0]["k"].update(shape=[])),
            r"cache file entry chunk0.k shape=\[\] must be "
            r"\[batch, heads, tokens, head_dim\]",
        ),
        (_meta_edit(lambda m: m["chunks"][0]["k"].update(shape="abc")), r"chunk0.k shape='abc' must be"),
        (_meta_edit(lambda m: m["chunks"][0]["k"].pop("quantized")), r"cache file entry chunk0.k lacks quantized"),
        (
            _meta_edit(lambda m: m["chunks"][0]["k"].update(quantized=False)),
            r"chunk0.k is not quantized but this cache quantizes that side",
        ),
        (_meta_edit(lambda m: m["chunks"][0]["k"].update(dtype=["float32"])), r"chunk0.k records dtype \['float32'\]"),
        (_meta_edit(lambda m: m["chunks"][0].pop("v")), r"cache file entry chunk0 lacks v"),
        (_meta_edit(lambda m: m.update(layout="x")), r"cache file metadata layout must be a JSON object, got str"),
        (_meta_edit(lambda m: m.update(layout={"batch": 1})), r"layout lacks heads, head_dim, dtype"),
        (_meta_edit(lambda m: m.update(layout=None)), r"lists 2 chunks but no layout"),
        (_meta_edit(lambda m: m.update(sink_held=0)), r"sink_held=0 does not fit its 2 chunks under sink_chunks=1"),
        (_meta_edit(lambda m: m.update(spec_k=[1])), r"spec_k must be a JSON object or null"),
        (_meta_edit(lambda m: m.update(version="2")), r"cache file format '2' is not supported"),
        (_meta_edit(lambda m: m.clear()), r"cache file format None is not supported"),
        (lambda st, t: set_cache_meta(t, None, raw=b"[1, 2]"), r"__jensen_kv_meta__ must be a JSON object, got list"),
        (lambda st, t: set_cache_meta(t, None, raw=b"[" * 100_000 + b"]" * 100_000), r"not readable JSON \(nested too"),
        (lambda st, t: set_cache_meta(t, None, raw=b"\xff\xfe"), r"__jensen_kv_meta__ is not readable JSON"),
        (
            lambda st, t: set_cache_meta(t, None, raw=b'{"version": 2, "version": 2}'),
            r"the key 'version' appears twice",
        ),
        (
            lambda st, t: t.update({f"cache.0.0.{META}": torch.zeros(4)}),
            r"has no __jensen_kv_meta__ record \(a 1-D uint8",
        ),
    ],
)
def test_malformed_metadata_is_one_clear_error_naming_the_field(tmp_path, edit, match):
    refused(craft(tmp_path, edit), match)


@pytest.mark.parametrize(
    "state,match",
    [
        ("[" * 100_000 + "]" * 100_000, r"the state record is not readable JSON \(nested too deeply\)"),
        ("[]", r"the state record must be a JSON object, got list"),
        ('{"a": NaN}', r"the state record is not readable JSON \(NaN is not a JSON number\)"),
        # Python 3.11+ refuses a 5,000-digit number in JSON; 3.10 reads it, and the field is unknown
        ('{"a": ' + "1" * 5000 + "}", r"the state record (is not readable JSON \(Exceeds the limit|has fields)"),
    ],
    ids=["nested-100k-deep", "a-list", "NaN", "a-5000-digit-number"],
)
def test_an_unreadable_state_record_is_one_clear_error(tmp_path, state, match):
    src = tmp_path / "s.safetensors"
    make_state().save(str(src))
    meta, tensors = read_file(src)
    refused(resign(tmp_path / "bad.safetensors", meta, tensors, state), match)


def test_a_safetensors_header_that_lies_is_one_clear_error(tmp_path):
    src = tmp_path / "s.safetensors"
    make_state(chunks=2).save(str(src))
    data = src.read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + n])
    name = next(k for k in header if k != "__metadata__")
    cases = {
        "offsets past the end": {**header, name: {**header[name], "data_offsets": [0, 10**12]}},
        "a dtype it cannot read": {**header, name: {**header[name], "dtype": "C64"}},
        "a shape that needs other bytes": {**header, name: {**header[name], "shape": [10**30, 0]}},
        "a gap": {**header, name: {**header[name], "data_offsets": [h + 1 for h in header[name]["data_offsets"]]}},
        "metadata that is not text": {**header, "__metadata__": {**header["__metadata__"], "state": 5}},
    }
    for what, h in cases.items():
        raw = json.dumps(h).encode()
        path = tmp_path / "lie.safetensors"
        path.write_bytes(len(raw).to_bytes(8, "little") + raw + data[8 + n :])
        assert "is not a readable safetensors file" in refused(path, r"readable"), what
    path.write_bytes(data + bytes(16))  # bytes after the last tensor's data, which no digest covers
    refused(path, rf"its tensors' data end at byte {len(data)}, but the file has {len(data) + 16} bytes")
    path.write_bytes((10**15).to_bytes(8, "little") + data[8:])
    refused(path, r"its header declares 1000000000000000 bytes; a Jensen KV cache file's header is at most")
    path.write_bytes(b"\x01")
    refused(path, r"fewer than a safetensors header's 8")
    if hasattr(os, "mkfifo"):
        os.mkfifo(tmp_path / "fifo.safetensors")
        refused(tmp_path / "fifo.safetensors", r"it is not a regular file")  # opened without blocking, not read


# ------------------------------------------------------------------------------------------------ item 6: memory before refusal
def _peak(fn) -> int:
    """Peak Python-heap bytes while ``fn`` runs (bytes, lists and bytearrays count; torch storage does not)."""
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_file_with_a_wrong_sha_is_refused_without_copying_its_tensors(tmp_path, monkeypatch):
    path = str(tmp_path / "big.safetensors")
    save_file(
        {"big": torch.ones(8 << 20)},
        path,  # 32 MiB
        metadata={"format": rs.FORMAT, "version": "1", "state": "{}", "sha256": "0" * 64},
    )
    count = Counting(monkeypatch)
    peak = _peak(lambda: refused(path, r"does not match its recorded SHA-256"))
    assert count.reads == 0  # hashed from the file in blocks, nothing loaded
    assert peak < 6 << 20, peak  # a copy of the tensor for hashing would be 32 MiB


def test_hashing_tensors_to_save_copies_none_of_them():
    tensors = {"a": torch.ones(8 << 20), "b": torch.ones(2, 1 << 20, dtype=torch.bfloat16)}
    digest = {}
    peak = _peak(lambda: digest.setdefault("d", rs._digest(tensors, "{}")))
    assert peak < 2 << 20, peak
    assert len(digest["d"]) == 64


def test_a_loaded_file_is_hashed_and_read_without_copies_on_the_python_heap(tmp_path):
    # one chunk of 4,096 frames: 4 MiB per key or value tensor, 20 MiB in all
    state = make_state(spec_k=None, spec_v=None, window=0, sink=0, chunks=1, chunk_frames=4096, branches=(0,))
    path = str(tmp_path / "s.safetensors")
    state.save(path)
    assert os.path.getsize(path) > 20 << 20
    back = {}
    peak = _peak(lambda: back.setdefault("state", rs.load_saved_run(path)))
    assert peak < 3 << 20, peak  # hashing a copy of one tensor would be 4 MiB
    assert torch.equal(back["state"].retained[0].latent, state.retained[0].latent)


def test_the_state_record_and_the_header_are_capped(tmp_path):
    src = tmp_path / "s.safetensors"
    make_state().save(str(src))
    meta, tensors = read_file(src)
    big_state = meta["state"][:-1] + " " * rs.MAX_STATE_BYTES + "}"  # valid JSON, over the cap
    refused(
        resign(tmp_path / "a.safetensors", meta, tensors, big_state),
        rf"has a {len(big_state)}-character state record; a Jensen KV cache file has one of at most "
        rf"{rs.MAX_STATE_BYTES} characters",
    )
    refused(
        resign(tmp_path / "b.safetensors", {**meta, "padding": " " * (rs.MAX_HEADER_BYTES + 1)}, tensors),
        rf"its header declares \d+ bytes; a Jensen KV cache file's header is at most {rs.MAX_HEADER_BYTES}",
    )


def test_a_cache_record_is_capped_and_decoded_without_a_python_int_per_byte(tmp_path, monkeypatch):
    cache = ChunkCache(INT2, INT2)
    cache.append(torch.randn(1, 2, 8, 32), torch.randn(1, 2, 8, 32))
    sd = cache.state_dict()
    record = sd[META].numpy().tobytes()
    near_cap = record[:-1] + b" " * (cache_mod.MAX_META_BYTES - len(record)) + b"}"
    sd[META] = torch.frombuffer(bytearray(near_cap), dtype=torch.uint8)
    peak = _peak(lambda: ChunkCache(INT2, INT2).load_state_dict(sd))
    assert peak < 5 << 20, peak  # .tolist() of 1 MiB alone is 8 MiB of pointers
    sd[META] = torch.frombuffer(bytearray(near_cap + b" "), dtype=torch.uint8)
    with pytest.raises(ValueError, match=rf"holds {cache_mod.MAX_META_BYTES + 1} bytes; a cache record is at most"):
        ChunkCache(INT2, INT2).load_state_dict(sd)

    # in a run-state file: refused from the header, before the record is read
    def edit(st, tensors):
        tensors[f"cache.0.0.{META}"] = torch.frombuffer(bytearray(near_cap + b" "), dtype=torch.uint8)

    count = Counting(monkeypatch)
    refused(
        craft(tmp_path, edit),
        r"the cache of layer 0, branch 0 has no __jensen_kv_meta__ record \(a 1-D uint8 "
        r"tensor of at most 1048576 bytes\)",
    )
    assert count.records == 0


# ------------------------------------------------------------------------------------------------ ChunkCache on its own
def test_a_chunk_cache_file_over_its_window_or_with_a_wrong_layout_is_refused():
    src = ChunkCache(INT2, INT2, window_chunks=None, sink_chunks=1)
    for _ in range(6):
        src.append(torch.randn(1, 2, 8, 32), torch.randn(1, 2, 8, 32))
    sd = src.state_dict()
    meta = json.loads(sd[META].numpy().tobytes())
    meta["window_chunks"] = 1
    sd[META] = torch.frombuffer(bytearray(json.dumps(meta).encode()), dtype=torch.uint8)
    with pytest.raises(
        ValueError, match="lists 6 chunks, but a cache with window_chunks=1 and sink_chunks=1 holds at most 2"
    ):
        ChunkCache(INT2, INT2, window_chunks=1, sink_chunks=1).load_state_dict(sd)
    meta["window_chunks"] = None
    sd[META] = torch.frombuffer(bytearray(json.dumps(meta).encode()), dtype=torch.uint8)
    with pytest.raises(ValueError, match="holds 5 chunks besides its sink, more than this cache's window of 1"):
        ChunkCache(INT2, INT2, window_chunks=1, sink_chunks=1).load_state_dict(sd)
    with pytest.raises(ValueError, match=r"holds entries its metadata does not describe \(\['chunk9.v'\]\)"):
        ChunkCache(INT2, INT2, sink_chunks=1).load_state_dict({**sd, "chunk9.v": torch.zeros(1)})
    meta["layout"]["heads"] = 4
    sd[META] = torch.frombuffer(bytearray(json.dumps(meta).encode()), dtype=torch.uint8)
    with pytest.raises(
        ValueError,
        match=r"chunk0 holds \(batch, heads, head_dim, dtype\) = \(1, 2, 32, float32\), "
        r"not the layout's \(1, 4, 32, float32\)",
    ):
        ChunkCache(INT2, INT2, sink_chunks=1).load_state_dict(sd)


def test_a_cache_record_one_chunk_past_sink_plus_window_is_refused_by_its_own_check():
    """read_meta's bound is sink + window exactly: one chunk more is named there, not left to a later check."""
    src = ChunkCache(INT2, INT2, window_chunks=None, sink_chunks=1)
    for _ in range(3):
        src.append(torch.randn(1, 2, 8, 32), torch.randn(1, 2, 8, 32))
    meta = json.loads(src.state_dict()[META].numpy().tobytes())

    def record(window):
        return torch.frombuffer(bytearray(json.dumps({**meta, "window_chunks": window}).encode()), dtype=torch.uint8)

    assert len(cache_mod.read_meta(record(2)).chunks) == 3  # sink 1 + window 2 holds 3: accepted
    with pytest.raises(
        ValueError, match="lists 3 chunks, but a cache with window_chunks=1 and sink_chunks=1 holds at most 2"
    ):
        cache_mod.read_meta(record(1))


# ------------------------------------------------------------------------------------------------ item 8: each refusal alone
def _as_saved(state) -> dict:
    return dict(
        fingerprint=dict(state.fingerprint),
        spec_k=state.spec_k,
        spec_v=state.spec_v,
        chunk_frames=state.chunk_frames,
        window_chunks=state.window_chunks,
        sink_chunks=state.sink_chunks,
        latent_shape=tuple(state.latent_shape),
        branches=list(state.branches),
    )


@pytest.mark.parametrize(
    "change,match",
    [
        ({"spec_v": INT4}, r"the value spec \{'bits': 2.*but this run has \{'bits': 4"),
        ({"spec_k": INT4}, r"the key spec \{'bits': 2.*but this run has \{'bits': 4"),
        ({"spec_v": None}, r"the value spec .* but this run has full precision"),
        ({"spec_v": QuantSpec(bits=2, group_size=16, rotation="hadamard")}, r"the value spec"),
        ({"sink_chunks": 0}, r"\(window_chunks, sink_chunks\) \(1, 1\), but this run has \(1, 0\)"),
        ({"window_chunks": 2}, r"\(window_chunks, sink_chunks\) \(1, 1\), but this run has \(2, 1\)"),
        (
            {"latent_shape": (1, 16, 8, 4)},
            r"latents of \(batch, channels, height, width\) \(1, 16, 4, 4\), but this run "
            r"has \(1, 16, 8, 4\)",
        ),
        ({"latent_shape": (1, 16, 4, 8)}, r"\(1, 16, 4, 4\), but this run has \(1, 16, 4, 8\)"),
        ({"latent_shape": (2, 16, 4, 4)}, r"\(1, 16, 4, 4\), but this run has \(2, 16, 4, 4\)"),
        ({"chunk_frames": 1}, r"chunk_frames 2, but this run has 1"),
        ({"branches": [0]}, r"CFG branches \[0, 1\], but this run has \[0\]"),
        ({"fingerprint": {"heads": 4}}, r"a model whose heads is 2, but this run has 4"),
        ({"fingerprint": {"weights": "cd" * 16}}, r"model weights with digest"),
        ({"tiers": AgeTiers(recent_bits=4, recent_chunks=1)}, r"age tiers off, but this run has recent1@4"),
    ],
)
def test_each_compared_field_is_refused_on_its_own(change, match):
    state = make_state(spec_k=INT2, spec_v=INT2, window=1, sink=1)
    same = _as_saved(state)
    state.check_compatible(**same)  # everything equal: accepted
    run = {**same, **change}
    if "fingerprint" in change:
        run["fingerprint"] = {**same["fingerprint"], **change["fingerprint"]}
    with pytest.raises(ValueError, match=match):
        state.check_compatible(**run)


def test_save_never_writes_through_a_symlink_planted_under_the_old_temporary_name(tmp_path):
    """SavedRun.save used ``{path}.tmp-{pid}``: a symlink at that name in output/ redirected the write outside."""
    import os

    from support import saved_run_files as rsf

    state = rsf.make_state()
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"keep")
    target = tmp_path / "out" / "kv.safetensors"
    target.parent.mkdir()
    os.symlink(outside, f"{target}.tmp-{os.getpid()}")
    state.save(str(target))
    assert outside.read_bytes() == b"keep"
    assert target.is_file() and not target.is_symlink()
    assert sorted(p.name for p in target.parent.iterdir()) == sorted([target.name, f"{target.name}.tmp-{os.getpid()}"])


# ------------------------------------------------------------------------------ grouped-query attention
def test_a_gqa_state_records_its_kv_heads_and_loads_back(tmp_path):
    """2 query heads over 1 K/V head: the caches hold the K/V head, the fingerprint says so, and a run of the same
    model continues it; a model with as many K/V heads as query heads is another model."""
    state = make_state(heads_of=lambda layer, b, c: 1)
    state.fingerprint = {**state.fingerprint, "kv_heads": 1}
    path = str(tmp_path / "gqa.safetensors")
    state.save(path)
    back = rs.load_saved_run(path)
    assert back.fingerprint["kv_heads"] == 1 and back.nbytes == state.nbytes
    back.check_compatible(**_as_saved(state))
    mha = {k: v for k, v in state.fingerprint.items() if k != "kv_heads"}
    with pytest.raises(ValueError, match="a model whose kv_heads is 1, but this run has 2"):
        back.check_compatible(**{**_as_saved(state), "fingerprint": mha})


def test_a_state_without_kv_heads_reads_as_as_many_kv_heads_as_heads(tmp_path):
    """Files written before GQA (and by models without it) record no kv_heads: they read as kv_heads == heads."""
    state = make_state()
    path = str(tmp_path / "mha.safetensors")
    state.save(path)
    assert "kv_heads" not in json.loads(read_file(path)[0]["state"])["fingerprint"]
    back = rs.load_saved_run(path)
    back.check_compatible(**{**_as_saved(state), "fingerprint": {**state.fingerprint, "kv_heads": HEADS}})
    with pytest.raises(ValueError, match="a model whose kv_heads is 2, but this run has 1"):
        back.check_compatible(**{**_as_saved(state), "fingerprint": {**state.fingerprint, "kv_heads": 1}})


def test_caches_of_the_query_heads_under_a_gqa_fingerprint_are_refused(tmp_path):
    state = make_state()  # caches of 2 heads
    state.fingerprint = {**state.fingerprint, "kv_heads": 1}
    path = str(tmp_path / "wrong.safetensors")
    state.save(path)
    refused(path, r"cache of layer 0, branch 0 holds \(batch, heads, head_dim\) = \(1, 2, 32\), not \(1, 1, 32\)")


@pytest.mark.parametrize(
    "kv_heads,match",
    [(3, r"fingerprint kv_heads=3 must divide heads=2"), (0, r"fingerprint kv_heads=0 must be a whole number")],
)
def test_kv_heads_that_do_not_fit_the_heads_are_refused(tmp_path, kv_heads, match):
    def edit(st, tensors):
        st["fingerprint"]["kv_heads"] = kv_heads

    refused(craft(tmp_path, edit), match)
