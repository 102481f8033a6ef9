"""Krea Realtime's kv_cache_attention_bias as per-chunk log-offsets, against a dense float64 reference.

The reference is written from scope's ``causal_model.py`` (commit 68b0f95): over the attended window
[cached frames, current block], ``score_mod`` adds ``log(bias)`` where ``frame_seqlen <= kv_idx <
cache_current_block_start`` - every cached key except the window's first frame, never the current
block - then softmax. Here the Jensen correction (taylor, chunk_mean, off) is subtracted in the same
scores, all materialised in float64.
"""

from __future__ import annotations

import math

import pytest
import torch

from jensen_core import CacheEntry, QuantSpec, attention, cached_attention, jensen_bias, quantize
from jensen_core.bias import (
    KREA_ATTENTION_BIAS,
    attention_bias_offsets,
    check_attention_bias,
    query_group_norms,
    taylor_weights,
)
from jensen_core.hadamard import rotate
from jensen_core.quant import cat_quantized

TPF = 6  # tokens per latent frame
FRAMES = (3, 3, 2)  # cached chunks of 3, 3 and 2 frames: the last is shorter
D, G_SIZE = 64, 32


def _setup(rotation="hadamard", seed=0, B=1, H=2, quantized=True):
    gen = torch.Generator().manual_seed(seed)
    spec = QuantSpec(bits=2, group_size=G_SIZE, rotation=rotation, seed=seed)
    ks = [torch.randn(B, H, f * TPF, D, generator=gen) * 2 for f in FRAMES]
    vs = [torch.randn(B, H, f * TPF, D, generator=gen) for f in FRAMES]
    if quantized:
        entries = [CacheEntry(quantize(k, spec), quantize(v, spec)) for k, v in zip(ks, vs)]
    else:
        entries = [CacheEntry(k, v) for k, v in zip(ks, vs)]
    q = torch.randn(B, H, 3 * TPF, D, generator=gen) * 2
    kc = torch.randn(B, H, 3 * TPF, D, generator=gen)
    vc = torch.randn(B, H, 3 * TPF, D, generator=gen)
    return entries, q, kc, vc


def _dequant(t):
    return t.double() if isinstance(t, torch.Tensor) else t.dequantize(torch.float64)


def _krea_reference(entries, q, kc, vc, mode, strength, bias, exempt=TPF, bias_current=False):
    """softmax(QK^T/sqrt(d) - lambda B + log(bias) mask) V in float64, the mask as scope's score_mod builds it."""
    k_hat = torch.cat([_dequant(e.k) for e in entries], -2)
    v_hat = torch.cat([_dequant(e.v) for e in entries], -2)
    n_cached = k_hat.shape[-2]
    qd = q.double()
    s_cached = qd @ k_hat.transpose(-1, -2) / math.sqrt(D)
    if mode != "off":
        k0 = entries[0].k
        qr = rotate(qd, k0.spec.seed) if k0.spec.rotation == "hadamard" else qd
        nu = query_group_norms(qr, G_SIZE).double()
        ws = [taylor_weights(e.k.step_sizes(), D).double() for e in entries]
        if mode == "chunk_mean":
            ws = [w.mean(-2, keepdim=True).expand_as(w) for w in ws]
        s_cached = s_cached - strength * (nu @ torch.cat(ws, -2).transpose(-1, -2))
    s = torch.cat([s_cached, qd @ kc.double().transpose(-1, -2) / math.sqrt(D)], -1)
    # scope: cache_len = cached + current block; biased where frame_seqlen <= kv_idx < cache_current_block_start
    cache_len = n_cached + kc.shape[-2]
    current_block_start = cache_len - kc.shape[-2]
    kv_idx = torch.arange(cache_len)
    biased = (kv_idx >= exempt) & (kv_idx < (cache_len if bias_current else current_block_start))
    s = s + torch.where(biased, math.log(bias), 0.0).double()
    return torch.softmax(s, -1) @ torch.cat([v_hat, vc.double()], -2)


@pytest.fixture(params=["streamed", "one-buffer"])
def path(request, monkeypatch):
    monkeypatch.setattr(attention, "_FORCE_CONCAT", request.param == "one-buffer")
    return request.param


def _offsets(entries, bias, exempt=TPF):
    return attention_bias_offsets([e.tokens for e in entries], bias, exempt)


@pytest.mark.parametrize("mode", ["off", "taylor", "chunk_mean"])
@pytest.mark.parametrize("rotation", ["none", "hadamard"])
def test_bias_composes_with_the_correction_as_krea_masks_it(mode, rotation, path):
    entries, q, kc, vc = _setup(rotation)
    out = cached_attention(q, kc, vc, entries, correction=mode, strength=0.7, key_log_offsets=_offsets(entries, 0.3))
    ref = _krea_reference(entries, q, kc, vc, mode, 0.7, 0.3)
    torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("mode", ["off", "taylor", "chunk_mean"])
def test_the_reference_tells_a_dropped_offset_and_a_biased_exempt_frame_apart(mode, path):
    """Negative controls: no offset, the first frame biased, the current block biased - each misses the reference."""
    entries, q, kc, vc = _setup()
    ref = _krea_reference(entries, q, kc, vc, mode, 1.0, 0.3)
    dropped = cached_attention(q, kc, vc, entries, correction=mode)
    first_frame_biased = cached_attention(
        q, kc, vc, entries, correction=mode, key_log_offsets=_offsets(entries, 0.3, exempt=0)
    )
    for wrong in (dropped, first_frame_biased):
        assert float((wrong.double() - ref).abs().max()) > 1e-2
    # and the reference itself moves when the exempt tokens are biased (what scope would compute then)
    assert float((_krea_reference(entries, q, kc, vc, mode, 1.0, 0.3, exempt=0) - ref).abs().max()) > 1e-2
    assert float((_krea_reference(entries, q, kc, vc, mode, 1.0, 0.3, bias_current=True) - ref).abs().max()) > 1e-2


def test_exact_mode_and_full_precision_caches_take_the_offsets_too():
    entries, q, kc, vc = _setup()
    exact_biased = cached_attention(q, kc, vc, entries, correction="exact", key_log_offsets=_offsets(entries, 0.5))
    # the reference with the exact bias (Eq. 12) materialised by jensen_bias
    k_all = cat_quantized([e.k for e in entries])
    b = jensen_bias(q, k_all, "exact").double()
    k_hat, v_hat = k_all.dequantize(torch.float64), cat_quantized([e.v for e in entries]).dequantize(torch.float64)
    n = k_hat.shape[-2]
    s = torch.cat([q.double() @ k_hat.transpose(-1, -2) / 8 - b, q.double() @ kc.double().transpose(-1, -2) / 8], -1)
    s[..., TPF:n] += math.log(0.5)
    ref = torch.softmax(s, -1) @ torch.cat([v_hat, vc.double()], -2)
    torch.testing.assert_close(exact_biased.double(), ref, rtol=1e-4, atol=2e-5)
    assert float((cached_attention(q, kc, vc, entries, correction="exact").double() - ref).abs().max()) > 1e-2
    full, q, kc, vc = _setup(quantized=False)
    out = cached_attention(q, kc, vc, full, correction="taylor", key_log_offsets=_offsets(full, 0.5))
    torch.testing.assert_close(out.double(), _krea_reference(full, q, kc, vc, "off", 1.0, 0.5), rtol=1e-4, atol=2e-5)


def test_bias_one_adds_nothing_and_costs_no_split():
    entries, q, kc, vc = _setup()
    assert _offsets(entries, 1.0) is None
    plain = cached_attention(q, kc, vc, entries, correction="taylor")
    zeros = cached_attention(q, kc, vc, entries, correction="taylor", key_log_offsets=[0.0, None, ((2 * TPF, 0.0),)])
    torch.testing.assert_close(plain, zeros, rtol=0, atol=0)


def test_offsets_cover_every_cached_key_but_the_first_frame():
    assert attention_bias_offsets([18, 18, 12], 0.3, 6) == [
        ((6, 0.0), (12, math.log(0.3))),
        ((18, math.log(0.3)),),
        ((12, math.log(0.3)),),
    ]
    # a first chunk shorter than the exempt frame: the exemption runs on into the next chunk
    assert attention_bias_offsets([4, 8], 0.5, 6) == [((4, 0.0),), ((2, 0.0), (6, math.log(0.5)))]
    assert KREA_ATTENTION_BIAS == 0.3


@pytest.mark.parametrize("bad", [0.0, -0.3, 1.5, float("nan"), True, "0.3"])
def test_bad_bias_values_name_the_range(bad):
    with pytest.raises(ValueError, match="kv_cache_attention_bias=.*from 0.01 to 1"):
        check_attention_bias(bad)


def test_bad_offsets_are_clear_errors():
    entries, q, kc, vc = _setup()
    with pytest.raises(ValueError, match="3 chunks"):
        cached_attention(q, kc, vc, entries, key_log_offsets=[0.0])
    with pytest.raises(ValueError, match="must add up to 18"):
        cached_attention(q, kc, vc, entries, key_log_offsets=[((5, 0.0),), None, None])
    with pytest.raises(ValueError, match="finite log-offset"):
        cached_attention(q, kc, vc, entries, key_log_offsets=[((18, float("-inf")),), None, None])


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (CPU-only machine)")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_every_cuda_layout_takes_the_offsets(monkeypatch, dtype):
    """pad, split and flex (FlexAttention's score_mod on a slice of W) each give scope's biased attention."""
    from jensen_core import correction_layouts as cl

    entries, q, kc, vc = _setup()
    dev = torch.device("cuda")
    moved = [CacheEntry(*(quantize(t.dequantize().to(dev), e.k.spec) for t in (e.k, e.v))) for e in entries]
    back = [CacheEntry(*(quantize(t.dequantize(), e.k.spec) for t in (e.k, e.v))) for e in entries]
    ref = _krea_reference(back, q, kc, vc, "taylor", 1.0, 0.3)
    G = D // G_SIZE
    layouts = [lay for lay in cl.candidate_layouts(dev, dtype, D, G) if cl._layout_ok(lay, dev, dtype, D, G)]
    assert layouts
    for layout in layouts:
        monkeypatch.setattr(attention, "taylor_layout", lambda *a, layout=layout, **k: layout)
        out = cached_attention(
            *(t.to(dev, dtype) for t in (q, kc, vc)), moved, "taylor", key_log_offsets=_offsets(moved, 0.3)
        )
        err = float((out.double().cpu() - ref).abs().max())
        assert err < 3e-2, f"{layout}: max error {err}"
