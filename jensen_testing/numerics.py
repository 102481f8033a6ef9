"""Error models for comparing a float result with a stored one, on any CPU (docs/testing.md, "Stored numbers").

A float32 result differs from machine to machine. MKL's sgemm and its vector maths (``exp``), oneDNN, and ATen's
vectorised kernels (``pow``, softmax, SDPA, normal sampling) take other instructions and summation orders on AVX2,
AVX-512, AMX and ARM. Equality bit for bit is therefore only for two paths in one process. A number stored by
another machine is compared within a bound from a stated model, :func:`rounding_bound`, on the relative L2 error
``||got - want|| / ||want||``. It is the sum of the terms below, each a worst case for one float32 evaluation,
times 2: both machines carry one.

- **Arithmetic through the blocks.** One block (a transformer block, a decoder block) evaluated in float32 returns
  its exact value at inputs perturbed by a relative amount of about ``sqrt(n) * u``. Here ``n`` is its longest
  reduction (a matmul's inner size, the keys an attention reads) and ``u = 2**-24`` is float32's unit roundoff.
  Rounding errors of either sign add in quadrature (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd
  ed., sections 2.8 and 3.1; the worst case is ``n * u``). Through the ``L`` blocks of one evaluation they add up:
  ``(1 + L * sqrt(n)) * u``, the 1 for storing the result. A sampler's latent is its noise plus the model's
  velocity integrated over the chunk's noise levels (their steps sum to at most 1), so a whole run carries the
  error of one evaluation; earlier chunks reach a later one only through attention, which averages their errors.
- **A sinusoidal timestep embedding.** Its frequencies ``base ** (-k / half)`` come from float32 ``pow`` or
  ``exp``, which round differently per instruction set (measured: ATen's vectorised ``pow`` and its scalar one
  differ in 5 of Wan's 128 frequencies, MKL's ``exp`` per instruction set in most of MAGI-1's). A frequency one
  unit off puts the phase ``a * f_k`` of an argument ``a`` off by ``a * f_k * u`` radians. With every frequency
  off, the embedding moves by ``a * u * rms(f)`` relative to its norm (``rms(f)``: 0.23 for base 10000), and the
  model's output by as much at most: the embedding only modulates.
- **A few roundings to bfloat16 inside a float32 computation** (a reference that rounds q, k, v to bfloat16). A
  value within the float32 error ``e = sqrt(n) * u`` of a rounding boundary rounds the other way on another
  machine: a share ``2 e / BF16_ULP`` of the values, each by ``BF16_ULP``, hence ``sqrt(2 e BF16_ULP)`` per
  rounding, the roundings adding in quadrature.
- **A computation in bfloat16** (its inputs, intermediates and output stored in bfloat16, sums accumulated in
  float32, as the CPU's attention kernels do). Once one stage's rounding differs, the next stages see other
  inputs, so every stage counts in full: ``BF16_ULP / 2`` of relative error per element and stage, ``S`` stages.

Quantization follows the arithmetic term. A key that lies within rounding of a code boundary may take the other
code on another machine; such flips are rare (their share is the rounding error over the step Δ) and each moves
one element by Δ, which attention averages over every key. The golden runs show it: on one machine with three
kernel sets (native AVX-512 with AMX, AVX2, and ATen's ``default``) their largest relative difference was 6.4e-7,
50 times below their bound (3.2e-5), while a planted one-line bug (a layer without its correction, a timestep 10 %
off) moves a run by 3 to 130 times the bound (``python tools/golden_runs.py --plants``).

A relative L2 norm is used, not an element-wise tolerance: elements near zero carry an absolute error, not a
relative one, and a behaviour change (a wrong step, a skipped correction) moves whole chunks, which the norm sees.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import torch

#: float32's unit roundoff: a correctly rounded operation's relative error is at most this
U32 = 2.0**-24
#: bfloat16's spacing relative to a value (7 stored mantissa bits)
BF16_ULP = 2.0**-7


@dataclass(frozen=True)
class RoundingBound:
    """The bound :func:`rounding_bound` gives, with the terms it was made of (for a failure's message)."""

    value: float
    terms: tuple[tuple[str, float], ...]

    def __str__(self) -> str:
        parts = " + ".join(f"{v:.2g} ({name})" for name, v in self.terms)
        return f"{self.value:.3g} = 2 (two machines) x [{parts}]"


def frequency_rms(dim: int, base: float = 10000.0) -> float:
    """The RMS of a sinusoidal embedding's frequencies ``base ** (-k / half)``, ``k < half = dim // 2``."""
    half = dim // 2
    return math.sqrt(sum(base ** (-2 * k / half) for k in range(half)) / half)


def rounding_bound(
    blocks: int,
    reduction: int,
    *,
    sinusoid: tuple[float, int] | None = None,
    bf16_roundings: int = 0,
    bf16_stages: int = 0,
) -> RoundingBound:
    """The relative L2 bound on two float32 evaluations of one computation (the module docstring derives each term):

    - ``blocks`` blocks whose longest reduction is ``reduction`` long;
    - ``sinusoid``: ``(largest argument, embedding width)`` of a sinusoidal timestep embedding with base 10000
      (Wan's and MAGI-1's: the timestep times 1000);
    - ``bf16_roundings``: roundings to bfloat16 inside a float32 computation;
    - ``bf16_stages``: stages of a computation carried out in bfloat16.
    """
    if blocks < 1 or reduction < 1 or bf16_roundings < 0 or bf16_stages < 0:
        raise ValueError(f"blocks {blocks} and reduction {reduction} must be >= 1, bf16 counts >= 0")
    terms = [(f"{blocks} blocks of reductions up to {reduction}", (1 + blocks * math.sqrt(reduction)) * U32)]
    if sinusoid is not None:
        arg, dim = sinusoid
        terms.append((f"timestep sinusoid up to {arg:g}, {dim} wide", arg * frequency_rms(dim) * U32))
    if bf16_roundings:
        e = math.sqrt(reduction) * U32
        terms.append((f"{bf16_roundings} bfloat16 roundings", math.sqrt(bf16_roundings * 2 * e * BF16_ULP)))
    if bf16_stages:
        terms.append((f"{bf16_stages} bfloat16 stages", bf16_stages * BF16_ULP / 2))
    return RoundingBound(2 * sum(v for _, v in terms), tuple(terms))


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """``||got - want|| / ||want||`` in float64 (``want`` all zero: the norm of the difference)."""
    if tuple(got.shape) != tuple(want.shape):
        raise AssertionError(f"shape {tuple(got.shape)} != recorded {tuple(want.shape)}")
    g, w = got.detach().double().cpu(), want.detach().double().cpu()
    den = float(w.norm())
    return float((g - w).norm()) / (den if den > 0 else 1.0)


def assert_within_rounding(got: torch.Tensor, want: torch.Tensor, bound: RoundingBound, what: str = "") -> float:
    """Fail unless ``got`` is within ``bound`` of ``want`` (relative L2); returns the relative error."""
    err = relative_error(got, want)
    if not err <= bound.value:  # NaN fails too
        diff = (got.detach().double().cpu() - want.detach().double().cpu()).abs()
        raise AssertionError(
            f"{what + ': ' if what else ''}relative L2 error {err:.3g} exceeds the float32 rounding bound {bound} "
            f"(max |difference| {float(diff.max()):.3g}, max |recorded| {float(want.abs().max()):.3g})"
        )
    return err


class CallCounter:
    """Counts the calls of some modules while active (``with CallCounter(blocks) as c: ...; c.count``)."""

    def __init__(self, modules: Iterable[torch.nn.Module]):
        self.modules = list(modules)
        if not self.modules:
            raise ValueError("CallCounter needs at least one module")
        self.count = 0
        self._handles: list = []

    def _hook(self, *_):
        self.count += 1

    def __enter__(self) -> CallCounter:
        self._handles = [m.register_forward_pre_hook(self._hook) for m in self.modules]
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
