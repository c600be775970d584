"""Trace reader speed: decode every stream of a trace, against np.load of the same streams as
raw int32 .npy files (the uncompressed peer), in the same run.

    python benchmarks/trace_reader.py [TRACE ...]      (default: the bundled synthetic traces)
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from simulator.trace import open_trace

ROOT = Path(__file__).resolve().parents[1]


def best_of(fn, repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def bench(path: Path) -> dict:
    trace = open_trace(path)
    streams = list(trace)
    accesses = sum(s.accesses for s in streams)

    def read_hst():
        for key in open_trace(path).keys:
            trace.read(key)

    with tempfile.TemporaryDirectory() as tmp:
        files = []
        for i, s in enumerate(streams):
            f = Path(tmp) / f"{i}.npy"
            np.save(f, s.indices)
            files.append(f)
        raw_bytes = sum(os.path.getsize(f) for f in files)

        def read_npy():
            for f in files:
                np.load(f)

        read_hst()  # warm: numba cache load, page cache
        read_npy()
        t_hst, t_npy = best_of(read_hst), best_of(read_npy)
    return {"trace": path.name, "streams": len(streams), "accesses": accesses,
            "bytes_per_access": trace.file_bytes / accesses, "npy_bytes_per_access": raw_bytes / accesses,
            "streams_s": len(streams) / t_hst, "accesses_s": accesses / t_hst,
            "npy_accesses_s": accesses / t_npy, "ratio": t_hst / t_npy}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("traces", nargs="*", type=Path, default=sorted((ROOT / "traces").glob("synthetic-*.hst")))
    args = parser.parse_args()
    print("| trace | streams | accesses | B/access (.hst) | B/access (.npy) | streams/s | M accesses/s "
          "| np.load M accesses/s | .hst time / np.load time |")
    print("|---|---|---|---|---|---|---|---|---|")
    for path in args.traces:
        r = bench(path)
        print(f"| {r['trace']} | {r['streams']} | {r['accesses']:,} | {r['bytes_per_access']:.3f} "
              f"| {r['npy_bytes_per_access']:.2f} | {r['streams_s']:.0f} | {r['accesses_s'] / 1e6:.0f} "
              f"| {r['npy_accesses_s'] / 1e6:.0f} | {r['ratio']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
