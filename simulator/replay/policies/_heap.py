"""A lazy min-heap of (key, slot) over two word rows, for key-ordered policies (LFU, OPT).

A policy using it declares 5 slot rows (0 current keys, 1-2 heap, 3-4 stash), g[0] for the heap
size and two more scalars for the stash (passed as ``gs``).

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
def pop_victim(sw, g, gs, mark, stamp):  # pragma: no cover - compiled
    """The unprotected slot with the smallest live key (heap in word rows 1-2, current keys in
    row 0, size in g[0]); the slot's key becomes EMPTY. Protected entries (marked with
    ``stamp``) popped on the way are set aside in rows 3-4 until the next step's first call
    (g[gs] of them, g[gs + 1] their stamp: the caller's two scalars), so a batched step passes
    over each protected entry once, not once per victim; then the live ones go back."""
    keys, vals, cur, stash_k, stash_v = sw[1], sw[2], sw[0], sw[3], sw[4]
    ns, st = gs, gs + 1
    if g[st] != stamp:
        for i in range(g[ns]):
            if cur[stash_v[i]] == stash_k[i]:  # still live
                push(keys, vals, g, 0, cur, cur.shape[0], stash_k[i], stash_v[i])
        g[ns] = 0
        g[st] = stamp
    found = -1
    while g[0] > 0:
        k = keys[0]
        s = vals[0]
        n = g[0] - 1
        g[0] = n
        if n > 0:
            keys[0] = keys[n]
            vals[0] = vals[n]
            _sift_down(keys, vals, n, 0)
        if cur[s] != k:
            continue  # stale
        if mark[s] == stamp:
            stash_k[g[ns]] = k
            stash_v[g[ns]] = s
            g[ns] += 1
            continue
        found = s
        break
    cur[found] = EMPTY
    return found
