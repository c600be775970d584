"""Time FlashAttention-3's sparse MLA decode as SGLang's ``fa3`` NSA backend calls it, at SGLang's shapes.

Usage (on one H100 / H200; FA3's source fetched first, nothing of it is committed here):
  bash benchmarks/fetch_fa3.sh .fa3-src
  MAX_JOBS=8 python benchmarks/fa3_sparse_decode.py --fa3 .fa3-src [--shapes 96x8p6 12x64 ...]
      [--overlaps 0.7 0.9] [--check 6x8p6 12x64] [--reps N] [--rounds N] [--sets N] [--out CSV]

What SGLang runs (sgl-project/sglang ``nsa_backend.py`` ``_forward_fa3``, the default decode backend with
a BF16 KV cache on Hopper, also for target verify and draft extend): ``flash_attn_with_kvcache(q=q_rope
[tokens, heads, 64], k_cache=kv[:, :, 512:] viewed [N, 1, 1, 64], v_cache=kv[:, :, :512] viewed
[N, 1, 1, 512], qv=q_nope [tokens, heads, 512], page_table=<the top-k, one row per query token>,
cache_seqlens=<2,048 per token>, cu_seqlens_q=arange(tokens + 1), cu_seqlens_k_new=cumsum(cache_seqlens),
max_seqlen_q=1, softmax_scale, causal=True, softcap=0.0, num_splits=0)``: every query token is its own
varlen "sequence" with its own page-table row over a page-size-1 cache (K and V are two strided views of
one [N, 1, 576] bf16 pool). This script makes exactly that call through FA3's own Python interface
(``hopper/flash_attn_interface.py`` of the fetched copy, unchanged).

Build: FA3's host API (``hopper/flash_api_stable.cpp``: argument checks, the split / PackGQA / paged-TMA
heuristics, scheduler metadata, combine dispatch) and ``flash_prepare_scheduler.cu`` compiled as they are,
with FA3's own nvcc flags (hopper/setup.py) and its FLASHATTENTION_DISABLE_* switches for everything the
call does not use (FEATURE_FLAGS), plus our two instantiation units (benchmarks/fa3_shim_fwd.cu,
fa3_shim_combine.cu) in place of FA3's generated ones: the one forward kernel the call reaches (bf16,
hdim 64 / hdim_v 512, qv, varlen, paged KV without TMA, split, not causal: FA3 drops causal at
max_seqlen_q 1) and the bf16 / 512 combine; every other combination FA3's dispatcher names raises an
error. torch.utils.cpp_extension.load for sm_90a; MAX_JOBS compiles the four units in parallel. The
library is loaded as ``flash_attn_3._C``, the module FA3's interface imports.

Inputs per shape ROWSxHEADS[pP] (ROWS query tokens, HEADS query heads per rank, P positions per request:
an EAGLE verify of P draft tokens, request-major as SGLang lays them out): one bf16 pool of standard
normal rows, at least --cache-rows (500K) and as many as the shapes' regions need; --sets input sets
(q_rope, q_nope, page table) rotated per timed sample. Every request of every set draws its top-k from
its own --region rows (a request's context: 8,192 rows, the cookbook cells' 8K-in + 1K-out requests), the
regions disjoint, so no two requests share a row and no call finds a previous call's rows in L2 (as a
model's next layer reads another layer's pool). Page-table rows are --topk distinct random rows of the
region; with --overlaps F (shapes with P > 1 only), position j + 1 of a request keeps round(F k) of
position j's rows and adds fresh ones (adjacent-position overlap F, the statistic ``hisparse trace info``
calls overlap_mean for adjacent decode steps: 0.70 in the glm51-longbench trace), so a request's
positions share rows that can hit in L2.

Check (shapes named by --check, overlap 0, input set 0): out and lse against the float64 reference
(cupy_kernels/mla_reference.mla_decode_reference, q = [q_nope | q_rope], rows = [c_kv | k_rope]),
||out - ref|| / ||ref|| <= REL_TOL and max |lse - ref| <= LSE_TOL; after the timed runs set 0's output
is compared with the checked one (repeat_bit_identical: reported, not required).
Timing: CUDA events around one call per input set, warm-up first, median per call; as plain launches
(the whole Python call: interface, allocations, three kernels) and as a CUDA graph of those calls
replayed (what SGLang's CUDA-graph decode runs: FA3's prepare-scheduler, forward and combine kernels);
the two modes alternate over --rounds. The kernels' own times come from torch.profiler over plain calls
(prepare_us, main_us, combine_us). splits = FA3's split upper bound (out_accum's first dimension).
bytes = rows x k x 1,152 B gathered (576 bf16 per row: K rope 64 + V 512), unique_bytes = distinct rows
of a set x 1,152 B.

Exit status: 0, all checks passed; 1, a check or the build failed (the CSV holds what was measured);
2, bad arguments, missing pieces of DIR, or no PyTorch / Hopper GPU.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.fetched_build import (  # noqa: E402
    UsageError,
    hopper_torch,
    max_abs,
    missing_files,
    read_fetched,
    rel_err,
)
from cupy_kernels.mla_reference import D_LATENT, D_ROPE, mla_decode_reference  # noqa: E402
from cupy_kernels.timing import time_calls_torch  # noqa: E402

# The pins of benchmarks/fetch_fa3.sh (tests/test_fa3_sparse_decode.py holds the two to each other).
FA3_COMMIT = "0251105a2fb19d2957484b7f023cd8c115286ced"  # Dao-AILab/flash-attention main, 2026-08-15
CUTLASS_COMMIT = "7127592069c2fe01b041e174ba4345ef9b279671"  # its csrc/cutlass submodule there

FA3_SOURCES = ("hopper/flash_api_stable.cpp", "hopper/flash_prepare_scheduler.cu")  # FA3's, compiled as is
HERE = Path(__file__).resolve().parent
SHIMS = (HERE / "fa3_shim_fwd.cu", HERE / "fa3_shim_combine.cu")  # our instantiation units
HEADERS = (  # what the build and the interface need besides FA3_SOURCES (a sample of each tree)
    "hopper/flash_attn_interface.py",
    "hopper/flash.h",
    "hopper/flash_fwd_launch_template.h",
    "hopper/flash_fwd_combine_launch_template.h",
    "hopper/mainloop_fwd_sm90_tma_gmma_ws.hpp",
    "hopper/paged_kv.h",
    "hopper/tile_size.h",
    "hopper/heuristics.h",
    "hopper/static_switch.h",
    "csrc/cutlass/include/cute/tensor.hpp",
    "csrc/cutlass/include/cutlass/cutlass.h",
)
INCLUDE_DIRS = ("hopper", "csrc/cutlass/include")  # as hopper/setup.py
DISABLED = ("BACKWARD", "FP16", "FP8", "HDIM96", "HDIM128", "HDIM192", "HDIM256", "SOFTCAP", "LOCAL",
            "APPENDKV", "CLUSTER", "SM8x", "HDIMDIFF192")  # FA3's switches for what the call does not use
FEATURE_FLAGS = tuple(f"-DFLASHATTENTION_DISABLE_{d}" for d in DISABLED)
# hopper/setup.py's nvcc flags (less --threads: one gencode target here) and its -gencode, which
# TORCH_CUDA_ARCH_LIST=9.0a gives; its C++ flags for flash_api_stable.cpp with torch >= 2.9.
NVCC_FLAGS = ("-O3", "-std=c++17", "--ftemplate-backtrace-limit=0", "--use_fast_math", "--resource-usage",
              "-lineinfo", "-DCUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED", "-DCUTLASS_ENABLE_GDC_FOR_SM90",
              "-DCUTLASS_DEBUG_TRACE_LEVEL=0", "-DNDEBUG", *FEATURE_FLAGS)
CXX_FLAGS = ("-O3", "-std=c++17", "-DPy_LIMITED_API=0x03090000", "-DTORCH_TARGET_VERSION=0x0209000000000000",
             *FEATURE_FLAGS)
ARCH_LIST = "9.0a"
EXTENSION_NAME = "_C"  # FA3's interface imports flash_attn_3._C
PACKAGE = "flash_attn_3"

ROW_BYTES = (D_LATENT + D_ROPE) * 2  # one bf16 pool row: V (c_kv) 512 + K rope 64
SOFTMAX_SCALE = 192**-0.5  # DeepSeek-V3.2 / GLM-5's (qk_nope 128 + qk_rope 64)^-0.5; any value times the same
REL_TOL = 1e-2  # tests/test_sparse_attention_gpu.py REL_TOL (bf16 rows against the float64 reference)
LSE_TOL = 1e-2  # natural-log units
DEFAULT_SHAPES = (  # the four cells' shapes first, then sweeps for interpolation
    # TP8 (8 heads per rank): the low-latency cell's EAGLE verify of 6 positions at c16 and c1;
    # DP attention (64 heads per rank): the high-throughput decode (12 per rank), the balanced verify
    # of 2 positions at c256 (32 requests per rank)
    "96x8p6", "6x8p6", "12x64", "64x64p2",
    "1x8", "12x8p6", "24x8p6", "48x8p6", "192x8p6",
    "1x64", "4x64", "8x64", "16x64", "24x64", "32x64p2", "48x64", "128x64p2",
)
SHAPE_RE = re.compile(r"^(\d+)x(\d+)(?:p(\d+))?$")


class Shape(NamedTuple):
    rows: int  # query tokens (FA3 "sequences" of one query each)
    heads: int  # query heads on the rank
    positions: int  # query tokens per request (1: decode; P: a verify of P positions)

    @property
    def name(self) -> str:
        return f"{self.rows}x{self.heads}" + (f"p{self.positions}" if self.positions > 1 else "")

    @property
    def requests(self) -> int:
        return self.rows // self.positions


def parse_shape(text: str) -> Shape:
    """'ROWSxHEADS' or 'ROWSxHEADSpP' -> Shape; ValueError on anything else."""
    m = SHAPE_RE.match(text.strip())
    if not m:
        raise ValueError(f"shape {text!r} is not ROWSxHEADS or ROWSxHEADSpP (e.g. 96x8p6)")
    rows, heads, pos = int(m.group(1)), int(m.group(2)), int(m.group(3) or 1)
    if rows < 1 or heads < 1 or pos < 1 or rows % pos:
        raise ValueError(f"shape {text!r}: rows, heads and positions must be >= 1 and rows a multiple of P")
    return Shape(rows, heads, pos)


def missing_pieces(src: Path) -> list[str]:
    """Paths of DIR the build needs that are absent (empty when DIR is complete)."""
    return missing_files(src, (*FA3_SOURCES, *HEADERS))


# --------------------------------------------------------------------------------------------
# Inputs (numpy, deterministic: CPU-testable)
# --------------------------------------------------------------------------------------------
def distinct_rows(rng: np.random.Generator, n: int, k: int, exclude: np.ndarray | None = None) -> np.ndarray:
    """k distinct ints in [0, n), none in ``exclude``, in random order."""
    if k + (0 if exclude is None else len(exclude)) > n:
        raise ValueError(f"cannot draw {k} distinct rows of {n} (excluding {0 if exclude is None else len(exclude)})")
    out = np.empty(0, dtype=np.int64)
    while len(out) < k:
        draw = rng.integers(0, n, size=2 * (k - len(out)) + 16)
        draw = draw[~np.isin(draw, out)]
        if exclude is not None:
            draw = draw[~np.isin(draw, exclude)]
        _, first = np.unique(draw, return_index=True)
        out = np.concatenate([out, draw[np.sort(first)]])
    return out[:k]


def page_table(rng: np.random.Generator, shape: Shape, k: int, region: int, overlap: float,
               first_region: int = 0) -> np.ndarray:
    """[rows, k] int32 pool rows, request-major; request b draws from its own ``region`` rows starting at
    row (first_region + b) x region (no two requests share a row). Overlap 0: every position its own
    random k. Overlap F: position j + 1 of a request keeps round(F k) of position j's rows (a random
    subset) and draws the rest fresh (none of position j's), shuffled."""
    if not 0.0 <= overlap < 1.0:
        raise ValueError(f"overlap must be in [0, 1), got {overlap}")
    keep = round(overlap * k)
    if region < 2 * k - keep:
        raise ValueError(f"a region of {region} rows cannot hold top-k {k} at overlap {overlap:g}")
    out = np.empty((shape.rows, k), dtype=np.int64)
    for r in range(shape.rows):
        if r % shape.positions == 0 or keep == 0:
            out[r] = distinct_rows(rng, region, k)
            continue
        prev = out[r - 1]
        kept = rng.choice(prev, size=keep, replace=False)
        row = np.concatenate([kept, distinct_rows(rng, region, k - keep, exclude=prev)])
        out[r] = row[rng.permutation(k)]
    base = (first_region + np.arange(shape.rows) // shape.positions) * region
    return (out + base[:, None]).astype(np.int32)


def adjacent_overlap(table: np.ndarray, positions: int) -> float:
    """Mean share of a position's rows its request's previous position also has (nan if P = 1)."""
    k = table.shape[1]
    shares = [len(np.intersect1d(table[r - 1], table[r])) / k
              for r in range(table.shape[0]) if r % positions]
    return float(np.mean(shares)) if shares else math.nan


class HostSet(NamedTuple):
    q_rope: np.ndarray  # [rows, H, 64] float32 (bf16-representable)
    q_nope: np.ndarray  # [rows, H, 512]
    table: np.ndarray  # [rows, k] int32


def bf16_round(x: np.ndarray) -> np.ndarray:
    """Round float32 values to the nearest bf16 (ties to even), as float32: exactly what the GPU holds."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return rounded.astype(np.uint32).view(np.float32)


def pool_rows_needed(shape: Shape, n_sets: int, region: int) -> int:
    """Pool rows the disjoint regions of every request of every input set take."""
    return n_sets * shape.requests * region


def make_sets(shape: Shape, k: int, region: int, overlap: float, n_sets: int, seed: int) -> list[HostSet]:
    """n_sets input sets; set s's requests take regions s R .. s R + R - 1 (R = requests): no two sets
    share a row, so a call finds none of the previous calls' rows in L2."""
    rng = np.random.default_rng(seed)
    sets = []
    for s in range(n_sets):
        q = bf16_round(rng.standard_normal((shape.rows, shape.heads, D_LATENT + D_ROPE), dtype=np.float32))
        sets.append(HostSet(np.ascontiguousarray(q[..., D_LATENT:]), np.ascontiguousarray(q[..., :D_LATENT]),
                            page_table(rng, shape, k, region, overlap, first_region=s * shape.requests)))
    return sets


def reference(host: HostSet, pool_rows: np.ndarray, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """Float64 out [rows, H, 512] and lse [rows, H] of one set; pool_rows [rows, k, 576] are the rows its
    page table names ([c_kv | k_rope]), q = [q_nope | q_rope] as mla_decode_reference lays them."""
    rows, k = host.table.shape
    q = np.concatenate([host.q_nope, host.q_rope], axis=-1).astype(np.float64)
    flat = pool_rows.reshape(rows * k, -1).astype(np.float64)
    return mla_decode_reference(q, flat, np.arange(rows * k).reshape(rows, k), scale)


# --------------------------------------------------------------------------------------------
# Build
# --------------------------------------------------------------------------------------------
def nvcc_major(cuda_home: str) -> int:
    import subprocess

    out = subprocess.run([os.path.join(cuda_home, "bin", "nvcc"), "--version"], capture_output=True, text=True).stdout
    m = re.search(r"release (\d+)\.", out)
    return int(m.group(1)) if m else 0


def build(src: Path, build_root: Path, verbose: bool) -> Any:
    """Compile FA3's host API + prepare-scheduler unit and our two instantiation units into
    build_root/flash_attn_3/_C.so, load it, and return FA3's interface module (the fetched copy's)."""
    from torch.utils.cpp_extension import CUDA_HOME, load

    os.environ["TORCH_CUDA_ARCH_LIST"] = ARCH_LIST
    if CUDA_HOME and nvcc_major(CUDA_HOME) >= 13:  # hopper/setup.py: CCCL's headers moved under include/cccl
        cccl = os.path.join(CUDA_HOME, "include", "cccl")
        for var in ("CPLUS_INCLUDE_PATH", "C_INCLUDE_PATH"):
            os.environ[var] = cccl + (":" + os.environ[var] if os.environ.get(var) else "")
    pkg = build_root / PACKAGE
    pkg.mkdir(parents=True, exist_ok=True)
    load(name=EXTENSION_NAME, sources=[str(src / p) for p in FA3_SOURCES] + [str(p) for p in SHIMS],
         extra_include_paths=[str((src / d).resolve()) for d in INCLUDE_DIRS], extra_cflags=list(CXX_FLAGS),
         extra_cuda_cflags=list(NVCC_FLAGS), build_directory=str(pkg), verbose=verbose, is_python_module=False)
    sys.path.insert(0, str(build_root))  # flash_attn_3 (a namespace package) holds _C.so
    sys.path.insert(0, str((src / "hopper").resolve()))
    import flash_attn_interface  # FA3's own; imports flash_attn_3._C

    return flash_attn_interface


# --------------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------------
KERNELS = {"prepare_us": "prepare_varlen", "main_us": "FlashAttnFwdSm90", "combine_us": "FlashAttnFwdCombine"}


def kernel_times(torch: Any, fn: Callable[[], None], calls_per_fn: int, iters: int = 5) -> dict[str, float]:
    """Mean device time per call of each FA3 kernel (torch.profiler over plain calls); nan if unreadable."""
    out = dict.fromkeys(KERNELS, math.nan)
    try:
        from torch.profiler import ProfilerActivity, profile

        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(iters):
                fn()
            torch.cuda.synchronize()
        for e in prof.key_averages():
            total = getattr(e, "self_device_time_total", None)
            if total is None:
                total = getattr(e, "self_cuda_time_total", 0.0)
            for col, needle in KERNELS.items():
                if needle in e.key and total:
                    out[col] = (0.0 if math.isnan(out[col]) else out[col]) + total / (iters * calls_per_fn)
    except Exception as exc:  # the profiler is a breakdown, not the measurement
        print(f"  (profiler: {type(exc).__name__}: {exc})", flush=True)
    return out


class Result(NamedTuple):
    shape: Shape
    overlap: float
    measured_overlap: float
    timing: str
    us: float
    us_p10: float
    us_p90: float
    kernels: dict[str, float]
    splits: int
    unique_rows: float
    rel: float
    lse_diff: float
    repeat_same: bool
    agree: bool


def run_shape(torch: Any, fa: Any, pool: Any, shape: Shape, overlap: float, check: bool,
              args: argparse.Namespace) -> list[Result]:
    t0 = time.perf_counter()
    dev = pool.device
    k = args.topk
    seed = args.seed + 1000 * shape.rows + 10 * shape.heads + round(100 * overlap)
    host = make_sets(shape, k, args.region, overlap, args.sets, seed)
    kc = pool[:, :, D_LATENT:].view(-1, 1, 1, D_ROPE)  # SGLang's k_rope_cache view
    vc = pool[:, :, :D_LATENT].view(-1, 1, 1, D_LATENT)  # c_kv_cache
    seqlens = torch.full((shape.rows,), k, dtype=torch.int32, device=dev)
    cu_q = torch.arange(shape.rows + 1, dtype=torch.int32, device=dev)
    cu_k = torch.arange(0, (shape.rows + 1) * k, k, dtype=torch.int32, device=dev)
    sets = [{"q": torch.from_numpy(h.q_rope).to(dev, torch.bfloat16), "qv": torch.from_numpy(h.q_nope).to(dev, torch.bfloat16),
             "pt": torch.from_numpy(h.table).to(dev)} for h in host]

    def call(st: dict, lse: bool = False) -> Any:
        return fa.flash_attn_with_kvcache(
            q=st["q"], k_cache=kc, v_cache=vc, qv=st["qv"], page_table=st["pt"], cache_seqlens=seqlens,
            cu_seqlens_q=cu_q, cu_seqlens_k_new=cu_k, max_seqlen_q=1, softmax_scale=SOFTMAX_SCALE, causal=True,
            softcap=0.0, return_softmax_lse=lse, num_splits=0)

    outs: list[Any] = [None] * len(sets)

    def run_all() -> None:
        for i, st in enumerate(sets):
            outs[i] = call(st)

    out0, lse0, out_accum, _ = call(sets[0], lse=True)
    torch.cuda.synchronize()
    splits = int(out_accum.shape[0]) if out_accum.numel() else 1
    rel = lse_diff = math.nan
    agree = True
    if check:
        rows = pool[sets[0]["pt"].long().reshape(-1), 0].float().cpu().numpy().reshape(shape.rows, k, -1)
        ref, ref_lse = reference(host[0], rows, SOFTMAX_SCALE)
        got = out0.float().cpu().numpy().astype(np.float64)
        got_lse = lse0.float().cpu().numpy().astype(np.float64).T  # FA3's varlen lse is [heads, total_q]
        rel, lse_diff = rel_err(got, ref), max_abs(got_lse, ref_lse)
        agree = rel <= REL_TOL and lse_diff <= LSE_TOL
    checked = out0.clone()
    measured = adjacent_overlap(host[0].table, shape.positions)
    unique = float(np.mean([len(np.unique(h.table)) for h in host]))
    prep = time.perf_counter() - t0

    modes: dict[str, Callable[[], None]] = {"plain": run_all}
    if not args.no_graph:
        try:
            run_all()
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                run_all()
            modes["graph"] = graph.replay
        except Exception as exc:  # capture unsupported: report, time plain calls only
            print(f"  ({shape.name}: no CUDA graph: {type(exc).__name__}: {exc})", flush=True)
    samples: dict[str, list[float]] = {m: [] for m in modes}
    for r in range(args.rounds):
        for mode in (list(modes) if r % 2 == 0 else list(modes)[::-1]):
            samples[mode] += [t / len(sets) for t in time_calls_torch(torch, modes[mode], args.reps, warmup=2)]
    torch.cuda.synchronize()
    kernels = kernel_times(torch, run_all, len(sets))
    again, _, _, _ = call(sets[0], lse=True)
    torch.cuda.synchronize()
    same = bool(torch.equal(again, checked))
    print(f"  {shape.name} overlap {overlap:g} (measured {measured:.3f}): splits {splits}, unique rows/set "
          f"{unique:.0f}, prep {prep:.1f} s" + (f"; out rel err {rel:.2e}, lse max diff {lse_diff:.2e}" if check else "")
          + f"; repeat bit-identical {same}", flush=True)
    results = []
    for mode, s in samples.items():
        q = np.quantile(np.asarray(s) * 1e6, [0.1, 0.5, 0.9])
        results.append(Result(shape, overlap, measured, mode, float(q[1]), float(q[0]), float(q[2]), kernels,
                              splits, unique, rel, lse_diff, same, agree))
    return results[::-1]  # graph first


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------
def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fa3", type=Path, required=True, help="the folder benchmarks/fetch_fa3.sh filled")
    ap.add_argument("--shapes", nargs="+", default=list(DEFAULT_SHAPES), help="ROWSxHEADS[pP], e.g. 96x8p6")
    ap.add_argument("--overlaps", type=float, nargs="*", default=[0.7, 0.9],
                    help="adjacent-position top-k overlaps run besides 0 on shapes with P > 1")
    ap.add_argument("--check", nargs="*", default=["6x8p6", "12x64"], help="shapes checked against the reference")
    ap.add_argument("--topk", type=int, default=2048)
    ap.add_argument("--region", type=int, default=8192,
                    help="rows of a request's own context its top-k is drawn from (the cookbook cells' 8K + 1K requests)")
    ap.add_argument("--cache-rows", type=int, default=500_000,
                    help="pool rows at least (more when the shapes' disjoint regions need more)")
    ap.add_argument("--reps", type=int, default=30, help="timed calls per mode and round")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--sets", type=int, default=8, help="rotating input sets (one call each per timed sample)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-graph", action="store_true", help="time plain calls only")
    ap.add_argument("--max-seconds", type=float, default=math.inf, help="stop starting new shapes after this")
    ap.add_argument("--build-dir", type=Path, default=Path("/tmp/hisparse-fa3-build"))
    ap.add_argument("--verbose-build", action="store_true", help="show the compiler's output (ptxas resource usage)")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/fa3_sparse_decode.csv"))
    args = ap.parse_args(argv)
    try:
        args.shapes = [parse_shape(s) for s in args.shapes]
        args.check = {parse_shape(s) for s in args.check}
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    for name in ("reps", "rounds", "sets", "topk", "cache_rows", "region"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if any(not 0.0 < f < 1.0 for f in args.overlaps):
        raise UsageError(f"--overlaps must each be in (0, 1), got {args.overlaps}")
    keep = round(max(args.overlaps, default=0.0) * args.topk)
    if args.region < 2 * args.topk - keep:
        raise UsageError(f"--region {args.region} must hold --topk {args.topk} and the fresh rows of the next "
                         f"position: at least {2 * args.topk - keep}")
    if not args.fa3.is_dir():
        raise UsageError(f"--fa3 {args.fa3}: no such folder (fill it with benchmarks/fetch_fa3.sh {args.fa3})")
    missing = missing_pieces(args.fa3)
    if missing:
        raise UsageError(f"--fa3 {args.fa3} lacks {len(missing)} file(s) the build needs, e.g. "
                         f"{', '.join(missing[:3])} (refill it with benchmarks/fetch_fa3.sh)")
    return args


def load_torch() -> Any:
    """torch on a Hopper GPU, else UsageError."""
    return hopper_torch("FA3")


CSV_COLUMNS = ("device", "rows", "heads", "positions", "requests", "topk", "region", "pool_rows", "overlap", "measured_overlap",
               "timing", "us", "us_p10", "us_p90", "prepare_us", "main_us", "combine_us", "splits", "bytes",
               "unique_bytes", "tb_s", "rel_err", "lse_max_diff", "repeat_bit_identical", "agree")


def write_csv(path: Path, device: str, args: argparse.Namespace, results: list[Result]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(CSV_COLUMNS)
        for r in results:
            s = r.shape
            gathered = s.rows * args.topk * ROW_BYTES
            w.writerow([device, s.rows, s.heads, s.positions, s.requests, args.topk, args.region, args.pool_rows,
                        f"{r.overlap:g}",
                        f"{r.measured_overlap:.3f}", r.timing, f"{r.us:.2f}", f"{r.us_p10:.2f}", f"{r.us_p90:.2f}",
                        *(f"{r.kernels[c]:.2f}" for c in KERNELS), r.splits, gathered,
                        f"{r.unique_rows * ROW_BYTES:.0f}", f"{gathered / r.us * 1e-6:.2f}", f"{r.rel:.2e}",
                        f"{r.lse_diff:.2e}", r.repeat_same, r.agree])


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parse_args(argv)
        torch = load_torch()
    except UsageError as exc:
        print(f"fa3_sparse_decode: {exc}", file=sys.stderr)
        return 2
    fetched = read_fetched(args.fa3)
    device = torch.cuda.get_device_name()
    print(f"{device}; torch {torch.__version__}; FA3 {fetched.get('flash-attention', '?')[:12]} CUTLASS "
          f"{fetched.get('cutlass', '?')[:12]} (pins {FA3_COMMIT[:12]} / {CUTLASS_COMMIT[:12]}); "
          f"MAX_JOBS={os.environ.get('MAX_JOBS', '-')}", flush=True)
    t0 = time.perf_counter()
    try:
        fa = build(args.fa3, args.build_dir, args.verbose_build)
    except Exception as exc:  # the compiler's own message, without a Python traceback
        print(f"fa3_sparse_decode: building FA3 failed: {str(exc)[-6000:]}", file=sys.stderr)
        return 1
    print(f"built FA3's sparse MLA decode path (4 units) in {time.perf_counter() - t0:.1f} s", flush=True)
    g = torch.Generator(device="cuda").manual_seed(args.seed)
    n_pool = max([args.cache_rows] + [pool_rows_needed(s, args.sets, args.region) for s in args.shapes])
    pool = torch.empty((n_pool, 1, D_LATENT + D_ROPE), dtype=torch.bfloat16, device="cuda")
    for i in range(0, n_pool, 1 << 20):  # standard normal values, in chunks (no fp32 copy of the whole pool)
        pool[i:i + (1 << 20)] = torch.randn(pool[i:i + (1 << 20)].shape, generator=g, device="cuda")
    args.pool_rows = n_pool
    print(f"pool: {n_pool} rows x {ROW_BYTES} B ({n_pool * ROW_BYTES / 1e9:.2f} GB)", flush=True)
    results: list[Result] = []
    failed = ""
    start = time.perf_counter()
    for shape in args.shapes:
        if time.perf_counter() - start > args.max_seconds:
            failed = f"--max-seconds {args.max_seconds:g} reached before {shape.name}"
            break
        for overlap in [0.0] + (list(args.overlaps) if shape.positions > 1 else []):
            try:
                results += run_shape(torch, fa, pool, shape, overlap, overlap == 0.0 and shape in args.check, args)
            except Exception as exc:  # a launch or CUDA error: keep what was measured, say where it stopped
                failed = f"{shape.name} overlap {overlap:g}: {type(exc).__name__}: {exc}"
                break
        if failed:
            break
    if failed:
        print(f"fa3_sparse_decode: stopped at {failed}", file=sys.stderr, flush=True)
    write_csv(args.out, device, args, results)
    print(f"\nwrote {args.out}\n")
    print(f"{device}, FA3 flash_attn_with_kvcache as SGLang's _forward_fa3 calls it; top-k {args.topk}, "
          f"{args.region}-row request contexts in a {args.pool_rows}-row pool; us per call (median; graph = CUDA-graph replay)")
    print("| shape | requests x positions | overlap | timing | us | prepare | main | combine | splits | TB/s | agree |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        s = r.shape
        print(f"| {s.rows} x {s.heads} heads | {s.requests} x {s.positions} | {r.overlap:g} | {r.timing} | {r.us:.1f} | "
              f"{r.kernels['prepare_us']:.1f} | {r.kernels['main_us']:.1f} | {r.kernels['combine_us']:.1f} | "
              f"{r.splits} | {s.rows * args.topk * ROW_BYTES / r.us * 1e-6:.2f} | {'yes' if r.agree else 'NO'} |")
    return 0 if results and not failed and all(r.agree for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
