"""QuantSpec: the frozen, self-validating description of how a KV tensor is quantized."""

from __future__ import annotations

from dataclasses import dataclass

import torch

SUPPORTED_BITS = (2, 3, 4, 8)
ROTATIONS = ("none", "hadamard")
#: quantization method -> the QuantSpec fields only that method reads (:mod:`jensen_core.methods` implements them)
METHOD_KNOBS: dict[str, tuple[str, ...]] = {"rtn": (), "qvg": ("qvg_stages", "qvg_centroids", "qvg_iters")}
METHODS = tuple(METHOD_KNOBS)
QVG_MAX_STAGES = 8
QVG_MAX_CENTROIDS = 256  # cluster ids are stored one uint8 per token and stage
#: ``qvg_centroids=0`` (the default): K is picked per chunk from its tokens (:func:`qvg_auto_centroids`)
QVG_AUTO_CENTROIDS = 0
#: auto K's centroid budget is QVG's own: 256 centroids (S = 1) per MAGI-1 chunk of 12,150 tokens, the
#: setting of the paper's ~2.52-bit QVG rows (16 * 256 / 12,150 = 0.337 bits per element on centroids)
QVG_AUTO_REF = (256, 12150)
QVG_MAX_ITERS = 1000
#: bytes of one stored centroid channel (QVG keeps its centroids in the cache dtype; BF16 here)
CENTROID_BYTES = 2
#: bytes of one cluster id (a token's id in one stage)
CLUSTER_ID_BYTES = 1

# storage format name -> (torch dtype, bits per stored value)
FLOAT_FORMATS: dict[str, tuple[torch.dtype, int]] = {
    "fp8_e4m3": (torch.float8_e4m3fn, 8),
    "bf16": (torch.bfloat16, 16),
    "fp16": (torch.float16, 16),
    "fp32": (torch.float32, 32),
}
ZERO_FORMATS = ("bf16", "fp16", "fp32")


def _divisors_hint(head_dim: int) -> str:
    ok = [g for g in (8, 16, 32, 64, 128, 256) if g <= head_dim and head_dim % g == 0]
    if not ok:
        return "head_dim must be a multiple of 8 to be quantized"
    return "use " + ", ".join(str(g) for g in ok[:-1]) + (" or " if len(ok) > 1 else "") + str(ok[-1])


@dataclass(frozen=True)
class QuantSpec:
    """How to quantize cached keys or values.

    Group-wise, per-token, asymmetric round-to-nearest along ``head_dim`` (paper Eq. 1):
    each token's ``head_dim`` channels are split into groups of ``group_size``; every group
    stores a step size (``scale_format``) and a grid origin (``zero_format``).

    ``rotation="hadamard"`` applies a seeded randomized Hadamard rotation (QuaRot) before
    quantization; queries are rotated the same way at attention time.

    ``method="qvg"`` (QuantVideoGen, arXiv 2602.02958) first smooths each chunk per (batch, head):
    ``qvg_stages`` rounds of k-means over the chunk's tokens (``qvg_centroids`` centroids of
    ``head_dim`` channels, at most ``qvg_iters`` Lloyd iterations each, seeded by ``seed`` and the
    global head index), each subtracting the assigned centroid; the final residual is quantized as
    above. The centroids (BF16) and the cluster ids (uint8) are stored per chunk, so the bits per
    element depend on the chunk's tokens: ``jensen_core.methods.method_of(spec).effective_bits_for``. ``qvg_centroids=0``
    (the default, "auto") picks K per chunk from its tokens (:func:`qvg_auto_centroids`).
    ``method="rtn"`` is plain RTN.
    """

    bits: int = 2
    group_size: int = 32
    rotation: str = "none"
    scale_format: str = "fp8_e4m3"
    zero_format: str = "bf16"
    seed: int = 0
    method: str = "rtn"
    qvg_stages: int = 1
    qvg_centroids: int = QVG_AUTO_CENTROIDS
    qvg_iters: int = 2

    def __post_init__(self) -> None:
        if isinstance(self.bits, bool) or not isinstance(self.bits, int) or self.bits not in SUPPORTED_BITS:
            raise ValueError(f"bits={self.bits!r} is not supported; use one of {SUPPORTED_BITS}")
        g = self.group_size
        if isinstance(g, bool) or not isinstance(g, int) or g < 8 or g > 256 or g & (g - 1):
            raise ValueError(
                f"group_size={g!r} is not supported; use a power of two from 8 to 256 "
                "(8, 16, 32, 64, 128 or 256) that divides head_dim"
            )
        if self.rotation not in ROTATIONS:
            raise ValueError(f"rotation={self.rotation!r} is not supported; use one of {ROTATIONS}")
        if self.scale_format not in FLOAT_FORMATS:
            raise ValueError(f"scale_format={self.scale_format!r} is not supported; use one of {tuple(FLOAT_FORMATS)}")
        if self.zero_format not in ZERO_FORMATS:
            raise ValueError(f"zero_format={self.zero_format!r} is not supported; use one of {ZERO_FORMATS}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed={self.seed!r} must be a non-negative integer")
        if self.method not in METHODS:
            raise ValueError(f"method={self.method!r} is not supported; use one of {METHODS}")
        for name, lo, hi in (
            ("qvg_stages", 1, QVG_MAX_STAGES),
            ("qvg_centroids", QVG_AUTO_CENTROIDS, QVG_MAX_CENTROIDS),
            ("qvg_iters", 1, QVG_MAX_ITERS),
        ):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
                auto = " (0 = auto: picked from the chunk's tokens)" if name == "qvg_centroids" else ""
                raise ValueError(f"{name}={v!r} must be a whole number from {lo} to {hi}{auto}")
        for other, knobs in METHOD_KNOBS.items():
            changed = [
                f"{f}={getattr(self, f)!r}" for f in knobs if other != self.method and getattr(self, f) != _DEFAULTS[f]
            ]
            if changed:
                raise ValueError(
                    f"{', '.join(changed)} only apply to method={other!r}; use method={other!r} or "
                    "leave them at their defaults"
                )

    @property
    def levels(self) -> int:
        return 2**self.bits

    @property
    def scale_bits(self) -> int:
        return FLOAT_FORMATS[self.scale_format][1]

    @property
    def zero_bits(self) -> int:
        return FLOAT_FORMATS[self.zero_format][1]

    @property
    def effective_bits(self) -> float:
        """Stored bits per element of the group-wise quantized codes: bits + (scale bits + zero bits) / group_size (paper Eq. 21).

        Everything stored for ``method="rtn"``. For ``method="qvg"`` this is the residual's part only;
        the cluster ids and the per-chunk centroids come on top: the method object's
        ``effective_bits_for`` (:func:`jensen_core.methods.method_of`) counts everything.
        """
        return self.bits + (self.scale_bits + self.zero_bits) / self.group_size

    def check_head_dim(self, head_dim: int) -> None:
        """Raise a ValueError naming the fix when this spec cannot quantize ``head_dim`` channels."""
        if head_dim % self.group_size:
            raise ValueError(
                f"group_size {self.group_size} does not divide head_dim {head_dim}; {_divisors_hint(head_dim)}"
            )
        if self.rotation == "hadamard" and head_dim & (head_dim - 1):
            raise ValueError(f"rotation='hadamard' needs a power-of-two head_dim, got {head_dim}; use rotation='none'")

    def to_dict(self) -> dict:
        return {
            "bits": self.bits,
            "group_size": self.group_size,
            "rotation": self.rotation,
            "scale_format": self.scale_format,
            "zero_format": self.zero_format,
            "seed": self.seed,
            "method": self.method,
            "qvg_stages": self.qvg_stages,
            "qvg_centroids": self.qvg_centroids,
            "qvg_iters": self.qvg_iters,
        }

    @classmethod
    def from_dict(cls, d: dict) -> QuantSpec:
        """Inverse of :meth:`to_dict`; keys missing from older files take their defaults (RTN)."""
        unknown = sorted(set(d) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"unknown QuantSpec field(s) {unknown}; known: {sorted(cls.__dataclass_fields__)}")
        if d.get("method", "rtn") != "qvg" and d.get("qvg_centroids") == _OLD_DEFAULT_CENTROIDS:
            d = {**d, "qvg_centroids": QVG_AUTO_CENTROIDS}  # an RTN spec written when K's default was 256
        return cls(**d)


def qvg_auto_centroids(tokens: int, stages: int = 1) -> int:
    """Auto K: QVG's centroid budget scaled to a chunk of ``tokens`` tokens, ``floor(256 * tokens / (12,150 * stages))``.

    The ``stages`` tables together cost what QVG's one table of 256 centroids costs on its
    12,150-token MAGI-1 chunks (0.337 bits per element), at least 1 and at most 256 centroids per stage:
    98 on a Wan 480p chunk of 3 latent frames (4,680 tokens), 32 on one-frame chunks (1,560), 4 on the
    tiny model's 192-token chunks.
    """
    if tokens < 1 or stages < 1:
        raise ValueError(f"qvg_auto_centroids needs tokens >= 1 and stages >= 1, got tokens={tokens}, stages={stages}")
    k, t = QVG_AUTO_REF
    return max(1, min(QVG_MAX_CENTROIDS, k * tokens // (t * stages)))


#: qvg_centroids' default before auto K; an RTN spec saved then carries it (QuantSpec.from_dict reads it as 0)
_OLD_DEFAULT_CENTROIDS = 256
_DEFAULTS = {f: QuantSpec.__dataclass_fields__[f].default for knobs in METHOD_KNOBS.values() for f in knobs}
