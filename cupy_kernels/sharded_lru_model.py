"""The algorithm of ``sharded_lru.cu`` in numpy, step for step (no GPU needed).

The kernels do not walk linked lists: each shard keeps all its W ways in an array, least
recently used first, free ways at the head; a step splits each shard's array stably into E (not
hit: free or stale) and H (hit), and with c = min(the shard's misses, |E|) the new array is
E[c:], E[:c], H, the shard's miss of rank r < c taking slot E[r] (ranks in stored order; misses
of rank >= c are served but not cached). With one shard of B ways this is the engine's batched
``lru``; with B / W shards, its ``salru``. tests/test_sharded_lru_reference.py checks this model
against the engine on the CPU, so that the formulation is proven where CI runs; the GPU tests
check the kernels against the engine directly.

This package imports nothing from the simulator: the engine is the tests' business.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

HASH = 2654435761
NOT_CACHED = -2  # an entry's slot when its miss was served but not cached (the shard overflowed)


class ModelRun(NamedTuple):
    misses: np.ndarray  # int64 [steps]
    slots: np.ndarray  # int32 [steps, width]: slot after the step (B newest, -1 pad, -2 not cached)
    slot_pos: np.ndarray  # int64 [B]
    order: np.ndarray  # filled slots, shard by shard, least recent first


def shard_of(pos: np.ndarray | int, shards: int) -> np.ndarray:
    """The Knuth multiplicative hash of salru.py, mod the shard count."""
    h = (np.asarray(pos, np.int64) * HASH) & 0xFFFFFFFF
    return h & (shards - 1) if shards & (shards - 1) == 0 else h % shards


def _ranks(keys: np.ndarray) -> np.ndarray:
    """Stable rank of each key among the earlier equal keys."""
    out = np.zeros(keys.size, np.int64)
    seen: dict[int, int] = {}
    for i, key in enumerate(keys.tolist()):
        out[i] = seen.get(key, 0)
        seen[key] = out[i] + 1
    return out


def _fresh(B: int, W: int, fill: bool) -> tuple[np.ndarray, np.ndarray, dict[int, int]]:
    S = B // W
    slot_pos = np.full(B, -1, np.int64)
    order = np.arange(B, dtype=np.int64)
    pos_slot: dict[int, int] = {}
    if fill:
        p = np.arange(B)
        sh = shard_of(p, S) if S > 1 else np.zeros(B, np.int64)
        rk = _ranks(sh)
        keep = rk < W
        slots = sh[keep] * W + rk[keep]
        slot_pos[slots] = p[keep]
        pos_slot = dict(zip(p[keep].tolist(), slots.tolist(), strict=True))
        for s in range(S):
            c = min(int((sh == s).sum()), W)
            ways = np.arange(s * W, (s + 1) * W)
            order[s * W:(s + 1) * W] = np.concatenate([ways[c:], ways[:c]])
    return slot_pos, order, pos_slot


def replay(indices: np.ndarray, ctx_len: np.ndarray, buffer: int, ways: int, *, prefix: bool = True,
           reserve: bool = True) -> ModelRun:
    """One stream (indices [steps, width], -1 padding at the end; ctx_len [steps])."""
    B, W = int(buffer), int(ways)
    if B % W:
        raise ValueError(f"buffer {B} is not a whole number of shards of {W} ways")
    S = B // W
    steps, width = indices.shape
    misses = np.zeros(steps, np.int64)
    slots = np.full((steps, width), -1, np.int32)
    slot_pos, order, pos_slot = _fresh(B, W, False)
    started = fast = False
    for t in range(steps):
        ctx = int(ctx_len[t])
        row = indices[t]
        if ctx <= B:
            fast = True
            slots[t] = np.where(row < 0, -1, np.where(reserve & (row == ctx - 1), B, row))
            continue
        if not started or fast:
            slot_pos, order, pos_slot = _fresh(B, W, prefix or fast)
            started, fast = True, False
        live = row[row >= 0]
        hit = np.zeros(B, bool)
        miss_pos = []
        for p in live.tolist():
            if reserve and p == ctx - 1:
                continue
            s = pos_slot.get(p, -1)
            if s >= 0:
                hit[s] = True
            else:
                miss_pos.append(p)
        mp = np.asarray(miss_pos, np.int64)
        msh = (shard_of(mp, S) if S > 1 else np.zeros(mp.size, np.int64)) if mp.size else mp
        rk = _ranks(msh)
        new_order = order.copy()
        victims = {}
        for s in range(S):
            seg = order[s * W:(s + 1) * W]
            E, H = seg[~hit[seg]], seg[hit[seg]]
            c = min(int((msh == s).sum()), E.size)
            new_order[s * W:(s + 1) * W] = np.concatenate([E[c:], E[:c], H])
            victims[s] = E[:c]
        placed = {}
        for p, s, r in zip(mp.tolist(), msh.tolist(), rk.tolist(), strict=True):
            if r < victims[s].size:
                v = int(victims[s][r])
                old = int(slot_pos[v])
                if old >= 0:
                    del pos_slot[old]
                slot_pos[v] = p
                pos_slot[p] = v
                placed[p] = v
            else:
                placed[p] = NOT_CACHED
        order = new_order
        misses[t] = mp.size
        for j, p in enumerate(row.tolist()):
            if p < 0:
                break
            slots[t, j] = B if reserve and p == ctx - 1 else placed.get(p, pos_slot.get(p, -1))
    filled = order[slot_pos[order] >= 0] if started else np.zeros(0, np.int64)
    return ModelRun(misses, slots, slot_pos if started else np.full(B, -1, np.int64), filled)
