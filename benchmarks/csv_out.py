"""Writing a benchmark's result rows: one place, so every script's CSV has the same shape."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def write_rows(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    """The rows as CSV (header from the first row's keys; its folder made if missing), then a
    line saying where they went."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {path}")
