"""Progress bars on stderr, shown only to a person at a terminal."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
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


def counter(total: int, *, desc: str = "", quiet: bool = False, unit: str = "it") -> Callable[..., None]:
    """A bar of ``total`` steps drawn at once (0 / total) and advanced by each call of the function
    returned (``tick()`` one step, ``tick(n)`` n): for work that reports through a callback
    (``on_point``, ``on_steps``). ``iter(progress(...))`` drew nothing until the first call (a long
    first point showed no bar) and then lagged a step, tqdm counting an item only once the next was
    asked for. Closed at the last step; steps past it are ignored."""
    if quiet or not sys.stderr.isatty() or total <= 0:
        return lambda n=1: None
    from tqdm import tqdm

    # each step is a simulated point or a block of drawn steps (tens of ms and up): every one is drawn
    bar = tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, leave=False, mininterval=0, miniters=1)
    bar.refresh()

    def tick(n: int = 1) -> None:
        if bar.n < total:
            bar.update(min(n, total - bar.n))
            if bar.n >= total:
                bar.close()

    return tick


@contextmanager
def status(desc: str, *, quiet: bool = False, every_s: float = 0.5) -> Iterator[None]:
    """A line ``desc: <elapsed>`` kept current while the block runs, for work that cannot report its
    steps (the plan's search runs in forked workers, one per system); erased at the end."""
    if quiet or not sys.stderr.isatty():
        yield
        return
    import threading

    from tqdm import tqdm

    bar = tqdm(total=None, desc=desc, bar_format="{desc}: {elapsed}", file=sys.stderr, leave=False)
    bar.refresh()
    done = threading.Event()

    def tick() -> None:
        while not done.wait(every_s):
            bar.refresh()

    thread = threading.Thread(target=tick, name="status", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        bar.close()
