"""Aggregating :func:`jensen_core.attention_shift.attention_shift` results over many calls.

``attention_shift`` compares one call (one layer, one step) with its full-precision reference. A run
samples many calls; :class:`ShiftAccumulator` keeps every per-query ΔP_S (the distribution the
paper's Fig. 4 plots), the sums behind the mean JSD and the element-weighted output MSE, and
:func:`summarize` / :func:`common_histogram` turn them into plain, JSON-ready numbers.
"""

from __future__ import annotations

from collections.abc import Sequence

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
        self._heads: dict[str, list[Tensor]] = {}  # per head label, its ΔP_S samples (tails per head)

    def add(
        self, stats: ShiftStats, output_elements: int, head_labels: Sequence[str] | None = None, batch: int = 1
    ) -> None:
        """Add one call; ``output_elements`` is how many attention-output values its MSE averaged.

        ``head_labels``: one name per query head of the call (e.g. "layer 3 head 5"); the ΔP_S samples come in
        (``batch``, head, query) order, as :func:`attention_shift` returns them, and are kept per head for the tails.
        """
        if output_elements < 0:
            raise ValueError(f"output_elements={output_elements} must be non-negative")
        d = stats.delta_ps.detach().to("cpu", torch.float32).reshape(-1)
        if head_labels is not None:
            labels = list(head_labels)
            if not labels or batch < 1 or d.numel() % (batch * len(labels)):
                raise ValueError(
                    f"{d.numel()} ΔP_S samples do not split over batch {batch} x {len(labels)} head labels; give "
                    "one label per query head of the call and its batch size"
                )
            per = d.reshape(batch, len(labels), -1)
            for i, name in enumerate(labels):
                self._heads.setdefault(name, []).append(per[:, i].reshape(-1))
        self._delta_ps.append(d)
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
            return {**dict.fromkeys(keys), "samples": 0, "calls": self.calls, **self.tails()}
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
            **self.tails(),
        }

    def tails(self) -> dict:
        """The tails of |ΔP_S|: its 95th and 99th percentiles over every sample, per head (where the calls named
        their heads) and the worst head (the largest 99th percentile). JSON-ready; ``None`` where no sample."""
        d = self.delta_ps()
        if d.numel() == 0:
            return {"p95_abs_delta_ps": None, "p99_abs_delta_ps": None, "per_head": {}, "worst_head": None}
        return {**abs_tails(d), **head_tails({k: torch.cat(v) for k, v in self._heads.items()})}


def abs_tails(delta_ps: Tensor) -> dict:
    """``{"p95_abs_delta_ps", "p99_abs_delta_ps"}`` of ``|delta_ps|``."""
    s = delta_ps.detach().to("cpu", torch.float32).reshape(-1).abs().sort().values
    return {"p95_abs_delta_ps": quantile(s, 0.95), "p99_abs_delta_ps": quantile(s, 0.99)}


def head_tails(per_head: dict[str, Tensor]) -> dict:
    """Per head, the median ΔP_S and the 95th / 99th percentiles of |ΔP_S|; the worst head by its 99th."""
    heads = {}
    for name, t in per_head.items():
        if t.numel():
            s = t.detach().to("cpu", torch.float32).reshape(-1).sort().values
            heads[name] = {"median_delta_ps": quantile(s, 0.5), **abs_tails(s), "samples": int(s.numel())}
    worst = max(heads, key=lambda k: heads[k]["p99_abs_delta_ps"], default=None)
    return {"per_head": heads, "worst_head": None if worst is None else {"head": worst, **heads[worst]}}


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
