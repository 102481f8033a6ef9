"""Precision by age: the sink and the newest cached chunks at more bits, older chunks at the cache's own bits.

The newest chunks and the attention sink carry most of the attention mass of the chunk being
generated, so :class:`AgeTiers` keeps them at ``recent_bits`` / ``sink_bits`` (3, 4 or 8) while every
other cached chunk stays at the cache's spec (e.g. INT2). A tier changes only ``bits``: group size,
rotation and seed, scale and minimum formats and the method stay the cache's, so each chunk is an
ordinary stored tensor with its own step sizes, and the bias correction of each chunk uses them.

Which bits a held chunk has depends on its position only (:meth:`AgeTiers.position_bits`):

- the newest ``recent_chunks`` held chunks: at least ``recent_bits``, their keys at least ``recent_key_bits``
  when that is set (0 keeps the keys out of the recent tier);
- the sink chunks (the first ``sink_held`` held, :class:`~jensen_core.retention.Retention`): at least ``sink_bits``;
- every chunk at least the cache's own bits (a tier never lowers a side).

A chunk is quantized at its tier's bits when it is appended; when it leaves the recent tier it is
**requantized** from its stored higher-bit form (:func:`requantize`, in the rotated space the codes
live in). ``benchmarks/tiers.py`` measured this against keeping the original (or a low-bit copy)
until demotion: see docs/tiers.md.

String form (settings lists, benchmarks): ``"recent2@4"``, ``"sink@8"``, ``"recent2@4+sink@8"``, and with the
recent tier's keys at other bits ``"recent1@4k3"`` (values 4, keys 3) or ``"recent1@4k0"`` (values only);
:func:`parse_tiers` reads it back (``"off"`` or ``""`` is None).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

import torch

from .methods import method_of
from .spec import QuantSpec
from .stored import JoinedTensor, StoredTensor

#: bits a tier may keep chunks at (0 = that tier is off)
TIER_BITS = (0, 3, 4, 8)
#: the most recent chunks a tier may name (a cache window is rarely longer)
MAX_RECENT_CHUNKS = 1024


@dataclass(frozen=True)
class AgeTiers:
    """Keep the newest ``recent_chunks`` cached chunks at ``recent_bits`` and the sink at ``sink_bits``.

    ``recent_bits`` / ``sink_bits``: 3, 4 or 8, or 0 for that tier off. ``recent_chunks`` is the number
    of newest held chunks kept at ``recent_bits`` (0 with the recent tier off). At least one tier is on.

    ``recent_key_bits`` (None: the same as ``recent_bits``) keeps the recent chunks' **keys** at other bits
    than their values: 0 leaves the keys out of the recent tier (a values-only tier), 3/4/8 sets them. The
    values carry most of what a recent chunk's quantization costs the output (their error reaches it
    linearly, weighted by the chunk's attention mass); docs/tiers.md measures the sides apart. A
    ``recent_key_bits`` equal to ``recent_bits`` is stored as None, so equal tiers compare equal.
    """

    recent_bits: int = 0
    recent_chunks: int = 0
    sink_bits: int = 0
    recent_key_bits: int | None = None

    def __post_init__(self) -> None:
        for name in ("recent_bits", "sink_bits", "recent_key_bits"):
            v = getattr(self, name)
            if name == "recent_key_bits" and v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, int) or v not in TIER_BITS:
                raise ValueError(f"{name}={v!r} is not supported; use 3, 4 or 8 (or 0 to keep that tier off)")
        if self.recent_key_bits == self.recent_bits:
            object.__setattr__(self, "recent_key_bits", None)  # one form per tier: equal tiers compare equal
        n = self.recent_chunks
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_RECENT_CHUNKS:
            raise ValueError(f"recent_chunks={n!r} must be a whole number from 0 to {MAX_RECENT_CHUNKS}")
        if bool(self.recent_bits or self.recent_key_bits) != bool(n):
            raise ValueError(
                f"recent_bits={self.recent_bits} with recent_chunks={n}: set both (e.g. recent_bits=4, "
                "recent_chunks=2) or neither"
            )
        if not (self.recent_bits or self.recent_key_bits) and not self.sink_bits:
            raise ValueError("AgeTiers with no tier on: set recent_bits and recent_chunks, or sink_bits (or use None)")

    def recent_side_bits(self, side: str) -> int:
        """The recent tier's bits on ``side`` ("k" or "v"): 0 when that side is not in the recent tier."""
        if side not in ("k", "v"):
            raise ValueError(f"side={side!r} must be 'k' (keys) or 'v' (values)")
        if side == "k" and self.recent_key_bits is not None:
            return self.recent_key_bits
        return self.recent_bits

    # ----------------------------------------------------------------- positions
    def position_bits(self, base_bits: int, held: int, sink_held: int, side: str) -> list[int]:
        """Bits of each of ``held`` chunks (oldest first, the first ``sink_held`` the sink) on ``side`` ("k" or
        "v") at ``base_bits``."""
        recent = self.recent_side_bits(side)
        out = []
        for i in range(held):
            b = base_bits
            if self.sink_bits and i < sink_held:
                b = max(b, self.sink_bits)
            if recent and i >= held - self.recent_chunks:
                b = max(b, recent)
            out.append(b)
        return out

    def newest_bits(self, base_bits: int, side: str, in_sink: bool) -> int:
        """Bits a chunk appended now is stored at on ``side``: the newest chunk's, a sink chunk's while the sink fills."""
        b = max(base_bits, self.recent_side_bits(side))
        return max(b, self.sink_bits) if in_sink else b

    def side_bits(self, base_bits: int, side: str) -> tuple[int, ...]:
        """Every bit width ``side`` ("k" or "v") at ``base_bits`` may hold under these tiers (ascending)."""
        recent = self.recent_side_bits(side)
        return tuple(sorted({base_bits, max(base_bits, recent), max(base_bits, self.sink_bits)}))

    def spec_at(self, spec: QuantSpec | None, bits: int) -> QuantSpec | None:
        """``spec`` at ``bits`` (None stays None: an unquantized side has no tiers)."""
        if spec is None or spec.bits == bits:
            return spec
        return replace(spec, bits=bits)

    def specs_for(self, spec: QuantSpec | None, held: int, sink_held: int, side: str) -> list[QuantSpec | None]:
        """The spec of each held chunk of ``side`` ("k" or "v") whose cache spec is ``spec``."""
        if spec is None:
            return [None] * held
        return [self.spec_at(spec, b) for b in self.position_bits(spec.bits, held, sink_held, side)]

    # ----------------------------------------------------------------- text
    def __str__(self) -> str:
        parts = []
        if self.recent_chunks:
            keys = "" if self.recent_key_bits is None else f"k{self.recent_key_bits}"
            parts.append(f"recent{self.recent_chunks}@{self.recent_bits}{keys}")
        if self.sink_bits:
            parts.append(f"sink@{self.sink_bits}")
        return "+".join(parts)

    def describe(self) -> str:
        parts = []
        if self.recent_chunks:
            kb, vb = self.recent_side_bits("k"), self.recent_side_bits("v")
            if kb == vb:
                what = f"at {vb} bits"
            elif not kb:
                what = f"values at {vb} bits (keys not tiered)"
            elif not vb:
                what = f"keys at {kb} bits (values not tiered)"
            else:
                what = f"values at {vb} bits, keys at {kb}"
            parts.append(f"newest {self.recent_chunks} chunk(s) {what}")
        if self.sink_bits:
            parts.append(f"sink at {self.sink_bits} bits")
        return ", ".join(parts)

    def to_dict(self) -> dict:
        d = {"recent_bits": self.recent_bits, "recent_chunks": self.recent_chunks, "sink_bits": self.sink_bits}
        if self.recent_key_bits is not None:  # only when set: a record without it reads as before
            d["recent_key_bits"] = self.recent_key_bits
        return d

    @classmethod
    def from_dict(cls, d: dict) -> AgeTiers:
        if not isinstance(d, dict):
            raise ValueError(f"tiers must be a JSON object, got {type(d).__name__}")
        unknown = sorted(set(d) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"unknown AgeTiers field(s) {unknown}; known: {sorted(cls.__dataclass_fields__)}")
        return cls(**d)

    @classmethod
    def from_record(cls, d, where: str) -> AgeTiers | None:
        """A stored record's tiers (None when it has none); a ValueError says ``where`` they are unreadable."""
        if d is None:
            return None
        try:
            return cls.from_dict(d)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{where} are not readable: {exc}") from None


_PART = re.compile(r"^(?:recent(\d+)@(\d+)(?:k(\d+))?|sink@(\d+))$")


def parse_tiers(text: str | None) -> AgeTiers | None:
    """``"recent2@4+sink@8"`` -> AgeTiers(4, 2, 8); ``"recent1@4k0"`` -> AgeTiers(4, 1, recent_key_bits=0) (the
    recent tier's keys at other bits); ``"off"``, ``""`` or None -> None. The inverse of ``str()``."""
    if text is None:
        return None
    if not isinstance(text, str):
        raise ValueError(
            f"tiers={text!r} must be text such as 'recent2@4', 'recent1@4k0', 'sink@8' or 'recent2@4+sink@8'"
        )
    s = text.strip().lower().replace(" ", "")
    if s in ("", "off", "none"):
        return None
    fields: dict[str, int] = {}
    for part in s.split("+"):
        m = _PART.match(part)
        if m is None or (m.group(1) is not None and "recent_bits" in fields) or (m.group(4) and "sink_bits" in fields):
            raise ValueError(
                f"tiers={text!r} is not readable: use 'recent<N>@<bits>[k<key bits>]', 'sink@<bits>' or both joined "
                "by '+' (e.g. 'recent2@4+sink@8', 'recent1@4k0' for values only), bits 3, 4 or 8 (0: not tiered)"
            )
        if m.group(1) is not None:
            fields.update(recent_chunks=int(m.group(1)), recent_bits=int(m.group(2)))
            if m.group(3) is not None:
                fields["recent_key_bits"] = int(m.group(3))
        else:
            fields["sink_bits"] = int(m.group(4))
    try:
        return AgeTiers(**fields)
    except ValueError as exc:
        raise ValueError(f"tiers={text!r}: {exc}") from None


def requantize(t: StoredTensor, spec: QuantSpec, head_offset: int = 0) -> StoredTensor:
    """``t`` requantized at ``spec`` (a demotion): its reconstruction, in the rotated space its codes live in,
    quantized again. ``spec`` differs from ``t.spec`` in ``bits`` only; ``head_offset`` is the global index of
    ``t``'s first head (:func:`jensen_core.quant.quantize`)."""
    if replace(spec, bits=t.spec.bits) != t.spec:
        raise ValueError(f"requantize changes bits only; {t.spec} and {spec} differ in more")
    if spec == t.spec:
        return t
    xf = t.dequantize(dtype=torch.float32, rotated=True)
    return method_of(spec).quantize(xf, spec, t.dtype, head_offset)


class TieredTensor(JoinedTensor):
    """Stored chunks whose specs differ in ``bits`` only, joined along the token axis (what diagnostics concatenate).

    Each part keeps its own codes and step sizes: :meth:`step_sizes` and :meth:`dequantize` are the parts'
    joined. ``spec`` is the first part's (group size, rotation and seed are every part's). Built by
    :func:`jensen_core.quant.cat_quantized` when the parts' bits differ.
    """

    __slots__ = ("parts",)

    def __init__(self, parts: list[StoredTensor]):
        first = parts[0]
        for p in parts[1:]:
            if replace(p.spec, bits=first.spec.bits) != first.spec or p.shape[:-2] != first.shape[:-2]:
                raise ValueError("TieredTensor joins stored chunks whose specs differ in bits only, of one layout")
        self.parts = list(parts)

    @property
    def shape(self) -> torch.Size:
        first = self.parts[0].shape
        return torch.Size((*first[:-2], sum(p.tokens for p in self.parts), first[-1]))

    def to(self, device) -> TieredTensor:
        return TieredTensor([p.to(device) for p in self.parts])

    def __getitem__(self, idx) -> TieredTensor:
        return TieredTensor([p[idx] for p in self.parts])

    def flatten_leading(self) -> TieredTensor:
        return TieredTensor([p.flatten_leading() for p in self.parts])

    def step_sizes(self) -> torch.Tensor:
        return torch.cat([p.step_sizes() for p in self.parts], dim=-2)

    def dequantize(self, dtype=None, rotated: bool = False, out=None) -> torch.Tensor:
        x = torch.cat([p.dequantize(dtype=dtype or self.dtype, rotated=rotated) for p in self.parts], dim=-2)
        if out is not None:
            out.copy_(x)
            return out
        return x
