"""RANDOM: evict a uniformly random unprotected slot (seeded: same seed, same misses)."""

from __future__ import annotations

import numpy as np
from numba import njit

from . import PolicyState

STATE = PolicyState(slot_rows=0, position_rows=0, scalars=0)


@njit(cache=True)
def init(sw, pw, g, B, cmax):  # pragma: no cover - compiled
    pass


@njit(cache=True)
def victim(sw, pw, g, B, cmax, mark, stamp, slot_pos, pos):  # pragma: no cover - compiled
    while True:
        s = np.random.randint(0, B)
        if mark[s] != stamp:
            return s


@njit(cache=True)
def insert(sw, pw, g, B, cmax, slot, pos, nu, stamp):  # pragma: no cover - compiled
    pass


@njit(cache=True)
def hits(sw, pw, g, B, cmax, mark, stamp, hit_slots, hit_nu, nh):  # pragma: no cover - compiled
    pass


@njit(cache=True)
def order(sw, pw, g, B, cmax, out):  # pragma: no cover - compiled
    return 0  # no recency order to report
