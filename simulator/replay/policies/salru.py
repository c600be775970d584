"""Sharded set-associative LRU: SGLang PR #31341 ("[HiSparse] Optimize small-batch perf with
multi-CTA cache sharding", vladnosiv, open).

Read from the PR's description, not its code (the PR branch is in no store this project can
read; its kernel diff was not found): "The kernel partitions each request's hot buffer into
independent LRU logical shards and hashes every selected top-k token to one shard. Each CTA owns
a subset of the logical shards, builds their top-k queues in shared memory, and assigns one warp
at a time to each shard." Its benchmark runs 256 shards x 32 ways (hot buffer 8192).

The model (the assumptions are ours, each named):
- The buffer of B slots is S = B / W shards of W ways; shard s owns slots [s*W, (s+1)*W).
  Position p belongs to shard ``(p * 2654435761 mod 2**32) mod S`` (masked when S is a power of
  two): the Knuth multiplicative hash SGLang's HiSparse kernels use for their token tables
  (``hash_slot`` in ``hisparse_mtp_swap.cuh``); #31341's own hash is not known to us. With S a
  power of two, positions [0, B) fill every shard exactly.
- Within a shard, HiSparse's batched LRU (the engine's ``lru``): the step's hits are protected;
  the shard's misses, in the step's stored order, take its least recently used unprotected ways
  in order; the shard's new order is stale ways (old order), loaded misses, hits (old order).
  Free ways are the least recent, in slot order.
- Overflow: when more misses map to a shard than it has unprotected ways, the extra misses are
  served but not cached (they do not evict anything and miss again when next selected). This is
  our reading of "shard-queue overflow dropped"; the TODO in #31341's code that decides it was
  not read.
- Initial prefix buffer: positions 0..B-1 offered in order, each kept while its shard has a
  free way (S a power of two: all of them, each shard in position order).

The ways per shard are ``ReplayConfig.ways`` (the step loop's g[4]); the engine replays this
policy in ``step.run_placed`` (hits are reported before the misses; see its docstring).

Words (slots 0..B-1, shard heads at B + s): 0 prev, 1 next; per shard s: 2 victim cursor,
3 its stamp, 4 first hit moved to the tail this step, 5 its stamp; 6 slot ever filled.
"""

from __future__ import annotations

from numba import njit

from . import PolicyState, _dlist

STATE = PolicyState(slot_rows=7, position_rows=0, scalars=5)

G_FLAGS, G_PARAM = 3, 4  # written by step.run_placed
FLAG_FILL = 2
HASH = 2654435761
M32 = 0xFFFFFFFF


@njit(cache=True, inline="always")
def shard_of(pos, S):  # pragma: no cover - compiled
    h = (pos * HASH) & M32
    return h & (S - 1) if (S & (S - 1)) == 0 else h % S


@njit(cache=True)
def init(sw, pw, g, B, cmax):  # pragma: no cover - compiled
    W = g[G_PARAM]
    S = B // W
    prev, nxt = sw[0], sw[1]
    for s in range(S):
        head = B + s
        _dlist.init(prev, nxt, head)
        for x in range(s * W, (s + 1) * W):  # free ways, oldest first in slot order
            _dlist.push_tail(prev, nxt, head, x)
        sw[3][s] = -1
        sw[5][s] = -1


@njit(cache=True)
def victim(sw, pw, g, B, cmax, mark, stamp, slot_pos, pos):  # pragma: no cover - compiled
    W = g[G_PARAM]
    S = B // W
    s = shard_of(pos, S)
    head = B + s
    prev, nxt = sw[0], sw[1]
    if g[G_FLAGS] & FLAG_FILL:  # initial prefix: a free way of the shard, if one is left
        x = nxt[head]
        if x == head or slot_pos[x] >= 0:
            return -1
        _dlist.unlink(prev, nxt, x)
        return x
    x = sw[2][s] if sw[3][s] == stamp else nxt[head]
    while x != head and mark[x] == stamp:
        x = nxt[x]
    if x == head:  # every way of the shard is protected: the miss is not cached
        sw[2][s] = head  # (and the shard's next misses this step need no walk)
        sw[3][s] = stamp
        return -1
    sw[2][s] = nxt[x]
    sw[3][s] = stamp
    _dlist.unlink(prev, nxt, x)
    return x


@njit(cache=True)
def insert(sw, pw, g, B, cmax, slot, pos, nu, stamp):  # pragma: no cover - compiled
    W = g[G_PARAM]
    s = slot // W
    prev, nxt = sw[0], sw[1]
    if sw[5][s] == stamp:  # before the shard's hits, which stay the most recent
        y = sw[4][s]
        a = prev[y]
        nxt[a] = slot
        prev[slot] = a
        nxt[slot] = y
        prev[y] = slot
    else:
        _dlist.push_tail(prev, nxt, B + s, slot)
    sw[6][slot] = 1


@njit(cache=True)
def hits(sw, pw, g, B, cmax, mark, stamp, hit_slots, hit_nu, nh):  # pragma: no cover - compiled
    """Called before the step's misses: each hit shard's hits move, in their old order, to its
    most recent end (the misses are then inserted before them)."""
    W = g[G_PARAM]
    prev, nxt = sw[0], sw[1]
    for i in range(nh):
        s = hit_slots[i] // W
        if sw[5][s] == stamp:
            continue  # shard already done
        head = B + s
        x = nxt[head]
        first = -1
        for _ in range(W):  # the shard's W ways, each visited once
            n = nxt[x]
            if mark[x] == stamp:
                _dlist.unlink(prev, nxt, x)
                _dlist.push_tail(prev, nxt, head, x)
                if first < 0:
                    first = x
            x = n
        sw[4][s] = first
        sw[5][s] = stamp


@njit(cache=True)
def order(sw, pw, g, B, cmax, out):  # pragma: no cover - compiled
    """Shard by shard, each shard's filled ways least recent first."""
    W = g[G_PARAM]
    S = B // W
    n = 0
    for s in range(S):
        head = B + s
        x = sw[1][head]
        while x != head:
            if sw[6][x]:
                out[n] = x
                n += 1
            x = sw[1][x]
    return n
