"""What a reference recipe is to a chunk loop: a class with a check of the request and four hooks.

A chunk loop (the pack's ``runtime/chunk_loop.py``; a family's own loop) keeps only the loop: it walks the chunks,
denoises each with ComfyUI's sampler and asks the run's recipe what the reference does around that:

- :meth:`Recipe.check` (a classmethod): what this recipe cannot be combined with, before anything runs
  (ValueError naming the value and the fix);
- :meth:`Recipe.prefill`: before the first chunk (a prefix clip into the cache);
- :meth:`Recipe.before_chunk`: before a chunk is denoised; returns the RoPE frame it is denoised at (a recipe that
  rebuilds its cache first places the chunk after the rebuilt context);
- :meth:`Recipe.write`: after a chunk is denoised (the cache write of the finished chunk, or none);
- :meth:`Recipe.on_prompt_switch`: the prompt changes at this chunk (re-cache the retained chunks under it).

``install`` / ``remove`` add and take away what the recipe hooks into the model (always called, ``remove`` in
``finally``), ``report`` adds the recipe's own lines to the run's report. The hooks get the loop's job and a
:class:`ChunkStep`; what a job offers is the loop's business (see ``runtime/chunk_loop.py``'s ``_Job``).
No ComfyUI import here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar


@dataclass(frozen=True)
class ChunkStep:
    """The chunk a loop is at: this run's ``run_index``-th chunk, absolute ``index``, first latent frame ``frame0``
    (absolute), ``frames`` latent frames, the ``prompt`` it is made under (and its fingerprint ``prompt_key``), and
    whether it is the run's ``last``."""

    run_index: int
    index: int
    frame0: int
    frames: int
    prompt: Any
    prompt_key: Any
    last: bool


class Recipe:
    """A reference's way around the chunk loop (subclasses: one per reference). Instances live for one run."""

    #: short name, in the report
    name: ClassVar[str] = "recipe"
    #: what the reference is and does, one line, in the report and docs
    label: ClassVar[str] = ""

    @classmethod
    def check(cls, request) -> None:
        """ValueError naming what this recipe cannot be combined with in ``request`` (nothing, by default)."""

    def install(self, job) -> None:
        """Hook into the patched model before the run (nothing, by default)."""

    def remove(self, job) -> None:
        """Undo :meth:`install` (in ``finally``; safe after a partial install)."""

    def prefill(self, job) -> None:
        """Before the first chunk (nothing, by default)."""

    def before_chunk(self, job, step: ChunkStep) -> int:
        """Before ``step`` is denoised; returns the RoPE frame it is denoised at (its own first frame, by default)."""
        return step.frame0

    def write(self, job, step: ChunkStep, clean) -> None:
        """After ``step`` is denoised (``clean``: its LATENT frames); nothing, by default."""

    def on_prompt_switch(self, job, step: ChunkStep, index: int) -> int:
        """The prompt switches to the schedule's ``index``-th at ``step``; returns how many chunks were re-cached."""
        return 0

    def report(self) -> dict:
        """The recipe's own report fields (``recipe``, and ``recipe_notes``: lines the report's text shows)."""
        return {"recipe": self.name}
