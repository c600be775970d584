"""The compiled loops of the stream codec (numba): the reference implementations.

``codec.py`` calls these, or the equivalent C functions of ``simulator.native`` when those are
built (checked bit for bit against these in tests/test_native.py).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .problems import DecodeProblem, RowProblem

# The codes as plain ints: numba freezes them into the compiled code.
_NEGATIVE = RowProblem.NEGATIVE.value
_OUT_OF_RANGE = RowProblem.OUT_OF_RANGE.value
_REPEATED = RowProblem.REPEATED.value
_TOO_MANY = RowProblem.TOO_MANY.value
_CTX_DOWN = RowProblem.CTX_DOWN.value
_CTX_NOT_POSITIVE = RowProblem.CTX_NOT_POSITIVE.value
_PAD_BEFORE_ENTRY = RowProblem.PAD_BEFORE_ENTRY.value
_ENDS_EARLY = DecodeProblem.ENDS_EARLY.value
_INCONSISTENT = DecodeProblem.INCONSISTENT.value
_TRAILING_BYTES = DecodeProblem.TRAILING_BYTES.value


@njit(cache=True)
def check_rows(indices, ctx_len, k):  # pragma: no cover - compiled
    """First problem in a stream as (code, step, value, extra), or code 0 (codes: problems.RowProblem)."""
    steps, width = indices.shape
    # seen[] is indexed by positions that passed v < ctx_len: size it by the largest position
    # (at most the largest ctx_len), not by ctx_len: a 12-entry stream at ctx_len 5e9 asked for 40 GB
    cmax = 1
    for t in range(steps):
        if ctx_len[t] > cmax:
            cmax = ctx_len[t]
    vmax = 0
    for t in range(steps):
        for j in range(width):
            if indices[t, j] + 1 > vmax:
                vmax = indices[t, j] + 1
    seen = np.zeros(min(cmax, vmax) if vmax > 0 else 1, dtype=np.int64)
    for t in range(steps):
        c = ctx_len[t]
        if c < 1:
            return _CTX_NOT_POSITIVE, t, c, 0
        if t > 0 and c < ctx_len[t - 1]:
            return _CTX_DOWN, t, c, ctx_len[t - 1]
        n = 0
        padded = False
        for j in range(width):
            v = indices[t, j]
            if v == -1:
                padded = True
                continue
            if v < 0:
                return _NEGATIVE, t, v, 0
            if padded:
                return _PAD_BEFORE_ENTRY, t, v, 0
            if v >= c:
                return _OUT_OF_RANGE, t, v, c
            if seen[v] == t + 1:
                return _REPEATED, t, v, 0
            seen[v] = t + 1
            n += 1
        if n > k:
            return _TOO_MANY, t, n, k
    return 0, 0, 0, 0


@njit(cache=True)
def _put(buf, pos, value, write):  # pragma: no cover - compiled
    """Append a LEB128 varint; return the new position (only counts when not writing)."""
    v = value
    while True:
        byte = v & 0x7F
        v >>= 7
        if v:
            if write:
                buf[pos] = byte | 0x80
            pos += 1
        else:
            if write:
                buf[pos] = byte
            return pos + 1


@njit(cache=True)
def encode(sorted_rows, ranks, counts, ctx_len, ordered, buf, write):  # pragma: no cover
    """Code a stream of sorted rows; return bytes used. Run once to size buf, once to fill it."""
    steps = sorted_rows.shape[0]
    pos = 0
    prev_n = 0
    prev = np.empty(sorted_rows.shape[1], dtype=np.int64)
    prev_ctx = 0
    for t in range(steps):
        n = counts[t]
        d = ctx_len[t] - prev_ctx
        pos = _put(buf, pos, (d << 1) ^ (d >> 63), write)
        prev_ctx = ctx_len[t]
        # Merge-walk prev and cur (both ascending): count leavers and arrivals.
        i = 0
        j = 0
        n_rem = 0
        n_add = 0
        while i < prev_n or j < n:
            if j >= n or (i < prev_n and prev[i] < sorted_rows[t, j]):
                n_rem += 1
                i += 1
            elif i >= prev_n or sorted_rows[t, j] < prev[i]:
                n_add += 1
                j += 1
            else:
                i += 1
                j += 1
        pos = _put(buf, pos, n_rem, write)
        pos = _put(buf, pos, n_add, write)
        # Leavers as gaps between their ranks in prev.
        i = 0
        j = 0
        last = -1
        while i < prev_n:
            if j >= n or prev[i] < sorted_rows[t, j]:
                pos = _put(buf, pos, i - last - 1, write)
                last = i
                i += 1
            elif sorted_rows[t, j] < prev[i]:
                j += 1
            else:
                i += 1
                j += 1
        # Arrivals as gaps between their positions.
        i = 0
        last = -1
        for j in range(n):
            v = sorted_rows[t, j]
            while i < prev_n and prev[i] < v:
                i += 1
            if i < prev_n and prev[i] == v:
                continue
            pos = _put(buf, pos, v - last - 1, write)
            last = v
        if ordered:
            for j in range(n):
                pos = _put(buf, pos, ranks[t, j], write)
        for j in range(n):
            prev[j] = sorted_rows[t, j]
        prev_n = n
    return pos


@njit(cache=True)
def _get(buf, pos):  # pragma: no cover - compiled
    """Read a LEB128 varint at pos: (value, new pos), pos -1 when the bytes run out."""
    value = 0
    shift = 0
    n = buf.shape[0]
    while True:
        if pos >= n or shift > 56:
            return 0, -1
        byte = buf[pos]
        pos += 1
        value |= np.int64(byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


@njit(cache=True)
def decode(buf, steps, width, ordered, out, ctx_out):  # pragma: no cover - compiled
    """Fill out [steps, width] and ctx_out; return (0, 0) or (problems.DecodeProblem code, step)."""
    pos = 0
    prev = np.empty(width, dtype=np.int64)
    cur = np.empty(width, dtype=np.int64)
    rem = np.empty(width, dtype=np.int64)
    add = np.empty(width, dtype=np.int64)
    prev_n = 0
    prev_ctx = 0
    for t in range(steps):
        z, pos = _get(buf, pos)
        if pos < 0:
            return _ENDS_EARLY, t
        prev_ctx += (z >> 1) ^ -(z & 1)
        ctx_out[t] = prev_ctx
        n_rem, pos = _get(buf, pos)
        if pos < 0:
            return _ENDS_EARLY, t
        n_add, pos = _get(buf, pos)
        if pos < 0:
            return _ENDS_EARLY, t
        if n_rem > prev_n or n_add > width:
            return _INCONSISTENT, t
        last = -1
        for r in range(n_rem):
            g, pos = _get(buf, pos)
            if pos < 0:
                return _ENDS_EARLY, t
            last += g + 1
            if last >= prev_n:
                return _INCONSISTENT, t
            rem[r] = last
        last = -1
        for a in range(n_add):
            g, pos = _get(buf, pos)
            if pos < 0:
                return _ENDS_EARLY, t
            last += g + 1
            add[a] = last
        n = prev_n - n_rem + n_add
        if n > width:
            return _INCONSISTENT, t
        # cur = merge(prev without the leavers, arrivals), ascending, no duplicates.
        i = 0
        r = 0
        a = 0
        m = 0
        while i < prev_n or a < n_add:
            if i < prev_n and r < n_rem and rem[r] == i:
                r += 1
                i += 1
                continue
            if a >= n_add or (i < prev_n and prev[i] < add[a]):
                v = prev[i]
                i += 1
            elif i >= prev_n or add[a] < prev[i]:
                v = add[a]
                a += 1
            else:
                return _INCONSISTENT, t
            cur[m] = v
            m += 1
        if ordered:
            for j in range(n):
                rk, pos = _get(buf, pos)
                if pos < 0:
                    return _ENDS_EARLY, t
                if rk >= n:
                    return _INCONSISTENT, t
                out[t, j] = cur[rk]
        else:
            for j in range(n):
                out[t, j] = cur[j]
        for j in range(n, out.shape[1]):
            out[t, j] = -1
        for j in range(n):
            prev[j] = cur[j]
        prev_n = n
    if pos != buf.shape[0]:
        return _TRAILING_BYTES, steps
    return 0, 0


# -- Coding 3 (format version 3) ---------------------------------------------------------------
# A step's leavers are named by their place in the decoder's slot array (the previous step's
# entries in an order of the coding's own, not sorted), as a bitmap or as gaps, whichever is
# shorter; arrivals are position gaps as in coding 2 and fill the leavers' places. Replaying the
# changes needs no sorted row (coding 2's leaver ranks index one, which costs a merge a step).

_BREAKS_RULE = DecodeProblem.BREAKS_RULE.value
_POS_LIMIT = 2**31 - 1  # positions are int32


@njit(cache=True)
def _varint_len(v):  # pragma: no cover - compiled
    n = 1
    while v >= 0x80:
        v >>= 7
        n += 1
    return n


@njit(cache=True)
def slots_apply(slots, n_prev, leave, n_leave, arrive, n_arrive, slot_of):  # pragma: no cover - compiled
    """The slot array after a step, the one rule the writer and every reader share: arrivals
    (ascending) take the leavers' places (ascending), extra arrivals go at the end, and places
    left over below the new count take the entries at or past it, in order. ``slot_of[p]`` is
    kept as each position's place (-1: not held). Returns the new count."""
    for i in range(n_leave):
        slot_of[slots[leave[i]]] = -1
    m = min(n_leave, n_arrive)
    for i in range(m):
        slots[leave[i]] = arrive[i]
        slot_of[arrive[i]] = leave[i]
    n = n_prev - n_leave + n_arrive
    if n_arrive > n_leave:
        for j in range(n_arrive - n_leave):
            slots[n_prev + j] = arrive[n_leave + j]
            slot_of[arrive[n_leave + j]] = n_prev + j
    elif n_leave > n_arrive:
        q = n_arrive
        while q < n_leave and leave[q] < n:
            q += 1
        j = n
        r = q  # leave[r:] are the places at or past n: skipped, they vanish
        for i in range(n_arrive, q):
            while r < n_leave and leave[r] == j:
                r += 1
                j += 1
            slots[leave[i]] = slots[j]
            slot_of[slots[j]] = leave[i]
            j += 1
    return n


@njit(cache=True)
def encode3(sorted_rows, ranks, counts, ctx_len, ordered, buf, write):  # pragma: no cover - compiled
    """Coding 3 of a stream of sorted rows (``ranks``: each stored entry's rank in its sorted
    row, when ``ordered``); returns the bytes used. Run once to size buf, once to fill it."""
    steps, width = sorted_rows.shape
    # the tables are indexed by positions: size them by the largest one (the last of a sorted
    # row), not by ctx_len (a 3-step stream at ctx_len 1e8 took 1.7 GB and 9 s)
    cmax = 1
    for t in range(steps):
        if counts[t] > 0 and sorted_rows[t, counts[t] - 1] + 1 > cmax:
            cmax = sorted_rows[t, counts[t] - 1] + 1
    slot_of = np.full(cmax, -1, dtype=np.int64)
    seen = np.zeros(cmax, dtype=np.int64)  # seen[p] == t + 1: p is in step t's row
    slots = np.empty(max(width, 1), dtype=np.int64)
    leave = np.empty(max(width, 1), dtype=np.int64)
    arrive = np.empty(max(width, 1), dtype=np.int64)
    pos = 0
    n_prev = 0
    prev_ctx = 0
    for t in range(steps):
        n = counts[t]
        d = ctx_len[t] - prev_ctx
        pos = _put(buf, pos, (d << 1) ^ (d >> 63), write)
        prev_ctx = ctx_len[t]
        for j in range(n):
            seen[sorted_rows[t, j]] = t + 1
        n_leave = 0
        gap_bytes = 0
        last = -1
        for i in range(n_prev):
            if seen[slots[i]] != t + 1:
                leave[n_leave] = i
                n_leave += 1
                gap_bytes += _varint_len(i - last - 1)
                last = i
        n_arrive = 0
        for j in range(n):
            p = sorted_rows[t, j]
            if slot_of[p] < 0:
                arrive[n_arrive] = p
                n_arrive += 1
        bitmap_bytes = (n_prev + 7) >> 3
        bitmap = n_leave > 0 and bitmap_bytes < gap_bytes
        pos = _put(buf, pos, 2 * n_leave + (1 if bitmap else 0), write)
        pos = _put(buf, pos, n_arrive, write)
        if bitmap:
            if write:
                for b in range(bitmap_bytes):
                    buf[pos + b] = 0
                for i in range(n_leave):
                    buf[pos + (leave[i] >> 3)] |= 1 << (leave[i] & 7)
            pos += bitmap_bytes
        else:
            last = -1
            for i in range(n_leave):
                pos = _put(buf, pos, leave[i] - last - 1, write)
                last = leave[i]
        last = -1
        for a in range(n_arrive):
            pos = _put(buf, pos, arrive[a] - last - 1, write)
            last = arrive[a]
        n_prev = slots_apply(slots, n_prev, leave, n_leave, arrive, n_arrive, slot_of)
        if ordered:
            for j in range(n):
                pos = _put(buf, pos, slot_of[sorted_rows[t, ranks[t, j]]], write)
    return pos


@njit(cache=True)
def decode3(buf, steps, width, ordered, out, ctx_out):  # pragma: no cover - compiled
    """Coding 3: fill out [steps, width] (unordered rows sorted ascending) and ctx_out; return
    (0, 0) or (problems.DecodeProblem code, step). Beyond coding 2's checks, an arrival must lie
    below its step's ctx_len and below 2**31 (BREAKS_RULE: positions index a membership table)
    and must not be held already, a leaver included (INCONSISTENT)."""
    w = max(width, 1)
    slots = np.empty(w, dtype=np.int64)
    leave = np.empty(w, dtype=np.int64)
    arrive = np.empty(w, dtype=np.int64)
    slot_of = np.full(64, -1, dtype=np.int64)  # grown with the largest arrival
    pos = 0
    n_prev = 0
    ctx = 0
    n_buf = buf.shape[0]
    for t in range(steps):
        z, pos = _get(buf, pos)
        if pos < 0:
            return _ENDS_EARLY, t
        ctx += (z >> 1) ^ -(z & 1)
        ctx_out[t] = ctx
        h, pos = _get(buf, pos)
        if pos < 0:
            return _ENDS_EARLY, t
        n_add, pos = _get(buf, pos)
        if pos < 0:
            return _ENDS_EARLY, t
        n_rem = h >> 1
        if n_rem > n_prev or n_add > width or n_prev - n_rem + n_add > width:
            return _INCONSISTENT, t
        if h & 1:
            nbytes = (n_prev + 7) >> 3
            if pos + nbytes > n_buf:
                return _ENDS_EARLY, t
            got = 0
            for b in range(nbytes):
                byte = buf[pos + b]
                for bit in range(8):
                    if byte & (1 << bit):
                        i = 8 * b + bit
                        if i >= n_prev or got >= n_rem:
                            return _INCONSISTENT, t
                        leave[got] = i
                        got += 1
            if got != n_rem:
                return _INCONSISTENT, t
            pos += nbytes
        else:
            last = -1
            for r in range(n_rem):
                g, pos = _get(buf, pos)
                if pos < 0:
                    return _ENDS_EARLY, t
                if g >= n_prev:
                    return _INCONSISTENT, t
                last += g + 1
                if last >= n_prev:
                    return _INCONSISTENT, t
                leave[r] = last
        last = -1
        for a in range(n_add):
            g, pos = _get(buf, pos)
            if pos < 0:
                return _ENDS_EARLY, t
            if g >= _POS_LIMIT:
                return _BREAKS_RULE, t
            last += g + 1
            if last >= ctx or last >= _POS_LIMIT:
                return _BREAKS_RULE, t
            if last >= slot_of.shape[0]:
                grown = np.full(max(2 * slot_of.shape[0], last + 1), -1, dtype=np.int64)
                grown[:slot_of.shape[0]] = slot_of
                slot_of = grown
            if slot_of[last] >= 0:
                return _INCONSISTENT, t
            arrive[a] = last
        n = slots_apply(slots, n_prev, leave, n_rem, arrive, n_add, slot_of)
        n_prev = n
        if ordered:
            for j in range(n):
                rk, pos = _get(buf, pos)
                if pos < 0:
                    return _ENDS_EARLY, t
                if rk >= n:
                    return _INCONSISTENT, t
                out[t, j] = slots[rk]
        else:
            row = np.sort(slots[:n])
            for j in range(n):
                out[t, j] = row[j]
        for j in range(n, out.shape[1]):
            out[t, j] = -1
    if pos != n_buf:
        return _TRAILING_BYTES, steps
    return 0, 0
