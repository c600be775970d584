// CLOCK multi-step (MTP) swap-in: SGLang PR #32162's commit as the replay engine's `sglang-clock`
// policy specifies it, one block per request, one launch per layer per commit.
//
// Specification: simulator/replay/policies/sglang_clock.py through step.run_placed (group = the
// commit's steps); cupy_kernels/clock_model.py is this file's algorithm in numpy (checked against
// the engine on the CPU in tests/test_clock_swap_reference.py); the GPU tests compare this
// kernel with the engine bit for bit.
//
// A commit takes [S, w] top-k positions (S draft steps), flattened in step order:
//   1. look-up: a resident position stamps its slot (hit; bit 1: read in the last step); a
//      missing one writes INT_MIN + its occurrence index into its pos_slot entry with atomicMin,
//      so the first occurrence wins (dedupe across the draft positions);
//   2. ordinals: a block scan over the occurrences numbers the first occurrences (the engine's
//      miss order); pos_slot then holds INT_MIN + ordinal; a miss read in the last step is
//      admitted; nh = stamped slots;
//   3. victims, e = the new epoch:
//      union path (nm + nh <= B): hits stamped e; miss i samples min(6, share) ring positions
//        congruent to i mod nm (disjoint across misses: one thread per miss) and takes the
//        oldest unstamped one;
//      approximate path: stamps cleared, last-step hits stamped; admitted miss i takes its first
//        unstamped candidate (j = i, i + nm, ... < B, hashed) in rounds: every unresolved miss
//        proposes its first untaken candidate and takes the minimum of its ordinal in `interest`
//        of each untaken candidate; a proposal wins when no earlier miss is interested (the
//        sequential order, exactly; one round when B is a power of two);
//      probes: misses left without a victim walk the stride-2654435761 ring in ordinal order,
//        warp 0, 32 attempts per ballot;
//   4. placement (victims distinct, evicted and loaded positions disjoint), slots recorded, the
//      misses' rows copied from pinned host memory (inline or planned for copy_plan).
// Fast path (the last step's ctx_len <= B) and the fresh state (identity prefix or empty, stamps
// 0, epoch 0, cursor 0) as in the step loop.
#include <climits>

#define THREADS 512
#define WARPS (THREADS / 32)
#define HASHU 2654435761u
#define VICTIM_SAMPLES 6
#ifndef UNROLL
#define UNROLL 4
#endif
#include "rows.cuh"

#define UNRESOLVED (-1)
#define PROBE (-2)
#define SKIP (-3)
#define PROPOSED(c) (-4 - (c))
// occ_slot codes besides a slot (>= 0) and INT_MIN + ordinal (a miss)
#define OCC_MISS (-1)
#define OCC_PAD (-2)
#define OCC_RESERVED (-3)
// flag bits per slot
#define F_HIT 1        // hit in this commit
#define F_LAST 2       // hit in the commit's last step
#define F_TAKEN 4      // stamped with this commit's epoch (the engine's ref == e)
#define F_NEWPOS 8     // a miss was placed here (its old position left)

struct ClockSmem {
    int* flag;      // [B]
    int* interest;  // [B] the rounds' minimum interested ordinal
    int* occ;       // [N] per occurrence: the position (staged from indices)
    int* occ_slot;  // [N] per occurrence: its slot (hit), INT_MIN + ordinal (miss), or OCC_*
    int* miss_pos;  // [N] per ordinal: the position
    int* vplan;     // [N] per ordinal: its victim slot (>= 0) or UNRESOLVED / PROBE / SKIP / PROPOSED
    int* step_m;    // [S] misses counted per step
    int* misc;      // [8]: 2, 3 misses left unresolved after a round (alternating)
    int* s_warp;    // [WARPS]
    unsigned char* adm;  // [N] admitted (read in the last step)
};

__device__ __forceinline__ ClockSmem clock_carve(int* base, int B, int N, int S) {
    ClockSmem s;
    s.flag = base;
    s.interest = s.flag + B;
    s.occ = s.interest + B;
    s.occ_slot = s.occ + N;
    s.miss_pos = s.occ_slot + N;
    s.vplan = s.miss_pos + N;
    s.step_m = s.vplan + N;
    s.misc = s.step_m + S;
    s.s_warp = s.misc + 8;
    s.adm = reinterpret_cast<unsigned char*>(s.s_warp + WARPS);
    return s;
}

__device__ __forceinline__ unsigned ring(unsigned start, unsigned a, int B) {
    return (start + a * HASHU) % (unsigned)B;  // unsigned arithmetic wraps mod 2**32 as the engine's & M32
}

// State per request in global memory: slot_pos [B], ref [B] (epoch stamps), pos_slot [C],
// meta [4] = started, fast, epoch, cursor. A commit reads and writes only the slots it touches
// (hits, sampled and placed slots) except on the approximate path and a fresh start (all B).
extern "C" __global__ void __launch_bounds__(THREADS, 1)
swap_in_clock(const int* __restrict__ indices, const long long* __restrict__ ctx_len, int S, int w, int B,
              long long C, int N, int prefix, int reserve, unsigned mask, int* slot_pos_g, int* ref_g, int* pos_slot_g,
              int* meta_g, int* slots_out, int* misses_out, int2* plan, int* plan_n, int plan_mode,
              const unsigned char* __restrict__ host, unsigned char* dev, int row_bytes) {
    extern __shared__ int smem[];
    const int r = blockIdx.x;
    const int n_occ = S * w;
    ClockSmem s = clock_carve(smem, B, N, S);
    int* pos_slot = pos_slot_g + (long long)r * C;
    int* slot_pos = slot_pos_g + (long long)r * B;
    int* ref = ref_g + (long long)r * B;
    int* meta = meta_g + 4 * r;
    const int* idx = indices + (long long)r * n_occ;
    const long long* ctx = ctx_len + (long long)r * S;
    int* sout = slots_out + (long long)r * n_occ;
    int* mout = misses_out + (long long)r * S;
    const int rows = B + 1 + N;
    const long long ctx_last = ctx[S - 1];
    if (ctx_last <= B) {  // fast path: position p in slot p (an idle request, ctx 0, keeps its state)
        for (int o = threadIdx.x; o < n_occ; o += THREADS) {
            int p = idx[o];
            sout[o] = p < 0 ? -1 : (reserve && p == ctx[o / w] - 1 ? B : p);
        }
        for (int t = threadIdx.x; t < S; t += THREADS) mout[t] = 0;
        if (threadIdx.x == 0) {
            meta[1] = ctx_last > 0 ? 1 : meta[1];
            if (plan_mode) plan_n[r] = 0;
        }
        return;
    }
    const long long first_new = ctx[0] - 1;  // reserved from here on (every step's newest token)
    for (int o = threadIdx.x; o < n_occ; o += THREADS) s.occ[o] = idx[o];
    for (int x = threadIdx.x; x < B; x += THREADS) s.flag[x] = 0;
    for (int t = threadIdx.x; t < S; t += THREADS) s.step_m[t] = 0;
    if (threadIdx.x < 8) s.misc[threadIdx.x] = 0;
    const int started = meta[0], fast = meta[1];
    const bool fresh = !started || fast;
    const int epoch = fresh ? 0 : meta[2];
    const int cursor = fresh ? 0 : meta[3];
    if (fresh) {  // clear the positions held before (the state the fast path left behind), then fill
        if (started)
            for (int x = threadIdx.x; x < B; x += THREADS) {
                int p = slot_pos[x];
                if (p >= 0) pos_slot[p] = -1;
            }
        __syncthreads();
        const bool fill = prefix || fast;
        for (int x = threadIdx.x; x < B; x += THREADS) {
            slot_pos[x] = fill ? x : -1;
            ref[x] = 0;
            if (fill) pos_slot[x] = x;
        }
    }
    __syncthreads();
    // 1. look-up: 4 occurrences per thread in flight
    int new_hits = 0;
    for (int o0 = threadIdx.x; o0 < n_occ; o0 += 4 * THREADS) {
        int p[4], sl[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const int o = o0 + u * THREADS;
            p[u] = o < n_occ ? s.occ[o] : -1;
            const bool live = p[u] >= 0 && !(reserve && p[u] >= first_new);
            sl[u] = live ? pos_slot[p[u]] : (p[u] < 0 ? OCC_PAD : OCC_RESERVED);
            if (!live) p[u] = -1;
        }
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const int o = o0 + u * THREADS;
            if (o >= n_occ) continue;
            if (p[u] < 0) {
                s.occ_slot[o] = sl[u];
            } else if (sl[u] >= 0) {
                const int old = atomicOr(&s.flag[sl[u]], o / w == S - 1 ? F_HIT | F_LAST : F_HIT);
                new_hits += !(old & F_HIT);
                s.occ_slot[o] = sl[u];
            } else {
                atomicMin(&pos_slot[p[u]], INT_MIN + o);
                s.occ_slot[o] = OCC_MISS;
            }
        }
    }
    __syncthreads();
    // 2. ordinals: thread t owns occurrences [t*per, (t+1)*per) (per <= 64)
    const int per = (n_occ + THREADS - 1) / THREADS;
    const int o0 = min(n_occ, (int)threadIdx.x * per), o1 = min(n_occ, o0 + per);
    unsigned long long firsts = 0;
    int cnt = 0;
    for (int o = o0; o < o1; ++o) {
        if (s.occ_slot[o] != OCC_MISS) continue;
        if (pos_slot[s.occ[o]] == INT_MIN + o) {
            firsts |= 1ull << (o - o0);
            ++cnt;
        }
    }
    int nm;
    int q = block_excl_scan(cnt, s.s_warp, &nm);
    for (int o = o0; o < o1; ++o) {
        if (!(firsts >> (o - o0) & 1)) continue;
        const int p = s.occ[o];
        s.miss_pos[q] = p;
        s.adm[q] = 0;
        atomicAdd(&s.step_m[o / w], 1);
        pos_slot[p] = INT_MIN + q;  // from here on: the ordinal
        ++q;
    }
    __syncthreads();
    for (int o = threadIdx.x; o < n_occ; o += THREADS) {  // every miss occurrence learns its ordinal
        if (s.occ_slot[o] != OCC_MISS) continue;
        const int v = pos_slot[s.occ[o]];
        s.occ_slot[o] = v;
        if (o / w == S - 1) s.adm[v - INT_MIN] = 1;  // admitted: read in the last step
    }
    int nh;
    block_excl_scan(new_hits, s.s_warp, &nh);  // (its barriers also publish occ_slot and adm)
    // 3. victims
    int e = (int)(((unsigned)epoch + 1u) & mask);
    if (e == 0) e = 1;
    const bool union_path = nm + nh <= B;
    for (int x = threadIdx.x; x < B; x += THREADS)  // stamped this commit: hits (union) / last-step hits
        if (s.flag[x] & (union_path ? F_HIT : F_LAST)) s.flag[x] |= F_TAKEN;
    if (union_path) {
        __syncthreads();
        for (int i = threadIdx.x; i < nm; i += THREADS) {
            const int share = (B - 1 - i) / nm + 1;
            const int n = min(share, VICTIM_SAMPLES);
            int best = -1;
            unsigned best_age = 0;
            for (int j = 0; j < n; ++j) {
                const int c = (int)(((long long)cursor + i + (long long)(j * share / n) * nm) % B);
                if (s.flag[c] & F_TAKEN) continue;  // the sample sets are disjoint: only hits are stamped here
                const int rc = ref[c];
                if (rc == e) continue;  // an old stamp equal to e after the epoch wrapped: the engine skips it too
                const unsigned age = ((unsigned)e - (unsigned)rc) & mask;
                if (best < 0 || age > best_age) {
                    best = c;
                    best_age = age;
                }
            }
            s.vplan[i] = best >= 0 ? best : PROBE;
        }
        __syncthreads();
        for (int i = threadIdx.x; i < nm; i += THREADS)
            if (s.vplan[i] >= 0) s.flag[s.vplan[i]] |= F_TAKEN;
    } else {
        for (int i = threadIdx.x; i < nm; i += THREADS) s.vplan[i] = s.adm[i] ? UNRESOLVED : SKIP;
        __syncthreads();
        for (int round = 0;; ++round) {
            int* left = &s.misc[2 + (round & 1)];  // two flags: a slow reader of the last round's is never reset under it
            for (int x = threadIdx.x; x < B; x += THREADS) s.interest[x] = INT_MAX;
            if (threadIdx.x == 0) *left = 0;
            __syncthreads();
            for (int i = threadIdx.x; i < nm && i < B; i += THREADS) {
                if (s.vplan[i] != UNRESOLVED) continue;
                int first = -1;
                for (int j = i; j < B; j += nm) {
                    const int c = (int)ring((unsigned)e, (unsigned)j, B);  // (j*HASH + e) mod 2**32 mod B
                    if (s.flag[c] & F_TAKEN) continue;
                    atomicMin(&s.interest[c], i);
                    if (first < 0) first = c;
                }
                s.vplan[i] = first < 0 ? PROBE : PROPOSED(first);
            }
            __syncthreads();
            for (int i = threadIdx.x; i < nm && i < B; i += THREADS) {
                const int v = s.vplan[i];
                if (v > PROPOSED(0)) continue;
                const int c = -4 - v;
                if (s.interest[c] == i) {
                    s.vplan[i] = c;
                    s.flag[c] |= F_TAKEN;
                } else {
                    s.vplan[i] = UNRESOLVED;
                    atomicOr(left, 1);
                }
            }
            __syncthreads();
            if (!*left) break;
        }
        for (int i = B + threadIdx.x; i < nm; i += THREADS)
            if (s.vplan[i] == UNRESOLVED) s.vplan[i] = PROBE;  // no candidate at all
    }
    __syncthreads();
    if (threadIdx.x < 32) {  // probes, in ordinal order, one warp
        const unsigned lane = threadIdx.x;
        for (int b0 = 0; b0 < nm; b0 += 32) {
            const int i0 = b0 + (int)lane;
            unsigned need = __ballot_sync(0xffffffffu, i0 < nm && s.vplan[i0] == PROBE);
            __syncwarp();  // every lane's read of vplan before lane 0 writes it
            while (need) {
                const int i = b0 + __ffs(need) - 1;
                need &= need - 1;
                const unsigned start = ((unsigned)cursor + (unsigned)i * HASHU) % (unsigned)B;
                int got = -1;
                for (int a0 = 0; a0 < B && got < 0; a0 += 32) {
                    const int a = a0 + (int)lane;
                    const int c = a < B ? (int)ring(start, (unsigned)a, B) : 0;
                    const unsigned ok = __ballot_sync(0xffffffffu, a < B && !(s.flag[c] & F_TAKEN) &&
                                                                   !(union_path && ref[c] == e));
                    if (ok) got = __shfl_sync(0xffffffffu, c, __ffs(ok) - 1);
                }
                if (lane == 0) {
                    if (got >= 0) s.flag[got] |= F_TAKEN;
                    s.vplan[i] = got >= 0 ? got : SKIP;
                }
                __syncwarp();
            }
        }
    }
    __syncthreads();
    // 4. the stamps, placement (victims distinct, evicted and loaded positions disjoint)
    for (int x = threadIdx.x; x < B; x += THREADS) {
        const bool taken = s.flag[x] & F_TAKEN;
        if (taken || !union_path) ref[x] = taken ? e : 0;  // the approximate path cleared every stamp
    }
    __syncthreads();  // the flags read above are marked below
    for (int i = threadIdx.x; i < nm; i += THREADS) {
        const int v = s.vplan[i];
        if (v < 0) continue;  // served from scratch, not cached
        const int old = slot_pos[v];
        if (old >= 0) pos_slot[old] = -1;
        const int p = s.miss_pos[i];
        slot_pos[v] = p;
        pos_slot[p] = v;
        s.flag[v] |= F_NEWPOS;
    }
    __syncthreads();
    // 5. the slots after the commit, the copy list, misses not cached back to -1
    for (int o = threadIdx.x; o < n_occ; o += THREADS) {
        const int c = s.occ_slot[o];
        int v;
        if (c == OCC_PAD) v = -1;
        else if (c == OCC_RESERVED) v = B;
        else if (c >= 0) v = (s.flag[c] & F_NEWPOS) ? -1 : c;  // a hit whose slot took a miss: evicted
        else {
            const int i = c - INT_MIN;
            v = s.vplan[i] >= 0 ? s.vplan[i] : B + 1 + i;  // a miss: its slot, or its scratch row
        }
        sout[o] = v;
    }
    int2* mine = plan + (long long)r * N;
    for (int i = threadIdx.x; i < nm; i += THREADS) {
        const int v = s.vplan[i];
        mine[i] = make_int2(s.miss_pos[i], v >= 0 ? v : B + 1 + i);
        if (v < 0) pos_slot[s.miss_pos[i]] = -1;
    }
    for (int t = threadIdx.x; t < S; t += THREADS) mout[t] = s.step_m[t];
    if (threadIdx.x == 0) {
        meta[0] = 1;
        meta[1] = 0;
        meta[2] = e;
        meta[3] = nm > 0 ? (int)(((long long)cursor + min(nm, B)) % B) : cursor;
        if (plan_mode) plan_n[r] = nm;
    }
    if (plan_mode) return;
    __syncthreads();
    copy_rows_block(mine, nm, host + (long long)r * C * row_bytes, dev + (long long)r * rows * row_bytes, row_bytes);
}
