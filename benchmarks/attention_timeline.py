"""Where the wide FP8 attention kernel's time goes, per CTA: a build with -DTIMELINE stamps clock64.

The warp-specialised kernels (cupy_kernels/sparse_attention.cu, `mla_ws_body`) built with
-DTIMELINE record, per CTA, one thread of each warpgroup: the start, Q in shared memory, and per
tile WG0's "buffer freed" (its previous P V done), "full wait done" and "P V issued", the
producer's "empty wait done" and "full arrived", then the loop's end, the epilogue's end and the
kernel's end (after the closing cluster barrier); %globaltimer at the start and end; and (wsxb) WG0 right
after the pair's cluster barrier, an instant both CTAs of a pair share, which sets the two SMs' clock64
counters against each other: how far apart the pair runs, and how long after the *last* of the four
consumers (two per CTA) frees a buffer the producer sees it free (pair_* columns). The default
build compiles none of it (its SASS is unchanged). Medians over CTAs and the steady tiles (2 ..
n - 3) say how long the prologue, one tile and the epilogue take, and which side of the two-buffer
hand-off waits: the question issue #27 item 4 leaves open.

    python benchmarks/attention_timeline.py --batches 64 128 --variants wsxe wsxo wsxr --out attention_timeline.csv
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.csv_out import write_rows  # noqa: E402
from benchmarks.sparse_attention import K, make_sets  # noqa: E402
from cupy_kernels import sparse_attention as sa  # noqa: E402
from cupy_kernels._build import build_cubin  # noqa: E402

# mirrors the TL_* constants of sparse_attention.cu
TL_FIXED, TL_TILES, TL_SERIES, TL_CTAS = 8, 32, 6, 1024
TL_START, TL_Q_READY, TL_LOOP_END, TL_EPI_END, TL_END, TL_GT_START, TL_GT_END, TL_PAIR = range(8)
FREED, FULL, PV, EMPTY, ARRIVED, WG1_FREED = range(TL_SERIES)
TL_EVENTS = TL_FIXED + TL_SERIES * TL_TILES
WS_VARIANTS = ("ws", "wsx", "wsxe", "wsxo", "wsxr", "wsxb")  # the warp-specialised FP8 kernels the stamps are in
PAIR_VARIANTS = ("wsxb",)  # those that stamp TL_PAIR (the split cluster barrier, SB)


def series(row: Any, s: int, it: int) -> int:
    """Stamp `it` of per-tile series `s` in one CTA's row."""
    return int(row[TL_FIXED + s * TL_TILES + it])


def summarise(stamps: Any, n_ctas: int, n_tiles: int, producer_stamps: bool,
              pair_stamps: bool = False) -> dict[str, float | str]:
    """Medians (us) over CTAs and steady tiles; the SM clock from clock64 against %globaltimer."""
    rows = stamps.reshape(TL_CTAS, TL_EVENTS)[:n_ctas]
    ghz = statistics.median((int(r[TL_END]) - int(r[TL_START])) / max(1, int(r[TL_GT_END]) - int(r[TL_GT_START]))
                            for r in rows)
    us = 1e-3 / ghz  # microseconds per cycle

    def med(f) -> float:
        vals = [f(r, it) for r in rows for it in range(2, n_tiles - 2)]
        return statistics.median(vals) * us

    def med1(f) -> float:
        return statistics.median(f(r) for r in rows) * us

    out = dict(
        sm_ghz=round(ghz, 3),
        kernel_us=round((max(int(r[TL_GT_END]) for r in rows) - min(int(r[TL_GT_START]) for r in rows)) * 1e-3, 2),
        cta_us=round(med1(lambda r: int(r[TL_END]) - int(r[TL_START])), 2),
        q_ready_us=round(med1(lambda r: int(r[TL_Q_READY]) - int(r[TL_START])), 2),
        first_full_us=round(med1(lambda r: series(r, FULL, 0) - int(r[TL_START])), 2),
        tile_period_us=round(med(lambda r, it: series(r, FULL, it + 1) - series(r, FULL, it)), 3),
        wg0_waits_full_us=round(med(lambda r, it: series(r, FULL, it) - series(r, FREED, it)), 3),
        wg0_s_softmax_us=round(med(lambda r, it: series(r, PV, it) - series(r, FULL, it)), 3),
        wg0_pv_tail_us=round(med(lambda r, it: series(r, FREED, it + 1) - series(r, PV, it)), 3),
        loop_us=round(med1(lambda r: int(r[TL_LOOP_END]) - series(r, FULL, 0)), 2),
        epilogue_us=round(med1(lambda r: int(r[TL_EPI_END]) - int(r[TL_LOOP_END])), 2),
        end_wait_us=round(med1(lambda r: int(r[TL_END]) - int(r[TL_EPI_END])), 2),
        start_spread_us=round((max(int(r[TL_GT_START]) for r in rows) - min(int(r[TL_GT_START]) for r in rows)) * 1e-3, 2),
    )
    if producer_stamps:
        out.update(
            prod_waits_empty_us=round(med(lambda r, it: series(r, EMPTY, it) - series(r, ARRIVED, it - 1)), 3),
            prod_tile_us=round(med(lambda r, it: series(r, ARRIVED, it) - series(r, EMPTY, it)), 3),
            full_after_arrive_us=round(med(lambda r, it: series(r, FULL, it) - series(r, ARRIVED, it)), 3),
            # tile it's buffer is tile it - 2's: WG0 frees that at the top of tile it - 1 (FREED), WG1 after its
            # P V of tile it - 2 (WG1_FREED); the producer's wait ends once both CTAs' consumers freed it
            empty_after_wg0_freed_us=round(med(lambda r, it: series(r, EMPTY, it) - series(r, FREED, it - 1)), 3),
            wg1_freed_after_wg0_us=round(med(lambda r, it: series(r, WG1_FREED, it - 2) - series(r, FREED, it - 1)), 3),
        )
    if producer_stamps and pair_stamps:
        out.update(pair_summary(rows, n_ctas, n_tiles, us))
    return out


def pair_summary(rows: Any, n_ctas: int, n_tiles: int, us: float) -> dict[str, float | str]:
    """The pair's phase and the producer's lag after the last release of each buffer, from the two CTAs of each
    cluster (CTAs 2 c and 2 c + 1: the grid's x is the pair) aligned at their shared TL_PAIR instant.
    For tile it (buffer of tile it - 2): the releases are each CTA's WG0 at the top of tile it - 1 and its WG1
    after tile it - 2; `pair_last_release_is_peer` is the share of (CTA, tile) where the peer's came last."""
    phase, peer_after = [], []
    lag: dict[bool, list[int]] = {False: [], True: []}  # the producer's lag, by whether the peer's release came last
    for c in range(0, n_ctas - 1, 2):
        a, b = rows[c], rows[c + 1]
        shift = int(b[TL_PAIR]) - int(a[TL_PAIR])  # b's clock64 minus a's at the same instant
        for own, peer, to_own in ((a, b, -shift), (b, a, shift)):
            for it in range(2, n_tiles - 2):
                phase.append(series(peer, FREED, it) + to_own - series(own, FREED, it))
                own_rel = max(series(own, FREED, it - 1), series(own, WG1_FREED, it - 2))
                peer_rel = max(series(peer, FREED, it - 1), series(peer, WG1_FREED, it - 2)) + to_own
                lag[peer_rel > own_rel].append(series(own, EMPTY, it) - max(own_rel, peer_rel))
                peer_after.append(peer_rel - own_rel)
    every = lag[False] + lag[True]
    if not every:
        return {}

    def med_us(vals: list[int]) -> float | str:
        return round(statistics.median(vals) * us, 3) if vals else ""

    return dict(
        pair_phase_us=med_us([abs(v) for v in phase]),
        pair_peer_release_after_own_us=med_us(peer_after),
        pair_last_release_is_peer=round(len(lag[True]) / len(every), 3),
        pair_empty_after_last_release_us=med_us(every),
        # own last: only the peer's earlier arrival can still be in flight; peer last: its arrival is the last
        pair_empty_after_own_last_us=med_us(lag[False]),
        pair_empty_after_peer_last_us=med_us(lag[True]),
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--heads", type=int, default=128, help="a multiple of 128 (the crossover variants)")
    ap.add_argument("--variants", nargs="+", default=["wsxe", "wsxo", "wsxr"], help=f"each one of {WS_VARIANTS}")
    ap.add_argument("--launches", type=int, default=5, help="launches per case; the last one's stamps are read")
    ap.add_argument("--out", type=Path, default=Path("attention_timeline.csv"))
    args = ap.parse_args(argv)
    bad = [v for v in args.variants if v not in WS_VARIANTS]
    if bad or args.heads % 128 or args.launches < 1 or any(b < 1 for b in args.batches):
        print(f"--variants must be among {WS_VARIANTS}, --heads a multiple of 128, --launches and --batches >= 1",
              file=sys.stderr)
        return 2
    import cupy as cp
    import numpy as np

    cubin = build_cubin(sa._SOURCE, (*sa._NVCC_FLAGS, "-DTIMELINE"), "sparse_attention_timeline")
    mod = cp.RawModule(path=str(cubin))
    g = mod.get_global("g_timeline")
    stamps = cp.ndarray((TL_CTAS * TL_EVENTS,), cp.uint64, g)
    scale_log2 = np.float32((1.0 / math.sqrt(576)) * math.log2(math.e))
    results = []
    for batch in args.batches:
        pool, sets = make_sets(cp, batch, args.heads, "fp8", 1)
        q, slots, out, lse, _ = sets[0]
        tiles = math.ceil(K / sa.TILE)
        grid = (args.heads // sa.HEADS_PER_CTA, 1, batch)  # one split per (request, head group)
        n_ctas = grid[0] * batch
        if n_ctas > TL_CTAS:
            print(f"B {batch} H {args.heads}: {n_ctas} CTAs, the timeline holds {TL_CTAS}", file=sys.stderr)
            return 2
        for var in args.variants:
            spec = sa.WIDE_VARIANTS[var]
            kern = mod.get_function(f"{spec.prefix}fp8")
            kern.max_dynamic_shared_size_bytes = spec.smem
            kargs = (q, pool, slots, np.int64(pool.shape[0]), np.int32(args.heads), np.int32(K), scale_log2,
                     np.int32(tiles), out, lse, out, lse)
            for _ in range(args.launches):
                stamps.fill(0)
                kern(grid, (spec.threads,), kargs, shared_mem=spec.smem)
            cp.cuda.Device().synchronize()
            row = dict(batch=batch, heads=args.heads, variant=var,
                       **summarise(stamps.get(), n_ctas, min(tiles, TL_TILES), producer_stamps=var != "ws",
                                  pair_stamps=var in PAIR_VARIANTS))
            results.append(row)
            print(" ".join(f"{k}={v}" for k, v in row.items()), flush=True)
    write_rows(args.out, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
