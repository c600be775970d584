"""OPT (Belady) stack distances: the misses of every buffer size in one pass (the plain reference).

OPT evicts by a priority that does not depend on the buffer's size (the next use: sooner is
better), so it is a stack algorithm (Mattson, Gecsei, Slutz and Traiger, 1970): the buffer of C
slots holds the top C entries of one stack, for every C at once, and an access misses at exactly
the sizes below its depth in that stack. This holds under both of the engine's step rules:

- ``sequential``: the classic case. On an access at depth d the entry goes to the top; walking
  down from depth 1, the lower-priority one of (carried, entry at depth i) is carried on and the
  other stays at i; the last carried entry takes depth d (Mattson's update for priority lists).
- ``batched``: a step's entries A are looked up at once, hits are kept, and at size C the
  |A - top C| misses evict the lowest-priority entries of top C outside A (free slots first).
  Contents nest: if top C is inside top C+1 before the step, A plus the best C - |A| of
  (top C - A) is inside A plus the best C + 1 - |A| of (top C+1 - A). The new stack is A (in
  any order: every size >= k holds all of it), then the old entries in order, where walking
  down from depth |A| + 1 with the set D of entries evicted so far at the size just passed:
  an entry of A leaves its depth to the best of D (one fewer miss below it); any other entry
  stays if it is better than every entry of D, else it joins D and the best of D takes its
  depth. Sequential is the case |A| = 1.

Free slots are entries of the lowest priority below the stack's end (a load takes a free slot
before it evicts). The keys are the engine's (``step.py``, ``policies/opt.py``): the access number
of the entry's next use over every entry of the stream, the reserved newest token's too, INF when
none; a prefix buffer starts as positions 0, 1, ... keyed by their first use. Entries that are
never used again tie, and which of them leaves first changes no later hit. Exact for every size
above which no step takes the fast path (ctx_len > size at every step).

This module is the reference, plain Python over the whole stack per step (small inputs only);
``native.opt_stack_hist`` is its C twin (a max tree over depths finds the next entry that moves,
and the depths above the smallest size asked for are one unordered set, a heap on the key),
held to it and to per-size replays in tests/test_mrc_opt.py.
"""

from __future__ import annotations

import heapq

import numpy as np

INF = 2**61  # step.INF: no next use


def next_uses(indices: np.ndarray) -> tuple[np.ndarray, dict[int, int]]:
    """The engine's next use of every entry (access numbers over every non-padding entry in
    row order; INF when none), and each position's first access number."""
    steps, width = indices.shape
    out = np.full((steps, width), INF, dtype=np.int64)
    nxt: dict[int, int] = {}
    vt = int((indices >= 0).sum())
    for t in range(steps - 1, -1, -1):
        row = indices[t]
        for j in range(int((row >= 0).sum()) - 1, -1, -1):
            vt -= 1
            p = int(row[j])
            out[t, j] = nxt.get(p, INF)
            nxt[p] = vt
    return out, nxt


def opt_stack_histogram(indices: np.ndarray, ctx_len: np.ndarray, *, reserve: bool, prefix: bool, batched: bool,
                        max_size: int, min_size: int = 1) -> np.ndarray:
    """hist[d] = accesses at OPT stack depth d (min_size..max_size) of one stream, those at
    depths 1..min_size all in hist[min_size]; hist[0] counts those deeper or not in the stack
    (misses at every size up to max_size). Misses at size C >= min_size are hist[0] +
    hist[C+1:].sum(). Valid for sizes >= the largest step when batched, and only where every
    ctx_len exceeds the size (no fast path)."""
    indices = np.asarray(indices)
    ctx_len = np.asarray(ctx_len)
    nu, first = next_uses(indices)
    hist = np.zeros(max_size + 1, dtype=np.int64)
    # the stack, top first: [key, position]; free slots are implicit below its end
    stack: list[tuple[int, int]] = [(first.get(p, INF), p) for p in range(max_size)] if prefix else []
    for t in range(indices.shape[0]):
        newest = int(ctx_len[t]) - 1
        entries = [(int(nu[t, j]), int(p)) for j, p in enumerate(indices[t])
                   if p >= 0 and not (reserve and p == newest)]
        for group in ([entries] if batched else [[e] for e in entries]):
            if group:
                stack = _step(stack, group, hist, max_size)
    hist[min_size] += hist[1:min_size].sum()
    hist[1:min_size] = 0
    return hist


def _step(stack: list[tuple[int, int]], group: list[tuple[int, int]], hist: np.ndarray,
          max_size: int) -> list[tuple[int, int]]:
    """One lookup of ``group`` (new key, position) at once: count each entry's depth, then the new stack."""
    depth = {p: d for d, (_, p) in enumerate(stack, 1)}
    accessed = {p for _, p in group}
    if len(accessed) != len(group):
        raise ValueError("a step selects a position twice")
    a = len(group)
    if a > max_size:
        raise ValueError(f"a step of {a} entries is larger than the largest size {max_size}")
    for _, p in group:
        hist[depth.get(p, 0)] += 1
    evicted: list[tuple[int, int]] = []  # D: a heap, best (smallest key: nearest next use) first
    tail = []  # the new entries at depths a + 1, a + 2, ...
    for d, entry in enumerate(stack, 1):
        inside = entry[1] in accessed
        if d <= a:
            if not inside:
                heapq.heappush(evicted, entry)
        elif inside:
            tail.append(heapq.heappop(evicted))  # D holds one entry per access still below: never empty here
        elif evicted and evicted[0][0] < entry[0]:
            tail.append(heapq.heapreplace(evicted, entry))
        else:
            tail.append(entry)
    while evicted and a + len(tail) < max_size:  # free slots below the end take the rest, best first
        tail.append(heapq.heappop(evicted))
    return (list(group) + tail)[:max_size]


def misses_at(hist: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Misses at each size (1..len(hist) - 1) from a depth histogram."""
    beyond = hist[0] + (hist[1:].sum() - np.cumsum(hist[1:]))  # index C-1 -> size C
    return beyond[np.asarray(sizes) - 1]
