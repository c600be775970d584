"""Time the swap-in kernel on one GPU against pinned cudaMemcpy measured in the same run.

Usage (on the H200):  python benchmarks/swap_in.py --out benchmarks/results/swap_in-h200.csv

Grid: batch 1/10/100, hot buffer 4096/8192 slots, miss rate 0.1%/20%/100% of k = 2048,
rows 512/656/1152 B; ctx_len 32768. One pinned mapped host pool (default 16 GiB) backs every
configuration: each HotBuffer gets as many layers as fill the pool, and every timed launch
works on a random layer, so the rows read are spread over the whole pool as in deployment.
Pinned cudaMemcpy (1 GiB, host -> device, offsets spread over the pool, median of 12) is measured
before and after the grid; the better reading is the reference. Each step is drawn from the kernel's own current state (hits from resident positions, misses
from the rest, plus the newest token), so a step has exactly the chosen number of misses; the
kernel's miss counts are checked against it. A launch is timed with CUDA events while a spin
kernel holds the stream, so host-side launch overhead is not counted; median of --iters.
GB/s = miss rows x row bytes / time (the newest-token row also copied each step is not counted).
--breakdown also times each case with copy=False (launch + bookkeeping, no rows); --phases times
the bookkeeping cut after each of its phases (variant builds, copy=False) at bs 1 and 100.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cupy_kernels.swap_in import (  # noqa: E402
    COPY_ORDERS,
    DUP_CHECKS,
    POOL_BACKINGS,
    HotBuffer,
    PinnedPool,
    _kernel,
)

K = 2048
CTX = 32768
MAX_CTX = CTX + 64
BATCHES = (1, 10, 100)
HOTS = (4096, 8192)
MISS_RATES = (0.001, 0.2, 1.0)
ROWS = (512, 656, 1152)
# (bs, hot, miss_rate, row_bytes): target (us or share of memcpy), SGLang first release on this H200
TARGETS = {
    (100, 4096, 0.2, 656): ("pct", 0.80, "704 us, 69%"),
    (100, 4096, 0.2, 1152): ("pct", 0.90, "966 us, 89%"),
    (100, 4096, 0.2, 512): ("pct", 0.88, "446 us, 85%"),
    (100, 4096, 1.0, 656): ("pct", 0.87, "6112 us, 40%"),
    (100, 4096, 0.001, 656): ("us", 10.0, "~33 us"),
    (1, 4096, 0.2, 656): ("us", 15.0, "69 us"),
}
_SPIN = r"""
// Holds the stream so that the timed launch is queued before its start event fires; block 0
// thread 0 writes the SM cycles and nanoseconds it spun (the SM clock the timed launch meets).
extern "C" __global__ void spin(long long ns, long long* clk) {
    long long t0, t;
    const long long c0 = clock64();
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
    if (clk && blockIdx.x == 0 && threadIdx.x == 0) {
        clk[0] = clock64() - c0;
        clk[1] = t - t0;
    }
}
// A stand-in for the kernel before the swap-in in a decode step (the indexer): every block
// spins `ns`; trigger=1 lets a programmatic dependent launch start at once, 0 only at the end.
extern "C" __global__ void busy(long long ns, int trigger) {
    if (trigger) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
}
extern "C" __global__ void empty(int* sink) {
    extern __shared__ int sm[];
    asm volatile("griddepcontrol.wait;" ::: "memory");
    if (threadIdx.x == 0 && sink[0] == 12345) sm[0] = sink[1];
}
// Row gather for the alignment study: n rows of row_bytes from host row src[i] * stride into
// dst row i. mode 0: the row's own 16-byte chunks; mode g > 0: every 16-byte chunk of the
// g-byte aligned granules the row touches is loaded, only the row's own are stored.
extern "C" __global__ void gather(const unsigned char* __restrict__ host, unsigned char* __restrict__ dst,
                                  const int* __restrict__ src, int n, int row_bytes, int stride, int mode) {
    const unsigned cpr = row_bytes >> 4;
    const unsigned span = mode ? (unsigned)((row_bytes + 2 * mode - 17) / mode) * (mode >> 4) : cpr;
    const unsigned total = (unsigned)n * span, T = gridDim.x * blockDim.x;
    for (unsigned c0 = blockIdx.x * blockDim.x + threadIdx.x; c0 < total; c0 += 4 * T) {
        uint4 v[4];
        long long d[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const unsigned c = c0 + u * T;
            d[u] = -1;
            if (c < total) {
                const unsigned e = c / span, q = c - e * span;
                const long long a = (long long)src[e] * stride;
                const long long b = mode ? (a & ~(long long)(mode - 1)) + 16 * (long long)q : a + 16 * (long long)q;
                if (mode == 0 || b < ((a + row_bytes + mode - 1) & ~(long long)(mode - 1))) {
                    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                                 : "=r"(v[u].x), "=r"(v[u].y), "=r"(v[u].z), "=r"(v[u].w) : "l"(host + b));
                    if (b >= a && b < a + row_bytes) d[u] = (long long)e * row_bytes + (b - a);
                }
            }
        }
#pragma unroll
        for (int u = 0; u < 4; ++u)
            if (d[u] >= 0) *reinterpret_cast<uint4*>(dst + d[u]) = v[u];
    }
}
"""


class Kernels:
    """The benchmark's helper kernels (spin, busy, empty, gather) and the SM-clock readout."""

    def __init__(self, cp: Any, hold_us: float = 300.0, hold_blocks: int = 1) -> None:
        self.cp = cp
        mod = cp.RawModule(code=_SPIN)  # CuPy compiles for the device (sm_90: griddepcontrol)
        self.spin, self.busy, self.gather = (mod.get_function(n) for n in ("spin", "busy", "gather"))
        self.empty = mod.get_function("empty")
        self.empty.max_dynamic_shared_size_bytes = 80_000  # up to empty_cooperative's 74 KB
        self.sink = cp.zeros(2, cp.int32)
        self.clk = cp.zeros(2, cp.int64)
        self.hold_ns, self.hold_blocks = int(hold_us * 1000), int(hold_blocks)
        self.n_sms = cp.cuda.Device().attributes["MultiProcessorCount"]

    def hold(self) -> None:
        """Spin on the current stream so that what follows is queued before its start event."""
        self.spin((self.hold_blocks,), (32,), (np.int64(self.hold_ns), self.clk))

    def empty_cooperative(self) -> None:
        """The empty kernel launched as the swap-in is: cooperative, one block of 512 threads per SM,
        74 KB of dynamic shared memory, on the current stream."""
        from cupy_kernels._launch import launch_ex

        launch_ex(self.empty.kernel.ptr, self.n_sms, 512, 74_000, self.cp.cuda.get_current_stream().ptr,
                  (self.sink,), cooperative=True, programmatic=False)

    def mhz(self) -> float:
        """SM clock during the last hold (call after synchronising)."""
        cyc, ns = self.clk.get()
        return float(cyc) / max(1, int(ns)) * 1e3


def held_launch_us(cp: Any, kern: Kernels, launch: Callable[[], None], iters: int,
                   after: Callable[[], None] | None = None) -> float:
    """Median us of `launch()` timed like a swap-in launch: queued behind the spin kernel, between
    two events, after 2 warm-up launches; `after()`, untimed, follows every launch."""
    times = []
    for i in range(iters + 2):
        cp.cuda.Device().synchronize()
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        kern.hold()
        e0.record()
        launch()
        e1.record()
        e1.synchronize()
        if i >= 2:
            times.append(cp.cuda.get_elapsed_time(e0, e1) * 1e3)
        if after is not None:
            after()
    return statistics.median(times)


def launch_floor(cp: Any, kern: Kernels, iters: int = 21) -> dict[str, float]:
    """Median us of an empty kernel timed like a swap-in launch (events after a spin kernel):
    the floor under any fixed cost, for 1 and 264 blocks of 512 threads with 69 KB of dynamic
    shared memory (the swap-in's at B 4096, k 2048)."""
    out = {}
    for blocks in (1, 264):
        out[f"empty_{blocks}"] = held_launch_us(
            cp, kern, lambda n=blocks: kern.empty((n,), (512,), (kern.sink,), shared_mem=69_000), iters)
    # launched as the swap-in is: cooperative, one block per SM, 74 KB of dynamic shared memory
    out[f"empty_{kern.n_sms}_cooperative"] = held_launch_us(cp, kern, kern.empty_cooperative, iters)
    out["sm_mhz"] = kern.mhz()
    return out


def n_misses(rate: float) -> int:
    """Misses per request per step: rate x k, at least 1, at most k - 1 (the newest is reserved)."""
    return min(K - 1, max(1, round(rate * K)))


def fill_pool(pool: PinnedPool, rng: np.random.Generator, chunk: int = 256 << 20) -> None:
    """Random bytes everywhere (a tiled random chunk: cheap, and never zeros)."""
    block = rng.integers(0, 256, chunk, dtype=np.uint8)
    for start in range(0, pool.nbytes, chunk):
        n = min(chunk, pool.nbytes - start)
        pool.array[start : start + n] = block[:n]


def measure_memcpy(cp: Any, pool: PinnedPool, nbytes: int = 1 << 30, reps: int = 12) -> float:
    """Pinned host -> device cudaMemcpy, GB/s (median), from offsets spread over the pool."""
    dst = cp.empty(nbytes, cp.uint8)
    stream = cp.cuda.get_current_stream()
    times = []
    for i in range(reps + 2):
        off = (i * 7919 * (1 << 20)) % (pool.nbytes - nbytes) // 4096 * 4096
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record()
        cp.cuda.runtime.memcpyAsync(dst.data.ptr, pool.device_ptr + off, nbytes, 1, stream.ptr)
        e1.record()
        e1.synchronize()
        if i >= 2:
            times.append(cp.cuda.get_elapsed_time(e0, e1) * 1e-3)
    return nbytes / statistics.median(times) / 1e9


def draw_step(rng: np.random.Generator, slot_pos: np.ndarray, miss: int) -> np.ndarray:
    """[R, K] positions: K - 1 - miss resident (hits), miss non-resident, and the newest."""
    n_req = slot_pos.shape[0]
    out = np.empty((n_req, K), np.int32)
    newest = CTX - 1
    for r in range(n_req):
        res = slot_pos[r][(slot_pos[r] >= 0) & (slot_pos[r] != newest)]
        hits = rng.choice(res, K - 1 - miss, replace=False)
        taken = np.zeros(MAX_CTX, bool)
        taken[res] = True
        taken[newest] = True
        fresh = np.zeros(0, np.int64)
        while fresh.size < miss:
            cand = np.unique(rng.integers(0, newest, 2 * miss + 64))
            fresh = np.unique(np.r_[fresh, cand[~taken[cand]]])
        fresh = rng.permutation(fresh)[:miss]
        out[r] = rng.permutation(np.r_[hits, fresh, newest])
    return out


def time_config(cp: Any, hb: HotBuffer, rng: np.random.Generator, miss: int, iters: int, kern: Kernels,
                copy: bool = True) -> tuple[list[float], list[float]]:
    """Per-launch microseconds of `iters` timed steps on random layers (after 2 warm-up steps),
    and the SM clock (MHz) the spin before each launch read."""
    g = hb.geometry
    ctx = cp.full(g.requests, CTX, cp.int64)
    times, mhz = [], []
    for i in range(iters + 2):
        layer = int(rng.integers(0, g.layers))
        idx = cp.asarray(draw_step(rng, hb.state(layer).slot_pos, miss))
        cp.cuda.Device().synchronize()
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        kern.hold()  # the launch below is queued before e0 fires
        e0.record()
        res = hb.swap_in(layer, idx, ctx, check=False, copy=copy)
        e1.record()
        e1.synchronize()
        got = res.misses.get()
        if not (got == miss).all():
            raise RuntimeError(f"kernel counted misses {np.unique(got)} for a step built with {miss}")
        if i == 1 and copy:
            check_rows(cp, hb, layer, idx, res.slots)
        if i >= 2:
            times.append(cp.cuda.get_elapsed_time(e0, e1) * 1e3)
            mhz.append(kern.mhz())
    return times, mhz


def time_after_kernel(cp: Any, hb: HotBuffer | None, rng: np.random.Generator, miss: int, iters: int,
                      kern: Kernels, *, pdl: bool, trigger: bool, busy_us: float, cooperative: bool = True,
                      busy_smem: int = 0) -> float:
    """Median us from the start of a `busy` kernel (every SM, busy_us) to the end of the launch
    after it (a swap-in, or the empty kernel when hb is None), minus the busy kernel alone: what
    the launch adds behind a kernel in the same stream, as in a decode step. pdl: the launch
    uses programmatic dependent launch (it may start before busy ends: at once with trigger, at
    busy's end without); cooperative=False asks for it without the cooperative attribute.
    busy_smem: dynamic shared memory of each busy block (200 KB leaves no room for a swap-in
    block beside it, as a large preceding kernel would; 0 leaves room if the registers fit)."""
    from cupy_kernels._launch import launch_ex

    stream = cp.cuda.Stream(non_blocking=True)
    busy_args = (np.int64(int(busy_us * 1000)), np.int32(trigger))
    out = {}
    with stream:
        for what in ("busy", "launch"):
            times = []
            for i in range(iters + 2):
                if hb is not None and what == "launch":
                    g = hb.geometry
                    ctx = cp.full(g.requests, CTX, cp.int64)
                    layer = int(rng.integers(0, g.layers))
                    idx = cp.asarray(draw_step(rng, hb.state(layer).slot_pos, miss))
                    hb.pdl = pdl
                    hb._pdl_cooperative = cooperative
                    hb._last_layer = -1  # the kernel before is `busy`, which writes no tables
                stream.synchronize()
                e0, e1 = cp.cuda.Event(), cp.cuda.Event()
                kern.hold()
                e0.record(stream)
                kern.busy((kern.n_sms,), (128,), busy_args, shared_mem=busy_smem)
                if what == "launch":
                    if hb is not None:
                        res = hb.swap_in(layer, idx, ctx, check=False)
                    else:
                        launch_ex(kern.empty.kernel.ptr, 264, 512, 69_000, stream.ptr, (kern.sink,),
                                  cooperative=False, programmatic=pdl)
                e1.record(stream)
                e1.synchronize()
                if what == "launch" and hb is not None:
                    if pdl and hb.launch_mode == "plain":
                        raise RuntimeError("the swap-in was launched plainly where PDL was asked for")
                    if not (res.misses.get() == miss).all():
                        raise RuntimeError("kernel miss counts differ from the step's")
                    if i == 1:
                        check_rows(cp, hb, layer, idx, res.slots)
                if i >= 2:
                    times.append(cp.cuda.get_elapsed_time(e0, e1) * 1e3)
            out[what] = statistics.median(times)
    if hb is not None:
        hb.pdl, hb._pdl_cooperative = False, True
    return out["launch"] - out["busy"]


def thp_setting() -> str:
    """The kernel's transparent-huge-page mode (the bracketed word), or why it is unknown."""
    try:
        text = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError as e:
        return f"unreadable ({e.strerror})"
    return text[text.find("[") + 1:text.find("]")] if "[" in text else text.strip()


def rowcopy(cp: Any, pool: PinnedPool, kern: Kernels, memcpy: float, n: int = 204_700, reps: int = 7) -> list[dict]:
    """Alignment study: gather n random rows from the pinned pool with the swap-in's loads, for
    row sizes, row strides (a 768 B stride starts every 656 B row on a 128 B line) and load
    granules (0: the row's own 16 B chunks; 64 / 128: whole aligned sectors / lines, the extra
    bytes discarded). Rows are drawn as the swap-in at 100% misses reads them (window "request":
    2047 rows from each 32832-row region in turn, regions in order) or anywhere in the pool
    (window "pool"). GB/s of row bytes, against cudaMemcpy."""
    rng = np.random.default_rng(1)
    cases = [(w, rb, stride, mode) for w in ("request",) for rb, stride, mode in
             [(512, 512, 0), (576, 576, 0), (640, 640, 0), (656, 656, 0), (656, 656, 64), (656, 656, 128),
              (656, 768, 0), (704, 704, 0), (768, 768, 0), (1152, 1152, 0)]]
    cases += [("pool", 640, 640, 0), ("pool", 656, 656, 0)]
    dst = cp.empty(n * 1152, cp.uint8)
    out = []
    for window, rb, stride, mode in cases:
        if window == "pool":
            pos = rng.integers(0, pool.nbytes // stride - 2, n)
        else:  # as the flat order reads 100 requests x 2047 misses
            per = 2047
            regions = np.arange(n // per + 1)[:, None] * MAX_CTX
            pos = (regions + np.sort(rng.integers(0, MAX_CTX, (regions.shape[0], per)), axis=1)).reshape(-1)[:n]
            pos = np.minimum(pos, pool.nbytes // stride - 2)
        src = cp.asarray(pos.astype(np.int32))
        times = []
        for i in range(reps + 2):
            e0, e1 = cp.cuda.Event(), cp.cuda.Event()
            e0.record()
            kern.gather((kern.n_sms * 4,), (512,), (np.uint64(pool.device_ptr), dst, src, np.int32(n), np.int32(rb),
                                                    np.int32(stride), np.int32(mode)))
            e1.record()
            e1.synchronize()
            if i >= 2:
                times.append(cp.cuda.get_elapsed_time(e0, e1) * 1e-3)
        # bytes check on a sample
        pick = rng.integers(0, n, 64)
        got = dst[: n * rb].reshape(n, rb)[cp.asarray(pick)].get()
        s_host = src.get()[pick].astype(np.int64) * stride
        want = np.stack([pool.array[o : o + rb] for o in s_host])
        if not np.array_equal(got, want):
            raise RuntimeError(f"gather rows differ (row {rb}, stride {stride}, mode {mode})")
        gbps = n * rb / statistics.median(times) / 1e9
        out.append(dict(window=window, row_bytes=rb, stride=stride, granule=mode, gbps=round(gbps, 2),
                        pct_memcpy=round(gbps / memcpy, 4)))
        print(f"rowcopy {window:7s} row {rb:4d} stride {stride:4d} granule {mode:3d}: {gbps:5.1f} GB/s "
              f"({gbps / memcpy:5.1%} of memcpy)", flush=True)
    return out


def check_rows(cp: Any, hb: HotBuffer, layer: int, idx: Any, slots: Any, n: int = 256) -> None:
    """A sample of entries: the device row equals the host row."""
    g = hb.geometry
    rng = np.random.default_rng(0)
    r = rng.integers(0, g.requests, n)
    j = rng.integers(0, K, n)
    pos, sl = idx.get()[r, j], slots.get()[r, j]
    got = hb.device_rows(layer)[cp.asarray(r * (g.buffer + 1) + sl)].get()
    want = hb.host_rows(layer)[r, pos]
    if not np.array_equal(got, want):
        raise RuntimeError("copied rows differ from host rows")


def run(args: argparse.Namespace) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    import cupy as cp

    rng = np.random.default_rng(args.seed)
    t0 = time.time()
    pool = PinnedPool(int(args.pool_gib * (1 << 30)), backing=args.pool_backing)
    fill_pool(pool, rng)
    print(f"pool {pool.nbytes / 2**30:.1f} GiB pinned+filled in {time.time() - t0:.1f} s, backing "
          f"{pool.backing}, {pool.huge_fraction():.1%} in huge pages (transparent_hugepage: {thp_setting()})",
          flush=True)
    memcpy_start = measure_memcpy(cp, pool)
    print(f"pinned cudaMemcpy H2D (start): {memcpy_start:.1f} GB/s", flush=True)
    kern = Kernels(cp, args.hold_us, args.hold_blocks)
    floor = launch_floor(cp, kern)
    print("launch floor (empty kernel, events after a spin): "
          + ", ".join(f"{k} {v:.1f}" for k, v in floor.items()), flush=True)
    rows = []
    for bs in args.batches:
        for hot in args.hots:
            for row in args.rows:
                layers = pool.nbytes // (bs * MAX_CTX * row)
                variants = [(u, mg, bp, co, dc) for u in args.unrolls for mg in args.max_grids
                            for bp in args.blocks_per_sm for co in args.copy_orders for dc in args.dup_checks]
                if args.baseline_cu:  # the kernel as it was, same geometry, in the same run
                    variants = [(4, 0, 1, f"head-{co}", "hash") for co in args.baseline_orders] + variants
                for unroll, max_grid, bps, order, dup in variants:
                    hb = HotBuffer(layers=layers, requests=bs, max_ctx=MAX_CTX, device_buffer_size=hot, top_k=K,
                                   row_bytes=row, pool=pool, unroll=unroll, blocks_per_sm=bps,
                                   copy_order=order.removeprefix("head-"), dup_check=dup)
                    if order.startswith("head-"):
                        hb._kern = baseline_kernel(cp, args.baseline_cu)
                        hb.copy_order = order.removeprefix("head-")
                    hb.prefill()
                    if max_grid:
                        hb.max_grid = min(hb.max_grid, max_grid)
                    for rate in args.miss_rates:
                        miss = n_misses(rate)
                        times, mhz = time_config(cp, hb, rng, miss, args.iters, kern)
                        us = statistics.median(times)
                        book = float("nan")
                        if args.breakdown:  # tables move on without rows: prefill restores consistency
                            book = statistics.median(time_config(cp, hb, rng, miss, args.iters, kern, copy=False)[0])
                            hb.prefill()
                        gbps = bs * miss * row / us / 1e3
                        rows.append(dict(bs=bs, hot=hot, miss_rate=rate, row_bytes=row, us=round(us, 2),
                                         gbps=round(gbps, 2), unroll=unroll, blocks_per_sm=bps, copy_order=order,
                                         dup_check=hb.dup_check, layers=layers, book_us=round(book, 2),
                                         grid=hb.grid(K), max_grid=max_grid, sm_mhz=round(statistics.median(mhz))))
                        print(f"bs {bs:3d} hot {hot} miss {rate:5.3f} row {row:4d} u{unroll} b{bps} {order:7s} "
                              f"{hb.dup_check:6s} grid {hb.grid(K):3d} layers {layers:4d}: {us:8.1f} us {gbps:5.1f} GB/s "
                              f"({gbps / memcpy_start:5.1%}) bookkeeping-only {book:6.1f} us, SM "
                              f"{statistics.median(mhz):5.0f} MHz", flush=True)
                    del hb
                    cp.get_default_memory_pool().free_all_blocks()
    after = time_after_kernels(cp, pool, rng, kern, args) if args.after_kernel else []
    if args.phases:
        time_phases(cp, pool, rng, kern, args.iters, args.dup_checks)
    memcpy_end = measure_memcpy(cp, pool)
    # The ceiling is the better of the two readings (one run here read 39.8 GB/s once, 54-55 otherwise).
    memcpy = max(memcpy_start, memcpy_end)
    print(f"pinned cudaMemcpy H2D (end): {memcpy_end:.1f} GB/s; reference {memcpy:.1f} GB/s", flush=True)
    rc = rowcopy(cp, pool, kern, memcpy) if args.rowcopy else []
    for x in rows + rc:
        x["memcpy_gbps"] = round(memcpy, 2)
        x["pool_backing"] = pool.backing
    return rows, after, rc


class _HeadKernel:
    """A committed kernel (its source passed with --baseline-cu), launched as the HotBuffer
    launches its own: with every argument, or less the last (dup_words) for a source from before
    that argument existed."""

    def __init__(self, kern: Any, takes_dup_words: bool) -> None:
        self.kern = kern
        self.kernel = kern.kernel
        self.n_args = None if takes_dup_words else -1

    def __call__(self, grid: tuple, block: tuple, args: tuple, shared_mem: int = 0) -> None:
        self.kern(grid, block, args[:self.n_args], shared_mem=shared_mem)


def baseline_kernel(cp: Any, source: Path) -> _HeadKernel:
    import re

    from cupy_kernels._build import build_cubin
    from cupy_kernels.swap_in import _NVCC_FLAGS, DEFAULT_UNROLL

    flags = (*_NVCC_FLAGS, f"-DUNROLL={DEFAULT_UNROLL}", "-DMIN_BLOCKS=1")
    mod = cp.RawModule(path=str(build_cubin(source, flags, "swap_in_head")), enable_cooperative_groups=True)
    kern = mod.get_function("swap_in_lru")
    optin = cp.cuda.Device().attributes["MaxSharedMemoryPerBlockOptin"]
    kern.max_dynamic_shared_size_bytes = optin - kern.shared_size_bytes
    signature = re.search(r"swap_in_lru\(([^)]*)\)", source.read_text())
    return _HeadKernel(kern, takes_dup_words=bool(signature and "dup_words" in signature.group(1)))


BUSY_KINDS = (("light, trigger at start", 1, 0), ("light, no trigger", 0, 0),
              ("200 KB smem, trigger at start", 1, 200_000))


def time_after_kernels(cp: Any, pool: PinnedPool, rng: np.random.Generator, kern: Kernels,
                       args: argparse.Namespace) -> list[dict[str, Any]]:
    """What a launch adds behind a `busy` kernel (every SM, --busy-us) in the same stream, plain
    and with programmatic dependent launch, for BUSY_KINDS (busy triggers its dependents at its
    start or only at its end; its blocks leave room for one of the swap-in's or not): the empty
    kernel (the floor), then the swap-in (656 B rows, hot 4096) as built by default, and with
    --after-max-regs (lowest miss rate only)."""
    kern.busy.max_dynamic_shared_size_bytes = 200_000
    out = []
    for name, trigger, smem in BUSY_KINDS:
        for pdl in (False, True):
            us = time_after_kernel(cp, None, rng, 0, args.iters, kern, pdl=pdl, trigger=bool(trigger),
                                   busy_us=args.busy_us, busy_smem=smem)
            out.append(dict(what="empty", busy=name, bs=0, miss_rate=0.0, copy_order="", max_regs=0,
                            launch="pdl" if pdl else "plain", added_us=round(us, 2)))
            print(f"after busy {args.busy_us:g} us ({name}): empty kernel {'pdl  ' if pdl else 'plain'} "
                  f"adds {us:6.1f} us", flush=True)
    builds = [(0, args.after_rates or [r for r in args.miss_rates if r < 1.0])]
    if args.after_max_regs:
        builds.append((args.after_max_regs, [min(args.miss_rates)]))
    for bs in args.batches:
        layers = pool.nbytes // (bs * MAX_CTX * 656)
        for order in args.after_orders:
            for max_regs, rates in builds:
                hb = HotBuffer(layers=layers, requests=bs, max_ctx=MAX_CTX, device_buffer_size=4096, top_k=K,
                               row_bytes=656, pool=pool, copy_order=order, max_regs=max_regs)
                hb.prefill()
                for rate in rates:
                    for name, trigger, smem in BUSY_KINDS:
                        for pdl, coop in ((False, True), (True, True), (True, False)):
                            us = time_after_kernel(cp, hb, rng, n_misses(rate), args.iters, kern, pdl=pdl,
                                                   trigger=bool(trigger), busy_us=args.busy_us, cooperative=coop,
                                                   busy_smem=smem)
                            mode = hb.launch_mode if pdl else "plain"
                            out.append(dict(what="swap_in", busy=name, bs=bs, miss_rate=rate, copy_order=order,
                                            max_regs=max_regs, launch=mode, added_us=round(us, 2)))
                            print(f"after busy ({name}): swap-in bs {bs:3d} miss {rate:5.3f} {order:6s} "
                                  f"regs<={max_regs or 128} {mode:16s} adds {us:6.1f} us", flush=True)
                del hb
                cp.get_default_memory_pool().free_all_blocks()
    return out


def time_phases(cp: Any, pool: PinnedPool, rng: np.random.Generator, kern: Kernels, iters: int,
                dup_checks: list[str]) -> None:
    """Bookkeeping cut after phase 0..6 (0: before its first load, i.e. the launch and the
    publishing; loads, duplicate check, hit lookup, miss ranking, order ranking, miss assignment)
    and whole (7), copy=False, 656 B rows, hot 4096: where the fixed cost goes. State-changing
    phases make the later draws approximate; timing only."""
    for dup in dup_checks:
        for bs in (1, 100):
            layers = pool.nbytes // (bs * MAX_CTX * 656)
            line = []
            for miss in (n_misses(0.001), n_misses(0.2)):
                for stop in range(0, 8):
                    hb = HotBuffer(layers=layers, requests=bs, max_ctx=MAX_CTX, device_buffer_size=4096, top_k=K,
                                   row_bytes=656, pool=pool, dup_check=dup)
                    hb.prefill()
                    if stop < 7:
                        hb._kern = _kernel(cp.cuda.Device().id, hb.unroll, hb.blocks_per_sm, stop)[0]
                    ctx = cp.full(bs, CTX, cp.int64)
                    idx = cp.asarray(draw_step(rng, hb.state(0).slot_pos, miss))
                    us = held_launch_us(cp, kern, partial(hb.swap_in, 0, idx, ctx, check=False, copy=False), iters,
                                        # these phases write the tables: re-prefill for the same step
                                        after=hb.prefill if stop >= 5 else None)
                    line.append(f"{stop}:{us:.1f}")
                    del hb
                print(f"phases {dup} bs {bs} misses {miss}: " + " ".join(line[-8:]) + " us", flush=True)


def summary(rows: list[dict[str, Any]]) -> None:
    """The issue's target cases."""
    print("\ncase                          us      GB/s   %memcpy  target        SGLang (same H200)")
    for (bs, hot, rate, row), (kind, goal, sgl) in TARGETS.items():
        for x in rows:
            if (x["bs"], x["hot"], x["miss_rate"], x["row_bytes"]) == (bs, hot, rate, row):
                pct = x["gbps"] / x["memcpy_gbps"]
                ok = pct >= goal if kind == "pct" else x["us"] <= goal
                tgt = f">= {goal:.0%}" if kind == "pct" else f"<= {goal:g} us"
                print(f"bs{bs:<3d} {rate:5.1%} {row:4d} B {x['copy_order'][:5]:5s} {x['dup_check'][:4]} g{x['grid']:<3d} {x['us']:9.1f} {x['gbps']:7.1f} "
                      f"{pct:8.1%}  {tgt:9s} {'met' if ok else 'MISSED':6s} {sgl}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/swap_in-h200.csv"))
    ap.add_argument("--pool-gib", type=float, default=16.0)
    ap.add_argument("--iters", type=int, default=15)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batches", type=int, nargs="+", default=list(BATCHES))
    ap.add_argument("--hots", type=int, nargs="+", default=list(HOTS))
    ap.add_argument("--miss-rates", type=float, nargs="+", default=list(MISS_RATES))
    ap.add_argument("--rows", type=int, nargs="+", default=list(ROWS))
    ap.add_argument("--unrolls", type=int, nargs="+", default=[4], help="loads in flight per thread (variants)")
    ap.add_argument("--max-grids", type=int, nargs="+", default=[0],
                    help="caps on blocks per launch, 0 = as many as fit (variants)")
    ap.add_argument("--copy-orders", nargs="+", default=["early"], choices=list(COPY_ORDERS),
                    help="copy phase orders (variants; see HotBuffer); default early")
    ap.add_argument("--dup-checks", nargs="+", default=["bitmap"], choices=list(DUP_CHECKS),
                    help="duplicate checks (variants; see HotBuffer); default bitmap")
    ap.add_argument("--blocks-per-sm", type=int, nargs="+", default=[1],
                    help="resident blocks per SM the kernel's registers are cut for (variants)")
    ap.add_argument("--breakdown", action="store_true", help="also time bookkeeping only (copy=False)")
    ap.add_argument("--phases", action="store_true", help="time the bookkeeping cut after each phase")
    ap.add_argument("--hold-us", type=float, default=300.0,
                    help="spin before each timed launch, us (default 300; it also reads the SM clock)")
    ap.add_argument("--hold-blocks", type=int, default=1, help="blocks of that spin (default 1)")
    ap.add_argument("--after-kernel", action="store_true",
                    help="also time launches behind a busy kernel in the same stream, plain and with "
                         "programmatic dependent launch (the honest PDL measure)")
    ap.add_argument("--busy-us", type=float, default=20.0, help="length of that busy kernel, us (default 20)")
    ap.add_argument("--after-orders", nargs="+", default=["early"], choices=list(COPY_ORDERS),
                    help="copy orders timed behind the busy kernel (default early)")
    ap.add_argument("--after-rates", type=float, nargs="+", default=None,
                    help="miss rates timed behind the busy kernel (default: those of --miss-rates under 1)")
    ap.add_argument("--after-max-regs", type=int, default=0,
                    help="also time behind the busy kernel a build capped at this many registers "
                         "(room for a busy block beside a swap-in block; 0 = no such build)")
    ap.add_argument("--rowcopy", action="store_true", help="also run the row-alignment gather study")
    ap.add_argument("--pool-backing", default="alloc", choices=list(POOL_BACKINGS),
                    help="how the pinned host pool is made: cudaHostAlloc (default), cudaHostRegister of 4 KB "
                         "pages, or of 2 MB transparent huge pages (the page-translation test)")
    ap.add_argument("--baseline-cu", type=Path, default=None,
                    help="also time the kernel built from this older swap_in.cu (e.g. the last commit's), "
                         "as copy orders head-<order>, hash duplicate check")
    ap.add_argument("--baseline-orders", nargs="+", default=["flat", "request"], choices=list(COPY_ORDERS),
                    help="copy orders of the --baseline-cu kernel (default flat request; early only for a source "
                         "that has it)")
    ap.add_argument("--variants-out", type=Path, default=None, help="CSV of every variant row (all columns)")
    ap.add_argument("--after-out", type=Path, default=None, help="CSV of the --after-kernel rows")
    ap.add_argument("--rowcopy-out", type=Path, default=None, help="CSV of the --rowcopy rows")
    args = ap.parse_args()
    rows, after, rc = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", newline="") as f:
        cols = ["bs", "hot", "miss_rate", "row_bytes", "us", "gbps", "memcpy_gbps"]
        w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        w.writerows(x for x in rows if x["unroll"] == args.unrolls[0] and x["max_grid"] == args.max_grids[0]
                    and x["blocks_per_sm"] == args.blocks_per_sm[0] and x["copy_order"] == args.copy_orders[0]
                    and x["dup_check"] == args.dup_checks[0])
    for path, table in ((args.variants_out, rows), (args.after_out, after), (args.rowcopy_out, rc)):
        if path is not None and table:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "w", newline="") as f:
                cols = list(dict.fromkeys(k for x in table for k in x))
                w = csv.DictWriter(f, fieldnames=cols)
                w.writeheader()
                w.writerows(table)
    summary(rows)


if __name__ == "__main__":
    main()
