"""Progress bars on stderr, shown only to a person at a terminal."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")


def progress(items: Iterable[T], *, total: int | None = None, desc: str = "", quiet: bool = False,
             unit: str = "it") -> Iterator[T]:
    """Wrap ``items`` in a tqdm bar unless quiet or stderr is not a terminal."""
    if quiet or not sys.stderr.isatty():
        yield from items
        return
    from tqdm import tqdm

    yield from tqdm(items, total=total, desc=desc, unit=unit, file=sys.stderr, leave=False)
