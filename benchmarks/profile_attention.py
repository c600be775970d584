"""One launch of each sparse-attention kernel variant on one shape, for a profiler to read counters.

Usage (on the H200):
    ncu --clock-control none -k regex:mla_decode --metrics METRICS python benchmarks/profile_attention.py

Each variant and KV layout runs once on the benchmark's inputs (benchmarks/sparse_attention.py:
k = 2048, every slot live), in the order variant-major, so the profiler's report lists them in that
order.  Without a profiler it just checks that every variant runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.sparse_attention import make_sets  # noqa: E402
from cupy_kernels.mla_reference import D_QK  # noqa: E402
from cupy_kernels.sparse_attention import (  # noqa: E402
    HEADS_PER_CTA,
    NARROW_VARIANTS,
    WIDE_VARIANTS,
    sparse_mla_decode,
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64, help="requests (default 64)")
    ap.add_argument("--heads", type=int, default=128,
                    help="query heads (default 128); a multiple of 64 runs the wide variants, else the narrow ones")
    ap.add_argument("--kv-dtypes", nargs="+", default=["bf16", "fp8"], help="KV layouts (default both)")
    ap.add_argument("--variants", nargs="+", choices=list(WIDE_VARIANTS) + list(NARROW_VARIANTS),
                    help="variants to run (default: all of the kernel that --heads selects)")
    args = ap.parse_args(argv)
    wide = args.heads % HEADS_PER_CTA == 0
    variants = args.variants or list(WIDE_VARIANTS if wide else NARROW_VARIANTS)
    if any((v in WIDE_VARIANTS) != wide for v in variants):
        ap.error(f"--variants {' '.join(variants)}: H={args.heads} runs the {'wide' if wide else 'narrow'} kernel")
    import cupy as cp

    for kv_dtype in args.kv_dtypes:
        pool, sets = make_sets(cp, args.batch, args.heads, kv_dtype, 1)
        q, slots, out, lse, ws = sets[0]
        cp.cuda.Device().synchronize()
        for variant in variants:
            sparse_mla_decode(q, pool, slots, D_QK**-0.5, kv_dtype, out=out, lse=lse, workspace=ws,
                              variant=variant if wide else None, narrow_variant=None if wide else variant)
            cp.cuda.Device().synchronize()
            print(f"ran {variant} {kv_dtype} B={args.batch} H={args.heads}", flush=True)
        del pool, sets
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
