"""The numba reference of ``mrc``'s stack-distance pass (``native.lru_stack_hist`` is its C twin,
checked against it in tests/test_mrc.py); imported only without the compiled module."""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def stack_distance_histogram(indices, ctx_len, reserve, max_size):  # pragma: no cover - compiled
    """hist[d] = accesses with LRU stack distance d (1..max_size); hist[0] counts cold misses and
    distances above max_size."""
    steps, width = indices.shape
    n = 0
    cmax = 1
    for t in range(steps):
        cmax = max(cmax, ctx_len[t])
        for j in range(width):
            if indices[t, j] >= 0:
                n += 1
    tree = np.zeros(n + 1, dtype=np.int64)  # Fenwick over access times (1-based)
    last = np.zeros(cmax, dtype=np.int64)  # latest access time of each position, 0 = never
    hist = np.zeros(max_size + 1, dtype=np.int64)
    now = 0
    live = 0
    for t in range(steps):
        newest = ctx_len[t] - 1
        for j in range(width):
            p = indices[t, j]
            if p < 0:
                break
            if reserve and p == newest:
                continue
            now += 1
            prev = last[p]
            if prev == 0:
                hist[0] += 1
            else:
                # distinct positions touched after prev = live marks in (prev, now)
                s = 0
                i = now - 1
                while i > 0:
                    s += tree[i]
                    i -= i & -i
                i = prev
                while i > 0:
                    s -= tree[i]
                    i -= i & -i
                d = s + 1
                if d > max_size:
                    hist[0] += 1
                else:
                    hist[d] += 1
                i = prev
                while i <= n:
                    tree[i] -= 1
                    i += i & -i
                live -= 1
            i = now
            while i <= n:
                tree[i] += 1
                i += i & -i
            live += 1
            last[p] = now
    return hist
