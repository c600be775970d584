"""Time DeepGEMM's FP8 GEMM, the kernel SGLang runs for a DSA model's block-FP8 linears on Hopper, against
`torch._scaled_mm`, the stand-in the cost model's fitted FP8 GEMM term was timed with, at decode rows.

Usage (on one H100 / H200, with SGLang's pinned DeepGEMM installed: sgl-deep-gemm 0.1.3 + apache-tvm-ffi 0.1.9,
the wheels `benchmarks/prefill_session.sh prepare` fetches):
  python benchmarks/deepgemm_decode_linears.py [--rows 1 4 16 64 256] [--out CSV]

Why: SGLang's block-FP8 linear on SM90 goes to DeepGEMM first (`layers/quantization/fp8_utils.py`
`_dispatch_auto_backend`: `deep_gemm_wrapper.ENABLE_JIT_DEEPGEMM`, on by default on SM90) with a float32 scale per
token x 128 K of the activations and per 128 x 128 block of the weights. The model prices those GEMMs at decode from
a fit of `torch._scaled_mm` (cuBLASLt, one tensor-wise scale, rows padded to 16: `calibration/op_kernels.py`) timed
on the H200. Both are timed here in one process on the same inputs' shapes, so their ratio per shape and row count
carries the fit over to SGLang's kernel.

What runs: every (N, K) of an FP8 linear in the shipped validation sets' decode passes (`SHAPES`: attention
projections, indexer projections, shared experts and dense MLPs of GLM-5.x and DeepSeek-V3.2 under DP or TP 8
attention), at each row count M. DeepGEMM: A [M, K] e4m3 with A's scales in its MN-major TMA-aligned layout, B [N,
K] e4m3 with 128 x 128 block scales, D [M, N] bf16, `fp8_gemm_nt`; torch: A padded to 16 rows, one scale each, as
the calibration runs it. The weights rotate over copies whose sum is at least twice the GPU's L2 (a decode step
reads each layer's weights once); one CUDA graph of one launch per copy, replayed, the median over replays divided
by the copies. Check: DeepGEMM's output against a float32 reference of the same dequantised product, relative error
<= REL_TOL.

Exit status: 0, every check passed; 1, a check or a launch failed (the CSV holds what was timed); 2, bad arguments,
or no PyTorch / Hopper GPU / deep_gemm.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.csv_out import row_stream  # noqa: E402
from benchmarks.fetched_build import (  # noqa: E402
    DEEP_GEMM_BLOCK as BLOCK,
)
from benchmarks.fetched_build import (
    UsageError,
    deep_gemm_sfa_layout,
    hopper_deep_gemm,
)
from benchmarks.fetched_build import block_fp8_reference as reference  # noqa: E402
from cupy_kernels.timing import l2_cold_sets, time_calls_torch, torch_graph  # noqa: E402

REL_TOL = 2e-2
# (N, K) of every FP8 linear in a decode pass of the shipped Hopper validation sets (tests check the list against
# the cost model's ops): GLM-5.x and DeepSeek-V3.2, DP attention (whole projections) and TP 8 (split ones)
SHAPES: tuple[tuple[int, int], ...] = (
    (128, 4096), (128, 6144), (128, 7168), (512, 6144), (1024, 4096), (1600, 4096), (2048, 2048), (2112, 7168),
    (2624, 6144), (3072, 6144), (4096, 512), (4096, 2048), (4096, 6144), (4096, 7168), (4096, 8192), (4608, 7168),
    (6144, 256), (6144, 1536), (6144, 2048), (6144, 16384), (7168, 2048), (7168, 2304), (7168, 16384), (8192, 1024),
    (8192, 1536), (16384, 2048), (24576, 1536),
)


def pad16(m: int) -> int:
    """The rows `torch._scaled_mm` runs (the calibration pads to a multiple of 16)."""
    return max(16, math.ceil(m / 16) * 16)


def per_launch_us(torch: Any, launch: Any, copies: int, reps: int) -> float:
    """Median us of one launch: a CUDA graph of ``copies`` launches (one per weight copy), replayed."""
    graph, _ = torch_graph(torch, launch, copies)
    times = time_calls_torch(torch, graph.replay, reps, warmup=2)
    del graph
    return float(np.median(times)) * 1e6 / copies


def time_rows(torch: Any, dg: Any, gen: Any, b: list[Any], b_sf: list[Any], m: int, reps: int) -> dict[str, Any]:
    """One row count: DeepGEMM's launch checked against the reference, then both kernels timed over the copies."""
    dev, fp8 = b[0].device, torch.float8_e4m3fn
    (n, k), copies = b[0].shape, len(b)
    a = (torch.randn((m, k), generator=gen, device=dev) * 0.5).to(fp8)
    a_sf = torch.rand((m, k // BLOCK), generator=gen, device=dev) * 0.01 + 0.001
    a_sf_k = deep_gemm_sfa_layout(dg, a_sf)
    d = torch.empty((m, n), dtype=torch.bfloat16, device=dev)
    dg.fp8_gemm_nt((a, a_sf_k), (b[0], b_sf[0]), d, disable_ue8m0_cast=True)
    torch.cuda.synchronize()
    ref = reference(a, a_sf, b[0], b_sf[0])
    got = d.float()
    rel = float(torch.linalg.norm(got - ref) / torch.linalg.norm(ref)) if torch.isfinite(got).all() else math.inf
    deep = per_launch_us(torch, lambda i: dg.fp8_gemm_nt((a, a_sf_k), (b[i], b_sf[i]), d, disable_ue8m0_cast=True),
                         copies, reps)
    ap = (torch.randn((pad16(m), k), generator=gen, device=dev) * 0.5).to(fp8)
    dt = torch.empty((pad16(m), n), dtype=torch.bfloat16, device=dev)
    one = torch.ones((), device=dev, dtype=torch.float32)
    cub = per_launch_us(torch, lambda i: torch._scaled_mm(ap, b[i].t(), scale_a=one, scale_b=one,
                                                          out_dtype=torch.bfloat16, out=dt), copies, reps)
    return {"n": n, "k": k, "m": m, "copies": copies, "deepgemm_us": round(deep, 2), "scaled_mm_us": round(cub, 2),
            "ratio": round(deep / cub, 4), "deepgemm_weight_gbps": round(n * k / (deep * 1e-6) / 1e9),
            "rel_err": f"{rel:.2e}"}


def run_shape(torch: Any, dg: Any, n: int, k: int, rows: Sequence[int], args: argparse.Namespace,
              l2_bytes: int) -> list[dict[str, Any]]:
    """Every row count of one (N, K), on ``l2_cold_sets`` copies of the weights."""
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(args.seed)
    copies = l2_cold_sets(n * k, l2_bytes, cap=args.max_copies)
    b = [(torch.randn((n, k), generator=gen, device=dev) * 0.5).to(torch.float8_e4m3fn) for _ in range(copies)]
    b_sf = [torch.rand((math.ceil(n / BLOCK), k // BLOCK), generator=gen, device=dev) * 0.01 + 0.001
            for _ in range(copies)]
    return [time_rows(torch, dg, gen, b, b_sf, m, args.reps) for m in rows]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16, 64, 256],
                    help="decode rows M (tokens of the rank's pass)")
    ap.add_argument("--shapes", nargs="+", default=None, metavar="NxK",
                    help="only these (N, K) (default: every shape of SHAPES)")
    ap.add_argument("--reps", type=int, default=15, help="graph replays timed per point")
    ap.add_argument("--max-copies", type=int, default=64, help="most weight copies rotated")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/deepgemm_decode_linears.csv"))
    args = ap.parse_args(argv)
    if any(m < 1 for m in args.rows):
        raise UsageError(f"--rows must each be >= 1, got {args.rows}")
    if args.reps < 1 or args.max_copies < 1:
        raise UsageError("--reps and --max-copies must be >= 1")
    if args.shapes is None:
        args.shape_list = list(SHAPES)
    else:
        try:
            args.shape_list = [tuple(int(x) for x in s.lower().split("x")) for s in args.shapes]
        except ValueError:
            raise UsageError(f"--shapes: each must be NxK (e.g. 6144x16384), got {args.shapes}") from None
        if any(len(s) != 2 or s[0] < 1 or s[1] < BLOCK or s[1] % BLOCK for s in args.shape_list):
            raise UsageError(f"--shapes: N >= 1 and K a multiple of {BLOCK}, got {args.shapes}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parse_args(argv)
        torch, dg = hopper_deep_gemm()
    except UsageError as exc:
        print(f"deepgemm_decode_linears: {exc}", file=sys.stderr)
        return 2
    props = torch.cuda.get_device_properties(0)
    l2 = int(getattr(props, "L2_cache_size", 50 << 20))
    print(f"{props.name} ({props.multi_processor_count} SMs, L2 {l2 >> 20} MB); deep_gemm "
          f"{getattr(dg, '__version__', '?')}; torch {torch.__version__}", flush=True)
    failed, bad = "", 0
    with row_stream(args.out) as put:
        for n, k in args.shape_list:
            try:
                rows = run_shape(torch, dg, n, k, args.rows, args, l2)
            except Exception as exc:  # a launch or CUDA error: keep what was measured, say where it stopped
                failed = f"N {n} K {k}: {type(exc).__name__}: {str(exc)[:400]}"
                print(f"deepgemm_decode_linears: stopped at {failed}", file=sys.stderr, flush=True)
                break
            for r in rows:
                r = {"device": props.name, **r}
                put(r)
                ok = float(r["rel_err"]) <= REL_TOL
                bad += not ok
                print(f"N {n} K {k} M {r['m']}: DeepGEMM {r['deepgemm_us']} us, _scaled_mm {r['scaled_mm_us']} us, "
                      f"ratio {r['ratio']}, rel err {r['rel_err']}{'' if ok else ' > ' + str(REL_TOL)}", flush=True)
    return 1 if failed or bad else 0


if __name__ == "__main__":
    sys.exit(main())
