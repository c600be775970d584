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

// `rounds` hand-offs of `round_bytes` each way by threads 0..127 (4 warps) in `mode` (see the top), both
// buffers at buf0, their barriers in_bar[2] / ack_bar[2] (8 bytes apart).
__device__ void hand_off_rounds(int rounds, int chunk_bytes, int round_bytes, int mode, uint32_t buf0,
                                uint32_t in_bar, uint32_t ack_bar, uint32_t rank) {
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const uint32_t dst = mode == 2 ? rank : rank ^ 1u;
    const bool sends = mode != 1 || rank == 0, receives = mode != 1 || rank == 1;
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
}

__device__ __forceinline__ void init_bars(uint32_t bars, int n) {
    if (threadIdx.x == 0) {
        for (int i = 0; i < n; ++i)
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(bars + 8 * i) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}

__device__ __forceinline__ unsigned long long global_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

extern "C" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(128, 1)
dsmem_copy(int rounds, int chunk_bytes, int round_bytes, int mode, unsigned long long* ns_out) {
    extern __shared__ __align__(1024) uint8_t smem[];
    const uint32_t buf0 = smem_addr(smem), bars = buf0 + 2 * round_bytes;  // in_bar[2], ack_bar[2]
    uint32_t rank;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
    init_bars(bars, 4);
    const unsigned long long t0 = global_ns();
    hand_off_rounds(rounds, chunk_bytes, round_bytes, mode, buf0, bars, bars + 16, rank);
    const unsigned long long t1 = global_ns();
    asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
    if (threadIdx.x == 0) ns_out[blockIdx.x] = t1 - t0;
}

// How long one remote mbarrier arrival takes to land (the attention kernel's release of a tile buffer to the
// peer's producer is one): lane 0 of warp 4 of rank 0 arrives on rank 1's ping barrier, rank 1's waits for it
// and arrives back on rank 0's, `pings` times; rank 0 records the span (ns_out[its CTA]; rank 1 writes 0).
// copies = 1: meanwhile warps 0..3 of both CTAs run mode 0's hand-off (bulk copies both ways, `rounds` of
// `round_bytes`), so the arrivals share the SM-to-SM path with copies going the same way; copies = 0: alone.
extern "C" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(160, 1)
dsmem_ping(int pings, int copies, int rounds, int chunk_bytes, int round_bytes, unsigned long long* ns_out) {
    extern __shared__ __align__(1024) uint8_t smem[];
    const uint32_t buf0 = smem_addr(smem), bars = buf0 + 2 * round_bytes;  // in_bar[2], ack_bar[2], ping
    uint32_t rank;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
    init_bars(bars, 5);
    const uint32_t ping = bars + 32;
    if (threadIdx.x < 128) {
        if (copies) hand_off_rounds(rounds, chunk_bytes, round_bytes, 0, buf0, bars, bars + 16, rank);
    } else if (threadIdx.x == 128) {
        const uint32_t peer_ping = map_to(ping, rank ^ 1u);
        const unsigned long long t0 = global_ns();
        for (int i = 0; i < pings; ++i) {
            if (rank == 0)
                asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(peer_ping) : "memory");
            wait_parity(ping, i & 1);
            if (rank == 1)
                asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(peer_ping) : "memory");
        }
        ns_out[blockIdx.x] = rank == 0 ? global_ns() - t0 : 0ull;
    }
    asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}
