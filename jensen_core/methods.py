"""The quantization methods behind one dispatch: one object per ``QuantSpec.method``.

Callers ask ``method_of(spec)`` what a method does (quantize, concatenate, count its stored bytes,
describe itself, store and read its tensors) instead of branching on ``spec.method``:

- :data:`RTN` - group-wise asymmetric round-to-nearest (:mod:`jensen_core.rtn`);
- :data:`QVG` - QuantVideoGen: k-means smoothing, then RTN of the residual (:mod:`jensen_core.qvg`).

This module imports the formats; they never import it (nor each other, beyond QVG holding an RTN
residual).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .qvg import CENTROID_DTYPE, QVGTensor, cat_qvg, quantize_qvg
from .rtn import QuantizedTensor, cat_rtn, quantize_rotated
from .spec import CENTROID_BYTES, CLUSTER_ID_BYTES, METHODS, QVG_AUTO_CENTROIDS, QuantSpec, qvg_auto_centroids
from .stored import StoredTensor


class QuantMethod:
    """What one quantization method does; stateless, one instance per method in :data:`REGISTRY`."""

    name: str = ""
    #: the stored-tensor class :meth:`quantize` returns
    tensor_type: type[StoredTensor] = StoredTensor
    #: whether ``spec.effective_bits`` is everything stored (else only the residual's part)
    exact_spec_bits: bool = True
    #: whether a block can be held quantized before it is final (else it waits in the model's dtype)
    quantizes_early: bool = True
    #: state-dict suffixes stored beside the RTN parts (``.packed``, ``.scale``, ``.minimum``)
    extra_parts: tuple[str, ...] = ()

    # ------------------------------------------------------------------ tensors
    def quantize(self, xf: Tensor, spec: QuantSpec, dtype: torch.dtype, head_offset: int = 0) -> StoredTensor:
        """Quantize float32 ``xf`` (``(..., tokens, head_dim)``, already rotated if the spec rotates).

        ``head_offset``: the global index of ``xf``'s first head (the dimension before tokens); a method
        whose result depends on the head (QVG's seeded k-means) uses it, so that quantizing a slice of the
        heads equals slicing the quantization of all of them."""
        raise NotImplementedError

    def concatenate(self, parts: list) -> StoredTensor:
        """Join stored tensors of this method along the token axis."""
        raise NotImplementedError

    def residual(self, t: StoredTensor) -> QuantizedTensor:
        """The RTN-quantized part of ``t`` (``t`` itself for RTN)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ storage accounting
    def centroids_per_chunk(self, spec: QuantSpec, tokens: int) -> int:
        """Centroids one stage stores for a chunk of ``tokens`` tokens (0 without k-means)."""
        return 0

    def chunk_extra_bytes(self, spec: QuantSpec, tokens: int, head_dim: int) -> int:
        """Bytes one (batch, head) row of a chunk stores beyond its RTN codes, steps and minima."""
        return 0

    def chunk_nbytes(self, spec: QuantSpec, lead: int, tokens: int, head_dim: int) -> int:
        """Exact bytes one quantized chunk of shape ``(lead..., tokens, head_dim)`` stores (``lead`` = batch x heads).

        Packed codes + one scale and one minimum per group and token, plus what the method adds
        (:meth:`chunk_extra_bytes`). Assumes the scales stay in ``scale_format`` (an FP8 overflow
        falls back to BF16).
        """
        spec.check_head_dim(head_dim)
        G = head_dim // spec.group_size
        per_token = head_dim * spec.bits // 8 + G * (spec.scale_bits + spec.zero_bits) // 8
        return lead * (tokens * per_token + self.chunk_extra_bytes(spec, tokens, head_dim))

    def effective_bits_for(self, spec: QuantSpec, head_dim: int, chunk_tokens: int) -> float:
        """Exact stored bits per element for chunks of ``chunk_tokens`` tokens of ``head_dim`` channels."""
        if chunk_tokens < 1:
            raise ValueError(f"chunk_tokens={chunk_tokens} must be at least 1")
        return self.chunk_nbytes(spec, 1, chunk_tokens, head_dim) * 8 / (chunk_tokens * head_dim)

    def bits_breakdown(self, spec: QuantSpec, head_dim: int | None = None, chunk_tokens: int | None = None) -> dict:
        """The parts of the stored bits per element that can be known from what is given (for the UI)."""
        return {}

    def plan_warnings(self, spec: QuantSpec, side: str, chunk_tokens: int) -> list[str]:
        """Warnings of the planner about this method on chunks of ``chunk_tokens`` tokens."""
        return []

    # ------------------------------------------------------------------ descriptions
    def label(self, spec: QuantSpec) -> str:
        """One side of a run's description (``runtime.config``)."""
        return f"INT{spec.bits} ({spec.effective_bits:g} bits)"

    def scheme(self, spec: QuantSpec) -> str:
        """Short scheme name with the rotation (diagnostics' legend)."""
        raise NotImplementedError

    def knobs_text(self, spec: QuantSpec) -> str | None:
        """The method's own knobs for a run's description, or None."""
        return None

    def report_fields(self, spec: QuantSpec | None) -> dict:
        """The method's knobs in a run report (None where the method has none)."""
        return {"qvg_stages": None, "qvg_centroids": None}

    def report_chunk_fields(self, spec: QuantSpec | None, chunk_tokens: int) -> dict:
        """What a run report adds about the method on chunks of ``chunk_tokens`` tokens (QVG: the K used)."""
        return {}

    def report_kind(self, report: dict, kind: str) -> str:
        """The quantization part of a report's text (``kind`` is "K INT2/V INT4" and the like)."""
        return kind

    # ------------------------------------------------------------------ cache files
    def part_record(self, t: StoredTensor) -> dict:
        """What a cache file's record says about ``t`` beyond shape, dtype and scale format."""
        return {}

    def check_record(self, rec: dict, prefix: str, spec: QuantSpec, shape: list[int]) -> None:
        """Refuse a part record this method cannot have written (ValueError naming ``prefix``)."""

    def state_tensors(self, t: StoredTensor) -> dict[str, Tensor]:
        """The tensors this method stores beside the RTN parts, by suffix."""
        return {}

    def from_state(
        self, residual: QuantizedTensor, sd: dict[str, Tensor], prefix: str, rec: dict, spec: QuantSpec
    ) -> StoredTensor:
        """The stored tensor of a cache file's part, from its checked RTN part and the state dict."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<quantization method {self.name!r}>"


class _RTN(QuantMethod):
    name = "rtn"
    tensor_type = QuantizedTensor

    def quantize(self, xf, spec, dtype, head_offset=0):
        return quantize_rotated(xf, spec, dtype=dtype)  # per token and group: no head enters it

    def concatenate(self, parts):
        return cat_rtn(parts)

    def residual(self, t):
        return t

    def scheme(self, spec):
        return "QuaRot" if spec.rotation == "hadamard" else "RTN"

    def check_record(self, rec, prefix, spec, shape):
        if "segments" in rec:
            raise ValueError(f"cache file entry {prefix} holds QVG centroids but the spec's method is {spec.method!r}")

    def from_state(self, residual, sd, prefix, rec, spec):
        if f"{prefix}.centroids" in sd or "segments" in rec:
            raise ValueError(f"cache file entry {prefix} holds QVG centroids but the spec's method is {spec.method!r}")
        return residual


class _QVG(QuantMethod):
    name = "qvg"
    tensor_type = QVGTensor
    exact_spec_bits = False
    quantizes_early = False  # k-means runs once, on the final block
    extra_parts = (".centroids", ".ids")

    def quantize(self, xf, spec, dtype, head_offset=0):
        return quantize_qvg(xf, spec, dtype=dtype, head_offset=head_offset)

    def concatenate(self, parts):
        return cat_qvg(parts)

    def residual(self, t):
        return t.residual

    def centroids_per_chunk(self, spec, tokens):
        """``min(K, tokens)``; with auto K (``qvg_centroids=0``) K is :func:`~jensen_core.spec.qvg_auto_centroids` of the chunk."""
        if spec.qvg_centroids == QVG_AUTO_CENTROIDS:
            return min(qvg_auto_centroids(tokens, spec.qvg_stages), tokens)
        return min(spec.qvg_centroids, tokens)

    @staticmethod
    def k_text(spec: QuantSpec) -> str:
        """K as a description shows it: the number, or "auto" (picked per chunk)."""
        return "auto" if spec.qvg_centroids == QVG_AUTO_CENTROIDS else str(spec.qvg_centroids)

    def chunk_extra_bytes(self, spec, tokens, head_dim):
        """Per stage one uint8 cluster id per token and ``min(K, tokens)`` BF16 centroids of ``head_dim`` channels."""
        return spec.qvg_stages * (
            tokens * CLUSTER_ID_BYTES + self.centroids_per_chunk(spec, tokens) * head_dim * CENTROID_BYTES
        )

    def bits_breakdown(self, spec, head_dim=None, chunk_tokens=None):
        """``bits + 24/g`` (residual) ``+ 8 S / d`` (cluster ids) ``+ 16 S min(K, T) / T`` (centroids).

        ``residual_bits`` always; ``id_bits`` with ``head_dim``; ``centroid_bits`` and the exact
        ``effective_bits`` with ``chunk_tokens`` too. ``effective_bits`` is the sum of the parts known;
        ``note`` says what it leaves out when not ``exact``.
        """
        out = {
            "residual_bits": spec.effective_bits,
            "id_bits": None,
            "centroid_bits": None,
            "exact": False,
            "effective_bits": spec.effective_bits,
        }
        if head_dim is not None:
            out["id_bits"] = 8.0 * CLUSTER_ID_BYTES * spec.qvg_stages / head_dim
            out["effective_bits"] = spec.effective_bits + out["id_bits"]
            if chunk_tokens is not None:
                exact = self.effective_bits_for(spec, head_dim, chunk_tokens)
                out.update(effective_bits=exact, exact=True, centroid_bits=exact - out["effective_bits"])
        # K per stage and chunk (what auto picks for these chunks), or None when auto and the chunk is unknown
        out["auto_centroids"] = spec.qvg_centroids == QVG_AUTO_CENTROIDS
        out["centroids"] = (
            self.centroids_per_chunk(spec, chunk_tokens)
            if chunk_tokens is not None
            else (None if out["auto_centroids"] else spec.qvg_centroids)
        )
        if not out["exact"]:
            out["note"] = (
                "without "
                + ("head_dim and " if head_dim is None else "")
                + "chunk_tokens: leaves out "
                + ("the cluster ids and " if head_dim is None else "")
                + f"the BF16 centroids ({8 * CENTROID_BYTES}*{spec.qvg_stages}*K/tokens-per-chunk bits); "
                "the planner counts them"
            )
        return out

    def plan_warnings(self, spec, side, chunk_tokens):
        k = self.centroids_per_chunk(spec, chunk_tokens)
        share = spec.qvg_stages * k * 8 * CENTROID_BYTES / chunk_tokens
        if k >= chunk_tokens:
            return [
                f"{side} cache: QVG with K={k} centroids on chunks of {chunk_tokens} tokens "
                "keeps every token as a BF16 centroid (more than a BF16 cache); lower K"
            ]
        if share >= spec.bits:
            return [
                f"{side} cache: QVG's BF16 centroids cost {share:.2f} bits/element on chunks of {chunk_tokens} "
                f"tokens, more than the residual's {spec.bits} bits; lower K (or use longer chunks)"
            ]
        return []

    def label(self, spec):
        return f"QVG + INT{spec.bits} residual ({spec.effective_bits:g} bits + centroids and ids)"

    def scheme(self, spec):
        return ("QVG+QuaRot" if spec.rotation == "hadamard" else "QVG") + f" S{spec.qvg_stages} K{self.k_text(spec)}"

    def knobs_text(self, spec):
        return f"k-means S={spec.qvg_stages} K={self.k_text(spec)} iters<={spec.qvg_iters}"

    def report_fields(self, spec):
        return {"qvg_stages": spec.qvg_stages, "qvg_centroids": spec.qvg_centroids}

    def report_chunk_fields(self, spec, chunk_tokens):
        """The K a run's chunks of ``chunk_tokens`` tokens get (auto picks it from the tokens)."""
        return {"qvg_centroids_used": self.centroids_per_chunk(spec, chunk_tokens), "qvg_chunk_tokens": chunk_tokens}

    def report_kind(self, report, kind):
        k = report["qvg_centroids"]
        used = report.get("qvg_centroids_used")
        if k == QVG_AUTO_CENTROIDS:
            k = f"auto ({used} on {report.get('qvg_chunk_tokens')}-token chunks)" if used is not None else "auto"
        return f"QVG S={report['qvg_stages']} K={k}, {kind} residual"

    def part_record(self, t):
        return {"segments": [list(s) for s in t.segments]}

    def check_record(self, rec, prefix, spec, shape):
        self.segments(rec, prefix, spec, shape)

    def segments(self, rec: dict, prefix: str, spec: QuantSpec, shape) -> tuple[tuple[int, int], ...]:
        """A part's ``(tokens, k)`` segments: whole numbers, at least one token each, covering the chunk's tokens."""
        segments = rec.get("segments")
        if (
            not isinstance(segments, list)
            or not 0 < len(segments) <= shape[-2]
            or any(
                not isinstance(s, list)
                or len(s) != 2
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in s)
                or s[0] < 1
                for s in segments
            )
        ):
            raise ValueError(f"cache file entry {prefix} has no valid QVG segments record")
        segments = tuple((t, k) for t, k in segments)
        if sum(t for t, _ in segments) != shape[-2] or any(k != self.centroids_per_chunk(spec, t) for t, k in segments):
            raise ValueError(
                f"cache file entry {prefix}: segments {segments} do not fit {shape[-2]} tokens with K={self.k_text(spec)}"
            )
        return segments

    def state_tensors(self, t):
        return {".centroids": t.centroids.contiguous(), ".ids": t.ids.contiguous()}

    def from_state(self, residual, sd, prefix, rec, spec):
        """The QVG tensor of a cache file entry, with every shape, dtype and id range checked."""
        shape = residual.shape
        try:
            centroids, ids = sd[prefix + ".centroids"], sd[prefix + ".ids"]
        except KeyError as exc:
            raise ValueError(
                f"cache file entry {exc.args[0]} is missing (a QVG chunk stores centroids and cluster ids)"
            ) from None
        segments = self.segments(rec, prefix, spec, shape)
        D, S = shape[-1], spec.qvg_stages
        k_total = sum(k for _, k in segments)
        if tuple(centroids.shape) != (S, *shape[:-2], k_total, D) or centroids.dtype != CENTROID_DTYPE:
            raise ValueError(
                f"cache file entry {prefix}.centroids is {tuple(centroids.shape)} {centroids.dtype}; expected "
                f"{(S, *shape[:-2], k_total, D)} {CENTROID_DTYPE}"
            )
        if tuple(ids.shape) != (S, *shape[:-1]) or ids.dtype != torch.uint8:
            raise ValueError(
                f"cache file entry {prefix}.ids is {tuple(ids.shape)} {ids.dtype}; expected {(S, *shape[:-1])} uint8"
            )
        start = 0
        for t, k in segments:
            if t and int(ids[..., start : start + t].max()) >= k:
                raise ValueError(f"cache file entry {prefix}.ids points past its chunk's {k} centroids")
            start += t
        return QVGTensor(residual=residual, centroids=centroids, ids=ids, segments=segments)


RTN = _RTN()
QVG = _QVG()
#: method name -> method object, in the order of :data:`jensen_core.spec.METHODS`
REGISTRY: dict[str, QuantMethod] = {m.name: m for m in (RTN, QVG)}
if tuple(REGISTRY) != METHODS:
    raise RuntimeError(f"jensen_core.methods implements {tuple(REGISTRY)} but QuantSpec knows {METHODS}")


def method_of(spec: QuantSpec | str) -> QuantMethod:
    """The method object of a spec (or of a method name)."""
    name = spec if isinstance(spec, str) else spec.method
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"method={name!r} is not supported; use one of {METHODS}") from None
