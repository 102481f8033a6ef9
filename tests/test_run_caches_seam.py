"""The attention seam every model family routes its self-attention through (``RunCaches.attend``): this chunk's
tokens (stored when written), the cached chunks (quantized, corrected), context tokens (attended, never stored)
and a key range, with grouped-query heads. Each checked against a float64 softmax written plainly here."""

from __future__ import annotations

import math

import pytest
import torch
from support.pack import load_pack_module

run_caches = load_pack_module("runtime.run_caches")
config_mod = load_pack_module("runtime.config")
jk = load_pack_module("jensen_core")

HQ, HKV, D, T = 4, 2, 32, 6


def make(spec=None, window=0, guard=True):
    cfg = config_mod.JensenKVConfig(spec_k=spec, spec_v=spec, correction="taylor" if spec else "off", guard=guard)
    return run_caches.RunCaches(cfg, window, num_layers=1)


def write(run, chunk, gen, batch=1):
    """Chunk ``chunk`` written (at frame ``chunk``) by one attention call: the write event around the call."""
    q = torch.randn(batch, HQ, T, D, generator=gen)
    k, v = (torch.randn(batch, HKV, T, D, generator=gen) for _ in range(2))
    run.write(chunk, chunk, k, lambda: run.attend(0, q, k, v, None), record=False)
    return k, v


def reference(q, keys, values, bias=None):
    """softmax(q k^T / sqrt(d) - bias) v in float64, query head h over K/V head h // groups."""
    groups = q.shape[1] // keys.shape[1]
    kk = keys.double().repeat_interleave(groups, dim=1)
    vv = values.double().repeat_interleave(groups, dim=1)
    s = q.double() @ kk.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if bias is not None:
        s = s - bias
    return torch.softmax(s, dim=-1) @ vv


@pytest.mark.parametrize("cached", [0, 2])
def test_context_tokens_are_attended_in_full_precision_and_never_stored(cached):
    gen = torch.Generator().manual_seed(0)
    run = make()
    stored = [write(run, c, gen) for c in range(cached)]
    run.denoise(cached, cached)
    q = torch.randn(1, HQ, T, D, generator=gen)
    k, v = (torch.randn(1, HKV, T, D, generator=gen) for _ in range(2))
    kc, vc = (torch.randn(1, HKV, 5, D, generator=gen) for _ in range(2))
    out = run.attend(0, q, k, v, None, context=(kc, vc))
    keys = torch.cat([*(s[0] for s in stored), kc, k], dim=2)
    values = torch.cat([*(s[1] for s in stored), vc, v], dim=2)
    torch.testing.assert_close(out.double(), reference(q, keys, values), atol=2e-6, rtol=0)
    # a write with context stores only the chunk's own tokens
    run.write(cached, cached, k, lambda: run.attend(0, q, k, v, None, context=(kc, vc)), record=False)
    assert run.caches[(0, 0)].num_chunks == cached + 1
    assert run.caches[(0, 0)].entries[-1].tokens == T


@pytest.mark.parametrize("guard", [False, True])
def test_the_correction_touches_cached_keys_only_never_context_or_current(guard):
    """INT2 cache + Taylor: the bias (Eq. 15, per K/V head's steps and the query's group norms) on cached keys,
    none on context or current tokens; with the run's guard (the config's default), times each K/V head's guard
    factor (6 keys a chunk: the guard acts)."""
    gen = torch.Generator().manual_seed(1)
    spec = jk.QuantSpec(bits=2, group_size=32)
    run = make(spec, guard=guard)
    k0, v0 = write(run, 0, gen)
    run.denoise(1, 1)
    q = torch.randn(1, HQ, T, D, generator=gen)
    k, v = (torch.randn(1, HKV, T, D, generator=gen) for _ in range(2))
    kc, vc = (torch.randn(1, HKV, 3, D, generator=gen) for _ in range(2))
    out = run.attend(0, q, k, v, None, context=(kc, vc))
    entry = run.caches[(0, 0)].entries[0]
    kq, vq = entry.k.dequantize(), entry.v.dequantize()
    steps = entry.k.step_sizes().double()  # (1, H_kv, T, d / g)
    groups = HQ // HKV
    g = spec.group_size
    nu = q.double().reshape(1, HQ, T, D // g, g).pow(2).sum(-1)  # (1, H_q, M, G)
    w = steps.repeat_interleave(groups, dim=1).pow(2) / (24 * D)  # (1, H_q, T, G)
    bias_cached = nu @ w.transpose(-1, -2)
    if guard:
        factors = load_pack_module("jensen_core.bias").guard_scales(q, entry.k, "taylor")  # (1, H_kv, 1 chunk)
        assert float(factors.max()) < 0.9
        bias_cached = bias_cached * factors.double().repeat_interleave(groups, dim=1).unsqueeze(-1)
    bias = torch.cat([bias_cached, torch.zeros(1, HQ, T, 3 + T, dtype=torch.float64)], dim=-1)
    keys = torch.cat([kq.to(k.dtype), kc, k], dim=2)
    values = torch.cat([vq.to(v.dtype), vc, v], dim=2)
    want = reference(q, keys, values, bias)
    torch.testing.assert_close(out.double(), want, atol=2e-6, rtol=0)
    # and the bias mattered: without it the answer moves well beyond the tolerance
    assert (reference(q, keys, values) - want).abs().max() > 1e-4


def test_a_key_range_attends_only_the_newest_chunks():
    gen = torch.Generator().manual_seed(2)
    run = make()
    stored = [write(run, c, gen) for c in range(3)]
    run.denoise(3, 3)
    q = torch.randn(1, HQ, T, D, generator=gen)
    k, v = (torch.randn(1, HKV, T, D, generator=gen) for _ in range(2))
    for n in (0, 1, 3):
        out = run.attend(0, q, k, v, None, last_chunks=n)
        keep = stored[3 - n :]
        keys = torch.cat([*(s[0] for s in keep), k], dim=2)
        values = torch.cat([*(s[1] for s in keep), v], dim=2)
        torch.testing.assert_close(out.double(), reference(q, keys, values), atol=2e-6, rtol=0)


def test_cfg_slots_each_get_their_own_context():
    gen = torch.Generator().manual_seed(3)
    run = make()
    run.denoise(0, 0)
    q = torch.randn(2, HQ, T, D, generator=gen)
    k, v = (torch.randn(2, HKV, T, D, generator=gen) for _ in range(2))
    kc, vc = (torch.randn(2, HKV, 4, D, generator=gen) for _ in range(2))
    out = run.attend(0, q, k, v, {"cond_or_uncond": [1, 0]}, context=(kc, vc))
    for b in range(2):
        want = reference(
            q[b : b + 1], torch.cat([kc[b : b + 1], k[b : b + 1]], 2), torch.cat([vc[b : b + 1], v[b : b + 1]], 2)
        )
        torch.testing.assert_close(out[b : b + 1].double(), want, atol=2e-6, rtol=0)
    with pytest.raises(ValueError, match="context must be"):
        run.attend(0, q, k, v, None, context=(kc[:1], vc[:1]))
