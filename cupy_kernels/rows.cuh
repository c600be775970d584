// Pieces shared by the swap-in kernels that place rows themselves (sharded_lru.cu, clock_swap.cu):
// the zero-copy 16-byte host load, a block-wide exclusive scan, a block's copy of its planned
// rows, and the full-grid copy of every request's planned rows (plan-then-copy).
// Each including file defines THREADS (and WARPS = THREADS / 32) and UNROLL first.
#pragma once

#include "host_load.cuh"

// Exclusive block scan of one value per thread; returns the exclusive prefix, *total the sum.
__device__ __forceinline__ int block_excl_scan(int v, int* s_warp, int* total) {
    const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int x = v;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
        int y = __shfl_up_sync(0xffffffffu, x, d);
        if (lane >= (unsigned)d) x += y;
    }
    if (lane == 31) s_warp[warp] = x;
    __syncthreads();
    if (warp == 0) {
        int w = lane < WARPS ? s_warp[lane] : 0;
#pragma unroll
        for (int d = 1; d < 32; d <<= 1) {
            int y = __shfl_up_sync(0xffffffffu, w, d);
            if (lane >= (unsigned)d) w += y;
        }
        if (lane < WARPS) s_warp[lane] = w;  // inclusive per warp
    }
    __syncthreads();
    int base = warp ? s_warp[warp - 1] : 0;
    *total = s_warp[WARPS - 1];
    __syncthreads();  // s_warp is reused by the next scan
    return base + x - v;
}

// The block copies its n planned rows (host row e.x of this request -> device row e.y):
// 16-byte chunks, UNROLL loads in flight per thread.
__device__ __forceinline__ void copy_rows_block(const int2* mine, int n, const unsigned char* __restrict__ hsrc,
                                                unsigned char* ddst, int row_bytes) {
    const int cpr = row_bytes / 16;
    const unsigned total = (unsigned)n * cpr;
    for (unsigned c0 = threadIdx.x; c0 < total; c0 += THREADS * UNROLL) {
        uint4 v[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            unsigned c = c0 + u * THREADS;
            if (c < total) {
                int2 e = mine[c / cpr];
                v[u] = ld_host(hsrc + (long long)e.x * row_bytes + (c % cpr) * 16);
            }
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            unsigned c = c0 + u * THREADS;
            if (c < total) {
                int2 e = mine[c / cpr];
                *reinterpret_cast<uint4*>(ddst + (long long)e.y * row_bytes + (c % cpr) * 16) = v[u];
            }
        }
    }
}

// Full-grid copy of every request's planned rows (requests' counts prefixed in shared memory).
// plan: [R][cap] (host row, device row of the request); rows: device rows per request.
extern "C" __global__ void __launch_bounds__(256)
copy_plan(const int2* __restrict__ plan, const int* __restrict__ plan_n, int R, int cap, long long C, int rows,
          const unsigned char* __restrict__ host, unsigned char* dev, int row_bytes) {
    extern __shared__ int pre[];  // [R + 1]
    if (threadIdx.x == 0) {
        int run = 0;
        for (int q = 0; q < R; ++q) {
            pre[q] = run;
            run += plan_n[q];
        }
        pre[R] = run;
    }
    __syncthreads();
    const unsigned cpr = row_bytes / 16;
    const unsigned total = (unsigned)pre[R] * cpr;
    const unsigned T = gridDim.x * blockDim.x;
    for (unsigned c0 = blockIdx.x * blockDim.x + threadIdx.x; c0 < total; c0 += T * UNROLL) {
        uint4 v[UNROLL];
        long long dsto[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            unsigned c = c0 + u * T;
            if (c < total) {
                unsigned row = c / cpr;
                int lo = 0, hi = R - 1;  // the request whose rows hold `row`
                while (lo < hi) {
                    int mid = (lo + hi + 1) >> 1;
                    if ((unsigned)pre[mid] <= row) lo = mid; else hi = mid - 1;
                }
                int2 e = plan[(long long)lo * cap + (row - pre[lo])];
                unsigned off = (c % cpr) * 16;
                v[u] = ld_host(host + ((long long)lo * C + e.x) * row_bytes + off);
                dsto[u] = ((long long)lo * rows + e.y) * row_bytes + off;
            }
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            unsigned c = c0 + u * T;
            if (c < total) *reinterpret_cast<uint4*>(dev + dsto[u]) = v[u];
        }
    }
}
