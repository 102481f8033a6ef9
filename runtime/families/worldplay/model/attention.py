"""The attention of HY-WorldPlay's two vision streams, as one injectable callable.

Every double block of WorldPlay attends twice per call, over the same keys:

- stream ``"img"``: the block's own attention (``img_attn``), q and k with 3-D RoPE;
- stream ``"prope"``: the same q, k, v before RoPE, PRoPE-transformed by each frame's camera
  (``runtime.families.worldplay.model.prope``); its output goes back through ``P`` and ``img_attn_prope_proj``.

In both, a call's vision tokens attend to ``[text prefix, context, own tokens]``. The text prefix is
the prompt's K/V of that block, computed once per prompt (WorldPlay's text stream never sees the
vision tokens), the same for both streams; the context is whatever the caller keeps (nothing, a
block-causal past, or re-encoded frames). The model calls **one** function for both streams::

    attention(layer, stream, q, k, v, text_k, text_v) -> out

with ``q``, ``k``, ``v`` ``(batch, heads, tokens, head_dim)`` of the call's vision tokens and
``text_k``, ``text_v`` ``(batch, heads, text_tokens, head_dim)``; ``out`` has ``q``'s shape. The default
is :func:`sdpa_attention` (no context); :class:`BlockCausalAttention` is the reference's training-time
chunk mask; :class:`ContextKV` is the reference's AR memory in full precision (write the re-encoded
context once, read it while denoising). A quantized cache is one more such callable. Pure torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

STREAMS = ("img", "prope")


class VisionAttention(Protocol):
    """What the WorldPlay model calls for each block and stream."""

    def __call__(
        self, layer: int, stream: str, q: Tensor, k: Tensor, v: Tensor, text_k: Tensor, text_v: Tensor
    ) -> Tensor: ...


def _sdpa(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def sdpa_attention(layer: int, stream: str, q: Tensor, k: Tensor, v: Tensor, text_k: Tensor, text_v: Tensor) -> Tensor:
    """Plain SDPA over ``[text prefix, own tokens]`` (the reference's first chunk, and any call without context)."""
    return _sdpa(q, torch.cat([text_k, k], dim=2), torch.cat([text_v, v], dim=2))


@dataclass(frozen=True)
class BlockCausalAttention:
    """Queries of chunk ``i`` attend the text prefix and chunks ``0 .. i`` of the call (``chunk_tokens`` each): the
    reference's ``torch_causal`` mask, with which a whole video is one teacher-forced forward."""

    chunk_tokens: int

    def __call__(self, layer: int, stream: str, q: Tensor, k: Tensor, v: Tensor, text_k: Tensor, text_v: Tensor):
        n, nt = q.shape[2], text_k.shape[2]
        if n <= self.chunk_tokens:
            return sdpa_attention(layer, stream, q, k, v, text_k, text_v)
        chunk = torch.arange(n, device=q.device) // self.chunk_tokens
        allowed = torch.ones(n, nt + n, dtype=torch.bool, device=q.device)
        allowed[:, nt:] = chunk[None, :] <= chunk[:, None]
        return _sdpa(q, torch.cat([text_k, k], dim=2), torch.cat([text_v, v], dim=2), allowed)


@dataclass
class ContextKV:
    """The reference's AR memory in full precision, per (layer, stream).

    ``mode = "write"``: the call re-encodes the context frames; each layer's k, v are kept (replacing
    what was kept) and the context attends ``[text, itself]``. ``mode = "read"``: the call denoises a
    chunk; it attends ``[text, kept context, own tokens]`` and keeps nothing."""

    mode: str = "read"
    kept: dict[tuple[int, str], tuple[Tensor, Tensor]] = field(default_factory=dict)

    def clear(self) -> None:
        self.kept.clear()

    def __call__(self, layer: int, stream: str, q: Tensor, k: Tensor, v: Tensor, text_k: Tensor, text_v: Tensor):
        if stream not in STREAMS:
            raise ValueError(f"stream {stream!r} is not one of {STREAMS}")
        if self.mode == "write":
            self.kept[(layer, stream)] = (k, v)
            return sdpa_attention(layer, stream, q, k, v, text_k, text_v)
        if self.mode != "read":
            raise ValueError(f"mode {self.mode!r} must be 'write' or 'read'")
        ctx = self.kept.get((layer, stream))
        if ctx is None:
            return sdpa_attention(layer, stream, q, k, v, text_k, text_v)
        return _sdpa(q, torch.cat([text_k, ctx[0], k], dim=2), torch.cat([text_v, ctx[1], v], dim=2))


@dataclass(frozen=True)
class TextPrefix:
    """The prompt's K/V per double block, ``(batch, heads, text_tokens, head_dim)`` each, computed once per prompt."""

    keys: Sequence[Tensor]
    values: Sequence[Tensor]

    def __post_init__(self) -> None:
        if len(self.keys) != len(self.values):
            raise ValueError(f"{len(self.keys)} key and {len(self.values)} value tensors: one pair per layer")

    @property
    def layers(self) -> int:
        return len(self.keys)

    @property
    def tokens(self) -> int:
        return self.keys[0].shape[2] if self.keys else 0

    def layer(self, i: int) -> tuple[Tensor, Tensor]:
        return self.keys[i], self.values[i]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))


__all__ = ["STREAMS", "BlockCausalAttention", "ContextKV", "TextPrefix", "VisionAttention", "sdpa_attention"]
