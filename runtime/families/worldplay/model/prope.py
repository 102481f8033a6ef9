"""PRoPE, the camera-projective transform of HY-WorldPlay's second attention stream.

Each latent frame has a camera: a world-to-camera matrix ``W`` (4 x 4, rigid) and intrinsics ``K``
(3 x 3, normalised: ``fx / width``, ``fy / height``). PRoPE keeps the focal lengths only (the
principal point is dropped) and builds the frame's projection ``P = lift(diag(fx, fy, 1)) @ W``
(image <- world, 4 x 4). The head dimension is cut into blocks of 4 channels, and every block of a
token of frame ``f`` is multiplied by a 4 x 4 matrix of that frame:

- queries by ``P_f^T``, keys and values by ``P_f^-1``, the attention output by ``P_f``.

So a query of frame ``a`` and a key of frame ``b`` score ``q^T P_a P_b^-1 k``: the attention sees the
relative projective transform between the two cameras, whatever the world frame. Without ``K`` the
projection is ``W`` itself (GTA). The inverse is analytic (``W`` rigid, ``K`` without skew), as in
the PRoPE paper (Li et al., "Projective Positional Encoding for Multiview Transformers").

Tensors are SDPA's layout: ``(batch, heads, tokens, head_dim)``, tokens frame-major, so the
``tokens`` axis reshapes to ``(frames, tokens_per_frame)``. Matrices are built in float64 and the
blocks are transformed in float32 (or float64 for float64 inputs), then cast back. Pure torch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

#: channels per block the 4 x 4 matrices act on
BLOCK = 4


def _check_cameras(viewmats: Tensor, intrinsics: Tensor | None) -> None:
    if viewmats.ndim != 4 or viewmats.shape[-2:] != (4, 4):
        raise ValueError(f"viewmats of shape {tuple(viewmats.shape)} must be (batch, frames, 4, 4) world-to-camera")
    if intrinsics is not None and (intrinsics.ndim != 4 or intrinsics.shape[-2:] != (3, 3)):
        raise ValueError(f"intrinsics of shape {tuple(intrinsics.shape)} must be (batch, frames, 3, 3)")
    if intrinsics is not None and intrinsics.shape[:2] != viewmats.shape[:2]:
        raise ValueError(
            f"intrinsics {tuple(intrinsics.shape[:2])} and viewmats {tuple(viewmats.shape[:2])} must give one "
            "camera per (batch, frame)"
        )


def invert_rigid(m: Tensor) -> Tensor:
    """The inverse of rigid 4 x 4 transforms ``[R t; 0 1]``: ``[R^T  -R^T t; 0 1]``."""
    out = torch.zeros_like(m)
    rt = m[..., :3, :3].transpose(-1, -2)
    out[..., :3, :3] = rt
    out[..., :3, 3] = -(rt @ m[..., :3, 3:]).squeeze(-1)
    out[..., 3, 3] = 1
    return out


def projection_matrices(viewmats: Tensor, intrinsics: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """``(P, P^-1)`` per camera, float64, shapes ``(batch, frames, 4, 4)``.

    ``P = diag(fx, fy, 1, 1) @ W`` (``W`` world-to-camera, ``fx = K[0, 0]``, ``fy = K[1, 1]``; the
    principal point and any skew of ``K`` are ignored, as the reference does); without intrinsics
    ``P = W``."""
    _check_cameras(viewmats, intrinsics)
    w = viewmats.to(torch.float64)
    if intrinsics is None:
        return w, invert_rigid(w)
    k = intrinsics.to(torch.float64)
    fx, fy = k[..., 0, 0], k[..., 1, 1]
    if bool((fx == 0).any() or (fy == 0).any()):
        raise ValueError("intrinsics have a zero focal length (K[0, 0] or K[1, 1]): PRoPE cannot invert them")
    one = torch.ones_like(fx)
    lift = torch.diag_embed(torch.stack([fx, fy, one, one], dim=-1))
    lift_inv = torch.diag_embed(torch.stack([1 / fx, 1 / fy, one, one], dim=-1))
    return lift @ w, invert_rigid(w) @ lift_inv


def apply_blockwise(x: Tensor, matrices: Tensor) -> Tensor:
    """Multiply every 4-channel block of every token by its frame's matrix: ``out[..., blk] = M_f @ x[..., blk]``.

    ``x``: ``(batch, heads, tokens, head_dim)`` with ``tokens = frames * tokens_per_frame`` (frame-major) and
    ``head_dim`` a multiple of 4; ``matrices``: ``(batch or 1, frames, 4, 4)``."""
    if x.ndim != 4:
        raise ValueError(f"x of shape {tuple(x.shape)} must be (batch, heads, tokens, head_dim)")
    b, h, n, d = x.shape
    if matrices.ndim != 4 or matrices.shape[-2:] != (BLOCK, BLOCK):
        raise ValueError(f"matrices of shape {tuple(matrices.shape)} must be (batch, frames, 4, 4)")
    frames = matrices.shape[1]
    if d % BLOCK:
        raise ValueError(f"head_dim {d} is not a multiple of {BLOCK}: PRoPE acts on blocks of {BLOCK} channels")
    if frames < 1 or n % frames:
        raise ValueError(f"{n} tokens do not split into {frames} frames of equal size")
    if matrices.shape[0] not in (1, b):
        raise ValueError(f"matrices for batch {matrices.shape[0]} cannot serve a batch of {b}")
    work = torch.float64 if x.dtype == torch.float64 else torch.float32
    xs = x.to(work).reshape(b, h, frames, n // frames, d // BLOCK, BLOCK)
    m = matrices.to(work)
    out = torch.einsum("bfij,bhftkj->bhftki", m.expand(b, -1, -1, -1), xs)
    return out.reshape(b, h, n, d).to(x.dtype)


@dataclass(frozen=True)
class PRoPE:
    """The PRoPE transforms of one call's frames (from :func:`projection_matrices`)."""

    projection: Tensor  # (batch, frames, 4, 4), P
    inverse: Tensor  # (batch, frames, 4, 4), P^-1

    @classmethod
    def from_cameras(cls, viewmats: Tensor, intrinsics: Tensor | None = None) -> PRoPE:
        p, p_inv = projection_matrices(viewmats, intrinsics)
        return cls(p, p_inv)

    @property
    def frames(self) -> int:
        return self.projection.shape[1]

    def queries(self, q: Tensor) -> Tensor:
        """``P^T q`` per block."""
        return apply_blockwise(q, self.projection.transpose(-1, -2))

    def keys_values(self, x: Tensor) -> Tensor:
        """``P^-1 x`` per block (keys and values alike)."""
        return apply_blockwise(x, self.inverse)

    def outputs(self, o: Tensor) -> Tensor:
        """``P o`` per block: the attention output mapped back to the frame's own coordinates."""
        return apply_blockwise(o, self.projection)


def prope_qkv(
    q: Tensor, k: Tensor, v: Tensor, viewmats: Tensor, intrinsics: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor, PRoPE]:
    """Queries, keys and values of one call's tokens in PRoPE form, and the transforms (for the output).

    ``q``, ``k``, ``v``: ``(batch, heads, tokens, head_dim)`` of the same shape; ``viewmats``
    ``(batch, frames, 4, 4)`` world-to-camera, ``intrinsics`` ``(batch, frames, 3, 3)`` or None."""
    if not (q.shape == k.shape == v.shape):
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)} and v {tuple(v.shape)} must have one shape")
    t = PRoPE.from_cameras(viewmats, intrinsics)
    return t.queries(q), t.keys_values(k), t.keys_values(v), t


__all__ = ["BLOCK", "PRoPE", "apply_blockwise", "invert_rigid", "projection_matrices", "prope_qkv"]
