"""SIGTERM as an interrupt: while a command runs, ``kill``, a job scheduler or a timeout unwinds
it like Ctrl-C (every ``finally`` and temp-file cleanup runs), and the exit status says which.

Compiled code that polls for signals catches the handler's exception: Ray's ``check_signals``
turns any KeyboardInterrupt into an "interrupted" status, which its wait and get re-raise as a
plain KeyboardInterrupt or, when the awaited object is ready in the same poll, drop. So the
handler also sets a flag, and loops around such calls ask ``raise_if_terminated`` each turn."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C."""


# Set when SIGTERM arrived, whatever became of the exception the handler raised.
TERMINATED = threading.Event()


def raise_if_terminated() -> None:
    """Raise ``Terminated`` if SIGTERM arrived and compiled code swallowed the handler's raise."""
    if TERMINATED.is_set():
        raise Terminated


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """While the block runs (in the main thread), SIGTERM raises ``Terminated``."""
    TERMINATED.clear()
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_terminated(signum, frame):
        TERMINATED.set()
        raise Terminated

    previous = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
