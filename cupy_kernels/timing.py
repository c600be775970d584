"""CUDA-event timing of a callable, shared by the kernel benchmarks (CuPy's events or PyTorch's)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any


def _time(fn: Callable[[], None], reps: int, warmup: int, new_event: Callable[[], Any],
          record: Callable[[Any], None], elapsed_ms: Callable[[Any, Any], float]) -> list[float]:
    """Seconds of each of ``reps`` calls of ``fn`` (an event pair around each, so a call's host
    launch path counts only where it stalls the GPU), after ``warmup`` untimed calls."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(reps):
        e0, e1 = new_event(), new_event()
        record(e0)
        fn()
        record(e1)
        e1.synchronize()
        out.append(elapsed_ms(e0, e1) * 1e-3)
    return out


def time_calls(cp: Any, stream: Any, fn: Callable[[], None], reps: int, warmup: int) -> list[float]:
    """``_time`` with CuPy events recorded on ``stream`` (None: the current stream)."""
    return _time(fn, reps, warmup, cp.cuda.Event, lambda e: e.record(stream), cp.cuda.get_elapsed_time)


def time_calls_torch(torch: Any, fn: Callable[[], None], reps: int, warmup: int) -> list[float]:
    """``_time`` with PyTorch events on its current stream (the warm-up finished first)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    return _time(fn, reps, 0, lambda: torch.cuda.Event(enable_timing=True), lambda e: e.record(),
                 lambda a, b: a.elapsed_time(b))


def torch_graph(torch: Any, launch: Callable[[int], Any], n: int) -> tuple[Any, list[Any]]:
    """A CUDA graph of ``launch(0) .. launch(n - 1)`` captured on PyTorch's current stream, each run once
    first on a side stream (warm-up outside the graph, as capture requires), and what the captured
    launches returned (their outputs live in the graph's pool: keep them while it replays)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(n):
            launch(i)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [launch(i) for i in range(n)]
    return graph, outs


def l2_cold_sets(nbytes: int, l2_bytes: int, cap: int = 16) -> int:
    """Copies of a call's input to rotate so that one call's data has left L2 by the next: their sum at
    least twice L2 (one copy when a single one already is), at most ``cap``."""
    return max(1, min(cap, math.ceil(2 * l2_bytes / max(nbytes, 1))))
