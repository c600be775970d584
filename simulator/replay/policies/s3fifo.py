"""S3-FIFO (Yang et al., SOSP'23): a small FIFO S (10% of slots) filters one-hit entries, a main
FIFO M keeps the rest with 2-bit counters, and a ghost FIFO G of positions remembers recent
evictions from S so that their return goes straight to M.

Evicting from S: an entry hit more than once moves to M (keeping its slot); otherwise it leaves
and its position joins G. Evicting from M: a counter above zero is decremented and the entry
re-queued; at zero it leaves. Protected (hit this step) entries are passed over. Words: 0 prev,
1 next (heads B: S, B+1: M), 2 queue (1 S, 2 M), 3 counter. Position words: 0 prev, 1 next
(head cmax), 2 in G. g: 0 |S|, 1 |M|, 2 |G|, 4-5 M's scan cursor and its stamp, 6-7 S's.
"""

from __future__ import annotations

from numba import njit

from . import PolicyState, _dlist

STATE = PolicyState(slot_rows=4, position_rows=3, scalars=8)


@njit(cache=True)
def init(sw, pw, g, B, cmax):  # pragma: no cover - compiled
    _dlist.init(sw[0], sw[1], B)
    _dlist.init(sw[0], sw[1], B + 1)
    _dlist.init(pw[0], pw[1], cmax)
    pw[2][:] = 0
    g[0:3] = 0


@njit(cache=True)
def _small_cap(B):  # pragma: no cover - compiled
    return max(1, B // 10)


@njit(cache=True)
def _to_ghost(pw, g, B, cmax, p):  # pragma: no cover - compiled
    if g[2] >= B - _small_cap(B):
        x = pw[1][cmax]
        _dlist.unlink(pw[0], pw[1], x)
        pw[2][x] = 0
        g[2] -= 1
    _dlist.push_tail(pw[0], pw[1], cmax, p)
    pw[2][p] = 1
    g[2] += 1


@njit(cache=True)
def _scan(nxt, head, g, gi, mark, stamp):  # pragma: no cover - compiled
    """Oldest unprotected node of a queue, from the step's cursor (g[gi] node, g[gi+1] stamp):
    the nodes before the cursor are protected ones already passed this step."""
    start = g[gi] if g[gi + 1] == stamp else -1
    x = _dlist.oldest_unmarked(nxt, head, start, mark, stamp)
    g[gi] = x
    g[gi + 1] = stamp
    return x


@njit(cache=True)
def _take(prev, nxt, g, gi, x):  # pragma: no cover - compiled
    """Unlink the node the cursor stands on; the cursor moves to its successor."""
    g[gi] = nxt[x]
    _dlist.unlink(prev, nxt, x)


@njit(cache=True)
def _requeue_m(prev, nxt, g, B, x, stamp):  # pragma: no cover - compiled
    """Append an unprotected node to M; a cursor that ran off M's end stands on it."""
    _dlist.push_tail(prev, nxt, B + 1, x)
    if g[5] == stamp and g[4] == B + 1:
        g[4] = x


@njit(cache=True)
def victim(sw, pw, g, B, cmax, mark, stamp, slot_pos, pos):  # pragma: no cover - compiled
    prev, nxt, q, cnt = sw[0], sw[1], sw[2], sw[3]
    while True:
        s = _scan(nxt, B, g, 6, mark, stamp) if g[0] >= _small_cap(B) else B
        if s != B:
            _take(prev, nxt, g, 6, s)
            g[0] -= 1
            if cnt[s] > 1:
                cnt[s] = 0
                q[s] = 2
                _requeue_m(prev, nxt, g, B, s, stamp)
                g[1] += 1
                continue
            _to_ghost(pw, g, B, cmax, slot_pos[s])
            return s
        m = _scan(nxt, B + 1, g, 4, mark, stamp)
        if m == B + 1:  # M has no unprotected entry: fall back to S whatever its size
            s = _scan(nxt, B, g, 6, mark, stamp)
            _take(prev, nxt, g, 6, s)
            g[0] -= 1
            _to_ghost(pw, g, B, cmax, slot_pos[s])
            return s
        _take(prev, nxt, g, 4, m)
        if cnt[m] > 0:
            cnt[m] -= 1
            _requeue_m(prev, nxt, g, B, m, stamp)
            continue
        g[1] -= 1
        return m


@njit(cache=True)
def insert(sw, pw, g, B, cmax, slot, pos, nu, stamp):  # pragma: no cover - compiled
    sw[3][slot] = 0
    if pw[2][pos]:
        _dlist.unlink(pw[0], pw[1], pos)
        pw[2][pos] = 0
        g[2] -= 1
        sw[2][slot] = 2
        _dlist.push_tail(sw[0], sw[1], B + 1, slot)
        g[1] += 1
    else:
        sw[2][slot] = 1
        _dlist.push_tail(sw[0], sw[1], B, slot)
        g[0] += 1


@njit(cache=True)
def hits(sw, pw, g, B, cmax, mark, stamp, hit_slots, hit_nu, nh):  # pragma: no cover - compiled
    for i in range(nh):
        s = hit_slots[i]
        if sw[3][s] < 3:
            sw[3][s] += 1


@njit(cache=True)
def order(sw, pw, g, B, cmax, out):  # pragma: no cover - compiled
    return 0  # no recency order to report
