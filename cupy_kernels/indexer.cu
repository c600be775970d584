// Lightning indexer for DeepSeek Sparse Attention decode (one query token per request).
//
// Semantics (defined once, in cupy_kernels/indexer.py's reference, mirrored here):
//   score[r, t] = kscale[r, t] * sum_h w[r, h] * relu(q[r, h, :] . k[r, t, :])      t < ctx[r]
// k: FP8 e4m3 keys, 132 B rows (128 codes, then the token's fp32 scale, little endian), stored
// [R, stride, 132]; q: [R, H, 128] bf16 bits or e4m3 codes; w: [R, H] fp32 (for FP8 queries it
// carries the query scale, as DeepSeek-V3.2's inference/model.py folds it in).
// Then the top-k positions by score, ties to the lower position, written in ascending position
// order, -1 padding when ctx < k.
//
// Scoring: tensor cores through warp-level mma.sync (m16n8k16 bf16 or m16n8k32 e4m3, fp32
// accumulate), 16 tokens (M) x 8 heads (N) per mma. The dot product is invariant under any
// permutation of the 128 dimensions applied to q and k alike, so each lane's fragment slots are
// taken from a contiguous 32-byte span of the row (lane group tig owns bytes tig*32..+32), and q
// is laid out in shared memory in exactly that fragment order (conflict-free 8-byte loads).
// A warp stages its 16-row tile (2112 B, 16 B aligned) in shared memory with 16 B loads; the
// row stride of 33 words makes the fragment reads conflict-free.
// Top-k: exact radix select (3 passes of 11/11/10 bits over order-preserving uint32 keys of
// the fp32 scores), then an ordered compaction that takes every key above the threshold and the
// lowest positions among keys equal to it.
#include <cuda_fp8.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#define ROW_BYTES 132
#define ROW_WORDS 33
#define DIM 128
#define WARPS 8
#define TILE_TOKENS 16
#define TILES_PER_WARP 8
#define TOKENS_PER_BLOCK (WARPS * TILE_TOKENS * TILES_PER_WARP)  // 1024
#define HIST1_BITS 11
#define HIST1_BINS (1 << HIST1_BITS)

__device__ __forceinline__ uint32_t fp8x2_to_bf16x2(uint16_t two) {
    // exact: every e4m3 value (subnormals too) is a bf16 value
    __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)two, __NV_E4M3);
    float lo = __half2float(__ushort_as_half(h.x));
    float hi = __half2float(__ushort_as_half(h.y));
    __nv_bfloat162 b = __floats2bfloat162_rn(lo, hi);  // .x (low 16 bits) = lo
    return *reinterpret_cast<uint32_t*>(&b);
}

__device__ __forceinline__ void mma_bf16(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void mma_e4m3(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t order_key(float f) {
    // larger float <-> larger key (scores are finite; -0 was written as +0)
    uint32_t u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ void hist_add(uint32_t* hist, uint32_t bin, bool active) {
    // warp-aggregated: lanes with the same bin add once (scores cluster in few high bins)
    const uint32_t act = __ballot_sync(0xffffffffu, active);
    if (!active) return;
    const uint32_t peers = __match_any_sync(act, bin);
    if ((threadIdx.x & 31) == __ffs(peers) - 1) atomicAdd(&hist[bin], (uint32_t)__popc(peers));
}

// FP8Q: false = bf16 queries (k-step 16, 8 steps), true = e4m3 queries (k-step 32, 4 steps).
template <int H, bool FP8Q>
__device__ __forceinline__ void score_kernel(const uint8_t* __restrict__ keys, const uint8_t* __restrict__ q,
                                             const float* __restrict__ w, const int* __restrict__ ctx_len,
                                             float* __restrict__ scores, uint32_t* __restrict__ hist1,
                                             long long stride) {
    constexpr int KSTEPS = FP8Q ? 4 : 8;
    constexpr int NT = H / 8;
    constexpr int QBYTES = FP8Q ? 1 : 2;
    __shared__ __align__(16) uint2 q_frag[NT * KSTEPS * 32];
    __shared__ float w_s[H];
    __shared__ __align__(16) uint32_t tile_s[WARPS][TILE_TOKENS * ROW_WORDS];
    __shared__ uint32_t hist_s[HIST1_BINS];  // bits 31..21 of the order keys of this block's scores

    const int r = blockIdx.y;
    const int L = ctx_len[r];
    const int block_t0 = blockIdx.x * TOKENS_PER_BLOCK;
    if (block_t0 >= L) return;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, tig = lane & 3;

    // q into fragment order: slot (nt, kk, lane) holds head nt*8+g, 8 bytes starting at
    // dimension tig*32 + kk*(8 / QBYTES) ... i.e. byte tig*32*QBYTES + kk*8 of the head's row
    const uint8_t* qr = q + (long long)r * H * DIM * QBYTES;
    for (int s = tid; s < NT * KSTEPS * 32; s += blockDim.x) {
        const int sl = s & 31, kk = (s >> 5) % KSTEPS, nt = (s >> 5) / KSTEPS;
        const int n = nt * 8 + (sl >> 2), st = sl & 3;
        q_frag[s] = *reinterpret_cast<const uint2*>(qr + n * DIM * QBYTES + st * 32 * QBYTES + kk * 8);
    }
    for (int h = tid; h < H; h += blockDim.x) w_s[h] = w[(long long)r * H + h];
    for (int b = tid; b < HIST1_BINS; b += blockDim.x) hist_s[b] = 0;
    __syncthreads();

    const uint8_t* kr = keys + (long long)r * stride * ROW_BYTES;
    float* sr = scores + (long long)r * stride;
    uint32_t* tile = tile_s[warp];
    for (int i = 0; i < TILES_PER_WARP; ++i) {
        const int t0 = block_t0 + (i * WARPS + warp) * TILE_TOKENS;
        if (t0 >= L) break;
        // stage the 16 rows (2112 B = 132 x 16 B); rows past L are read (within stride) but not scored
        const uint4* src = reinterpret_cast<const uint4*>(kr + (long long)t0 * ROW_BYTES);
        uint4 v[5];
#pragma unroll
        for (int j = 0; j < 5; ++j)
            if (lane + 32 * j < 132) v[j] = __ldg(src + lane + 32 * j);
        __syncwarp();
#pragma unroll
        for (int j = 0; j < 5; ++j)
            if (lane + 32 * j < 132) reinterpret_cast<uint4*>(tile)[lane + 32 * j] = v[j];
        __syncwarp();

        // A fragments: rows g and g+8, bytes tig*32 .. +32 of each
        uint32_t a[KSTEPS][4];
        const uint32_t* row0 = tile + g * ROW_WORDS + tig * 8;
        const uint32_t* row1 = tile + (g + 8) * ROW_WORDS + tig * 8;
#pragma unroll
        for (int kk = 0; kk < KSTEPS; ++kk) {
            if (FP8Q) {
                a[kk][0] = row0[2 * kk];
                a[kk][1] = row1[2 * kk];
                a[kk][2] = row0[2 * kk + 1];
                a[kk][3] = row1[2 * kk + 1];
            } else {
                const uint32_t w0 = row0[kk], w1 = row1[kk];
                a[kk][0] = fp8x2_to_bf16x2((uint16_t)(w0 & 0xFFFF));
                a[kk][1] = fp8x2_to_bf16x2((uint16_t)(w1 & 0xFFFF));
                a[kk][2] = fp8x2_to_bf16x2((uint16_t)(w0 >> 16));
                a[kk][3] = fp8x2_to_bf16x2((uint16_t)(w1 >> 16));
            }
        }
        float part0 = 0.f, part1 = 0.f;  // tokens g and g+8
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            float c[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
            for (int kk = 0; kk < KSTEPS; ++kk) {
                const uint2 b = q_frag[(nt * KSTEPS + kk) * 32 + lane];
                if (FP8Q) mma_e4m3(c, a[kk], b.x, b.y);
                else mma_bf16(c, a[kk], b.x, b.y);
            }
            const float w0 = w_s[nt * 8 + tig * 2], w1 = w_s[nt * 8 + tig * 2 + 1];
            part0 = fmaf(w0, fmaxf(c[0], 0.f), part0);
            part0 = fmaf(w1, fmaxf(c[1], 0.f), part0);
            part1 = fmaf(w0, fmaxf(c[2], 0.f), part1);
            part1 = fmaf(w1, fmaxf(c[3], 0.f), part1);
        }
        part0 += __shfl_xor_sync(0xffffffffu, part0, 1);
        part0 += __shfl_xor_sync(0xffffffffu, part0, 2);
        part1 += __shfl_xor_sync(0xffffffffu, part1, 1);
        part1 += __shfl_xor_sync(0xffffffffu, part1, 2);
        const int row = g + 8 * tig;
        const bool writer = tig < 2 && t0 + row < L;
        float sc = 0.f;
        if (writer) {
            sc = (tig == 0 ? part0 : part1) * __uint_as_float(tile[row * ROW_WORDS + 32]);
            sc = (sc == 0.f) ? 0.f : sc;  // one zero: -0 and +0 rank alike
            sr[t0 + row] = sc;
        }
        hist_add(hist_s, order_key(sc) >> (32 - HIST1_BITS), writer);
        __syncwarp();
    }
    __syncthreads();
    uint32_t* hr = hist1 + (long long)r * HIST1_BINS;
    for (int b = tid; b < HIST1_BINS; b += blockDim.x)
        if (hist_s[b]) atomicAdd(hr + b, hist_s[b]);
}

// blocks per SM the register budget must allow (occupancy keeps enough key bytes in flight)
#define SCORE_ENTRY(NAME, H, FP8Q)                                                                            \
    extern "C" __global__ void __launch_bounds__(WARPS * 32, (H == 32 ? 4 : 3)) NAME(                                           \
        const uint8_t* keys, const uint8_t* q, const float* w, const int* ctx_len, float* scores,              \
        uint32_t* hist1, long long stride) {                                                                  \
        score_kernel<H, FP8Q>(keys, q, w, ctx_len, scores, hist1, stride);                                  \
    }
SCORE_ENTRY(indexer_score_bf16_h32, 32, false)
SCORE_ENTRY(indexer_score_bf16_h64, 64, false)
SCORE_ENTRY(indexer_score_fp8_h32, 32, true)
SCORE_ENTRY(indexer_score_fp8_h64, 64, true)

// ------------------------------------------------------------------------------------------
// Exact top-k
// ------------------------------------------------------------------------------------------
#define TK_THREADS 512
#define TK_WARPS (TK_THREADS / 32)

// Exclusive block scan of one uint32 per thread; returns the block total in *total.
__device__ __forceinline__ uint32_t block_exclusive_scan(uint32_t v, uint32_t* warp_sums, uint32_t* total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    uint32_t x = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        uint32_t y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    if (lane == 31) warp_sums[warp] = x;
    __syncthreads();
    if (warp == 0) {
        uint32_t s = lane < TK_WARPS ? warp_sums[lane] : 0u;
        uint32_t t = s;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            uint32_t y = __shfl_up_sync(0xffffffffu, t, o);
            if (lane >= o) t += y;
        }
        warp_sums[lane] = t - s;  // exclusive warp offsets
        if (lane == 31) warp_sums[32] = t;
    }
    __syncthreads();
    const uint32_t res = warp_sums[warp] + x - v;
    *total = warp_sums[32];
    __syncthreads();
    return res;
}

// Warp 0: the bin, from the top, that holds the remaining-th largest key; its count of keys above.
__device__ __forceinline__ void pick_bin(const uint32_t* hist, int bins, uint32_t remaining, uint32_t* sel_bin,
                                         uint32_t* sel_above) {
    const int lane = threadIdx.x & 31;
    const int per = bins / 32;  // lane l owns bins/32 consecutive bins, descending
    uint32_t sum = 0;
    for (int j = 0; j < per; ++j) sum += hist[bins - 1 - (lane * per + j)];
    uint32_t incl = sum;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
        const uint32_t y = __shfl_up_sync(0xffffffffu, incl, off);
        if (lane >= off) incl += y;
    }
    uint32_t above = incl - sum;
    if (above < remaining && remaining <= incl) {
        for (int j = 0; j < per; ++j) {
            const int b = bins - 1 - (lane * per + j);
            if (remaining <= above + hist[b]) {
                *sel_bin = (uint32_t)b;
                *sel_above = above;
                break;
            }
            above += hist[b];
        }
    }
}

#define TK_PER_THREAD 16                          // consecutive positions per thread and round
#define TK_ROUND (TK_THREADS * TK_PER_THREAD)     // 8192 positions per round
#define CAND_CAP 16384                            // positions kept in (dynamic) shared memory

// TK_PER_THREAD consecutive scores from p0 (a multiple of 8, < L <= stride, stride % 16 == 0:
// the loads stay inside the row)
__device__ __forceinline__ void load_run(const float* s, int p0, int L, float* f) {
    if (p0 < L) {
        const float4* s4 = reinterpret_cast<const float4*>(s + p0);
#pragma unroll
        for (int j = 0; j < TK_PER_THREAD / 4; ++j) {
            const float4 v = s4[j];
            f[4 * j] = v.x; f[4 * j + 1] = v.y; f[4 * j + 2] = v.z; f[4 * j + 3] = v.w;
        }
    } else {
#pragma unroll
        for (int j = 0; j < TK_PER_THREAD; ++j) f[j] = 0.f;
    }
}

extern "C" __global__ void __launch_bounds__(TK_THREADS) indexer_topk(const float* __restrict__ scores,
                                                                     const uint32_t* __restrict__ hist1,
                                                                     const int* __restrict__ ctx_len,
                                                                     long long stride, int k,
                                                                     int* __restrict__ out) {
    extern __shared__ int cand[];  // CAND_CAP positions whose key is in the level-1 threshold bin
    __shared__ uint32_t hist[2048];
    __shared__ uint32_t warp_sums[33];
    __shared__ uint32_t sel_bin, sel_above, n_cand;
    const int r = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int L = ctx_len[r];
    int* o = out + (long long)r * k;
    if (L <= k) {
        for (int i = tid; i < k; i += TK_THREADS) o[i] = i < L ? i : -1;
        return;
    }
    const float* s = scores + (long long)r * stride;  // stride % 16 == 0: float4 aligned
    // level 1 (bits 31..21): the scoring kernel's histogram
    for (int b = tid; b < 2048; b += TK_THREADS) hist[b] = hist1[(long long)r * 2048 + b];
    if (tid == 0) n_cand = 0;
    __syncthreads();
    if (warp == 0) pick_bin(hist, 2048, (uint32_t)k, &sel_bin, &sel_above);
    __syncthreads();
    uint32_t prefix = sel_bin << 21, mask = 0xFFE00000u, remaining = (uint32_t)k - sel_above;
    __syncthreads();
    // level 2 (bits 20..10), one pass over the row; the keys in the level-1 bin become candidates
    for (int b = tid; b < 2048; b += TK_THREADS) hist[b] = 0;
    __syncthreads();
    for (int base = 0; base < L; base += TK_ROUND) {
        const int p0 = base + tid * TK_PER_THREAD;
        float f[TK_PER_THREAD];
        load_run(s, p0, L, f);
#pragma unroll
        for (int j = 0; j < TK_PER_THREAD; ++j) {
            const uint32_t u = order_key(f[j]);
            const bool on = (p0 + j < L) && ((u & mask) == prefix);
            const uint32_t act = __ballot_sync(0xffffffffu, on);
            if (act) {  // warp-uniform
                uint32_t slot = 0;
                if (lane == __ffs(act) - 1) slot = atomicAdd(&n_cand, (uint32_t)__popc(act));
                slot = __shfl_sync(0xffffffffu, slot, __ffs(act) - 1);
                if (on) {
                    const uint32_t mine = slot + __popc(act & ((1u << lane) - 1));
                    if (mine < CAND_CAP) cand[mine] = p0 + j;
                    const uint32_t bin = (u >> 10) & 2047u;
                    const uint32_t peers = __match_any_sync(act, bin);
                    if (lane == __ffs(peers) - 1) atomicAdd(&hist[bin], (uint32_t)__popc(peers));
                }
            }
        }
    }
    __syncthreads();
    if (warp == 0) pick_bin(hist, 2048, remaining, &sel_bin, &sel_above);
    __syncthreads();
    prefix |= sel_bin << 10;
    mask |= 0x7FFu << 10;
    remaining -= sel_above;
    const uint32_t nc = n_cand;
    __syncthreads();
    // level 3 (bits 9..0) over the candidates, or over the whole row when they did not fit
    for (int b = tid; b < 1024; b += TK_THREADS) hist[b] = 0;
    __syncthreads();
    if (nc <= CAND_CAP) {
        for (int base = 0; base < (int)nc; base += TK_THREADS) {
            const int i = base + tid;
            const uint32_t u = i < (int)nc ? order_key(s[cand[i]]) : 0u;
            hist_add(hist, u & 1023u, i < (int)nc && (u & mask) == prefix);
        }
    } else {
        for (int base = 0; base < L; base += TK_ROUND) {
            const int p0 = base + tid * TK_PER_THREAD;
            float f[TK_PER_THREAD];
            load_run(s, p0, L, f);
#pragma unroll
            for (int j = 0; j < TK_PER_THREAD; ++j) {
                const uint32_t u = order_key(f[j]);
                hist_add(hist, u & 1023u, (p0 + j < L) && (u & mask) == prefix);
            }
        }
    }
    __syncthreads();
    if (warp == 0) pick_bin(hist, 1024, remaining, &sel_bin, &sel_above);
    __syncthreads();
    // the k-th largest key; take every key above it and the `need` lowest positions equal to it,
    // in ascending position order (one block scan per round of TK_PER_THREAD consecutive positions a thread)
    const uint32_t thr = prefix | sel_bin, need = remaining - sel_above;
    uint32_t run_gt = 0, run_eq = 0;
    for (int base = 0; base < L; base += TK_ROUND) {
        const int p0 = base + tid * TK_PER_THREAD;
        float f[TK_PER_THREAD];
        load_run(s, p0, L, f);
        uint32_t gt_bits = 0, eq_bits = 0;
#pragma unroll
        for (int j = 0; j < TK_PER_THREAD; ++j) {
            const uint32_t u = order_key(f[j]);
            const bool in = p0 + j < L;
            gt_bits |= (in && u > thr) ? (1u << j) : 0u;
            eq_bits |= (in && u == thr) ? (1u << j) : 0u;
        }
        uint32_t tot;
        const uint32_t ex = block_exclusive_scan(__popc(gt_bits) | (__popc(eq_bits) << 16), warp_sums, &tot);
        uint32_t gb = run_gt + (ex & 0xFFFF), eb = run_eq + (ex >> 16);
#pragma unroll
        for (int j = 0; j < TK_PER_THREAD; ++j) {
            const bool gt = (gt_bits >> j) & 1u, eq = (eq_bits >> j) & 1u;
            if (gt) o[gb + min(eb, need)] = p0 + j;
            else if (eq && eb < need) o[gb + eb] = p0 + j;
            gb += gt;
            eb += eq;
        }
        run_gt += tot & 0xFFFF;
        run_eq += tot >> 16;
        if (run_gt + min(run_eq, need) >= (uint32_t)k) break;  // uniform across the block
    }
}
