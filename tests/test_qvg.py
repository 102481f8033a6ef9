"""QVG (k-means smoothing + progressive residual quantization) as a cache method, and the Jensen correction on it."""

import json
import math

import pytest
import torch

import jensen_core.attention as attention
from jensen_core import CacheEntry, ChunkCache, QuantSpec, cached_attention, jensen_bias, quantize, rotate
from jensen_core.methods import method_of
from jensen_core.planner import CachePrecision, CacheShape, LatentGeometry
from jensen_core.quant import QuantizedTensor, cat_quantized
from jensen_core.qvg import QVGTensor, kmeans
from jensen_testing.planning import plan_video

QVG = dict(method="qvg", bits=2, group_size=32, qvg_centroids=8)


def _clustered(seed, B=1, H=2, T=96, D=64, clusters=6, spread=0.3, offset=3.0):
    """Tokens around a few centers per head, as video tokens of one object are: what QVG exploits."""
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(B, H, clusters, D, generator=g) * offset
    which = torch.randint(0, clusters, (B, H, T), generator=g)
    x = torch.gather(centers, 2, which.unsqueeze(-1).expand(B, H, T, D))
    return x + spread * torch.randn(B, H, T, D, generator=g)


# ------------------------------------------------------------------------------------------- spec
def test_spec_defaults_stay_rtn_and_validate_the_qvg_fields():
    assert (QuantSpec().method, QuantSpec().qvg_stages, QuantSpec().qvg_centroids, QuantSpec().qvg_iters) == (
        "rtn",
        1,
        0,  # auto K
        2,
    )
    for kw, words in (
        (dict(method="vq"), "method='vq' is not supported; use one of ('rtn', 'qvg')"),
        (dict(method="qvg", qvg_stages=0), "qvg_stages=0 must be a whole number from 1 to 8"),
        (dict(method="qvg", qvg_centroids=257), "qvg_centroids=257 must be a whole number from 0 to 256 (0 = auto"),
        (dict(method="qvg", qvg_iters=True), "qvg_iters=True must be a whole number"),
        (dict(method="qvg", qvg_centroids=-1), "qvg_centroids=-1 must be a whole number from 0 to 256"),
        (dict(qvg_centroids=64), "qvg_centroids=64 only apply to method='qvg'"),
    ):
        with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
            QuantSpec(**kw)


def test_spec_dict_round_trip_and_old_dicts_load_as_rtn():
    s = QuantSpec(
        bits=3, group_size=16, rotation="hadamard", seed=4, method="qvg", qvg_stages=2, qvg_centroids=17, qvg_iters=5
    )
    assert QuantSpec.from_dict(json.loads(json.dumps(s.to_dict()))) == s
    old = {
        "bits": 2,
        "group_size": 32,
        "rotation": "none",
        "scale_format": "fp8_e4m3",
        "zero_format": "bf16",
        "seed": 0,
    }
    assert QuantSpec.from_dict(old) == QuantSpec()
    with pytest.raises(ValueError, match="unknown QuantSpec field"):
        QuantSpec.from_dict({**old, "centroids": 4})


def test_effective_bits_count_residual_ids_and_centroids():
    # QVG's default S=1, B=64, K=256 on a MAGI-1 chunk (6 latent frames x 45 x 45 tokens at 720x720):
    # 2 + 24/64 (this pack's asymmetric residual: FP8 step + BF16 zero) + 8/128 (ids) + 16*256/12150
    s = QuantSpec(method="qvg", bits=2, group_size=64, qvg_centroids=256)
    assert s.effective_bits == 2.375  # the residual's part, as for RTN
    assert method_of(s).effective_bits_for(s, 128, 12150) == pytest.approx(2.375 + 0.0625 + 16 * 256 / 12150)
    assert method_of(s).effective_bits_for(s, 128, 100) == pytest.approx(
        2.375 + 0.0625 + 16
    )  # K > tokens: min(K, T) = T centroids
    r = QuantSpec(bits=2, group_size=32)
    assert method_of(r).effective_bits_for(r, 128, 7) == r.effective_bits == 2.75


# ----------------------------------------------------------------------------------------- k-means
def test_kmeans_converges_to_a_lloyd_fixed_point_and_is_seeded():
    x = _clustered(0, H=3, T=120, clusters=5, spread=0.3, offset=4.0).flatten(0, 1)
    ids, c, iters = kmeans(x, 6, iters=100, generator=torch.Generator().manual_seed(1))
    assert c.shape == (3, 6, 64) and ids.shape == (3, 120) and iters < 100
    # a fixed point: every token sits with its nearest centroid, every centroid is its members' mean
    assert torch.equal(ids, torch.cdist(x, c).argmin(-1))
    for r in range(3):
        for j in ids[r].unique().tolist():
            torch.testing.assert_close(c[r, j], x[r][ids[r] == j].mean(0), atol=1e-5, rtol=1e-5)
    resid = (x - torch.gather(c, 1, ids.unsqueeze(-1).expand(-1, -1, 64))).square().sum()
    assert resid < 0.2 * (x - x.mean(1, keepdim=True)).square().sum()
    again = kmeans(x, 6, iters=100, generator=torch.Generator().manual_seed(1))
    assert torch.equal(again[0], ids) and torch.equal(again[1], c)
    other = kmeans(x, 6, iters=1, generator=torch.Generator().manual_seed(2))
    assert not torch.equal(other[1], kmeans(x, 6, iters=1, generator=torch.Generator().manual_seed(1))[1])


def test_kmeans_stops_at_the_iteration_bound_or_when_assignments_settle():
    x = _clustered(1, T=200, clusters=12, spread=1.0).flatten(0, 1)
    assert kmeans(x, 12, iters=1, generator=torch.Generator().manual_seed(0))[2] == 1
    _, _, n = kmeans(x, 12, iters=500, generator=torch.Generator().manual_seed(0))
    assert 2 <= n < 500  # converged (no token changed) long before the bound


def test_kmeans_with_fewer_tokens_than_centroids_makes_every_token_a_centroid():
    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(2))
    ids, c, _ = kmeans(x, 256, iters=3, generator=torch.Generator().manual_seed(0))
    assert c.shape == (2, 5, 16)
    torch.testing.assert_close(torch.gather(c, 1, ids.unsqueeze(-1).expand(-1, -1, 16)), x)
    assert all(sorted(r.tolist()) == list(range(5)) for r in ids)


def test_kmeans_stage_never_increases_the_residual_energy():
    """Cluster means minimise the within-cluster energy, so each PRQ stage can only shrink the residual."""
    x = _clustered(3, T=160, clusters=10, spread=1.0).flatten(0, 1)
    res = x
    energies = [float(res.square().sum())]
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):
        ids, c, _ = kmeans(res, 8, iters=4, generator=gen)
        res = res - torch.gather(c, 1, ids.unsqueeze(-1).expand(-1, -1, 64))
        energies.append(float(res.square().sum()))
    assert all(b <= a * (1 + 1e-6) for a, b in zip(energies, energies[1:])), energies
    assert energies[1] < 0.5 * energies[0]


# ------------------------------------------------------------------------------------------ tensor
@pytest.mark.parametrize("rotation", ["none", "hadamard"])
@pytest.mark.parametrize("stages", [1, 2])
def test_error_is_the_residual_rtn_error_only(rotation, stages):
    """Centroids are exact as stored: |x_hat - x| <= Delta/2 of the residual, element-wise, in the codes' space."""
    spec = QuantSpec(**{**QVG, "rotation": rotation, "qvg_stages": stages, "seed": 3})
    x = _clustered(4)
    qt = quantize(x, spec)
    assert (
        isinstance(qt, QVGTensor) and isinstance(qt.residual, QuantizedTensor) and not isinstance(qt, QuantizedTensor)
    )
    xr = rotate(x, 3) if rotation == "hadamard" else x
    diff = qt.dequantize(torch.float32, rotated=True) - xr
    half = qt.step_sizes().repeat_interleave(32, -1) / 2
    assert (diff.abs() <= half * (1 + 1e-5) + 1e-6).all()
    # back in the model's space the error is the same vector, rotated back (same norm per token)
    torch.testing.assert_close((qt.dequantize(torch.float32) - x).norm(dim=-1), diff.norm(dim=-1), atol=1e-4, rtol=1e-4)
    # and the steps really are the residual's: much finer than RTN's on the same keys
    assert (
        qt.step_sizes().mean()
        < 0.3 * quantize(x, QuantSpec(bits=2, group_size=32, rotation=rotation, seed=3)).step_sizes().mean()
    )
    assert qt.stages == stages and qt.centroids.dtype == torch.bfloat16 and qt.ids.dtype == torch.uint8


def test_nbytes_is_what_is_stored_and_what_the_spec_predicts():
    spec = QuantSpec(method="qvg", bits=3, group_size=16, qvg_stages=2, qvg_centroids=20)
    for T in (96, 7):  # 7 < K: min(K, T) centroids
        x = torch.randn(2, 3, T, 64, generator=torch.Generator().manual_seed(T))
        qt = quantize(x, spec)
        k = min(20, T)
        assert qt.centroids.shape == (2, 2, 3, k, 64) and qt.ids.shape == (2, 2, 3, T)
        parts = (qt.residual.packed, qt.residual.scale, qt.residual.minimum, qt.centroids, qt.ids)
        assert (
            qt.nbytes
            == sum(t.numel() * t.element_size() for t in parts)
            == method_of(spec).chunk_nbytes(spec, 6, T, 64)
        )
        assert qt.effective_bits == pytest.approx(method_of(spec).effective_bits_for(spec, 64, T))


def test_fewer_tokens_than_centroids_reconstructs_from_the_centroids():
    x = torch.randn(1, 2, 3, 32, generator=torch.Generator().manual_seed(5)) * 4
    qt = quantize(x, QuantSpec(method="qvg", bits=2, group_size=8, qvg_centroids=256))
    # every token is its own BF16 centroid; the residual is only the BF16 rounding
    torch.testing.assert_close(qt.dequantize(torch.float32), x, atol=0.05, rtol=0.01)
    assert float(qt.step_sizes().max()) < 0.05


def test_same_seed_same_bytes_other_seed_other_init():
    x = _clustered(6, T=128, clusters=12, spread=1.0)
    a, b = quantize(x, QuantSpec(**QVG, seed=1)), quantize(x, QuantSpec(**QVG, seed=1))
    assert (
        torch.equal(a.ids, b.ids)
        and torch.equal(a.centroids, b.centroids)
        and torch.equal(a.residual.packed, b.residual.packed)
    )
    c = quantize(x, QuantSpec(**QVG, seed=2))
    assert not torch.equal(a.ids, c.ids)


def test_indexing_flattening_and_concatenation_keep_each_chunks_centroids():
    spec = QuantSpec(**QVG, rotation="hadamard")
    parts = [quantize(_clustered(10 + i, B=2, H=3, T=40 + 8 * i), spec) for i in range(3)]
    cat = cat_quantized(parts)
    assert cat.segments == ((40, 8), (48, 8), (56, 8)) and cat.tokens == 144
    full = torch.cat([p.dequantize(torch.float32) for p in parts], dim=-2)
    torch.testing.assert_close(cat.dequantize(torch.float32), full)
    assert cat.nbytes == sum(p.nbytes for p in parts)
    torch.testing.assert_close(cat[1, 2].dequantize(torch.float32), full[1, 2])
    torch.testing.assert_close(cat[:, 1:].flatten_leading().dequantize(torch.float32), full[:, 1:].flatten(0, 1))
    torch.testing.assert_close(cat.step_sizes(), torch.cat([p.step_sizes() for p in parts], dim=-2))
    with pytest.raises(IndexError, match="only its dimensions before"):
        cat[0, 0, 3]
    with pytest.raises(ValueError, match="cannot mix QVG"):
        cat_quantized([parts[0], quantize(_clustered(0, B=2, H=3), QuantSpec(bits=2, group_size=32))])


def test_dequantize_into_a_strided_buffer_as_attention_does():
    qt = quantize(_clustered(7), QuantSpec(**QVG))
    buf = torch.full((1, 2, 96, 72), 7.0)
    qt.dequantize(rotated=True, out=buf[..., :64])
    torch.testing.assert_close(buf[..., :64], qt.dequantize(torch.float32, rotated=True))
    assert (buf[..., 64:] == 7.0).all()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (CPU-only machine)")
def test_cuda_gives_the_cpu_clusters():
    x = _clustered(8, T=256, clusters=8, spread=0.05)
    spec = QuantSpec(**QVG)
    cpu, gpu = quantize(x, spec), quantize(x.cuda(), spec)
    assert gpu.device.type == "cuda" and torch.equal(cpu.ids, gpu.ids.cpu())
    torch.testing.assert_close(cpu.dequantize(torch.float32), gpu.dequantize(torch.float32).cpu(), atol=1e-4, rtol=0)


# ------------------------------------------------------------------------------------------- cache
def test_cache_bytes_and_safetensors_round_trip(tmp_path):
    spec_k = QuantSpec(**QVG, rotation="hadamard", seed=2, qvg_stages=2)
    spec_v = QuantSpec(method="qvg", bits=4, group_size=16, qvg_centroids=5)
    cache = ChunkCache(spec_k, spec_v, window_chunks=3)
    for i in range(4):
        cache.append(_clustered(20 + i, T=48), _clustered(30 + i, T=48))
    assert cache.num_chunks == 3
    assert cache.nbytes == 3 * (
        method_of(spec_k).chunk_nbytes(spec_k, 2, 48, 64) + method_of(spec_v).chunk_nbytes(spec_v, 2, 48, 64)
    )
    path = str(tmp_path / "qvg.safetensors")
    cache.save(path)
    back = ChunkCache(spec_k, spec_v)
    back.load(path)
    assert back.nbytes == cache.nbytes
    for a, b in zip(cache.entries, back.entries):
        for x, y in ((a.k, b.k), (a.v, b.v)):
            assert isinstance(y, QVGTensor) and y.segments == x.segments and y.shape == x.shape
            for name in ("centroids", "ids"):
                assert torch.equal(getattr(x, name), getattr(y, name))
            for name in ("packed", "minimum"):
                assert torch.equal(getattr(x.residual, name), getattr(y.residual, name))
            assert torch.equal(x.residual.scale.view(torch.uint8), y.residual.scale.view(torch.uint8))
    q = torch.randn(1, 2, 48, 64)
    torch.testing.assert_close(back.attend(q, q, q), cache.attend(q, q, q))
    with pytest.raises(ValueError, match="saved with specs"):
        ChunkCache(QuantSpec(bits=2, group_size=32, rotation="hadamard", seed=2), spec_v).load(path)


def _tamper(cache, key, fn):
    sd = cache.state_dict()
    sd[key] = fn(sd[key])
    return sd


@pytest.mark.parametrize(
    "key, fn, words",
    [
        ("chunk0.k.centroids", lambda t: t[..., :-1, :], "centroids is"),
        ("chunk0.k.centroids", lambda t: t.float(), "centroids is"),
        ("chunk0.k.ids", lambda t: t.long(), "ids is"),
        ("chunk0.k.ids", lambda t: torch.full_like(t, 200), "points past its chunk's 8 centroids"),
        ("chunk0.k.ids", lambda t: torch.full_like(t, 8), "points past its chunk's 8 centroids"),  # one past
        ("chunk0.k.packed", lambda t: t.to(torch.int8), "unexpected dtypes"),
    ],
)
def test_load_rejects_tampered_qvg_entries(key, fn, words):
    spec = QuantSpec(**QVG)
    cache = ChunkCache(spec, spec)
    cache.append(_clustered(40, T=32), _clustered(41, T=32))
    with pytest.raises(ValueError, match=words):
        ChunkCache(spec, spec).load_state_dict(_tamper(cache, key, fn))
    sd = cache.state_dict()
    del sd["chunk0.v.ids"]
    with pytest.raises(ValueError, match="chunk0.v.ids is missing"):
        ChunkCache(spec, spec).load_state_dict(sd)


def test_a_version_1_file_still_loads():
    spec = QuantSpec(bits=2, group_size=32)
    cache = ChunkCache(spec, None)
    cache.append(*(_clustered(50, T=16) for _ in range(2)))
    sd = cache.state_dict()
    meta = json.loads(bytes(sd["__jensen_kv_meta__"].tolist()).decode())
    meta["version"] = 1
    meta["spec_k"] = {k: v for k, v in meta["spec_k"].items() if not (k == "method" or k.startswith("qvg_"))}
    sd["__jensen_kv_meta__"] = torch.frombuffer(bytearray(json.dumps(meta).encode()), dtype=torch.uint8)
    sd = {k.replace(".minimum", ".zero"): t for k, t in sd.items()}  # versions 1 and 2 named the minima ".zero"
    back = ChunkCache(spec, None)
    back.load_state_dict(sd)
    assert torch.equal(back.entries[0].k.packed, cache.entries[0].k.packed)
    assert torch.equal(back.entries[0].k.minimum, cache.entries[0].k.minimum)


@pytest.mark.parametrize(
    "spec", [QuantSpec(bits=2, group_size=32), QuantSpec(**QVG, rotation="hadamard", qvg_stages=2)]
)
def test_a_version_2_file_loads_bit_exactly_and_a_version_3_name_in_it_is_refused(spec, tmp_path):
    """Version 2 stored each part's grid origins as ``.zero``; version 3 as ``.minimum``. Both load, each by its name."""
    cache = ChunkCache(spec, spec, window_chunks=2)
    for i in range(3):
        cache.append(_clustered(60 + i, T=24), _clustered(70 + i, T=24))
    sd = cache.state_dict()
    meta = json.loads(bytes(sd["__jensen_kv_meta__"].tolist()).decode())
    assert meta["version"] == 3 and "chunk0.k.minimum" in sd and not any(k.endswith(".zero") for k in sd)
    meta["version"] = 2
    old = {k.replace(".minimum", ".zero"): t.clone() for k, t in sd.items()}
    old["__jensen_kv_meta__"] = torch.frombuffer(bytearray(json.dumps(meta).encode()), dtype=torch.uint8)
    path = str(tmp_path / "v2.safetensors")
    from safetensors.torch import save_file

    save_file(old, path, metadata={"format": "jensen_kv_cache", "version": "2"})
    back = ChunkCache(spec, spec, window_chunks=2)
    back.load(path)
    assert back.state_dict().keys() == sd.keys()
    for name, t in back.state_dict().items():
        assert t.dtype == sd[name].dtype and torch.equal(t.view(torch.uint8), sd[name].view(torch.uint8)), name
    q = torch.randn(1, 2, 24, 64, generator=torch.Generator().manual_seed(9))
    assert torch.equal(back.attend(q, q, q), cache.attend(q, q, q))
    # a version 2 record with the new name is not a file any version wrote
    with pytest.raises(ValueError, match=r"chunk0\.k\.zero is missing"):
        ChunkCache(spec, spec, window_chunks=2).load_state_dict({**sd, "__jensen_kv_meta__": old["__jensen_kv_meta__"]})


def test_planner_matches_the_bytes_a_qvg_run_stores():
    layers, branches, heads, D, chunks, window = 2, 2, 2, 64, 5, 3
    spec_k, spec_v = QuantSpec(**QVG, qvg_stages=2), QuantSpec(method="qvg", bits=3, group_size=32, qvg_centroids=30)
    geometry = LatentGeometry(patch=(1, 2, 2), latent_channels=16)
    shape = CacheShape(layers=layers, heads=heads, head_dim=D, geometry=geometry, cfg_branches=branches)
    plan = plan_video((chunks * 3, 2, 8), 3, window, shape, precision=CachePrecision(spec_k=spec_k, spec_v=spec_v))
    T = 3 * plan.tokens_per_latent_frame  # 12 tokens: fewer than spec_v's K=30
    caches = [ChunkCache(spec_k, spec_v, window_chunks=window) for _ in range(layers * branches)]
    peak = 0
    for c in range(chunks - 1):
        for i, cache in enumerate(caches):
            cache.append(_clustered(100 * c + i, H=heads, T=T, D=D), _clustered(7 + 100 * c + i, H=heads, T=T, D=D))
        peak = max(peak, sum(cache.nbytes for cache in caches))
    assert plan.quantized_bytes == peak
    assert plan.effective_bits_k == pytest.approx(method_of(spec_k).effective_bits_for(spec_k, D, T))
    assert any("keeps every token as a BF16 centroid" in w and w.startswith("value cache") for w in plan.warnings)


# ---------------------------------------------------------------------------------------- attention
def _reference(entries, q, k_cur, v_cur, mode, strength):
    kq = cat_quantized([e.k for e in entries])
    k_hat = kq.dequantize(torch.float32)
    v_hat = cat_quantized([e.v for e in entries]).dequantize(torch.float32)
    d = q.shape[-1]
    s_cached = q @ k_hat.transpose(-1, -2) / math.sqrt(d) - strength * jensen_bias(q, kq, mode)
    s = torch.cat([s_cached, q @ k_cur.transpose(-1, -2) / math.sqrt(d)], dim=-1)
    return torch.softmax(s, -1) @ torch.cat([v_hat, v_cur], dim=-2)


@pytest.mark.parametrize("rotation", ["none", "hadamard"])
@pytest.mark.parametrize(
    "mode, strength",
    [("taylor", 1.0), ("taylor", 0.5), ("chunk_mean", 0.7), ("per_channel", 1.0), ("exact", 1.0), ("off", 1.0)],
)
@pytest.mark.parametrize("single_buffer", [False, True])
def test_fast_path_equals_the_materialised_reference_for_qvg(rotation, mode, strength, single_buffer):
    spec = QuantSpec(**QVG, rotation=rotation, seed=5)
    entries = [
        CacheEntry(quantize(_clustered(60 + i, T=40 + 8 * i), spec), quantize(_clustered(70 + i, T=40 + 8 * i), spec))
        for i in range(3)
    ]
    g = torch.Generator().manual_seed(9)
    q, k_cur, v_cur = (torch.randn(1, 2, 24, 64, generator=g) for _ in range(3))
    ref = _reference(entries, q, k_cur, v_cur, mode, strength)
    attention._FORCE_CONCAT = single_buffer
    try:
        out = cached_attention(q, k_cur, v_cur, entries, correction=mode, strength=strength)
    finally:
        attention._FORCE_CONCAT = False
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=2e-5)
    if mode != "off":  # the correction really acted
        assert (out - _reference(entries, q, k_cur, v_cur, "off", 1.0)).abs().max() > 1e-3


def test_bias_uses_the_residual_steps_not_the_keys_range():
    spec = QuantSpec(**QVG)
    kq = quantize(_clustered(80), spec)
    q = torch.randn(1, 2, 5, 64, generator=torch.Generator().manual_seed(1))
    nu = q.reshape(1, 2, 5, 2, 32).square().sum(-1)
    expect = nu @ (kq.residual.step_sizes().square() / (24 * 64)).transpose(-1, -2)
    torch.testing.assert_close(jensen_bias(q, kq, "taylor"), expect)


# ------------------------------------------------------------------------------------ Monte Carlo
def _partition_ratios(spec, trials, bits_qscale):
    """Per trial: mean over queries of Z_hat/Z and Z_corrected/Z for the cached block (fresh keys each trial)."""
    out = []
    for t in range(trials):
        g = torch.Generator().manual_seed(1000 + t)
        x = _clustered(2000 + t, H=1, T=256, clusters=16, spread=0.5, offset=2.0)
        q = torch.randn(1, 1, 32, 64, generator=g) * bits_qscale
        kq = quantize(x, spec)
        s = q @ x.transpose(-1, -2) / 8
        s_hat = q @ kq.dequantize(torch.float32).transpose(-1, -2) / 8
        b = jensen_bias(q, kq, "taylor")
        lz = torch.logsumexp(s, -1)
        out.append(
            [
                float((torch.logsumexp(s_hat, -1) - lz).exp().mean()),
                float((torch.logsumexp(s_hat - b, -1) - lz).exp().mean()),
            ]
        )
    r = torch.tensor(out, dtype=torch.float64)
    return r.mean(0) - 1, r.std(0) / math.sqrt(trials)


@pytest.mark.parametrize("method", ["rtn", "qvg"])
def test_correction_removes_the_partition_sum_bias_monte_carlo(method):
    """INT4 (where the uniform-noise model holds): E[Z_hat/Z] - 1 is tens of standard errors above 0,
    the corrected ratio is within 4 standard errors of 1 - for QVG as for RTN (200 independent trials)."""
    kw = dict(bits=4, group_size=32, method=method) | (dict(qvg_centroids=16) if method == "qvg" else {})
    bias, se = _partition_ratios(QuantSpec(**kw), 200, 4.0)
    assert bias[0] > 10 * se[0], (bias, se)
    assert abs(bias[1]) < 4 * se[1], (bias, se)


@pytest.mark.parametrize("method", ["rtn", "qvg"])
def test_int2_correction_removes_most_of_the_partition_sum_bias(method):
    """INT2: the error is not quite uniform any more, but the correction still removes >= 75% of the bias."""
    kw = dict(bits=2, group_size=32, method=method) | (dict(qvg_centroids=16) if method == "qvg" else {})
    bias, se = _partition_ratios(QuantSpec(**kw), 100, 1.0)
    assert bias[0] > 10 * se[0]
    assert abs(bias[1]) < 0.25 * bias[0], (bias, se)


def test_an_empty_cluster_keeps_its_previous_centroid_and_never_becomes_zero():
    """k-means' update: a centroid no token chose stays where it was (a mean over 0 members would be 0 or NaN)."""
    from jensen_core import qvg

    x = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]])  # (N=1, T=3, d=2)
    old = torch.tensor([[[0.0, 0.0], [7.0, -7.0], [9.0, 9.0]]])  # cluster 1 gets no token
    ids = torch.tensor([[0, 0, 2]])
    new = qvg._update(x, ids, old)
    torch.testing.assert_close(new[0, 0], torch.tensor([2.0, 3.0]))
    torch.testing.assert_close(new[0, 1], old[0, 1])  # kept, not zero, not NaN
    torch.testing.assert_close(new[0, 2], torch.tensor([5.0, 6.0]))
    # and through kmeans: more centroids than distinct points leaves some empty, none is zero or NaN
    pts = torch.tensor([[[1.0, 1.0]] * 6 + [[-2.0, 3.0]] * 6])
    _, centroids, _ = qvg.kmeans(pts, 4, iters=5)
    assert torch.isfinite(centroids).all() and not (centroids == 0).all(-1).any()
