"""Readers take nothing on trust: every field of a saved run file is checked against the others, one planted field
at a time (no ComfyUI).

The table :data:`PLANTS` names each field of a run-state file (``runtime/saved_run.py``: the state record, every
(layer, branch) cache's ``__jensen_kv_meta__`` record of ``jensen_core/cache.py``, the tensors) and plants one
wrong value in a real state's file - re-signed, so the SHA-256 checks out and only the cross-checks stand between
it and a run. Each must be refused with one ValueError that names the file and the field. The converted
checkpoint's fields are planted in ``tests/test_convert_checkpoint.py``
(``test_a_header_field_that_disagrees_with_the_others_is_refused``).
"""

from __future__ import annotations

import pytest
import torch
from support.saved_run_files import AgeTiers, cache_meta, craft, make_state, rs, set_cache_meta

DTYPE_NAMES = ("float16", "bfloat16")


def _cache(edit, layer=0, branch=0):
    """An edit of the (layer, branch) cache's record."""

    def apply(st, tensors):
        meta = cache_meta(tensors, layer, branch)
        edit(meta)
        set_cache_meta(tensors, meta, layer, branch)

    return apply


def _all_chunks(meta, side, **fields):
    for c in meta["chunks"]:
        c[side].update(fields)


def _retained_dtype(st, tensors):
    st["retained"][1]["dtype"] = "float16"
    tensors["latent.3"] = tensors["latent.3"].half()


def _whole_cache_in(dtype):
    def edit(meta):
        meta["layout"]["dtype"] = dtype
        for c in meta["chunks"]:
            c["k"]["dtype"] = c["v"]["dtype"] = dtype

    return edit


def _keys_in(dtype):
    def edit(meta):
        meta["layout"]["dtype"] = dtype
        _all_chunks(meta, "k", dtype=dtype)

    return edit


#: (field, the edit of a default state's file (INT2 g16, 4 chunks of 2 frames, window 1 + sink 1, cfg branches
#: 0 and 1, 2 layers x 2 heads x 32, latents (1, 16, 4, 4): 4 tokens per frame), the error it must meet)
PLANTS = [
    ("fingerprint.layers", lambda st, t: st["fingerprint"].update(layers=3), r"caches lists 4 entries; a model of 3"),
    (
        "fingerprint.heads",
        lambda st, t: st["fingerprint"].update(heads=4),
        r"holds \(batch, heads, head_dim\) = \(1, 2, 32\), not \(1, 4, 32\)",
    ),
    (
        "fingerprint.head_dim",
        lambda st, t: st["fingerprint"].update(head_dim=64),
        r"holds \(batch, heads, head_dim\) = \(1, 2, 32\), not \(1, 2, 64\)",
    ),
    ("spec_k", lambda st, t: st["spec_k"].update(bits=4), r"was saved with specs \(keys, values\)"),
    ("spec_v", lambda st, t: st.update(spec_v=None), r"was saved with specs \(keys, values\)"),
    (
        "tiers",
        lambda st, t: st.update(tiers={"recent_bits": 4, "recent_chunks": 1, "sink_bits": 0}),
        r"was saved with age tiers off, but the state says recent1@4",
    ),
    ("chunk_frames", lambda st, t: st.update(chunk_frames=1), r"is not a latent of 1 to chunk_frames=1 frames"),
    ("window_chunks", lambda st, t: st.update(window_chunks=2), r"retained lists 2 chunks; .*retains 3"),
    ("sink_chunks", lambda st, t: st.update(sink_chunks=0), r"retained lists 2 chunks; .*sink_chunks=0 retains 1"),
    (
        "latent_shape batch",
        lambda st, t: st.update(latent_shape=[2, 16, 4, 4]),
        r"is not a latent of .*\(batch, channels, height, width\) \(2, 16, 4, 4\)",
    ),
    ("latent_shape width", lambda st, t: st.update(latent_shape=[1, 16, 4, 8]), r"\(1, 16, 4, 8\)"),
    ("next_chunk", lambda st, t: st.update(next_chunk=5), r"retained\[1\] is chunk 3, but at chunk 5"),
    ("next_frame", lambda st, t: st.update(next_frame=9), r"next_frame=9 does not follow the retained chunks"),
    ("branches", lambda st, t: st.update(branches=[0]), r"caches lists 4 entries; .*branches \[0\] has 2"),
    (
        "retained frame_offset (against the chunks before)",
        lambda st, t: st["retained"][1].update(frame_offset=2),
        r"retained\[1\] \(chunk 3\) frame_offset=2 must be from 4 to 6",
    ),
    (
        "retained frame_offset (against next_frame)",
        lambda st, t: st["retained"][1].update(frame_offset=5),
        r"next_frame=8 does not follow the retained chunks: the last one \(chunk 3\) starts at frame 5",
    ),
    (
        "retained dtype (record)",
        lambda st, t: st["retained"][1].update(dtype="float16"),
        r"retained\[1\] dtype=float16 differs from retained\[0\]'s float32",
    ),
    ("retained dtype (record and tensor)", _retained_dtype, r"retained\[1\] dtype=float16 differs from retained\[0\]"),
    (
        "retained tensor dtype",
        lambda st, t: t.update({"latent.3": t["latent.3"].half()}),
        r"tensor latent.3 is missing or does not match its recorded shape \[1, 16, 2, 4, 4\] and dtype float32",
    ),
    (
        "cache spec",
        _cache(lambda m: m["spec_k"].update(bits=4)),
        r"cache of layer 0, branch 0 was saved with specs \(keys, values\)",
    ),
    (
        "cache window",
        _cache(lambda m: m.update(window_chunks=2)),
        r"cache of layer 0, branch 0 keeps window_chunks=2, sink_chunks=1, but the state says 1, 1",
    ),
    (
        "cache sink_held",
        _cache(lambda m: m.update(sink_held=0)),
        r"cache of layer 0, branch 0: cache file metadata sink_held=0 does not fit its 2 chunks",
    ),
    (
        "cache layout dtype",
        _cache(lambda m: m["layout"].update(dtype="float16")),
        r"chunk0 holds \(batch, heads, head_dim, dtype\) = \(1, 2, 32, float32\), not the layout's "
        r"\(1, 2, 32, float16\)",
    ),
    (
        "cache layout batch",
        _cache(lambda m: m["layout"].update(batch=2)),
        r"chunk0 holds \(batch, heads, head_dim, dtype\) = \(1, 2, 32, float32\), not the layout's \(2, 2, 32",
    ),
    (
        "cache keys' dtype (layout too)",
        _cache(_keys_in("float16")),
        r"chunk0 stores keys \[1, 2, 8, 32\] float16 and values \[1, 2, 8, 32\] float32",
    ),
    (
        "one cache's dtype (layout and parts)",
        _cache(_whole_cache_in("float16"), layer=1, branch=1),
        r"cache of layer 1, branch 1 holds torch.float16 chunks, the other caches torch.float32",
    ),
    (
        "cache part scale format",
        _cache(lambda m: _all_chunks(m, "v", scale_format="fp4")),
        r"chunk0.v has an unknown scale format 'fp4'",
    ),
    (
        "cache part quantized flag",
        _cache(lambda m: _all_chunks(m, "k", quantized=False)),
        r"chunk0.k is not quantized but this cache quantizes that side",
    ),
]


@pytest.mark.parametrize("field,edit,match", PLANTS, ids=[p[0] for p in PLANTS])
def test_one_planted_field_is_refused_naming_it(tmp_path, field, edit, match):
    path = craft(tmp_path, edit)
    with pytest.raises(ValueError, match=match) as info:
        rs.load_saved_run(path)
    assert type(info.value) is ValueError and "crafted.safetensors" in str(info.value)


def test_the_unplanted_file_loads(tmp_path):
    """The control: the same file with no field planted loads and equals the state it was made from."""
    state = rs.load_saved_run(craft(tmp_path, lambda st, t: None))
    ref = make_state()
    assert (state.next_chunk, state.next_frame, state.tokens_per_frame) == (ref.next_chunk, ref.next_frame, 4)
    assert all(torch.equal(a.latent, b.latent) for a, b in zip(state.retained, ref.retained))


def _with_cache_of(state, key, other):
    state.caches[key] = other.caches[key]
    return state


@pytest.mark.parametrize(
    "make,match",
    [
        (  # chunk 3 of one cache holds 1 frame's tokens, its latent 2 frames
            lambda: _with_cache_of(make_state(), (1, 1), make_state(frames_of=lambda c: 1 if c == 3 else 2, seed=1)),
            r"cache of layer 1, branch 1 holds 4 tokens in chunk 3, whose latent has 2 frames; expected 8",
        ),
        (  # a whole cache of 2 tokens per frame where the others hold 4
            lambda: _with_cache_of(make_state(), (1, 1), make_state(frames_of=lambda c: 1, seed=1)),
            r"cache of layer 1, branch 1 holds 4 tokens in chunk 0, whose latent has 2 frames; expected 8 "
            r"\(4 tokens per frame, as in the first chunk\)",
        ),
    ],
    ids=["tokens per frame across chunks", "tokens per frame across caches"],
)
def test_caches_of_other_tokens_per_frame_are_refused(tmp_path, make, match):
    path = str(tmp_path / "tokens.safetensors")
    make().save(path)
    with pytest.raises(ValueError, match=match):
        rs.load_saved_run(path)


def test_each_chunks_bits_must_be_its_positions_under_the_tiers(tmp_path):
    """Under tiers every part records its bits; they must be the ones its position keeps (the sink, the newest
    chunks at the tiers' bits), not merely bits that side may hold: a state whose tiers record says one chunk
    fewer is recent than its caches hold at 4 bits is refused."""
    wide = AgeTiers(recent_bits=4, recent_chunks=2)  # both held chunks (sink, newest) at 4 bits
    state = make_state(tiers=wide)
    narrow = {"recent_bits": 4, "recent_chunks": 1, "sink_bits": 0}

    def edit(st, tensors):
        st["tiers"] = narrow
        for layer, branch in st["caches"]:
            meta = cache_meta(tensors, layer, branch)
            meta["tiers"] = narrow
            set_cache_meta(tensors, meta, layer, branch)

    path = craft(tmp_path, edit, state=state)
    with pytest.raises(
        ValueError,
        match=r"cache of layer 0, branch 0: cache file entry chunk0.k bits=4: under age tiers 'recent1@4' with "
        r"sink_held=1, chunk 0 of 2 is kept at 2 bits",
    ):
        rs.load_saved_run(path)
    assert rs.load_saved_run(craft(tmp_path, lambda st, t: None, state=state, name="ok.safetensors")).tiers == wide


def test_a_state_whose_caches_disagree_with_the_runs_latent_is_refused():
    """The file's latent size and its caches' tokens are two fields: a run compares both with its own latent."""
    state = make_state()
    kw = dict(
        fingerprint=state.fingerprint,
        spec_k=state.spec_k,
        spec_v=state.spec_v,
        chunk_frames=state.chunk_frames,
        window_chunks=state.window_chunks,
        sink_chunks=state.sink_chunks,
        latent_shape=state.latent_shape,
        branches=state.branches,
    )
    state.check_compatible(**kw, tokens_per_frame=4)  # 4 x 4 latents, 2 x 2 patches
    with pytest.raises(ValueError, match=r"caches of 4 tokens per latent frame, but this run has 16 for its latent"):
        state.check_compatible(**kw, tokens_per_frame=16)
