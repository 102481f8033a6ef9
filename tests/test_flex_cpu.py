"""FlexAttention on the CPU: the ``flex`` layout (compiled ``score_mod``, log-sum-exp from a sink key) against float64.

torch.compile's CPU FlexAttention compiles once per shape (20-60 s on a busy 2-core machine), so
every test here uses one problem shape per dtype - the shape of the layout's own float64 check
(1 batch, 2 heads, 5 queries, 11 keys per cached chunk, head_dim 128, 4 groups) - and the module
compiles twice in all (float32, bfloat16), in its first fixture.
"""

import math

import pytest
import torch
from support.gqa_reference import reference_attention

from jensen_core import CacheEntry, QuantSpec, cached_attention, jensen_bias, quantize
from jensen_core import correction_layouts as layouts
from jensen_core.correction_layouts import Layout
from jensen_core.quant import cat_quantized

pytestmark = pytest.mark.slow

CPU = torch.device("cpu")
FLEX = Layout("flex", 128, sink=True)
B, H, M, T, D = 1, 2, 5, 11, 128  # the check's shape: no compilation beyond the check's


@pytest.fixture(scope="module")
def flex_checks():
    """Compile the CPU FlexAttention once per dtype through the layout's own float64 check: whether it passes.

    It depends on the CPU: inductor generates code for the instruction set it finds (and honours
    ``ATEN_CPU_CAPABILITY``), and measured on an AMX Xeon the compiled kernel is right with its AVX-512 code and wrong
    with its AVX2 code (log-sum-exp off by 2.8), while torch's plain compiled flex_attention is wrong the other way
    round. The check exists for that: a layout that fails it is never used (``test_a_flex_that_fails_its_check``)."""
    if not layouts._flex_available(CPU):
        pytest.fail("torch.nn.attention.flex_attention is missing: torch 2.14 has it")
    return {dtype: layouts._layout_ok(FLEX, CPU, dtype, D, 4) for dtype in (torch.float32, torch.bfloat16)}


@pytest.fixture(scope="module")
def flex_cpu(flex_checks):
    """The compiled CPU FlexAttention, where it passes its float64 check on this CPU, with its calls counted."""
    failing = [str(d) for d, ok in flex_checks.items() if not ok]
    if failing:
        pytest.skip(
            f"torch's compiled CPU FlexAttention fails the layout's float64 check on this CPU in {', '.join(failing)}: "
            "the pack refuses the layout here (test_a_flex_that_fails_its_check_is_never_used)"
        )
    with pytest.MonkeyPatch.context() as mp:
        calls = []
        real = layouts._flex_sink_attend
        mp.setattr(layouts, "_flex_sink_attend", lambda *a: calls.append(a[0].dtype) or real(*a))
        yield calls


@pytest.fixture
def choose_flex(monkeypatch, flex_cpu):
    """The flex layout chosen for this test (explicitly, as a user would); earlier choices forgotten."""
    monkeypatch.setattr(layouts, "_LAYOUTS", {})
    monkeypatch.setattr(layouts, "_PREFERENCE", None)
    layouts.set_layout_preference("flex")
    flex_cpu.clear()
    return flex_cpu


def _problem(spec, dtype=torch.float32, chunks=3, seed=0):
    gen = torch.Generator().manual_seed(seed)
    entries = [
        CacheEntry(
            quantize(torch.randn(B, H, T, D, generator=gen) * 2, spec),
            quantize(torch.randn(B, H, T, D, generator=gen), spec),
        )
        for _ in range(chunks)
    ]
    q, kc, vc = (torch.randn(B, H, n, D, generator=gen) for n in (M, 7, 7))
    return entries, (q * 2).to(dtype), kc.to(dtype), vc.to(dtype)


def _reference(entries, q, kc, vc, mode, strength):
    """softmax(q k^T / sqrt(d) - lambda b) v over [cached, current] in float64, b the bias of ``mode``."""
    kq = cat_quantized([e.k for e in entries])
    k_hat = kq.dequantize(torch.float32).double()
    v_hat = cat_quantized([e.v for e in entries]).dequantize(torch.float32).double()
    qd = q.double()
    b = jensen_bias(q.float(), kq, mode, chunk_tokens=[e.tokens for e in entries]).double()
    s = torch.cat(
        [qd @ k_hat.transpose(-1, -2) / math.sqrt(D) - strength * b, qd @ kc.double().transpose(-1, -2) / math.sqrt(D)],
        -1,
    )
    return torch.softmax(s, -1) @ torch.cat([v_hat, vc.double()], -2)


@pytest.mark.parametrize("mode", ["taylor", "chunk_mean"])
@pytest.mark.parametrize("rotation", ["none", "hadamard"])
def test_flex_on_the_cpu_equals_the_float64_reference(mode, rotation, choose_flex):
    entries, q, kc, vc = _problem(QuantSpec(bits=2, group_size=32, rotation=rotation, seed=3))
    out = cached_attention(q, kc, vc, entries, mode, 0.9)
    torch.testing.assert_close(out.double(), _reference(entries, q, kc, vc, mode, 0.9), rtol=1e-4, atol=2e-5)
    flex = {"cpu/torch.float32 d128 G4": "FlexAttention score_mod at width 128, log-sum-exp from a sink key"}
    assert layouts.kernel_choices() == (flex if mode == "taylor" else {})
    # taylor: the check at first use, then every cached chunk through the compiled kernel;
    # chunk_mean needs no layout (an offset of each chunk's log-sum-exp)
    assert choose_flex == ([torch.float32] * (1 + len(entries)) if mode == "taylor" else [])


@pytest.mark.parametrize("rotation", ["none", "hadamard"])
def test_flex_on_the_cpu_corrects_qvg_residuals(rotation, choose_flex):
    """QVG keys: the correction comes from the residual's steps; flex applies it exactly as pad does."""
    spec = QuantSpec(bits=2, group_size=32, rotation=rotation, seed=5, method="qvg", qvg_centroids=4)
    entries, q, kc, vc = _problem(spec, seed=1)
    out = cached_attention(q, kc, vc, entries, "taylor", 1.0)
    torch.testing.assert_close(out.double(), _reference(entries, q, kc, vc, "taylor", 1.0), rtol=1e-4, atol=2e-5)
    assert len(choose_flex) == 1 + len(entries)  # the check, then each cached chunk
    layouts.set_layout_preference("pad")  # the same attention through the padded layout
    torch.testing.assert_close(cached_attention(q, kc, vc, entries, "taylor", 1.0), out, rtol=1e-5, atol=1e-5)
    assert len(choose_flex) == 1 + len(entries)


@pytest.mark.parametrize("rotation", ["none", "hadamard"])
def test_flex_on_the_cpu_with_grouped_query_attention_and_context_tokens(rotation, choose_flex):
    """10 query heads over 2 K/V heads, one query each: folded into their K/V head's rows, the kernel sees the check's
    shape (2 heads x 5 query rows), so nothing compiles again. Context tokens join the merge uncorrected."""
    gen = torch.Generator().manual_seed(6)
    spec = QuantSpec(bits=2, group_size=32, rotation=rotation, seed=3)
    entries = [
        CacheEntry(
            quantize(torch.randn(B, H, T, D, generator=gen) * 2, spec),
            quantize(torch.randn(B, H, T, D, generator=gen), spec),
        )
        for _ in range(2)
    ]
    q = torch.randn(B, 5 * H, M // 5, D, generator=gen) * 2
    kc, vc, kx, vx = (torch.randn(B, H, n, D, generator=gen) for n in (7, 7, 4, 4))
    out = cached_attention(q, kc, vc, entries, "taylor", 0.9, k_ctx=kx, v_ctx=vx)
    ref = reference_attention(q, kc, vc, entries, "taylor", 0.9, kx, vx)
    torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=2e-5)
    assert choose_flex == [torch.float32] * (1 + len(entries))


def test_flex_on_the_cpu_in_bfloat16(choose_flex):
    entries, q, kc, vc = _problem(QuantSpec(bits=2, group_size=32, rotation="hadamard", seed=3), torch.bfloat16)
    out = cached_attention(q, kc, vc, entries, "taylor", 1.0)
    assert out.dtype == torch.bfloat16 and choose_flex == [torch.bfloat16] * (1 + len(entries))
    torch.testing.assert_close(out.double(), _reference(entries, q, kc, vc, "taylor", 1.0), rtol=3e-2, atol=3e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_sink_recovers_the_log_sum_exp_of_scores_spread_over_hundreds_of_nats(dtype, flex_cpu):
    """Where the sink's share underflows (one key far above the rest), those rows are attended again with a higher sink."""
    q, k, v, nu, w = layouts._problem(CPU, dtype, B, H, M, T, D, 4)
    k[:, :, 3] = q[:, :, 0] * 30  # query 0 scores key 3 ~ 30 |q|^2 / sqrt(d) above its other keys
    args = layouts._inputs(FLEX, q, k, v, nu, w, 0.7)
    out, lse = layouts.layout_attend(FLEX, *args, nu, w, 0.7, 1 / math.sqrt(D))
    s = (q.double() @ k.double().transpose(-1, -2)) / math.sqrt(D) - 0.7 * (nu.double() @ w.double().transpose(-1, -2))
    assert (s.max(-1).values - s.mean(-1)).max() > 150  # the first sink (at the mean score + log T) underflows
    tol = layouts.check_tolerance(dtype)
    torch.testing.assert_close(lse.double(), torch.logsumexp(s, -1), rtol=tol, atol=tol)
    torch.testing.assert_close(out.double(), torch.softmax(s, -1) @ v.double(), rtol=tol, atol=tol)


def test_the_automatic_choice_leaves_cpu_flex_out_and_an_explicit_one_takes_it(monkeypatch, flex_cpu):
    monkeypatch.setattr(layouts, "_LAYOUTS", {})
    monkeypatch.setattr(layouts, "_PREFERENCE", None)
    monkeypatch.delenv(layouts.LAYOUT_ENV, raising=False)
    assert FLEX in layouts.candidate_layouts(CPU, torch.float32, D, 4)
    assert layouts.taylor_layout(CPU, torch.float32, D, 4, (H, M, T)) == Layout("pad", 136)
    monkeypatch.setenv(layouts.LAYOUT_ENV, "flex")
    assert layouts.taylor_layout(CPU, torch.float32, D, 4, (H, M, T)) == Layout("pad", 136)  # chosen once
    monkeypatch.setattr(layouts, "_LAYOUTS", {})
    assert layouts.taylor_layout(CPU, torch.float32, D, 4, (H, M, T)) == FLEX
    layouts.set_layout_preference("auto")  # overrides the environment and forgets the choice
    assert layouts.taylor_layout(CPU, torch.float32, D, 4, (H, M, T)) == Layout("pad", 136)


def test_a_flex_that_fails_its_check_is_never_used(monkeypatch, flex_checks, caplog):
    """Whatever torch's compiled kernel does on this CPU, an explicit request for flex gets a layout that passed its
    float64 check: flex where it passed, the padded layout (logged) where it did not; here it is also planted to fail."""
    monkeypatch.setattr(layouts, "_LAYOUTS", {})
    monkeypatch.setattr(layouts, "_PREFERENCE", None)
    monkeypatch.setenv(layouts.LAYOUT_ENV, "flex")
    want = FLEX if flex_checks[torch.float32] else Layout("pad", 136)
    assert layouts.taylor_layout(CPU, torch.float32, D, 4, (H, M, T)) == want
    real = layouts._layout_ok
    monkeypatch.setattr(layouts, "_layout_ok", lambda lay, *a: lay.kind != "flex" and real(lay, *a))
    monkeypatch.setattr(layouts, "_LAYOUTS", {})
    assert layouts.taylor_layout(CPU, torch.float32, D, 4, (H, M, T)) == Layout("pad", 136)
