"""The CLOCK multi-step swap-in kernel's algorithm (``clock_swap.cu``) in numpy, phase for phase.

SGLang's MTP commit (PR #32162) as the replay engine's ``sglang-clock`` policy specifies it
(``simulator/replay/policies/sglang_clock.py``): a commit flattens [steps, k] top-k positions,
looks each up once, dedupes the misses across the draft positions (ordinal = first occurrence),
and places them in a CLOCK cache of epoch-stamped slots. The engine places misses one after the
other; the kernel cannot, so it uses these parallel formulations, which give the same answer:

- *Union path* (nm + nh <= B): miss i samples only ring positions congruent to i mod nm, so the
  sample sets of different misses are disjoint and every miss picks its victim at once.
- *Approximate path*: admitted miss i takes the first slot on its candidate list (j = i, i + nm,
  ... < B, hashed) not taken by an earlier miss. Solved in rounds: every unresolved miss proposes
  its first untaken candidate and registers interest (a minimum over ordinals) in each of its
  untaken candidates; a proposal is final when no earlier unresolved miss is interested in that
  slot. The smallest unresolved miss always wins, and a later miss never takes a slot an earlier
  one could still reach, so the rounds reproduce the sequential order exactly.
- *Probes* (misses left without a victim) walk the stride-2654435761 ring in ordinal order, one
  warp per probe, 32 attempts at a time: sequential, as in the engine.

tests/test_clock_swap_reference.py checks this model against the engine on the CPU (so the
formulation is proven where CI runs); the GPU tests compare the kernel with the engine directly.
This package imports nothing from the simulator.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

HASH = 2654435761
M32 = 0xFFFFFFFF
VICTIM_SAMPLES = 6


class ClockRun(NamedTuple):
    misses: np.ndarray  # int64 [steps]: each unique miss counted at its first step
    slots: np.ndarray  # int32 [steps, width]: slot after the commit (B reserved, -1 pad / not cached)
    slot_pos: np.ndarray  # int64 [B]
    rounds: int  # the most rounds one approximate-path commit needed (the kernel's loop count)


def epoch_mask(B: int) -> int:
    bits = (B - 1).bit_length()
    return (1 << min(32 - bits, 23)) - 1


def _probe(ref: np.ndarray, B: int, start: int, e: int) -> int:
    """The first slot not stamped e on the stride-HASH walk from start, 32 attempts per round
    (the kernel's warp ballot), stamped; -1 if none."""
    for base in range(0, B, 32):
        a = np.arange(base, min(base + 32, B), dtype=np.int64)
        c = ((start + ((a * HASH) & M32)) & M32) % B
        free = np.flatnonzero(ref[c] != e)
        if free.size:
            v = int(c[free[0]])
            ref[v] = e
            return v
    return -1


def _union(ref, hits, nm, B, cursor, e, mask):
    ref[hits] = e
    plan = np.full(nm, -1, np.int64)
    for i in range(nm):  # independent: the sample sets are disjoint (the kernel: one thread each)
        share = (B - 1 - i) // nm + 1
        n = min(share, VICTIM_SAMPLES)
        c = (cursor + i + (np.arange(n) * share // n) * nm) % B
        ok = ref[c] != e
        if ok.any():
            age = np.where(ok, (e - ref[c]) & mask, -1)
            plan[i] = c[int(np.argmax(age))]  # first on ties
    ref[plan[plan >= 0]] = e
    return plan


def _approx(ref, hits_last, adm, nm, B, e):
    """Admitted misses' candidate lists, solved in rounds (module docstring)."""
    ref[:] = 0
    ref[hits_last] = e
    plan = np.full(nm, -1, np.int64)
    cands = {}
    for i in np.flatnonzero(adm).tolist():
        j = np.arange(i, B, nm, dtype=np.int64)
        cands[i] = ((((j * HASH) & M32) + e) & M32) % B
    unresolved = [i for i in cands if cands[i].size]
    rounds = 0
    while unresolved:
        rounds += 1
        interest = np.full(B, np.iinfo(np.int64).max, np.int64)
        prop = {}
        for i in unresolved:
            c = cands[i][ref[cands[i]] != e]
            if c.size:
                np.minimum.at(interest, c, i)
                prop[i] = int(c[0])
        left = []
        for i in unresolved:
            if i not in prop:
                continue  # every candidate taken: probes later
            if interest[prop[i]] == i:
                plan[i] = prop[i]
            else:
                left.append(i)
        ref[plan[plan >= 0]] = e
        unresolved = left
    return plan, rounds


def replay(indices: np.ndarray, ctx_len: np.ndarray, buffer: int, steps: int = 1, *, prefix: bool = True,
           reserve: bool = True) -> ClockRun:
    """One stream (indices [T, width], -1 padding at the end; ctx_len [T]) in commits of
    ``steps`` consecutive trace steps (the engine's ``group``; MTP draft positions)."""
    B = int(buffer)
    mask = epoch_mask(B)
    T, width = indices.shape
    misses = np.zeros(T, np.int64)
    slots = np.full((T, width), -1, np.int32)
    slot_pos = np.full(B, -1, np.int64)
    ref = np.zeros(B, np.int64)
    pos_slot: dict[int, int] = {}
    epoch = cursor = 0
    started = fast = False
    max_rounds = 0
    for t0 in range(0, T, steps):
        t1 = min(t0 + steps, T)
        rows = indices[t0:t1]
        if ctx_len[t1 - 1] <= B:  # fast path
            for t in range(t0, t1):
                p = indices[t]
                slots[t] = np.where(p < 0, -1, np.where(reserve & (p == ctx_len[t] - 1), B, p))
            fast = True
            continue
        if not started or fast:
            fill = prefix or fast
            slot_pos = np.arange(B, dtype=np.int64) if fill else np.full(B, -1, np.int64)
            pos_slot = {p: p for p in range(B)} if fill else {}
            ref[:] = 0
            epoch = cursor = 0
            started, fast = True, False
        first_new = int(ctx_len[t0]) - 1
        # 1. look up every occurrence (flattened [steps, width] order)
        hit_any = np.zeros(B, bool)
        hit_last = np.zeros(B, bool)
        first_occ: dict[int, int] = {}
        miss_last: set[int] = set()
        for t in range(t0, t1):
            last = t == t1 - 1
            for j in range(width):
                p = int(indices[t, j])
                if p < 0:
                    break
                if reserve and p >= first_new:
                    continue
                s = pos_slot.get(p, -1)
                if s >= 0:
                    hit_any[s] = True
                    hit_last[s] |= last
                else:
                    first_occ.setdefault(p, t * width + j)
                    if last:
                        miss_last.add(p)
        order = sorted(first_occ, key=first_occ.__getitem__)  # ordinals: first occurrence
        nm, nh = len(order), int(hit_any.sum())
        adm = np.array([p in miss_last for p in order], bool)
        for p in order:
            misses[first_occ[p] // width] += 1
        e = (epoch + 1) & mask or 1
        # 2. victims
        if nm + nh <= B:
            plan = _union(ref, np.flatnonzero(hit_any), nm, B, cursor, e, mask)
            want = np.ones(nm, bool)
        else:
            plan, rounds = _approx(ref, np.flatnonzero(hit_last), adm, nm, B, e)
            max_rounds = max(max_rounds, rounds)
            want = adm
        for i in np.flatnonzero((plan < 0) & want).tolist():  # 3. probes, in ordinal order
            plan[i] = _probe(ref, B, ((cursor + ((i * HASH) & M32)) & M32) % B, e)
        # 4. place (victims are distinct; evicted positions and loaded ones are disjoint)
        for i, p in enumerate(order):
            v = int(plan[i])
            if v < 0:
                continue
            old = int(slot_pos[v])
            if old >= 0:
                del pos_slot[old]
            slot_pos[v] = p
            pos_slot[p] = v
        epoch = e
        if nm:
            cursor = (cursor + min(nm, B)) % B
        for t in range(t0, t1):
            for j, p in enumerate(rows[t - t0].tolist()):
                if p < 0:
                    break
                slots[t, j] = B if reserve and p >= first_new else pos_slot.get(p, -1)
    return ClockRun(misses, slots, slot_pos if started else np.full(B, -1, np.int64), max_rounds)
