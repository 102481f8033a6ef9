"""StoredTensor: what every quantization method's stored tensor offers attention, the bias and the cache.

One class per stored format subclasses it: :class:`jensen_core.rtn.QuantizedTensor` (``method="rtn"``)
and :class:`jensen_core.qvg.QVGTensor` (``method="qvg"``, which holds an RTN residual rather than being
one). ``isinstance(t, StoredTensor)`` asks "is this side quantized?" whatever the method; what a method
does is asked of its object in :mod:`jensen_core.methods`, never of ``spec.method``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


class StoredTensor:
    """A quantized tensor of shape ``(..., tokens, head_dim)`` with its ``spec``, original ``dtype`` and storage.

    Subclasses provide ``spec``, ``shape``, ``dtype``, ``scale_format``, ``device``, ``nbytes``,
    :meth:`to`, :meth:`step_sizes`, :meth:`dequantize`, ``interleaved`` / :meth:`dequantize_interleaved`,
    indexing of the leading dimensions and :meth:`flatten_leading`.
    """

    __slots__ = ()
    shape: torch.Size

    @property
    def head_dim(self) -> int:
        return self.shape[-1]

    @property
    def tokens(self) -> int:
        return self.shape[-2]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def effective_bits(self) -> float:
        """Stored bits per element, everything the tensor holds counted."""
        return self.nbytes * 8 / self.numel

    @property
    def nbytes(self) -> int:  # pragma: no cover - every format defines it
        raise NotImplementedError

    def step_sizes(self) -> Tensor:  # pragma: no cover - every format defines it
        """Step size Delta of the stored codes per group, float32, ``(..., tokens, head_dim // group_size)``."""
        raise NotImplementedError

    def dequantize(
        self, dtype: torch.dtype | None = None, rotated: bool = False, out: Tensor | None = None
    ) -> Tensor:  # pragma: no cover - every format defines it
        raise NotImplementedError


class JoinedTensor(StoredTensor):
    """A stored tensor made of stored ``parts`` whose specs differ in ``bits`` only (chunks at their age's bits:
    :class:`jensen_core.tiers.TieredTensor`; heads at their own: :class:`jensen_core.head_bits.HeadBitsTensor`).
    Spec, dtype, device and scale format are the first part's; its bytes are the parts'; never interleaved."""

    __slots__ = ()
    parts: list[StoredTensor]

    @property
    def spec(self):
        return self.parts[0].spec

    @property
    def dtype(self) -> torch.dtype:
        return self.parts[0].dtype

    @property
    def device(self) -> torch.device:
        return self.parts[0].device

    @property
    def scale_format(self) -> str:
        return self.parts[0].scale_format

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)

    @property
    def interleaved(self) -> bool:
        return False
