"""Is the swap-in's fixed cost the fetch of its own code? One launch timed cold and warm.

Every swap-in benchmark times a launch queued behind a spin kernel (``Kernels.hold``): the
launch's code and constants were last used one launch (and a spin) ago. Here the same launch is
also timed right behind a launch of the same kernel on the same layer and step, so it starts
with whatever its own code left in the caches. Steps repeat a drawn step, so both timed launches
have 0 misses and copy only the newest row per request. Controls: the empty kernel (cooperative,
74 KB of shared memory, as the swap-in launches) cold and warm, and the build that stops before
the bookkeeping's first load (phase 0: the launch and the publishing alone).

A warm launch much faster than a cold one, with the empty kernel unchanged, says the fixed cost
is spent fetching instructions (a Nsight Compute source profile of bs 100 at 0.1% misses puts
32% of warp samples at "no instruction", BENCHMARKS.md).

    python benchmarks/swap_in_warm.py --batches 1 100 --iters 15 --out swap_in_warm.csv
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.csv_out import write_rows  # noqa: E402
from benchmarks.swap_in import CTX, MAX_CTX, K, Kernels, draw_step, n_misses  # noqa: E402
from cupy_kernels.swap_in import HotBuffer, PinnedPool, _kernel  # noqa: E402


def cold_and_warm(cp: Any, kern: Kernels, launch: Callable[[], None], iters: int) -> tuple[float, float]:
    """Median us of `launch()` queued behind the spin kernel (cold) and queued behind another
    `launch()` (warm), each between two events, after 2 warm-up rounds."""
    cold, warm = [], []
    for i in range(iters + 2):
        for mode in ("cold", "warm"):
            cp.cuda.Device().synchronize()
            e0, e1 = cp.cuda.Event(), cp.cuda.Event()
            kern.hold()
            if mode == "warm":
                launch()
            e0.record()
            launch()
            e1.record()
            e1.synchronize()
            if i >= 2:
                (cold if mode == "cold" else warm).append(cp.cuda.get_elapsed_time(e0, e1) * 1e3)
    return statistics.median(cold), statistics.median(warm)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 100])
    ap.add_argument("--iters", type=int, default=15, help="timed rounds per case (median)")
    ap.add_argument("--pool-gib", type=float, default=3.0, help="pinned host pool (bs 100 needs 2.2 GB per layer)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("swap_in_warm.csv"))
    args = ap.parse_args(argv)
    if args.iters < 1 or any(b < 1 for b in args.batches):
        print("--iters and --batches must be >= 1", file=sys.stderr)
        return 2
    import cupy as cp
    import numpy as np

    rng = np.random.default_rng(args.seed)
    kern = Kernels(cp)
    pool = PinnedPool(int(args.pool_gib * (1 << 30)))
    rows: list[dict[str, Any]] = []

    def record(what: str, bs: int, cold: float, warm: float) -> None:
        rows.append(dict(what=what, bs=bs, cold_us=round(cold, 2), warm_us=round(warm, 2),
                         warm_minus_cold_us=round(warm - cold, 2)))
        print(f"{what:28s} bs {bs:3d}: cold {cold:6.1f} us  warm {warm:6.1f} us  ({warm - cold:+.1f})", flush=True)

    record("empty kernel, cooperative", 0, *cold_and_warm(cp, kern, kern.empty_cooperative, args.iters))
    for bs in args.batches:
        layers = max(1, pool.nbytes // (bs * MAX_CTX * 656))
        ctx = cp.full(bs, CTX, cp.int64)
        for what, stop, copy in (("swap-in, 0 misses", None, True), ("bookkeeping only", None, False),
                                 ("phase 0 build (launch+publish)", 0, False)):
            hb = HotBuffer(layers=layers, requests=bs, max_ctx=MAX_CTX, device_buffer_size=4096, top_k=K,
                           row_bytes=656, pool=pool)
            hb.prefill()
            if stop is not None:
                hb._kern = _kernel(cp.cuda.Device().id, hb.unroll, hb.blocks_per_sm, stop)[0]
            idx = cp.asarray(draw_step(rng, hb.state(0).slot_pos, n_misses(0.001)))
            if stop is None:  # now every entry but the newest is resident
                hb.swap_in(0, idx, ctx, check=True, copy=True)

            def launch(hb=hb, idx=idx, ctx=ctx, copy=copy) -> None:
                hb.swap_in(0, idx, ctx, check=False, copy=copy)

            record(what, bs, *cold_and_warm(cp, kern, launch, args.iters))
            if stop is None and copy:
                got = hb.swap_in(0, idx, ctx, check=True).misses.get()
                if int(got.max()) != 0:
                    raise RuntimeError(f"a repeated step missed {int(got.max())} rows (expected 0)")
            del hb
    write_rows(args.out, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
