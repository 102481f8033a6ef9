"""The bytes of tensors alive at once while code runs, on any device: :class:`LiveTensors`.

A ``TorchDispatchMode`` that sees every tensor an aten op returns inside it, counts its storage once (views and
in-place results of a storage already counted add nothing; a storage the code did not make, a weight or an input,
is never counted) and uncounts it when the last Python tensor over it is gone. ``peak`` is the most bytes alive at
once; :meth:`LiveTensors.scope` measures the transient of a section (the peak inside it above what was alive when
it began, less what it left alive: the dequantized copies of an attention call, not the chunk it stored).

What it cannot see: buffers an op allocates and frees inside its own kernel (SDPA's workspace), and tensors made
before the mode was entered. It is for benchmarks on the CPU, where no allocator statistic exists; it slows the
code it watches, so time nothing under it.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class LiveTensors(TorchDispatchMode):
    """Use as ``with LiveTensors() as live: ...``; then ``live.peak`` (bytes), ``live.transients[name]`` (the
    largest transient of each :meth:`scope` name)."""

    def __init__(self):
        super().__init__()
        self.live = 0
        self.peak = 0
        self._storages: dict[int, list[int]] = {}  # storage data_ptr -> [nbytes, Python tensors alive over it]
        self._scopes: list[list[int]] = []  # [live at entry, peak inside]
        self.transients: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        given = {
            t.untyped_storage().data_ptr()
            for t in tree_flatten((args, kwargs))[0]
            if isinstance(t, torch.Tensor) and t.device.type != "meta"
        }
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                self._track(t, given)
        return out

    def _track(self, t: torch.Tensor, given: set[int]) -> None:
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key == 0:
            return
        entry = self._storages.get(key)
        if entry is None:
            if key in given:  # a view or an in-place result of a storage made before the mode: not ours
                return
            entry = self._storages[key] = [storage.nbytes(), 0]
            self.live += entry[0]
            self.peak = max(self.peak, self.live)
            for scope in self._scopes:
                scope[1] = max(scope[1], self.live)
        entry[1] += 1
        weakref.finalize(t, self._release, key)

    def _release(self, key: int) -> None:
        entry = self._storages.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            del self._storages[key]
            self.live -= entry[0]

    @contextlib.contextmanager
    def scope(self, name: str) -> Iterator[None]:
        """Record the transient of the code inside under ``name`` (the largest over all its entries)."""
        scope = [self.live, self.live]
        self._scopes.append(scope)
        try:
            yield
        finally:
            self._scopes.remove(scope)
            transient = scope[1] - max(scope[0], self.live)
            self.transients[name] = max(self.transients.get(name, 0), transient)


__all__ = ["LiveTensors"]
