"""Outputs of the corrected attention with as many K/V heads as query heads and no context tokens, for a fixed
set of seeded inputs: what ``tests/data/mha_outputs.safetensors`` holds from the code before grouped-query attention.

``mha_outputs()`` uses only the API that existed then (``cached_attention``, ``ChunkCache.attend``, ``jensen_bias``,
``attention_shift``), so the same function runs against either version of the pack. The data file was made by
running it against commit d7cce09 (before GQA and context tokens) on this project's development machine::

    PYTHONPATH=<checkout at d7cce09> python -c "import sys; sys.path.insert(0, 'tests'); \\
        from support.mha_cases import record; record('tests/data/mha_outputs.safetensors')"

RTN only: QVG's outputs changed on purpose when its k-means became seeded per head (CHANGELOG).
"""

from __future__ import annotations

import torch

MODES = ("taylor", "chunk_mean", "exact", "per_channel", "off")


def mha_outputs() -> dict[str, torch.Tensor]:
    from jensen_core import CacheEntry, ChunkCache, QuantSpec, attention, cached_attention, jensen_bias, quantize
    from jensen_core.attention_shift import attention_shift
    from jensen_core.quant import cat_quantized
    from jensen_core.tiers import AgeTiers

    out: dict[str, torch.Tensor] = {}
    saved = attention._FORCE_CONCAT
    try:
        for dtype in (torch.float32, torch.bfloat16):
            for rotation in ("none", "hadamard"):
                g = torch.Generator().manual_seed(11)
                spec = QuantSpec(bits=2, group_size=32, rotation=rotation, seed=3)
                ks = [torch.randn(1, 2, 10, 64, generator=g) * 2 for _ in range(3)]
                vs = [torch.randn(1, 2, 10, 64, generator=g) for _ in range(3)]
                entries = [CacheEntry(quantize(k.to(dtype), spec), quantize(v.to(dtype), spec)) for k, v in zip(ks, vs)]
                q = (torch.randn(1, 2, 4, 64, generator=g) * 2).to(dtype)
                kc, vc = (torch.randn(1, 2, 5, 64, generator=g).to(dtype) for _ in range(2))
                name = f"{str(dtype).removeprefix('torch.')}.{rotation}"
                for path in ("streamed", "buffer"):
                    attention._FORCE_CONCAT = path == "buffer"
                    for mode in MODES:
                        out[f"attend.{name}.{path}.{mode}"] = cached_attention(q, kc, vc, entries, mode, 0.7)
                    out[f"offsets.{name}.{path}"] = cached_attention(
                        q, kc, vc, entries, "taylor", 0.7, key_log_offsets=[0.5, ((4, 0.0), (6, -1.0)), None]
                    )
                attention._FORCE_CONCAT = saved
                cache = ChunkCache(
                    QuantSpec(bits=2, rotation=rotation),
                    QuantSpec(bits=4, rotation=rotation),
                    window_chunks=2,
                    sink_chunks=1,
                    tiers=AgeTiers(recent_bits=4, recent_chunks=1, sink_bits=8),
                )
                for k, v in zip(ks + ks[:1], vs + vs[:1]):
                    cache.append(k.to(dtype), v.to(dtype))
                for mode in ("taylor", "chunk_mean", "off"):
                    out[f"cache.{name}.{mode}"] = cache.attend(q, kc, vc, mode)
                if dtype == torch.float32:
                    kq, vq = cat_quantized([e.k for e in entries]), cat_quantized([e.v for e in entries])
                    for mode in MODES[:4]:
                        out[f"bias.{rotation}.{mode}"] = jensen_bias(q, kq, mode, chunk_tokens=[10, 10, 10])
                    st = attention_shift(
                        q, torch.cat(ks, -2), torch.cat(vs, -2), kc, vc, kq, vq, "taylor", chunk_tokens=[10] * 3
                    )
                    out[f"shift.{rotation}"] = torch.cat([st.delta_ps, st.jsd, torch.tensor([st.output_mse])])
    finally:
        attention._FORCE_CONCAT = saved
    return {k: v.contiguous() for k, v in out.items()}


def record(path: str) -> None:
    """Write :func:`mha_outputs` with the machine's CPU class and torch version (tests/test_gqa.py compares within float32
    rounding: another machine's kernels round otherwise)."""
    from safetensors.torch import save_file

    from jensen_core.cpu import cpu_class

    save_file(mha_outputs(), path, metadata={"cpu_class": cpu_class(), "torch": torch.__version__})
