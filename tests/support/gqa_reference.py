"""A float64 reference of corrected attention written plainly, one query head at a time (grouped-query attention,
context tokens): what ``jensen_core.attention.cached_attention`` must compute.

For query head ``h`` of ``H_q = groups * H_kv`` heads, K/V head ``h // groups`` (SDPA's ``enable_gqa``
convention). Scores over [cached chunks, context tokens, current chunk]; only the cached keys get the bias,
built here from the stored step sizes and the (rotated) query's own channels, without ``jensen_core.bias``:

- ``taylor`` (Eq. 15): ``sum_j ||q_j||^2 Delta_ij^2 / (24 d)`` over the groups ``j`` of the rotated query;
- ``chunk_mean``: the mean of that over each cached chunk's keys;
- ``per_channel`` (App. E): ``Delta^2`` averaged over every attended cached key first;
- ``exact`` (Eq. 12): ``sum_c log(sinh(a_c) / a_c)``, ``a_c = q_c Delta_{g(c)} / (2 sqrt d)``;
- ``off``: nothing.

The rotation is built here too: ``R = diag(signs) H_n / sqrt(n)`` with the Sylvester ``H_n`` (Kronecker powers of
[[1, 1], [1, -1]]) and the seeded signs of ``jensen_core.hadamard.random_signs`` (the rotation's definition).
"""

from __future__ import annotations

import math

import torch

from jensen_core.hadamard import random_signs
from jensen_core.quant import StoredTensor


def hadamard_matrix(n: int, seed: int) -> torch.Tensor:
    """The rotation ``x -> x @ R`` of a Hadamard-rotated cache, float64."""
    h = torch.ones(1, 1, dtype=torch.float64)
    base = torch.tensor([[1.0, 1.0], [1.0, -1.0]], dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.kron(h, base)
    return torch.diag(random_signs(n, seed, dtype=torch.float64)) @ h / math.sqrt(n)


def _log_sinhc(a: torch.Tensor) -> torch.Tensor:
    small = a.abs() < 1e-6
    safe = torch.where(small, torch.ones_like(a), a)
    return torch.where(small, a * a / 6, torch.log(torch.sinh(safe) / safe))


def _side(t) -> torch.Tensor:
    return t.dequantize(dtype=torch.float64) if isinstance(t, StoredTensor) else t.double()


def reference_attention(q, k_cur, v_cur, entries, mode="taylor", strength=1.0, k_ctx=None, v_ctx=None):
    """(batch, H_q, M, d) float64: softmax([q k_hat / sqrt d - strength * b, q k_ctx / sqrt d, q k_cur / sqrt d]) V."""
    q = q.double()
    B, Hq, M, D = q.shape
    Hkv = k_cur.shape[1]
    groups = Hq // Hkv
    assert groups * Hkv == Hq
    k_hat = [_side(e.k) for e in entries]
    v_hat = [_side(e.v) for e in entries]
    quantized = bool(entries) and isinstance(entries[0].k, StoredTensor)
    if quantized:
        spec = entries[0].k.spec
        g = spec.group_size
        qr = q @ hadamard_matrix(D, spec.seed) if spec.rotation == "hadamard" else q
        steps = [e.k.step_sizes().double() for e in entries]  # (B, Hkv, T_i, D // g) each
    full_k = ([k_ctx.double()] if k_ctx is not None else []) + [k_cur.double()]
    full_v = ([v_ctx.double()] if v_ctx is not None else []) + [v_cur.double()]
    out = torch.empty(B, Hq, M, D, dtype=torch.float64)
    for b in range(B):
        for h in range(Hq):
            kv = h // groups
            qh = q[b, h]
            scores = []
            for i, kh in enumerate(k_hat):
                s = qh @ kh[b, kv].T / math.sqrt(D)
                if quantized and mode != "off":
                    s = s - strength * _bias(qr[b, h], steps, i, b, kv, mode, g, D)
                scores.append(s)
            scores += [qh @ k[b, kv].T / math.sqrt(D) for k in full_k]
            p = torch.softmax(torch.cat(scores, -1), -1)
            values = torch.cat([v[b, kv] for v in v_hat] + [v[b, kv] for v in full_v], -2)
            out[b, h] = p @ values
    return out


def _bias(qr, steps, i, b, kv, mode, g, D):
    """(M, T_i): the bias of query rows ``qr`` (rotated, float64) on cached chunk ``i`` of K/V head ``kv``."""
    nu = qr.reshape(qr.shape[0], D // g, g).square().sum(-1)  # (M, groups)
    step = steps[i][b, kv]  # (T_i, groups)
    if mode == "exact":
        a = qr.unsqueeze(1) * step.repeat_interleave(g, -1).unsqueeze(0) / (2 * math.sqrt(D))  # (M, T_i, D)
        return _log_sinhc(a).sum(-1)
    w = step.square() / (24 * D)
    if mode == "taylor":
        return nu @ w.T
    if mode == "chunk_mean":
        return (nu @ w.T).mean(-1, keepdim=True).expand(-1, step.shape[0])
    if mode == "per_channel":
        every = torch.cat([s[b, kv] for s in steps], 0).square() / (24 * D)
        return (nu @ every.mean(0, keepdim=True).T).expand(-1, step.shape[0])
    raise ValueError(mode)
