"""How fast the two CTAs of a cluster hand each other shared memory: the FP8 attention kernel's crossover traffic alone.

The crossover attention kernels (variants wsx .. wsxl) send each 64-token tile's 32 dequantised rows,
36,864 B, to the peer CTA with bulk copies (4 warps x 9 x 1 KB), both CTAs at once, two buffers in
flight. Their tile period, ~2.7 us on an H100 (FlashMLA's 2.69), is 13.7 GB/s per CTA and direction.
This times that traffic with nothing else in the kernel (benchmarks/dsmem_bandwidth.cu), so the
period can be set against what the SM-to-SM network gives:

- mode ``both``: both CTAs send and receive (the kernel's pattern); ``one-way``: rank 0 sends,
  rank 1 receives; ``local``: each CTA bulk-copies into its own shared memory (the copy engine
  without the network); ``st-async-lines`` / ``st-async-halves``: both CTAs send, every thread
  storing 16 B at a time from registers into the peer's shared memory (``st.async``, FlashMLA's
  hand-off), eight lanes to a whole 128-byte line (FlashMLA's order) or four lanes to every other
  16 B of a line (the order our dequantisation writes a row in); `--chunks` does not apply to them;
- ``ping`` / ``ping-under-copies``: one remote ``mbarrier.arrive``'s round trip between the two CTAs
  (`--pings` of them, one thread each side; what the attention kernel's release of a tile buffer to the
  peer's producer is), alone or while the other four warps run mode ``both``'s copies (the arrivals then
  share the path with copies going the same way): ``round_trip_us`` per ping, ``one_way_us`` half of it;
- `--chunks`: bytes per bulk copy (the kernel's 1,024; larger copies, fewer of them);
- `--clusters`: 1 (a lone pair) or 66 (every SM of an H100 busy, as at B 64 H 128).

us per round (one `--round-bytes` hand-off per CTA and direction) is the median over CTAs of the
kernel's own %globaltimer span divided by the rounds; GB/s = round bytes / that.

    python benchmarks/dsmem_bandwidth.py --out benchmarks/results/dsmem_bandwidth-h100.csv
    python benchmarks/dsmem_bandwidth.py --modes ping ping-under-copies --chunks 1024   # a release's latency

Exit status: 0 done; 2 bad arguments or no CuPy / Hopper GPU.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.csv_out import write_rows  # noqa: E402

SOURCE = Path(__file__).with_suffix(".cu")
MODES = {"both": 0, "one-way": 1, "local": 2, "st-async-lines": 3, "st-async-halves": 4, "ping": 5,
         "ping-under-copies": 6}
PING = ("ping", "ping-under-copies")  # the dsmem_ping kernel: remote arrivals, with mode both's copies or without
ST_ASYNC = ("st-async-lines", "st-async-halves")  # 16-byte stores by all 128 threads: no chunk size
THREADS = 128
TILE_HALF_BYTES = 32 * 9 * 128  # the crossover's rows per tile and direction (32 rows x 9 chunks of 128 B)
WARPS = 4


def check(args: argparse.Namespace) -> str | None:
    """What is wrong with the options, or None."""
    if args.pings < 1:
        return "--pings must be >= 1"
    if args.rounds < 4 or args.round_bytes < 16 or 2 * args.round_bytes + 64 > 227 * 1024:
        return "--rounds must be >= 4 and --round-bytes from 16 to 116,192 (two buffers in 227 KB of shared memory)"
    for c in args.chunks:
        if c < 16 or c % 16 or (args.round_bytes // WARPS) % c or args.round_bytes % WARPS:
            return (f"--chunks {c}: each of the {WARPS} warps copies round_bytes / {WARPS} = "
                    f"{args.round_bytes / WARPS:g} B in whole copies of a multiple of 16 B")
    if any(m in ST_ASYNC for m in args.modes) and args.round_bytes % (2 * THREADS * 16):
        return (f"--round-bytes {args.round_bytes}: the st-async modes store 16 B per thread, {THREADS} threads, in "
                f"pairs: a multiple of {2 * THREADS * 16:,}")
    if any(n < 1 for n in args.clusters) or any(m not in MODES for m in args.modes):
        return f"--clusters must be >= 1 and --modes among {', '.join(MODES)}"
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modes", nargs="+", default=list(MODES), help=f"of {', '.join(MODES)} (default all)")
    ap.add_argument("--chunks", type=int, nargs="+", default=[1024, 9216], help="bytes per bulk copy (default 1024 9216)")
    ap.add_argument("--clusters", type=int, nargs="+", default=[1, 66], help="clusters of two CTAs (default 1 66)")
    ap.add_argument("--round-bytes", type=int, default=TILE_HALF_BYTES,
                    help=f"bytes per CTA and direction per round (default {TILE_HALF_BYTES:,}: a tile's half)")
    ap.add_argument("--rounds", type=int, default=400, help="hand-offs per launch (default 400)")
    ap.add_argument("--launches", type=int, default=5, help="launches per case, the median kept (default 5)")
    ap.add_argument("--pings", type=int, default=100,
                    help="remote-arrival round trips per launch in the ping modes (default 100; the copies of "
                         "ping-under-copies run --rounds rounds, long enough to outlast them)")
    ap.add_argument("--out", type=Path, default=Path("dsmem_bandwidth.csv"))
    args = ap.parse_args(argv)
    bad = check(args)
    if bad:
        print(bad, file=sys.stderr)
        return 2
    try:
        import cupy as cp
        import numpy as np
    except ImportError:
        print("needs CuPy and a Hopper GPU", file=sys.stderr)
        return 2
    from cupy_kernels._build import build_cubin

    cubin = build_cubin(SOURCE, ("-cubin", "-O3", "-std=c++17", "-gencode", "arch=compute_90a,code=sm_90a"),
                        "dsmem_bandwidth")
    module = cp.RawModule(path=str(cubin))
    kern, ping = module.get_function("dsmem_copy"), module.get_function("dsmem_ping")
    smem = 2 * args.round_bytes + 64  # two buffers, then 5 mbarriers
    kern.max_dynamic_shared_size_bytes = smem
    ping.max_dynamic_shared_size_bytes = smem
    name = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    rows = []
    for clusters in args.clusters:
        ns = cp.zeros(2 * clusters, cp.uint64)
        for mode in args.modes:
            if mode in PING:
                rows.append(_ping_row(cp, np, ping, name, mode, clusters, ns, smem, args))
                print(" ".join(f"{k}={v}" for k, v in rows[-1].items()), flush=True)
                continue
            for chunk in ([16] if mode in ST_ASYNC else args.chunks):
                spans = []
                for _ in range(args.launches):
                    kern((2 * clusters,), (THREADS,), (np.int32(args.rounds), np.int32(chunk), np.int32(args.round_bytes),
                                                   np.int32(MODES[mode]), ns), shared_mem=smem)
                    cp.cuda.Device().synchronize()
                    spans.append(statistics.median(int(v) for v in ns.get()))
                us = statistics.median(spans) / args.rounds / 1e3
                row = dict(gpu=name, mode=mode, clusters=clusters, chunk_bytes=chunk, round_bytes=args.round_bytes,
                           us_per_round=round(us, 4), gb_s_per_cta_direction=round(args.round_bytes / us / 1e3, 2))
                rows.append(row)
                print(" ".join(f"{k}={v}" for k, v in row.items()), flush=True)
    write_rows(args.out, rows)
    return 0


def _ping_row(cp, np, ping, name: str, mode: str, clusters: int, ns, smem: int, args: argparse.Namespace) -> dict:
    """One ping mode: the median over launches of rank 0's span (the even CTAs'), per round trip."""
    spans = []
    for _ in range(args.launches):
        ns.fill(0)
        ping((2 * clusters,), (THREADS + 32,), (np.int32(args.pings), np.int32(mode == "ping-under-copies"),
                                                np.int32(args.rounds), np.int32(args.chunks[0]),
                                                np.int32(args.round_bytes), ns), shared_mem=smem)
        cp.cuda.Device().synchronize()
        spans.append(statistics.median(int(v) for v in ns.get()[0::2]))
    rt = statistics.median(spans) / args.pings / 1e3
    return dict(gpu=name, mode=mode, clusters=clusters, chunk_bytes=args.chunks[0] if mode != "ping" else "",
                round_bytes=args.round_bytes if mode != "ping" else "", round_trip_us=round(rt, 4),
                one_way_us=round(rt / 2, 4))


if __name__ == "__main__":
    sys.exit(main())
