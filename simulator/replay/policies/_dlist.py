"""Intrusive doubly linked lists over slot (or position) numbers, for the compiled policies.

``prev`` and ``nxt`` are rows of a policy's word table; list heads are sentinel indices past the
last real node (e.g. B, B+1). The first node after a head is the oldest.
"""

from __future__ import annotations

from numba import njit


@njit(cache=True)
def init(prev, nxt, head):  # pragma: no cover - compiled
    prev[head] = head
    nxt[head] = head


@njit(cache=True)
def push_tail(prev, nxt, head, x):  # pragma: no cover - compiled
    last = prev[head]
    nxt[last] = x
    prev[x] = last
    nxt[x] = head
    prev[head] = x


@njit(cache=True)
def unlink(prev, nxt, x):  # pragma: no cover - compiled
    a = prev[x]
    b = nxt[x]
    nxt[a] = b
    prev[b] = a


@njit(cache=True)
def oldest_unmarked(nxt, head, start, mark, stamp):  # pragma: no cover - compiled
    """First node from ``start`` (or the oldest, if start < 0) not marked with ``stamp``; head if none."""
    x = nxt[head] if start < 0 else start
    while x != head and mark[x] == stamp:
        x = nxt[x]
    return x


@njit(cache=True)
def take_oldest_unmarked(prev, nxt, head, g, mark, stamp):  # pragma: no cover - compiled
    """Unlink and return the oldest node not marked with ``stamp``. g[0] and g[1] keep a cursor
    for the step (g[1] = its stamp): nodes before it are protected ones already passed, so a
    step's victims cost one walk, not one walk each."""
    start = g[0] if g[1] == stamp else -1
    v = oldest_unmarked(nxt, head, start, mark, stamp)
    g[0] = nxt[v]
    g[1] = stamp
    unlink(prev, nxt, v)
    return v


@njit(cache=True)
def walk(nxt, head, out):  # pragma: no cover - compiled
    """The list's nodes, oldest first, into out; returns their number (at most len(out))."""
    n = 0
    x = nxt[head]
    while x != head and n < out.shape[0]:
        out[n] = x
        n += 1
        x = nxt[x]
    return n
