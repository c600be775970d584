"""ARC (Megiddo & Modha, FAST'03): recency list T1 and frequency list T2 with ghost lists B1, B2
that steer the target size p of T1.

Slots hit in the current step are protected: REPLACE takes the oldest unprotected entry of the
list it chooses, and the other list when that one has none. Words: 0 prev, 1 next (heads B: T1,
B+1: T2), 2 list of the slot (1 or 2). Position words: 0 prev, 1 next (heads cmax: B1, cmax+1:
B2), 2 ghost list of the position (0 none, 1, 2). g: 0 p, 1 |T1|, 2 |T2|, 3 |B1|, 4 |B2|.
"""

from __future__ import annotations

from numba import njit

from . import PolicyState, _dlist

STATE = PolicyState(slot_rows=3, position_rows=3, scalars=5)


@njit(cache=True)
def init(sw, pw, g, B, cmax):  # pragma: no cover - compiled
    _dlist.init(sw[0], sw[1], B)
    _dlist.init(sw[0], sw[1], B + 1)
    _dlist.init(pw[0], pw[1], cmax)
    _dlist.init(pw[0], pw[1], cmax + 1)
    pw[2][:] = 0
    g[0:5] = 0


@njit(cache=True)
def _drop_ghost(pw, g, which, cmax):  # pragma: no cover - compiled
    x = pw[1][cmax + which - 1]
    _dlist.unlink(pw[0], pw[1], x)
    pw[2][x] = 0
    g[2 + which] -= 1


@njit(cache=True)
def _evict_from(sw, pw, g, B, cmax, mark, stamp, slot_pos, which, to_ghost):  # pragma: no cover
    """Oldest unprotected slot of T<which> (or of the other list if none); ghost it if asked."""
    v = _dlist.oldest_unmarked(sw[1], B + which - 1, -1, mark, stamp)
    if v == B + which - 1:
        which = 3 - which
        v = _dlist.oldest_unmarked(sw[1], B + which - 1, -1, mark, stamp)
    _dlist.unlink(sw[0], sw[1], v)
    g[which] -= 1
    if to_ghost:
        p = slot_pos[v]
        _dlist.push_tail(pw[0], pw[1], cmax + which - 1, p)
        pw[2][p] = which
        g[2 + which] += 1
    return v


@njit(cache=True)
def victim(sw, pw, g, B, cmax, mark, stamp, slot_pos, pos):  # pragma: no cover - compiled
    ghost = pw[2][pos]
    c = B
    if ghost == 1:
        g[0] = min(c, g[0] + max(g[4] // max(g[3], 1), 1))
    elif ghost == 2:
        g[0] = max(0, g[0] - max(g[3] // max(g[4], 1), 1))
    else:
        if g[1] + g[3] == c:
            if g[1] < c:
                _drop_ghost(pw, g, 1, cmax)
            else:
                return _evict_from(sw, pw, g, B, cmax, mark, stamp, slot_pos, 1, False)
        elif g[1] + g[2] + g[3] + g[4] >= 2 * c:
            _drop_ghost(pw, g, 2, cmax)
    t1 = g[1]
    if t1 >= 1 and (t1 > g[0] or (ghost == 2 and t1 == g[0])):
        return _evict_from(sw, pw, g, B, cmax, mark, stamp, slot_pos, 1, True)
    return _evict_from(sw, pw, g, B, cmax, mark, stamp, slot_pos, 2, True)


@njit(cache=True)
def insert(sw, pw, g, B, cmax, slot, pos, nu, stamp):  # pragma: no cover - compiled
    ghost = pw[2][pos]
    if ghost:
        _dlist.unlink(pw[0], pw[1], pos)
        pw[2][pos] = 0
        g[2 + ghost] -= 1
        which = 2
    else:
        which = 1
    _dlist.push_tail(sw[0], sw[1], B + which - 1, slot)
    sw[2][slot] = which
    g[which] += 1


@njit(cache=True)
def hits(sw, pw, g, B, cmax, mark, stamp, hit_slots, hit_nu, nh):  # pragma: no cover - compiled
    for i in range(nh):
        s = hit_slots[i]
        _dlist.unlink(sw[0], sw[1], s)
        if sw[2][s] == 1:
            g[1] -= 1
            g[2] += 1
            sw[2][s] = 2
        _dlist.push_tail(sw[0], sw[1], B + 1, s)


@njit(cache=True)
def order(sw, pw, g, B, cmax, out):  # pragma: no cover - compiled
    return 0  # no recency order to report
