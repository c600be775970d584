// How fast can the two CTAs of a cluster hand each other shared memory? (benchmarks/dsmem_bandwidth.py)
//
// The FP8 attention kernel's crossover (cupy_kernels/sparse_attention.cu, variants wsx..wsxl) sends
// every tile's 32 dequantised rows, 36,864 B, to the peer CTA with bulk copies (4 warps x 9 x 1 KB),
// both ways at once. This kernel does only that: each round a CTA copies `round_bytes` from its own
// shared memory into the peer's (`cp.async.bulk.shared::cluster.shared::cta`, completion on the
// peer's mbarrier), the receiver acknowledges with one remote arrival, two buffers in flight, as the
// attention kernel's two tile buffers. Modes: 0 both CTAs send (the kernel's pattern), 1 rank 0
// sends and rank 1 receives, 2 each CTA copies into its own shared memory (the bulk-copy engine
// without the SM-to-SM network). Modes 3 and 4 send the same bytes both ways without the copy engine:
// every thread stores 16 B at a time from registers into the peer's shared memory (`st.async`,
// completion on the same mbarrier), as FlashMLA's SM90 FP8 decode hands its dequantised rows over.
// 3: eight consecutive lanes fill one 128-byte line (FlashMLA's order: a warp's store is 4 whole
// lines); 4: four lanes write every other 16 B of a line, the order our dequantisation stores a row in
// (a raw 16-byte unit becomes two bf16 units, lanes q = 0..3 of a row write units 2q, then 2q + 1:
// a warp's store is 8 half lines).
#include <cstdint>

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ uint32_t map_to(uint32_t addr, uint32_t rank) {
    uint32_t r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(addr), "r"(rank));
    return r;
}
__device__ __forceinline__ void wait_parity(uint32_t bar, int parity) {
    uint32_t ok = 0;
    while (!ok) {
        asm volatile(
            "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(ok) : "r"(bar), "r"(parity) : "memory");
    }
}

extern "C" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(128, 1)
dsmem_copy(int rounds, int chunk_bytes, int round_bytes, int mode, unsigned long long* ns_out) {
    extern __shared__ __align__(1024) uint8_t smem[];
    const uint32_t buf0 = smem_addr(smem), bars = buf0 + 2 * round_bytes;  // in_bar[2], ack_bar[2]
    const uint32_t in_bar = bars, ack_bar = bars + 16;
    uint32_t rank;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const uint32_t dst = mode == 2 ? rank : rank ^ 1u;
    const bool sends = mode != 1 || rank == 0, receives = mode != 1 || rank == 1;
    if (tid == 0) {
        for (int i = 0; i < 4; ++i)
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(bars + 8 * i) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
    unsigned long long t0;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    const int per_warp = round_bytes / 4;
    for (int r = 0; r < rounds; ++r) {
        const int b = r & 1;
        if (receives && tid == 0)  // this round's bytes, announced (they may land first: tx goes negative)
            asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(in_bar + 8 * b),
                         "r"(round_bytes) : "memory");
        if (sends && mode >= 3) {
            if (r >= 2) wait_parity(ack_bar + 8 * b, ((r >> 1) - 1) & 1);
            const uint32_t base = map_to(buf0 + b * round_bytes, dst), rbar = map_to(in_bar + 8 * b, dst);
            const int stores = round_bytes / (128 * 16);  // per thread
            for (int i = 0; i < stores; ++i) {
                uint32_t off;
                if (mode == 3) {
                    off = (i * 128 + tid) * 16;
                } else {  // 8 rows x 4 lanes, units 2q + (i & 1) of each row's line
                    const int line = warp * (stores / 2) * 8 + (i >> 1) * 8 + (lane >> 2);
                    off = line * 128 + (2 * (lane & 3) + (i & 1)) * 16;
                }
                asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];\n"
                             ::"r"(base + off), "r"(i), "r"(tid), "r"(r), "r"(off), "r"(rbar) : "memory");
            }
        } else if (sends) {
            if (r >= 2) wait_parity(ack_bar + 8 * b, ((r >> 1) - 1) & 1);  // the receiver is done with buffer b
            if (lane == 0) {
                const uint32_t src = buf0 + b * round_bytes + warp * per_warp;
                const uint32_t rbar = map_to(in_bar + 8 * b, dst), rdst = map_to(src, dst);
                for (int off = 0; off < per_warp; off += chunk_bytes)
                    asm volatile("cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                                 ::"r"(rdst + off), "r"(src + off), "r"(chunk_bytes), "r"(rbar) : "memory");
            }
        }
        if (receives) {
            wait_parity(in_bar + 8 * b, (r >> 1) & 1);
            if (tid == 0)  // buffer b may be written again: one arrival on the sender's ack_bar
                asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(map_to(ack_bar + 8 * b, dst))
                             : "memory");
        }
    }
    unsigned long long t1;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
    asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
    if (tid == 0) ns_out[blockIdx.x] = t1 - t0;
}
