// Sharded (set-associative) batched LRU on the GPU: SGLang PR #31341's design as the replay
// engine's `salru` policy specifies it, with one shard of B ways being the engine's exact `lru`.
//
// Specification: simulator/replay/policies/salru.py and lru.py through the step loops of
// simulator/replay/step.py; cupy_kernels/sharded_lru_model.py is this file's algorithm in numpy
// (checked against the engine on the CPU in tests/test_sharded_lru_reference.py), and the GPU
// tests compare these kernels with the engine bit for bit.
//
// The algorithm. The buffer's B slots are S = B / W shards of W ways; shard s owns slots
// [s*W, (s+1)*W) and keeps `order`, all W of its ways least recently used first, free ways (never
// filled) at the head in slot order. A step:
//   1. every entry (not padding, not the reserved newest) is looked up: a hit stamps its slot;
//      a miss gets its shard (Knuth hash of the position) and its rank among the step's misses
//      of that shard in stored order (a per-warp histogram, then a prefix over the warps);
//   2. each shard's order is split, stably, into E (unstamped: free or stale) and H (hits);
//      with c = min(misses of the shard, |E|) the shard's new order is E[c:], E[:c], H, and
//      the shard's miss of rank r < c takes slot E[r]; misses of rank >= c are served but not
//      cached (the shard overflowed). One exclusive scan over all B order entries gives every
//      shard's split at once (segment starts subtracted);
//   3. the tables are updated (evicted positions and loaded positions are disjoint sets, so one
//      pass needs no barrier between them).
// Fast path (ctx_len <= B: nothing misses) and the fresh state when leaving it or starting (the
// first B positions, each shard filled in position order, or empty) as in the step loops.
//
// Kernels:
//   replay_sharded_lru  one block per (stream, config): a whole trace replayed in one launch,
//                       state in shared memory, the position table in global memory;
//   swap_in_sharded     one block per request, one decode step of one layer: the same step, the
//                       state in global memory; the missing rows either copied by the block
//                       itself (plan = 0) or written as a copy plan (plan = 1) for
//   copy_plan           (rows.cuh) a full-grid copy of every request's planned rows (zero-copy
//                       16-byte loads from pinned host memory, UNROLL in flight per thread).
#include <climits>

#define THREADS 512
#define WARPS (THREADS / 32)
#define HASH 2654435761u
#ifndef UNROLL
#define UNROLL 4
#endif
#include "rows.cuh"

__device__ __forceinline__ int shard_of(long long p, int S) {
    unsigned h = (unsigned)p * HASH;
    return (S & (S - 1)) == 0 ? (int)(h & (unsigned)(S - 1)) : (int)(h % (unsigned)S);
}

__device__ __forceinline__ unsigned lane_id() { return threadIdx.x & 31; }

struct Smem {
    int* order0;    // [B] each (double buffered): per shard, ways least recent first
    int* order1;
    __device__ __forceinline__ int* order(int i) const { return i ? order1 : order0; }
    int* slot_pos;  // [B]
    int* mark;      // [B] stamp of the step that hit the slot
    int* victim;    // [B] per shard s: E_s[r] at s*W + r
    int* seg;       // [S + 1] unstamped entries of order before shard s's start
    int* nm;        // [S] misses per shard
    int* cnt;       // [WARPS][S] per-warp miss counts, then their exclusive prefix over warps
    int* key;       // [k] per entry: its shard if a miss, else -1
    int* rank;      // [k] its rank within the warp's chunk, then within the shard
    // (the fresh prefix ranks B positions in order1 and victim, free at that time)
    int* epos;      // [k] per entry: the position
    int* eslot;     // [k] per entry: its slot after the step
    int* misc;      // [8]: 0 misses, 1 copies queued, 2 stamp, 3 cur order buffer
    int* s_warp;    // [WARPS]
};

__device__ __forceinline__ Smem carve(int* base, int B, int S, int k) {
    Smem s;
    s.order0 = base;
    s.order1 = s.order0 + B;
    s.slot_pos = s.order1 + B;
    s.mark = s.slot_pos + B;
    s.victim = s.mark + B;
    s.seg = s.victim + B;
    s.nm = s.seg + S + 1;
    s.cnt = s.nm + S;
    s.key = s.cnt + WARPS * S;
    s.rank = s.key + k;
    s.epos = s.rank + k;
    s.eslot = s.epos + k;
    s.misc = s.eslot + k;
    s.s_warp = s.misc + 8;
    return s;
}

// Stable ranks of keys[0, n) within their key (keys in [0, S), -1 skipped): rank[i] = number
// of earlier entries with the same key; nm[s] = entries with key s. Warp w takes the chunk
// [w*CH, (w+1)*CH) in 32-entry rows.
__device__ __forceinline__ void rank_keys(const Smem& s, int* keys, int* ranks, int n, int S) {
    const unsigned lane = lane_id(), warp = threadIdx.x >> 5;
    for (int i = threadIdx.x; i < WARPS * S; i += THREADS) s.cnt[i] = 0;
    __syncthreads();
    const int ch = ((n + WARPS - 1) / WARPS + 31) & ~31;
    int* cnt = s.cnt + warp * S;
    for (int b = warp * ch; b < (int)(warp + 1) * ch && b < n; b += 32) {
        int i = b + lane;
        int key = i < n ? keys[i] : -1;
        unsigned peers = __match_any_sync(0xffffffffu, key);
        int leader = __ffs(peers) - 1;
        int before = 0;
        if (key >= 0 && (int)lane == leader) before = cnt[key];
        before = __shfl_sync(0xffffffffu, before, leader);
        if (key >= 0) {
            ranks[i] = before + __popc(peers & ((1u << lane) - 1));
            if ((int)lane == leader) cnt[key] = before + __popc(peers);
        }
        __syncwarp();
    }
    __syncthreads();
    for (int k = threadIdx.x; k < S; k += THREADS) {
        int run = 0;
        for (int w = 0; w < WARPS; ++w) {
            int t = s.cnt[w * S + k];
            s.cnt[w * S + k] = run;
            run += t;
        }
        s.nm[k] = run;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += THREADS) {
        int key = keys[i];
        if (key >= 0) ranks[i] += s.cnt[(i / ch) * S + key];
    }
    __syncthreads();
}

// Fresh state: clear the held positions from pos_slot, then the first B positions (prefix) or
// nothing (empty). Each shard's ways take its positions in position order; order: the shard's
// free ways (slot order), then its filled ways in fill order.
__device__ __forceinline__ void fresh_state(const Smem& s, int* pos_slot, int B, int W, int S, bool fill) {
    for (int x = threadIdx.x; x < B; x += THREADS) {
        int p = s.slot_pos[x];
        if (p >= 0) pos_slot[p] = -1;
    }
    __syncthreads();
    if (!fill) {
        for (int x = threadIdx.x; x < B; x += THREADS) {
            s.slot_pos[x] = -1;
            s.order0[x] = x;
        }
        if (threadIdx.x == 0) s.misc[3] = 0;
        __syncthreads();
        return;
    }
    int* keys = s.order1;  // free until the first step
    int* ranks = s.victim;
    for (int p = threadIdx.x; p < B; p += THREADS) {
        keys[p] = S == 1 ? 0 : shard_of(p, S);
        s.slot_pos[p] = -1;
    }
    __syncthreads();
    rank_keys(s, keys, ranks, B, S);
    for (int p = threadIdx.x; p < B; p += THREADS) {
        int sh = keys[p], r = ranks[p];
        if (r < W) {
            s.slot_pos[sh * W + r] = p;
            pos_slot[p] = sh * W + r;
        }
    }
    for (int x = threadIdx.x; x < B; x += THREADS) {
        int sh = x / W, i = x - sh * W;
        int c = min(s.nm[sh], W);
        s.order0[x] = sh * W + (i < W - c ? c + i : i - (W - c));
    }
    if (threadIdx.x == 0) s.misc[3] = 0;
    __syncthreads();
}

// One batched step (not on the fast path). Entries idx[0, width); the reserved newest position
// is `newest` (-1: none). Fills s.epos / s.eslot for every entry (eslot: slot, B for the
// reserved newest, -1 padding, -2 a miss served but not cached) and returns the misses.
template <typename PosSlot>
__device__ __forceinline__ int step(const Smem& s, PosSlot pos_slot, const int* idx, int width, long long newest, int B, int W,
                    int S) {
    const int stamp = s.misc[2] + 1;
    // 1. look up
    for (int j = threadIdx.x; j < width; j += THREADS) {
        int p = idx[j];
        int key = -1, slot = -1;
        if (p >= 0) {
            if ((long long)p == newest) {
                slot = B;
            } else {
                slot = pos_slot[p];
                if (slot >= 0)
                    s.mark[slot] = stamp;
                else
                    key = S == 1 ? 0 : shard_of(p, S);
            }
        }
        s.key[j] = key;
        s.epos[j] = p;
        s.eslot[j] = slot;
    }
    __syncthreads();
    rank_keys(s, s.key, s.rank, width, S);
    // 2. split each shard's order: one scan of the unstamped flags over all B entries
    const int cur = s.misc[3];
    const int* ord = s.order(cur);
    int* nxt = s.order(cur ^ 1);
    const int per = (B + THREADS - 1) / THREADS;
    const int i0 = min(B, (int)threadIdx.x * per), i1 = min(B, i0 + per);
    int u = 0;
    for (int i = i0; i < i1; ++i) u += s.mark[ord[i]] != stamp;
    int total;
    int base = block_excl_scan(u, s.s_warp, &total);
    {
        int run = base;
        for (int i = i0; i < i1; ++i) {
            if (i % W == 0) s.seg[i / W] = run;
            run += s.mark[ord[i]] != stamp;
        }
        if (threadIdx.x == 0) s.seg[S] = total;
    }
    __syncthreads();
    {
        int run = base;
        for (int i = i0; i < i1; ++i) {
            int x = ord[i];
            int sh = i / W, a = sh * W;
            int e_before = run - s.seg[sh];
            int ne = s.seg[sh + 1] - s.seg[sh];
            int c = min(s.nm[sh], ne);
            if (s.mark[x] != stamp) {
                nxt[a + (e_before >= c ? e_before - c : ne - c + e_before)] = x;
                if (e_before < c) s.victim[a + e_before] = x;
                ++run;
            } else {
                nxt[a + ne + (i - a - e_before)] = x;
            }
        }
    }
    __syncthreads();
    // 3. tables
    int mine = 0;
    for (int j = threadIdx.x; j < width; j += THREADS) {
        int sh = s.key[j];
        if (sh < 0) continue;
        ++mine;
        int r = s.rank[j];
        int ne = s.seg[sh + 1] - s.seg[sh];
        if (r < min(s.nm[sh], ne)) {
            int v = s.victim[sh * W + r];
            int old = s.slot_pos[v];
            if (old >= 0) pos_slot[old] = -1;
            int p = s.epos[j];
            s.slot_pos[v] = p;
            pos_slot[p] = v;
            s.mark[v] = stamp;
            s.eslot[j] = v;
        } else {
            s.eslot[j] = -2;
        }
    }
    int tot;  // the step's misses: a reduction of the per-thread counts
    block_excl_scan(mine, s.s_warp, &tot);
    if (threadIdx.x == 0) {
        s.misc[2] = stamp;
        s.misc[3] = cur ^ 1;
    }
    __syncthreads();
    return tot;
}

// ------------------------------------------------------------------------------------------
// Whole-trace replay: block b replays stream b % n_streams under config b / n_streams.
// ------------------------------------------------------------------------------------------
extern "C" __global__ void __launch_bounds__(THREADS, 1)
replay_sharded_lru(const int* __restrict__ idx, const long long* __restrict__ ctx, const long long* idx_off,
                   const long long* step_off, const int* steps_of, const int* width_of, int n_streams,
                   const int* cfg_B, const int* cfg_W, const int* cfg_flags, int* pos_slot_all,
                   const long long* pos_off, int* misses_out, long long total_steps, int* slot_pos_out,
                   int* order_out, int* n_order_out, int Bmax, int Smax, int kmax) {
    extern __shared__ int smem[];
    const int b = blockIdx.x;
    const int st = b % n_streams, c = b / n_streams;
    const int B = cfg_B[c], W = cfg_W[c], S = B / W;
    const bool prefix = cfg_flags[c] & 1, reserve = cfg_flags[c] & 2;
    Smem s = carve(smem, B, S, kmax);
    int* pos_slot = pos_slot_all + pos_off[b];
    const int steps = steps_of[st], width = width_of[st];
    const int* sidx = idx + idx_off[st];
    const long long* sctx = ctx + step_off[st];
    int* mout = misses_out + (long long)c * total_steps + step_off[st];
    for (int x = threadIdx.x; x < B; x += THREADS) {
        s.slot_pos[x] = -1;
        s.mark[x] = 0;
        s.order0[x] = x;
    }
    if (threadIdx.x == 0) {
        s.misc[2] = 0;
        s.misc[3] = 0;
    }
    __syncthreads();
    bool started = false, fast = false;
    for (int t = 0; t < steps; ++t) {
        const long long n_ctx = sctx[t];
        if (n_ctx <= B) {
            if (threadIdx.x == 0) mout[t] = 0;
            fast = true;
            continue;
        }
        if (!started || fast) {
            fresh_state(s, pos_slot, B, W, S, prefix || fast);
            started = true;
            fast = false;
        }
        int m = step(s, pos_slot, sidx + (long long)t * width, width, reserve ? n_ctx - 1 : -1, B, W, S);
        if (threadIdx.x == 0) mout[t] = m;
    }
    int* so = slot_pos_out + (long long)b * Bmax;
    int* oo = order_out + (long long)b * Bmax;
    const int* ord = s.order(s.misc[3]);
    for (int x = threadIdx.x; x < B; x += THREADS) so[x] = started ? s.slot_pos[x] : -1;
    if (threadIdx.x == 0) {  // the engine's order: shard by shard, filled ways only
        int n = 0;
        if (started)
            for (int i = 0; i < B; ++i)
                if (s.slot_pos[ord[i]] >= 0) oo[n++] = ord[i];
        n_order_out[b] = n;
    }
}

// ------------------------------------------------------------------------------------------
// Swap-in: one decode step of one layer, block r for request r.
// State per request: slot_pos [B], order [B], pos_slot [C], meta [4] = started, fast, stamp, _.
// Device rows per request: B + 1 + k (slot B: the newest; B + 1 + i: the i-th miss not cached).
// ------------------------------------------------------------------------------------------
extern "C" __global__ void __launch_bounds__(THREADS, 1)
swap_in_sharded(const int* __restrict__ indices, const long long* __restrict__ ctx_len, int width, int B, int W,
                long long C, int k, int prefix, int reserve, int* slot_pos_g, int* order_g, int* pos_slot_g,
                int* meta_g, int* slots_out, int* misses_out, int2* plan, int* plan_n, int plan_mode,
                const unsigned char* __restrict__ host, unsigned char* dev, int row_bytes) {
    extern __shared__ int smem[];
    const int r = blockIdx.x;
    const int S = B / W;
    Smem s = carve(smem, B, S, k);
    int* pos_slot = pos_slot_g + (long long)r * C;
    int* meta = meta_g + 4 * r;
    const long long n_ctx = ctx_len[r];
    const int* idx = indices + (long long)r * width;
    int* sout = slots_out + (long long)r * width;
    const int rows = B + 1 + k;
    if (n_ctx <= B) {  // fast path: the buffer holds the whole context, position p in slot p
        for (int j = threadIdx.x; j < width; j += THREADS) {
            int p = idx[j];
            sout[j] = p < 0 ? -1 : (reserve && p == n_ctx - 1 ? B : p);
        }
        if (threadIdx.x == 0) {
            meta[1] = n_ctx > 0 ? 1 : meta[1];  // an idle request (ctx 0) keeps its state
            misses_out[r] = 0;
            if (plan_mode) plan_n[r] = 0;
        }
        return;
    }
    int started = meta[0], fast = meta[1];
    for (int x = threadIdx.x; x < B; x += THREADS) {
        s.slot_pos[x] = started ? slot_pos_g[(long long)r * B + x] : -1;
        s.order0[x] = started ? order_g[(long long)r * B + x] : x;
        s.mark[x] = 0;
    }
    if (threadIdx.x == 0) {
        s.misc[1] = 0;
        s.misc[2] = 0;
        s.misc[3] = 0;
    }
    __syncthreads();
    if (!started || fast) fresh_state(s, pos_slot, B, W, S, prefix || fast);
    const int m = step(s, pos_slot, idx, width, reserve ? n_ctx - 1 : -1, B, W, S);
    const int* ord = s.order(s.misc[3]);
    for (int x = threadIdx.x; x < B; x += THREADS) {
        slot_pos_g[(long long)r * B + x] = s.slot_pos[x];
        order_g[(long long)r * B + x] = ord[x];
    }
    // slots and the copy list: (host row, device row) per miss, in any order
    int2* mine = plan + (long long)r * k;
    for (int j = threadIdx.x; j < width; j += THREADS) {
        int v = s.eslot[j];
        if (s.key[j] >= 0) {
            int q = atomicAdd(&s.misc[1], 1);
            int dst = v >= 0 ? v : B + 1 + q;
            v = dst;
            mine[q] = make_int2(s.epos[j], dst);
        }
        sout[j] = v;
    }
    __syncthreads();
    const int nq = s.misc[1];
    if (threadIdx.x == 0) {
        meta[0] = 1;
        meta[1] = 0;
        misses_out[r] = m;
        if (plan_mode) plan_n[r] = nq;
    }
    if (plan_mode) return;
    // the block copies its own rows
    copy_rows_block(mine, nq, host + (long long)r * C * row_bytes, dev + (long long)r * rows * row_bytes, row_bytes);
}
