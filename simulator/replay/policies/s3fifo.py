"""S3-FIFO (Yang et al., SOSP'23): a small FIFO S (10% of slots) filters one-hit entries, a main
FIFO M keeps the rest with 2-bit counters, and a ghost FIFO G of positions remembers recent
evictions from S so that their return goes straight to M.

Evicting from S: an entry hit more than once moves to M (keeping its slot); otherwise it leaves
and its position joins G. Evicting from M: a counter above zero is decremented and the entry
re-queued; at zero it leaves. Protected (hit this step) entries are passed over. Words: 0 prev,
1 next (heads B: S, B+1: M), 2 queue (1 S, 2 M), 3 counter. Position words: 0 prev, 1 next
(head cmax), 2 in G. g: 0 |S|, 1 |M|, 2 |G|.
"""

from __future__ import annotations

from numba import njit

from . import _dlist

NAME = "s3fifo"


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
def victim(sw, pw, g, B, cmax, mark, stamp, slot_pos, pos):  # pragma: no cover - compiled
    prev, nxt, q, cnt = sw[0], sw[1], sw[2], sw[3]
    while True:
        s = _dlist.oldest_unmarked(nxt, B, -1, mark, stamp) if g[0] >= _small_cap(B) else B
        if s != B:
            _dlist.unlink(prev, nxt, s)
            g[0] -= 1
            if cnt[s] > 1:
                cnt[s] = 0
                q[s] = 2
                _dlist.push_tail(prev, nxt, B + 1, s)
                g[1] += 1
                continue
            _to_ghost(pw, g, B, cmax, slot_pos[s])
            return s
        m = _dlist.oldest_unmarked(nxt, B + 1, -1, mark, stamp)
        if m == B + 1:  # M has no unprotected entry: fall back to S whatever its size
            s = _dlist.oldest_unmarked(nxt, B, -1, mark, stamp)
            _dlist.unlink(prev, nxt, s)
            g[0] -= 1
            _to_ghost(pw, g, B, cmax, slot_pos[s])
            return s
        _dlist.unlink(prev, nxt, m)
        if cnt[m] > 0:
            cnt[m] -= 1
            _dlist.push_tail(prev, nxt, B + 1, m)
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
