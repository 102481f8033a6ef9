"""``head_mean`` (issue 40, item 5): one bias per query and head, the Taylor bias averaged with the query's attention
over the cached keys. The fast path (streamed, and one window buffer) against the materialised bias of
``jensen_bias``, with and without the guard, grouped-query heads and Krea's offsets; and what it is not: the
uniform mean over the window (``per_channel``)."""

from __future__ import annotations

import math

import pytest
import torch

from jensen_core import CacheEntry, QuantSpec, attention, cached_attention, jensen_bias, quantize
from jensen_core.attention_shift import attention_shift
from jensen_core.bias import MODES, guard_scales
from jensen_core.quant import cat_quantized


@pytest.fixture(params=["streamed", "one-buffer"])
def path(request, monkeypatch):
    monkeypatch.setattr(attention, "_FORCE_CONCAT", request.param == "one-buffer")
    return request.param


def _setup(hq=4, hkv=2, gain=1.0, seed=0, rotation="hadamard"):
    g = torch.Generator().manual_seed(seed)
    spec = QuantSpec(bits=2, group_size=32, rotation=rotation, seed=seed)
    entries = [
        CacheEntry(
            quantize(torch.randn(1, hkv, 20, 64, generator=g) * gain, spec),
            quantize(torch.randn(1, hkv, 20, 64, generator=g), spec),
        )
        for _ in range(3)
    ]
    q = torch.randn(1, hq, 40, 64, generator=g) * gain
    kc, vc = torch.randn(1, hkv, 16, 64, generator=g), torch.randn(1, hkv, 16, 64, generator=g)
    return entries, q, kc, vc


def _reference(entries, q, kc, vc, strength, guard):
    """softmax([q k_hat / sqrt(d) - strength * factor * b_head_mean, q k_cur / sqrt(d)]) v, materialised."""
    kq = cat_quantized([e.k for e in entries])
    groups = q.shape[1] // kq.shape[1]
    b = jensen_bias(q, kq, "head_mean", [e.tokens for e in entries])
    if guard:
        f = guard_scales(q, kq, "head_mean", strength, [e.tokens for e in entries])[..., :1]
        b = b * f.repeat_interleave(groups, dim=1).unsqueeze(-1)
    rep = lambda t: t.repeat_interleave(groups, dim=1)  # noqa: E731
    k_hat, v_hat = (
        rep(kq.dequantize(torch.float32)),
        rep(cat_quantized([e.v for e in entries]).dequantize(torch.float32)),
    )
    d = q.shape[-1]
    s = torch.cat(
        [q @ k_hat.transpose(-1, -2) / math.sqrt(d) - strength * b, q @ rep(kc).transpose(-1, -2) / math.sqrt(d)], -1
    )
    return torch.softmax(s, -1) @ torch.cat([v_hat, rep(vc)], -2)


def test_head_mean_is_the_last_mode_so_saved_workflows_keep_theirs():
    assert MODES[:5] == ("taylor", "chunk_mean", "exact", "per_channel", "off") and MODES[-1] == "head_mean"


@pytest.mark.parametrize("guard", [False, True])
@pytest.mark.parametrize("gain", [1.0, 2.0])
def test_the_fast_path_equals_the_materialised_head_mean(gain, guard, path):
    entries, q, kc, vc = _setup(gain=gain)
    out = cached_attention(q, kc, vc, entries, correction="head_mean", strength=0.8, guard=guard)
    torch.testing.assert_close(out, _reference(entries, q, kc, vc, 0.8, guard), rtol=1e-4, atol=2e-5)
    if gain == 2.0:  # scores ~N(0, 4^2) over 20-key chunks: the guard acts
        unguarded = cached_attention(q, kc, vc, entries, correction="head_mean", strength=0.8)
        assert (float((out - unguarded).abs().max()) > 1e-3) == guard


def test_krea_offsets_weigh_the_attention_in_both_paths(monkeypatch):
    entries, q, kc, vc = _setup(seed=1)
    offsets = [((4, 0.0), (16, math.log(0.3))), math.log(0.3), math.log(0.3)]
    outs = []
    for force in (False, True):
        monkeypatch.setattr(attention, "_FORCE_CONCAT", force)
        outs.append(cached_attention(q, kc, vc, entries, "head_mean", key_log_offsets=offsets, guard=True))
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-4, atol=2e-5)


def test_head_mean_is_one_value_per_query_and_not_the_windows_uniform_mean():
    entries, q, _, _ = _setup(hq=2, hkv=2, gain=2.0)
    kq = cat_quantized([e.k for e in entries])
    b = jensen_bias(q, kq, "head_mean")
    assert torch.equal(b, b[..., :1].expand_as(b))
    taylor = jensen_bias(q, kq, "taylor")
    assert bool(((b[..., 0] >= taylor.amin(-1) - 1e-6) & (b[..., 0] <= taylor.amax(-1) + 1e-6)).all())
    assert float((b - jensen_bias(q, kq, "per_channel")).abs().max()) > 1e-3


def test_head_mean_gives_attention_back_on_spread_keys():
    g = torch.Generator().manual_seed(5)
    spec = QuantSpec(bits=2, group_size=32, rotation="hadamard", seed=5)
    k, v = torch.randn(1, 4, 384, 64, generator=g), torch.randn(1, 4, 384, 64, generator=g)
    q, kc, vc = (torch.randn(1, 4, 48, 64, generator=g) for _ in range(3))
    kq = quantize(k, spec)
    off = attention_shift(q, k, v, kc, vc, kq, v, "off").delta_ps.mean()
    hm = attention_shift(q, k, v, kc, vc, kq, v, "head_mean", guard=True).delta_ps.mean()
    assert float(off) > 0.01 and abs(float(hm)) < 0.3 * float(off)
