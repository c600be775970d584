"""LRU, with HiSparse's batched semantics (the specification the swap-in kernel is checked against).

Batched step: hits are protected; miss i takes the i-th least recently used slot among the slots
not hit; the new recency order is stale slots (old order), then the loaded misses in the step's
stored order, then the hits (old order) as most recent. Sequential: classic LRU, one access at a
time. Words: 0 prev, 1 next (list head B: oldest first); g[0] victim cursor, g[1] its stamp,
g[2] first slot inserted in the current step, g[3] that step's stamp.
"""

from __future__ import annotations

from numba import njit

from . import PolicyState, _dlist

STATE = PolicyState(slot_rows=2, position_rows=0, scalars=4)


@njit(cache=True)
def init(sw, pw, g, B, cmax):  # pragma: no cover - compiled
    _dlist.init(sw[0], sw[1], B)
    g[1] = -1
    g[3] = -1


@njit(cache=True)
def victim(sw, pw, g, B, cmax, mark, stamp, slot_pos, pos):  # pragma: no cover - compiled
    return _dlist.take_oldest_unmarked(sw[0], sw[1], B, g, mark, stamp)


@njit(cache=True)
def insert(sw, pw, g, B, cmax, slot, pos, nu, stamp):  # pragma: no cover - compiled
    if g[3] != stamp:
        g[2] = slot
        g[3] = stamp
    _dlist.push_tail(sw[0], sw[1], B, slot)


@njit(cache=True)
def hits(sw, pw, g, B, cmax, mark, stamp, hit_slots, hit_nu, nh):  # pragma: no cover - compiled
    if nh == 1:
        _dlist.unlink(sw[0], sw[1], hit_slots[0])
        _dlist.push_tail(sw[0], sw[1], B, hit_slots[0])
        return
    # Walk the old part of the list (up to the first slot loaded this step), moving hits, in
    # their old order, to the most recent end.
    stop = g[2] if g[3] == stamp else B
    x = sw[1][B]
    moved = 0
    while x != stop and x != B and moved < nh:
        n = sw[1][x]
        if mark[x] == stamp:
            _dlist.unlink(sw[0], sw[1], x)
            _dlist.push_tail(sw[0], sw[1], B, x)
            moved += 1
        x = n


@njit(cache=True)
def order(sw, pw, g, B, cmax, out):  # pragma: no cover - compiled
    """Recency order, least recent first."""
    return _dlist.walk(sw[1], B, out)
