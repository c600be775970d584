"""One compiled entry point per policy: the step loop with the policy's id as a constant.

Generated from the registry (simulator/replay/policies/__init__.py) by
``python -m simulator.replay.policies.generate``: do not edit.
"""

from __future__ import annotations

from numba import njit

from . import step


@njit(cache=True, nogil=True)
def replay_lru(a, b, c, d, e, f, g, h, i, j, k, m, n, o, p):  # pragma: no cover - compiled
    return step.run(0, a, b, c, d, e, f, g, h, i, j, k, m, n, o, p)


@njit(cache=True, nogil=True)
def replay_fifo(a, b, c, d, e, f, g, h, i, j, k, m, n, o, p):  # pragma: no cover - compiled
    return step.run(1, a, b, c, d, e, f, g, h, i, j, k, m, n, o, p)


@njit(cache=True, nogil=True)
def replay_clock(a, b, c, d, e, f, g, h, i, j, k, m, n, o, p):  # pragma: no cover - compiled
    return step.run(2, a, b, c, d, e, f, g, h, i, j, k, m, n, o, p)


@njit(cache=True, nogil=True)
def replay_lfu(a, b, c, d, e, f, g, h, i, j, k, m, n, o, p):  # pragma: no cover - compiled
    return step.run(3, a, b, c, d, e, f, g, h, i, j, k, m, n, o, p)


@njit(cache=True, nogil=True)
def replay_arc(a, b, c, d, e, f, g, h, i, j, k, m, n, o, p):  # pragma: no cover - compiled
    return step.run(4, a, b, c, d, e, f, g, h, i, j, k, m, n, o, p)


@njit(cache=True, nogil=True)
def replay_s3fifo(a, b, c, d, e, f, g, h, i, j, k, m, n, o, p):  # pragma: no cover - compiled
    return step.run(5, a, b, c, d, e, f, g, h, i, j, k, m, n, o, p)


@njit(cache=True, nogil=True)
def replay_sieve(a, b, c, d, e, f, g, h, i, j, k, m, n, o, p):  # pragma: no cover - compiled
    return step.run(6, a, b, c, d, e, f, g, h, i, j, k, m, n, o, p)


@njit(cache=True, nogil=True)
def replay_random(a, b, c, d, e, f, g, h, i, j, k, m, n, o, p):  # pragma: no cover - compiled
    return step.run(7, a, b, c, d, e, f, g, h, i, j, k, m, n, o, p)


@njit(cache=True, nogil=True)
def replay_opt(a, b, c, d, e, f, g, h, i, j, k, m, n, o, p):  # pragma: no cover - compiled
    return step.run(8, a, b, c, d, e, f, g, h, i, j, k, m, n, o, p)


@njit(cache=True, nogil=True)
def replay_salru(a, b, c, d, e, f, g, h, i, j, k, m, n, o, p, q, r):  # pragma: no cover - compiled
    return step.run_placed(9, a, b, c, d, e, f, g, h, i, j, k, m, n, o, p, q, r)


@njit(cache=True, nogil=True)
def replay_sglang_clock(a, b, c, d, e, f, g, h, i, j, k, m, n, o, p, q, r):  # pragma: no cover - compiled
    return step.run_placed(10, a, b, c, d, e, f, g, h, i, j, k, m, n, o, p, q, r)


# In registry order: ENTRIES[pid].
ENTRIES = (replay_lru, replay_fifo, replay_clock, replay_lfu, replay_arc, replay_s3fifo, replay_sieve, replay_random, replay_opt, replay_salru, replay_sglang_clock)
