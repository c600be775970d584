"""The replay engine: exact per-step miss counts of a stream for one policy and buffer size.

Step structure (shared by every policy; BRIEF section 1):
- While ``ctx_len <= buffer`` nothing misses (HiSparse's fast path: the buffer holds the whole
  context). Leaving it, the buffer holds positions [0, buffer), oldest first by position.
- The newest token (``ctx_len - 1``) sits in a reserved slot: never a miss, never in the buffer
  (``reserve_newest=False`` treats it as an ordinary access).
- Initial buffer: ``prefix`` (colocated: the first positions of the prompt) or ``empty``
  (disaggregated decode). Free slots are taken first, in slot order.
- ``batched`` (HiSparse): a step's entries are looked up at once; hits are protected; miss i
  takes the policy's i-th victim in stored order; hits are then reported to the policy.
  ``sequential``: the step's entries one at a time, in stored order (classic cache simulation).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import NamedTuple

import numpy as np
from numba import literally, njit

from .policies import POLICY_IDS, arc, clock, fifo, lfu, lru, opt, random_, s3fifo, sieve


def _drop_stale_compiled_copies(here: Path = Path(__file__).parent) -> None:
    """numba's on-disk cache checks only the file a function is defined in, so after an edit of
    a policy or of a helper such as _heap.py the engine would keep running its old compiled copy.
    When the engine or a policy module changed, drop their cached machine code."""
    sources = [here / "engine.py", *sorted((here / "policies").glob("*.py"))]
    digest = hashlib.sha1(b"".join(p.name.encode() + p.read_bytes() for p in sources)).hexdigest()
    dirs = [here / "__pycache__", here / "policies" / "__pycache__"]
    if os.environ.get("NUMBA_CACHE_DIR"):  # numba mirrors the source tree under it
        root = Path(os.environ["NUMBA_CACHE_DIR"])
        dirs += [root / str(d.parent.resolve()).lstrip(os.sep) for d in dirs]
    stamp = dirs[0] / "replay-sources.sha1"
    try:
        if stamp.read_text() == digest:
            return
    except OSError:
        pass
    for d in dirs:
        pattern = "*.nb[ic]" if d.parent.name == "policies" else "engine.*.nb[ic]"
        for f in d.glob(pattern):
            f.unlink(missing_ok=True)
    try:
        stamp.parent.mkdir(parents=True, exist_ok=True)
        tmp = stamp.with_name(f"{stamp.name}.{os.getpid()}.tmp")
        tmp.write_text(digest)
        tmp.replace(stamp)
    except OSError:  # a read-only install: numba then compiles in memory
        pass


_drop_stale_compiled_copies()

INF = 2**61
_NSW, _NPW, _NG = 5, 3, 16


@njit(cache=True)
def _init(pid, sw, pw, g, B, cmax):  # pragma: no cover - compiled
    literally(pid)  # one compiled copy per policy: the branches below fold away
    if pid == 0:
        lru.init(sw, pw, g, B, cmax)
    elif pid == 1:
        fifo.init(sw, pw, g, B, cmax)
    elif pid == 2:
        clock.init(sw, pw, g, B, cmax)
    elif pid == 3:
        lfu.init(sw, pw, g, B, cmax)
    elif pid == 4:
        arc.init(sw, pw, g, B, cmax)
    elif pid == 5:
        s3fifo.init(sw, pw, g, B, cmax)
    elif pid == 6:
        sieve.init(sw, pw, g, B, cmax)
    elif pid == 7:
        random_.init(sw, pw, g, B, cmax)
    else:
        opt.init(sw, pw, g, B, cmax)


@njit(cache=True)
def _victim(pid, sw, pw, g, B, cmax, mark, stamp, slot_pos, pos):  # pragma: no cover - compiled
    literally(pid)  # one compiled copy per policy: the branches below fold away
    if pid == 0:
        return lru.victim(sw, pw, g, B, cmax, mark, stamp, slot_pos, pos)
    if pid == 1:
        return fifo.victim(sw, pw, g, B, cmax, mark, stamp, slot_pos, pos)
    if pid == 2:
        return clock.victim(sw, pw, g, B, cmax, mark, stamp, slot_pos, pos)
    if pid == 3:
        return lfu.victim(sw, pw, g, B, cmax, mark, stamp, slot_pos, pos)
    if pid == 4:
        return arc.victim(sw, pw, g, B, cmax, mark, stamp, slot_pos, pos)
    if pid == 5:
        return s3fifo.victim(sw, pw, g, B, cmax, mark, stamp, slot_pos, pos)
    if pid == 6:
        return sieve.victim(sw, pw, g, B, cmax, mark, stamp, slot_pos, pos)
    if pid == 7:
        return random_.victim(sw, pw, g, B, cmax, mark, stamp, slot_pos, pos)
    return opt.victim(sw, pw, g, B, cmax, mark, stamp, slot_pos, pos)


@njit(cache=True)
def _insert(pid, sw, pw, g, B, cmax, slot, pos, nu, stamp):  # pragma: no cover - compiled
    literally(pid)  # one compiled copy per policy: the branches below fold away
    if pid == 0:
        lru.insert(sw, pw, g, B, cmax, slot, pos, nu, stamp)
    elif pid == 1:
        fifo.insert(sw, pw, g, B, cmax, slot, pos, nu, stamp)
    elif pid == 2:
        clock.insert(sw, pw, g, B, cmax, slot, pos, nu, stamp)
    elif pid == 3:
        lfu.insert(sw, pw, g, B, cmax, slot, pos, nu, stamp)
    elif pid == 4:
        arc.insert(sw, pw, g, B, cmax, slot, pos, nu, stamp)
    elif pid == 5:
        s3fifo.insert(sw, pw, g, B, cmax, slot, pos, nu, stamp)
    elif pid == 6:
        sieve.insert(sw, pw, g, B, cmax, slot, pos, nu, stamp)
    elif pid == 7:
        random_.insert(sw, pw, g, B, cmax, slot, pos, nu, stamp)
    else:
        opt.insert(sw, pw, g, B, cmax, slot, pos, nu, stamp)


@njit(cache=True)
def _hits(pid, sw, pw, g, B, cmax, mark, stamp, hit_slots, hit_nu, nh):  # pragma: no cover
    literally(pid)  # one compiled copy per policy: the branches below fold away
    if pid == 0:
        lru.hits(sw, pw, g, B, cmax, mark, stamp, hit_slots, hit_nu, nh)
    elif pid == 1:
        fifo.hits(sw, pw, g, B, cmax, mark, stamp, hit_slots, hit_nu, nh)
    elif pid == 2:
        clock.hits(sw, pw, g, B, cmax, mark, stamp, hit_slots, hit_nu, nh)
    elif pid == 3:
        lfu.hits(sw, pw, g, B, cmax, mark, stamp, hit_slots, hit_nu, nh)
    elif pid == 4:
        arc.hits(sw, pw, g, B, cmax, mark, stamp, hit_slots, hit_nu, nh)
    elif pid == 5:
        s3fifo.hits(sw, pw, g, B, cmax, mark, stamp, hit_slots, hit_nu, nh)
    elif pid == 6:
        sieve.hits(sw, pw, g, B, cmax, mark, stamp, hit_slots, hit_nu, nh)
    elif pid == 7:
        random_.hits(sw, pw, g, B, cmax, mark, stamp, hit_slots, hit_nu, nh)
    else:
        opt.hits(sw, pw, g, B, cmax, mark, stamp, hit_slots, hit_nu, nh)


@njit(cache=True, inline="always")
def _load(pid, sw, pw, g, B, cmax, mark, stamp, slot_pos, pos_slot, free_next, p, nu):  # pragma: no cover
    """Load missed position p: a free slot while any is left (in slot order), else the policy's
    victim; the slot is protected for the rest of the step. Returns the next free slot."""
    if free_next < B:
        v = free_next
        free_next += 1
    else:
        v = _victim(pid, sw, pw, g, B, cmax, mark, stamp, slot_pos, p)
        pos_slot[slot_pos[v]] = -1
    slot_pos[v] = p
    pos_slot[p] = v
    mark[v] = stamp
    _insert(pid, sw, pw, g, B, cmax, v, p, nu, stamp)
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
def _replay(pid, indices, ctx_len, B, reserve, prefix, batched, seed, nu_all, want_nu, misses_out, record,
            slots_out):  # pragma: no cover
    literally(pid)
    steps, width = indices.shape
    cmax = 1
    for t in range(steps):
        cmax = max(cmax, ctx_len[t])
    L = 8 * (B + 4)
    sw = np.zeros((_NSW, L), dtype=np.int64)
    pw = np.zeros((_NPW, cmax + 4), dtype=np.int64)
    g = np.zeros(_NG, dtype=np.int64)
    slot_pos = np.full(B, -1, dtype=np.int64)
    pos_slot = np.full(cmax, -1, dtype=np.int64)
    mark = np.zeros(B, dtype=np.int64)
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
            _init(pid, sw, pw, g, B, cmax)
            free_next = 0
            if prefix or fast:
                n_pre = B  # ctx > B here, so the prompt fills every slot
                first = _first_uses(indices, t, cmax) if want_nu else np.zeros(0, dtype=np.int64)
                stamp += 1
                for p in range(n_pre):
                    slot_pos[p] = p
                    pos_slot[p] = p
                    _insert(pid, sw, pw, g, B, cmax, p, p, first[p] if want_nu else INF, stamp)
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
                _hits(pid, sw, pw, g, B, cmax, mark, stamp, hit_slots, hit_nu, nh)
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
                    _hits(pid, sw, pw, g, B, cmax, mark, stamp, one_slot, one_nu, 1)
                    continue
                free_next = _load(pid, sw, pw, g, B, cmax, mark, stamp, slot_pos, pos_slot, free_next, p, nu)
                n_miss += 1
        misses_out[t] = n_miss
        if record:  # where attention reads each entry: its slot, B for the reserved newest slot
            for j in range(width):
                p = indices[t, j]
                slots_out[t, j] = -1 if p < 0 else (B if reserve and p == newest else pos_slot[p])
    # Recency (LRU) or queue (FIFO) order of the slots, oldest first.
    order = np.empty(0, dtype=np.int64)
    if pid <= 1 and started:
        order = np.empty(B, dtype=np.int64)
        n = 0
        x = sw[1][B]
        while x != B and n < B:
            order[n] = x
            n += 1
            x = sw[1][x]
        order = order[:n]
    return slot_pos, order


# One compiled entry point per policy: calling _replay with a constant id makes the id a
# literal, so each policy gets its own copy of the step loop with its hooks called directly
# (a run-time id costs a dispatch on every call and every hook).
@njit(cache=True, nogil=True)
def _replay_lru(a, b, c, d, e, f, g, h, i, j, k, m):  # pragma: no cover - compiled
    return _replay(0, a, b, c, d, e, f, g, h, i, j, k, m)


@njit(cache=True, nogil=True)
def _replay_fifo(a, b, c, d, e, f, g, h, i, j, k, m):  # pragma: no cover - compiled
    return _replay(1, a, b, c, d, e, f, g, h, i, j, k, m)


@njit(cache=True, nogil=True)
def _replay_clock(a, b, c, d, e, f, g, h, i, j, k, m):  # pragma: no cover - compiled
    return _replay(2, a, b, c, d, e, f, g, h, i, j, k, m)


@njit(cache=True, nogil=True)
def _replay_lfu(a, b, c, d, e, f, g, h, i, j, k, m):  # pragma: no cover - compiled
    return _replay(3, a, b, c, d, e, f, g, h, i, j, k, m)


@njit(cache=True, nogil=True)
def _replay_arc(a, b, c, d, e, f, g, h, i, j, k, m):  # pragma: no cover - compiled
    return _replay(4, a, b, c, d, e, f, g, h, i, j, k, m)


@njit(cache=True, nogil=True)
def _replay_s3fifo(a, b, c, d, e, f, g, h, i, j, k, m):  # pragma: no cover - compiled
    return _replay(5, a, b, c, d, e, f, g, h, i, j, k, m)


@njit(cache=True, nogil=True)
def _replay_sieve(a, b, c, d, e, f, g, h, i, j, k, m):  # pragma: no cover - compiled
    return _replay(6, a, b, c, d, e, f, g, h, i, j, k, m)


@njit(cache=True, nogil=True)
def _replay_random(a, b, c, d, e, f, g, h, i, j, k, m):  # pragma: no cover - compiled
    return _replay(7, a, b, c, d, e, f, g, h, i, j, k, m)


@njit(cache=True, nogil=True)
def _replay_opt(a, b, c, d, e, f, g, h, i, j, k, m):  # pragma: no cover - compiled
    return _replay(8, a, b, c, d, e, f, g, h, i, j, k, m)


_ENTRY = {"lru": _replay_lru, "fifo": _replay_fifo, "clock": _replay_clock, "lfu": _replay_lfu,
          "arc": _replay_arc, "s3fifo": _replay_s3fifo, "sieve": _replay_sieve, "random": _replay_random,
          "opt": _replay_opt}
assert set(_ENTRY) == set(POLICY_IDS)


class PolicyRun(NamedTuple):
    """One stateful replay: misses per step, and the state a GPU kernel is checked against."""

    misses: np.ndarray  # int64 [steps]
    slot_pos: np.ndarray  # int64 [B]: position held by each slot at the end (-1: free)
    order: np.ndarray  # int64: LRU/FIFO order of occupied slots, oldest first (lru, fifo only)
    slots: np.ndarray | None  # int32 [steps, width]: slot of every entry after its step (B: reserved
    #                           newest slot, -1: padding); only with record=True


def replay_policy(policy: str, indices: np.ndarray, ctx_len: np.ndarray, buffer: int, *, reserve: bool,
                  prefix: bool, batched: bool, seed: int, record: bool = False) -> PolicyRun:
    """Replay one stateful policy over one stream."""
    want_nu = policy == "opt"
    idx = np.ascontiguousarray(indices, dtype=np.int32)
    ctx = np.ascontiguousarray(ctx_len, dtype=np.int64)
    cmax = int(ctx.max()) if ctx.size else 1
    nu = next_uses(idx, cmax) if want_nu else np.zeros((1, 1), dtype=np.int64)
    misses = np.zeros(idx.shape[0], dtype=np.int64)
    slots = np.full(idx.shape if record else (1, 1), -1, dtype=np.int32)
    slot_pos, order = _ENTRY[policy](idx, ctx, int(buffer), reserve, prefix, batched, int(seed), nu, want_nu,
                                     misses, record, slots)
    return PolicyRun(misses, slot_pos, order, slots if record else None)
