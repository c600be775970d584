"""Swap-in designs on PR #33686's grid, same run: our exact-LRU kernel against the sharded kernels.

Designs (hot buffer 4096 slots, k 2048, ctx 32768; every launch reads a random layer's rows of
one pinned pool, as benchmarks/swap_in.py does):
- ``exact-lru``: ``cupy_kernels/swap_in.py`` HotBuffer (copy order "early"), the kernel that makes
  SGLang's exact-LRU choices;
- ``lru1-inline`` / ``lru1-plan``: ``sharded_lru.cu`` with one shard of 4096 ways (the engine's
  exact lru again), rows copied by each request's block, or planned and copied by a full grid;
- ``salru32-inline`` / ``salru32-plan``: the same kernels with 128 shards of 32 ways (SGLang
  #31341's set-associative LRU as the engine's ``salru`` models it).
Grid: rows 576 / 656 B, batch 1 / 2 / 8 / 100, misses 0.1% / 20% / 100% of k (each step drawn from
the kernel's own state so it has exactly that many misses; counts checked). Times: CUDA events
around the launch(es) while a spin kernel holds the stream (no host launch overhead), median of
--iters; ratio = design / exact-lru in the same run.

    python benchmarks/swap_in_designs.py --out benchmarks/results/swap_in_designs-h200.csv
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from swap_in import CTX, MAX_CTX, K, Kernels, draw_step, fill_pool, measure_memcpy, n_misses  # noqa: E402

from cupy_kernels.sharded_lru import ShardedHotBuffer  # noqa: E402
from cupy_kernels.swap_in import HotBuffer, PinnedPool  # noqa: E402

HOT = 4096
DESIGNS = ("exact-lru", "lru1-inline", "lru1-plan", "salru32-inline", "salru32-plan")


def _time(cp, launch, state, rng, miss, iters, kern, check):
    ctx = None
    times = []
    for i in range(iters + 2):
        sp = state()
        idx = cp.asarray(draw_step(rng, sp, miss))
        if ctx is None:
            ctx = cp.full(sp.shape[0], CTX, cp.int64)
        cp.cuda.Device().synchronize()
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        kern.hold()
        e0.record()
        misses = launch(idx, ctx)
        e1.record()
        e1.synchronize()
        got = misses.get()
        if not (got == miss).all():
            raise RuntimeError(f"{check}: kernel counted misses {np.unique(got)} for a step built with {miss}")
        if i >= 2:
            times.append(cp.cuda.get_elapsed_time(e0, e1) * 1e3)
    return statistics.median(times)


def run_design(cp, design, pool, bs, row, rate, iters, kern, rng):
    miss = n_misses(rate)
    layers = pool.nbytes // (bs * MAX_CTX * row)
    if design == "exact-lru":
        hb = HotBuffer(layers=layers, requests=bs, max_ctx=MAX_CTX, device_buffer_size=HOT, top_k=K, row_bytes=row,
                       pool=pool)
        hb.prefill()
        layer = [0]

        def state():
            layer[0] = int(rng.integers(0, layers))
            return hb.state(layer[0]).slot_pos

        def launch(idx, ctx):
            return hb.swap_in(layer[0], idx, ctx, check=False).misses
    else:
        ways = HOT if design.startswith("lru1") else 32
        hb = ShardedHotBuffer(requests=bs, max_ctx=MAX_CTX, buffer=HOT, ways=ways, top_k=K, row_bytes=row,
                              host_ptr=pool.device_ptr, copy=design.rsplit("-", 1)[1])
        layer_bytes = bs * MAX_CTX * row

        def state():
            sp, _ = hb.state()
            if (sp < 0).all():  # before the first step: the fresh prefix the kernel will build
                sp = np.tile(np.arange(HOT, dtype=np.int64), (bs, 1))
            hb.host_ptr = pool.device_ptr + int(rng.integers(0, layers)) * layer_bytes
            return sp

        def launch(idx, ctx):
            return hb.swap_in(idx, ctx)[1]
    return _time(cp, launch, state, rng, miss, iters, kern, design)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 2, 8, 100])
    ap.add_argument("--rows", type=int, nargs="+", default=[576, 656])
    ap.add_argument("--miss-rates", type=float, nargs="+", default=[0.001, 0.2, 1.0])
    ap.add_argument("--designs", nargs="+", default=list(DESIGNS), choices=DESIGNS)
    ap.add_argument("--pool-gib", type=float, default=4.0)
    ap.add_argument("--iters", type=int, default=9)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import cupy as cp
    import pandas as pd

    rng = np.random.default_rng(args.seed)
    pool = PinnedPool(int(args.pool_gib * (1 << 30)))
    fill_pool(pool, rng)
    memcpy = measure_memcpy(cp, pool)
    print(f"pinned cudaMemcpy H2D: {memcpy:.1f} GB/s", flush=True)
    kern = Kernels(cp, 300.0, 1)
    rows = []
    for bs in args.batches:
        for row in args.rows:
            for rate in args.miss_rates:
                base = None
                for design in args.designs:
                    us = run_design(cp, design, pool, bs, row, rate, args.iters, kern, rng)
                    cp.get_default_memory_pool().free_all_blocks()
                    base = us if design == "exact-lru" else base
                    gbps = bs * n_misses(rate) * row / us / 1e3
                    rows.append(dict(design=design, bs=bs, row_bytes=row, miss_rate=rate, us=round(us, 2),
                                     gbps=round(gbps, 2), pct_memcpy=round(gbps / memcpy, 3),
                                     vs_exact_lru=round(us / base, 3) if base else float("nan")))
                    print(f"bs {bs:3d} row {row} miss {rate:5.3f} {design:15s} {us:9.1f} us {gbps:6.1f} GB/s "
                          f"x{us / base if base else float('nan'):5.2f} of exact-lru", flush=True)
    if args.out:
        pd.DataFrame(rows).assign(memcpy_gbps=round(memcpy, 2)).to_csv(args.out, index=False)


if __name__ == "__main__":
    main()
