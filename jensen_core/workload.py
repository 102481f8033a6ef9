"""A seeded synthetic attention workload shaped like one self-attention layer of a video DiT.

Defaults follow Wan 2.1 1.3B at 480x832: 12 heads of 128 channels, 1,560 tokens per latent frame
chunk (30 x 52 patches), and a window of 4 cached chunks. Keys carry a few outlier channels with
large offsets and spread (the channel-wise key outliers KIVI and QuaRot describe); values don't.
Queries share a component with their own chunk's keys, so the current chunk holds a real share
of the attention, as local spatio-temporal attention does in video models.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Workload:
    q: Tensor  # (1, heads, chunk_tokens, head_dim): current chunk's queries
    k_cached: list[Tensor]  # one (1, heads, chunk_tokens, head_dim) per cached chunk, oldest first
    v_cached: list[Tensor]
    k_cur: Tensor
    v_cur: Tensor

    @property
    def k_cached_all(self) -> Tensor:
        return torch.cat(self.k_cached, dim=-2)

    @property
    def v_cached_all(self) -> Tensor:
        return torch.cat(self.v_cached, dim=-2)


def make_workload(
    seed: int = 0,
    heads: int = 12,
    head_dim: int = 128,
    chunk_tokens: int = 1560,
    cached_chunks: int = 4,
    outlier_channels: int = 4,
    outlier_scale: float = 6.0,
    dtype: torch.dtype = torch.float32,
) -> Workload:
    g = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g)

    n_chunks = cached_chunks + 1
    # per-channel key statistics: modest spread, a few outlier channels per head
    k_std = torch.exp(0.3 * randn(heads, 1, head_dim))
    k_mean = 0.5 * randn(heads, 1, head_dim)
    out_idx = torch.stack([torch.randperm(head_dim, generator=g)[:outlier_channels] for _ in range(heads)])
    for h in range(heads):
        k_std[h, 0, out_idx[h]] *= outlier_scale
        k_mean[h, 0, out_idx[h]] += outlier_scale * torch.sign(randn(outlier_channels))
    keys = [k_mean + k_std * randn(heads, chunk_tokens, head_dim) for _ in range(n_chunks)]
    values = [randn(heads, chunk_tokens, head_dim) for _ in range(n_chunks)]
    # queries: a shared direction per head, plus a pull toward their own chunk's keys
    q_dir = 0.6 * randn(heads, 1, head_dim)
    q = q_dir + 0.5 * randn(heads, chunk_tokens, head_dim) + 0.35 * (keys[-1] - k_mean) / k_std
    q = q / k_std.sqrt()  # queries are small where keys are large, as with trained QK norms

    def prep(t: Tensor) -> Tensor:
        return t.unsqueeze(0).to(dtype).contiguous()

    return Workload(
        q=prep(q),
        k_cached=[prep(k) for k in keys[:-1]],
        v_cached=[prep(v) for v in values[:-1]],
        k_cur=prep(keys[-1]),
        v_cur=prep(values[-1]),
    )
