"""Seeded randomized Hadamard rotation (QuaRot) with a fast Walsh-Hadamard transform.

The rotation of a row vector ``x`` is ``x @ R`` with ``R = D @ H_n / sqrt(n)``, where ``D`` is a
seeded diagonal of random signs and ``H_n`` the (symmetric) Sylvester Hadamard matrix. ``R`` is
orthogonal, so ``rotate(q) . rotate(k) = q . k`` and :func:`unrotate` is its transpose.
"""
from __future__ import annotations

import math
from functools import lru_cache

import torch
from torch import Tensor


def _check_pow2(n: int) -> None:
    if n < 1 or n & (n - 1):
        raise ValueError(
            f"the Hadamard rotation needs a power-of-two head_dim, got {n}; use rotation='none' for this model"
        )


def fwht(x: Tensor) -> Tensor:
    """Orthonormal fast Walsh-Hadamard transform along the last axis (length a power of two).

    ``O(n log n)`` butterflies instead of an ``n x n`` matmul; the result equals ``x @ H_n / sqrt(n)``.
    Half-precision inputs are transformed in float32 (more accurate, and much faster on CPUs).
    """
    n = x.shape[-1]
    _check_pow2(n)
    if x.dtype in (torch.float16, torch.bfloat16):
        return fwht(x.float()).to(x.dtype)
    lead = x.shape[:-1]
    y = x.reshape(-1, n)
    h = 1
    while h < n:
        y = y.view(-1, n // (2 * h), 2, h)
        a, b = y[:, :, 0, :], y[:, :, 1, :]
        y = torch.stack((a + b, a - b), dim=2)
        h *= 2
    return y.reshape(*lead, n) * (1.0 / math.sqrt(n))


@lru_cache(maxsize=64)
def _signs_cpu(n: int, seed: int) -> Tensor:
    g = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randint(0, 2, (n,), generator=g, dtype=torch.int64).mul(2).sub(1).to(torch.float32)


def random_signs(n: int, seed: int, device=None, dtype=torch.float32) -> Tensor:
    """The seeded +-1 diagonal of the randomized Hadamard rotation (same on every device)."""
    _check_pow2(n)
    return _signs_cpu(n, seed).to(device=device, dtype=dtype)


def _compute_dtype(x: Tensor) -> torch.dtype:
    return torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype


def rotate(x: Tensor, seed: int) -> Tensor:
    """Apply the seeded randomized Hadamard rotation to the last axis of ``x``."""
    xf = x.to(_compute_dtype(x))
    return fwht(xf * random_signs(x.shape[-1], seed, x.device, xf.dtype)).to(x.dtype)


def unrotate(x: Tensor, seed: int) -> Tensor:
    """Inverse of :func:`rotate` (the rotation is orthogonal: its inverse is its transpose)."""
    xf = x.to(_compute_dtype(x))
    return (fwht(xf) * random_signs(x.shape[-1], seed, x.device, xf.dtype)).to(x.dtype)


def rotation_matrix(n: int, seed: int, dtype=torch.float64) -> Tensor:
    """The explicit ``n x n`` rotation ``R`` with ``rotate(x) == x @ R`` (for tests)."""
    return rotate(torch.eye(n, dtype=dtype), seed)
