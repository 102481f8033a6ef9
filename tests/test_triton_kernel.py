"""The fused Triton kernel over the packed cache (jensen_core/triton_kernel.py), run by Triton's interpreter on the CPU.

Every test compares the kernel's (out, lse) with the materialised reference: keys and values dequantized in
float64, the bias of jensen_core.bias.jensen_bias, softmax in float64. Positive controls load mutated copies of
the kernel's source (a correction term dropped, an FP8 or unpacking detail broken) and check that the same
comparison fails. Shapes are tiny: the interpreter runs each program in numpy.

Marker ``triton``; needs the ``triton`` package (in the ``test`` extra): without it these tests skip, and under
``CI=true`` they fail instead.
"""

from __future__ import annotations

import importlib.util
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from support.ci_skips import ci_enabled
from support.gqa_reference import reference_attention

from jensen_core import CacheEntry, QuantSpec, cached_attention, jensen_bias, quantize
from jensen_core import attention as attention_mod
from jensen_core import correction_layouts as layouts
from jensen_core import triton_kernel as tk
from jensen_core.correction_layouts import Layout
from jensen_core.hadamard import rotate, unrotate
from jensen_core.quant import cat_quantized

pytestmark = pytest.mark.triton
ROOT = Path(__file__).resolve().parents[1]
IMPL = ROOT / "jensen_core" / "_triton_impl.py"


def _is_triton_python_module(name: str) -> bool:
    return (name == "triton" or name.startswith("triton.")) and not name.startswith("triton._C")


@pytest.fixture(scope="module", autouse=True)
def interpreter():
    """TRITON_INTERPRET=1 for this module only, with triton's Python modules imported afresh under it.

    Triton decorates its own library functions (``tl.zeros``, ...) when ``triton.language`` is imported, for
    the interpreter or not; torch imports it early (``torch._inductor``, FlexAttention). So the module swaps
    triton's Python modules (not its compiled extension) for fresh ones imported under the interpreter and puts
    the originals back afterwards; the kernel module is loaded per interpreter mode (``triton_kernel._IMPLS``).
    """
    if importlib.util.find_spec("triton") is None:
        if ci_enabled():
            pytest.fail("triton is not installed: CI must run the triton tests (pip install -e '.[test]')")
        pytest.skip("needs the triton package (pip install -e '.[test]')")
    saved = {k: m for k, m in sys.modules.items() if _is_triton_python_module(k)}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRITON_INTERPRET", "1")
        for k in saved:
            del sys.modules[k]
        tk._IMPLS.pop(True, None)
        try:
            import triton.language  # noqa: F401  (fresh, decorated for the interpreter)

            yield
        finally:
            for k in [k for k in sys.modules if _is_triton_python_module(k)]:
                del sys.modules[k]
            sys.modules.update(saved)
            tk._IMPLS.pop(True, None)


def _problem(bits=2, g=32, rotation="none", D=64, B=1, H=2, M=20, N=50, seed=0, k_scale=2.0, v_scale=1.0, **spec_kw):
    """q (B, H, M, D) float32 and the RTN keys and values of one cached chunk of N tokens."""
    gen = torch.Generator().manual_seed(seed)
    spec = QuantSpec(bits=bits, group_size=g, rotation=rotation, seed=seed, **spec_kw)
    q = torch.randn(B, H, M, D, generator=gen) * 2
    k = torch.randn(B, H, N, D, generator=gen) * k_scale
    v = torch.randn(B, H, N, D, generator=gen) * v_scale
    return q, quantize(k, spec), quantize(v, spec)


def _reference(q, kq, v, correction, strength):
    """softmax(q k_hat^T / sqrt(d) - lambda b) v_hat and its log-sum-exp, in float64 (q in the model's space)."""
    D = q.shape[-1]
    k_hat = kq.dequantize(torch.float64)
    v_hat = v.dequantize(torch.float64) if not isinstance(v, torch.Tensor) else v.double()
    b = jensen_bias(q.float(), kq, correction).double()
    s = q.double() @ k_hat.transpose(-1, -2) / math.sqrt(D) - strength * b
    return torch.softmax(s, -1) @ v_hat, torch.logsumexp(s, -1)


def _mismatch(q, kq, v, correction="taylor", strength=0.7, **kw) -> tuple[float, float]:
    """Largest |out - ref| and |lse - ref| of the kernel against the float64 reference."""
    out, lse = tk.triton_attend_chunk(q, kq, v, correction, strength, **kw)
    assert out.shape == q.shape and out.dtype == q.dtype and lse.shape == q.shape[:-1] and lse.dtype == torch.float32
    ref_out, ref_lse = _reference(q, kq, v, correction, strength)
    return float((out.double() - ref_out).abs().max()), float((lse.double() - ref_lse).abs().max())


def _assert_matches(q, kq, v, correction="taylor", strength=0.7, tol=2e-5, **kw):
    d_out, d_lse = _mismatch(q, kq, v, correction, strength, **kw)
    assert d_out < tol and d_lse < tol, (d_out, d_lse)


# ------------------------------------------------------------------------------------------------ correctness
@pytest.mark.parametrize("correction", tk.CORRECTIONS)
@pytest.mark.parametrize("rotation", ["none", "hadamard"])
@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_kernel_equals_the_materialised_reference(bits, rotation, correction):
    """Every bit width the packing has, both rotations, every fused correction: 20 queries (two query blocks, the
    second partly masked) over 50 keys (two key tiles, the second partly masked)."""
    q, kq, vq = _problem(bits=bits, rotation=rotation)
    _assert_matches(q, kq, vq, correction)


def test_the_correction_is_large_enough_to_be_seen():
    """The tests above could not tell a missing correction from a present one if it were tiny: it is not."""
    q, kq, vq = _problem(bits=2)
    _, lse_off = tk.triton_attend_chunk(q, kq, vq, "off")
    for mode in ("taylor", "chunk_mean"):
        _, lse = tk.triton_attend_chunk(q, kq, vq, mode, 0.7)
        assert float((lse_off - lse).abs().min()) > 1e-2, mode


@pytest.mark.parametrize(
    "bits,g,D", [(2, 8, 64), (4, 16, 64), (2, 64, 64), (4, 128, 128), (2, 16, 32), (4, 16, 48), (2, 8, 16)]
)
def test_group_sizes_and_head_dims(bits, g, D):
    """Groups from 8 to 128 channels; head_dims 16 to 128, 48 not a power of two (padded lanes masked)."""
    q, kq, vq = _problem(bits=bits, g=g, D=D)
    _assert_matches(q, kq, vq, "taylor")
    _assert_matches(q, kq, vq, "chunk_mean")


@pytest.mark.parametrize("scale_format", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("zero_format", ["fp16", "fp32"])
def test_step_and_zero_point_formats(scale_format, zero_format):
    q, kq, vq = _problem(bits=2, scale_format=scale_format, zero_format=zero_format)
    assert kq.scale.dtype != torch.float8_e4m3fn and kq.minimum.dtype != torch.bfloat16
    _assert_matches(q, kq, vq, "taylor")


def test_fp8_steps_that_overflow_fall_back_to_bf16():
    """Steps above FP8 E4M3's 448 are stored in BF16 by the quantizer; the kernel reads what was stored."""
    q, kq, vq = _problem(bits=2, k_scale=2000.0, v_scale=2000.0)
    assert kq.scale_format == "bf16" and kq.scale.dtype == torch.bfloat16
    _assert_matches(q * 1e-3, kq, vq, "taylor", tol=1e-6 * 2000 * 10)


def test_subnormal_fp8_steps():
    """Small ranges give FP8 E4M3 subnormal steps (below 2^-6): decoded from their bits in registers."""
    q, kq, vq = _problem(bits=4, k_scale=0.02, v_scale=0.02)
    for t in (kq, vq):
        assert t.scale.dtype == torch.float8_e4m3fn and bool((t.step_sizes() < 2**-6).any())
    _assert_matches(q, kq, vq, "taylor", tol=1e-6)


def test_every_fp8_value_is_decoded_exactly():
    """All 254 finite E4M3 values (subnormals, normals, both signs, 448), one per head, as the step of a one-key
    chunk whose code is 1 and origin 0: the output is that key's value, i.e. the decoded step, bit for bit."""
    from jensen_core.rtn import QuantizedTensor

    finite = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn)
    finite = finite[torch.isfinite(finite.float())]
    n, D = finite.numel(), 16
    kq = QuantizedTensor(
        packed=torch.ones(1, n, 1, D, dtype=torch.uint8),
        scale=finite.reshape(1, n, 1, 1),
        minimum=torch.zeros(1, n, 1, 1, dtype=torch.bfloat16),
        spec=QuantSpec(bits=8, group_size=16),
        shape=torch.Size((1, n, 1, D)),
        dtype=torch.float32,
        scale_format="fp8_e4m3",
    )
    q = torch.zeros(1, n, 1, D)
    q[..., 0] = 1.0  # each head's one score is its step itself
    out, lse = tk.triton_attend_chunk(q, kq, kq, "off", scale=1.0)
    assert n == 254 and torch.equal(out[0, :, 0, :], finite.float()[:, None].expand(n, D))
    assert torch.equal(lse[0, :, 0], finite.float())


def test_half_precision_queries():
    """float16 runs half-precision dots (the GPU's path); bfloat16 float32 dots under the interpreter."""
    q, kq, vq = _problem(bits=2, rotation="hadamard")
    for dtype in (torch.float16, torch.bfloat16):
        qh = q.to(dtype)
        out, lse = tk.triton_attend_chunk(qh, kq, vq, "taylor", 0.7)
        ref_out, ref_lse = _reference(qh.float(), kq, vq, "taylor", 0.7)
        assert out.dtype == dtype
        torch.testing.assert_close(out.double(), ref_out, rtol=2e-2, atol=2e-2)
        torch.testing.assert_close(lse.double(), ref_lse, rtol=2e-2, atol=2e-2)


def test_full_precision_values_and_strided_chunks():
    """Values kept in full precision; keys and values sliced out of bigger tensors (strided, no copy); batch 2."""
    q, kq, vq = _problem(bits=4, rotation="hadamard", B=2, H=3, N=40)
    v = torch.randn(2, 3, 40, 64)
    _assert_matches(q[:, 1:], kq[:, 1:], v[:, 1:], "taylor")
    ks, vs = kq[:, :, 5:33], vq[:, :, 5:33]
    assert not ks.packed.is_contiguous()
    _assert_matches(q, ks, vs, "chunk_mean")


def test_codes_space_leaves_rotations_to_the_caller():
    q, kq, vq = _problem(bits=2, rotation="hadamard")
    out, lse = tk.triton_attend_chunk(q, kq, vq, "taylor")
    out_c, lse_c = tk.triton_attend_chunk(rotate(q, kq.spec.seed), kq, vq, "taylor", codes_space=True)
    torch.testing.assert_close(unrotate(out_c, vq.spec.seed), out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse_c, lse)


def test_no_dequantized_transient_is_allocated():
    """Every tensor created during a call (the interpreter's byte copies of the arguments included) is smaller than
    one side of the chunk dequantized to BF16: the kernel writes its output and LSE only. 8 queries, 64 keys. A view
    (an expanded rotation matrix, say) allocates nothing and is not counted."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Allocations(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.sizes = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if any(r.alias_info is not None for r in func._schema.returns):
                return out  # a view or an in-place result: nothing allocated
            for t in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(t, torch.Tensor):
                    self.sizes.append((str(func), t.numel() * t.element_size()))
            return out

    q, kq, vq = _problem(bits=2, rotation="hadamard", M=8, N=64)
    chunk_side_bf16 = kq.numel * 2
    for codes_space in (True, False):
        tk.triton_attend_chunk(q, kq, vq, "taylor", codes_space=codes_space)  # builds the rotation matrices once
        with Allocations() as seen:
            tk.triton_attend_chunk(q, kq, vq, "taylor", codes_space=codes_space)
        assert seen.sizes and max(n for _, n in seen.sizes) <= chunk_side_bf16 // 4, [
            x for x in seen.sizes if x[1] > 4096
        ]
    with Allocations() as seen:  # positive control: dequantizing the keys first shows up
        tk.triton_attend_chunk(q, kq, kq.dequantize().to(torch.bfloat16), "taylor")
    assert max(n for _, n in seen.sizes) >= chunk_side_bf16


# ------------------------------------------------------------------------------------- the attention path
def _entries(rotation, chunks=3, T=24, D=64, v_bits=2, seed=0):
    gen = torch.Generator().manual_seed(seed)
    spec = QuantSpec(bits=2, group_size=32, rotation=rotation, seed=seed)
    vspec = QuantSpec(bits=v_bits, group_size=32, rotation=rotation, seed=seed)
    entries = [
        CacheEntry(quantize(torch.randn(1, 2, T, D, generator=gen) * 2, spec), quantize(torch.randn(1, 2, T, D), vspec))
        for _ in range(chunks)
    ]
    q = torch.randn(1, 2, T + 3, D, generator=gen) * 2
    return entries, q, torch.randn(1, 2, T, D, generator=gen), torch.randn(1, 2, T, D, generator=gen)


def _window_reference(entries, q, kc, vc, strength):
    D = q.shape[-1]
    kq = cat_quantized([e.k for e in entries])
    k_hat, v_hat = kq.dequantize(torch.float64), cat_quantized([e.v for e in entries]).dequantize(torch.float64)
    b = jensen_bias(q, kq, "taylor", chunk_tokens=[e.tokens for e in entries]).double()
    qd = q.double()
    s = torch.cat([qd @ k_hat.transpose(-1, -2) / math.sqrt(D) - strength * b, qd @ kc.double().mT / math.sqrt(D)], -1)
    return torch.softmax(s, -1) @ torch.cat([v_hat, vc.double()], -2)


@pytest.mark.parametrize("rotation", ["none", "hadamard"])
def test_attention_through_the_triton_layout(rotation, monkeypatch):
    """cached_attention with the layout choice answering "triton": every cached chunk through the kernel, merged."""
    entries, q, kc, vc = _entries(rotation)
    calls = []
    real = attention_mod.triton_attend_chunk
    monkeypatch.setattr(attention_mod, "triton_attend_chunk", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(attention_mod, "taylor_layout", lambda *a, **k: Layout("triton", 64))
    out = cached_attention(q, kc, vc, entries, "taylor", 0.8)
    assert len(calls) == len(entries)
    torch.testing.assert_close(out.double(), _window_reference(entries, q, kc, vc, 0.8), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rotation", ["none", "hadamard"])
@pytest.mark.parametrize("Hq,Hkv,D", [(4, 2, 64), (6, 2, 128)])
def test_gqa_and_context_tokens_through_the_triton_layout(Hq, Hkv, D, rotation, monkeypatch):
    """Grouped-query attention: the kernel reads each K/V head's packed codes once for the query rows of its whole
    group (the query heads folded into rows); context tokens join the merge uncorrected. Against float64."""
    gen = torch.Generator().manual_seed(2)
    spec = QuantSpec(bits=2, group_size=32, rotation=rotation, seed=4)
    entries = [
        CacheEntry(
            quantize(torch.randn(1, Hkv, 20, D, generator=gen) * 2, spec),
            quantize(torch.randn(1, Hkv, 20, D, generator=gen), spec),
        )
        for _ in range(2)
    ]
    q = torch.randn(1, Hq, 6, D, generator=gen) * 2
    kc, vc, kx, vx = (torch.randn(1, Hkv, n, D, generator=gen) for n in (5, 5, 7, 7))
    calls = []
    real = attention_mod.triton_attend_chunk
    monkeypatch.setattr(attention_mod, "triton_attend_chunk", lambda *a, **k: calls.append(a[0].shape) or real(*a, **k))
    monkeypatch.setattr(attention_mod, "taylor_layout", lambda *a, **k: Layout("triton", D))
    out = cached_attention(q, kc, vc, entries, "taylor", 0.8, k_ctx=kx, v_ctx=vx)
    assert calls == [(1, Hkv, 6 * Hq // Hkv, D)] * len(entries)
    ref = reference_attention(q, kc, vc, entries, "taylor", 0.8, kx, vx)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)


def test_krea_offsets_through_the_triton_layout(monkeypatch):
    """Krea's bias: an offset over a whole chunk shifts the kernel's log-sum-exp; a chunk split into runs (its
    spared first frame) goes through a buffer. Both equal the buffered path with the same offsets."""
    entries, q, kc, vc = _entries("hadamard")
    whole = [0.0] + [math.log(0.3)] * (len(entries) - 1)
    split = [[(8, 0.0), (16, math.log(0.3))]] + [math.log(0.3)] * (len(entries) - 1)
    expected = {
        n: cached_attention(q, kc, vc, entries, "taylor", 0.8, key_log_offsets=o)
        for n, o in (("whole", whole), ("split", split))
    }
    calls = []
    real = attention_mod.triton_attend_chunk
    monkeypatch.setattr(attention_mod, "triton_attend_chunk", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(attention_mod, "taylor_layout", lambda *a, **k: Layout("triton", 64))
    out = cached_attention(q, kc, vc, entries, "taylor", 0.8, key_log_offsets=whole)
    assert len(calls) == len(entries)
    torch.testing.assert_close(out, expected["whole"], rtol=1e-5, atol=1e-5)
    calls.clear()
    out = cached_attention(q, kc, vc, entries, "taylor", 0.8, key_log_offsets=split)
    assert calls == []
    torch.testing.assert_close(out, expected["split"], rtol=1e-5, atol=1e-5)


def test_attention_falls_back_to_a_buffer_for_keys_the_kernel_cannot_read(monkeypatch):
    """QVG keys: the triton layout is answered, the chunk goes through a padded buffer instead (same result)."""
    gen = torch.Generator().manual_seed(3)
    spec = QuantSpec(bits=2, group_size=32, method="qvg", qvg_centroids=4)
    entries = [CacheEntry(quantize(torch.randn(1, 2, 16, 64, generator=gen), spec), torch.randn(1, 2, 16, 64))]
    q, kc, vc = (torch.randn(1, 2, 16, 64, generator=gen) for _ in range(3))
    assert tk.unsupported_reason(entries[0].k, entries[0].v)
    expected = cached_attention(q, kc, vc, entries, "taylor")
    monkeypatch.setattr(attention_mod, "taylor_layout", lambda *a, **k: Layout("triton", 64))
    monkeypatch.setattr(attention_mod, "triton_attend_chunk", lambda *a, **k: pytest.fail("kernel called"))
    torch.testing.assert_close(cached_attention(q, kc, vc, entries, "taylor"), expected)


# ------------------------------------------------------------------------------------------ the layout choice
def test_a_cuda_only_candidate_checked_against_float64(monkeypatch):
    """Offered on CUDA where triton runs, never on a CPU (even under the interpreter); its check is float64's."""
    D, G = 64, 2
    cpu = torch.device("cpu")
    assert tk.available(cpu)  # the interpreter is on here
    assert all(lay.kind != "triton" for lay in layouts.candidate_layouts(cpu, torch.float32, D, G))
    monkeypatch.setattr(tk, "available", lambda device=None: True)
    cands = layouts.candidate_layouts(torch.device("cuda"), torch.bfloat16, D, G)
    assert cands[-1] == Layout("triton", D)
    monkeypatch.undo()
    # the check itself, run here on CPU tensors by the interpreter (on CUDA it runs on the GPU)
    assert tk.layout_check(cpu, torch.float32, D, G)
    assert layouts._layout_ok(Layout("triton", D), cpu, torch.float32, D, G)
    assert not tk.layout_check(cpu, torch.float32, D, 3)  # 64 / 3 is no group size


def test_without_the_interpreter_the_cpu_is_refused_clearly(monkeypatch):
    q, kq, vq = _problem()
    monkeypatch.delenv("TRITON_INTERPRET")
    assert not tk.available("cpu")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        tk.triton_attend_chunk(q, kq, vq)


def test_bad_input_is_a_clear_error():
    q, kq, vq = _problem()
    with pytest.raises(ValueError, match="'exact' is not fused"):
        tk.triton_attend_chunk(q, kq, vq, "exact")
    with pytest.raises(ValueError, match="RTN-quantized keys only"):
        tk.triton_attend_chunk(q, kq.dequantize(), vq)
    with pytest.raises(ValueError, match="do not match"):
        tk.triton_attend_chunk(q[:, :1], kq, vq)
    with pytest.raises(ValueError, match="float16/bfloat16/float32"):
        tk.triton_attend_chunk(q.double(), kq, vq)


def test_the_pack_imports_and_attends_without_triton():
    code = (
        "import sys; sys.modules['triton'] = None\n"
        "import torch\n"
        "from jensen_core import CacheEntry, QuantSpec, cached_attention, quantize, triton_kernel\n"
        "from jensen_core import correction_layouts as L\n"
        "assert not triton_kernel.available() and not triton_kernel.available('cpu')\n"
        "assert all(l.kind != 'triton' for l in L.candidate_layouts(torch.device('cuda'), torch.bfloat16, 64, 2))\n"
        "x = torch.randn(1, 2, 8, 64)\n"
        "e = CacheEntry(quantize(x, QuantSpec()), quantize(x, QuantSpec()))\n"
        "print(cached_attention(x, x, x, [e]).shape)\n"
    )
    env = {k: v for k, v in __import__("os").environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0 and "torch.Size([1, 2, 8, 64])" in r.stdout, r.stdout + r.stderr


# ---------------------------------------------------------------------------------------- positive controls
MUTANTS = {
    "taylor term dropped": ("if CORR == 1:", "if CORR == 99:", dict(bits=2), "taylor"),
    "chunk_mean offset dropped": ("lse -= tl.sum(", "lse -= 0.0 * tl.sum(", dict(bits=2), "chunk_mean"),
    "fp8 exponent bias": ("(e + 120) << 23", "(e + 121) << 23", dict(bits=2), "off"),
    "fp8 subnormals": ("0.001953125", "0.00390625", dict(bits=4, k_scale=0.02, v_scale=0.02), "off"),
    "3-bit code across bytes": ("(bit % 8) > 5", "(bit % 8) > 6", dict(bits=3), "off"),
    "group of a channel": ("group = cols // GS", "group = cols // (2 * GS)", dict(bits=4, g=16), "off"),
    "grid origin": ("return origin + code.to(tl.float32) * step", "return code.to(tl.float32) * step", {}, "off"),
    "key mask": ('s = tl.where(nmask[None, :], s, float("-inf"))', "s = s", dict(N=40), "off"),
}


@pytest.mark.parametrize("name", list(MUTANTS))
def test_a_broken_kernel_fails_the_comparison(name, tmp_path, monkeypatch):
    find, replace, problem, correction = MUTANTS[name]
    src = IMPL.read_text()
    assert src.count(find) == 1, f"mutant {name!r} is stale: {find!r} not found once"
    src = src.replace(find, replace)
    path = tmp_path / "_triton_impl_mutant.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(f"jensen_core._triton_impl_mutant_{len(name)}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    q, kq, vq = _problem(**problem)
    _assert_matches(q, kq, vq, correction)  # the real kernel passes on this problem
    monkeypatch.setitem(tk._IMPLS, True, module)
    d_out, d_lse = _mismatch(q, kq, vq, correction)
    assert max(d_out, d_lse) > 1e-3, (name, d_out, d_lse)
