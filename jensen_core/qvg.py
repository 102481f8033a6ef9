"""QuantVideoGen (QVG) as a cache method: k-means smoothing + progressive residual quantization.

QVG (Xi et al., "Quant VideoGen", arXiv 2602.02958, ICML 2026) exploits the redundancy of video
tokens: per (batch, head) and per cached chunk, ``S`` stages of k-means over the chunk's tokens
(``K`` centroids of ``head_dim`` channels) each subtract the assigned centroid ("semantic-aware
smoothing", then "progressive residual quantization" over the stages); the small final residual
is quantized group-wise along ``head_dim``. Here that last step is this pack's own quantizer
(:func:`jensen_core.rtn.quantize_rotated`: asymmetric RTN, bit-packed codes, FP8 E4M3 steps,
BF16 grid origins), so a QVG chunk stores

- per stage, ``min(K, tokens)`` centroids in BF16 and one uint8 cluster id per token;
- the residual's packed codes, steps and grid origins (minima), exactly as an RTN chunk does.

The centroids are exact as stored (the residual is taken against the BF16-rounded centroids), so
the only quantization noise on a reconstructed key is the residual's, and the Jensen bias of a QVG
key comes from the residual's steps alone: :meth:`QVGTensor.step_sizes` returns them, and every
correction (Taylor, exact, per-channel, the fused fast path) uses them unchanged.

With ``rotation="hadamard"`` the rotation comes first: k-means runs on the rotated vectors (the
rotation is orthogonal, so distances and clusters are the same) and the centroids live in the
rotated space with the residual's codes.

Ported from the algorithm of the reference implementation (``svg-project/Quant-VideoGen``,
``prq_quant`` / ``batch_kmeans_Euclid``), not its code. What differs:

- initial centroids are ``K`` *distinct* tokens drawn per (seed, global head index, stage)
  (:func:`head_seed`; the reference draws ``K`` token indices with replacement from the global RNG,
  so a chunk can start with duplicated, forever-empty centroids), and every (batch, head) row stops
  on its own: a process holding some of the heads (a sequence-parallel rank) gets exactly the
  single process's result for them;
- the returned centroids are always the member means of the final assignment (the reference
  returns the previous centroids when it stops on the tolerance);
- the residual quantizer is this pack's asymmetric RTN with BF16 zero-points; the reference's
  default is symmetric absmax (INT2 then uses 3 of its 4 levels) with an FP8 scale and no zero-point;
- k-means runs per chunk; some reference integrations cluster a span of several chunks at once
  (``quant_factor``), which spreads the centroid table over more tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from .hadamard import unrotate
from .rtn import QuantizedTensor, cat_rtn, check_cat_compatible, quantize_rotated
from .spec import QuantSpec, qvg_auto_centroids
from .stored import StoredTensor

#: k-means stops early once fewer than this fraction of the tokens change cluster (the reference's rule)
KMEANS_TOL = 1e-4
#: at most this many bytes of (rows, tokens, centroids) distances are materialised at once
_DIST_BLOCK_BYTES = 64 * 2**20
CENTROID_DTYPE = torch.bfloat16


# --------------------------------------------------------------------------------------------- k-means
def _assign(x: Tensor, c: Tensor) -> Tensor:
    """Nearest centroid (squared Euclidean) of every token: ``x`` (N, T, d), ``c`` (N, k, d) -> (N, T) int64.

    ``argmin_j ||x - c_j||^2 = argmin_j (||c_j||^2 - 2 x.c_j)``: one batched matmul, in row blocks
    so that at most ``_DIST_BLOCK_BYTES`` of distances exist at a time. Ties go to the lower index.
    """
    N, T, _ = x.shape
    k = c.shape[1]
    c_sq = c.square().sum(-1)  # (N, k)
    rows = max(1, _DIST_BLOCK_BYTES // max(1, T * k * 4))
    out = torch.empty(N, T, dtype=torch.int64, device=x.device)
    for r0 in range(0, N, rows):
        sl = slice(r0, r0 + rows)
        dist = torch.baddbmm(c_sq[sl].unsqueeze(1), x[sl], c[sl].transpose(1, 2), alpha=-2.0)
        out[sl] = dist.argmin(-1)
    return out


def _update(x: Tensor, ids: Tensor, old: Tensor) -> Tensor:
    """Member means of every cluster (float32 sums); an empty cluster keeps its old centroid."""
    N, T, d = x.shape
    k = old.shape[1]
    sums = torch.zeros(N, k, d, dtype=torch.float32, device=x.device)
    sums.scatter_add_(1, ids.unsqueeze(-1).expand(N, T, d), x)
    counts = torch.zeros(N, k, dtype=torch.float32, device=x.device)
    counts.scatter_add_(1, ids, torch.ones(N, T, dtype=torch.float32, device=x.device))
    means = sums / counts.clamp_min(1.0).unsqueeze(-1)
    return torch.where((counts > 0).unsqueeze(-1), means, old)


def kmeans(
    x: Tensor,
    k: int,
    iters: int,
    tol: float = KMEANS_TOL,
    generator: torch.Generator | None = None,
    *,
    init: Tensor | None = None,
) -> tuple[Tensor, Tensor, int]:
    """Batched Lloyd k-means: ``x`` (N, T, d) float32 -> (ids (N, T) int64, centroids (N, min(k, T), d), iterations).

    Starts from ``min(k, T)`` distinct tokens per row: ``init`` (N, min(k, T)) token indices, or drawn
    with ``generator`` on the CPU (so a CPU and a GPU run start alike). Every row runs on its own: at
    most ``iters`` assign/update rounds, and it stops earlier once fewer than ``tol`` of its tokens
    changed cluster, so a row's result depends on that row alone (its data and its start), never on
    the other rows in the batch. ``iterations`` is the most rounds any row ran. The centroids
    returned are the member means of the returned assignment (an empty cluster keeps its previous
    centroid). With ``T <= k`` every token is its own centroid.
    """
    if x.dim() != 3 or not x.is_floating_point():
        raise ValueError(f"kmeans expects a floating-point (rows, tokens, dim) tensor, got {tuple(x.shape)} {x.dtype}")
    if k < 1 or iters < 1:
        raise ValueError(f"kmeans needs k >= 1 and iters >= 1, got k={k}, iters={iters}")
    x = x.to(torch.float32)
    N, T, d = x.shape
    k = min(k, T)
    if init is None:
        pick = torch.rand(N, T, generator=generator).argsort(-1)[:, :k]
    elif tuple(init.shape) != (N, k) or init.dtype != torch.int64:
        raise ValueError(f"kmeans init must be (rows, min(k, tokens)) = {(N, k)} int64, got {tuple(init.shape)}")
    else:
        pick = init
    c = torch.gather(x, 1, pick.to(x.device).unsqueeze(-1).expand(N, k, d))
    ids = torch.empty(N, T, dtype=torch.int64, device=x.device)
    rows = torch.arange(N, device=x.device)  # the rows still iterating
    xa, ca, prev = x, c, None
    it = 0
    while rows.numel():
        it += 1
        ia = _assign(xa, ca)
        ca = _update(xa, ia, ca)
        if it >= iters:
            done = torch.ones(rows.numel(), dtype=torch.bool, device=x.device)
        elif prev is not None:
            done = (ia != prev).sum(-1).to(torch.float32) < tol * T
        else:
            done = torch.zeros(rows.numel(), dtype=torch.bool, device=x.device)
        if bool(done.any()):
            ids[rows[done]] = ia[done]
            c[rows[done]] = ca[done]
            keep = ~done
            rows, xa, ca, ia = rows[keep], xa[keep], ca[keep], ia[keep]
        prev = ia
    return ids, c, it


def head_seed(seed: int, head: int, stage: int) -> int:
    """The seed of one head's k-means start in one stage: a SplitMix64 mix of (seed, global head index, stage).

    It depends on nothing else, so a process holding heads ``[h0, h0 + n)`` (a sequence-parallel rank,
    ``head_offset=h0``) draws what the single process draws for those heads.
    """
    z = seed & _M64
    for part in (head, stage):
        z = _splitmix64(_splitmix64(z) ^ (part & _M64))
    return z >> 1  # a non-negative 63-bit seed


_M64 = (1 << 64) - 1


def _splitmix64(z: int) -> int:
    z = (z + 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def initial_picks(seed: int, stage: int, heads: range, tokens: int, k: int) -> Tensor:
    """Per head of ``heads`` (global indices), the ``k`` distinct tokens one stage's k-means starts from, (len, k)."""
    out = torch.empty(len(heads), k, dtype=torch.int64)
    for i, h in enumerate(heads):
        gen = torch.Generator().manual_seed(head_seed(seed, h, stage))
        out[i] = torch.rand(tokens, generator=gen).argsort()[:k]
    return out


def _gather_rows(c: Tensor, ids: Tensor) -> Tensor:
    """``c`` (N, k, d), ``ids`` (N, T) -> (N, T, d): each token's centroid."""
    return torch.gather(c, 1, ids.unsqueeze(-1).expand(*ids.shape, c.shape[-1]))


# --------------------------------------------------------------------------------------------- tensor
@dataclass(eq=False)
class QVGTensor(StoredTensor):
    """A QVG-quantized tensor of shape ``(..., tokens, head_dim)``: centroids + cluster ids + quantized residual.

    ``residual`` is the RTN-quantized final residual (a :class:`QuantizedTensor` in the rotated
    space, carrying this tensor's spec, shape and dtype), so :meth:`step_sizes` is the residual's
    step size Delta; ``centroids`` has shape ``(stages, ..., k_total, head_dim)`` in BF16 and
    ``ids`` ``(stages, ..., tokens)`` in uint8. ``segments`` lists ``(tokens, k)`` of each chunk
    concatenated here, in token order: the ids of a segment index that segment's ``k`` rows of the
    centroid table (one segment per cached chunk; :func:`cat_qvg` joins chunks for diagnostics
    without re-indexing anything).
    """

    residual: QuantizedTensor
    centroids: Tensor
    ids: Tensor
    segments: tuple[tuple[int, int], ...]

    @property
    def spec(self) -> QuantSpec:
        return self.residual.spec

    @property
    def shape(self) -> torch.Size:
        return self.residual.shape

    @property
    def dtype(self) -> torch.dtype:
        return self.residual.dtype

    @property
    def scale_format(self) -> str:
        return self.residual.scale_format

    @property
    def device(self) -> torch.device:
        return self.residual.device

    @property
    def stages(self) -> int:
        return self.ids.shape[0]

    @property
    def nbytes(self) -> int:
        """Bytes really stored: the residual's codes, steps and minima, the centroids and the cluster ids."""
        return self.residual.nbytes + sum(t.numel() * t.element_size() for t in (self.centroids, self.ids))

    def to(self, device: str | torch.device) -> QVGTensor:
        """The same stored bytes on ``device`` (residual, centroids and ids; nothing re-quantized)."""
        return QVGTensor(
            residual=self.residual.to(device),
            centroids=self.centroids.to(device),
            ids=self.ids.to(device),
            segments=self.segments,
        )

    def _with(self, residual: QuantizedTensor, centroids: Tensor, ids: Tensor) -> QVGTensor:
        return QVGTensor(residual=residual, centroids=centroids, ids=ids, segments=self.segments)

    def __getitem__(self, idx) -> QVGTensor:
        """Index the leading dimensions (batch, heads); the tokens share per-chunk centroid tables and stay whole."""
        if not isinstance(idx, tuple):
            idx = (idx,)
        n_lead = len(self.shape) - 2
        if len(idx) == n_lead + 1 and isinstance(idx[-1], slice) and idx[-1] == slice(None):
            idx = idx[:-1]
        if any(i is Ellipsis or i is None for i in idx) or len(idx) > n_lead:
            raise IndexError("a QVG tensor indexes only its dimensions before (tokens, head_dim), without ... or None")
        full = (slice(None), *idx)
        return self._with(self.residual[idx], self.centroids[full], self.ids[full])

    def flatten_leading(self) -> QVGTensor:
        """View with the dimensions before (tokens, head_dim) flattened into one."""
        S = self.stages
        return self._with(
            self.residual.flatten_leading(),
            self.centroids.reshape(S, -1, *self.centroids.shape[-2:]),
            self.ids.reshape(S, -1, self.tokens),
        )

    def step_sizes(self) -> Tensor:
        """The residual's stored step size per group, float32, shape ``(..., tokens, head_dim // group_size)``."""
        return self.residual.step_sizes()

    def codes(self) -> Tensor:
        """The residual's unpacked integer codes, uint8, shape ``(..., tokens, head_dim)``."""
        return self.residual.codes()

    def _token_offsets(self) -> Tensor:
        """Row offset into the centroid table of each token's segment, (tokens,) int64."""
        offs, tok = [], []
        start = 0
        for t, k in self.segments:
            offs.append(start)
            tok.append(t)
            start += k
        return torch.repeat_interleave(torch.tensor(offs, dtype=torch.int64), torch.tensor(tok)).to(self.device)

    @property
    def interleaved(self) -> bool:
        """QVG chunks are reconstructed in channel order (centroids + residual), never interleaved."""
        return False

    def dequantize_interleaved(self, out: Tensor) -> Tensor:
        raise ValueError("no interleaved dequantization for QVG tensors (centroids + residual, in channel order)")

    def smoothing(self) -> Tensor:
        """Sum over stages of each token's centroid, float32, shape ``(..., tokens, head_dim)``, in the rotated space."""
        S, d = self.stages, self.head_dim
        offs = self._token_offsets()
        c = self.centroids.reshape(S, -1, self.centroids.shape[-2], d)
        ids = self.ids.reshape(S, -1, self.tokens)
        total = None
        for s in range(S):
            g = _gather_rows(c[s].to(torch.float32), ids[s].to(torch.int64) + offs)
            total = g if total is None else total.add_(g)
        return total.reshape(self.shape)

    def dequantize(self, dtype: torch.dtype | None = None, rotated: bool = False, out: Tensor | None = None) -> Tensor:
        """Reconstruct ``sum_s centroid_s[id_s] + (m + code * delta)`` (summed in float32).

        ``rotated`` and ``out`` as in :meth:`QuantizedTensor.dequantize`.
        """
        dtype = dtype or (out.dtype if out is not None else self.dtype)
        x = self.residual.dequantize(dtype=torch.float32, rotated=True).add_(self.smoothing())
        if self.spec.rotation == "hadamard" and not rotated:
            x = unrotate(x, self.spec.seed)
        if out is not None:
            out.copy_(x)
            return out
        return x.to(dtype)


def quantize_qvg(xf: Tensor, spec: QuantSpec, dtype: torch.dtype, head_offset: int = 0) -> QVGTensor:
    """QVG of a float32 tensor ``(..., tokens, head_dim)`` already in the codes' space (rotated if any).

    Per (leading index) row: ``spec.qvg_stages`` rounds of :func:`kmeans` with
    ``spec.qvg_centroids`` centroids (0, auto: :func:`~jensen_core.spec.qvg_auto_centroids` of the tokens)
    and at most ``spec.qvg_iters`` iterations, each subtracting the BF16-rounded centroids; then
    :func:`~jensen_core.rtn.quantize_rotated` of the residual.

    Heads are the dimension before (tokens, head_dim) (a 2-D tensor is one head). Each row's start
    comes from (``spec.seed``, its global head index ``head_offset + h``, stage) only
    (:func:`head_seed`) and each row stops on its own, so quantizing heads ``[h0, h0 + n)`` with
    ``head_offset=h0`` gives exactly that slice of quantizing all heads; the batch items of one head
    start alike.
    """
    if isinstance(head_offset, bool) or not isinstance(head_offset, int) or head_offset < 0:
        raise ValueError(f"head_offset={head_offset!r} must be a whole number >= 0 (the first head's global index)")
    shape = xf.shape
    T, d = shape[-2], shape[-1]
    rows = xf.reshape(-1, T, d).to(torch.float32)
    heads = shape[-3] if len(shape) >= 3 else 1
    residual = rows
    cents, ids = [], []
    k_picked = spec.qvg_centroids or qvg_auto_centroids(T, spec.qvg_stages)  # 0: auto, from the chunk's tokens
    k = min(k_picked, T)
    for stage in range(spec.qvg_stages):
        starts = initial_picks(spec.seed, stage, range(head_offset, head_offset + heads), T, k)
        i, c, _ = kmeans(residual, k, spec.qvg_iters, init=starts.repeat(rows.shape[0] // heads, 1))
        c = c.to(CENTROID_DTYPE)
        residual = residual - _gather_rows(c.to(torch.float32), i)
        cents.append(c)
        ids.append(i.to(torch.uint8))
    S = spec.qvg_stages
    return QVGTensor(
        residual=quantize_rotated(residual.reshape(shape), spec, dtype=dtype),
        centroids=torch.stack(cents).reshape(S, *shape[:-2], k, d),
        ids=torch.stack(ids).reshape(S, *shape[:-1]),
        segments=((T, k),),
    )


def cat_qvg(parts: list[QVGTensor]) -> QVGTensor:
    """Concatenate QVG tensors along the token axis: the centroid tables are stacked, the ids kept as stored."""
    first = parts[0]
    if not all(isinstance(p, QVGTensor) for p in parts):
        raise ValueError("cat_quantized: cannot mix QVG and plain quantized tensors")
    check_cat_compatible(parts)
    if len(parts) == 1:
        return first
    return QVGTensor(
        residual=cat_rtn([p.residual for p in parts]),
        centroids=torch.cat([p.centroids for p in parts], dim=-2),
        ids=torch.cat([p.ids for p in parts], dim=-1),
        segments=tuple(s for p in parts for s in p.segments),
    )


def reconstruction_snr_db(x: Tensor, x_hat: Tensor) -> float:
    """10 log10(||x||^2 / ||x - x_hat||^2), the SQNR of a reconstruction in dB."""
    err = float((x.double() - x_hat.double()).square().sum())
    return math.inf if err == 0 else 10 * math.log10(float(x.double().square().sum()) / err)
