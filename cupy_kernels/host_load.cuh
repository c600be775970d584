// The zero-copy load every swap-in kernel copies rows with: 16 bytes of pinned host memory through
// the read-only path, not kept in L1 (a row is read once). swap_in.cu and rows.cuh include it.
#pragma once

__device__ __forceinline__ uint4 ld_host(const void* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}
