"""FIFO: evict the slot loaded longest ago; hits change nothing (hit slots are still protected).

Words: 0 prev, 1 next (list head B: oldest first); g[0] victim cursor, g[1] its stamp.
"""

from __future__ import annotations

from numba import njit

from . import PolicyState, _dlist

STATE = PolicyState(slot_rows=2, position_rows=0, scalars=2)


@njit(cache=True)
def init(sw, pw, g, B, cmax):  # pragma: no cover - compiled
    _dlist.init(sw[0], sw[1], B)
    g[1] = -1


@njit(cache=True)
def victim(sw, pw, g, B, cmax, mark, stamp, slot_pos, pos):  # pragma: no cover - compiled
    return _dlist.take_oldest_unmarked(sw[0], sw[1], B, g, mark, stamp)


@njit(cache=True)
def insert(sw, pw, g, B, cmax, slot, pos, nu, stamp):  # pragma: no cover - compiled
    _dlist.push_tail(sw[0], sw[1], B, slot)


@njit(cache=True)
def hits(sw, pw, g, B, cmax, mark, stamp, hit_slots, hit_nu, nh):  # pragma: no cover - compiled
    pass


@njit(cache=True)
def order(sw, pw, g, B, cmax, out):  # pragma: no cover - compiled
    """Queue order, oldest first."""
    return _dlist.walk(sw[1], B, out)
