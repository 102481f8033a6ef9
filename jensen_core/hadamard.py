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


#: Up to this width the rotation is applied as one matmul with the matrix the transform builds:
#: in eager PyTorch a BLAS call beats log2(n) butterfly passes there (measured: 2.3x on a CPU at
#: n = 128, ``benchmarks/rotation.py``); wider rotations use the butterflies directly.
MATMUL_MAX_DIM = 256
_MATRICES: dict[tuple[int, int, str, torch.dtype, bool], Tensor] = {}


def _matrix(n: int, seed: int, device: torch.device, dtype: torch.dtype, inverse: bool) -> Tensor:
    key = (n, seed, str(device), dtype, inverse)
    m = _MATRICES.get(key)
    if m is None:
        r = rotation_matrix(n, seed, dtype=torch.float64)
        m = (r.T if inverse else r).to(device=device, dtype=dtype).contiguous()
        if len(_MATRICES) > 64:
            _MATRICES.clear()
        _MATRICES[key] = m
    return m


def _apply(x: Tensor, seed: int, inverse: bool) -> Tensor:
    n = x.shape[-1]
    _check_pow2(n)
    xf = x.to(_compute_dtype(x))
    if n <= MATMUL_MAX_DIM:
        m = _matrix(n, seed, x.device, xf.dtype, inverse)
        if xf.dim() < 3:
            return (xf @ m).to(x.dtype)
        # one (tokens, n) matmul per leading index (batch, head): a BLAS blocks a matrix by its row count, so a
        # matmul over all heads folded together would round a head's rows differently from a matmul over a slice
        # of the heads (MKL's AVX2 kernels do); per head, a rank holding heads [h0, h0 + k) rotates them exactly as
        # one process holding every head does
        x3 = xf.reshape(-1, *xf.shape[-2:])
        return torch.bmm(x3, m.expand(x3.shape[0], n, n)).reshape(xf.shape).to(x.dtype)
    signs = random_signs(n, seed, x.device, xf.dtype)
    return (fwht(xf) * signs if inverse else fwht(xf * signs)).to(x.dtype)


def rotate(x: Tensor, seed: int) -> Tensor:
    """Apply the seeded randomized Hadamard rotation to the last axis of ``x``."""
    return _apply(x, seed, inverse=False)


def unrotate(x: Tensor, seed: int) -> Tensor:
    """Inverse of :func:`rotate` (the rotation is orthogonal: its inverse is its transpose)."""
    return _apply(x, seed, inverse=True)


def rotation_matrix(n: int, seed: int, dtype=torch.float64) -> Tensor:
    """The explicit ``n x n`` rotation ``R = diag(signs) H_n / sqrt(n)`` with ``rotate(x) == x @ R``, built by the FWHT."""
    _check_pow2(n)
    return fwht(torch.diag(random_signs(n, seed, dtype=dtype)))
