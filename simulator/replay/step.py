"""The step loop every policy shares: exact per-step misses of one stream (the replay engine's semantics).

Step structure (shared by every policy; BRIEF section 1):
- While ``ctx_len <= buffer`` nothing misses (HiSparse's fast path: the buffer holds the whole
  context). Leaving it, the buffer holds positions [0, buffer), oldest first by position: SGLang's
  swap-in kernel returns before touching ``lru_slots`` when ``seq_len <= HOT_BUFFER_SIZE`` (its
  kernel test: "should skip host loads and LRU mutations"), and ``lru_slots`` starts as
  ``arange(device_buffer_size)``, front least recently used. Reads on the fast path leave no
  recency, so a larger buffer, which stays on the fast path longer, can miss more: LRU's
  inclusion property does not hold across buffer sizes (tests/test_replay_lru.py pins a case).
- The newest token (``ctx_len - 1``) sits in a reserved slot: never a miss, never in the buffer
  (``reserve_newest=False`` treats it as an ordinary access).
- Initial buffer: ``prefix`` (colocated: the first positions of the prompt) or ``empty``
  (disaggregated decode). Free slots are taken first, in slot order.
- ``batched`` (HiSparse): a step's entries are looked up at once; hits are protected; miss i
  takes the policy's i-th victim in stored order; hits are then reported to the policy.
  ``sequential``: the step's entries one at a time, in stored order (classic cache simulation).
"""

from __future__ import annotations

import numpy as np
from numba import literally, njit

from .policies import dispatch

INF = 2**61


@njit(cache=True, inline="always")
def _load(pid, sw, pw, g, B, cmax, mark, stamp, slot_pos, pos_slot, free_next, p, nu):  # pragma: no cover
    """Load missed position p: a free slot while any is left (in slot order), else the policy's
    victim; the slot is protected for the rest of the step. Returns the next free slot."""
    if free_next < B:
        v = free_next
        free_next += 1
    else:
        v = dispatch.victim(pid, sw, pw, g, B, cmax, mark, stamp, slot_pos, p)
        pos_slot[slot_pos[v]] = -1
    slot_pos[v] = p
    pos_slot[p] = v
    mark[v] = stamp
    dispatch.insert(pid, sw, pw, g, B, cmax, v, p, nu, stamp)
    return free_next


@njit(cache=True)
def _walk_back(indices, t0, cmax, out, fill):  # pragma: no cover - compiled
    """Walk the accesses from the last back to step t0 (access numbers = vtime). With ``fill``,
    out[t, j] = the next access number of the same position (INF if none). Returns each
    position's first access number at or after step t0 (INF if none)."""
    steps, width = indices.shape
    last = np.full(cmax, INF, dtype=np.int64)
    vt = 0
    for t in range(steps):
        for j in range(width):
            if indices[t, j] >= 0:
                vt += 1
    for t in range(steps - 1, t0 - 1, -1):
        n = 0
        for j in range(width):
            if indices[t, j] >= 0:
                n += 1
        for j in range(n - 1, -1, -1):
            vt -= 1
            p = indices[t, j]
            if fill:
                out[t, j] = last[p]
            last[p] = vt
    return last


@njit(cache=True)
def next_uses(indices, cmax):  # pragma: no cover - compiled
    """Next access number (vtime) of the same position for every entry; INF if none."""
    out = np.full(indices.shape, INF, dtype=np.int64)
    _walk_back(indices, 0, cmax, out, True)
    return out


@njit(cache=True)
def _first_uses(indices, t0, cmax):  # pragma: no cover - compiled
    """First access number at or after step t0 of every position (INF if none)."""
    return _walk_back(indices, t0, cmax, np.empty((1, 1), dtype=np.int64), False)


@njit(cache=True, nogil=True)
def _state(ctx_len, steps, B, n_sw, n_pw, n_g):  # pragma: no cover - compiled
    """What both step loops start from: the largest context, the policy's slot rows, position
    rows and scalars, the slot <-> position maps (empty) and the per-slot stamps."""
    cmax = 1
    for t in range(steps):
        cmax = max(cmax, ctx_len[t])
    sw = np.zeros((n_sw, 8 * (B + 4)), dtype=np.int64)
    pw = np.zeros((n_pw, cmax + 4), dtype=np.int64)
    g = np.zeros(n_g, dtype=np.int64)
    return (cmax, sw, pw, g, np.full(B, -1, dtype=np.int64), np.full(cmax, -1, dtype=np.int64),
            np.zeros(B, dtype=np.int64))


@njit(cache=True, nogil=True)
def run(pid, indices, ctx_len, B, reserve, prefix, batched, seed, nu_all, want_nu, misses_out, record, slots_out,
        n_sw, n_pw, n_g):  # pragma: no cover - compiled
    """Replay one stream through policy ``pid`` (a constant: see entries.py); the policy's state
    is n_sw slot rows, n_pw position rows and n_g scalars. Returns (slot_pos, order)."""
    literally(pid)
    steps, width = indices.shape
    cmax, sw, pw, g, slot_pos, pos_slot, mark = _state(ctx_len, steps, B, n_sw, n_pw, n_g)
    hit_slots = np.empty(width, dtype=np.int64)
    hit_nu = np.empty(width, dtype=np.int64)
    one_slot = np.empty(1, dtype=np.int64)
    one_nu = np.empty(1, dtype=np.int64)
    np.random.seed(seed)
    stamp = 0
    free_next = 0
    fast = False  # the previous step took the fast path
    started = False
    for t in range(steps):
        ctx = ctx_len[t]
        if ctx <= B:
            misses_out[t] = 0
            fast = True
            if record:  # the buffer holds the whole context, position p in slot p
                for j in range(width):
                    p = indices[t, j]
                    slots_out[t, j] = -1 if p < 0 else (B if reserve and p == ctx - 1 else p)
            continue
        if not started or fast:
            # Fresh state: empty, or the first positions (prefix initial buffer / leaving the
            # fast path, when the buffer held the whole context).
            sw[:] = 0
            pw[:] = 0
            g[:] = 0
            slot_pos[:] = -1
            pos_slot[:] = -1
            dispatch.init(pid, sw, pw, g, B, cmax)
            free_next = 0
            if prefix or fast:
                n_pre = B  # ctx > B here, so the prompt fills every slot
                first = _first_uses(indices, t, cmax) if want_nu else np.zeros(0, dtype=np.int64)
                stamp += 1
                for p in range(n_pre):
                    slot_pos[p] = p
                    pos_slot[p] = p
                    dispatch.insert(pid, sw, pw, g, B, cmax, p, p, first[p] if want_nu else INF, stamp)
                free_next = n_pre
            started = True
            fast = False
        newest = ctx - 1
        n_miss = 0
        if batched:
            stamp += 1
            nh = 0
            for j in range(width):
                p = indices[t, j]
                if p < 0:
                    break
                if reserve and p == newest:
                    continue
                s = pos_slot[p]
                if s >= 0:
                    mark[s] = stamp
                    hit_slots[nh] = s
                    hit_nu[nh] = nu_all[t, j] if want_nu else INF
                    nh += 1
            for j in range(width):
                p = indices[t, j]
                if p < 0:
                    break
                if (reserve and p == newest) or pos_slot[p] >= 0:
                    continue
                free_next = _load(pid, sw, pw, g, B, cmax, mark, stamp, slot_pos, pos_slot, free_next, p,
                                  nu_all[t, j] if want_nu else INF)
                n_miss += 1
            if nh:
                dispatch.hits(pid, sw, pw, g, B, cmax, mark, stamp, hit_slots, hit_nu, nh)
        else:
            for j in range(width):
                p = indices[t, j]
                if p < 0:
                    break
                if reserve and p == newest:
                    continue
                stamp += 1
                nu = nu_all[t, j] if want_nu else INF
                s = pos_slot[p]
                if s >= 0:
                    mark[s] = stamp
                    one_slot[0] = s
                    one_nu[0] = nu
                    dispatch.hits(pid, sw, pw, g, B, cmax, mark, stamp, one_slot, one_nu, 1)
                    continue
                free_next = _load(pid, sw, pw, g, B, cmax, mark, stamp, slot_pos, pos_slot, free_next, p, nu)
                n_miss += 1
        misses_out[t] = n_miss
        if record:  # where attention reads each entry: its slot, B for the reserved newest slot
            for j in range(width):
                p = indices[t, j]
                slots_out[t, j] = -1 if p < 0 else (B if reserve and p == newest else pos_slot[p])
    # The policy's recency (or queue) order of the slots, oldest first (empty if it has none).
    order = np.empty(B if started else 0, dtype=np.int64)
    n = dispatch.order(pid, sw, pw, g, B, cmax, order) if started else 0
    return slot_pos, order[:n]


# The scalars run_placed writes for a placed policy before calling its hooks (its own start at 5).
G_MISSES, G_HITS, G_ORDINAL, G_FLAGS, G_PARAM = 0, 1, 2, 3, 4
FLAG_LAST = 1  # the miss being placed occurs in the commit's last step
FLAG_FILL = 2  # initial fill: position ``pos`` of the prompt is being placed in an empty buffer


@njit(cache=True)
def _commit(pid, sw, pw, g, B, cmax, mark, stamp, slot_pos, pos_slot, occ_p, occ_t, occ_last, n_occ, last_mark, seen,
            seen_last, hit_slots, flags, miss_pos, miss_step, misses_out):  # pragma: no cover - compiled
    """One commit of a placed policy: its n_occ occurrences (position, step, in the last step)
    looked up at once, then the policy's hooks (run_placed's docstring)."""
    nh = 0
    nm = 0
    for o in range(n_occ):
        p = occ_p[o]
        last = occ_last[o]
        s = pos_slot[p]
        if s >= 0:
            if mark[s] != stamp:
                mark[s] = stamp
                hit_slots[nh] = s
                nh += 1
            if last:
                last_mark[s] = stamp
        elif seen[p] != stamp:
            seen[p] = stamp
            miss_pos[nm] = p
            miss_step[nm] = occ_t[o]
            nm += 1
            if last:
                seen_last[p] = stamp
        elif last:
            seen_last[p] = stamp
    for i in range(nh):
        flags[i] = 1 if last_mark[hit_slots[i]] == stamp else 0
    for i in range(nm):
        flags[nh + i] = 1 if seen_last[miss_pos[i]] == stamp else 0
    g[G_MISSES] = nm
    g[G_HITS] = nh
    dispatch.hits(pid, sw, pw, g, B, cmax, mark, stamp, hit_slots, flags, nh)
    for i in range(nm):
        p = miss_pos[i]
        misses_out[miss_step[i]] += 1
        g[G_ORDINAL] = i
        g[G_FLAGS] = flags[nh + i]
        v = dispatch.victim(pid, sw, pw, g, B, cmax, mark, stamp, slot_pos, p)
        if v < 0:
            continue  # served, not cached
        if slot_pos[v] >= 0:
            pos_slot[slot_pos[v]] = -1
        slot_pos[v] = p
        pos_slot[p] = v
        mark[v] = stamp
        dispatch.insert(pid, sw, pw, g, B, cmax, v, p, INF, stamp)


@njit(cache=True, nogil=True)
def run_placed(pid, indices, ctx_len, B, reserve, prefix, batched, seed, nu_all, want_nu, misses_out, record,
               slots_out, n_sw, n_pw, n_g, group, param):  # pragma: no cover - compiled
    """The step loop of a policy that places every load itself (registered with ``placed=True``):
    SGLang's sharded LRU (a load may only go to its shard) and multi-step CLOCK commit.

    What differs from ``run`` (``seed`` is unused):
    - A *commit* is ``group`` consecutive steps (1: every step; >1 models MTP, the steps'
      [group, k] positions flattened into one swap call); sequential semantics make every access
      its own commit (``group`` must be 1). A commit's entries are looked up at once, each
      resident slot counted once (``nh``), each non-resident position once (``nm``, numbered in
      order of first occurrence: the miss ordinal). A miss is counted at its first step.
    - Reserved newest: positions from ``ctx_len[t0] - 1`` (t0 the commit's first step) on, i.e.
      every step's newest token (MTP: the draft tokens, in SGLang's extra page).
    - The fast path is per commit: its last step's context fits the buffer.
    - Hooks, in this order, once per commit: ``hits`` (even with nh == 0) with g[0] = nm,
      g[1] = nh, hit_nu[i] = 1 if hit slot i is read in the commit's last step (else 0) for
      i < nh, and hit_nu[nh + i] the same for miss i; then, miss by miss in ordinal order,
      ``victim`` with g[2] = the ordinal and g[3] = FLAG_LAST if the miss is read in the last
      step, and ``insert`` when the victim is a slot. ``victim`` may return any slot, free or
      held (its position leaves), hit in this commit or not, or -1: the miss is served (and
      counted) but not cached.
    - Free slots are the policy's: ``victim`` is asked for every load. The initial prefix buffer
      is the policy's too: positions 0..B-1 are offered in order, each with g[3] = FLAG_FILL and
      its own stamp, and placed where ``victim`` says (-1: not kept).
    - g[4] = ``param`` (the policy's parameter, e.g. ways per shard) from init on.
    """
    literally(pid)
    steps, width = indices.shape
    if not batched:
        group = 1
    cmax, sw, pw, g, slot_pos, pos_slot, mark = _state(ctx_len, steps, B, n_sw, n_pw, n_g)
    last_mark = np.zeros(B, dtype=np.int64)  # stamp of the commit whose last step read the slot
    seen = np.zeros(cmax, dtype=np.int64)  # stamp of the commit that counted the position as a miss
    seen_last = np.zeros(cmax, dtype=np.int64)  # ... and read it in its last step
    cap = group * width
    occ_p = np.empty(cap, dtype=np.int64)
    occ_t = np.empty(cap, dtype=np.int64)
    occ_last = np.empty(cap, dtype=np.bool_)
    hit_slots = np.empty(cap, dtype=np.int64)
    flags = np.empty(2 * cap, dtype=np.int64)  # the hits hook's hit_nu: hits' then misses' last-step flags
    miss_pos = np.empty(cap, dtype=np.int64)
    miss_step = np.empty(cap, dtype=np.int64)
    stamp = 0
    fast = False
    started = False
    for t0 in range(0, steps, group):
        t1 = min(t0 + group, steps)
        for t in range(t0, t1):
            misses_out[t] = 0
        if ctx_len[t1 - 1] <= B:  # fast path: the buffer holds the whole context, position p in slot p
            if record:
                for t in range(t0, t1):
                    for j in range(width):
                        p = indices[t, j]
                        slots_out[t, j] = -1 if p < 0 else (B if reserve and p == ctx_len[t] - 1 else p)
            fast = True
            continue
        if not started or fast:
            sw[:] = 0
            pw[:] = 0
            g[:] = 0
            slot_pos[:] = -1
            pos_slot[:] = -1
            g[G_PARAM] = param
            dispatch.init(pid, sw, pw, g, B, cmax)
            if prefix or fast:
                for p in range(B):  # ctx > B here: the prompt's first B positions, in order
                    stamp += 1
                    g[G_FLAGS] = FLAG_FILL
                    v = dispatch.victim(pid, sw, pw, g, B, cmax, mark, stamp, slot_pos, p)
                    if v < 0:
                        continue
                    if slot_pos[v] >= 0:
                        pos_slot[slot_pos[v]] = -1
                    slot_pos[v] = p
                    pos_slot[p] = v
                    mark[v] = stamp
                    dispatch.insert(pid, sw, pw, g, B, cmax, v, p, INF, stamp)
            started = True
            fast = False
        first_new = ctx_len[t0] - 1  # reserved from here on (every step's newest token)
        n = 0
        for t in range(t0, t1):
            for j in range(width):
                p = indices[t, j]
                if p < 0:
                    break
                if reserve and p >= first_new:
                    continue
                occ_p[n] = p
                occ_t[n] = t
                occ_last[n] = t == t1 - 1
                n += 1
                if not batched:  # sequential: one access per commit
                    stamp += 1
                    _commit(pid, sw, pw, g, B, cmax, mark, stamp, slot_pos, pos_slot, occ_p, occ_t, occ_last, 1,
                            last_mark, seen, seen_last, hit_slots, flags, miss_pos, miss_step, misses_out)
                    n = 0
        if batched:
            stamp += 1
            _commit(pid, sw, pw, g, B, cmax, mark, stamp, slot_pos, pos_slot, occ_p, occ_t, occ_last, n, last_mark,
                    seen, seen_last, hit_slots, flags, miss_pos, miss_step, misses_out)
        if record:
            for t in range(t0, t1):
                for j in range(width):
                    p = indices[t, j]
                    slots_out[t, j] = -1 if p < 0 else (B if reserve and p >= first_new else pos_slot[p])
    order = np.empty(B if started else 0, dtype=np.int64)
    n = dispatch.order(pid, sw, pw, g, B, cmax, order) if started else 0
    return slot_pos, order[:n]
