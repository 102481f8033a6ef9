"""The fused Triton kernel compiled for a GPU (jensen_core/triton_kernel.py): skipped without CUDA.

The interpreter tests (tests/test_triton_kernel.py) prove the kernel's arithmetic on the CPU; these run the
compiled kernel, the half-precision dots and the layout choice where a GPU is lent (``benchmarks/gpu.py`` runs
the CUDA-marked tests). Not run in the interpreter: under ``TRITON_INTERPRET`` the kernel refuses CUDA tensors.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from jensen_core import CacheEntry, QuantSpec, cached_attention, jensen_bias, quantize
from jensen_core import attention as attention_mod
from jensen_core import triton_kernel as tk
from jensen_core.correction_layouts import Layout
from jensen_core.quant import cat_quantized

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.triton,
    pytest.mark.skipif(not tk.available("cuda"), reason="needs a CUDA device and triton (CPU-only machine)"),
]
TOL = {torch.float32: 1e-4, torch.bfloat16: 3e-2, torch.float16: 1e-2}


def _reference(q, kq, v, correction, strength):
    k_hat, v_hat = kq.dequantize(torch.float64), v.dequantize(torch.float64)
    b = jensen_bias(q.float(), kq, correction).double()
    s = q.double() @ k_hat.transpose(-1, -2) / math.sqrt(q.shape[-1]) - strength * b
    return torch.softmax(s, -1) @ v_hat, torch.logsumexp(s, -1)


@pytest.mark.parametrize("dtype", list(TOL))
def test_compiled_kernel_equals_float64(dtype):
    dev = torch.device("cuda")
    assert tk.layout_check(dev, dtype, 128, 4)
    gen = torch.Generator().manual_seed(0)
    for bits, rotation, correction in itertools.product((2, 3, 4, 8), ("none", "hadamard"), tk.CORRECTIONS):
        spec = QuantSpec(bits=bits, group_size=32, rotation=rotation)
        q = (torch.randn(2, 4, 200, 128, generator=gen) * 2).to(dev, dtype)
        kq = quantize(torch.randn(2, 4, 300, 128, generator=gen).to(dev) * 2, spec)
        vq = quantize(torch.randn(2, 4, 300, 128, generator=gen).to(dev), spec)
        out, lse = tk.triton_attend_chunk(q, kq, vq, correction, 0.8)
        ref_out, ref_lse = _reference(q, kq, vq, correction, 0.8)
        tol = TOL[dtype]
        torch.testing.assert_close(out.double(), ref_out, rtol=tol, atol=tol, msg=f"{bits} {rotation} {correction}")
        torch.testing.assert_close(lse.double(), ref_lse, rtol=tol, atol=tol, msg=f"{bits} {rotation} {correction}")


def test_attention_through_the_compiled_kernel(monkeypatch):
    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(1)
    spec = QuantSpec(bits=2, group_size=32, rotation="hadamard")
    entries = [
        CacheEntry(quantize(torch.randn(1, 4, 256, 128, generator=gen).to(dev) * 2, spec),
                   quantize(torch.randn(1, 4, 256, 128, generator=gen).to(dev), spec))
        for _ in range(3)
    ]  # fmt: skip
    q, kc, vc = (torch.randn(1, 4, 256, 128, generator=gen).to(dev) for _ in range(3))
    monkeypatch.setattr(attention_mod, "taylor_layout", lambda *a, **k: Layout("triton", 128))
    out = cached_attention(q, kc, vc, entries, "taylor", 0.9)
    kq = cat_quantized([e.k for e in entries])
    k_hat, v_hat = kq.dequantize(torch.float64), cat_quantized([e.v for e in entries]).dequantize(torch.float64)
    b = jensen_bias(q, kq, "taylor", chunk_tokens=[e.tokens for e in entries]).double()
    qd = q.double()
    s = torch.cat([qd @ k_hat.mT / math.sqrt(128) - 0.9 * b, qd @ kc.double().mT / math.sqrt(128)], -1)
    ref = torch.softmax(s, -1) @ torch.cat([v_hat, vc.double()], -2)
    torch.testing.assert_close(out.double(), ref, rtol=1e-3, atol=1e-3)
