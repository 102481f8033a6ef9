"""What the benchmarks write beside their printed tables: the rows as CSV."""

from __future__ import annotations

import csv
from pathlib import Path


def write_csv(path: str | Path, rows: list[dict]) -> Path:
    """``rows`` (dicts with the first row's keys, in its order) as a CSV file at ``path``, its folder made; the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return path
