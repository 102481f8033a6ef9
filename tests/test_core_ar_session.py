"""Core's ``end`` protocol over the pack's caches (runtime/core_ar/session.py), driven the way sample_ar_video drives it.

No ComfyUI here: a fake "core sampler" moves ``end`` exactly as comfy/k_diffusion/sampling.py::sample_ar_video
(v0.27) does, and the attention calls stand in for CausalWanSelfAttention; the ComfyUI tests are in
tests/integration/test_core_ar_path.py.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from support.pack import load_pack_module

session_mod = load_pack_module("runtime.core_ar.session")
config_mod = load_pack_module("runtime.config")
jk = load_pack_module("jensen_core")

LAYERS, HEADS, D, FRAME_TOKENS = 2, 2, 32, 4


def make(window=0, sink=0, spec=None):
    cfg = config_mod.JensenKVConfig(spec_k=spec, spec_v=spec)
    s = session_mod.CoreARSession(cfg, num_layers=LAYERS, window_chunks=window, sink_chunks=sink)
    s.geometry = session_mod.CoreARGeometry(batch=1, frame_tokens=FRAME_TOKENS, latent_frames=8)
    return s


def call(s, kv, frames, gen, labels=(0,)):
    """One sampler model call: begin, every layer attends with fresh q/k/v, end. Returns (q, k, v) of layer 0."""
    s.begin_call()
    first = None
    for layer in range(LAYERS):
        q, k, v = (torch.randn(len(labels), HEADS, frames * FRAME_TOKENS, D, generator=gen) for _ in range(3))
        s.labels = list(labels)
        s.attend(layer, q, k, v, list(labels))
        first = first or (q, k, v)
    s.end_call()
    return first


def run_block(s, kv, frames, steps, gen):
    """One block as sample_ar_video runs it: ``steps`` denoising calls, end moved back after each non-final
    step and once more before the clean pass, then the clean pass. Returns the clean pass's (q, k, v)."""
    bt = frames * FRAME_TOKENS
    for i in range(steps):
        call(s, kv, frames, gen)
        if i < steps - 1:
            for c in kv:
                c["end"] -= bt
    for c in kv:
        c["end"] -= bt
    return call(s, kv, frames, gen)


def test_only_the_clean_pass_is_committed_and_end_moves_like_core():
    s, gen = make(), torch.Generator().manual_seed(0)
    kv = s.init_caches(1, 8 * FRAME_TOKENS)
    assert all(set(c) == {"end"} for c in kv)  # nothing the size of the video
    clean0 = run_block(s, kv, 2, 3, gen)
    assert s.commits == 0 and kv[0]["end"] == 2 * FRAME_TOKENS  # final, but committed only at the next call
    run_block(s, kv, 2, 3, gen)
    assert s.commits == 1 and s.committed_end == 2 * FRAME_TOKENS
    cache = s.run.caches[(0, 0)]
    assert cache.num_chunks == 1
    # the committed chunk is the clean pass's keys and values (full precision here), not a denoising step's
    torch.testing.assert_close(cache.entries[0].k, clean0[1])
    torch.testing.assert_close(cache.entries[0].v, clean0[2])


def test_full_precision_attention_equals_attention_over_cache_plus_block():
    s, gen = make(), torch.Generator().manual_seed(1)
    kv = s.init_caches(1, 8 * FRAME_TOKENS)
    keys, values = [], []
    # block 0: 1 step + clean
    for _ in range(2):
        (q, k, v) = call(s, kv, 1, gen)
        for c in kv:
            c["end"] -= FRAME_TOKENS
    # the clean pass of block 0 is the last call above, and end was moved back after it: replay it as core does
    q0, k0, v0 = call(s, kv, 1, gen)
    keys.append(k0)
    values.append(v0)
    # block 1, first step: layer 0's output must be attention over [block 0 clean, block 1]
    s.begin_call()
    q, k, v = (torch.randn(1, HEADS, FRAME_TOKENS, D, generator=gen) for _ in range(3))
    out = s.attend(0, q, k, v, [0])
    ref = F.scaled_dot_product_attention(q, torch.cat([k0, k], 2), torch.cat([v0, v], 2))
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_a_move_core_never_makes_is_refused():
    s, gen = make(), torch.Generator().manual_seed(2)
    kv = s.init_caches(1, 8 * FRAME_TOKENS)
    call(s, kv, 1, gen)
    for c in kv:
        c["end"] += 3  # neither stayed nor went back by the block
    with pytest.raises(session_mod.CoreARProtocolError, match="must stay at 4"):
        s.begin_call()


def test_reaching_for_core_full_precision_cache_names_the_cause():
    s = make()
    kv = s.init_caches(1, 8 * FRAME_TOKENS)
    with pytest.raises(session_mod.CoreARProtocolError, match="replaced the pack's self-attention"):
        kv[0]["k"][:, 0:4] = 0


@pytest.mark.slow
@pytest.mark.parametrize("window,sink", [(0, 0), (2, 0), (1, 1), (3, 2)])
def test_window_and_sink_hold_what_the_planner_says(window, sink):
    """Peak bytes on core's protocol equal the planner's figure (INT2, blocks of 1 frame, 7 blocks)."""
    planner = load_pack_module("jensen_core.planner")
    spec = jk.QuantSpec(bits=2, group_size=32)
    s, gen = make(window, sink, spec), torch.Generator().manual_seed(3)
    kv = s.init_caches(1, 7 * FRAME_TOKENS)
    for _ in range(7):
        run_block(s, kv, 1, 2, gen)
    assert s.commits == 6  # the last block is never committed: nothing reads it
    held = s.run.caches[(0, 0)].num_chunks
    kept = 6 if not window else min(6, window + sink)
    assert held == kept
    plan = planner.plan_cache(
        latent_frames=7,
        latent_height=2,
        latent_width=2 * FRAME_TOKENS,
        chunk_frames=1,
        window_chunks=window,
        sink_chunks=sink,
        shape=planner.CacheShape(
            layers=LAYERS, heads=HEADS, head_dim=D, geometry=planner.LatentGeometry(patch=(1, 2, 2), latent_channels=16)
        ),
        precision=planner.CachePrecision(spec_k=spec, spec_v=spec),
    )
    assert s.peak_bytes == plan.quantized_bytes


def test_cfg_branches_in_one_batch_get_their_own_caches():
    s, gen = make(), torch.Generator().manual_seed(4)
    kv = s.init_caches(1, 8 * FRAME_TOKENS)
    s.begin_call()
    for layer in range(LAYERS):
        q, k, v = (torch.randn(2, HEADS, FRAME_TOKENS, D, generator=gen) for _ in range(3))
        s.attend(layer, q, k, v, [1, 0])  # uncond first, as cond_or_uncond may order them
    s.end_call()
    call(s, kv, 1, gen, labels=(0, 1))
    assert set(s.run.caches) == {(layer, b) for layer in range(LAYERS) for b in (0, 1)}


def test_separate_cond_and_uncond_calls_write_one_block():
    """cond and uncond as two apply_model calls within one sampler call write the same block at the same end."""
    s, gen = make(), torch.Generator().manual_seed(5)
    kv = s.init_caches(1, 8 * FRAME_TOKENS)
    s.begin_call()
    for labels in ([0], [1]):
        for layer in range(LAYERS):
            q, k, v = (torch.randn(1, HEADS, FRAME_TOKENS, D, generator=gen) for _ in range(3))
            s.attend(layer, q, k, v, labels)
    s.end_call()
    assert kv[0]["end"] == FRAME_TOKENS
    call(s, kv, 1, gen, labels=(0, 1))
    assert s.commits == 1 and s.run.caches[(0, 1)].num_chunks == 1


def test_a_call_that_skips_layers_is_refused():
    s, gen = make(), torch.Generator().manual_seed(6)
    s.init_caches(1, 8 * FRAME_TOKENS)
    s.begin_call()
    q, k, v = (torch.randn(1, HEADS, FRAME_TOKENS, D, generator=gen) for _ in range(3))
    s.attend(0, q, k, v, [0])
    with pytest.raises(session_mod.CoreARProtocolError, match=r"layers \[1\]"):
        s.end_call()


def test_the_block_in_flight_waits_at_the_cache_precision():
    """RTN: the pending block is held quantized (what the cache will store); QVG: raw, quantized once at commit."""
    gen = torch.Generator().manual_seed(7)
    rtn = jk.QuantSpec(bits=2, group_size=32)
    s = make(spec=rtn)
    kv = s.init_caches(1, 8 * FRAME_TOKENS)
    run_block(s, kv, 2, 2, gen)
    held = s.in_flight_bytes
    cache_one_chunk = jk.ChunkCache.with_precision(s.config.precision)  # an empty cache of the run's precision
    probe = torch.randn(1, HEADS, 2 * FRAME_TOKENS, D)
    cache_one_chunk.append(probe, probe)
    assert held == LAYERS * cache_one_chunk.nbytes  # one block per layer, at INT2
    assert held < LAYERS * 2 * probe.numel() * 4 / 5  # far below the fp32 block
    run_block(s, kv, 2, 2, gen)
    assert s.run.caches[(0, 0)].nbytes == cache_one_chunk.nbytes  # what was held is what got committed

    qvg = jk.QuantSpec(bits=2, group_size=32, method="qvg", qvg_centroids=4)
    s = make(spec=qvg)
    kv = s.init_caches(1, 8 * FRAME_TOKENS)
    run_block(s, kv, 2, 2, gen)
    assert s.in_flight_bytes == LAYERS * 2 * 2 * FRAME_TOKENS * HEADS * D * 4  # fp32 k and v
    run_block(s, kv, 2, 2, gen)
    assert s.run.caches[(0, 0)].num_chunks == 1 and s.run.caches[(0, 0)].nbytes < s.in_flight_bytes / LAYERS
