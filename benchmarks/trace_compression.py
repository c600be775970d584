"""Size and inflate speed of a trace's coded steps under each candidate chunk compression, for
choosing the default (issue 30): zlib at the levels ``hisparse trace gen --compression`` offers
(6, 0 = stored), zlib 1 and 9, and zstd (the ``zstandard`` package, when installed) at 1, 3 and 19.

The coded steps are the payloads of an existing .hst file, inflated once; each candidate then
compresses all of them and decompresses them ``--repeats`` times in this process (the best run:
the least disturbed by other work on a shared machine). Output MB/s is of coded bytes produced.

    python benchmarks/trace_compression.py [traces/glm51-longbench.hst] [--repeats 5]
"""

from __future__ import annotations

import argparse
import sys
import time
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _best(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", nargs="?", default=str(ROOT / "traces" / "glm51-longbench.hst"))
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    from simulator.trace.format import TraceReader

    r = TraceReader(args.trace)
    raw = [bytes(c.coded()) for key in r.keys for c in r.coded_chunks(key)]
    total = sum(map(len, raw))
    accesses = r.accesses
    def zlib_at(level: int):
        return lambda b: zlib.compress(b, level)

    cands = [(f"zlib {lv}" + (" (stored)" if lv == 0 else " (default)" if lv == 6 else ""), zlib_at(lv),
              zlib.decompress) for lv in (0, 1, 6, 9)]
    try:
        import zstandard

        dctx = zstandard.ZstdDecompressor()
        for lv in (1, 3, 19):
            cctx = zstandard.ZstdCompressor(level=lv)
            cands.append((f"zstd {lv}", cctx.compress, dctx.decompress))
    except ImportError:
        print("zstandard not installed: zstd rows left out")
    print(f"{args.trace}: {len(raw)} chunks, {accesses:,} accesses, {total / 1e6:.1f} MB of coded steps "
          f"({total / accesses:.2f} B/access); best of {args.repeats}\n")
    print("| compression | MB on disk | B/access | x coded | compress MB/s | decompress MB/s (coded out) | "
          "decompress M accesses/s |")
    print("|---|---|---|---|---|---|---|")
    for name, comp, decomp in cands:
        t0 = time.perf_counter()
        packed = [comp(b) for b in raw]
        tc = time.perf_counter() - t0
        assert all(decomp(p) == b for p, b in zip(packed, raw, strict=True))
        td = _best(lambda d=decomp, p=packed: [d(x) for x in p], args.repeats)
        size = sum(map(len, packed))
        print(f"| {name} | {size / 1e6:.2f} | {size / accesses:.3f} | {size / total:.3f} | {total / tc / 1e6:.0f} | "
              f"{total / td / 1e6:.0f} | {accesses / td / 1e6:.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
