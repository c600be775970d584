"""Timings of the real kernels and the host link on a GPU (``hisparse calibrate``)."""

from __future__ import annotations

import statistics
from typing import Any

import numpy as np

K = 2048
_SPIN = r"""
extern "C" __global__ void spin(long long ns) {
    long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
}
"""
_spin_kernel = None


def hold_stream(cp: Any, us: float) -> None:
    """Keep the stream busy for ``us`` so that the launches queued next start back to back:
    events then time the GPU's work, not Python's launch overhead (a serving engine replays
    CUDA graphs, so its kernels run without that overhead too)."""
    global _spin_kernel
    if _spin_kernel is None:
        _spin_kernel = cp.RawKernel(_SPIN, "spin")
    _spin_kernel((1,), (1,), (np.int64(us * 1000),))


def _events(cp):
    return cp.cuda.Event(), cp.cuda.Event()


def memcpy_gbps(cp: Any, pool: Any, nbytes: int = 1 << 30, reps: int = 8) -> float:
    """Pinned host -> device cudaMemcpy bandwidth (median GB/s)."""
    dst = cp.empty(nbytes, cp.uint8)
    times = []
    for _ in range(reps + 2):
        e0, e1 = _events(cp)
        e0.record()
        cp.cuda.runtime.memcpyAsync(dst.data.ptr, pool.device_ptr, nbytes, cp.cuda.runtime.memcpyHostToDevice,
                                    cp.cuda.get_current_stream().ptr)
        e1.record()
        e1.synchronize()
        times.append(cp.cuda.get_elapsed_time(e0, e1) * 1e-3)
    return nbytes / statistics.median(times[2:]) / 1e9


def hbm_gbps(cp: Any, nbytes: int = 2 << 30) -> float:
    """Device-to-device copy, bytes read + written per second (GB/s)."""
    a, b = cp.empty(nbytes, cp.uint8), cp.empty(nbytes, cp.uint8)
    times = []
    for _ in range(6):
        e0, e1 = _events(cp)
        e0.record()
        b[...] = a
        e1.record()
        e1.synchronize()
        times.append(cp.cuda.get_elapsed_time(e0, e1) * 1e-3)
    return 2 * nbytes / statistics.median(times[1:]) / 1e9


def draw_step(rng: np.random.Generator, slot_pos: np.ndarray, miss: int, ctx: int) -> np.ndarray:
    """[R, K] positions: K - 1 - miss resident, ``miss`` not resident, and the newest token."""
    out = np.empty((slot_pos.shape[0], K), np.int32)
    newest = ctx - 1
    for r in range(slot_pos.shape[0]):
        res = slot_pos[r][(slot_pos[r] >= 0) & (slot_pos[r] != newest)]
        hits = rng.choice(res, K - 1 - miss, replace=False)
        taken = np.zeros(ctx, bool)
        taken[res] = True
        taken[newest] = True
        free = np.flatnonzero(~taken)
        fresh = rng.choice(free, miss, replace=False)
        out[r] = rng.permutation(np.r_[hits, fresh, newest])
    return out


def time_swap_in(cp: Any, pool: Any, *, batch: int, hot: int, miss: int, row_bytes: int, ctx: int,
                 iters: int, rng: np.random.Generator) -> float:
    """Median microseconds of one swap-in launch with exactly ``miss`` misses per request."""
    from cupy_kernels.swap_in import HotBuffer

    layers = max(1, min(8, pool.nbytes // (batch * (ctx + 64) * row_bytes)))
    hb = HotBuffer(layers=layers, requests=batch, max_ctx=ctx + 64, device_buffer_size=hot, top_k=K,
                   row_bytes=row_bytes, pool=pool)
    hb.prefill()
    ctx_arr = cp.full(batch, ctx, cp.int64)
    times = []
    for i in range(iters + 2):
        layer = int(rng.integers(0, layers))
        idx = cp.asarray(draw_step(rng, hb.state(layer).slot_pos, miss, ctx))
        cp.cuda.Device().synchronize()
        e0, e1 = _events(cp)
        hold_stream(cp, 400)
        e0.record()
        res = hb.swap_in(layer, idx, ctx_arr, check=False)
        e1.record()
        e1.synchronize()
        if not (res.misses.get() == miss).all():
            raise RuntimeError(f"swap-in counted {np.unique(res.misses.get())} misses, expected {miss}")
        if i >= 2:
            times.append(cp.cuda.get_elapsed_time(e0, e1) * 1e3)
    del hb
    return statistics.median(times)


def time_attention(cp: Any, *, batch: int, heads: int, kv_dtype: str, iters: int,
                   rng: np.random.Generator) -> float:
    """Median microseconds of one sparse MLA attention launch over k = 2048 random rows."""
    from cupy_kernels.mla_reference import BF16_ROW_BYTES, D_QK, FP8_ROW_BYTES
    from cupy_kernels.sparse_attention import sparse_mla_decode

    n_rows = batch * 4096
    q = cp.asarray(rng.integers(0x3C00, 0x3F00, (batch, heads, D_QK), dtype=np.uint16))
    if kv_dtype == "bf16":
        kv = cp.asarray(rng.integers(0x3C00, 0x3F00, (n_rows, D_QK), dtype=np.uint16))
    else:
        raw = rng.integers(0, 0x70, (n_rows, FP8_ROW_BYTES), dtype=np.uint8)
        raw[:, 512:528] = np.frombuffer(np.full(4, 0.01, np.float32).tobytes(), np.uint8)
        kv = cp.asarray(raw)
    del BF16_ROW_BYTES
    slots = cp.asarray(np.stack([rng.choice(4096, K, replace=False) + 4096 * b for b in range(batch)]).astype(np.int32))
    out = cp.empty((batch, heads, 512), cp.uint16)
    lse = cp.empty((batch, heads), cp.float32)
    times = []
    for i in range(iters + 2):
        e0, e1 = _events(cp)
        hold_stream(cp, 400)
        e0.record()
        sparse_mla_decode(q, kv, slots, 0.07, kv_dtype, out=out, lse=lse)
        e1.record()
        e1.synchronize()
        if i >= 2:
            times.append(cp.cuda.get_elapsed_time(e0, e1) * 1e3)
    return statistics.median(times)


def time_queued(cp: Any, fn: Any, reps: int, hold_us: float = 3000.0, warmup: int = 2) -> float:
    """Median microseconds of one call of ``fn`` (GPU work on the current stream): the calls are
    queued behind a spin kernel with an event between each, so each interval is GPU time."""
    for _ in range(warmup):
        fn()
    cp.cuda.Device().synchronize()
    ev = [cp.cuda.Event() for _ in range(reps + 1)]
    hold_stream(cp, hold_us)
    ev[0].record()
    for i in range(reps):
        fn()
        ev[i + 1].record()
    ev[-1].synchronize()
    return statistics.median(cp.cuda.get_elapsed_time(ev[i], ev[i + 1]) * 1e3 for i in range(reps))
