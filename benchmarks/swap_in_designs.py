"""Swap-in designs on PR #33686's grid, same run: ours against SGLang's own kernels.

Designs (hot buffer 4096 slots, k 2048, ctx 32768; every launch reads a random layer's rows of
one pinned pool, as benchmarks/swap_in.py does):
- ``exact-lru``: ``cupy_kernels/swap_in.py`` HotBuffer (copy order "early"), the kernel that makes
  SGLang's exact-LRU choices, which also copies the newest token's row into its reserved slot
  every step; ``exact-lru-no-newest``: without that row (SGLang's swap-in does not load it: the
  model's KV write puts the newest token into the reserved slot), the like-for-like peer of
  ``sglang-fused``; ``exact-lru-nocopy``: bookkeeping only (copy=False);
- ``lru1-plan``: ``sharded_lru.cu`` with one shard of 4096 ways (exact lru), planned and copied
  by a full grid; ``salru32-inline`` / ``salru32-plan``: 128 shards of 32 ways (SGLang #31341's
  set-associative LRU as the engine's ``salru`` models it), copied by each request's block or
  planned;
- ``clock-inline`` / ``clock-plan``: ``clock_swap.cu``, SGLang #32162's CLOCK commit (the
  engine's ``sglang-clock``) with one step per commit;
- with ``--sglang DIR`` (filled by benchmarks/fetch_sglang_kernels.sh; built in this process by
  benchmarks/sglang_kernels.py): ``sglang-fused`` SGLang's ``load_cache_to_device_buffer_kernel``
  (block 960, one block per request, a warp per missed row), ``sglang-nocopy`` the same with its
  SkipIO probe (bookkeeping only), ``sglang-plan`` its RecordMissPlan + SkipIO launch followed by
  ``copy_cache_planned_kernel`` on a full grid (--sglang-copy-blocks, default the SM count).
Grid: rows 576 / 656 B, batch 1 / 2 / 8 / 100, misses 0.1% / 20% / 100% of k (each step drawn from
the design's own state so it has exactly that many misses; every design's count is checked).
Times: CUDA events around the launch(es) while a spin kernel holds the stream (no host launch
overhead), median of --iters; ratio = design / exact-lru and design / sglang-fused in the same
run. ``--clock-steps 4`` adds the multi-step commit: S draft steps per launch, each drawn with
the rate's misses (unique misses deduped across the steps), ours only (SGLang's speculative
kernel keeps a different state: not timed).

    bash benchmarks/fetch_sglang_kernels.sh .sglang-src
    python benchmarks/swap_in_designs.py --sglang .sglang-src --out benchmarks/results/swap_in_designs-h200.csv
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from swap_in import (  # noqa: E402
    CTX,
    MAX_CTX,
    K,
    Kernels,
    baseline_kernel,
    draw_step,
    fill_pool,
    measure_memcpy,
    n_misses,
)

from cupy_kernels.clock_swap import ClockHotBuffer  # noqa: E402
from cupy_kernels.sharded_lru import ShardedHotBuffer  # noqa: E402
from cupy_kernels.swap_in import HotBuffer, PinnedPool  # noqa: E402

HOT = 4096
OURS = ("exact-lru", "exact-lru-no-newest", "exact-lru-nocopy", "lru1-plan", "salru32-inline", "salru32-plan", "clock-inline", "clock-plan")
VARIANTS = ("exact-lru-base", "exact-lru-base-no-newest", "exact-lru-base-nocopy")
"""Opt-in designs: the kernel of another commit (``--baseline-cu``, e.g. main's ``swap_in.cu``) with and without copies, timed in
the same run."""
SGLANG = ("sglang-fused", "sglang-nocopy", "sglang-plan")
DESIGNS = OURS + SGLANG + VARIANTS


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
        got = np.asarray(misses.get())
        if not (got == miss).all():
            raise RuntimeError(f"{check}: kernel counted misses {np.unique(got)} for a step built with {miss}")
        if i >= 2:
            times.append(cp.cuda.get_elapsed_time(e0, e1) * 1e3)
    return statistics.median(times)


class _TokenDiff:
    """SGLang's fused kernel reports no miss count: the slots whose token changed, per request."""

    def __init__(self, cp, before, tokens, B):
        self.cp, self.before, self.tokens, self.B = cp, before, tokens, B

    def get(self):
        return (self.tokens[:, :self.B] != self.before).sum(axis=1).get()


class SglangBuffer:
    """SGLang's per-layer tables for a batch (as its coordinator lays them out): slot -> token
    (B slots + a 64-slot page for the newest), slot -> device row, position -> host row, the
    int16 LRU order; colocated start: slot s holds position s, LRU order 0..B-1."""

    def __init__(self, cp, mod, build, *, bs, row, pool_ptr, copy_blocks, B=HOT, k=K, block=960):
        from sglang_kernels import smem_bytes

        self.cp, self.bs, self.row, self.B, self.k, self.block = cp, bs, row, B, k, block
        self.W = B + 64
        self.fused = mod.get_function(build.fused)
        self.nocopy = mod.get_function(build.bookkeeping)
        self.plan_k = mod.get_function(build.plan)
        self.copy_k = mod.get_function(build.copy)
        self.smem = smem_bytes(k, B)
        self.copy_blocks = copy_blocks
        self.tokens = cp.full((bs, self.W), -1, cp.int32)
        self.tokens[:, :B] = cp.arange(B, dtype=cp.int32)
        self.dev_locs = (cp.arange(bs, dtype=cp.int32)[:, None] * self.W + cp.arange(self.W, dtype=cp.int32)).copy()
        self.host_locs = (cp.arange(bs, dtype=cp.int64)[:, None] * MAX_CTX + cp.arange(MAX_CTX, dtype=cp.int64)).copy()
        self.lru = cp.tile(cp.arange(B, dtype=cp.int16), (bs, 1))
        self.dev = cp.empty((bs * self.W, row), cp.uint8)
        self.out = cp.empty((bs, k), cp.int32)
        self.rpi = cp.arange(bs, dtype=cp.int64)
        self.n_real = cp.asarray([bs], cp.int32)
        self.miss_src = cp.empty((bs, k), cp.int64)
        self.miss_dst = cp.empty((bs, k), cp.int32)
        self.miss_n = cp.zeros(bs, cp.int32)
        self.pool_ptr = pool_ptr
        self.host_ptr = pool_ptr
        self.before = None

    def state(self):
        self.before = self.tokens[:, :self.B].copy()
        return self.before.get().astype(np.int64)

    def _args(self, idx, ctx, rec):
        z = np.uint64(0)  # a null pointer
        return (idx, self.tokens, self.host_locs, self.dev_locs, np.uint64(self.host_ptr), z, self.dev, z, self.out,
                self.rpi, ctx, self.lru, self.n_real, np.int64(self.W), np.int64(MAX_CTX), np.int64(self.B),
                np.int64(self.k), np.int64(self.k), np.int64(1), np.int64(self.row),
                self.miss_src if rec else z, self.miss_dst if rec else z, self.miss_n if rec else z,
                np.int64(self.k if rec else 0))

    def launch(self, mode, idx, ctx):
        if mode == "plan":
            self.plan_k((self.bs,), (self.block,), self._args(idx, ctx, True), shared_mem=self.smem)
            self.copy_k((self.copy_blocks,), (self.block,),
                        (self.miss_src, self.miss_dst, self.miss_n, self.n_real, np.uint64(self.host_ptr),
                         np.uint64(0), self.dev, np.uint64(0), np.int64(self.k), np.int64(self.row)))
            return self.miss_n
        kern = self.fused if mode == "fused" else self.nocopy
        kern((self.bs,), (self.block,), self._args(idx, ctx, False), shared_mem=self.smem)
        return _TokenDiff(self.cp, self.before, self.tokens, self.B)


def run_design(cp, design, pool, bs, row, rate, iters, kern, rng, sgl=None, copy_blocks=0, baseline_cu=None):
    miss = n_misses(rate)
    layers = pool.nbytes // (bs * MAX_CTX * row)
    layer_bytes = bs * MAX_CTX * row
    if design.startswith("exact-lru"):
        hb = HotBuffer(layers=layers, requests=bs, max_ctx=MAX_CTX, device_buffer_size=HOT, top_k=K, row_bytes=row,
                       pool=pool, load_newest=not design.endswith("no-newest"))
        if design.startswith("exact-lru-base"):
            if baseline_cu is None:
                raise SystemExit("the exact-lru-base* designs need --baseline-cu FILE")
            hb._kern = baseline_kernel(cp, baseline_cu)
        hb.prefill()
        layer = [0]
        copy = not design.endswith("nocopy")

        def state():
            layer[0] = int(rng.integers(0, layers))
            return hb.state(layer[0]).slot_pos

        def launch(idx, ctx):
            return hb.swap_in(layer[0], idx, ctx, check=False, copy=copy).misses
    elif design.startswith("sglang"):
        mod, build = sgl
        sb = SglangBuffer(cp, mod, build, bs=bs, row=row, pool_ptr=pool.device_ptr, copy_blocks=copy_blocks)

        def state():
            sb.host_ptr = pool.device_ptr + int(rng.integers(0, layers)) * layer_bytes
            return sb.state()

        def launch(idx, ctx):
            return sb.launch(design.split("-", 1)[1], idx, ctx)
    else:
        mode = design.rsplit("-", 1)[1]
        if design.startswith("clock"):
            hb = ClockHotBuffer(requests=bs, max_ctx=MAX_CTX, buffer=HOT, steps=1, top_k=K, row_bytes=row,
                                host_ptr=pool.device_ptr, copy=mode)
        else:
            hb = ShardedHotBuffer(requests=bs, max_ctx=MAX_CTX, buffer=HOT, ways=HOT if design.startswith("lru1")
                                  else 32, top_k=K, row_bytes=row, host_ptr=pool.device_ptr, copy=mode)

        def state():
            sp = hb.state()
            sp = sp[0] if isinstance(sp, tuple) else sp
            if (sp < 0).all():  # before the first step: the fresh prefix the kernel will build
                sp = np.tile(np.arange(HOT, dtype=np.int64), (bs, 1))
            hb.host_ptr = pool.device_ptr + int(rng.integers(0, layers)) * layer_bytes
            return sp

        if design.startswith("clock"):
            def launch(idx, ctx):
                return hb.swap_in(idx[:, None, :], ctx[:, None])[1][:, 0]
        else:
            def launch(idx, ctx):
                return hb.swap_in(idx, ctx)[1]
    return _time(cp, launch, state, rng, miss, iters, kern, design)


def run_clock_steps(cp, pool, bs, row, rate, steps, iters, kern, rng, mode):
    """The multi-step commit: `steps` draft steps per launch, each drawn with the rate's misses."""
    miss = n_misses(rate)
    layers = pool.nbytes // (bs * MAX_CTX * row)
    layer_bytes = bs * MAX_CTX * row
    hb = ClockHotBuffer(requests=bs, max_ctx=MAX_CTX, buffer=HOT, steps=steps, top_k=K, row_bytes=row,
                        host_ptr=pool.device_ptr, copy=mode)
    ctx = cp.asarray(np.tile(CTX + np.arange(steps, dtype=np.int64), (bs, 1)))
    times, uniq = [], []
    for i in range(iters + 2):
        sp = hb.state()
        if (sp < 0).all():
            sp = np.tile(np.arange(HOT, dtype=np.int64), (bs, 1))
        hb.host_ptr = pool.device_ptr + int(rng.integers(0, layers)) * layer_bytes
        idx = np.stack([draw_step(rng, sp, miss) for _ in range(steps)], axis=1)
        want = np.array([np.setdiff1d(np.unique(idx[r][idx[r] < CTX - 1]), sp[r]).size for r in range(bs)])
        d_idx = cp.asarray(idx)
        cp.cuda.Device().synchronize()
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        kern.hold()
        e0.record()
        _, misses = hb.swap_in(d_idx, ctx)
        e1.record()
        e1.synchronize()
        got = misses.get().sum(axis=1)
        if not (got == want).all():
            raise RuntimeError(f"clock x{steps}: kernel counted {got[:4]} unique misses, the draw has {want[:4]}")
        if i >= 2:
            times.append(cp.cuda.get_elapsed_time(e0, e1) * 1e3)
            uniq.append(float(want.mean()))
    return statistics.median(times), statistics.mean(uniq)


def same_choices(cp, sgl, pool, rng, *, bs=8, steps=12, row=656) -> int:
    """Slots whose content differs between SGLang's fused kernel and our exact-LRU kernel after
    the same steps from the same prefix state (each step drawn from the shared state: 20% or 0.1%
    misses alternately). 0: the two make the same LRU choices."""
    mod, build = sgl
    sb = SglangBuffer(cp, mod, build, bs=bs, row=row, pool_ptr=pool.device_ptr, copy_blocks=8)
    hb = HotBuffer(layers=1, requests=bs, max_ctx=MAX_CTX, device_buffer_size=HOT, top_k=K, row_bytes=row,
                   pool=pool, load_newest=False)
    hb.prefill()
    ctx = cp.full(bs, CTX, cp.int64)
    bad = 0
    for t in range(steps):
        sp = sb.state()
        idx = cp.asarray(draw_step(rng, sp, n_misses(0.2 if t % 2 else 0.001)))
        sb.launch("fused", idx, ctx)
        hb.swap_in(0, idx, ctx)
        bad += int((sb.tokens[:, :HOT].get() != hb.state(0).slot_pos).sum())
    return bad


def _load_sglang(cp: Any, src: str) -> tuple[Any, Any]:
    from sglang_kernels import build

    b = build(Path(src), Path("/tmp/sglang-build"))
    mod = cp.RawModule(path=str(b.cubin))
    print(f"SGLang {b.version} kernels built from {src}: {b.cubin.name}", flush=True)
    return mod, b


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 2, 8, 100])
    ap.add_argument("--rows", type=int, nargs="+", default=[576, 656])
    ap.add_argument("--miss-rates", type=float, nargs="+", default=[0.001, 0.2, 1.0])
    ap.add_argument("--designs", nargs="+", default=None, choices=DESIGNS)
    ap.add_argument("--sglang", default=None, help="folder filled by benchmarks/fetch_sglang_kernels.sh")
    ap.add_argument("--sglang-copy-blocks", type=int, default=0, help="copy_cache_planned grid (0: SM count)")
    ap.add_argument("--clock-steps", type=int, nargs="*", default=[], help="multi-step commits to time, e.g. 2 4")
    ap.add_argument("--pool-gib", type=float, default=4.0)
    ap.add_argument("--iters", type=int, default=9)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--baseline-cu", type=Path, default=None,
                    help="swap_in.cu of another commit, timed as the exact-lru-base* designs")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import cupy as cp
    import pandas as pd

    designs = args.designs or (list(OURS) + (list(SGLANG) if args.sglang else []))
    if any(d.startswith("sglang") for d in designs) and not args.sglang:
        ap.error("the sglang-* designs need --sglang DIR (benchmarks/fetch_sglang_kernels.sh DIR)")
    sgl = _load_sglang(cp, args.sglang) if args.sglang else None
    copy_blocks = args.sglang_copy_blocks or cp.cuda.Device().attributes["MultiProcessorCount"]
    rng = np.random.default_rng(args.seed)
    pool = PinnedPool(int(args.pool_gib * (1 << 30)))
    fill_pool(pool, rng)
    memcpy = measure_memcpy(cp, pool)
    print(f"pinned cudaMemcpy H2D: {memcpy:.1f} GB/s; {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}",
          flush=True)
    kern = Kernels(cp, 300.0, 1)
    if sgl:
        print(f"slots differing from SGLang's choices after 12 steps x 8 requests: "
              f"{same_choices(cp, sgl, pool, rng)}", flush=True)
    rows = []
    for bs in args.batches:
        for row in args.rows:
            for rate in args.miss_rates:
                got = {}
                for design in designs:
                    got[design] = run_design(cp, design, pool, bs, row, rate, args.iters, kern, rng, sgl, copy_blocks,
                                             args.baseline_cu)
                    cp.get_default_memory_pool().free_all_blocks()
                for design, us in got.items():
                    gbps = bs * n_misses(rate) * row / us / 1e3
                    base, peer = got.get("exact-lru", float("nan")), got.get("sglang-fused", float("nan"))
                    rows.append(dict(design=design, steps=1, bs=bs, row_bytes=row, miss_rate=rate, us=round(us, 2),
                                     gbps=round(gbps, 2), pct_memcpy=round(gbps / memcpy, 3),
                                     vs_exact_lru=round(us / base, 3), vs_sglang=round(us / peer, 3)))
                    print(f"bs {bs:3d} row {row} miss {rate:5.3f} {design:17s} {us:9.1f} us {gbps:6.1f} GB/s "
                          f"x{us / base:5.2f} exact-lru  x{us / peer:5.2f} sglang-fused", flush=True)
                for steps in args.clock_steps:
                    for mode in ("inline", "plan"):
                        us, uniq = run_clock_steps(cp, pool, bs, row, rate, steps, args.iters, kern, rng, mode)
                        gbps = bs * uniq * row / us / 1e3
                        rows.append(dict(design=f"clock-{mode}", steps=steps, bs=bs, row_bytes=row, miss_rate=rate,
                                         us=round(us, 2), gbps=round(gbps, 2), pct_memcpy=round(gbps / memcpy, 3),
                                         vs_exact_lru=float("nan"), vs_sglang=float("nan"), unique_misses=uniq))
                        print(f"bs {bs:3d} row {row} miss {rate:5.3f} clock-{mode} x{steps} {us:9.1f} us "
                              f"({uniq:.0f} unique misses per request)", flush=True)
    if args.out:
        pd.DataFrame(rows).assign(memcpy_gbps=round(memcpy, 2)).to_csv(args.out, index=False)


if __name__ == "__main__":
    main()
