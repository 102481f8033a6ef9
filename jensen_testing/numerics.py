"""Error models for comparing a float result with a stored one, on any CPU (docs/testing.md, "Stored numbers").

A float32 result differs from machine to machine. MKL's sgemm and its vector maths (``exp``), oneDNN, and ATen's
vectorised kernels (softmax, SDPA, normal sampling) take other instructions and summation orders on AVX2, AVX-512,
AMX and ARM. Equality bit for bit is therefore only for two paths in one process. A number stored by another
machine is compared within a bound from a stated model:

**float32 rounding through a network** (:func:`rounding_bound`). One block (a transformer block, a decoder block)
evaluated in float32 returns its exact value at inputs perturbed by a relative amount of about ``sqrt(n) * u``.
Here ``n`` is its longest reduction (a matmul's inner size, the keys an attention reads) and ``u = 2**-24`` is
float32's unit roundoff. Rounding errors of either sign add in quadrature (Higham, *Accuracy and Stability of
Numerical Algorithms*, 2nd ed., sections 2.8 and 3.1; the worst case is ``n * u``). Through the ``L`` blocks of
one evaluation these add up, so its output carries a relative error of about ``L * sqrt(n) * u``, plus ``u`` for
storing the result. A sampler's latent is its noise plus the model's velocity integrated over the chunk's noise
levels (their steps sum to at most 1), so a whole run carries the same relative error as one evaluation; earlier
chunks reach a later one only through attention, which averages their errors. Two machines each carry one such
error, hence a factor 2. Softmax, normalisations and a quantizer's rounding can amplify an error:
``AMPLIFICATION = 4`` allows for that. So two float32 evaluations of one computation differ by

    ||got - want|| / ||want||  <=  AMPLIFICATION * 2 * (1 + L * sqrt(n)) * u.

Quantization follows the same bound. A key that lies within rounding of a code boundary may take the other code
on another machine; such flips are rare (their share is the rounding error over the step Δ) and each moves one
element by Δ, which attention averages over every key. The golden runs show it: on one machine with three kernel
sets (native AVX-512 with AMX, AVX2, and ATen's ``default``), the largest relative difference was 6.4e-7, 25 times
below the bound of their 2-block model (1.6e-5), while a planted one-line bug (a layer without its correction, a
timestep 10 % off) moves the output by 6 to 100 times the bound (``python tools/golden_runs.py --plants``).

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
#: how much softmax, normalisations and quantizer rounding may amplify one evaluation's rounding (see above)
AMPLIFICATION = 4.0


@dataclass(frozen=True)
class RoundingBound:
    """The bound :func:`rounding_bound` gives, with what it was made of (for a failure's message)."""

    value: float
    blocks: int
    reduction: int

    def __str__(self) -> str:
        return (
            f"{self.value:.3g} = {AMPLIFICATION:g} (amplification) x 2 (two machines) x (1 + {self.blocks} (blocks) x "
            f"sqrt({self.reduction}) (longest reduction)) x 2^-24 (float32 unit roundoff)"
        )


def rounding_bound(blocks: int, reduction: int) -> RoundingBound:
    """The relative L2 bound on two float32 evaluations of a computation through ``blocks`` blocks whose longest
    reduction is ``reduction`` long (the module docstring derives it)."""
    if blocks < 1 or reduction < 1:
        raise ValueError(f"blocks {blocks} and reduction {reduction} must be >= 1")
    return RoundingBound(AMPLIFICATION * 2 * (1 + blocks * math.sqrt(reduction)) * U32, blocks, reduction)


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


def float32_from_float64(x: torch.Tensor) -> torch.Tensor:
    """Round a float64 tensor to float32 once. Seeded test data drawn this way is the same on every CPU: ATen's
    float32 normal sampler and MKL's float32 ``exp`` take other code paths per instruction set, while float64
    draws are the same everywhere and float64 maths differs by far less than a float32 rounding step."""
    if x.dtype != torch.float64:
        raise TypeError(f"float32_from_float64 takes float64, got {x.dtype}")
    return x.to(torch.float32)
