"""Bit-packing of integer codes along the last dimension.

INT2 stores four codes a byte, INT4 two, INT8 one, and INT3 eight codes in three bytes.
Codes are packed along the last (``head_dim``) axis, which is always a multiple of 8.
"""

from __future__ import annotations

import sys

import torch
from torch import Tensor

_SHIFT_CACHE: dict[tuple[int, torch.device], Tensor] = {}


def packed_width(n: int, bits: int) -> int:
    if n % 8:
        raise ValueError(f"the packed axis must be a multiple of 8, got {n}")
    return n * bits // 8


def _shifts(bits: int, device: torch.device) -> Tensor:
    key = (bits, device)
    t = _SHIFT_CACHE.get(key)
    if t is None:
        t = torch.arange(0, 8, bits, dtype=torch.uint8, device=device)
        _SHIFT_CACHE[key] = t
    return t


def pack_codes(codes: Tensor, bits: int) -> Tensor:
    """Pack uint8 codes in ``[0, 2**bits)`` along the last axis into a uint8 tensor."""
    if codes.dtype != torch.uint8:
        raise TypeError(f"codes must be uint8, got {codes.dtype}")
    n = codes.shape[-1]
    lead = codes.shape[:-1]
    packed_width(n, bits)
    if bits == 8:
        return codes.contiguous()
    if bits in (2, 4):
        per = 8 // bits
        c = codes.reshape(*lead, n // per, per)
        out = c[..., 0].clone()
        for i in range(1, per):
            out |= c[..., i] << (bits * i)
        return out
    if bits == 3:
        c = codes.reshape(*lead, n // 8, 8).to(torch.int32)
        word = c[..., 0].clone()
        for i in range(1, 8):
            word |= c[..., i] << (3 * i)
        out = torch.stack([(word >> s) & 0xFF for s in (0, 8, 16)], dim=-1).to(torch.uint8)
        return out.reshape(*lead, n * 3 // 8)
    raise ValueError(f"bits={bits} cannot be packed; use 2, 3, 4 or 8")


def unpack_codes(packed: Tensor, bits: int, n: int) -> Tensor:
    """Inverse of :func:`pack_codes`: uint8 codes of width ``n`` along the last axis."""
    lead = packed.shape[:-1]
    if packed.shape[-1] != packed_width(n, bits):
        raise ValueError(f"packed width {packed.shape[-1]} does not hold {n} codes of {bits} bits")
    if bits == 8:
        return packed
    if bits in (2, 4):
        mask = (1 << bits) - 1
        return ((packed.unsqueeze(-1) >> _shifts(bits, packed.device)) & mask).reshape(*lead, n)
    if bits == 3:
        b = packed.reshape(*lead, n // 8, 3).to(torch.int32)
        word = b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16)
        shifts = torch.arange(0, 24, 3, dtype=torch.int32, device=packed.device)
        return ((word.unsqueeze(-1) >> shifts) & 7).to(torch.uint8).reshape(*lead, n)
    raise ValueError(f"bits={bits} cannot be unpacked; use 2, 3, 4 or 8")


# ------------------------------------------------------------------------------ group-interleaved unpacking
# Attention does not care in which order a head's channels come, as long as the query's (keys) or the
# output's (values) come in the same order. Unpacking with one shift-and-mask per code position of a
# whole machine word, instead of one per byte, yields every group's channels in the order
#     position k * (g / p) + j  <-  channel p * j + k      (p codes per byte, j the byte within the group)
# i.e. a permutation *within* each group, so each group's step size and zero-point apply unchanged.
_WORD_DTYPES = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def interleaved_supported(bits: int, group_size: int) -> bool:
    """Whether :func:`unpack_codes_interleaved` handles these codes (INT2 and INT4, groups of 2+ bytes)."""
    if bits not in (2, 4) or sys.byteorder != "little":
        return False
    group_bytes = group_size * bits // 8
    return group_bytes in _WORD_DTYPES or group_bytes % 8 == 0


def unpack_codes_interleaved(packed: Tensor, bits: int, n: int, group_size: int) -> Tensor:
    """The codes of :func:`unpack_codes` in group-interleaved order (see above), uint8 ``(..., n)``.

    One shift-and-mask per code position on 2-, 4- or 8-byte words: 4 (INT2) or 2 (INT4) cheap
    passes over the packed bytes instead of a broadcast over every code.
    """
    if packed.shape[-1] != packed_width(n, bits) or not interleaved_supported(bits, group_size) or n % group_size:
        raise ValueError(f"no interleaved unpacking for {bits}-bit codes in groups of {group_size} over {n} channels")
    lead = packed.shape[:-1]
    per = 8 // bits
    G = n // group_size
    group_bytes = group_size * bits // 8
    word_bytes = min(group_bytes, 8)
    words = group_bytes // word_bytes
    wtype = _WORD_DTYPES[word_bytes]
    w = packed.contiguous().view(wtype).view(*lead, G, 1, words)
    mask = int.from_bytes(bytes([(1 << bits) - 1]) * word_bytes, "little")
    out = torch.empty(*lead, G, per, words, dtype=wtype, device=packed.device)
    for k in range(per):
        torch.bitwise_and(w >> (bits * k) if k else w, mask, out=out[..., k : k + 1, :])
    return out.view(torch.uint8).view(*lead, n)


def to_interleaved(x: Tensor, bits: int, group_size: int) -> Tensor:
    """Reorder the last axis of ``x`` from channel order to the group-interleaved order (a copy)."""
    per = 8 // bits
    n = x.shape[-1]
    return x.reshape(*x.shape[:-1], n // group_size, group_size // per, per).transpose(-1, -2).reshape(x.shape)


def from_interleaved(x: Tensor, bits: int, group_size: int) -> Tensor:
    """Inverse of :func:`to_interleaved`."""
    per = 8 // bits
    n = x.shape[-1]
    return x.reshape(*x.shape[:-1], n // group_size, per, group_size // per).transpose(-1, -2).reshape(x.shape)
