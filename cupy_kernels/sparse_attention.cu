// Absorbed-MLA sparse decode attention (DeepSeek Sparse Attention) for Hopper (sm_90a).
//
// One CTA = 64 query heads of one request x one split of its top-k token list.
// Two warpgroups (256 threads).  Per tile of 64 gathered KV rows:
//   S = Q K^T      : warpgroup w computes tokens [32w, 32w+32) with wgmma m64n32k16 (K = 576)
//   softmax        : online, row max exchanged between the warpgroups through shared memory
//   O += P V       : warpgroup w owns output columns [256w, 256w+256), wgmma m64n256k16
// K and V are the same gathered rows (V = first 512 values), stored once in shared memory in the
// 128-byte-swizzled layout that serves as K-major B for S and as MN-major B for P V.
// bf16 rows are gathered with cp.async straight into that layout (two buffers, the next tile
// issued while this tile's S MMAs run).  FP8 rows (656 B) are loaded into registers (11 x 16 B per
// thread) a tile ahead and dequantised into the other bf16 buffer while the P V MMAs of the
// current tile run (before: staged raw in shared memory and dequantised between tiles, unhidden).
// Outputs: bf16 out and natural-log lse, or fp32 partials per split merged by mla_combine.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

#define D_QK 576
#define D_V 512
#define HEADS_PER_CTA 64
#define TILE 64
#define NCHUNK 9                              // 64-value (128-byte) chunks per 576-value row
#define CHUNK_BYTES (TILE * 128)              // one chunk of a 64-row tile
#define TILE_BYTES (NCHUNK * CHUNK_BYTES)     // 73728: 64 bf16 rows of 576
#define Q_BYTES (NCHUNK * HEADS_PER_CTA * 128)
#define P_BYTES (HEADS_PER_CTA * 128)         // 64 heads x 64 tokens bf16
#define XCH_BYTES (2 * 2 * HEADS_PER_CTA * 4) // row max / row sum exchange
#define SLOT_BYTES (2 * TILE * 4)             // validated slots of the next two tiles
#define FP8_ROW 656
#define NTHREADS 256
#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

// Timeline (benchmarks/attention_timeline.py builds with -DTIMELINE; the default build has none of
// it): the warp-specialised kernels stamp the SM's clock64 at fixed points, one warpgroup thread
// each, per CTA into g_timeline (TL_FIXED fixed events, then TL_TILES stamps of each per-tile
// series), so the prologue, the tile period and who waits on whom can be read per CTA.
#define TL_FIXED 8
#define TL_TILES 32
#define TL_SERIES 6  // WG0: buffer freed (top), full wait done, P V issued; producer: empty wait done, full arrived;
                     // WG1: buffer freed
#define TL_EVENTS (TL_FIXED + TL_SERIES * TL_TILES)
// TL_PAIR (SB): WG0 right after its wait on the pair's cluster barrier, an instant both CTAs of a pair share
// to within the barrier's wake-up, so the two SMs' clock64 counters can be set against each other.
enum TlEvent { TL_START = 0, TL_Q_READY = 1, TL_LOOP_END = 2, TL_EPI_END = 3, TL_END = 4, TL_GT_START = 5, TL_GT_END = 6,
               TL_PAIR = 7 };
enum TlSeries { TL_FREED = 0, TL_FULL = 1, TL_PV = 2, TL_EMPTY = 3, TL_ARRIVED = 4, TL_WG1_FREED = 5 };
#ifdef TIMELINE
#define TL_CTAS 1024
__device__ unsigned long long g_timeline[TL_CTAS * TL_EVENTS];
__device__ __forceinline__ void tl_put(int e, unsigned long long v) {
    const unsigned cta = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    if (cta < TL_CTAS && e < TL_EVENTS) g_timeline[cta * TL_EVENTS + e] = v;
}
__device__ __forceinline__ void tl_stamp(int e) {
    unsigned long long c;
    asm volatile("mov.u64 %0, %%clock64;" : "=l"(c));
    tl_put(e, c);
}
__device__ __forceinline__ void tl_global(int e) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    tl_put(e, t);
}
#define TL(cond, e) do { if (cond) tl_stamp(e); } while (0)
#define TL_TILE(cond, series, it) do { if ((cond) && (it) < TL_TILES) tl_stamp(TL_FIXED + (series) * TL_TILES + (it)); } while (0)
#define TL_GLOBAL(cond, e) do { if (cond) tl_global(e); } while (0)
#else
#define TL(cond, e) ((void)0)
#define TL_TILE(cond, series, it) ((void)0)
#define TL_GLOBAL(cond, e) ((void)0)
#endif

// ---------------------------------------------------------------------------------------------
// PTX helpers
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte async copy global -> shared; src_bytes = 0 writes zeros (masked rows).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait1() { asm volatile("cp.async.wait_group 1;\n" ::: "memory"); }

// Generic-proxy shared-memory writes must be fenced before the tensor cores (async proxy) read them.
__device__ __forceinline__ void fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }

// Shared-memory matrix descriptor, 128-byte swizzle.  K-major: lbo unused (16), sbo = 1024
// (8 rows of 128 B).  MN-major: lbo = stride between 64-wide MN blocks, sbo = 8 K-rows (1024).
__device__ __forceinline__ uint64_t make_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
    return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)(lbo >> 4) << 16) |
           ((uint64_t)(sbo >> 4) << 32) | (1ull << 62);
}

// Byte offset of 16-byte unit u (0..7) of row r in a 128-byte-swizzled chunk.
__device__ __forceinline__ uint32_t swz(int r, int u) { return r * 128 + ((u ^ (r & 7)) << 4); }

// D[64 x 32] (+)= A[64 x 16] * B[16 x 32], A and B from shared memory (descriptors).
template <int TRANS_B>
__device__ __forceinline__ void wgmma_m64n32k16(float (&d)[16], uint64_t desc_a, uint64_t desc_b,
                                                 int accumulate) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %18, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
        "%16, %17, p, 1, 1, 0, %19;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(TRANS_B));
}

// D[64 x 256] (+)= A[64 x 16] * B[16 x 256], A and B from shared memory (descriptors).
template <int TRANS_B>
__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[128], uint64_t desc_a, uint64_t desc_b,
                                                 int accumulate) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
        "%128, %129, p, 1, 1, 0, %131;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
          "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
          "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
          "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
          "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
          "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
          "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
          "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
          "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(TRANS_B));
}

// ---------------------------------------------------------------------------------------------
// Loaders
// ---------------------------------------------------------------------------------------------
// A token's slot in two halves, so a slot loaded a step before its use is checked only at the use
// (checking right after the load stalls the warp on it): the load (-1 beyond this split) ...
__device__ __forceinline__ int load_slot(const int* slots_b, int tok, int tok_end) {
    return tok < tok_end ? __ldg(slots_b + tok) : -1;
}
// ... and the check: -1 when masked (negative or >= n_rows).
__device__ __forceinline__ int checked_slot(int slot, long long n_rows) { return (slot >= 0 && slot < n_rows) ? slot : -1; }
// Slot of token `tok`, or -1 when masked (beyond this split, negative, or >= n_rows).
__device__ __forceinline__ int fetch_slot(const int* slots_b, int tok, int tok_end, long long n_rows) {
    return checked_slot(load_slot(slots_b, tok, tok_end), n_rows);
}

// Q rows of this CTA's 64 heads -> swizzled smem (18 x 16 B per thread).
__device__ __forceinline__ void load_q(uint32_t q_s, const uint16_t* q_rows, int tid) {
#pragma unroll
    for (int i = 0; i < (HEADS_PER_CTA * 72) / NTHREADS; ++i) {
        int idx = tid + i * NTHREADS;
        int h = idx / 72, ci = idx - h * 72;
        cp_async16(q_s + (ci >> 3) * (HEADS_PER_CTA * 128) + swz(h, ci & 7), q_rows + h * D_QK + ci * 8, 16);
    }
}

// 64 bf16 rows (1152 B) gathered by slot -> swizzled smem tile; invalid rows become zeros.
template <int NT = NTHREADS>
__device__ __forceinline__ void load_tile_bf16(uint32_t kv_s, const uint16_t* kv, const int* slot_tile, int tid) {
#pragma unroll 6
    for (int i = 0; i < (TILE * 72) / NT; ++i) {
        int idx = tid + i * NT;
        int t = idx / 72, ci = idx - t * 72;
        int slot = slot_tile[t];
        bool ok = slot >= 0;
        const uint16_t* src = kv + (ok ? (long long)slot * D_QK + ci * 8 : 0);
        cp_async16(kv_s + (ci >> 3) * CHUNK_BYTES + swz(t, ci & 7), src, ok ? 16 : 0);
    }
}

// FP8 rows staged in registers: TPR threads per row of a 64-row tile (2 in the 128-thread narrow
// kernel, 4 in the 256-thread wide one); thread t holds the 16-byte units q + TPR * m of row
// t / TPR (q = t % TPR).  Masked rows read as zeros.
template <int TPR>
struct RawRegs {
    static constexpr int N = (FP8_ROW / 16 + TPR - 1) / TPR;  // 21 or 11 units per thread
    uint4 v[N];
};

template <int TPR>
__device__ __forceinline__ void load_raw_regs(RawRegs<TPR>& r, const uint8_t* kv, const int* slot_tile, int tid) {
    const int row = tid / TPR, q = tid % TPR;
    const int slot = slot_tile[row];
    const uint4* src = reinterpret_cast<const uint4*>(kv + (long long)max(slot, 0) * FP8_ROW) + q;
#pragma unroll
    for (int m = 0; m < RawRegs<TPR>::N; ++m) {
        const bool ok = slot >= 0 && q + TPR * m < FP8_ROW / 16;
        r.v[m] = ok ? __ldg(src + TPR * m) : make_uint4(0, 0, 0, 0);
    }
}

// 16 e4m3 values -> 16 bf16 (two 16-byte units): value = bf16(e4m3 * bf16(scale)), the scale of
// its 128-value block rounded to bf16 first and the product rounded once (FlashMLA's SM90 FP8
// decode does the same: csrc/sm90/decode/sparse_fp8/components/dequant.h, `cvt_fp8x8_bf16x8`;
// the CPU twin is mla_reference.dequant_fp8_rows_bf16).
//
// Why not the hardware conversions: e4m3 -> f16x2 -> 2 x f32 -> bf16x2 is four conversion
// instructions per pair, and conversions issue at a quarter of the integer rate, so a 64-row
// tile (32,768 values) cost ~4,096 cycles per SM, more than its MMAs (BENCHMARKS.md, "ws" FP8).
// Here a pair costs three integer instructions and two bf16x2 multiplies: an e4m3 code moved
// into a bf16's bit positions (sign to bit 15, exponent and mantissa to bits 10..4) is exactly
// e4m3 * 2^-120 (the two formats' exponent biases, 127 - 7; e4m3 subnormals become bf16
// subnormals).
//   prmt (sign-replicating selector nibbles 8, A) puts code b0 in bits 15..8 with its sign
//   replicated in bits 23..16 and code b1 in bits 31..24; an arithmetic shift right by 4 and the
//   mask 0x87F087F0 then leave both bf16 halves (low half b0, high half b1).
// Then x * 2^120 (exact: the e4m3 value itself, now a bf16) and * bf16(scale), rounded once: any
// scale, zero, subnormal or huge, takes the same two multiplies (one bf16(scale) * 2^120 would
// save one but overflows bf16 for scales >= 2^8).  No branch, no conversion instruction in the
// loop.  The e4m3 NaN codes (0x7F, 0xFF; the packer never writes them) decode to +-480 * scale.
__device__ __forceinline__ uint32_t e4m3x2_bits_to_bf16x2(uint32_t w, uint32_t selector) {
    uint32_t t;
    asm("prmt.b32 %0, %1, 0, %2;" : "=r"(t) : "r"(w), "r"(selector));
    return static_cast<uint32_t>(static_cast<int32_t>(t) >> 4) & 0x87F087F0u;
}

__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
    __nv_bfloat162 p = __hmul2(*reinterpret_cast<__nv_bfloat162*>(&a), *reinterpret_cast<__nv_bfloat162*>(&b));
    return *reinterpret_cast<uint32_t*>(&p);
}

__device__ __forceinline__ void e4m3x16_to_bf16(const uint4& raw, float sc, uint4& lo, uint4& hi) {
    constexpr uint32_t TWO_POW_120 = 0x7B807B80u;  // bf16x2 {2^120, 2^120}
    const uint32_t s = __bfloat16_as_ushort(__float2bfloat16_rn(sc));
    const uint32_t s2 = s | (s << 16);
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
    uint32_t o[8];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        o[2 * j] = bf16x2_mul(bf16x2_mul(e4m3x2_bits_to_bf16x2(w[j], 0x1804u), TWO_POW_120), s2);  // codes 0, 1
        o[2 * j + 1] = bf16x2_mul(bf16x2_mul(e4m3x2_bits_to_bf16x2(w[j], 0x3A24u), TWO_POW_120), s2);  // 2, 3
    }
    lo = make_uint4(o[0], o[1], o[2], o[3]);
    hi = make_uint4(o[4], o[5], o[6], o[7]);
}

// Registers of load_raw_regs -> bf16 swizzled tile.  The row's scales (unit 32) sit in the
// row's first thread (q = 0); the others get them by a shuffle within the row's TPR lanes.
template <int TPR>
__device__ __forceinline__ void dequant_regs(uint8_t* kv_tile, const RawRegs<TPR>& r, int tid) {
    constexpr int MS = 32 / TPR;  // m of unit 32
    const int row = tid / TPR, q = tid % TPR;
    float sc[4];
    sc[0] = __uint_as_float(__shfl_sync(0xffffffff, r.v[MS].x, 0, TPR));
    sc[1] = __uint_as_float(__shfl_sync(0xffffffff, r.v[MS].y, 0, TPR));
    sc[2] = __uint_as_float(__shfl_sync(0xffffffff, r.v[MS].z, 0, TPR));
    sc[3] = __uint_as_float(__shfl_sync(0xffffffff, r.v[MS].w, 0, TPR));
#pragma unroll
    for (int m = 0; m < MS; ++m) {  // units q + TPR m < 32: latent values 16u .. 16u + 15
        const int u = q + TPR * m;
        uint4 lo, hi;
        e4m3x16_to_bf16(r.v[m], sc[(TPR * m) >> 3], lo, hi);
        uint8_t* chunk = kv_tile + ((TPR * m) >> 2) * CHUNK_BYTES;
        *reinterpret_cast<uint4*>(chunk + swz(row, (u & 3) * 2)) = lo;
        *reinterpret_cast<uint4*>(chunk + swz(row, (u & 3) * 2 + 1)) = hi;
    }
#pragma unroll
    for (int m = MS; m < RawRegs<TPR>::N; ++m) {  // units 33 .. 40: the bf16 rope values
        const int u = q + TPR * m;
        if (u >= 33 && u <= 40) *reinterpret_cast<uint4*>(kv_tile + 8 * CHUNK_BYTES + swz(row, u - 33)) = r.v[m];
    }
}

// ---------------------------------------------------------------------------------------------
// Online-softmax pieces of the wide kernels (serial, ws, ws2, wsx): the accumulator layout of an
// m64nN wgmma, s[4 j + 2 i + c] = row r0 + 8 i, column 8 j + cq + c of this thread's quad.
// ---------------------------------------------------------------------------------------------
// Scores to the log2 domain, masked columns (bit 2 j + c of `valid` clear) to -inf, and this
// thread's max of each of its two rows.
template <int NJ>
__device__ __forceinline__ void mask_scale_row_max(float (&s)[4 * NJ], uint32_t valid, float scale_log2,
                                                   float (&m)[2]) {
#pragma unroll
    for (int j = 0; j < NJ; ++j)
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                const float v = ((valid >> (j * 2 + c)) & 1) ? s[j * 4 + i * 2 + c] * scale_log2 : -INFINITY;
                s[j * 4 + i * 2 + c] = v;
                m[i] = fmaxf(m[i], v);
            }
}

// O rows r0 and r0 + 8 (this thread's 128 accumulators of an m64n256 product) times a0 and a1.
__device__ __forceinline__ void rescale_rows(float (&o)[128], float a0, float a1) {
#pragma unroll
    for (int j = 0; j < 32; ++j) {
        o[j * 4 + 0] *= a0;
        o[j * 4 + 1] *= a0;
        o[j * 4 + 2] *= a1;
        o[j * 4 + 3] *= a1;
    }
}

// ---------------------------------------------------------------------------------------------
// Epilogue (the wide kernels)
// ---------------------------------------------------------------------------------------------
// One warpgroup's half of O (columns 256 wg .. 256 wg + 255), normalised by inv, to out (bf16)
// or to the split partials (fp32).
__device__ __forceinline__ void store_o_half(const float (&o_acc)[128], const float (&inv)[2], int wg, int r0,
                                             int cq, long long b, int H, int head0, int split, int n_splits,
                                             uint16_t* out, float* part_o) {
    if (n_splits == 1) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const long long row = b * H + head0 + r0 + i * 8;
            uint16_t* orow = out + row * D_V + wg * 256 + cq;
#pragma unroll
            for (int j = 0; j < 32; ++j) {
                __nv_bfloat162 v = __floats2bfloat162_rn(o_acc[j * 4 + i * 2] * inv[i], o_acc[j * 4 + i * 2 + 1] * inv[i]);
                *reinterpret_cast<__nv_bfloat162*>(orow + j * 8) = v;
            }
        }
    } else {
        const long long B = gridDim.z;
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const long long row = ((long long)split * B + b) * H + head0 + r0 + i * 8;
            float* orow = part_o + row * D_V + wg * 256 + cq;
#pragma unroll
            for (int j = 0; j < 32; ++j)
                *reinterpret_cast<float2*>(orow + j * 8) =
                    make_float2(o_acc[j * 4 + i * 2] * inv[i], o_acc[j * 4 + i * 2 + 1] * inv[i]);
        }
    }
}

// Natural-log lse of this thread's two rows r0, r0 + 8 of the head group, to lse (one split) or
// to the split partials.
__device__ __forceinline__ void store_lse_rows(const float (&lse_row)[2], int r0, long long b, int H, int head0,
                                               int split, int n_splits, float* lse, float* part_lse) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        if (n_splits == 1) lse[b * H + head0 + r0 + i * 8] = lse_row[i];
        else part_lse[((long long)split * gridDim.z + b) * H + head0 + r0 + i * 8] = lse_row[i];
    }
}

// ---------------------------------------------------------------------------------------------
// Main kernel
// ---------------------------------------------------------------------------------------------
// grid = (H / 64, n_splits, B): the head groups of one request run side by side and share the
// gathered rows through L2.
template <bool FP8>
__device__ __forceinline__ void mla_decode_body(
    const uint16_t* __restrict__ q, const void* __restrict__ kv_raw, const int* __restrict__ slots,
    long long n_rows, int H, int K, float scale_log2, int tiles_per_split,
    uint16_t* __restrict__ out, float* __restrict__ lse, float* __restrict__ part_o,
    float* __restrict__ part_lse) {
    extern __shared__ uint8_t smem_raw[];
    uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
    uint8_t* q_sm = smem;
    uint8_t* kv_sm[2];
    kv_sm[0] = smem + Q_BYTES;
    kv_sm[1] = kv_sm[0] + TILE_BYTES;
    uint8_t* p_sm = smem + Q_BYTES + 2 * TILE_BYTES;
    float* xch = reinterpret_cast<float*>(p_sm + P_BYTES);  // [2 kinds][2 wg][64 rows]
    int* slot_sm = reinterpret_cast<int*>(p_sm + P_BYTES + XCH_BYTES);  // [2 tiles][64]
    const uint8_t* kv8 = static_cast<const uint8_t*>(kv_raw);

    const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
    const int hg = blockIdx.x, split = blockIdx.y, b = blockIdx.z;
    const int n_splits = gridDim.y;
    const int tok_begin = split * tiles_per_split * TILE;
    const int tok_end = min(K, tok_begin + tiles_per_split * TILE);
    const int n_tiles = (tok_end - tok_begin + TILE - 1) / TILE;
    const int* slots_b = slots + (long long)b * K;
    const uint16_t* q_rows = q + ((long long)b * H + hg * HEADS_PER_CTA) * D_QK;

    const uint32_t q_s = smem_u32(q_sm), p_s = smem_u32(p_sm);
    const uint32_t kv_s0 = smem_u32(kv_sm[0]), kv_s1 = smem_u32(kv_sm[1]);

    // rows owned by this thread in the wgmma accumulator layout
    const int r0 = warp * 16 + (lane >> 2);  // and r0 + 8
    const int cq = (lane & 3) * 2;

    float o_acc[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) o_acc[i] = 0.f;
    float s_acc[16];
    float m_run[2] = {-INFINITY, -INFINITY}, l_part[2] = {0.f, 0.f};

    // slot indices are staged in shared memory two tiles ahead, so no gather waits on them
    if (tid < TILE) {
        slot_sm[tid] = fetch_slot(slots_b, tok_begin + tid, tok_end, n_rows);
        slot_sm[TILE + tid] = fetch_slot(slots_b, tok_begin + TILE + tid, tok_end, n_rows);
    }
    __syncthreads();
    load_q(q_s, q_rows, tid);
    RawRegs<4> raw;  // FP8: the next tile's raw rows, loaded before and dequantised during an MMA
    if (FP8) {
        load_raw_regs(raw, kv8, slot_sm, tid);
        cp_async_commit();
        cp_async_wait_all();
        dequant_regs(kv_sm[0], raw, tid);
        fence_proxy_async();
        if (n_tiles > 1) load_raw_regs(raw, kv8, slot_sm + TILE, tid);
    } else {
        load_tile_bf16(kv_s0, (const uint16_t*)kv_raw, slot_sm, tid);
        cp_async_commit();
    }

    for (int it = 0; it < n_tiles; ++it) {
        const int tok0 = tok_begin + it * TILE;
        const int buf = it & 1;
        const uint32_t kv_cur = buf ? kv_s1 : kv_s0;
        if (!FP8) {
            cp_async_wait_all();
            fence_proxy_async();
        }
        __syncthreads();  // tile `it` visible to all; previous tile's MMAs finished in both warpgroups
        int* sl_cur = slot_sm + (it & 1) * TILE;
        const int* sl_nxt = slot_sm + ((it + 1) & 1) * TILE;
        const int pre = tid < TILE ? fetch_slot(slots_b, tok0 + 2 * TILE + tid, tok_end, n_rows) : -1;

        // ---- S = Q K^T for this warpgroup's 32 tokens (36 k-steps of 16) ----
        const uint64_t dq = make_desc(q_s, 16, 1024);
        const uint64_t dk = make_desc(kv_cur + wg * 32 * 128, 16, 1024);
        wgmma_fence();
#pragma unroll
        for (int s = 0; s < 36; ++s) {
            const uint32_t off = (s >> 2) * (HEADS_PER_CTA * 128) + (s & 3) * 32;
            const uint32_t offk = (s >> 2) * CHUNK_BYTES + (s & 3) * 32;
            wgmma_m64n32k16<0>(s_acc, dq + (off >> 4), dk + (offk >> 4), s > 0);
        }
        wgmma_commit();
        if (!FP8 && it + 1 < n_tiles) {  // the next tile into the other buffer while S runs
            load_tile_bf16(buf ? kv_s0 : kv_s1, (const uint16_t*)kv_raw, sl_nxt, tid);
            cp_async_commit();
        }

        // validity of this thread's 8 score columns
        uint32_t valid = 0;
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                valid |= (sl_cur[wg * 32 + j * 8 + cq + c] >= 0 ? 1u : 0u) << (j * 2 + c);
            }
        wgmma_wait0();

        // ---- online softmax (log2 domain) ----
        float m_loc[2] = {-INFINITY, -INFINITY};
        mask_scale_row_max<4>(s_acc, valid, scale_log2, m_loc);
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            m_loc[i] = fmaxf(m_loc[i], __shfl_xor_sync(0xffffffff, m_loc[i], 1));
            m_loc[i] = fmaxf(m_loc[i], __shfl_xor_sync(0xffffffff, m_loc[i], 2));
        }
        if ((lane & 3) == 0) {
            xch[wg * 64 + r0] = m_loc[0];
            xch[wg * 64 + r0 + 8] = m_loc[1];
        }
        __syncthreads();
        if (tid < TILE) sl_cur[tid] = pre;  // tile it+2 takes tile it's place (all reads of it done)
        float alpha[2], m_use[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            float m_other = xch[(wg ^ 1) * 64 + r0 + i * 8];
            float m_new = fmaxf(m_run[i], fmaxf(m_loc[i], m_other));
            m_use[i] = m_new == -INFINITY ? 0.f : m_new;  // all masked so far: keep p = 0, no NaN
            alpha[i] = exp2f(m_run[i] - m_use[i]);
            m_run[i] = m_new;
            l_part[i] *= alpha[i];
        }
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                float p0 = exp2f(s_acc[j * 4 + i * 2] - m_use[i]);
                float p1 = exp2f(s_acc[j * 4 + i * 2 + 1] - m_use[i]);
                __nv_bfloat162 pb = __floats2bfloat162_rn(p0, p1);
                float2 pr = __bfloat1622float2(pb);  // sum what the MMA will see
                l_part[i] += pr.x + pr.y;
                const int r = r0 + i * 8, col = wg * 32 + j * 8 + cq;
                *reinterpret_cast<__nv_bfloat162*>(p_sm + swz(r, col >> 3) + (col & 7) * 2) = pb;
            }
        fence_proxy_async();
        __syncthreads();  // P complete

        // ---- O = alpha * O + P V for this warpgroup's 256 columns ----
        rescale_rows(o_acc, alpha[0], alpha[1]);
        const uint64_t dp = make_desc(p_s, 16, 1024);
        const uint64_t dv = make_desc(kv_cur + wg * 4 * CHUNK_BYTES, CHUNK_BYTES, 1024);
        wgmma_fence();
#pragma unroll
        for (int s = 0; s < 4; ++s)
            wgmma_m64n256k16<1>(o_acc, dp + ((s * 32) >> 4), dv + ((s * 16 * 128) >> 4), 1);
        wgmma_commit();
        if (FP8 && it + 1 < n_tiles) {  // tile it+1 into the other buffer while the MMAs run
            dequant_regs(kv_sm[buf ^ 1], raw, tid);
            fence_proxy_async();
        }
        wgmma_wait0();

        if (FP8 && it + 2 < n_tiles) load_raw_regs(raw, kv8, sl_cur, tid);  // slots staged above
    }

    // ---- epilogue: merge the two warpgroups' row sums, normalise, write ----
    float* xl = xch + 128;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        l_part[i] += __shfl_xor_sync(0xffffffff, l_part[i], 1);
        l_part[i] += __shfl_xor_sync(0xffffffff, l_part[i], 2);
    }
    if ((lane & 3) == 0) {
        xl[wg * 64 + r0] = l_part[0];
        xl[wg * 64 + r0 + 8] = l_part[1];
    }
    __syncthreads();
    float inv[2], lse_row[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        float l = l_part[i] + xl[(wg ^ 1) * 64 + r0 + i * 8];
        inv[i] = l > 0.f ? 1.f / l : 0.f;
        lse_row[i] = l > 0.f ? (m_run[i] + log2f(l)) * LN2 : -INFINITY;
    }
    const int head0 = hg * HEADS_PER_CTA;
    if (wg == 0 && (lane & 3) == 0) store_lse_rows(lse_row, r0, b, H, head0, split, n_splits, lse, part_lse);
    store_o_half(o_acc, inv, wg, r0, cq, b, H, head0, split, n_splits, out, part_o);
}

#define MLA_ARGS                                                                                   \
    const uint16_t *__restrict__ q, const void *__restrict__ kv, const int *__restrict__ slots,      \
        long long n_rows, int H, int K, float scale_log2, int tiles_per_split, uint16_t *__restrict__ out, \
        float *__restrict__ lse, float *__restrict__ part_o, float *__restrict__ part_lse

extern "C" __global__ void __launch_bounds__(NTHREADS, 1) mla_decode_bf16(MLA_ARGS) {
    mla_decode_body<false>(q, kv, slots, n_rows, H, K, scale_log2, tiles_per_split, out, lse, part_o, part_lse);
}

extern "C" __global__ void __launch_bounds__(NTHREADS, 1) mla_decode_fp8(MLA_ARGS) {
    mla_decode_body<true>(q, kv, slots, n_rows, H, K, scale_log2, tiles_per_split, out, lse, part_o, part_lse);
}

// ---------------------------------------------------------------------------------------------
// Warp-specialised wide kernel (H a multiple of 64): variant "ws", the default
// ---------------------------------------------------------------------------------------------
// One CTA = 64 heads of one request x one split, three warpgroups (384 threads).  The division of
// work follows FlashMLA's sm90 sparse decode (csrc/sm90/decode/sparse_fp8/splitkv_mla.cuh, read
// for its structure only):
//   WG0, consumer: S = Q K^T for the whole 64-token tile (wgmma m64n64k16: 4 KB of shared memory
//        per 64 K MACs instead of 3 KB per 32 K at N = 32), online softmax, P to shared memory for
//        WG1 and kept in registers as the A operand of its own O[:, 0:256] += P V (register-A
//        wgmma).  S of tile t+1 is issued before the P V of tile t is waited on.
//   WG1, consumer: O[:, 256:512] = alpha O + P V, P read from shared memory.
//   WG2, producer: fills two bf16 tile buffers.  bf16 rows: cp.async, the warpgroup split in two
//        halves of 64 threads, one per buffer, so both buffers can be in flight at once.  FP8 rows:
//        the next tile's raw rows are loaded into registers (2 threads per row) as soon as this
//        tile is dequantised, and dequantised into a buffer as soon as the consumers free it.
// Handoffs: mbarriers full[2] (producer -> consumers) and empty[2] (consumers -> producer); named
// barriers between WG0 and WG1 for P and the per-row rescale factors (P_READY, P_FREE).
// Registers: the launch cap is 168 (384 threads, 1 CTA / SM); setmaxnreg gives WG0 224, WG1 160,
// WG2 120.  Shared memory: Q 72 KB + two 72 KB tiles + P 8 KB + 1 KB = 226 KB (one CTA per SM).
#define NT_WS 384
#define WS_SMEM_SMALL (2 * HEADS_PER_CTA * 4 + 2 * TILE * 4 + 6 * 8)  // row scales, slots, mbarriers (5 used)
enum WsBarrier { BAR_P_READY = 1, BAR_P_FREE = 2, BAR_EPI = 3, BAR_PROD0 = 4, BAR_WG0 = 6, BAR_STAGE0 = 7 };

__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar) : "memory");
}
// An arrival on the peer CTA's mbarrier (`bar` already mapped by mapa_shared).
// Release at CTA scope, as FlashMLA's (CUTLASS ClusterBarrier::arrive(cta_id)): what it orders are
// this warp's wgmma reads of the buffer, complete already; .release.cluster compiled to
// MEMBAR.ALL.GPU + ERRBAR per tile (ncu: 3-4% of the kernel's stall samples).
__device__ __forceinline__ void mbar_arrive_cluster(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// An arrival that also announces `bytes` still to come by complete_tx (the peer's st.async).
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// BOUNDED (variant ws2, not yet run on a GPU): a handoff that never comes ends the wait after
// 2^20 polls (a legitimate wait is a few hundred), so a protocol bug gives wrong outputs,
// which the tests catch, instead of a hung GPU.
// The poll is warp-uniform (__all_sync): every caller is a whole warp, and what follows a wait
// (bar.sync / bar.arrive, the .aligned forms; wgmma .sync.aligned) needs the warp converged.
// The per-lane poll compiled to an out-of-line retry loop with no reconvergence before the
// BAR.SYNC after it (mla_decode_ws_fp8 SASS: TRYWAIT, @!P0 BRA to a spin, BAR.SYNC 0x1), so
// lanes that saw the phase complete at different polls reached the aligned barrier apart:
// undefined behaviour that depends on timing, a candidate cause of the once-seen
// cudaErrorIllegalInstruction (issue #27 item 5; docs/kernels.md). synccheck still reported
// "Divergent thread(s) in block" at BAR_EPI while all 384 threads met there at three bar.sync
// sites; BAR_EPI is now WG0's arrive and WG1's sync (see the producer's branch).
template <bool BOUNDED = false>
__device__ __forceinline__ void mbar_wait(uint32_t bar, int parity) {
    uint32_t ok = 0;
    for (uint32_t n = 0;; ++n) {
        asm volatile(
            "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(ok)
            : "r"(bar), "r"(parity)
            : "memory");
        if (__all_sync(0xffffffffu, ok)) break;
        if (BOUNDED && n > (1u << 20)) break;
    }
}
// bar.sync / bar.arrive are the .aligned forms: the warp must arrive converged. ptxas does not
// always reconverge a warp after a divergent branch (lanes (lane & 3) == 0 writing the row
// scales, the epilogue's lse stores) before the asm barrier, so each waits for its warp first.
__device__ __forceinline__ void named_sync(int id, int n) {
    __syncwarp();
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int n) {
    __syncwarp();
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}

// The epilogue through shared memory (variant "wsxo", one split): this warpgroup's bf16 half of O
// (64 heads x 256 values) into `stage` (512-byte rows padded to 528 B, so the 4-byte stores of a
// warp's 8 rows fall in 32 different banks), a barrier of the warpgroup's 128 threads, then
// 16-byte stores, one warp per 512-byte row piece (store_o_half: 4-byte stores, 16 B per row).
#define STAGE_ROW 528
__device__ __forceinline__ void store_o_half_staged(const float (&o_acc)[128], const float (&inv)[2], int wg, int r0,
                                                    int cq, long long b, int H, int head0, uint8_t* stage,
                                                    int bar_id, int ltid, uint16_t* out) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        uint8_t* srow = stage + (r0 + i * 8) * STAGE_ROW + cq * 2;
#pragma unroll
        for (int j = 0; j < 32; ++j) {
            __nv_bfloat162 v = __floats2bfloat162_rn(o_acc[j * 4 + i * 2] * inv[i], o_acc[j * 4 + i * 2 + 1] * inv[i]);
            *reinterpret_cast<__nv_bfloat162*>(srow + j * 16) = v;
        }
    }
    named_sync(bar_id, 128);
#pragma unroll
    for (int m = 0; m < 16; ++m) {
        const int u = ltid + 128 * m, row = u >> 5, c = u & 31;
        const uint4 v = *reinterpret_cast<const uint4*>(stage + row * STAGE_ROW + c * 16);
        *reinterpret_cast<uint4*>(out + (b * H + head0 + row) * D_V + wg * 256 + c * 8) = v;
    }
}

// 2^x by the MUFU alone (ex2.approx.ftz): exp2f adds a range test and two multiplies per call for
// results below 2^-126, which the bf16 P rounds to nothing that matters (flushed to 0 here).
// Used by the wide kernels' softmax, on WG0's critical path (32 calls per thread per tile).
__device__ __forceinline__ float exp2_ftz(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
__device__ __forceinline__ void wgmma_wait1() { asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void reg_alloc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N)); }
template <int N>
__device__ __forceinline__ void reg_dealloc() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N)); }

__device__ __forceinline__ void st_shared16(uint32_t addr, const uint4& v) {
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}

// Cluster helpers of the crossover kernel (variant "wsx", a cluster of two CTAs = the two head
// groups of one request and split).
__device__ __forceinline__ uint32_t cluster_ctarank() {
    uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
}
// The address in CTA `rank`'s shared memory of this CTA's shared address `addr` (same layout).
__device__ __forceinline__ uint32_t mapa_shared(uint32_t addr, uint32_t rank) {
    uint32_t r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(addr), "r"(rank));
    return r;
}
// Every thread of both CTAs; orders the mbarrier inits before any remote use, and keeps a CTA
// alive until its peer has stopped writing into its shared memory and barriers.
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}

// The two halves of cluster_sync, apart (variant "wsxb", SB): a thread arrives once the peer may
// rely on what it did before (relaxed: nothing to order; release: its remote arrives), and waits
// only where it needs the peer's arrival, so the barrier's round trip overlaps other work.
__device__ __forceinline__ void cluster_arrive_relaxed() { asm volatile("barrier.cluster.arrive.relaxed;\n" ::: "memory"); }
__device__ __forceinline__ void cluster_arrive_release() { asm volatile("barrier.cluster.arrive.release;\n" ::: "memory"); }
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire;\n" ::: "memory"); }
// `bytes` (a multiple of 16) from this CTA's shared memory at `src` to the peer's at `dst` (mapped
// by mapa_shared) by the bulk-copy engine; the peer's mbarrier `bar` (mapped) counts the bytes.
// The source was written by the generic proxy: fence.proxy.async and a barrier come first.
__device__ __forceinline__ void bulk_copy_to_peer(uint32_t dst, uint32_t src, uint32_t bytes, uint32_t bar) {
    asm volatile("cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                 ::"r"(dst), "r"(src), "r"(bytes), "r"(bar) : "memory");
}

// D[64 x 64] (+)= A[64 x 16] * B[16 x 64], A and B from shared memory, both K-major.
__device__ __forceinline__ void wgmma_m64n64k16(float (&d)[32], uint64_t desc_a, uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "%32, %33, p, 1, 1, 0, 0;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

// D[64 x 256] += A[64 x 16] * B[16 x 256], A from registers (4 x bf16x2 per thread, the
// accumulator layout of an m64nN product), B from shared memory MN-major.
__device__ __forceinline__ void wgmma_m64n256k16_rs(float (&d)[128], uint32_t a0, uint32_t a1, uint32_t a2,
                                                    uint32_t a3, uint64_t desc_b) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
        "{%128, %129, %130, %131}, %132, p, 1, 1, 1;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc_b));
}

// FP8 rows of one tile into registers, TPR threads per row (thread q: units q, q + TPR, ...); the
// row's slot comes in a register; a masked row (slot < 0) reads as zeros.
template <int TPR>
__device__ __forceinline__ void load_raw_row(RawRegs<TPR>& r, const uint8_t* kv, int slot, int q) {
    const uint4* src = reinterpret_cast<const uint4*>(kv + (long long)max(slot, 0) * FP8_ROW) + q;
#pragma unroll
    for (int m = 0; m < RawRegs<TPR>::N; ++m) {
        const bool ok = slot >= 0 && q + TPR * m < FP8_ROW / 16;
        r.v[m] = ok ? __ldg(src + TPR * m) : make_uint4(0, 0, 0, 0);
    }
}

// dequant_regs with shared-memory stores addressed as such (st.shared, not generic stores): row
// `row` of the tile at `tile`, thread q of the row's TPR holding units q + TPR m (load_raw_row).
template <int TPR>
__device__ __forceinline__ void dequant_row_smem(uint32_t tile, const RawRegs<TPR>& r, int row, int q) {
    constexpr int MS = 32 / TPR;  // m of unit 32 (the scales), held by q = 0
    float sc[4];
    sc[0] = __uint_as_float(__shfl_sync(0xffffffff, r.v[MS].x, 0, TPR));
    sc[1] = __uint_as_float(__shfl_sync(0xffffffff, r.v[MS].y, 0, TPR));
    sc[2] = __uint_as_float(__shfl_sync(0xffffffff, r.v[MS].z, 0, TPR));
    sc[3] = __uint_as_float(__shfl_sync(0xffffffff, r.v[MS].w, 0, TPR));
#pragma unroll
    for (int m = 0; m < MS; ++m) {  // unit u = q + TPR m < 32: latent values 16u .. 16u + 15
        const int u = q + TPR * m;
        uint4 lo, hi;
        e4m3x16_to_bf16(r.v[m], sc[(TPR * m) >> 3], lo, hi);
        const uint32_t chunk = tile + ((TPR * m) >> 2) * CHUNK_BYTES;
        st_shared16(chunk + swz(row, (u & 3) * 2), lo);
        st_shared16(chunk + swz(row, (u & 3) * 2 + 1), hi);
    }
#pragma unroll
    for (int m = MS; m < RawRegs<TPR>::N; ++m) {  // units 33 .. 40: the bf16 rope values
        const int u = q + TPR * m;
        if (u >= 33 && u <= 40) st_shared16(tile + 8 * CHUNK_BYTES + swz(row, u - 33), r.v[m]);
    }
}

// FP8 producer, rolling: unit m of this tile is dequantised into shared memory, then the same
// registers take unit m of the next tile's row (slot s_next; -1 loads zeros), so the next tile's
// loads are in flight while this tile converts instead of after it.
__device__ __forceinline__ void dequant_row_roll(uint32_t tile, RawRegs<2>& r, int row, int q, const uint8_t* kv,
                                                 int s_next) {
    constexpr int MS = 16;
    float sc[4];
    sc[0] = __uint_as_float(__shfl_sync(0xffffffff, r.v[MS].x, 0, 2));
    sc[1] = __uint_as_float(__shfl_sync(0xffffffff, r.v[MS].y, 0, 2));
    sc[2] = __uint_as_float(__shfl_sync(0xffffffff, r.v[MS].z, 0, 2));
    sc[3] = __uint_as_float(__shfl_sync(0xffffffff, r.v[MS].w, 0, 2));
    const uint4* src = reinterpret_cast<const uint4*>(kv + (long long)max(s_next, 0) * FP8_ROW) + q;
#pragma unroll
    for (int m = 0; m < RawRegs<2>::N; ++m) {
        const int u = q + 2 * m;
        if (m < MS) {
            uint4 lo, hi;
            e4m3x16_to_bf16(r.v[m], sc[(2 * m) >> 3], lo, hi);
            const uint32_t chunk = tile + ((2 * m) >> 2) * CHUNK_BYTES;
            st_shared16(chunk + swz(row, (u & 3) * 2), lo);
            st_shared16(chunk + swz(row, (u & 3) * 2 + 1), hi);
        } else if (u >= 33 && u <= 40) {
            st_shared16(tile + 8 * CHUNK_BYTES + swz(row, u - 33), r.v[m]);
        }
        const bool ok = s_next >= 0 && u < FP8_ROW / 16;
        r.v[m] = ok ? __ldg(src + 2 * m) : make_uint4(0, 0, 0, 0);
    }
}

// Crossover producer (variant "wsx", FlashMLA's SM90 FP8 decode does the same: the two CTAs of a
// cluster hold the two 64-head groups of one request and split and need the same bf16 tile, so
// each dequantises half of its rows, 32, into its own shared memory, 4 threads per row
// (load_raw_row<4>, dequant_row_smem<4>), and the bulk-copy engine copies them into the peer's;
// see docs/kernels.md).  A masked row is zeros like any other, so the peer's byte count is fixed.
// (Before: every thread wrote each unit to the peer too, st.async of 16 B: 2,304 remote stores per
// tile, each half a 128-byte line; B 64 / 128 H 128 on an H100 took 141.7 / 282.1 us against
// ws's 120.3 / 236.8 in the same run.)

// bf16 rows rg + 16 p (p < 4) of a tile, units sub + 8 c (c < 9) of each, by cp.async into the
// swizzled tile at `tile`; slot < 0 writes zeros.  36 copies per thread, addresses from registers.
__device__ __forceinline__ void issue_rows_bf16(uint32_t tile, const uint16_t* kv, const int (&sl)[4], int rg, int sub) {
#pragma unroll
    for (int p = 0; p < 4; ++p) {
        const int row = rg + 16 * p, slot = sl[p];
        const uint16_t* src = kv + (slot >= 0 ? (long long)slot * D_QK : 0) + sub * 8;
#pragma unroll
        for (int c = 0; c < NCHUNK; ++c)
            cp_async16(tile + c * CHUNK_BYTES + swz(row, sub), src + c * 64, slot >= 0 ? 16 : 0);
    }
}

// PROD selects the producer: 0 (variant "ws", run and measured) = bf16 by two 64-thread halves,
// one per buffer, cp.async then wait for all; FP8 dequantised after the next tile's loads land.
// 1 (variant "ws2", NOT yet run on a GPU in its present form) = bf16 by all 128 threads, slots
// in registers (issue_rows_bf16), the next tile issued before this one is waited on (cp.async
// groups); FP8 rolling (dequant_row_roll); shared memory addressed as such (LDS/STS, see smem).
// With PROD 1 bf16 the producer waits for tile t-1's buffer before it signals tile t, so WG0 must
// free tile t-1 before it waits for tile t (EARLY_FREE): the first version freed it only after
// issuing S of tile t and deadlocked on the GPU with more than one tile per CTA.
// XO (variant "wsx", FP8 and PROD 0 only, launched in clusters of two CTAs along x): the crossover
// producer above; full[i] then counts 128 local arrivals + 1 arrival that expects the peer's 32
// rows as bytes, and empty[i] 256 local consumer arrivals + 8, one per consumer warp of the peer
// (each CTA's producer writes into both CTAs' buffer i, so both CTAs' consumers must free it).
// EF (variant "wsxe"): WG0 frees tile t-1's buffer as soon as its P V of that tile is done, before
// it waits for tile t (as PROD 1 bf16 must), instead of after issuing tile t's S: both CTAs'
// producers may start tile t+1 while tile t is still in flight to WG0.
template <bool FP8, int PROD, bool XO = false, bool EF = false, bool SE = false, bool QE = false, bool DT = false,
          bool SB = false>
__device__ __forceinline__ void mla_ws_body(
    const uint16_t* __restrict__ q, const void* __restrict__ kv_raw, const int* __restrict__ slots,
    long long n_rows, int H, int K, float scale_log2, int tiles_per_split,
    uint16_t* __restrict__ out, float* __restrict__ lse, float* __restrict__ part_o,
    float* __restrict__ part_lse) {
    extern __shared__ uint8_t smem_raw[];
    // PROD 1: aligned by pointer arithmetic, so the compiler keeps the shared address space and
    // emits LDS/STS (the integer round trip of PROD 0 turns every access into a generic LD/ST)
    uint8_t* smem = PROD == 1 ? smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u)
                              : reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
    uint8_t* p_sm = smem + Q_BYTES + 2 * TILE_BYTES;
    float* s_scale = reinterpret_cast<float*>(p_sm + P_BYTES);  // [64] alpha of the current tile (WG0 -> WG1)
    float* s_oscale = s_scale + HEADS_PER_CTA;                   // [64] 1 / row sum (epilogue)
    int* slot_sm = reinterpret_cast<int*>(s_oscale + HEADS_PER_CTA);  // [2 buffers][64] validated slots
    const uint32_t q_s = smem_u32(smem), kv_s0 = q_s + Q_BYTES, p_s = smem_u32(p_sm);
    const uint32_t full0 = smem_u32(slot_sm + 2 * TILE), empty0 = full0 + 16;  // full[i] = full0 + 8 i
    const uint32_t q_bar = full0 + 32;  // QE: Q landed (every thread's share of it)

    const int tid = threadIdx.x, wg = tid >> 7, ltid = tid & 127, warp = ltid >> 5, lane = tid & 31;
    const int hg = blockIdx.x, split = blockIdx.y, b = blockIdx.z;
    const int n_splits = gridDim.y;
    const int tok_begin = split * tiles_per_split * TILE;
    const int tok_end = min(K, tok_begin + tiles_per_split * TILE);
    const int n_tiles = (tok_end - tok_begin + TILE - 1) / TILE;
    const int* slots_b = slots + (long long)b * K;
    const int head0 = hg * HEADS_PER_CTA;
    const int r0 = warp * 16 + (lane >> 2);  // accumulator rows r0, r0 + 8 (heads)
    const int cq = (lane & 3) * 2;

    static_assert(!XO || (FP8 && PROD == 0), "the crossover producer is FP8, PROD 0");
    static_assert(!QE || XO, "QE: only the crossover producer arrives on q_bar");
    static_assert(!DT || QE, "the delayed second tile (DT) comes with QE");
    static_assert(!SB || XO, "split cluster barriers (SB) are the crossover's");
    TL_GLOBAL(tid == 0, TL_GT_START);
    TL(tid == 0, TL_START);
    // QE: Q by all 384 threads, 12 copies each, issued before the barrier set-up (Q's shared
    // memory is this CTA's alone); each thread waits for its share where it has nothing else in
    // flight to wait for (WG0 at once, WG1 after its set-up, the producer after its first raw
    // rows are issued), fences it for the tensor cores and arrives on q_bar, which WG0 waits on.
    if (QE) {
        const uint16_t* q_rows = q + ((long long)b * H + head0) * D_QK;
#pragma unroll
        for (int i = 0; i < (HEADS_PER_CTA * 72) / NT_WS; ++i) {
            const int idx = tid + i * NT_WS, h = idx / 72, ci = idx - h * 72;
            cp_async16(q_s + (ci >> 3) * (HEADS_PER_CTA * 128) + swz(h, ci & 7), q_rows + h * D_QK + ci * 8, 16);
        }
        cp_async_commit();
    }
    auto q_share_landed = [&]() {
        if (QE) {
            cp_async_wait_all();
            fence_proxy_async();
            mbar_arrive(q_bar);
        }
    };
    const uint32_t rank = XO ? cluster_ctarank() : 0u, peer = rank ^ 1u;
    if (tid == 0) {
        if (QE) mbar_init(q_bar, NT_WS);
        const int n_full = XO ? 129 : (FP8 || PROD == 1) ? 128 : 64, n_empty = XO ? 256 + 8 : 256;
        mbar_init(full0, n_full);
        mbar_init(full0 + 8, n_full);
        mbar_init(empty0, n_empty);
        mbar_init(empty0 + 8, n_empty);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    // SB: the barriers are initialised for this CTA at the __syncthreads; the cluster arrival
    // (relaxed, after fence.mbarrier_init, as FlashMLA's kernel does it) is waited on only before
    // a thread's first remote operation, so the producer's first loads go out without it.
    if (XO && !SB) cluster_sync();
    else __syncthreads();
    if (SB) cluster_arrive_relaxed();
    // A consumer thread frees buffer i: locally, and for XO once per warp on the peer's empty[i]
    // (its wgmma reads of the buffer are complete: the caller waited on them).
    auto release = [&](uint32_t empty_bar) {
        mbar_arrive(empty_bar);
        if (XO) {
            __syncwarp();
            if (lane == 0) mbar_arrive_cluster(mapa_shared(empty_bar, peer));
        }
    };

    if (wg == 0) {
        // ------------------------------ consumer 0: S, softmax, P V (left half) ---------------
        reg_alloc<XO ? 216 : 224>();  // XO: 8 registers to the producer's two raw tiles
        if (QE) {
            q_share_landed();
            mbar_wait(q_bar, 0);
        } else {
            const uint16_t* q_rows = q + ((long long)b * H + head0) * D_QK;
#pragma unroll
            for (int i = 0; i < (HEADS_PER_CTA * 72) / 128; ++i) {
                const int idx = ltid + i * 128, h = idx / 72, ci = idx - h * 72;
                cp_async16(q_s + (ci >> 3) * (HEADS_PER_CTA * 128) + swz(h, ci & 7), q_rows + h * D_QK + ci * 8, 16);
            }
            cp_async_commit();
            cp_async_wait_all();
            fence_proxy_async();
            named_sync(BAR_WG0, 128);
        }
        TL(ltid == 0, TL_Q_READY);

        float o_acc[128];
#pragma unroll
        for (int i = 0; i < 128; ++i) o_acc[i] = 0.f;
        float s_acc[32];
        uint32_t pa[16];  // P as bf16x2 A fragments: k-step s holds pa[4 s .. 4 s + 3]
#pragma unroll
        for (int i = 0; i < 16; ++i) pa[i] = 0u;
        float m_run[2] = {-INFINITY, -INFINITY}, l_part[2] = {0.f, 0.f};
        const uint64_t dq = make_desc(q_s, 16, 1024);

        constexpr bool EARLY_FREE = (PROD == 1 && !FP8) || EF;
        if (SB) cluster_wait();  // before its first arrival on the peer's empty barrier
        TL(SB && ltid == 0, TL_PAIR);
        for (int it = 0; it < n_tiles; ++it) {
            const int buf = it & 1;
            const uint32_t kv_cur = kv_s0 + buf * TILE_BYTES;
            if (EARLY_FREE && it > 0) {
                wgmma_wait0();  // P V of tile it-1 done: its buffer is free
                release(empty0 + 8 * (buf ^ 1));
            }
            TL_TILE(ltid == 0, TL_FREED, it);
            mbar_wait<PROD == 1>(full0 + 8 * buf, (it >> 1) & 1);
            TL_TILE(ltid == 0, TL_FULL, it);

            // ---- S = Q K^T: 64 heads x 64 tokens, 36 k-steps ----
            const uint64_t dk = make_desc(kv_cur, 16, 1024);
            wgmma_fence();
#pragma unroll
            for (int s = 0; s < 36; ++s) {
                const uint32_t off = (s >> 2) * (HEADS_PER_CTA * 128) + (s & 3) * 32;
                const uint32_t offk = (s >> 2) * CHUNK_BYTES + (s & 3) * 32;
                wgmma_m64n64k16(s_acc, dq + (off >> 4), dk + (offk >> 4), s > 0);
            }
            wgmma_commit();
            uint32_t valid = 0;  // this thread's 16 score columns: 8 j + cq + c
#pragma unroll
            for (int j = 0; j < 8; ++j)
#pragma unroll
                for (int c = 0; c < 2; ++c) valid |= (slot_sm[buf * TILE + j * 8 + cq + c] >= 0 ? 1u : 0u) << (j * 2 + c);
            if (!EARLY_FREE && it > 0) {
                wgmma_wait1();  // P V of tile it-1 done: its buffer is free
                release(empty0 + 8 * (buf ^ 1));
            }
            wgmma_wait0();

            // ---- online softmax over the tile (log2 domain), rows whole in this warpgroup ----
            float m_loc[2] = {-INFINITY, -INFINITY};
            mask_scale_row_max<8>(s_acc, valid, scale_log2, m_loc);
            float alpha[2], m_use[2];
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                m_loc[i] = fmaxf(m_loc[i], __shfl_xor_sync(0xffffffff, m_loc[i], 1));
                m_loc[i] = fmaxf(m_loc[i], __shfl_xor_sync(0xffffffff, m_loc[i], 2));
                const float m_new = fmaxf(m_run[i], m_loc[i]);
                m_use[i] = m_new == -INFINITY ? 0.f : m_new;  // all masked so far: p = 0, no NaN
                alpha[i] = exp2_ftz(m_run[i] - m_use[i]);
                m_run[i] = m_new;
                l_part[i] *= alpha[i];
            }
#pragma unroll
            for (int j = 0; j < 8; ++j)
#pragma unroll
                for (int i = 0; i < 2; ++i) {
                    const float p0 = exp2_ftz(s_acc[j * 4 + i * 2] - m_use[i]);
                    const float p1 = exp2_ftz(s_acc[j * 4 + i * 2 + 1] - m_use[i]);
                    __nv_bfloat162 pb = __floats2bfloat162_rn(p0, p1);
                    const float2 pr = __bfloat1622float2(pb);  // sum what the MMA will see
                    l_part[i] += pr.x + pr.y;
                    pa[(j >> 1) * 4 + (j & 1) * 2 + i] = *reinterpret_cast<uint32_t*>(&pb);
                }
            rescale_rows(o_acc, alpha[0], alpha[1]);
            if (it > 0) named_sync(BAR_P_FREE, 256);  // WG1 done with the previous P and scales
#pragma unroll
            for (int j = 0; j < 8; ++j)
#pragma unroll
                for (int i = 0; i < 2; ++i) {
                    const int r = r0 + i * 8, col = j * 8 + cq;
                    *reinterpret_cast<uint32_t*>(p_sm + swz(r, col >> 3) + (col & 7) * 2) = pa[(j >> 1) * 4 + (j & 1) * 2 + i];
                }
            if ((lane & 3) == 0) {
                s_scale[r0] = alpha[0];
                s_scale[r0 + 8] = alpha[1];
            }
            fence_proxy_async();
            named_arrive(BAR_P_READY, 256);

            // ---- O[:, 0:256] += P V, P from registers ----
            const uint64_t dv = make_desc(kv_cur, CHUNK_BYTES, 1024);
            wgmma_fence();
#pragma unroll
            for (int s = 0; s < 4; ++s)
                wgmma_m64n256k16_rs(o_acc, pa[s * 4], pa[s * 4 + 1], pa[s * 4 + 2], pa[s * 4 + 3],
                                    dv + ((s * 16 * 128) >> 4));
            wgmma_commit();
            TL_TILE(ltid == 0, TL_PV, it);
        }
        wgmma_wait0();
        if (SB) cluster_arrive_release();  // its last remote arrival is out: the peer may exit after the epilogue
        TL(ltid == 0, TL_LOOP_END);

        // ---- epilogue: full row sums are here; hand 1 / l to WG1, write lse and the left half ----
        float inv[2], lse_row[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            l_part[i] += __shfl_xor_sync(0xffffffff, l_part[i], 1);
            l_part[i] += __shfl_xor_sync(0xffffffff, l_part[i], 2);
            inv[i] = l_part[i] > 0.f ? 1.f / l_part[i] : 0.f;
            lse_row[i] = l_part[i] > 0.f ? (m_run[i] + log2f(l_part[i])) * LN2 : -INFINITY;
        }
        if ((lane & 3) == 0) {
            s_oscale[r0] = inv[0];
            s_oscale[r0 + 8] = inv[1];
            store_lse_rows(lse_row, r0, b, H, head0, split, n_splits, lse, part_lse);
        }
        // XO + SE: the buffer both warpgroups stage O in below is tile n - 2's, which this CTA's
        // producer also bulk-copied into the peer; nothing else orders that copy's reads before the
        // staged stores. The peer's consumers free tile n - 2 on this CTA's empty barrier only after
        // the copy landed there, so that phase is the order (WG1 stages after BAR_EPI, after this);
        // the producer never waits this phase (no tile n), and the peer finished tile n - 2 a tile
        // ago, so the wait is a formality (tests/test_crossover_protocol.py finds the race without it).
        if (XO && SE && n_splits == 1 && n_tiles >= 2) mbar_wait(empty0 + 8 * (n_tiles & 1), ((n_tiles - 2) >> 1) & 1);
        named_arrive(BAR_EPI, 256);  // 1 / l published for WG1; WG0 itself need not wait
        // SE: staged in the tile buffer the last tile did not use (its last reader, WG1's P V of
        // tile n - 2, finished before WG1 freed P for tile n - 1; no producer writes past tile n - 1)
        if (SE && n_splits == 1)
            store_o_half_staged(o_acc, inv, 0, r0, cq, b, H, head0, smem + Q_BYTES + (((n_tiles - 1) & 1) ^ 1) * TILE_BYTES,
                                BAR_STAGE0, ltid, out);
        else
            store_o_half(o_acc, inv, 0, r0, cq, b, H, head0, split, n_splits, out, part_o);
        TL(ltid == 0, TL_EPI_END);
    } else if (wg == 1) {
        // ------------------------------ consumer 1: P V (right half) --------------------------
        reg_dealloc<160>();
        q_share_landed();
        float o_acc[128];
#pragma unroll
        for (int i = 0; i < 128; ++i) o_acc[i] = 0.f;
        const uint64_t dp = make_desc(p_s, 16, 1024);
        if (SB) cluster_wait();
        for (int it = 0; it < n_tiles; ++it) {
            const int buf = it & 1;
            const uint32_t kv_cur = kv_s0 + buf * TILE_BYTES;
            mbar_wait<PROD == 1>(full0 + 8 * buf, (it >> 1) & 1);
            named_sync(BAR_P_READY, 256);
            rescale_rows(o_acc, s_scale[r0], s_scale[r0 + 8]);
            const uint64_t dv = make_desc(kv_cur + 4 * CHUNK_BYTES, CHUNK_BYTES, 1024);
            wgmma_fence();
#pragma unroll
            for (int s = 0; s < 4; ++s)
                wgmma_m64n256k16<1>(o_acc, dp + ((s * 32) >> 4), dv + ((s * 16 * 128) >> 4), 1);
            wgmma_commit();
            wgmma_wait0();
            if (it + 1 < n_tiles) named_arrive(BAR_P_FREE, 256);
            release(empty0 + 8 * buf);
            TL_TILE(ltid == 0, TL_WG1_FREED, it);
        }
        if (SB) cluster_arrive_release();
        named_sync(BAR_EPI, 256);  // WG0's 1 / l
        const float inv[2] = {s_oscale[r0], s_oscale[r0 + 8]};
        if (SE && n_splits == 1)  // the same buffer as WG0's, past its 64 rows (WG0 is done with every tile)
            store_o_half_staged(o_acc, inv, 1, r0, cq, b, H, head0,
                                smem + Q_BYTES + (((n_tiles - 1) & 1) ^ 1) * TILE_BYTES + HEADS_PER_CTA * STAGE_ROW,
                                BAR_STAGE0 + 1, ltid, out);
        else
            store_o_half(o_acc, inv, 1, r0, cq, b, H, head0, split, n_splits, out, part_o);
    } else {
        // ------------------------------ producer: gather (and dequantise) tiles ---------------
        reg_dealloc<XO ? 128 : 120>();
        if (!FP8 && PROD == 1) {
            // thread = (row group rg, unit sub): rows rg + 16 p (p < 4), units sub + 8 c of each
            // (c < 9: chunk c, unit sub), so 8 lanes read one 128-byte piece of a row; the slots
            // stay in registers (read from global a tile ahead), no dependent load before a copy
            const uint16_t* kv16 = static_cast<const uint16_t*>(kv_raw);
            const int sub = ltid & 7, rg = ltid >> 3;
            int sa[4], sb[4];
#pragma unroll
            for (int p = 0; p < 4; ++p) {
                sa[p] = fetch_slot(slots_b, tok_begin + rg + 16 * p, tok_end, n_rows);
                sb[p] = fetch_slot(slots_b, tok_begin + TILE + rg + 16 * p, tok_end, n_rows);
            }
            if (n_tiles > 0) {
                issue_rows_bf16(kv_s0, kv16, sa, rg, sub);
                if (sub == 0) {
#pragma unroll
                    for (int p = 0; p < 4; ++p) slot_sm[rg + 16 * p] = sa[p];
                }
                cp_async_commit();
            }
            for (int it = 0; it < n_tiles; ++it) {
                if (it + 1 < n_tiles) {  // tile it+1 in flight before tile it is waited on
                    const int b1 = (it + 1) & 1;
                    if (it + 1 >= 2) mbar_wait<PROD == 1>(empty0 + 8 * b1, (((it + 1) >> 1) - 1) & 1);
                    if (sub == 0) {
#pragma unroll
                        for (int p = 0; p < 4; ++p) slot_sm[b1 * TILE + rg + 16 * p] = sb[p];
                    }
                    issue_rows_bf16(kv_s0 + b1 * TILE_BYTES, kv16, sb, rg, sub);
                    cp_async_commit();
#pragma unroll
                    for (int p = 0; p < 4; ++p)
                        sb[p] = fetch_slot(slots_b, tok_begin + (it + 2) * TILE + rg + 16 * p, tok_end, n_rows);
                    cp_async_wait1();
                } else {
                    cp_async_wait_all();
                }
                fence_proxy_async();
                mbar_arrive(full0 + 8 * (it & 1));
            }
        } else if (!FP8) {
            const uint16_t* kv16 = static_cast<const uint16_t*>(kv_raw);
            const int half = ltid >> 6, lt = ltid & 63;  // half h fills buffer h with tiles h, h + 2, ...
            const uint32_t kvb = kv_s0 + half * TILE_BYTES;
            int* sl = slot_sm + half * TILE;
            int nxt = fetch_slot(slots_b, tok_begin + half * TILE + lt, tok_end, n_rows);
            for (int it = half, use = 0; it < n_tiles; it += 2, ++use) {
                if (use > 0) mbar_wait<PROD == 1>(empty0 + 8 * half, (use - 1) & 1);
                sl[lt] = nxt;
                named_sync(BAR_PROD0 + half, 64);
                nxt = fetch_slot(slots_b, tok_begin + (it + 2) * TILE + lt, tok_end, n_rows);
                load_tile_bf16<64>(kvb, kv16, sl, lt);
                cp_async_commit();
                cp_async_wait_all();
                fence_proxy_async();
                mbar_arrive(full0 + 8 * half);
            }
        } else if (XO) {
            // crossover: rows 32 rank .. 32 rank + 31 of each tile, 4 threads per row; the other
            // half arrives from the peer.  Each thread also validates one of the peer's rows
            // (q = 1), so this CTA's consumers see all 64 slots.  Two tiles of raw rows in
            // registers (ra: even tiles, rb: odd): tile t + 2's loads are issued as soon as tile t
            // is dequantised, so they have a whole tile's time to land (ws issues tile t + 1's
            // after tile t and waits for them at the next tile).
            const uint8_t* kv8 = static_cast<const uint8_t*>(kv_raw);
            const int row = 32 * rank + (ltid >> 2), orow = 32 * peer + (ltid >> 2), qq = ltid & 3;
            const uint32_t peer_kv0 = mapa_shared(kv_s0, peer), peer_full0 = mapa_shared(full0, peer);
            RawRegs<4> ra, rb;
            int sa = fetch_slot(slots_b, tok_begin + row, tok_end, n_rows);
            int sb = fetch_slot(slots_b, tok_begin + TILE + row, tok_end, n_rows);
            int s_pre = load_slot(slots_b, tok_begin + 2 * TILE + row, tok_end);  // tile it + 2, unchecked
            int o_cur = qq == 1 ? load_slot(slots_b, tok_begin + orow, tok_end) : -1;  // the peer's row, unchecked
            load_raw_row<4>(ra, kv8, sa, qq);
            if (!DT) load_raw_row<4>(rb, kv8, sb, qq);  // DT: after tile 0 is out (a smaller first burst)
            q_share_landed();
            if (SB) cluster_wait();  // before its first bulk copy into the peer
            auto step = [&](int it, RawRegs<4>& raw, int& s_this) {
                const int buf = it & 1;
                if (it >= 2) mbar_wait(empty0 + 8 * buf, ((it >> 1) - 1) & 1);
                TL_TILE(ltid == 0, TL_EMPTY, it);
                if (ltid == 0) mbar_arrive_expect_tx(full0 + 8 * buf, 32 * NCHUNK * 128);  // the peer's 32 rows
                if (qq == 0) slot_sm[buf * TILE + row] = s_this;
                if (qq == 1) slot_sm[buf * TILE + orow] = checked_slot(o_cur, n_rows);
                dequant_row_smem<4>(kv_s0 + buf * TILE_BYTES, raw, row, qq);
                fence_proxy_async();
                __syncwarp();  // this warp's 8 rows are written and visible to the async proxy
                if (lane == 0) {  // they are 1 KB in a row in each chunk: 9 bulk copies per warp
                    const uint32_t rows8 = kv_s0 + buf * TILE_BYTES + (32 * rank + 8 * warp) * 128;
#pragma unroll
                    for (int c = 0; c < NCHUNK; ++c)
                        bulk_copy_to_peer(peer_kv0 + (rows8 - kv_s0) + c * CHUNK_BYTES, rows8 + c * CHUNK_BYTES, 8 * 128,
                                          peer_full0 + 8 * buf);
                }
                mbar_arrive(full0 + 8 * buf);
                TL_TILE(ltid == 0, TL_ARRIVED, it);
                if (DT && it == 0 && n_tiles > 1) load_raw_row<4>(rb, kv8, sb, qq);
                if (it + 2 < n_tiles) {
                    s_this = checked_slot(s_pre, n_rows);
                    load_raw_row<4>(raw, kv8, s_this, qq);
                    s_pre = load_slot(slots_b, tok_begin + (it + 3) * TILE + row, tok_end);
                }
                if (qq == 1) o_cur = load_slot(slots_b, tok_begin + (it + 1) * TILE + orow, tok_end);
            };
            for (int it = 0; it < n_tiles; it += 2) {
                step(it, ra, sa);
                if (it + 1 < n_tiles) step(it + 1, rb, sb);
            }
            // the peer's consumers arrive only after their last tile is full, so the bulk copies'
            // source (this CTA's buffers) outlives them
            if (SB) cluster_arrive_release();
        } else if (PROD == 1) {
            const uint8_t* kv8 = static_cast<const uint8_t*>(kv_raw);
            const int row = ltid >> 1, qq = ltid & 1;
            RawRegs<2> raw;
            int s_cur = fetch_slot(slots_b, tok_begin + row, tok_end, n_rows);
            int s_nxt = fetch_slot(slots_b, tok_begin + TILE + row, tok_end, n_rows);
            load_raw_row(raw, kv8, s_cur, qq);
            for (int it = 0; it < n_tiles; ++it) {
                const int buf = it & 1;
                if (it >= 2) mbar_wait<PROD == 1>(empty0 + 8 * buf, ((it >> 1) - 1) & 1);
                if (qq == 0) slot_sm[buf * TILE + row] = s_cur;
                dequant_row_roll(kv_s0 + buf * TILE_BYTES, raw, row, qq, kv8, s_nxt);  // loads tile it+1
                fence_proxy_async();
                mbar_arrive(full0 + 8 * buf);
                s_cur = s_nxt;
                s_nxt = fetch_slot(slots_b, tok_begin + (it + 2) * TILE + row, tok_end, n_rows);
            }
        } else {
            const uint8_t* kv8 = static_cast<const uint8_t*>(kv_raw);
            const int row = ltid >> 1, qq = ltid & 1;
            RawRegs<2> raw;
            int s_cur = fetch_slot(slots_b, tok_begin + row, tok_end, n_rows);
            int s_nxt = fetch_slot(slots_b, tok_begin + TILE + row, tok_end, n_rows);
            load_raw_row(raw, kv8, s_cur, qq);
            for (int it = 0; it < n_tiles; ++it) {
                const int buf = it & 1;
                if (it >= 2) mbar_wait<PROD == 1>(empty0 + 8 * buf, ((it >> 1) - 1) & 1);
                if (qq == 0) slot_sm[buf * TILE + row] = s_cur;
                dequant_row_smem(kv_s0 + buf * TILE_BYTES, raw, row, qq);
                fence_proxy_async();
                mbar_arrive(full0 + 8 * buf);
                if (it + 1 < n_tiles) {
                    s_cur = s_nxt;
                    load_raw_row(raw, kv8, s_cur, qq);
                    s_nxt = fetch_slot(slots_b, tok_begin + (it + 2) * TILE + row, tok_end, n_rows);
                }
            }
        }
        // The producer takes no part in the epilogue: BAR_EPI is WG0's arrive and WG1's sync
        // (256 threads, the P_READY pattern). With all 384 threads at three different bar.sync
        // sites (the earlier form), compute-sanitizer synccheck reported "Divergent thread(s)
        // in block" at BAR_EPI (issue #27 item 4).
    }
    // No CTA of the pair leaves while the other may still arrive on its barriers or read its
    // buffers (the peer's bulk copies come from here): SB waits for the arrivals made above.
    if (XO && SB) {
        cluster_wait();
    } else if (XO) {
        __syncwarp();
        cluster_sync();
    }
    TL(tid == 0, TL_END);
    TL_GLOBAL(tid == 0, TL_GT_END);
}

extern "C" __global__ void __launch_bounds__(NT_WS, 1) mla_decode_ws_bf16(MLA_ARGS) {
    mla_ws_body<false, 0>(q, kv, slots, n_rows, H, K, scale_log2, tiles_per_split, out, lse, part_o, part_lse);
}

extern "C" __global__ void __launch_bounds__(NT_WS, 1) mla_decode_ws_fp8(MLA_ARGS) {
    mla_ws_body<true, 0>(q, kv, slots, n_rows, H, K, scale_log2, tiles_per_split, out, lse, part_o, part_lse);
}

// Crossover: clusters of two CTAs along x (the grid's head groups; H a multiple of 128).
extern "C" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(NT_WS, 1) mla_decode_wsx_fp8(MLA_ARGS) {
    mla_ws_body<true, 0, true>(q, kv, slots, n_rows, H, K, scale_log2, tiles_per_split, out, lse, part_o, part_lse);
}

extern "C" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(NT_WS, 1) mla_decode_wsxe_fp8(MLA_ARGS) {
    mla_ws_body<true, 0, true, true>(q, kv, slots, n_rows, H, K, scale_log2, tiles_per_split, out, lse, part_o, part_lse);
}

// wsxe whose warpgroups write O through shared memory (16-byte stores) instead of 4-byte stores
extern "C" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(NT_WS, 1) mla_decode_wsxo_fp8(MLA_ARGS) {
    mla_ws_body<true, 0, true, true, true>(q, kv, slots, n_rows, H, K, scale_log2, tiles_per_split, out, lse, part_o, part_lse);
}

// wsxo with Q loaded by all three warpgroups before the barrier set-up (QE) and the producer
// issuing tile 1's raw rows only once tile 0 is out (DT): a smaller first burst. (QE alone, built
// as "wsxq" and timed once on an H100, was 0-0.6% slower than wsxo: the producer's wait for its
// share of Q delayed tile 0; BENCHMARKS.md.)
extern "C" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(NT_WS, 1) mla_decode_wsxr_fp8(MLA_ARGS) {
    mla_ws_body<true, 0, true, true, true, true, true>(q, kv, slots, n_rows, H, K, scale_log2, tiles_per_split, out, lse, part_o, part_lse);
}

// wsxr with the cluster barriers split (SB): at the start each thread waits for the pair's
// arrival only before its first remote operation; at the end each warpgroup arrives once its
// last remote operation is out (before the epilogue) and waits at the very end, so neither the
// barrier's round trip nor the epilogue's global stores (a release orders them) sit on the exit.
extern "C" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(NT_WS, 1) mla_decode_wsxb_fp8(MLA_ARGS) {
    mla_ws_body<true, 0, true, true, true, true, true, true>(q, kv, slots, n_rows, H, K, scale_log2, tiles_per_split, out, lse, part_o, part_lse);
}

extern "C" __global__ void __launch_bounds__(NT_WS, 1) mla_decode_ws2_bf16(MLA_ARGS) {
    mla_ws_body<false, 1>(q, kv, slots, n_rows, H, K, scale_log2, tiles_per_split, out, lse, part_o, part_lse);
}

extern "C" __global__ void __launch_bounds__(NT_WS, 1) mla_decode_ws2_fp8(MLA_ARGS) {
    mla_ws_body<true, 1>(q, kv, slots, n_rows, H, K, scale_log2, tiles_per_split, out, lse, part_o, part_lse);
}

// ---------------------------------------------------------------------------------------------
// Narrow kernel: any H (8 or 16 heads per GPU under TP attention, MTP tokens folded into heads)
// ---------------------------------------------------------------------------------------------
// One CTA = one warpgroup (128 threads) = up to 16 query heads of one request x one split.
// The two products are transposed so that no tensor-core work goes to padding heads:
//   S^T = K Q^T    : wgmma m64n16k16, M = the tile's 64 tokens (A = the K tile, K-major),
//                    N = 16 heads (B = Q, K-major)
//   O^T += V^T P^T : 8 x wgmma m64n16k16, M = 64 latent values (A = the same tile read MN-major),
//                    K = 64 tokens, N = 16 heads (B = P^T stored [head][token], K-major)
// Softmax runs per head over the tile's tokens, which sit in the 4 warps' accumulator rows: the
// tile's max is exchanged once per tile through shared memory; row sums are reduced at the end.
// Heads past H in the last head group are zero rows of Q and are never written.
// bf16 rows: cp.async straight into two swizzled tile buffers, the next tile issued while this
// tile's S MMAs run (refilling a buffer with tile t+2 right after tile t instead was slower: the
// issue then sits on the critical path, 118 -> 131 us at B 128 H 8).  FP8 rows: the next tile's
// raw rows are loaded into registers (21 x 16 B per thread) before this tile's MMAs and
// dequantised into the one bf16 tile after them; with no staging buffer a CTA needs 95 KB, so two
// CTAs share an SM and one's dequantisation overlaps the other's MMAs.
#define NH 16
#define NT_NARROW 128
#define QN_CHUNK (NH * 128)
#define QN_BYTES (NCHUNK * QN_CHUNK)  // 18432
#define PN_BYTES (NH * 128)           // P^T: 16 heads x 64 tokens bf16
#define XN_BYTES (2 * 4 * NH * 4)     // per warp and head: tile max, final row sum
#define RING_BYTES (4 * TILE * 4)     // validated slots of tiles t .. t+3

// D[64 x 16] (+)= A[64 x 16] * B[16 x 16]; A from shared memory, K-major (TRANS_A 0) or
// MN-major (TRANS_A 1); B K-major.
template <int TRANS_A>
__device__ __forceinline__ void wgmma_m64n16k16(float (&d)[8], uint64_t desc_a, uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %10, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, %11, 0;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
        : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(TRANS_A));
}

// Q rows of this CTA's heads -> swizzled smem [9 chunks][16 rows][128 B]; rows >= n_heads are 0.
__device__ __forceinline__ void load_q_narrow(uint32_t q_s, const uint16_t* q_rows, int n_heads, int tid) {
#pragma unroll
    for (int i = 0; i < (NH * 72) / NT_NARROW; ++i) {
        int idx = tid + i * NT_NARROW;
        int h = idx / 72, ci = idx - h * 72;
        bool ok = h < n_heads;
        cp_async16(q_s + (ci >> 3) * QN_CHUNK + swz(h, ci & 7), q_rows + (ok ? h * D_QK + ci * 8 : 0), ok ? 16 : 0);
    }
}

// grid = (ceil(H / 16), n_splits, B)
// One bf16 tile by the narrow kernel's 128 threads: G2 = false the original mapping
// (load_tile_bf16), G2 = true rows tid/8 + 16 p with their slots read once (issue_rows_bf16).
template <bool G2>
__device__ __forceinline__ void narrow_tile_bf16(uint32_t kv_s, const uint16_t* kv, const int* slot_tile, int tid) {
    if (G2) {
        const int rg = tid >> 3, sub = tid & 7;
        int sl[4];
#pragma unroll
        for (int p = 0; p < 4; ++p) sl[p] = slot_tile[rg + 16 * p];
        issue_rows_bf16(kv_s, kv, sl, rg, sub);
    } else {
        load_tile_bf16<NT_NARROW>(kv_s, kv, slot_tile, tid);
    }
}

// G2 (variant "narrow2", NOT yet run on a GPU): the shared-memory base aligned by pointer
// arithmetic, so shared accesses are LDS/STS instead of generic LD/ST, and the bf16 gather
// reads each thread's 4 row slots once (issue_rows_bf16) instead of one generic load before
// every cp.async (the SASS of G2 = false shows LD.E, LDGSTS, LD.E, ...).
template <bool FP8, bool G2 = false>
__device__ __forceinline__ void mla_narrow_body(
    const uint16_t* __restrict__ q, const void* __restrict__ kv_raw, const int* __restrict__ slots,
    long long n_rows, int H, int K, float scale_log2, int tiles_per_split,
    uint16_t* __restrict__ out, float* __restrict__ lse, float* __restrict__ part_o,
    float* __restrict__ part_lse) {
    extern __shared__ uint8_t smem_raw[];
    uint8_t* smem = G2 ? smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u)
                       : reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
    uint8_t* kv_sm0 = smem + QN_BYTES;
    uint8_t* p_sm = smem + QN_BYTES + (FP8 ? 1 : 2) * TILE_BYTES;
    float* xm = reinterpret_cast<float*>(p_sm + PN_BYTES);  // [4 warps][16 heads] tile max
    float* xl = xm + 4 * NH;                                // [4 warps][16 heads] row sum
    int* ring = reinterpret_cast<int*>(p_sm + PN_BYTES + XN_BYTES);  // [4][64]

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int hg = blockIdx.x, split = blockIdx.y, b = blockIdx.z;
    const int n_splits = gridDim.y;
    const int head0 = hg * NH, n_heads = min(NH, H - head0);
    const int tok_begin = split * tiles_per_split * TILE;
    const int tok_end = min(K, tok_begin + tiles_per_split * TILE);
    const int n_tiles = (tok_end - tok_begin + TILE - 1) / TILE;
    const int* slots_b = slots + (long long)b * K;
    const uint16_t* q_rows = q + ((long long)b * H + head0) * D_QK;
    const uint8_t* kv8 = static_cast<const uint8_t*>(kv_raw);
    const uint16_t* kv16 = static_cast<const uint16_t*>(kv_raw);

    const uint32_t q_s = smem_u32(smem), p_s = smem_u32(p_sm);
    const uint32_t kv_s0 = smem_u32(kv_sm0), kv_s1 = kv_s0 + (FP8 ? 0 : TILE_BYTES);

    const int tr0 = warp * 16 + (lane >> 2);  // accumulator rows tr0, tr0 + 8 (tokens of S^T)
    const int hq = (lane & 3) * 2;            // accumulator columns: heads 8j + hq + c

    float o_acc[8][8];
#pragma unroll
    for (int mb = 0; mb < 8; ++mb)
#pragma unroll
        for (int e = 0; e < 8; ++e) o_acc[mb][e] = 0.f;
    float s_acc[8];
    float m_run[4], l_part[4];  // [j * 2 + c]: head 8j + hq + c
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        m_run[e] = -INFINITY;
        l_part[e] = 0.f;
    }

    if (tid < TILE) {
#pragma unroll
        for (int t = 0; t < 3; ++t) ring[t * TILE + tid] = fetch_slot(slots_b, tok_begin + t * TILE + tid, tok_end, n_rows);
    }
    __syncthreads();
    load_q_narrow(q_s, q_rows, n_heads, tid);
    RawRegs<2> raw;  // FP8: the next tile's rows, in flight during this tile's MMAs
    if (FP8) {
        load_raw_regs(raw, kv8, ring, tid);
        cp_async_commit();
        cp_async_wait_all();
        dequant_regs(kv_sm0, raw, tid);
        fence_proxy_async();
        if (n_tiles > 1) load_raw_regs(raw, kv8, ring + TILE, tid);
    } else {
        narrow_tile_bf16<G2>(kv_s0, kv16, ring, tid);
        cp_async_commit();
    }

    for (int it = 0; it < n_tiles; ++it) {
        const uint32_t kv_cur = (FP8 || !(it & 1)) ? kv_s0 : kv_s1;
        if (!FP8) {
            cp_async_wait_all();
            fence_proxy_async();
        }
        __syncthreads();  // tile `it` visible; every warp done with tile it-1 (its buffers are free)
        const int* sl_cur = ring + (it & 3) * TILE;
        const int pre = tid < TILE ? fetch_slot(slots_b, tok_begin + (it + 3) * TILE + tid, tok_end, n_rows) : -1;

        // ---- S^T = K Q^T: 64 tokens x 16 heads, 36 k-steps ----
        const uint64_t dk = make_desc(kv_cur, 16, 1024);
        const uint64_t dq = make_desc(q_s, 16, 1024);
        wgmma_fence();
#pragma unroll
        for (int s = 0; s < 36; ++s) {
            const uint32_t offk = (s >> 2) * CHUNK_BYTES + (s & 3) * 32;
            const uint32_t offq = (s >> 2) * QN_CHUNK + (s & 3) * 32;
            wgmma_m64n16k16<0>(s_acc, dk + (offk >> 4), dq + (offq >> 4), s > 0);
        }
        wgmma_commit();
        if (!FP8 && it + 1 < n_tiles) {  // the next tile into the other buffer while S runs
            narrow_tile_bf16<G2>((it & 1) ? kv_s0 : kv_s1, kv16, ring + ((it + 1) & 3) * TILE, tid);
            cp_async_commit();
        }
        const bool v0 = sl_cur[tr0] >= 0, v1 = sl_cur[tr0 + 8] >= 0;
        wgmma_wait0();

        // ---- online softmax per head over the tile's tokens (log2 domain) ----
        float m_loc[4];
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                const float a0 = v0 ? s_acc[j * 4 + c] * scale_log2 : -INFINITY;
                const float a1 = v1 ? s_acc[j * 4 + 2 + c] * scale_log2 : -INFINITY;
                s_acc[j * 4 + c] = a0;
                s_acc[j * 4 + 2 + c] = a1;
                m_loc[j * 2 + c] = fmaxf(a0, a1);
            }
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            m_loc[e] = fmaxf(m_loc[e], __shfl_xor_sync(0xffffffff, m_loc[e], 4));
            m_loc[e] = fmaxf(m_loc[e], __shfl_xor_sync(0xffffffff, m_loc[e], 8));
            m_loc[e] = fmaxf(m_loc[e], __shfl_xor_sync(0xffffffff, m_loc[e], 16));
        }
        if (lane < 4) {
#pragma unroll
            for (int j = 0; j < 2; ++j)
#pragma unroll
                for (int c = 0; c < 2; ++c) xm[warp * NH + 8 * j + hq + c] = m_loc[j * 2 + c];
        }
        __syncthreads();
        if (tid < TILE) ring[((it + 3) & 3) * TILE + tid] = pre;  // tile it-1's entry, no longer read
        float alpha[4], m_use[4];
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                const int e = j * 2 + c, h = 8 * j + hq + c;
                const float mt = fmaxf(fmaxf(xm[h], xm[NH + h]), fmaxf(xm[2 * NH + h], xm[3 * NH + h]));
                const float m_new = fmaxf(m_run[e], mt);
                m_use[e] = m_new == -INFINITY ? 0.f : m_new;  // all masked so far: p = 0, no NaN
                alpha[e] = exp2f(m_run[e] - m_use[e]);
                m_run[e] = m_new;
                l_part[e] *= alpha[e];
            }
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
            for (int i = 0; i < 2; ++i)
#pragma unroll
                for (int c = 0; c < 2; ++c) {
                    const int e = j * 2 + c, h = 8 * j + hq + c, t = tr0 + 8 * i;
                    const __nv_bfloat16 pb = __float2bfloat16_rn(exp2f(s_acc[j * 4 + i * 2 + c] - m_use[e]));
                    l_part[e] += __bfloat162float(pb);  // sum what the MMA will see
                    *reinterpret_cast<__nv_bfloat16*>(p_sm + swz(h, t >> 3) + (t & 7) * 2) = pb;
                }
        fence_proxy_async();
        __syncthreads();  // P^T complete

        // ---- O^T = alpha O^T + V^T P^T: 8 blocks of 64 latent values ----
#pragma unroll
        for (int mb = 0; mb < 8; ++mb)
#pragma unroll
            for (int j = 0; j < 2; ++j)
#pragma unroll
                for (int i = 0; i < 2; ++i)
#pragma unroll
                    for (int c = 0; c < 2; ++c) o_acc[mb][j * 4 + i * 2 + c] *= alpha[j * 2 + c];
        const uint64_t dp = make_desc(p_s, 16, 1024);
        const uint64_t dv = make_desc(kv_cur, CHUNK_BYTES, 1024);
        wgmma_fence();
#pragma unroll
        for (int s = 0; s < 4; ++s)
#pragma unroll
            for (int mb = 0; mb < 8; ++mb)
                wgmma_m64n16k16<1>(o_acc[mb], dv + ((mb * CHUNK_BYTES + s * 16 * 128) >> 4), dp + ((s * 32) >> 4), 1);
        wgmma_commit();
        wgmma_wait0();

        if (FP8 && it + 1 < n_tiles) {
            __syncthreads();  // every warp done reading the bf16 tile
            dequant_regs(kv_sm0, raw, tid);  // tile it+1
            fence_proxy_async();
            if (it + 2 < n_tiles) load_raw_regs(raw, kv8, ring + ((it + 2) & 3) * TILE, tid);
        }
    }

    // ---- epilogue: row sums over lanes and warps, normalise, write ----
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        l_part[e] += __shfl_xor_sync(0xffffffff, l_part[e], 4);
        l_part[e] += __shfl_xor_sync(0xffffffff, l_part[e], 8);
        l_part[e] += __shfl_xor_sync(0xffffffff, l_part[e], 16);
    }
    if (lane < 4) {
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
            for (int c = 0; c < 2; ++c) xl[warp * NH + 8 * j + hq + c] = l_part[j * 2 + c];
    }
    __syncthreads();
    const long long B = gridDim.z;
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
            const int e = j * 2 + c, h = 8 * j + hq + c;
            if (h >= n_heads) continue;
            const float l = xl[h] + xl[NH + h] + xl[2 * NH + h] + xl[3 * NH + h];
            const float inv = l > 0.f ? 1.f / l : 0.f;
            const float lse_h = l > 0.f ? (m_run[e] + log2f(l)) * LN2 : -INFINITY;
            if (n_splits == 1) {
                const long long row = (long long)b * H + head0 + h;
                uint16_t* orow = out + row * D_V;
#pragma unroll
                for (int mb = 0; mb < 8; ++mb)
#pragma unroll
                    for (int i = 0; i < 2; ++i) {
                        const __nv_bfloat16 v = __float2bfloat16_rn(o_acc[mb][j * 4 + i * 2 + c] * inv);
                        *reinterpret_cast<__nv_bfloat16*>(orow + mb * 64 + tr0 + 8 * i) = v;
                    }
                if (tid < 4) lse[row] = lse_h;
            } else {
                const long long row = ((long long)split * B + b) * H + head0 + h;
                float* orow = part_o + row * D_V;
#pragma unroll
                for (int mb = 0; mb < 8; ++mb)
#pragma unroll
                    for (int i = 0; i < 2; ++i) orow[mb * 64 + tr0 + 8 * i] = o_acc[mb][j * 4 + i * 2 + c] * inv;
                if (tid < 4) part_lse[row] = lse_h;
            }
        }
}

extern "C" __global__ void __launch_bounds__(NT_NARROW, 1) mla_decode_narrow_bf16(MLA_ARGS) {
    mla_narrow_body<false>(q, kv, slots, n_rows, H, K, scale_log2, tiles_per_split, out, lse, part_o, part_lse);
}

extern "C" __global__ void __launch_bounds__(NT_NARROW, 2) mla_decode_narrow_fp8(MLA_ARGS) {
    mla_narrow_body<true>(q, kv, slots, n_rows, H, K, scale_log2, tiles_per_split, out, lse, part_o, part_lse);
}

extern "C" __global__ void __launch_bounds__(NT_NARROW, 1) mla_decode_narrow2_bf16(MLA_ARGS) {
    mla_narrow_body<false, true>(q, kv, slots, n_rows, H, K, scale_log2, tiles_per_split, out, lse, part_o, part_lse);
}

extern "C" __global__ void __launch_bounds__(NT_NARROW, 2) mla_decode_narrow2_fp8(MLA_ARGS) {
    mla_narrow_body<true, true>(q, kv, slots, n_rows, H, K, scale_log2, tiles_per_split, out, lse, part_o, part_lse);
}

// Merge split partials: lse = logsumexp_s(lse_s), out = sum_s exp(lse_s - lse) * o_s.
// grid = B * H, block = 128 (4 columns per thread).
extern "C" __global__ void __launch_bounds__(128) mla_combine(
    const float* __restrict__ part_o, const float* __restrict__ part_lse, int n_splits, long long rows,
    uint16_t* __restrict__ out, float* __restrict__ lse) {
    const long long row = blockIdx.x;
    float mx = -INFINITY;
    for (int s = 0; s < n_splits; ++s) mx = fmaxf(mx, part_lse[s * rows + row]);
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    float wsum = 0.f;
    if (mx != -INFINITY) {
        for (int s = 0; s < n_splits; ++s) {
            float w = __expf(part_lse[s * rows + row] - mx);
            float4 o = *reinterpret_cast<const float4*>(part_o + (s * rows + row) * D_V + threadIdx.x * 4);
            acc.x += w * o.x; acc.y += w * o.y; acc.z += w * o.z; acc.w += w * o.w;
            wsum += w;
        }
    }
    float inv = wsum > 0.f ? 1.f / wsum : 0.f;
    __nv_bfloat162 a = __floats2bfloat162_rn(acc.x * inv, acc.y * inv);
    __nv_bfloat162 c = __floats2bfloat162_rn(acc.z * inv, acc.w * inv);
    uint2 packed = make_uint2(*reinterpret_cast<uint32_t*>(&a), *reinterpret_cast<uint32_t*>(&c));
    *reinterpret_cast<uint2*>(out + row * D_V + threadIdx.x * 4) = packed;
    if (threadIdx.x == 0) lse[row] = wsum > 0.f ? mx + logf(wsum) : -INFINITY;
}

// The FP8 rows as the attention kernels' tensor cores see them: bf16 [n, 576] through the same
// e4m3x16_to_bf16 the kernels call (tests hold it bit for bit to mla_reference's
// dequant_fp8_rows_bf16).  One thread per 16-byte unit of a row: units 0..31 the e4m3 values
// (16 each, scale of block u / 8), units 33..40 the bf16 rope values copied.
extern "C" __global__ void __launch_bounds__(128) fp8_dequant_rows(const uint8_t* __restrict__ kv, long long n,
                                                                   uint16_t* __restrict__ out) {
    const long long units = n * 41;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < units;
         i += (long long)gridDim.x * blockDim.x) {
        const long long row = i / 41;
        const int u = (int)(i % 41);
        const uint8_t* r = kv + row * FP8_ROW;
        uint4* dst = reinterpret_cast<uint4*>(out + row * D_QK);
        if (u < 32) {
            const float sc = reinterpret_cast<const float*>(r + D_V)[u >> 3];
            uint4 lo, hi;
            e4m3x16_to_bf16(reinterpret_cast<const uint4*>(r)[u], sc, lo, hi);
            dst[2 * u] = lo;
            dst[2 * u + 1] = hi;
        } else if (u >= 33) {
            dst[64 + (u - 33)] = reinterpret_cast<const uint4*>(r)[u];
        }
    }
}
