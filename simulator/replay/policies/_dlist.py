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
