"""SDPA that also returns each query's log-sum-exp, verified once per device, dtype and width.

:func:`sdpa_with_lse` runs private PyTorch ops (the CPU flash kernel; CUDA's flash or
memory-efficient kernel) that report the log-sum-exp; :func:`lse_supported` checks them against
a plain float64 computation on a tiny problem before use. The streamed fast path needs the
log-sum-exp to merge chunk by chunk, and the chunk-constant corrections (``chunk_mean``,
``per_channel``) are nothing but an offset of a cached chunk's log-sum-exp - free with any such kernel.
"""

from __future__ import annotations

import logging

import torch
from torch import Tensor

logger = logging.getLogger("jensen_kv")

#: the reduced-precision float dtypes (CUDA's flash kernel takes only these)
HALF_DTYPES = (torch.float16, torch.bfloat16)


def check_tolerance(dtype: torch.dtype) -> float:
    """Absolute and relative tolerance of a kernel check against float64 in ``dtype``."""
    return 1e-4 if dtype in (torch.float32, torch.float64) else 5e-2


_LSE_OK: dict[tuple[str, torch.dtype, int], bool] = {}


def _sdpa_lse_raw(q: Tensor, k: Tensor, v: Tensor, scale: float) -> tuple[Tensor, Tensor]:
    if q.device.type == "cpu":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, False, scale=scale)
        return out, lse
    if q.device.type == "cuda":
        if q.dtype in HALF_DTYPES and q.shape[-1] == v.shape[-1]:
            try:
                r = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, False, False, scale=scale)
                return r[0], r[1]
            except RuntimeError:
                pass
        r = torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0, False, scale=scale)
        return r[0], r[1][..., : q.shape[-2]]
    raise NotImplementedError(q.device.type)


def sdpa_with_lse(q: Tensor, k: Tensor, v: Tensor, scale: float) -> tuple[Tensor, Tensor]:
    """SDPA that also returns the fp32 log-sum-exp of each query's scores, ``(..., M)``."""
    out, lse = _sdpa_lse_raw(q, k, v, scale)
    return out, lse.to(torch.float32)


def lse_supported(device: torch.device, dtype: torch.dtype, width: int) -> bool:
    """Whether :func:`sdpa_with_lse` works here; checked once per (device, dtype, width) on a tiny problem.

    The kernels that report the log-sum-exp are private PyTorch ops, so they are verified against
    a plain computation before use; on any mismatch or error the single-buffer path is used.
    """
    key = (str(device), dtype, width)
    ok = _LSE_OK.get(key)
    if ok is None:
        try:
            gen = torch.Generator().manual_seed(0)
            q, k, v = (torch.randn(1, 2, n, width, generator=gen).to(device=device, dtype=dtype) for n in (5, 11, 11))
            out, lse = sdpa_with_lse(q, k, v, 0.3)
            s = (q.double() @ k.double().transpose(-1, -2)) * 0.3
            tol = check_tolerance(dtype)
            ok = bool(
                out.shape == q.shape
                and lse.shape == q.shape[:-1]
                and torch.allclose(lse.double(), torch.logsumexp(s, -1), atol=tol, rtol=tol)
                and torch.allclose(out.double(), torch.softmax(s, -1) @ v.double(), atol=tol, rtol=tol)
            )
        except Exception:  # noqa: BLE001 - any failure means: don't use it
            ok = False
        if not ok:
            logger.info(
                "jensen_kv: SDPA with log-sum-exp unavailable on %s/%s (width %d): one buffer per window",
                device,
                dtype,
                width,
            )
        _LSE_OK[key] = ok
    return ok
