"""Aggregating :func:`jensen_core.attention_shift.attention_shift` results over many calls.

``attention_shift`` compares one call (one layer, one step) with its full-precision reference. A run
samples many calls; :class:`ShiftAccumulator` keeps every per-query ΔP_S (the distribution the
paper's Fig. 4 plots), the sums behind the mean JSD and the element-weighted output MSE, and
:func:`summarize` / :func:`common_histogram` turn them into plain, JSON-ready numbers.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .attention_shift import ShiftStats, quantile


class ShiftAccumulator:
    """Collects the ΔP_S samples, JSD sums and output squared errors of many ``attention_shift`` calls."""

    def __init__(self) -> None:
        self._delta_ps: list[Tensor] = []
        self._jsd_sum = 0.0
        self._jsd_count = 0
        self._sq_err = 0.0
        self._elements = 0
        self.calls = 0

    def add(self, stats: ShiftStats, output_elements: int) -> None:
        """Add one call; ``output_elements`` is how many attention-output values its MSE averaged."""
        if output_elements < 0:
            raise ValueError(f"output_elements={output_elements} must be non-negative")
        self._delta_ps.append(stats.delta_ps.detach().to("cpu", torch.float32).reshape(-1))
        self._jsd_sum += float(stats.jsd.detach().to(torch.float64).sum())
        self._jsd_count += stats.jsd.numel()
        self._sq_err += float(stats.output_mse) * output_elements
        self._elements += output_elements
        self.calls += 1

    @property
    def samples(self) -> int:
        return sum(t.numel() for t in self._delta_ps)

    def delta_ps(self) -> Tensor:
        """Every ΔP_S sample so far (float32, CPU)."""
        return torch.cat(self._delta_ps) if self._delta_ps else torch.zeros(0)

    def summary(self) -> dict:
        """Median, quartiles, IQR and mean of ΔP_S; mean JSD; output MSE; sample and call counts.

        Empty accumulators give ``None`` statistics (JSON has no NaN).
        """
        d = self.delta_ps()
        if d.numel() == 0:
            keys = (
                "median_delta_ps",
                "q25_delta_ps",
                "q75_delta_ps",
                "iqr_delta_ps",
                "mean_delta_ps",
                "mean_jsd",
                "output_mse",
            )
            return {**dict.fromkeys(keys), "samples": 0, "calls": self.calls}
        s = d.sort().values
        q25, q75 = quantile(s, 0.25), quantile(s, 0.75)
        return {
            "median_delta_ps": quantile(s, 0.5),
            "q25_delta_ps": q25,
            "q75_delta_ps": q75,
            "iqr_delta_ps": q75 - q25,
            "mean_delta_ps": float(d.to(torch.float64).mean()),
            "mean_jsd": self._jsd_sum / max(self._jsd_count, 1),
            "output_mse": self._sq_err / max(self._elements, 1),
            "samples": int(d.numel()),
            "calls": self.calls,
        }


def common_histogram(samples: dict[str, Tensor], bins: int = 60, tail: float = 0.005) -> dict:
    """Histograms of several sample sets on one set of bin edges (for overlaid plots).

    The range spans the ``tail`` to ``1 - tail`` quantiles of all sets together and always includes 0;
    values beyond it are counted in the outermost bins (``clamped`` says how many). Returns
    ``{"edges": [bins + 1 floats], "counts": {name: [bins ints]}, "clamped": {name: int}}``.
    """
    if bins < 1:
        raise ValueError(f"bins={bins} must be at least 1")
    if not 0.0 <= tail < 0.5:
        raise ValueError(f"tail={tail} must be in [0, 0.5)")
    flat = {name: t.detach().to("cpu", torch.float64).reshape(-1) for name, t in samples.items()}
    every = torch.cat(list(flat.values())) if flat else torch.zeros(0, dtype=torch.float64)
    if every.numel() == 0:
        lo, hi = -1e-6, 1e-6
    else:
        s = every.sort().values
        lo, hi = min(quantile(s, tail), 0.0), max(quantile(s, 1.0 - tail), 0.0)
    if hi - lo < 1e-12:
        lo, hi = lo - 1e-6, hi + 1e-6
    edges = torch.linspace(lo, hi, bins + 1, dtype=torch.float64)
    counts, clamped = {}, {}
    for name, t in flat.items():
        outside = (t < lo) | (t > hi)
        clamped[name] = int(outside.sum())
        idx = ((t.clamp(lo, hi) - lo) / (hi - lo) * bins).floor().clamp(0, bins - 1).long()
        counts[name] = torch.bincount(idx, minlength=bins).tolist()
    return {"edges": edges.tolist(), "counts": counts, "clamped": clamped}
