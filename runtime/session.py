"""One run on a patched clone, for every loop that samples with the pack's cache.

The pack's chunk loop (``runtime/chunk_loop.py``), MAGI-1's recipe (``runtime/families/magi1/recipe.py``) and
HY-WorldPlay's (``runtime/families/worldplay/recipe.py``) each walk their chunks their own way; what is around the
walk is the same, and lives here once (:class:`Session`):

- the clone: ``model.clone()``, patched by :meth:`Session.patched` (a recipe's own hooks first, then the family's
  :meth:`~runtime.families.ModelFamily.install`), and undone in ``finally`` after success, an error or an interrupt
  (the family's ``remove``, the recipe's, then the caches and the diagnostics freed); the MODEL it was given is
  never modified;
- the run's :class:`~runtime.run_caches.RunCaches` and the bytes the loop planned for them;
- ComfyUI's memory request (``comfy.model_management.load_models_gpu`` with room for the planned cache, which
  frees other models' memory to make it), its progress bar (``comfy.utils.ProgressBar``), latent previews
  (``latent_preview``, as KSampler's) and interrupts (``throw_exception_if_processing_interrupted``);
- the run's peak memory above its start (:class:`~runtime.peak_memory.PeakMeter`: the CUDA allocator's peak, or
  the process's resident peak on a CPU), measured from the memory request to the end;
- the base report (:func:`base_report`: the caches' bytes and bits, the precision and the correction, the peak
  beside them), which each loop extends with its own fields.

Core's AR path (``runtime/core_ar/``) takes the caches' lifecycle and :func:`base_report` from here and nothing
else: core's sampler owns the model call, the memory, the progress, the previews and the interrupts there (see
``runtime/core_ar/session.py``). ComfyUI is imported lazily, so the module imports without it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

from .config import JensenKVConfig
from .peak_memory import PeakMeter
from .report import MIB, build_report
from .run_caches import RunCaches

logger = logging.getLogger("jensen_kv")


def interrupted() -> None:
    """ComfyUI's interrupt check (raises when the user pressed Cancel)."""
    import comfy.model_management

    comfy.model_management.throw_exception_if_processing_interrupted()


def request_memory(work, planned_bytes: int) -> dict:
    """Ask ComfyUI to load the model with room for the planned cache (it offloads other models to make it)."""
    import comfy.model_management as mm

    device = work.load_device
    mm.load_models_gpu([work], memory_required=int(planned_bytes))
    return {
        "bytes": int(planned_bytes),
        "mib": planned_bytes / MIB,
        "device": str(device),
        "how": "comfy.model_management.load_models_gpu(memory_required=planned peak cache)",
    }


def previewer(model, enabled: bool):
    """ComfyUI's latent previewer for ``model`` (as KSampler's), or None when previews are off or unavailable."""
    if not enabled:
        return None
    try:
        import latent_preview

        return latent_preview.get_previewer(model.load_device, model.model.latent_format)
    except Exception:  # noqa: BLE001 - previews are a nicety; a previewer that fails must not stop sampling
        logger.debug("jensen_kv: no latent previewer", exc_info=True)
        return None


def base_report(caches: RunCaches, config: JensenKVConfig, shape, **facts) -> dict:
    """The report every loop starts from: :func:`runtime.report.build_report` of ``caches`` under ``config``'s
    precision and correction, with the run's own ``facts`` (chunks, chunk_frames, window, seconds, ...)."""
    return build_report(
        caches,
        shape,
        config.precision,
        correction=config.effective_correction,
        strength=config.strength,
        guard=config.guard,
        **facts,
    )


class Session:
    """One run of ``model`` with the pack's cache: the clone, the caches, ComfyUI's services, the base report.

    ``family`` is the MODEL's :class:`~runtime.families.ModelFamily` adapter, ``caches`` the run's
    :class:`RunCaches` (under ``config``), ``planned_bytes`` the cache's planned peak (ComfyUI is asked for that
    much room), ``steps`` the denoising steps the progress bar counts, ``progress`` / ``preview`` whether the bar
    and latent previews are shown, ``diagnostics`` the run's KV Cache Diagnostics observer (freed with the caches).
    Instances live for one run; :meth:`patched` is entered once."""

    def __init__(
        self,
        model,
        family,
        caches: RunCaches,
        config: JensenKVConfig,
        *,
        planned_bytes: int,
        steps: int,
        progress: bool = True,
        preview: bool = True,
        diagnostics: Any = None,
    ):
        import comfy.utils

        self.model, self.family, self.caches, self.config = model, family, caches, config
        self.planned_bytes = int(planned_bytes)
        self.steps = int(steps)
        self.diagnostics = diagnostics
        self.work = model.clone()
        self.previewer = previewer(model, preview and progress)
        self.pbar = comfy.utils.ProgressBar(self.steps) if progress else None
        self.memory_request: dict | None = None
        self.meter: PeakMeter | None = None

    # ------------------------------------------------------------------ the patched clone
    @contextlib.contextmanager
    def patched(
        self, install: Callable[[], None] | None = None, remove: Callable[[], None] | None = None
    ) -> Iterator[Session]:
        """The clone patched for the run, and ComfyUI asked for room for the planned cache: ``install()`` (a recipe's
        own hooks, outside the family's) first, then the family's. On leaving, after success, an error or an
        interrupt: the family's ``remove``, ``remove()``, then the caches and the diagnostics freed."""
        try:
            if install is not None:
                install()
            self.family.install(self.work, self.caches)
            self.memory_request = request_memory(self.work, self.planned_bytes)
            self.meter = PeakMeter(self.work.load_device).start()
            yield self
        finally:
            if self.meter is not None:
                self.meter.stop()
            try:
                self.family.remove(self.work)
            finally:
                if remove is not None:
                    remove()
                self.caches.free()
                if self.diagnostics is not None:
                    self.diagnostics.free()

    # ------------------------------------------------------------------ ComfyUI's progress, previews, interrupts
    def progress(self, done: int, preview: Any = None) -> None:
        """The bar at ``done`` of :attr:`steps`, with a preview of ``preview`` (a latent, or a callable giving one:
        decoded only when previews are on; a preview that fails never fails the run)."""
        if self.pbar is None:
            return
        image = None
        if self.previewer is not None and preview is not None:
            try:
                latent = preview() if callable(preview) else preview
                image = self.previewer.decode_latent_to_preview_image("JPEG", latent)
            except Exception:  # noqa: BLE001 - never fail a run for a preview
                logger.debug("jensen_kv: preview failed", exc_info=True)
        self.pbar.update_absolute(done, self.steps, image)

    def sampler_callback(
        self, chunk: int, done: int, steps: int, step_callback: Callable[[int, int, int], None] | None = None
    ):
        """ComfyUI's sampler callback for the denoising of ``chunk`` (``steps`` steps, ``done`` steps of the run
        before it): the caches' step, the bar with a preview of the step's x0, ``step_callback(chunk, step,
        steps)``, an interrupt check."""

        def on_step(step, x0, x, total):
            self.caches.at(step=step + 1)
            self.progress(done + step + 1, x0)
            if step_callback is not None:
                step_callback(chunk, step, steps)
            interrupted()

        return on_step

    # ------------------------------------------------------------------ the report
    def report(self, shape, **facts) -> dict:
        """:func:`base_report` of this run: its caches, the memory request, the planned bytes, the measured peak
        memory (:mod:`runtime.peak_memory`) and ``facts``."""
        peak = None
        if self.meter is not None:
            peak = self.meter.report(self.caches.usage.peak_bytes, self.planned_bytes)
        return base_report(
            self.caches,
            self.config,
            shape,
            memory_request=self.memory_request,
            planned_bytes=self.planned_bytes,
            peak_memory=peak,
            **facts,
        )


__all__ = ["Session", "base_report", "interrupted", "previewer", "request_memory"]
