"""QVG's auto K (qvg_centroids=0, the default): K picked from the chunk's tokens, counted to the byte."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jensen_core import ChunkCache, QuantSpec, quantize
from jensen_core.geometry import LatentGeometry
from jensen_core.methods import method_of
from jensen_core.planner import CachePrecision, CacheShape, plan_cache
from jensen_core.spec import qvg_auto_centroids

AUTO = dict(method="qvg", bits=2, group_size=16)


def test_auto_k_scales_qvgs_centroid_budget_to_the_chunk():
    # QVG's own setting: 256 centroids on a 12,150-token MAGI-1 chunk; Wan 480p: 1,560 tokens per latent frame
    assert [qvg_auto_centroids(t) for t in (12150, 4680, 1560, 192, 64, 47, 1)] == [256, 98, 32, 4, 1, 1, 1]
    assert qvg_auto_centroids(10**6) == 256  # at most one uint8 id's worth
    assert qvg_auto_centroids(4680, stages=2) == 49  # S tables share the budget
    with pytest.raises(ValueError, match="tokens >= 1"):
        qvg_auto_centroids(0)
    spec = QuantSpec(method="qvg", bits=2, group_size=64)
    assert spec.qvg_centroids == 0
    q = method_of(spec)
    assert q.centroids_per_chunk(spec, 4680) == 98 and q.centroids_per_chunk(spec, 192) == 4
    # Wan 480p, 3 latent frames per chunk, QVG's B = 64: 2 + 24/64 + 8/128 + 16 * 98 / 4680
    assert q.effective_bits_for(spec, 128, 4680) == pytest.approx(2.375 + 0.0625 + 16 * 98 / 4680)
    for t in (192, 1560, 4680, 12150):  # the centroids stay within QVG's 16 * 256 / 12150 bits per element
        cb = q.bits_breakdown(spec, 128, t)
        assert 0.25 < cb["centroid_bits"] <= 16 * 256 / 12150 + 1e-12
        assert cb["centroids"] == qvg_auto_centroids(t) and cb["auto_centroids"] is True
    assert q.bits_breakdown(spec, 128)["centroids"] is None  # auto without the chunk: not known yet
    fixed = QuantSpec(method="qvg", bits=2, group_size=64, qvg_centroids=256)
    assert q.bits_breakdown(fixed, 128)["centroids"] == 256 and q.centroids_per_chunk(fixed, 4680) == 256


def test_auto_k_describes_itself_and_reports_the_k_used():
    spec = QuantSpec(method="qvg", bits=2, group_size=64, rotation="hadamard")
    q = method_of(spec)
    assert q.scheme(spec) == "QVG+QuaRot S1 Kauto" and "K=auto" in q.knobs_text(spec)
    report = {"qvg_stages": 1, **q.report_fields(spec), **q.report_chunk_fields(spec, 4680)}
    assert report["qvg_centroids_used"] == 98
    assert q.report_kind(report, "K INT2/V INT2") == "QVG S=1 K=auto (98 on 4680-token chunks), K INT2/V INT2 residual"
    fixed = QuantSpec(method="qvg", bits=2, group_size=64, qvg_centroids=30)
    r2 = {"qvg_stages": 1, **q.report_fields(fixed), **q.report_chunk_fields(fixed, 4680)}
    assert q.report_kind(r2, "K INT2") == "QVG S=1 K=30, K INT2 residual"


def test_auto_k_quantizes_with_the_k_it_counts():
    x = torch.randn(1, 2, 300, 32, generator=torch.Generator().manual_seed(0))
    spec = QuantSpec(**AUTO)
    qt = quantize(x, spec)
    assert qvg_auto_centroids(300) == 6
    assert qt.segments == ((300, 6),) and qt.centroids.shape == (1, 1, 2, 6, 32)
    assert qt.nbytes == method_of(spec).chunk_nbytes(spec, 2, 300, 32)


def test_old_rtn_dicts_with_the_old_default_k_still_load():
    """Specs saved when K's default was 256 carry qvg_centroids=256 on RTN; a QVG spec keeps its explicit 256."""
    old = QuantSpec(bits=2, group_size=32).to_dict() | {"qvg_centroids": 256}
    assert QuantSpec.from_dict(old) == QuantSpec(bits=2, group_size=32)
    qvg = QuantSpec(method="qvg", qvg_centroids=256)
    assert QuantSpec.from_dict(qvg.to_dict()).qvg_centroids == 256
    auto = QuantSpec(method="qvg")
    assert QuantSpec.from_dict(auto.to_dict()) == auto
    with pytest.raises(ValueError, match="qvg_centroids=17 only apply to method='qvg'"):
        QuantSpec.from_dict(old | {"qvg_centroids": 17})


GEOMETRY = LatentGeometry(patch=(1, 1, 1), latent_channels=4)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    chunks=st.integers(1, 4),
    window=st.integers(0, 3),
    chunk_frames=st.integers(1, 3),
    tokens_per_frame=st.sampled_from([1, 20, 47, 48, 95, 96, 150]),
    stages=st.integers(1, 2),
)
def test_the_planner_counts_auto_k_to_the_byte(chunks, window, chunk_frames, tokens_per_frame, stages):
    """The planner's bytes with auto K equal a real ChunkCache's, for chunks where auto picks 1 to 11 centroids."""
    spec = QuantSpec(**AUTO, qvg_stages=stages)
    head_dim, heads = 32, 2
    plan = plan_cache(
        latent_frames=chunks * chunk_frames,
        latent_height=1,
        latent_width=tokens_per_frame,
        chunk_frames=chunk_frames,
        window_chunks=window,
        write_last=True,
        shape=CacheShape(layers=1, heads=heads, head_dim=head_dim, geometry=GEOMETRY),
        precision=CachePrecision(spec_k=spec, spec_v=spec),
    )
    cache = ChunkCache(spec, spec, window_chunks=window)
    tokens = chunk_frames * tokens_per_frame
    gen = torch.Generator().manual_seed(tokens)
    peak = 0
    for _ in range(chunks):
        k, v = (torch.randn(1, heads, tokens, head_dim, generator=gen) for _ in range(2))
        cache.append(k, v)
        peak = max(peak, cache.nbytes)
    assert plan.quantized_bytes == peak
    assert all(e.k.segments == ((tokens, min(qvg_auto_centroids(tokens, stages), tokens)),) for e in cache.entries)


def test_the_auto_k_table_in_the_docs_is_what_the_benchmark_prints():
    import importlib.util
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("qvg_bench_auto_k", root / "benchmarks" / "qvg.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    table = mod.auto_k_table()
    assert "| Wan 480p, 3 latent frames (Self-Forcing) | 4,680 | 98 | 0.335 | 3.148 | 2.773 | 2.585 |" in table
    docs = (root / "docs" / "qvg.md").read_text()
    assert "\n".join(table) in docs
