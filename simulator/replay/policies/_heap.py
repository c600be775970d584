"""A lazy min-heap of (key, slot) over two word rows, for key-ordered policies (LFU, OPT).

Entries go stale when a slot's key changes: each slot's current key lives in ``cur`` and a
popped entry counts only if it still matches. When the rows fill up, the heap is rebuilt from
the current keys of the ``n_slots`` slots (``cur`` = EMPTY marks a slot with nothing in it).
"""

from __future__ import annotations

from numba import njit

EMPTY = -(2**62)


@njit(cache=True)
def _sift_up(keys, vals, i):  # pragma: no cover - compiled
    k = keys[i]
    v = vals[i]
    while i > 0:
        parent = (i - 1) >> 1
        if keys[parent] < k or (keys[parent] == k and vals[parent] <= v):
            break
        keys[i] = keys[parent]
        vals[i] = vals[parent]
        i = parent
    keys[i] = k
    vals[i] = v


@njit(cache=True)
def _sift_down(keys, vals, n, i):  # pragma: no cover - compiled
    k = keys[i]
    v = vals[i]
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and (keys[c + 1] < keys[c] or (keys[c + 1] == keys[c] and vals[c + 1] < vals[c])):
            c += 1
        if k < keys[c] or (k == keys[c] and v <= vals[c]):
            break
        keys[i] = keys[c]
        vals[i] = vals[c]
        i = c
    keys[i] = k
    vals[i] = v


@njit(cache=True)
def push(keys, vals, g, gi, cur, n_slots, key, slot):  # pragma: no cover - compiled
    """Push (key, slot); g[gi] holds the heap size."""
    n = g[gi]
    if n >= keys.shape[0]:
        n = 0  # rebuild from the live keys
        for s in range(n_slots):
            if cur[s] != EMPTY:
                keys[n] = cur[s]
                vals[n] = s
                n += 1
        for i in range(n // 2 - 1, -1, -1):
            _sift_down(keys, vals, n, i)
        g[gi] = n
        if cur[slot] == key:  # the rebuild already holds this entry
            return
    keys[n] = key
    vals[n] = slot
    g[gi] = n + 1
    _sift_up(keys, vals, n)


@njit(cache=True)
def pop_live(keys, vals, g, gi, cur, mark, stamp, stash_k, stash_v):  # pragma: no cover - compiled
    """Pop the smallest live entry whose slot is not marked with ``stamp``; marked live entries
    popped on the way are pushed back. Returns the slot."""
    ns = 0
    found = -1
    while g[gi] > 0:
        k = keys[0]
        s = vals[0]
        n = g[gi] - 1
        g[gi] = n
        if n > 0:
            keys[0] = keys[n]
            vals[0] = vals[n]
            _sift_down(keys, vals, n, 0)
        if cur[s] != k:
            continue  # stale
        if mark[s] == stamp:
            stash_k[ns] = k
            stash_v[ns] = s
            ns += 1
            continue
        found = s
        break
    for i in range(ns):
        n = g[gi]
        keys[n] = stash_k[i]
        vals[n] = stash_v[i]
        g[gi] = n + 1
        _sift_up(keys, vals, n)
    return found


@njit(cache=True)
def pop_victim(sw, g, mark, stamp):  # pragma: no cover - compiled
    """The unprotected slot with the smallest key (heap in word rows 1-2, stash in 3-4, current
    keys in row 0, size in g[0]); the slot's key becomes EMPTY."""
    v = pop_live(sw[1], sw[2], g, 0, sw[0], mark, stamp, sw[3], sw[4])
    sw[0][v] = EMPTY
    return v
