"""Independent references for the combination matrix: one masked full forward of ComfyUI's own Wan over chunks.

:func:`masked_forward` runs ``WanModel.forward_orig`` once over pieces of latent frames, each at its own
absolute RoPE frame and timestep, with a token-level attention mask built from which pieces each piece's
queries see, and an optional additive score bias on the keys the last piece attends (Krea's
``log(bias)``). Self-attention only is replaced (through ComfyUI's ``optimized_attention_override``);
cross-attention and everything else is ComfyUI's. It knows nothing of the pack: a test states which
chunks a cache should hold at a call and how they were written, and compares the call's output with it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class Piece:
    """Latent frames ``x`` (B, C, T, H, W, as the model sees them) at RoPE frame ``frame``, timestep ``t`` (B,)."""

    x: torch.Tensor
    t: torch.Tensor
    frame: int

    @property
    def frames(self) -> int:
        return int(self.x.shape[2])


def masked_forward(
    dm,
    pieces: list[Piece],
    context: torch.Tensor,
    sees: list[list[int]],
    *,
    key_bias: dict[int, tuple[int, float]] | None = None,
) -> torch.Tensor:
    """The output of the last piece from one forward over ``pieces``.

    ``sees[i]`` lists the pieces whose keys piece ``i``'s queries attend (itself included, if it should).
    ``key_bias[j] = (exempt, value)``: the last piece's scores of piece ``j``'s keys get ``value`` added,
    except its first ``exempt`` tokens."""
    x = torch.cat([p.x for p in pieces], dim=2)
    B, _, _, H, W = x.shape
    tpf = math.ceil(H / 2) * math.ceil(W / 2)
    t = torch.cat([p.t.reshape(B, 1).expand(B, p.frames) for p in pieces], dim=1)
    starts = [0]
    for p in pieces:
        starts.append(starts[-1] + p.frames * tpf)
    L = starts[-1]
    mask = torch.full((L, L), float("-inf"))
    for i, seen in enumerate(sees):
        for j in seen:
            mask[starts[i] : starts[i + 1], starts[j] : starts[j + 1]] = 0.0
    last = len(pieces) - 1
    for j, (exempt, value) in (key_bias or {}).items():
        cols = slice(starts[j] + exempt, starts[j + 1])
        mask[starts[last] :, cols] = mask[starts[last] :, cols] + value
    freqs = torch.cat(
        [dm.rope_encode(p.frames, H, W, t_start=p.frame, device=x.device, dtype=torch.float32) for p in pieces], dim=1
    )

    def override(func, q, k, v, *args, **kwargs):
        if q.shape[1] == L and k.shape[1] == L and q.ndim == 3:
            heads = kwargs["heads"] if "heads" in kwargs else args[0]
            b, n, dim = q.shape
            d = dim // heads
            qh, kh, vh = (a.view(b, n, heads, d).transpose(1, 2) for a in (q, k, v))
            out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask.to(qh.dtype))
            return out.transpose(1, 2).reshape(b, n, dim)
        return func(q, k, v, *args, **kwargs)

    with torch.no_grad():
        out = dm.forward_orig(
            x, t, context, freqs=freqs, transformer_options={"optimized_attention_override": override}
        )
    return out[:, :, -pieces[-1].frames :]


class ForwardRecorder:
    """Every ``forward_orig`` call of a Wan diffusion model, as the model sees it: x (model space), t, the text
    context, the output and the CFG slots (``cond_or_uncond``) - denoising steps, cache writes, re-caches and
    SkyReels' per-step redraws alike. Install it on the instance (``monkeypatch.setattr(dm, "forward_orig",
    recorder)``); :func:`masked_forward` calls the class's method and is not recorded."""

    def __init__(self, dm):
        self.dm, self.calls = dm, []

    def __call__(self, x, t, context, *args, **kwargs):
        out = type(self.dm).forward_orig(self.dm, x, t, context, *args, **kwargs)
        to = kwargs.get("transformer_options") or {}
        self.calls.append(
            {
                "x": x.detach().clone(),
                "t": t.detach().clone(),
                "context": context.detach().clone(),
                "out": out.detach().clone(),
                "cond_or_uncond": list(to.get("cond_or_uncond") or []),
            }
        )
        return out


def causal(n: int) -> list[list[int]]:
    """Each of ``n`` pieces sees itself and every piece before it."""
    return [list(range(i + 1)) for i in range(n)]


def windowed(n: int, window: int, sink: int) -> list[list[int]]:
    """Block-causal under a window of ``window`` pieces and a sink of ``sink``: piece i sees j <= i with
    j >= i - window or j < sink (each piece one chunk, written once, in order)."""
    return [[j for j in range(i + 1) if j >= i - window or j < sink] for i in range(n)]
