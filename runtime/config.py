"""The KV-cache configuration that "Quantize KV Cache" and "Jensen Bias Correction" attach to a MODEL.

A frozen, self-validating dataclass stored under ``model_options["transformer_options"]["jensen_kv"]``
of a *cloned* ModelPatcher; the Chunked AR sampler reads it. No ComfyUI import here, so the
config is testable anywhere.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ..jensen_core import MODES, CachePrecision, QuantSpec
from ..jensen_core.bias import check_mode
from ..jensen_core.head_bits import HeadBits
from ..jensen_core.methods import method_of
from ..jensen_core.spec import METHOD_KNOBS, METHODS, QVG_MAX_CENTROIDS, QVG_MAX_ITERS, QVG_MAX_STAGES
from ..jensen_core.tiers import AgeTiers

CONFIG_KEY = "jensen_kv"
#: the cache window of core's AR sampler (AR Cache Window); the Chunked AR sampler has its own inputs
WINDOW_KEY = "jensen_kv_window"

BITS_CHOICES = ("2", "3", "4", "8", "off")
GROUP_SIZE_CHOICES = ("8", "16", "32", "64", "128", "256")
ROTATION_CHOICES = ("none", "hadamard")
SCALE_FORMAT_CHOICES = ("fp8_e4m3", "bf16", "fp16", "fp32")
CORRECTION_CHOICES = MODES  # ("taylor", "chunk_mean", "exact", "per_channel", "off", "head_mean"): the core's names
METHOD_CHOICES = METHODS
# (default, min, max) of QVG's k-means knobs, as QuantSpec validates them
QVG_STAGES_RANGE = (QuantSpec.__dataclass_fields__["qvg_stages"].default, 1, QVG_MAX_STAGES)
QVG_CENTROIDS_RANGE = (QuantSpec.__dataclass_fields__["qvg_centroids"].default, 0, QVG_MAX_CENTROIDS)  # 0 = auto
QVG_ITERS_RANGE = (QuantSpec.__dataclass_fields__["qvg_iters"].default, 1, QVG_MAX_ITERS)
STRENGTH_MAX = 4.0
#: Quantize KV Cache's widget defaults (the node and the web planner both start here)
QUANTIZE_DEFAULTS: dict[str, str] = {
    "key_bits": "2",
    "value_bits": "2",
    "group_size": "32",
    "rotation": "hadamard",
    "scale_format": "fp8_e4m3",
    "method": "rtn",
    "recent_chunks_bits": "off",
    "sink_bits": "off",
    "recent_chunks_key_bits": "same",
    "head_bits": "off",
}
#: age tiers (precision by age): the bits the sink and the newest chunks may keep, and how many newest chunks
TIER_BITS_CHOICES = ("off", "3", "4", "8")
#: the recent tier's keys: "same" as recent_chunks_bits, "off" (values only: keys stay at key_bits), or bits
RECENT_KEY_BITS_CHOICES = ("same",) + TIER_BITS_CHOICES
RECENT_CHUNKS_RANGE = (2, 1, 64)  # default, min, max (recent_chunks counts only with recent_chunks_bits on)
#: precision by head: the bits the keys of the heads with the largest predicted bias are kept at, and what share
HEAD_BITS_CHOICES = ("off", "3", "4", "8")
HEAD_FRACTION_RANGE = (0.25, 0.01, 1.0)  # default, min, max (counts only with head_bits on)
#: the Chunked AR sampler's chunking defaults (latent frames per chunk, window and sink in chunks; 0 = all / none)
CHUNK_DEFAULTS: dict[str, int] = {"chunk_frames": 3, "window_chunks": 0, "sink_chunks": 0}


def parse_bits(value: str | int, what: str) -> int | None:
    """ "2" -> 2, "off" -> None; anything else is a ValueError naming the choices."""
    if isinstance(value, str) and value.strip().lower() == "off":
        return None
    try:
        bits = int(value)
    except (TypeError, ValueError):
        bits = None
    if bits is None or str(bits) not in BITS_CHOICES:
        raise ValueError(f"{what}={value!r} is not supported; use one of {', '.join(BITS_CHOICES)}")
    return bits


def method_fields(method: str, stages: int | str, centroids: int | str, iters: int | str) -> dict:
    """QuantSpec keyword arguments of the node's method inputs (each method's own knobs only with that method)."""
    if method not in METHOD_CHOICES:
        raise ValueError(f"method={method!r} is not supported; use one of {', '.join(METHOD_CHOICES)}")
    given = {"qvg_stages": stages, "qvg_centroids": centroids, "qvg_iters": iters}
    out = {"method": method}
    for name, value in ((k, given[k]) for k in METHOD_KNOBS[method]):
        try:
            out[name] = int(value)
        except (TypeError, ValueError):
            raise ValueError(f"{name}={value!r} must be a whole number") from None
    return out


def parse_tiers(
    spec_k: QuantSpec | None,
    spec_v: QuantSpec | None,
    recent_chunks_bits: str = "off",
    recent_chunks: int | str = RECENT_CHUNKS_RANGE[0],
    sink_bits: str = "off",
    recent_chunks_key_bits: str = "same",
) -> AgeTiers | None:
    """Quantize KV Cache's tier inputs as :class:`AgeTiers` (None when both are off); ValueError naming the fix.

    ``recent_chunks_key_bits`` sets the recent tier's keys apart from its values ("same", "off" for a
    values-only tier, or bits); it counts only with ``recent_chunks_bits`` on."""
    bits = {}
    for name, value in (("recent_chunks_bits", recent_chunks_bits), ("sink_bits", sink_bits)):
        v = str(value).strip().lower()
        if v not in TIER_BITS_CHOICES:
            raise ValueError(f"{name}={value!r} is not supported; use one of {', '.join(TIER_BITS_CHOICES)}")
        bits[name] = 0 if v == "off" else int(v)
    kv = str(recent_chunks_key_bits).strip().lower()
    if kv not in RECENT_KEY_BITS_CHOICES:
        raise ValueError(
            f"recent_chunks_key_bits={recent_chunks_key_bits!r} is not supported; use one of "
            f"{', '.join(RECENT_KEY_BITS_CHOICES)} ('same' keeps the keys at recent_chunks_bits, 'off' leaves them "
            "at key_bits)"
        )
    key_bits = None if kv == "same" or not bits["recent_chunks_bits"] else (0 if kv == "off" else int(kv))
    if not any(bits.values()):
        return None
    n = 0
    if bits["recent_chunks_bits"]:
        try:
            n = int(recent_chunks)
        except (TypeError, ValueError):
            n = None
        lo, hi = RECENT_CHUNKS_RANGE[1:]
        if n is None or not lo <= n <= hi:
            raise ValueError(
                f"recent_chunks={recent_chunks!r} with recent_chunks_bits={bits['recent_chunks_bits']}: keep "
                f"{lo} to {hi} of the newest cached chunks at {bits['recent_chunks_bits']} bits, or set "
                "recent_chunks_bits off"
            )
    sides = [(side, s) for side, s in (("key_bits", spec_k), ("value_bits", spec_v)) if s is not None]
    if not sides:
        raise ValueError(
            "recent_chunks_bits / sink_bits keep quantized chunks at more bits, but key_bits and value_bits are "
            "both off; quantize a side or set the tiers off"
        )
    recent = {"key_bits": bits["recent_chunks_bits"] if key_bits is None else key_bits}
    recent["value_bits"] = bits["recent_chunks_bits"]
    if all(s.bits >= max(recent[side], bits["sink_bits"]) for side, s in sides):
        raise ValueError(
            f"recent_chunks_bits={recent_chunks_bits}"
            + ("" if key_bits is None else f", recent_chunks_key_bits={recent_chunks_key_bits}")
            + f" and sink_bits={sink_bits} keep no chunk above "
            + " and ".join(f"{side}={s.bits}" for side, s in sides)
            + "; use tier bits above the cache's bits (e.g. key_bits 2 with recent_chunks_bits 4) or set them off"
        )
    return AgeTiers(
        recent_bits=bits["recent_chunks_bits"], recent_chunks=n, sink_bits=bits["sink_bits"], recent_key_bits=key_bits
    )


def parse_head_bits(
    spec_k: QuantSpec | None,
    head_bits: str = "off",
    head_fraction: float | str = HEAD_FRACTION_RANGE[0],
    tiers: AgeTiers | None = None,
) -> HeadBits | None:
    """Quantize KV Cache's precision-by-head inputs as :class:`HeadBits` (None when off); ValueError naming the fix."""
    v = str(head_bits).strip().lower()
    if v not in HEAD_BITS_CHOICES:
        raise ValueError(f"head_bits={head_bits!r} is not supported; use one of {', '.join(HEAD_BITS_CHOICES)}")
    if v == "off":
        return None
    lo, hi = HEAD_FRACTION_RANGE[1:]
    try:
        f = float(head_fraction)
    except (TypeError, ValueError):
        f = None
    if f is None or not (lo <= f <= hi):
        raise ValueError(
            f"head_fraction={head_fraction!r} with head_bits={v}: give the share of each layer's heads to keep at "
            f"{v} bits, from {lo:g} to {hi:g} (e.g. 0.25), or set head_bits off"
        )
    hb = HeadBits(int(v), f)
    if tiers is not None:
        raise ValueError(
            f"head_bits={v} cannot be combined with recent_chunks_bits / sink_bits yet; set head_bits off or the "
            "age tiers off"
        )
    if spec_k is None:
        raise ValueError(f"head_bits={v} keeps some heads' keys at more bits, but key_bits is off; set key_bits 2 or 3")
    if spec_k.bits >= hb.bits:
        raise ValueError(
            f"head_bits={v} is not above key_bits={spec_k.bits}: no head would be stored sharper; use head_bits "
            f"above key_bits (e.g. key_bits 2 with head_bits 4) or set it off"
        )
    if spec_k.method != "rtn":
        raise ValueError(f"head_bits={v} works with method rtn only, not {spec_k.method}; use rtn or head_bits off")
    return hb


def parse_correction(value: str) -> str:
    """A correction widget's value as one of :data:`CORRECTION_CHOICES` (an old "none" reads as "off")."""
    try:
        return check_mode(value)
    except ValueError:
        raise ValueError(f"mode={value!r} is not supported; use one of {', '.join(CORRECTION_CHOICES)}") from None


@dataclass(frozen=True)
class JensenKVConfig:
    """How the Chunked AR sampler stores and reads its KV cache.

    ``spec_k`` / ``spec_v``: how cached keys / values are quantized (``None`` keeps that side in the
    model's own precision). ``correction``: a ``jensen_core`` mode ("taylor", "chunk_mean", "exact",
    "per_channel" or "off") applied to the scores of cached keys, scaled by ``strength``; ``guard`` (on by
    default) scales it down per (layer, head, chunk) where it would overshoot the bias the noise is predicted to
    have caused (:func:`jensen_core.bias.guard_scale`). ``tiers``:
    precision by age (:class:`jensen_core.tiers.AgeTiers`), None for every chunk at the specs' bits. ``head_bits``:
    precision by head (:class:`jensen_core.head_bits.HeadBits`), None for every head's keys at ``spec_k``.
    """

    spec_k: QuantSpec | None = None
    spec_v: QuantSpec | None = None
    correction: str = "off"
    strength: float = 1.0
    tiers: AgeTiers | None = None
    guard: bool = True
    head_bits: HeadBits | None = None

    def __post_init__(self) -> None:
        for name in ("spec_k", "spec_v"):
            s = getattr(self, name)
            if s is not None and not isinstance(s, QuantSpec):
                raise TypeError(f"{name} must be a QuantSpec or None, got {type(s).__name__}")
        if self.tiers is not None and not isinstance(self.tiers, AgeTiers):
            raise TypeError(f"tiers must be an AgeTiers or None, got {type(self.tiers).__name__}")
        if self.head_bits is not None:
            CachePrecision(self.spec_k, self.spec_v, self.tiers, self.head_bits)  # checks it against keys and tiers
        try:  # a config made before "none" was renamed "off" still reads
            object.__setattr__(self, "correction", check_mode(self.correction))
        except ValueError:
            raise ValueError(f"correction={self.correction!r} is not supported; use one of {MODES}") from None
        if not isinstance(self.guard, bool):
            raise ValueError(f"guard={self.guard!r} must be True or False (True: the correction never overshoots)")
        s = self.strength
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s) or not 0 <= s <= STRENGTH_MAX:
            raise ValueError(
                f"strength={s!r} must be a number from 0 to {STRENGTH_MAX:g} (1.0 applies the full correction)"
            )

    @property
    def precision(self) -> CachePrecision:
        """How the cache stores keys and values (the specs, the age tiers, precision by head), as the planner and caches
        take it."""
        return CachePrecision(self.spec_k, self.spec_v, self.tiers, self.head_bits)

    @property
    def keys_quantized(self) -> bool:
        return self.spec_k is not None

    @property
    def quantized(self) -> bool:
        return self.spec_k is not None or self.spec_v is not None

    @property
    def effective_correction(self) -> str:
        """What attention really applies: nothing when the keys are not quantized or strength is 0."""
        if not self.keys_quantized or self.strength == 0:
            return "off"
        return self.correction

    def with_correction(self, correction: str, strength: float, guard: bool = True) -> JensenKVConfig:
        return replace(self, correction=correction, strength=float(strength), guard=bool(guard))

    def with_specs(
        self,
        spec_k: QuantSpec | None,
        spec_v: QuantSpec | None,
        tiers: AgeTiers | None = None,
        head_bits: HeadBits | None = None,
    ) -> JensenKVConfig:
        return replace(self, spec_k=spec_k, spec_v=spec_v, tiers=tiers, head_bits=head_bits)

    def check_head_dim(self, head_dim: int) -> None:
        """ValueError naming the fix when a spec cannot quantize this model's head_dim."""
        for side, spec in (("key", self.spec_k), ("value", self.spec_v)):
            if spec is not None:
                try:
                    spec.check_head_dim(head_dim)
                except ValueError as exc:
                    raise ValueError(f"Quantize KV Cache ({side}s): {exc}") from None

    def describe(self) -> str:
        def side(spec: QuantSpec | None) -> str:
            if spec is None:
                return "full precision"
            return method_of(spec).label(spec)

        parts = [f"keys {side(self.spec_k)}", f"values {side(self.spec_v)}"]
        spec = self.spec_k or self.spec_v
        if spec is not None:
            parts.append(f"group {spec.group_size}, rotation {spec.rotation}, scales {spec.scale_format}")
            knobs = method_of(spec).knobs_text(spec)
            if knobs:
                parts.append(knobs)
        if self.tiers is not None:
            parts.append(f"age tiers: {self.tiers.describe()}")
        if self.head_bits is not None:
            parts.append(f"precision by head: {self.head_bits.describe()}")
        corr = self.effective_correction
        parts.append(
            f"correction {corr}"
            + (f" x{self.strength:g}" if corr != "off" else "")
            + (", unguarded" if corr != "off" and not self.guard else "")
        )
        return "; ".join(parts)


def get_option(model_options: dict | None, key: str, cls: type, producer: str):
    """The ``cls`` instance a node of this pack stored under ``transformer_options[key]``, or None."""
    value = (model_options or {}).get("transformer_options", {}).get(key)
    if value is not None and not isinstance(value, cls):
        raise TypeError(
            f"model_options['transformer_options'][{key!r}] holds a {type(value).__name__}, not a "
            f"{cls.__name__}; it was set by something other than the {producer} node"
        )
    return value


def set_option(model_patcher, key: str, value) -> None:
    """Store ``value`` under ``transformer_options[key]`` of ``model_patcher`` (call it on a clone only)."""
    model_patcher.model_options.setdefault("transformer_options", {})[key] = value


def get_config(model_options: dict) -> JensenKVConfig | None:
    """The config on a ModelPatcher's ``model_options`` (None when no Quantize KV Cache ran upstream)."""
    return get_option(model_options, CONFIG_KEY, JensenKVConfig, "Quantize KV Cache")


def set_config(model_patcher, config: JensenKVConfig) -> None:
    """Store ``config`` on ``model_patcher`` (call it on a clone only)."""
    set_option(model_patcher, CONFIG_KEY, config)


@dataclass(frozen=True)
class CacheWindow:
    """Window and sink (in chunks = core's blocks) of the cache on core's AR path (AR Cache Window node)."""

    window_chunks: int = 0
    sink_chunks: int = 0

    def __post_init__(self) -> None:
        for name in ("window_chunks", "sink_chunks"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{name}={v!r} must be 0 or a positive whole number of chunks")

    def describe(self) -> str:
        w = f"window {self.window_chunks} chunk(s)" if self.window_chunks else "no window (every chunk kept)"
        return w + (f", sink {self.sink_chunks} chunk(s)" if self.sink_chunks else "")


def get_window(model_options: dict | None) -> CacheWindow | None:
    """The window an AR Cache Window node stored on the MODEL, or None."""
    return get_option(model_options, WINDOW_KEY, CacheWindow, "AR Cache Window")


def set_window(model_patcher, window: CacheWindow) -> None:
    """Store ``window`` on ``model_patcher`` (call it on a clone only)."""
    set_option(model_patcher, WINDOW_KEY, window)
