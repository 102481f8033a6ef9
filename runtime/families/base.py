"""The interface a model family implements so the Chunked AR sampler can drive it.

A family adapter knows four things about its models, and nothing about caches or samplers:

- **detection**: :meth:`ModelFamily.probe` looks at a ModelPatcher and says whether the family
  applies and, if it does, what (if anything) stops the pack from supporting this variant;
- **self-attention**: :meth:`ModelFamily.install` routes every self-attention layer of a *clone*
  through :meth:`runtime.cache_run.CacheRun.attend` (object patches, wrappers), and
  :meth:`ModelFamily.remove` undoes exactly that;
- **RoPE frame offset**: the chunk's absolute first latent frame (``run.frame_offset``) must reach
  the rotary embedding, so cached keys and the current chunk sit at their true positions;
- **latent geometry**: channels, how latent frames become tokens (:meth:`tokens_per_frame`) and
  which latents it can take (:meth:`check_latent`).

Adding a family is adding one file in ``runtime/families/`` and its class to ``FAMILIES`` there.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar


class UnsupportedModelError(ValueError):
    """The MODEL is not one the Chunked AR sampler supports (the message names the supported ones)."""


@dataclass(frozen=True)
class Probe:
    """What a family's probe found: ``applies`` (it is this family), ``problem`` (why it is not supported)."""

    applies: bool
    problem: str | None = None

    @property
    def supported(self) -> bool:
        return self.applies and self.problem is None


class ModelFamily(ABC):
    """One model family (Wan 2.1 T2V, ...). Instances belong to one ModelPatcher and one run."""

    #: short name, e.g. "Wan 2.1 T2V"
    name: ClassVar[str]
    #: one sentence for errors: which checkpoints this family covers and how they are loaded
    supported: ClassVar[str]
    latent_channels: ClassVar[int]

    num_layers: int
    heads: int
    head_dim: int

    @classmethod
    @abstractmethod
    def probe(cls, model_patcher) -> Probe:
        """Inspect ``model_patcher`` without changing it."""

    @abstractmethod
    def install(self, work, run) -> None:
        """Patch ``work`` (a clone made for one run) so its self-attention goes through ``run``."""

    @abstractmethod
    def remove(self, work) -> None:
        """Undo :meth:`install` on ``work``; safe after a partial install or an error."""

    @abstractmethod
    def tokens_per_frame(self, latent_shape: tuple[int, ...]) -> int:
        """Self-attention tokens of one latent frame of a latent of this shape."""

    @abstractmethod
    def check_latent(self, samples) -> None:
        """ValueError naming the fix when this family cannot take ``samples`` (channels, size)."""

    def fingerprint(self) -> dict:
        """The architecture facts a saved cache must match (see ``runtime.run_state``)."""
        return {"family": self.name, "layers": self.num_layers, "heads": self.heads, "head_dim": self.head_dim}
