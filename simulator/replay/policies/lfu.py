"""LFU: evict the least frequently used slot, least recently used first among equals.

A slot's count starts at 1 when loaded and grows with each hit. Words: 0 current key
(count * 2**40 + tick, EMPTY when free), 1-2 heap keys/slots, 3-4 stash; g[0] heap size,
g[1] tick, g[2]-g[3] the heap's stash.
"""

from __future__ import annotations

from numba import njit

from . import PolicyState, _heap

STATE = PolicyState(slot_rows=5, position_rows=0, scalars=4)
_SHIFT = 2**40


@njit(cache=True)
def init(sw, pw, g, B, cmax):  # pragma: no cover - compiled
    sw[0][:] = _heap.EMPTY
    g[0] = 0
    g[1] = 0


@njit(cache=True)
def victim(sw, pw, g, B, cmax, mark, stamp, slot_pos, pos):  # pragma: no cover - compiled
    return _heap.pop_victim(sw, g, 2, mark, stamp)


@njit(cache=True)
def _set(sw, g, B, slot, count):  # pragma: no cover - compiled
    g[1] += 1
    key = count * _SHIFT + g[1]
    sw[0][slot] = key
    _heap.push(sw[1], sw[2], g, 0, sw[0], B, key, slot)


@njit(cache=True)
def insert(sw, pw, g, B, cmax, slot, pos, nu, stamp):  # pragma: no cover - compiled
    _set(sw, g, B, slot, 1)


@njit(cache=True)
def hits(sw, pw, g, B, cmax, mark, stamp, hit_slots, hit_nu, nh):  # pragma: no cover - compiled
    for i in range(nh):
        s = hit_slots[i]
        _set(sw, g, B, s, sw[0][s] // _SHIFT + 1)


@njit(cache=True)
def order(sw, pw, g, B, cmax, out):  # pragma: no cover - compiled
    return 0  # no recency order to report
