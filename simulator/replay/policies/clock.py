"""CLOCK: a hand sweeps the slots; a set reference bit buys one more sweep, then eviction.

Hits set the bit; loaded entries start with it clear. Slots hit in the current step are
protected: the hand passes them without touching their bit. Words: 0 reference bit; g[0] hand.
"""

from __future__ import annotations

from numba import njit

from . import PolicyState

STATE = PolicyState(slot_rows=1, position_rows=0, scalars=1)


@njit(cache=True)
def init(sw, pw, g, B, cmax):  # pragma: no cover - compiled
    g[0] = 0


@njit(cache=True)
def victim(sw, pw, g, B, cmax, mark, stamp, slot_pos, pos):  # pragma: no cover - compiled
    ref = sw[0]
    while True:
        s = g[0]
        g[0] = s + 1 if s + 1 < B else 0
        if mark[s] == stamp:
            continue
        if ref[s]:
            ref[s] = 0
            continue
        return s


@njit(cache=True)
def insert(sw, pw, g, B, cmax, slot, pos, nu, stamp):  # pragma: no cover - compiled
    sw[0][slot] = 0


@njit(cache=True)
def hits(sw, pw, g, B, cmax, mark, stamp, hit_slots, hit_nu, nh):  # pragma: no cover - compiled
    for i in range(nh):
        sw[0][hit_slots[i]] = 1


@njit(cache=True)
def order(sw, pw, g, B, cmax, out):  # pragma: no cover - compiled
    return 0  # no recency order to report
