"""Writing a benchmark's result rows: one place, so every script's CSV has the same shape."""

from __future__ import annotations

import contextlib
import csv
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any


def write_rows(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    """The rows as CSV (header: every row's keys in the order they first appear, a key a row lacks
    left empty there; its folder made if missing), then a line saying where they went."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for r in rows for k in r)), restval="")
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {path}")


@contextlib.contextmanager
def row_stream(path: Path) -> Iterator[Callable[[dict[str, Any]], None]]:
    """A writer of rows as they are measured, in ``write_rows``'s shape (header from the first row's keys; its
    folder made if missing), each row flushed, so a run stopped by a time limit keeps what it timed; then the
    line saying where they went."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer: list[csv.DictWriter] = []

        def put(row: dict[str, Any]) -> None:
            if not writer:
                writer.append(csv.DictWriter(f, fieldnames=list(row)))
                writer[0].writeheader()
            writer[0].writerow(row)
            f.flush()

        yield put
    print(f"wrote {path}")
