"""A small thread pool for the replay's per-stream and per-chunk work.

Why not ``concurrent.futures``: importing it loads ``logging`` (~6 ms of CPU together, a tenth
of a whole ``hisparse replay`` process on a .npy stream or a short trace; BENCHMARKS.md), and the
replay needs only what is here: ``submit`` a call, get its ``result()`` (its exception raised
in the caller), and on leaving the ``with`` block wait for the calls that started. A call still
queued when the block is left by an exception is dropped, never started.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any


class Cancelled(RuntimeError):
    """The result of a call that the pool dropped before it started (its block was left early)."""


class Job:
    """One submitted call: ``result()`` waits for it and returns its value or raises its error."""

    __slots__ = ("_fn", "_args", "_kwargs", "_done", "_value", "_error")

    def __init__(self, fn: Callable[..., Any], args: tuple, kwargs: dict[str, Any]) -> None:
        self._fn, self._args, self._kwargs = fn, args, kwargs
        self._done = threading.Event()
        self._value: Any = None
        self._error: BaseException | None = None

    def _run(self) -> None:
        try:
            self._value = self._fn(*self._args, **self._kwargs)
        except BaseException as exc:  # handed to the caller by result(), as a future does
            self._error = exc
        finally:
            self._fn = self._args = self._kwargs = None  # type: ignore[assignment] - free the inputs early
            self._done.set()

    def _cancel(self) -> None:
        self._error = Cancelled("dropped before it started")
        self._done.set()

    def result(self) -> Any:
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._value


class ThreadPool:
    """Up to ``workers`` threads, started as calls arrive, running calls in submission order."""

    def __init__(self, workers: int, name: str = "replay") -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self._workers, self._name = workers, name
        self._queue: deque[Job] = deque()
        self._ready = threading.Condition()
        self._idle = 0
        self._closed = False
        self._threads: list[threading.Thread] = []

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Job:
        job = Job(fn, args, kwargs)
        with self._ready:
            if self._closed:
                raise RuntimeError("submit on a closed ThreadPool")
            self._queue.append(job)
            if self._idle:  # a waiting thread takes it (counted off here, so two calls wake two)
                self._idle -= 1
                self._ready.notify()
            elif len(self._threads) < self._workers:
                thread = threading.Thread(target=self._work, name=f"{self._name}-{len(self._threads)}", daemon=True)
                self._threads.append(thread)
                thread.start()
        return job

    def _work(self) -> None:
        while True:
            with self._ready:
                while not self._queue and not self._closed:
                    self._idle += 1  # submit counts it off when it wakes this thread
                    self._ready.wait()
                if not self._queue:
                    return
                job = self._queue.popleft()
            job._run()

    def close(self, *, drop_queued: bool = False, wait: bool = True) -> None:
        """No more calls; wait for the running ones (and the queued ones unless ``drop_queued``);
        with ``wait`` False, leave the running ones to finish on their own (daemon threads)."""
        with self._ready:
            self._closed = True
            if drop_queued:
                while self._queue:
                    self._queue.popleft()._cancel()
            self._ready.notify_all()
        if not wait:
            return
        for thread in self._threads:
            thread.join()

    def __enter__(self) -> ThreadPool:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        # Ctrl-C / SIGTERM: return at once. A running call may be compiled code that never looks at
        # signals (a native replay of one long stream ran on for ~25 s after Ctrl-C); its thread is
        # a daemon, and nothing reads its result.
        interrupted = exc_type is not None and issubclass(exc_type, KeyboardInterrupt)
        self.close(drop_queued=exc_type is not None, wait=not interrupted)


def run_in_order(items: Iterable[Any], workers: int, ahead: int, submit: Callable[[ThreadPool, Any], Any],
                 collect: Callable[[Any], None]) -> None:
    """``submit(pool, item)`` for each item on a pool of ``workers`` threads and ``collect`` what
    it returned, in order, at most ``ahead`` items beyond the one collected next (bounded memory)."""
    with ThreadPool(workers) as pool:
        pending: deque = deque()
        for item in items:
            pending.append(submit(pool, item))
            if len(pending) > ahead:
                collect(pending.popleft())
        while pending:
            collect(pending.popleft())
