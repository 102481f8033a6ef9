"""A run's peak memory, measured on the device it ran on, for the report beside the cache's planned bytes.

The planner and the report give the cache's bytes to the byte; a user reads the peak of the whole run (what
``nvidia-smi`` or the task manager shows). :class:`PeakMeter` measures it from the moment the run's model is
loaded (after ComfyUI's memory request) to its end, as bytes above that start:

- **CUDA**: the allocator's peak (``torch.cuda.max_memory_allocated``, its peak statistic reset at the start) minus
  what was allocated at the start: every tensor of the run (the cache, the block in flight, activations, the
  dequantized transients of attention), not the allocator's reserved-but-free blocks;
- **CPU on Linux**: the process's resident peak (``VmHWM`` of ``/proc/self/status``, reset at the start by
  writing ``5`` to ``/proc/self/clear_refs``) minus its resident size at the start. A lower bound of what the run
  allocated: memory the allocator already held and reused does not count again;
- elsewhere (or where the reset is refused), nothing: the report says the peak was not measured, and why.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

PROC_STATUS = Path("/proc/self/status")
PROC_CLEAR_REFS = Path("/proc/self/clear_refs")


def _status_bytes(field: str, status: Path = PROC_STATUS) -> int | None:
    """``field`` (``VmRSS``, ``VmHWM``) of ``/proc/self/status`` in bytes, or None where there is no such file."""
    try:
        m = re.search(rf"^{field}:\s+(\d+)\s+kB", status.read_text(), re.M)
    except OSError:
        return None
    return int(m.group(1)) * 1024 if m else None


class PeakMeter:
    """The peak memory of one run above its start on ``device`` (a ``torch.device`` or its string).

    :meth:`start` when the run's model is loaded, :meth:`stop` in the run's ``finally``; :meth:`report` (any
    time: the peak so far before :meth:`stop`) gives the report's ``peak_memory`` entry."""

    def __init__(self, device, *, status: Path = PROC_STATUS, clear_refs: Path = PROC_CLEAR_REFS):
        self.device = torch.device(device)
        self._status, self._clear_refs = status, clear_refs
        self._start: int | None = None
        self._peak: int | None = None
        self.how: str = ""
        self.why_not: str | None = None

    # ------------------------------------------------------------------ measuring
    def start(self) -> PeakMeter:
        if self.device.type == "cuda" and torch.cuda.is_available():
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._start = torch.cuda.memory_allocated(self.device)
            self.how = "CUDA allocator: peak allocated above the run's start"
        elif self.device.type == "cpu":
            try:
                self._clear_refs.write_text("5")  # resets VmHWM to the current resident size (Linux)
            except OSError as e:
                self.why_not = f"the process's resident peak cannot be reset here ({type(e).__name__})"
                return self
            self._start = _status_bytes("VmRSS", self._status)
            if self._start is None:
                self.why_not = "no /proc/self/status (not Linux)"
            self.how = "process resident set: peak (VmHWM) above the run's start (a lower bound of its allocations)"
        else:
            self.why_not = f"no peak statistic for a {self.device.type} device"
        return self

    def _now(self) -> int | None:
        if self._start is None:
            return None
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            peak = torch.cuda.max_memory_allocated(self.device)
        else:
            peak = _status_bytes("VmHWM", self._status)
            if peak is None:
                return None
        return max(0, int(peak) - self._start)

    def stop(self) -> None:
        if self._peak is None:
            self._peak = self._now()

    @property
    def peak_bytes(self) -> int | None:
        """Bytes above the start at the run's peak (so far, before :meth:`stop`); None when not measured."""
        return self._peak if self._peak is not None else self._now()

    def report(self, cache_bytes: int, planned_bytes: int | None) -> dict:
        """The report's ``peak_memory``: the measured peak beside the cache's peak and its plan, and what the run
        held above the cache (the model's activations, the block in flight, attention's transients)."""
        peak = self.peak_bytes
        return {
            "device": str(self.device),
            "peak_bytes": peak,
            "cache_bytes": int(cache_bytes),
            "planned_cache_bytes": None if planned_bytes is None else int(planned_bytes),
            "above_cache_bytes": None if peak is None else max(0, peak - int(cache_bytes)),
            "how": self.how if peak is not None else None,
            "why_not": None if peak is not None else (self.why_not or "not measured"),
        }


def peak_text(peak: dict | None) -> str | None:
    """The report's line for ``peak`` (:meth:`PeakMeter.report`), or None when there is none."""
    if not peak:
        return None
    mib = 2**20
    plan = peak.get("planned_cache_bytes")
    planned = "" if plan is None else f", planned {plan / mib:.2f} MiB"
    if peak.get("peak_bytes") is None:
        return f"Peak memory not measured ({peak.get('why_not')}); the cache's peak {peak['cache_bytes'] / mib:.2f} MiB{planned}."
    where = "GPU" if str(peak["device"]).startswith("cuda") else "process"
    return (
        f"Peak memory of the run ({where}): {peak['peak_bytes'] / mib:.2f} MiB above its start; the cache's peak "
        f"{peak['cache_bytes'] / mib:.2f} MiB{planned}; the rest ({peak['above_cache_bytes'] / mib:.2f} MiB) is the "
        "model's activations and attention's transients."
    )


__all__ = ["PeakMeter", "peak_text"]
