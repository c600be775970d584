"""CUDA-event timing of a callable on a stream, shared by the kernel benchmarks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def time_calls(cp: Any, stream: Any, fn: Callable[[], None], reps: int, warmup: int) -> list[float]:
    """Seconds of each of ``reps`` calls of ``fn`` on ``stream`` (an event pair around each, so a
    call's host launch path counts only where it stalls the GPU), after ``warmup`` untimed calls."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(reps):
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record(stream)
        fn()
        e1.record(stream)
        e1.synchronize()
        out.append(cp.cuda.get_elapsed_time(e0, e1) * 1e-3)
    return out
