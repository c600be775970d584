// HiSparse swap-in for one layer and a batch of requests (CuPy RawModule, cooperative launch).
//
// Semantics: the replay engine's `lru` policy, batched (simulator/replay/engine.py and
// policies/lru.py are the specification; the GPU tests compare against them bit for bit).
// Per (layer, request) state, owned by cupy_kernels/swap_in.py:HotBuffer:
//   slot_pos [B]  position held by each slot (-1 free)      pos_slot [C]  inverse map (-1 absent)
//   order    [B]  occupied slots, least recently used first   meta [4]     n_used, started, fast, filled
// `filled`: slots [0, filled) physically hold rows [0, filled) (fast path / prefix data).
//
// One launch, no grid barrier:
//   A. bookkeeping, one block per request (its owner): hits, misses, victims, new order, tables,
//      slot outputs, and the request's (host row, device row) copies written to the request's own
//      segment of the copy list; the owner then publishes (launch epoch, copy count) in one 64-bit
//      release store;
//   B. copy, in one of four orders (argument `flat`: 1 flat, 0 per request, 2 hybrid, 3 early):
//      flat: once every request's word is published (the grid's only wait), the whole
//        grid copies the segments as one list in request order, grid-stride;
//      per request: request r's rows are copied by its owner and, when the grid has more blocks
//        than requests, by the blocks b = r + R, r + 2R, ..., which wait for r's word alone;
//      hybrid: flat, except that a request of at most one pass of rows (SELF_CHUNKS) is copied
//        by its owner right after its bookkeeping and skipped by the flat phase;
//      early (3, the default): the copy starts before the bookkeeping ends. Once its misses are ranked the
//        owner publishes their sources (a second word per request, `ready[R + r]`); a request of
//        at most one pass of rows is loaded by its owner into registers right then and stored
//        once its slots are chosen (no other block waits for it); the others are prefetched by
//        the whole grid (first pass, flat order) while their owners choose victims, and stored
//        once the final words are published. Requests count with a parallel prefix.
//      Either way the rows are cut into 16-byte chunks, UNROLL zero-copy loads (ld.global.nc)
//      in flight per thread before the stores.
// The launch is cooperative only so that all blocks are resident together (a helper spinning on
// a word must not keep the owner from being scheduled).
// Programmatic dependent launch (optional, swap_in.py): everything before griddepcontrol.wait
// reads only this layer's tables (meta, and order and slot_pos by cp.async into shared memory),
// so it may overlap the kernel before it in the stream, which must not write this layer's tables.
// Duplicate check: a bitmap of max_ctx bits in shared memory (dup_words > 0), else a hash table.
#include <climits>

#include "host_load.cuh"

#ifndef UNROLL
#define UNROLL 4
#endif
#ifndef STOP_AFTER  // timing breakdowns only: end the bookkeeping after phase STOP_AFTER (0..6)
#define STOP_AFTER 99
#endif
#define PHASE_END(n)                                  \
    if (STOP_AFTER <= (n)) {                          \
        if (threadIdx.x == 0) s_sc[SC_NCOPY] = 0;     \
        return;                                       \
    }
#ifndef MAX_REGS  // 0: registers as the launch bounds allow (128 at 1 block of 512 per SM)
#define MAX_REGS 0
#endif
#ifndef MIN_BLOCKS  // resident blocks per SM the register budget is cut for (launch bounds)
#define MIN_BLOCKS 1
#endif
#ifndef STEP_BATCH  // step entries per thread loaded, then looked up, before any is used (k 2048: all)
#define STEP_BATCH 4
#endif
#define THREADS 512
#define WARPS (THREADS / 32)
#define SELF_CHUNKS (THREADS * UNROLL)       // a request this small is copied by its owner block
#define SELF_COPIED 0x80000000ull           // flag in a published word's count

enum { ERR_NONE = 0, ERR_CTX = 1, ERR_POS = 2, ERR_PAD = 3, ERR_DUP = 4 };
enum {  // per-request scalars in shared memory
    SC_MINLOAD, SC_NLOAD, SC_PCOUNT, SC_DUP, SC_NCOPY, SC_EARLY, SC_SELF, SC_N
};
enum { ORDER_REQUEST = 0, ORDER_FLAT = 1, ORDER_HYBRID = 2, ORDER_EARLY = 3 };

struct Smem {
    int* idx;       // [k]  the step's positions
    int* res;       // [k]  per entry: its slot (hit: before the step; miss: once assigned), -1
    int* miss_j;    // [k]  i-th miss (stored order) -> its entry    } together: the hash table
    int* victim;    // [k]  i-th evictable slot (LRU first)         } of the duplicate check
    int* order;     // [B]  old recency order
    int* slotpos;   // [B]  old slot -> position
    unsigned* ballot;
    unsigned* dupbm;     // [dup_words] duplicate-check bitmap of positions (empty if dup_words 0)
    unsigned char* hit;  // [B] 0 stale, 1 hit, 2 loaded this step
};

__device__ __forceinline__ Smem carve(unsigned char* base, int k, int B, int dup_words) {
    Smem s;
    int nb = (max(B, k) + 31) / 32 + WARPS;
    s.idx = reinterpret_cast<int*>(base);
    s.res = s.idx + k;
    s.miss_j = s.res + k;
    s.victim = s.miss_j + k;
    s.order = s.victim + k;
    s.slotpos = s.order + B;
    s.ballot = reinterpret_cast<unsigned*>(s.slotpos + B);
    s.dupbm = s.ballot + nb;
    s.hit = reinterpret_cast<unsigned char*>(s.dupbm + dup_words);
    return s;
}

// Exclusive ranks of the flagged items among 0..n-1, in index order. Each warp owns a contiguous
// segment; pass 1 stores one ballot per 32 items, pass 2 emits (i, rank, flagged, total).
template <class Flag, class Emit>
__device__ __forceinline__ int block_rank(int n, unsigned* s_ballot, int* s_warp, Flag flag, Emit emit) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int seg = ((n + WARPS - 1) / WARPS + 31) & ~31;
    const int start = warp * seg, end = min(n, start + seg);
    int cnt = 0;
    for (int base = start; base < end; base += 32) {
        const int i = base + lane;
        const unsigned b = __ballot_sync(0xffffffffu, i < end && flag(i));
        if (lane == 0) s_ballot[base >> 5] = b;
        cnt += __popc(b);
    }
    if (lane == 0) s_warp[warp] = cnt;
    __syncthreads();
    if (warp == 0) {
        const int v = lane < WARPS ? s_warp[lane] : 0;
        int incl = v;
        for (int d = 1; d < 32; d <<= 1) {
            const int u = __shfl_up_sync(0xffffffffu, incl, d);
            if (lane >= d) incl += u;
        }
        __syncwarp();
        if (lane < WARPS) s_warp[lane] = incl - v;
        if (lane == 31) s_warp[WARPS] = incl;
    }
    __syncthreads();
    const int total = s_warp[WARPS];
    int run = s_warp[warp];
    const unsigned lt = (1u << lane) - 1u;
    for (int base = start; base < end; base += 32) {
        const unsigned b = s_ballot[base >> 5];
        const int i = base + lane;
        if (i < end) emit(i, run + __popc(b & lt), (b >> lane) & 1u, total);
        run += __popc(b);
    }
    __syncthreads();  // s_warp / s_ballot free for the next call
    return total;
}

__device__ __forceinline__ void st_release(unsigned long long* p, unsigned long long v) {
    asm volatile("st.release.gpu.global.b64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ unsigned long long ld_acquire(const unsigned long long* p) {
    unsigned long long v;
    asm volatile("ld.acquire.gpu.global.b64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

// 4 bytes global -> shared without a register (sm_80+); cp_async_wait_all waits for this
// thread's (a barrier after it makes them visible to the block).
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(d), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }

__device__ __forceinline__ void st_relaxed(unsigned long long* p, unsigned long long v) {
    asm volatile("st.relaxed.gpu.global.b64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
// Programmatic dependent launch: wait for the kernel before this one (a no-op without PDL), and
// let the next kernel's blocks be scheduled.
__device__ __forceinline__ void grid_dependency_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void allow_dependents() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

struct Args {
    const int* indices;
    const long long* ctx_len;
    int* slot_pos;
    int* order;
    int* pos_slot;
    int* meta;
    int* slots_out;
    int* misses_out;
    int* errors;
    int2* copy_list;
    unsigned long long* ready;  // [2R]: final words, then early words (ORDER_EARLY)
    const unsigned char* host;
    unsigned char* dev;
    int R, k, B;
    long long C;
    int prefix, load_newest, global_rows, seg;
    int row_bytes, order_mode, do_copy, dup_words;
    unsigned epoch;
};

__device__ void write_outputs_idle(const Args& a, int r, int err, int errj, int* s_sc) {
    for (int j = threadIdx.x; j < a.k; j += THREADS) a.slots_out[(size_t)r * a.k + j] = -1;
    if (threadIdx.x == 0) {
        s_sc[SC_NCOPY] = 0;
        a.misses_out[r] = 0;
        a.errors[2 * r] = err;
        a.errors[2 * r + 1] = errj;
    }
}

// Short-sequence fast path: position p lives in slot p; rows [filled, newest) are brought in
// (the context before the newest token; no misses are counted), the newest goes to slot B.
__device__ void fast_path(const Args& a, int r, int newest, int4 m, int* s_sc) {
    const int B = a.B;
    const int from = m.w, nrange = max(0, newest - from);
    const int ncopy = nrange + (a.load_newest ? 1 : 0);
    __syncthreads();  // every read of s_sc done before it is written
    if (threadIdx.x == 0) {
        s_sc[SC_NCOPY] = ncopy;
        a.misses_out[r] = 0;
        a.errors[2 * r] = ERR_NONE;
        a.errors[2 * r + 1] = -1;
        *reinterpret_cast<int4*>(a.meta + 4 * r) = make_int4(m.x, m.y, 1, max(m.w, newest));
    }
    const int base = r * a.seg;
    const int rc = r * (int)a.C, rd = r * (B + 1);
    for (int i = threadIdx.x; i < nrange; i += THREADS)
        a.copy_list[base + i] = make_int2(rc + from + i, rd + from + i);
    if (a.load_newest && threadIdx.x == 0) a.copy_list[base + nrange] = make_int2(rc + newest, rd + B);
}

// Positions of a step must be distinct (as in the trace format). Duplicate check, hash form: an
// open-addressing table of `size` ints (filled with -1 first); the smallest repeated position is
// reported. (The bitmap form, one bit per position, is inline in book_request.)
__device__ __forceinline__ void dup_insert(int* table, unsigned size, int p, int* s_sc) {
    unsigned h = ((unsigned)p * 2654435761u) % size;
    while (true) {
        const int old = atomicCAS(table + h, -1, p);
        if (old == -1) break;
        if (old == p) {
            atomicMin(&s_sc[SC_DUP], p);
            break;
        }
        h = h + 1 == size ? 0 : h + 1;
    }
}

__device__ void book_request(const Args& a, int r, const Smem& s, int* s_sc, int* s_warp, int* s_red,
                             bool wait_first) {
    const int tid = threadIdx.x, B = a.B, k = a.k;
    const long long C = a.C;
    int* pos_slot = a.pos_slot + (size_t)r * C;
    int* slot_pos = a.slot_pos + (size_t)r * B;
    int* order = a.order + (size_t)r * B;

    if (tid == 0) {  // (the previous request's reads of s_sc ended at the caller's barrier)
        s_sc[SC_MINLOAD] = INT_MAX;  // smallest slot loaded this step
        s_sc[SC_NLOAD] = 0;        // slots loaded in the fresh-prefix range
        s_sc[SC_PCOUNT] = 0;       // prefix copies appended
        s_sc[SC_DUP] = INT_MAX;    // smallest repeated position
        s_sc[SC_EARLY] = 0;        // early word published (ORDER_EARLY)
        s_sc[SC_SELF] = 0;         // rows loaded and stored by this block (ORDER_EARLY)
    }
    PHASE_END(0)  // timing: the launch and the publishing alone
    // Phase 1, every global load in as few dependent round trips as the PDL contract allows:
    // (this layer's tables; then, after the grid-dependency wait, the step and ctx_len) -> the
    // hit lookup. Each batch of loads is issued before any of its values is used (the loop
    // that loaded an entry's position, looked it up and stored both paid two round trips per
    // entry: 8 at k 2048).
    const int4 m = *reinterpret_cast<const int4*>(a.meta + 4 * r);  // n_used, started, fast, filled
    // the tables straight into shared memory (cp.async: in flight without holding registers)
    for (int i = tid; i < B; i += THREADS) {
        cp_async4(s.order + i, order + i);
        cp_async4(s.slotpos + i, slot_pos + i);
    }
    if (wait_first) {
        grid_dependency_wait();
        allow_dependents();
    }
    const long long ctx = a.ctx_len[r];
    int pj[STEP_BATCH];  // this thread's first STEP_BATCH entries
#pragma unroll
    for (int u = 0; u < STEP_BATCH; ++u) {
        const int j = tid + u * THREADS;
        pj[u] = j < k ? a.indices[(size_t)r * k + j] : -1;
    }
    for (int i = tid; i < B; i += THREADS) s.hit[i] = 0;
    // the duplicate check's table: cleared before any entry goes in (the barrier below)
    for (int i = tid; i < a.dup_words; i += THREADS) s.dupbm[i] = 0u;
    if (!a.dup_words)
        for (int i = tid; i < 2 * k; i += THREADS) s.miss_j[i] = -1;  // miss_j and victim: 2k ints
    cp_async_wait_all();
    __syncthreads();
    // The hit lookup (it does not wait for ctx_len: the newest, never a hit, is cleared after;
    // positions >= ctx_len are an error; a step that resets the tables looks its hits up again
    // below), the duplicate check while the lookups are in flight, then the entries' scans:
    // first padding entry, last real entry, first entry out of [0, ctx): warp reductions, then
    // one value per warp in s_red (no same-address shared atomics).
    // The duplicate check takes every entry >= 0, not only those before the first padding: it
    // differs only where a real entry follows the padding, an error reported before duplicates.
    int w_len = k, w_last = -1, w_bad = k;
    auto scan_entries = [&](int j, int p, int sl) {
        s.idx[j] = p;
        s.res[j] = p == ctx - 1 ? -1 : sl;  // newest: never a hit
        if (p < 0) {
            w_len = min(w_len, j);
        } else {
            w_last = max(w_last, j);
            if (p >= ctx) w_bad = min(w_bad, j);
        }
    };
    auto dup_entry = [&](int p) {
        if (a.dup_words) {
            if (p >= 0 && p < C) {
                const unsigned bit = 1u << (p & 31);
                if (atomicOr(s.dupbm + (p >> 5), bit) & bit) atomicMin(&s_sc[SC_DUP], p);
            }
        } else if (p >= 0) {
            dup_insert(s.miss_j, 2u * (unsigned)k, p, s_sc);
        }
    };
    {
        int sl[STEP_BATCH];
#pragma unroll
        for (int u = 0; u < STEP_BATCH; ++u) {
            const int p = pj[u];
            sl[u] = (p >= 0 && p < C) ? __ldcg(pos_slot + p) : -1;
        }
#pragma unroll
        for (int u = 0; u < STEP_BATCH; ++u) dup_entry(pj[u]);
#pragma unroll
        for (int u = 0; u < STEP_BATCH; ++u) {
            const int j = tid + u * THREADS;
            if (j < k) scan_entries(j, pj[u], sl[u]);
        }
    }
    for (int j = tid + STEP_BATCH * THREADS; j < k; j += THREADS) {  // k > STEP_BATCH x THREADS
        const int p = a.indices[(size_t)r * k + j];
        const int sl = (p >= 0 && p < C) ? __ldcg(pos_slot + p) : -1;
        dup_entry(p);
        scan_entries(j, p, sl);
    }
    w_len = __reduce_min_sync(0xffffffffu, w_len);
    w_last = __reduce_max_sync(0xffffffffu, w_last);
    w_bad = __reduce_min_sync(0xffffffffu, w_bad);
    if ((tid & 31) == 0) {
        s_red[3 * (tid >> 5)] = w_len;
        s_red[3 * (tid >> 5) + 1] = w_last;
        s_red[3 * (tid >> 5) + 2] = w_bad;
    }
    __syncthreads();
    int len = k, last = -1, bad = k;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) {
        len = min(len, s_red[3 * w]);
        last = max(last, s_red[3 * w + 1]);
        bad = min(bad, s_red[3 * w + 2]);
    }
    PHASE_END(1)
    PHASE_END(2)  // (the duplicate check is part of phase 1 now)
    const int dup = s_sc[SC_DUP];
    if (ctx < 0 || ctx > C) return write_outputs_idle(a, r, ERR_CTX, -1, s_sc);
    if (bad < k) return write_outputs_idle(a, r, ERR_POS, bad, s_sc);
    if (last > len) return write_outputs_idle(a, r, ERR_PAD, len, s_sc);
    if (dup != INT_MAX) return write_outputs_idle(a, r, ERR_DUP, dup, s_sc);
    if (ctx == 0) return write_outputs_idle(a, r, ERR_NONE, -1, s_sc);  // idle request this step

    const int newest = (int)(ctx - 1);
    const int rbase = a.global_rows ? r * (B + 1) : 0;
    if (ctx <= B) {
        for (int j = tid; j < k; j += THREADS) {
            const int p = s.idx[j];
            a.slots_out[(size_t)r * k + j] = j >= len ? -1 : (p == newest ? B : p) + rbase;
        }
        return fast_path(a, r, newest, m, s_sc);
    }

    // ---- first long step, or leaving the fast path: fresh prefix (or empty) state -------------
    const bool reset = !m.y || m.z;
    const bool load_prefix = reset && (a.prefix || m.z);
    int n_used = m.x;
    if (reset) {
        for (int i = tid; i < B; i += THREADS) {
            const int q = s.slotpos[i];
            if (q >= 0) pos_slot[q] = -1;
        }
        __syncthreads();
        for (int i = tid; i < B; i += THREADS) {
            const int q = load_prefix ? i : -1;
            slot_pos[i] = q;
            s.slotpos[i] = q;
            if (load_prefix) {
                pos_slot[i] = i;
                s.order[i] = i;
            }
        }
        n_used = load_prefix ? B : 0;
        __syncthreads();
    }

    // ---- hits (protected) and the misses' ranks ------------------------------------------------
    // A reset step looks its hits up again first; otherwise phase 1's lookup stands and the hits
    // are marked inside the miss ranking's first pass (its barriers order the marks).
    if (reset) {
        for (int j = tid; j < len; j += THREADS) {
            const int p = s.idx[j];
            const int sl = p == newest ? -1 : __ldcg(pos_slot + p);
            s.res[j] = sl;
        }
        __syncthreads();
    }
    PHASE_END(3)
    const int n_miss = block_rank(
        len, s.ballot, s_warp,
        [&](int j) {
            const int sl = s.res[j];
            if (sl >= 0) s.hit[sl] = 1;
            return sl < 0 && s.idx[j] != newest;
        },
        [&](int j, int rank, bool f, int) {
            if (f) s.miss_j[rank] = j;
        });
    PHASE_END(4)
    const int n_free = B - n_used;
    const int n_from_free = min(n_miss, n_free);
    const int n_victims = n_miss - n_from_free;
    const int n_head = n_miss + (a.load_newest ? 1 : 0);  // misses + newest, then prefix rows
    const int base = r * a.seg;
    const int rc = r * (int)C, rd = r * (B + 1);

    // ---- early order: the copy starts now (sources are known; slots are chosen below) --------
    const unsigned cpr = (unsigned)a.row_bytes >> 4;
    const bool self = a.order_mode == ORDER_EARLY && a.do_copy && !load_prefix &&
                      (unsigned)n_head * cpr <= SELF_CHUNKS;
    uint4 pv[UNROLL];  // self: this thread's chunks (c = tid + u * THREADS), in flight meanwhile
    if (self) {
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const unsigned c = tid + u * THREADS;
            if (c < (unsigned)n_head * cpr) {
                const unsigned e = c / cpr, off = (c - e * cpr) << 4;
                const int p = (int)e < n_miss ? s.idx[s.miss_j[e]] : newest;
                pv[u] = ld_host(a.host + (size_t)(rc + p) * a.row_bytes + off);
            }
        }
        if (tid == 0) {  // nothing for other blocks: count 0, no data to release
            st_relaxed(a.ready + a.R + r, (unsigned long long)a.epoch << 32);
            s_sc[SC_EARLY] = 1;
            s_sc[SC_SELF] = 1;
        }
    } else if (a.order_mode == ORDER_EARLY) {
        int* src = reinterpret_cast<int*>(a.copy_list);
        for (int i = tid; i < n_miss; i += THREADS) src[2 * (base + i)] = rc + s.idx[s.miss_j[i]];
        if (tid == 0 && a.load_newest) src[2 * (base + n_miss)] = rc + newest;
        __syncthreads();  // every source written before the release
        if (tid == 0) {
            __threadfence();
            st_release(a.ready + a.R + r, ((unsigned long long)a.epoch << 32) | (unsigned)n_head);
            s_sc[SC_EARLY] = 1;
        }
    }

    // ---- new recency order: stale (old order), loaded misses (stored order), hits (old order) --
    const int n_nonhit = block_rank(
        n_used, s.ballot, s_warp, [&](int i) { return s.hit[s.order[i]] == 0; },
        [&](int i, int rank, bool f, int total) {
            const int sl = s.order[i];
            if (f) {
                if (rank < n_victims)
                    s.victim[rank] = sl;
                else
                    order[rank - n_victims] = sl;
            } else {
                order[total - n_victims + n_miss + (i - rank)] = sl;
            }
        });
    const int n_stale = n_nonhit - n_victims;
    PHASE_END(5)

    // ---- misses take free slots first, then the LRU evictable slots ---------------------------
    const int filled = load_prefix ? B : m.w;
    int w_min = INT_MAX, w_nload = 0;
    for (int i = tid; i < n_miss; i += THREADS) {
        const int j = s.miss_j[i];
        const int p = s.idx[j];
        const int v = i < n_from_free ? n_used + i : s.victim[i - n_from_free];
        if (i >= n_from_free) pos_slot[s.slotpos[v]] = -1;
        pos_slot[p] = v;
        slot_pos[v] = p;
        order[n_stale + i] = v;
        s.res[j] = v;
        s.hit[v] = 2;
        w_min = min(w_min, v);
        if (load_prefix && v >= m.w) ++w_nload;
    }
    w_min = __reduce_min_sync(0xffffffffu, w_min);
    w_nload = __reduce_add_sync(0xffffffffu, w_nload);
    if ((tid & 31) == 0) {
        if (w_min != INT_MAX) atomicMin(&s_sc[SC_MINLOAD], w_min);
        if (w_nload) atomicAdd(&s_sc[SC_NLOAD], w_nload);
    }
    __syncthreads();
    PHASE_END(6)
    // early order: the sources are out already (other blocks may be reading them): slots only
    const bool early_src = a.order_mode == ORDER_EARLY && !self;
    int* cl = reinterpret_cast<int*>(a.copy_list);
    for (int i = tid; i < n_miss; i += THREADS) {
        const int j = s.miss_j[i];
        if (early_src) cl[2 * (base + i) + 1] = rd + s.res[j];
        else a.copy_list[base + i] = make_int2(rc + s.idx[j], rd + s.res[j]);
    }
    if (tid == 0) {
        if (a.load_newest) {
            if (early_src) cl[2 * (base + n_miss) + 1] = rd + B;
            else a.copy_list[base + n_miss] = make_int2(rc + newest, rd + B);
        }
        a.misses_out[r] = n_miss;
        a.errors[2 * r] = ERR_NONE;
        a.errors[2 * r + 1] = -1;
        const int new_filled = min(filled, s_sc[SC_MINLOAD]);
        *reinterpret_cast<int4*>(a.meta + 4 * r) = make_int4(n_used + n_from_free, 1, 0, new_filled);
        // rows [m.w, B) of a fresh prefix that no miss overwrote
        const int n_pre = load_prefix ? max(0, B - m.w) - s_sc[SC_NLOAD] : 0;
        s_sc[SC_NCOPY] = n_head + n_pre;
    }
    if (load_prefix) {
        const int pbase = base + n_head;
        for (int i = m.w + tid; i < B; i += THREADS)
            if (s.hit[i] != 2) a.copy_list[pbase + atomicAdd(&s_sc[SC_PCOUNT], 1)] = make_int2(rc + i, rd + i);
    }

    // ---- where attention reads each entry -----------------------------------------------------
    for (int j = tid; j < k; j += THREADS) {
        int out = -1;
        if (j < len) out = (s.idx[j] == newest ? B : s.res[j]) + rbase;
        a.slots_out[(size_t)r * k + j] = out;
    }
    // self: the rows loaded after the miss ranking, into their slots, last (the writes above go
    // out while the rows are still arriving)
    if (self) {
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const unsigned c = tid + u * THREADS;
            if (c < (unsigned)n_head * cpr) {
                const unsigned e = c / cpr, off = (c - e * cpr) << 4;
                const int sl = (int)e < n_miss ? s.res[s.miss_j[e]] : B;
                *reinterpret_cast<uint4*>(a.dev + (size_t)(rd + sl) * a.row_bytes + off) = pv[u];
            }
        }
    }
}

// The copy loop every order shares: chunks first, first + T, ... below end, UNROLL zero-copy
// loads in flight per thread before the stores. locate(c, off) returns chunk c's copy-list entry
// (host row, device row) and sets the chunk's byte offset in the row.
template <class Locate>
__device__ __forceinline__ void copy_chunks(unsigned first, unsigned end, unsigned T,
                                            const unsigned char* __restrict__ host,
                                            unsigned char* __restrict__ dev, int row_bytes, Locate locate) {
    for (unsigned c0 = first; c0 < end; c0 += T * UNROLL) {
        uint4 v[UNROLL];
        unsigned char* dst[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const unsigned c = c0 + u * T;
            dst[u] = nullptr;
            if (c < end) {
                unsigned off;
                const int2 ent = locate(c, off);
                dst[u] = dev + (size_t)ent.y * row_bytes + off;
                v[u] = ld_host(host + (size_t)ent.x * row_bytes + off);
            }
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u)
            if (dst[u]) *reinterpret_cast<uint4*>(dst[u]) = v[u];
    }
}

// Last request whose segment starts at or before chunk c (pre: exclusive prefix, R entries).
__device__ __forceinline__ int find_request(const int* pre, int R, unsigned c) {
    int lo = 0, hi = R - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if ((unsigned)pre[mid] <= c) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

// Chunk c of the requests' segments laid end to end in request order (pre: exclusive prefix of
// their chunk counts): its copy-list entry, and its byte offset in the row in off.
__device__ __forceinline__ int2 flat_entry(const Args& a, const int* pre, int R, unsigned cpr, unsigned c,
                                           unsigned& off) {
    const int lo = find_request(pre, R, c);
    const unsigned in = c - (unsigned)pre[lo], e = in / cpr;
    off = (in - e * cpr) << 4;
    return __ldcg(a.copy_list + (size_t)lo * a.seg + e);
}

// Copy part `part` of `parts` of request r's segment (n rows).
__device__ void copy_segment(const Args& a, int r, unsigned n, int part, int parts,
                             const unsigned char* __restrict__ host, unsigned char* __restrict__ dev,
                             int row_bytes) {
    const int2* list = a.copy_list + (size_t)r * a.seg;
    const unsigned cpr = (unsigned)row_bytes >> 4;
    copy_chunks((unsigned)part * THREADS + threadIdx.x, n * cpr, (unsigned)parts * THREADS, host, dev, row_bytes,
                [&](unsigned c, unsigned& off) {
                    const unsigned e = c / cpr;
                    off = (c - e * cpr) << 4;
                    return __ldcg(list + e);
                });
}

// Copy this block's share (part `part` of `parts`) of request r's segment, once its owner has
// published it for this launch.
__device__ void copy_request(const Args& a, int r, int part, int parts, const unsigned long long* ready,
                             unsigned epoch, const unsigned char* __restrict__ host,
                             unsigned char* __restrict__ dev, int row_bytes, int* s_cnt) {
    if (threadIdx.x == 0) {
        unsigned long long w = ld_acquire(ready + r);
        while ((unsigned)(w >> 32) != epoch) {
            __nanosleep(32);
            w = ld_acquire(ready + r);
        }
        *s_cnt = (int)(unsigned)(w & 0x7fffffffu);
    }
    __syncthreads();
    const unsigned n = (unsigned)*s_cnt;
    __syncthreads();  // s_cnt free for the next request
    copy_segment(a, r, n, part, parts, host, dev, row_bytes);
}

// Flat order: once every request is published, the whole grid copies the requests' segments as
// one list in request order (grid-stride), so at any time the copies touch the host rows of a
// few requests only.  Requests marked SELF_COPIED (a few rows, copied by their owner right after
// their bookkeeping) count as empty.  cnt / pre: R and R + 1 ints of shared memory (the bookkeeping's arrays).
__device__ void copy_flat(const Args& a, const unsigned long long* ready, unsigned epoch,
                          const unsigned char* __restrict__ host, unsigned char* __restrict__ dev,
                          int row_bytes, int* cnt, int* pre) {
    const int R = a.R;
    for (;;) {
        int ok = 1;
        for (int i = threadIdx.x; i < R; i += THREADS) {
            const unsigned long long w = ld_acquire(ready + i);
            if ((unsigned)(w >> 32) != epoch) ok = 0;
            else cnt[i] = (w & SELF_COPIED) ? 0 : (int)(unsigned)(w & 0x7fffffffu);
        }
        if (__syncthreads_and(ok)) break;
        __nanosleep(64);
    }
    const unsigned cpr = (unsigned)row_bytes >> 4;
    if (threadIdx.x == 0) {  // exclusive prefix of chunk counts (R is small: a serial pass)
        unsigned run = 0;
        for (int i = 0; i < R; ++i) {
            pre[i] = (int)run;
            run += (unsigned)cnt[i] * cpr;
        }
        pre[R] = (int)run;
    }
    __syncthreads();
    copy_chunks(blockIdx.x * THREADS + threadIdx.x, (unsigned)pre[R], gridDim.x * THREADS, host, dev, row_bytes,
                [&](unsigned c, unsigned& off) { return flat_entry(a, pre, R, cpr, c, off); });
}

// Early order's helpers. Exclusive prefix (times cpr) of R counts in place, total in v[R]: one
// warp, 32 counts per step.
__device__ void scan_chunks(int* v, int R, unsigned cpr) {
    if (threadIdx.x < 32) {
        const int lane = threadIdx.x;
        unsigned carry = 0;
        for (int base = 0; base < R; base += 32) {
            const int i = base + lane;
            const unsigned x = i < R ? (unsigned)v[i] * cpr : 0u;
            unsigned incl = x;
#pragma unroll
            for (int d = 1; d < 32; d <<= 1) {
                const unsigned y = __shfl_up_sync(0xffffffffu, incl, d);
                if (lane >= d) incl += y;
            }
            if (i < R) v[i] = (int)(carry + incl - x);
            carry += __shfl_sync(0xffffffffu, incl, 31);
        }
        if (lane == 0) v[R] = (int)carry;
    }
    __syncthreads();
}

// Early order's copy (every block, after its own bookkeeping). The early words give each
// request's sources (misses + newest, or a fast path's whole list); their first pass, flat in
// request order, is loaded at once and stored when the final words give the slots; then the
// rest of the early entries, then the entries only the final words add (fresh-prefix rows).
// pre_e / pre_x: R + 1 ints of shared memory each (the bookkeeping's B-slot arrays).
__device__ void copy_flat_early(const Args& a, int* pre_e, int* pre_x) {
    const int R = a.R;
    const unsigned cpr = (unsigned)a.row_bytes >> 4;
    const int* cl = reinterpret_cast<const int*>(a.copy_list);
    for (;;) {
        int ok = 1;
        for (int i = threadIdx.x; i < R; i += THREADS) {
            const unsigned long long w = ld_acquire(a.ready + R + i);
            if ((unsigned)(w >> 32) != a.epoch) ok = 0;
            else pre_e[i] = (int)(unsigned)(w & 0x7fffffffu);
        }
        if (__syncthreads_and(ok)) break;
        __nanosleep(64);
    }
    scan_chunks(pre_e, R, cpr);
    const unsigned chunks = (unsigned)pre_e[R];
    const unsigned T = gridDim.x * THREADS, step = T * UNROLL;
    const unsigned c0 = blockIdx.x * THREADS + threadIdx.x;
    uint4 v[UNROLL];
    int ent[UNROLL];
    unsigned offs[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
        const unsigned c = c0 + u * T;
        ent[u] = -1;
        if (c < chunks) {
            const int lo = find_request(pre_e, R, c);
            const unsigned in = c - (unsigned)pre_e[lo], e = in / cpr;
            offs[u] = (in - e * cpr) << 4;
            ent[u] = lo * a.seg + (int)e;
            v[u] = ld_host(a.host + (size_t)__ldcg(cl + 2 * ent[u]) * a.row_bytes + offs[u]);
        }
    }
    for (;;) {  // final words: slots chosen; extras = entries past the early ones
        int ok = 1;
        for (int i = threadIdx.x; i < R; i += THREADS) {
            const unsigned long long w = ld_acquire(a.ready + i);
            if ((unsigned)(w >> 32) != a.epoch) ok = 0;
            else pre_x[i] = (w & SELF_COPIED) ? 0
                                              : (int)(unsigned)(w & 0x7fffffffu) -
                                                    (int)((unsigned)(pre_e[i + 1] - pre_e[i]) / cpr);
        }
        if (__syncthreads_and(ok)) break;
        __nanosleep(64);
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
        if (ent[u] >= 0)
            *reinterpret_cast<uint4*>(a.dev + (size_t)__ldcg(cl + 2 * ent[u] + 1) * a.row_bytes + offs[u]) = v[u];
    // early entries past the first pass
    copy_chunks(c0 + step, chunks, T, a.host, a.dev, a.row_bytes,
                [&](unsigned c, unsigned& off) { return flat_entry(a, pre_e, R, cpr, c, off); });
    scan_chunks(pre_x, R, cpr);
    // fresh-prefix rows (steps that reset): entries past each request's early ones
    copy_chunks(c0, (unsigned)pre_x[R], T, a.host, a.dev, a.row_bytes, [&](unsigned c, unsigned& off) {
        const int lo = find_request(pre_x, R, c);
        const unsigned in = c - (unsigned)pre_x[lo];
        off = (in % cpr) << 4;
        const unsigned e = (unsigned)(pre_e[lo + 1] - pre_e[lo]) / cpr + in / cpr;
        return __ldcg(a.copy_list + (size_t)lo * a.seg + e);
    });
}

#if MAX_REGS  // a register cap below the launch bounds' 128 (room for another kernel's block beside)
#define SWAP_IN_BOUNDS __maxnreg__(MAX_REGS)
#else
#define SWAP_IN_BOUNDS __launch_bounds__(THREADS, MIN_BLOCKS)
#endif
extern "C" __global__ void SWAP_IN_BOUNDS
swap_in_lru(const int* indices, const long long* ctx_len, int* slot_pos, int* order, int* pos_slot,
            int* meta, int* slots_out, int* misses_out, int* errors, int2* copy_list,
            unsigned long long* ready, const unsigned char* host, unsigned char* dev, int R, int k, int B,
            long long C, int row_bytes, int prefix, int load_newest, int global_rows, int seg,
            unsigned epoch, int do_copy, int flat, int dup_words) {
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ int s_sc[SC_N];
    __shared__ int s_warp[WARPS + 1];
    __shared__ int s_red[3 * WARPS];
    const Args a{indices, ctx_len, slot_pos, order, pos_slot, meta, slots_out, misses_out, errors,
                 copy_list, ready, host, dev, R, k, B, C, prefix, load_newest, global_rows, seg,
                 row_bytes, flat, do_copy, dup_words, epoch};
    const Smem s = carve(smem, k, B, dup_words);
    if ((int)blockIdx.x >= R) {  // a helper block: nothing of its own to prepare
        grid_dependency_wait();
        allow_dependents();
    }
    for (int r = blockIdx.x; r < R; r += gridDim.x) {
        book_request(a, r, s, s_sc, s_warp, s_red, r == (int)blockIdx.x);
        __syncthreads();  // the segment and every write of the request done
        const unsigned n = (unsigned)s_sc[SC_NCOPY];
        // hybrid order: a request with at most one pass of rows is copied by its owner at once;
        // early order: such a request's rows were loaded and stored in book_request
        const bool hybrid_self = flat == ORDER_HYBRID && do_copy && n * ((unsigned)row_bytes >> 4) <= SELF_CHUNKS;
        const bool early_self = flat == ORDER_EARLY && s_sc[SC_SELF];
        if (threadIdx.x == 0) {
            const unsigned long long word = ((unsigned long long)epoch << 32) | n;
            if (flat == ORDER_EARLY && !s_sc[SC_EARLY]) {  // fast path, idle or bad: the whole list
                __threadfence();
                st_release(ready + R + r, word);
            }
            if (early_self) {
                st_relaxed(ready + r, word | SELF_COPIED);  // nothing for other blocks to read
            } else {
                __threadfence();
                st_release(ready + r, word | (hybrid_self ? SELF_COPIED : 0ull));
            }
        }
        __syncthreads();  // s_sc read before the next request rewrites it
        if (hybrid_self) copy_segment(a, r, n, 0, 1, host, dev, row_bytes);
    }
    if (!do_copy) return;  // bookkeeping only (timing breakdowns)
    if (flat == ORDER_EARLY) {
        copy_flat_early(a, s.order, s.slotpos);  // needs R + 1 <= B
    } else if (flat) {
        copy_flat(a, ready, epoch, host, dev, row_bytes, s.order, s.slotpos);  // needs R + 1 <= B
    } else if ((int)gridDim.x > R) {  // blocks r, r + R, r + 2R, ... copy request r
        const int r = blockIdx.x % R;
        copy_request(a, r, blockIdx.x / R, (gridDim.x - 1 - r) / R + 1, ready, epoch, host, dev, row_bytes, s_warp);
    } else {  // each block copies the requests it owns
        for (int r = blockIdx.x; r < R; r += gridDim.x)
            copy_request(a, r, 0, 1, ready, epoch, host, dev, row_bytes, s_warp);
    }
}
