"""SIEVE (Zhang et al., NSDI'24): a FIFO queue with a visited bit and a hand that stays put.

The hand walks from the oldest entry towards the newest, clearing visited bits, and evicts the
first unvisited, unprotected entry; it then rests on the next newer entry. New entries join the
newest end unvisited; hits set the bit. Words: 0 prev, 1 next (head B: oldest first), 2 visited;
g[0] hand (-1: start from the oldest).
"""

from __future__ import annotations

from numba import njit

from . import PolicyState, _dlist

STATE = PolicyState(slot_rows=3, position_rows=0, scalars=1)


@njit(cache=True)
def init(sw, pw, g, B, cmax):  # pragma: no cover - compiled
    _dlist.init(sw[0], sw[1], B)
    g[0] = -1


@njit(cache=True)
def victim(sw, pw, g, B, cmax, mark, stamp, slot_pos, pos):  # pragma: no cover - compiled
    nxt = sw[1]
    visited = sw[2]
    x = g[0] if g[0] >= 0 else nxt[B]
    while True:
        if x == B:
            x = nxt[B]
            continue
        if mark[x] == stamp:
            x = nxt[x]
        elif visited[x]:
            visited[x] = 0
            x = nxt[x]
        else:
            n = nxt[x]
            g[0] = n if n != B else -1
            _dlist.unlink(sw[0], nxt, x)
            return x


@njit(cache=True)
def insert(sw, pw, g, B, cmax, slot, pos, nu, stamp):  # pragma: no cover - compiled
    sw[2][slot] = 0
    _dlist.push_tail(sw[0], sw[1], B, slot)


@njit(cache=True)
def hits(sw, pw, g, B, cmax, mark, stamp, hit_slots, hit_nu, nh):  # pragma: no cover - compiled
    for i in range(nh):
        sw[2][hit_slots[i]] = 1


@njit(cache=True)
def order(sw, pw, g, B, cmax, out):  # pragma: no cover - compiled
    return 0  # no recency order to report
