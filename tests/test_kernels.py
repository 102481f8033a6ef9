"""The kernels behind the fast path: CPU class, the per-score correction's layouts and their choice at first use."""

import math

import pytest
import torch

from jensen_core import CacheEntry, QuantSpec, attention, cached_attention, cpu, quantize
from jensen_core import correction_layouts as layouts
from jensen_core.correction_layouts import Layout


def _entries(rotation="hadamard", B=1, H=3, T=40, D=128, chunks=2, seed=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    spec = QuantSpec(bits=2, group_size=32, rotation=rotation, seed=seed)
    entries = [
        CacheEntry(
            quantize(torch.randn(B, H, T, D, generator=gen) * 2, spec),
            quantize(torch.randn(B, H, T, D, generator=gen), spec),
        )
        for _ in range(chunks)
    ]
    q, kc, vc = (torch.randn(B, H, n, D, generator=gen).to(dtype) for n in (T + 3, T, T))
    return entries, q * 2, kc, vc


def _reference(entries, q, kc, vc, mode="taylor", strength=1.0):
    from jensen_core import jensen_bias
    from jensen_core.quant import cat_quantized

    kq = cat_quantized([e.k for e in entries])
    k_hat, v_hat = kq.dequantize(torch.float32), cat_quantized([e.v for e in entries]).dequantize(torch.float32)
    qf = q.float()
    b = jensen_bias(qf, kq, mode, chunk_tokens=[e.tokens for e in entries])
    d = q.shape[-1]
    s = torch.cat(
        [qf @ k_hat.transpose(-1, -2) / math.sqrt(d) - strength * b, qf @ kc.float().transpose(-1, -2) / math.sqrt(d)],
        -1,
    )
    return torch.softmax(s, -1) @ torch.cat([v_hat, vc.float()], -2)


@pytest.fixture
def fresh_choices(monkeypatch):
    """An empty layout cache for the test (the process's real choices stay untouched)."""
    monkeypatch.setattr(layouts, "_LAYOUTS", {})
    return layouts._LAYOUTS


@pytest.mark.parametrize(
    "flags, expected",
    [
        ({"fpu", "avx2", "avx512f", "amx_bf16", "amx_tile"}, "AMX"),
        ({"avx2", "avx512f", "avx512_bf16"}, "AVX-512"),
        ({"sse4_2", "avx2"}, "AVX2"),
        ({"neon", "asimd"}, "other"),
        (set(), "other"),
    ],
)
def test_cpu_class_from_flags(flags, expected):
    assert cpu.cpu_class_from_flags(frozenset(flags)) == expected


def test_this_machines_cpu_class_is_read_from_proc_cpuinfo():
    """The real detection, on the machine that runs the suite: the class its own /proc/cpuinfo flags give."""
    assert cpu.cpu_class() in CPU_CLASSES
    try:
        text = open("/proc/cpuinfo").read()
    except OSError:  # no /proc (macOS): no flags, class "other"
        assert cpu.cpu_class() == "other"
        return
    line = next((x for x in text.splitlines() if x.startswith(("flags", "Features"))), "")
    flags = frozenset(line.split(":", 1)[1].split()) if line else frozenset()
    assert cpu.cpu_flags() == flags
    assert cpu.cpu_class() == cpu.cpu_class_from_flags(flags)


CPU_CLASSES = ("AMX", "AVX-512", "AVX2", "other")


@pytest.mark.parametrize("klass", CPU_CLASSES)
@pytest.mark.parametrize("flex", [True, False], ids=["flex", "no-flex"])
def test_cpu_candidates_follow_the_flash_kernels_needs(monkeypatch, klass, flex):
    """The CPU's candidate layouts for every CPU class the detector can answer (not only this machine's): the padded
    layout first; with AMX, half-precision also tries a width that keeps the flash kernel's 64-wide tile packing;
    FlexAttention (with its sink key) for float32 and bfloat16 where torch has it (the sink underflows in float16)."""
    monkeypatch.setattr(layouts, "cpu_class", lambda: klass)
    monkeypatch.setattr(layouts, "_flex_available", lambda device: flex)
    cpu = torch.device("cpu")
    fx = [Layout("flex", 128, sink=True)] if flex else []
    amx = klass == "AMX"
    assert layouts.candidate_layouts(cpu, torch.float32, 128, 4) == [Layout("pad", 136), *fx]  # fp32: never packed
    assert layouts.candidate_layouts(cpu, torch.float16, 128, 4) == [Layout("pad", 136)] + (
        [Layout("pad", 192)] if amx else []
    )
    assert (
        layouts.candidate_layouts(cpu, torch.bfloat16, 128, 4)
        == [Layout("pad", 136)] + ([Layout("pad", 192)] if amx else []) + [Layout("flex", 128, sink=True)] * flex
    )
    # a width already a multiple of 64 needs no second layout
    assert (
        layouts.candidate_layouts(cpu, torch.bfloat16, 120, 8)
        == [Layout("pad", 128)] + [Layout("flex", 120, sink=True)] * flex
    )
    assert layouts.candidate_layouts(cpu, torch.bfloat16, 64, 1)[:2] == [Layout("pad", 72)] + (
        [Layout("pad", 128)] if amx else [Layout("flex", 64, sink=True)] * flex
    )


@pytest.mark.parametrize("klass", CPU_CLASSES)
def test_cuda_candidates_do_not_depend_on_the_cpu(monkeypatch, klass):
    monkeypatch.setattr(layouts, "cpu_class", lambda: klass)
    kinds = [lay.kind for lay in layouts.candidate_layouts(torch.device("cuda"), torch.bfloat16, 128, 4)]
    assert kinds[:2] == ["pad", "split"] and set(kinds) <= {"pad", "split", "flex", "triton"}


def test_a_layout_that_fails_its_check_is_never_used(monkeypatch, fresh_choices):
    # the CPU flash kernel refuses a narrower v: the "split" layout fails its check and "pad" is used
    monkeypatch.setattr(layouts, "candidate_layouts", lambda *a: [Layout("split", 136), Layout("pad", 136)])
    assert layouts.taylor_layout(torch.device("cpu"), torch.float32, 128, 4) == Layout("pad", 136)
    assert layouts.kernel_choices() == {"cpu/torch.float32 d128 G4": "q,k,v padded to 136"}


def test_the_choice_is_made_once_and_times_the_candidates_that_pass(monkeypatch, fresh_choices):
    checks, timed = [], []
    real_ok, real_fastest = layouts._layout_ok, layouts._fastest
    monkeypatch.setattr(layouts, "candidate_layouts", lambda *a: [Layout("pad", 136), Layout("pad", 192)])
    monkeypatch.setattr(layouts, "_layout_ok", lambda lay, *a: checks.append(lay) or real_ok(lay, *a))
    monkeypatch.setattr(layouts, "_fastest", lambda lays, *a, **k: timed.append(lays) or real_fastest(lays, *a, **k))
    cpu = torch.device("cpu")
    first = layouts.taylor_layout(cpu, torch.float32, 128, 4, (2, 64, 64))
    assert first in (Layout("pad", 136), Layout("pad", 192)) and len(checks) == 2 and len(timed) == 1
    for _ in range(3):
        assert layouts.taylor_layout(cpu, torch.float32, 128, 4, (2, 64, 64)) == first
    assert len(checks) == 2 and len(timed) == 1  # cached per (device type, dtype, head_dim, G)
    layouts.taylor_layout(cpu, torch.bfloat16, 128, 4, (2, 64, 64))
    assert len(checks) == 4


def test_the_automatic_choice_never_compiles_flex_on_the_cpu(monkeypatch, fresh_choices):
    """FlexAttention on the CPU costs a compilation per shape for no speed-up: only an explicit choice takes it."""
    checked = []
    monkeypatch.setattr(layouts, "_PREFERENCE", None)
    monkeypatch.delenv(layouts.LAYOUT_ENV, raising=False)
    monkeypatch.setattr(layouts, "_layout_ok", lambda lay, *a: checked.append(lay) or True)
    assert layouts.taylor_layout(torch.device("cpu"), torch.float32, 128, 4) == Layout("pad", 136)
    assert checked == [Layout("pad", 136)]
    layouts.set_layout_preference("flex")
    assert layouts.taylor_layout(torch.device("cpu"), torch.float32, 128, 4) == Layout("flex", 128, sink=True)
    assert checked[1:] == [Layout("flex", 128, sink=True)]


@pytest.mark.parametrize("how", ["env", "call"])
def test_an_unknown_layout_name_is_refused_with_the_names_that_work(how, monkeypatch, fresh_choices):
    monkeypatch.setattr(layouts, "_PREFERENCE", None)
    monkeypatch.setenv(layouts.LAYOUT_ENV, "flexx" if how == "env" else "auto")
    with pytest.raises(
        ValueError, match=r"unknown correction layout 'flexx'; use one of pad, split, flex, triton or 'auto'"
    ):
        if how == "env":
            layouts.taylor_layout(torch.device("cpu"), torch.float32, 128, 4)
        else:
            layouts.set_layout_preference("flexx")
    assert fresh_choices == {} and layouts._PREFERENCE is None  # nothing chosen, nothing changed


def test_a_kind_not_offered_or_failing_its_check_falls_back_to_the_automatic_choice(monkeypatch, fresh_choices, caplog):
    monkeypatch.setattr(layouts, "_PREFERENCE", None)
    layouts.set_layout_preference("split")  # the CPU flash kernel takes no narrower v: not offered on the CPU
    with caplog.at_level("WARNING", logger="jensen_kv"):
        assert layouts.taylor_layout(torch.device("cpu"), torch.float32, 128, 4) == Layout("pad", 136)
    assert "'split' is not offered on cpu" in caplog.text
    layouts.set_layout_preference("flex")
    real_ok = layouts._layout_ok
    monkeypatch.setattr(layouts, "_layout_ok", lambda lay, *a: lay.kind != "flex" and real_ok(lay, *a))
    with caplog.at_level("WARNING", logger="jensen_kv"):
        assert layouts.taylor_layout(torch.device("cpu"), torch.float32, 128, 4) == Layout("pad", 136)
    assert "'flex' failed its check on cpu" in caplog.text


def test_no_passing_layout_falls_back_to_one_buffer_and_stays_correct(monkeypatch, fresh_choices):
    monkeypatch.setattr(layouts, "candidate_layouts", lambda *a: [Layout("split", 136)])
    entries, q, kc, vc = _entries()
    out = cached_attention(q, kc, vc, entries, "taylor", 0.8)
    assert layouts.kernel_choices() == {"cpu/torch.float32 d128 G4": "none (single buffer)"}
    torch.testing.assert_close(out, _reference(entries, q, kc, vc, "taylor", 0.8), rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("width", [136, 192])
@pytest.mark.parametrize("rotation", ["none", "hadamard"])
def test_every_cpu_layout_equals_the_reference(width, rotation, fresh_choices):
    fresh_choices[("cpu", torch.float32, 128, 4)] = Layout("pad", width)
    entries, q, kc, vc = _entries(rotation)
    torch.testing.assert_close(
        cached_attention(q, kc, vc, entries, "taylor", 1.3),
        _reference(entries, q, kc, vc, "taylor", 1.3),
        rtol=1e-4,
        atol=2e-5,
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rotation", ["none", "hadamard"])
def test_the_path_before_issue_12_gives_the_same_attention(rotation, dtype, monkeypatch):
    """``_LEGACY`` (channel-order dequantization, the current chunk rotated) stays callable for the benchmarks:
    the same results up to rounding."""
    entries, q, kc, vc = _entries(rotation, dtype=dtype)
    q, kc, vc = (t.to(dtype) for t in (q, kc, vc))
    for mode in ("off", "taylor", "chunk_mean"):
        new = cached_attention(q, kc, vc, entries, mode)
        monkeypatch.setattr(attention, "_LEGACY", True)
        old = cached_attention(q, kc, vc, entries, mode)
        monkeypatch.setattr(attention, "_LEGACY", False)
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(new, old, rtol=tol, atol=tol)


# ------------------------------------------------------------------------------------------------- CUDA
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (CPU-only machine)")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_cuda_layouts_each_equal_the_reference(dtype, fresh_choices):
    """Every layout CUDA offers (padded, split v, FlexAttention score_mod) passes its check and equals the
    reference through the whole fast path; the chunk-constant modes need none of them."""
    dev = torch.device("cuda")
    cands = layouts.candidate_layouts(dev, dtype, 128, 4)
    kinds = [lay.kind for lay in cands]  # the fused Triton kernel joins them where triton imports
    assert kinds in (["pad", "split", "flex"], ["pad", "split", "flex", "triton"]), kinds
    entries, q, kc, vc = _entries("hadamard", T=300, dtype=dtype)
    ref = {m: _reference(entries, q.float(), kc.float(), vc.float(), m, 0.9) for m in ("taylor", "chunk_mean")}
    moved = [CacheEntry(e.k.to(dev), e.v.to(dev)) for e in entries]
    tol = 1e-3 if dtype == torch.float32 else 3e-2
    for lay in cands:
        assert layouts._layout_ok(lay, dev, dtype, 128, 4), lay
        fresh_choices[("cuda", dtype, 128, 4)] = lay
        out = cached_attention(q.to(dev), kc.to(dev), vc.to(dev), moved, "taylor", 0.9)
        torch.testing.assert_close(out.float().cpu(), ref["taylor"], rtol=tol, atol=tol)
    out = cached_attention(q.to(dev), kc.to(dev), vc.to(dev), moved, "chunk_mean", 0.9)
    torch.testing.assert_close(out.float().cpu(), ref["chunk_mean"], rtol=tol, atol=tol)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (CPU-only machine)")
def test_cuda_choice_at_first_use(fresh_choices):
    lay = layouts.taylor_layout(torch.device("cuda"), torch.bfloat16, 128, 4, (12, 1560, 1560))
    assert lay is not None and lay.kind in ("pad", "split", "flex")
    assert "cuda/torch.bfloat16 d128 G4" in layouts.kernel_choices()


@pytest.mark.parametrize("mode", ["off", "taylor", "chunk_mean"])
def test_butterfly_rotations_take_the_same_route(mode, monkeypatch):
    """Wide heads rotate with butterflies instead of the matrix the channel order is folded into."""
    from jensen_core import hadamard

    entries, q, kc, vc = _entries("hadamard", T=24)
    fast = cached_attention(q, kc, vc, entries, mode, 0.8)
    monkeypatch.setattr(hadamard, "MATMUL_MAX_DIM", 0)
    torch.testing.assert_close(cached_attention(q, kc, vc, entries, mode, 0.8), fast, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fast, _reference(entries, q, kc, vc, mode, 0.8), rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("broken", ["output", "lse"])
def test_the_float64_check_refuses_a_layout_right_in_one_half_only(monkeypatch, broken):
    """A layout whose log-sum-exp is right but whose output is wrong (or the reverse) must fail its float64 check."""
    lay = layouts.Layout("pad", 136)
    assert layouts._layout_ok(lay, torch.device("cpu"), torch.float32, 128, 4)  # the real one passes
    real = layouts.layout_attend

    def half_wrong(*args, **kwargs):
        out, lse = real(*args, **kwargs)
        return (out * 1.01, lse) if broken == "output" else (out, lse + 0.01)

    monkeypatch.setattr(layouts, "layout_attend", half_wrong)
    assert not layouts._layout_ok(lay, torch.device("cpu"), torch.float32, 128, 4)


def test_the_kernels_live_in_three_modules_and_no_shim():
    """CPU class, SDPA with log-sum-exp and the correction layouts each have their own module; no old path remains."""
    import importlib

    from jensen_core import sdpa_lse

    assert layouts.cpu_class is cpu.cpu_class and layouts.sdpa_with_lse is sdpa_lse.sdpa_with_lse
    assert attention.lse_supported is sdpa_lse.lse_supported and attention.taylor_layout is layouts.taylor_layout
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("jensen_core.kernels")
