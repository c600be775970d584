"""OPT (Belady): evict the slot whose entry is used farthest in the future; the lower bound.

Next uses are access numbers (vtime) over the whole stream, so ties only happen between entries
never used again. Words: 0 current key (-next use; EMPTY when free), 1-2 heap, 3-4 stash;
g[0] heap size, g[1]-g[2] the heap's stash.
"""

from __future__ import annotations

from numba import njit

from . import PolicyState, _heap

STATE = PolicyState(slot_rows=5, position_rows=0, scalars=3, next_use=True)


@njit(cache=True)
def init(sw, pw, g, B, cmax):  # pragma: no cover - compiled
    sw[0][:] = _heap.EMPTY
    g[0] = 0


@njit(cache=True)
def victim(sw, pw, g, B, cmax, mark, stamp, slot_pos, pos):  # pragma: no cover - compiled
    return _heap.pop_victim(sw, g, 1, mark, stamp)


@njit(cache=True)
def insert(sw, pw, g, B, cmax, slot, pos, nu, stamp):  # pragma: no cover - compiled
    sw[0][slot] = -nu
    _heap.push(sw[1], sw[2], g, 0, sw[0], B, -nu, slot)


@njit(cache=True)
def hits(sw, pw, g, B, cmax, mark, stamp, hit_slots, hit_nu, nh):  # pragma: no cover - compiled
    for i in range(nh):
        s = hit_slots[i]
        sw[0][s] = -hit_nu[i]
        _heap.push(sw[1], sw[2], g, 0, sw[0], B, -hit_nu[i], s)


@njit(cache=True)
def order(sw, pw, g, B, cmax, out):  # pragma: no cover - compiled
    return 0  # no recency order to report
