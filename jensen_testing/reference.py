"""Reference computations for the Wan adapter tests: a recorder and block-causal full forwards.

Independent of the adapter: the full forward runs ComfyUI's own ``WanModel.forward_orig`` over the
whole video with per-frame timesteps and a block-causal mask injected through ComfyUI's
``optimized_attention_override`` (self-attention only; cross-attention goes to ComfyUI's kernel).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class DiffusionModelRecorder:
    """A ``WrappersMP.DIFFUSION_MODEL`` wrapper that records every call's inputs and output (outermost)."""

    def __init__(self):
        self.calls: list[dict] = []

    def __call__(
        self, executor, x, timestep, context, clip_fea=None, time_dim_concat=None, transformer_options=None, **kwargs
    ):
        out = executor(x, timestep, context, clip_fea, time_dim_concat, transformer_options, **kwargs)
        self.calls.append(
            {
                "x": x.detach().clone(),
                "t": timestep.detach().clone(),
                "context": context.detach().clone(),
                "out": out.detach().clone(),
                "cond_or_uncond": list((transformer_options or {}).get("cond_or_uncond", [])),
            }
        )
        return out


def block_causal_mask(
    chunk_of_frame: list[int], tokens_per_frame: int, window: int | None, sink: int = 0
) -> torch.Tensor:
    """bool (L, L): token i may attend token j when chunk(j) <= chunk(i) (and within ``window`` chunks,
    or among the first ``sink`` chunks, which every later chunk sees)."""
    c = torch.tensor(chunk_of_frame).repeat_interleave(tokens_per_frame)
    ci, cj = c[:, None], c[None, :]
    mask = cj <= ci
    if window:
        mask &= (cj >= ci - window) | (cj < sink)
    return mask


def block_causal_forward(
    dm,
    frames: list[torch.Tensor],
    timesteps: list[torch.Tensor],
    context: torch.Tensor,
    window: int | None = None,
    rope_offsets: bool = True,
    sink: int = 0,
    first_frame: int = 0,
) -> torch.Tensor:
    """One forward of ``WanModel`` over the chunks ``frames`` (each (B, C, T_i, H, W)) at once.

    ``timesteps[i]`` is chunk i's timestep per batch row; chunk i attends chunks <= i (and at most
    ``window`` earlier ones). ``rope_offsets=False`` restarts RoPE at frame 0 for every chunk
    (the bug the adapter must not have) - a negative control.
    """
    x = torch.cat(frames, dim=2)
    B, _, T, H, W = x.shape
    chunk_of_frame = [i for i, f in enumerate(frames) for _ in range(f.shape[2])]
    t = torch.cat([ts.reshape(B, 1).expand(B, f.shape[2]) for ts, f in zip(timesteps, frames)], dim=1)
    tpf = (H // 2) * (W // 2)
    mask = block_causal_mask(chunk_of_frame, tpf, window, sink).to(x.device)
    L = T * tpf
    if rope_offsets:
        freqs = dm.rope_encode(T, H, W, t_start=first_frame, device=x.device, dtype=torch.float32)
    else:
        freqs = torch.cat(
            [dm.rope_encode(f.shape[2], H, W, t_start=0, device=x.device, dtype=torch.float32) for f in frames], dim=1
        )

    def override(func, q, k, v, *args, **kwargs):
        if q.shape[1] == L and k.shape[1] == L and q.ndim == 3:
            heads = kwargs["heads"] if "heads" in kwargs else args[0]
            b, n, dim = q.shape
            d = dim // heads
            qh, kh, vh = (a.view(b, n, heads, d).transpose(1, 2) for a in (q, k, v))
            out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask)
            return out.transpose(1, 2).reshape(b, n, dim)
        return func(q, k, v, *args, **kwargs)

    with torch.no_grad():
        return dm.forward_orig(
            x, t, context, freqs=freqs, transformer_options={"optimized_attention_override": override}
        )
