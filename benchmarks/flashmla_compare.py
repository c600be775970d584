"""Time our sparse MLA decode kernel against FlashMLA's SM90 sparse FP8 decode, same inputs, same run.

Usage (on one H100 / H200; FlashMLA's source fetched first, nothing of it is committed here):
  bash benchmarks/fetch_flashmla.sh .flashmla-src
  python benchmarks/flashmla_compare.py --flashmla .flashmla-src [--batches 64 128] [--heads 128 64]
      [--variants ws wsxr] [--topk 512 2048 ...] [--flashmla-sms N] [--reps N] [--clock-probe S] [--out CSV]

FlashMLA (the commit benchmarks/fetch_flashmla.sh pins, with CUTLASS's headers at FlashMLA's
submodule commit) is built with torch.utils.cpp_extension.load for sm_90a with the nvcc flags of
its setup.py (NVCC_FLAGS below), from only what its SM90 sparse FP8 decode needs: the V3.2 h64 /
h128 instantiations, the scheduler-metadata kernel and the combine kernel, bound through our own
shim (benchmarks/flashmla_shim.cpp, raw device pointers: CuPy owns every buffer).

Both kernels read the SAME device buffers: q bf16 [B, H, 576] (FlashMLA's [B, 1, H, 576]), one pool
of FP8 KV rows (656 B: 512 e4m3, 4 fp32 scales, 64 bf16 rope; FlashMLA's [N / 64, 64, 1, 656] view
of the same bytes, a token index t being row t), top-k 2048 int32 row indices per request
([B, 1, 2048] to FlashMLA), softmax scale 1/sqrt(576). Our row format is byte-identical to
FlashMLA's V3.2 FP8 layout (V32_ROW below, from flash_mla_interface.py's docstring, tests/quant.py
and the kernel's loads in csrc/sm90/decode/sparse_fp8/splitkv_mla.cuh; tests/test_flashmla_compare.py
holds cupy_kernels/mla_reference.pack_fp8_rows to it). The rows are pack_fp8_rows of random values
(--unique-rows of them, repeated over a pool of --sets x B x 4096 rows: each request's 2048 picks
come from its own 4096-row region, and --sets input sets rotate so L2 holds no previous call's rows).

Checks, per shape, on input set 0: both outputs poisoned first; each against the float64 CPU
reference (mla_decode_reference on the exactly dequantised rows) and against each other,
||a - b|| / ||b|| <= REL_TOL on out and max |a - b| <= LSE_TOL on lse; after the timed runs, set
0's outputs must be bit-identical to the checked ones.
Timing: CUDA events around one call per input set, warm-up first, median per call; both as plain
launches and as a CUDA graph of those calls replayed; the two kernels alternate over --rounds.
FlashMLA's time is its split-KV kernel + combine kernel per layer, its scheduler metadata computed
before (it depends only on B and top-k, so a model computes it once per decode step for all
layers); that kernel's own time (a graph replay of it) is the flashmla_meta_us column. FLOPs, the same for both (mla_reference
.attention_flops): 2 x B x H x k x (576 + 512), the tensor-core work of S = Q K^T and O = P V.
ratio = FlashMLA's time / ours (our speed as a fraction of FlashMLA's: > 1 means ours is faster).
--variants: our wide-kernel variants (cupy_kernels.sparse_attention.WIDE_VARIANTS) timed in the same
run, each one checked and timed against the same FlashMLA samples (default: "ws" and the FP8
default "wsxr"; a variant that cannot run a shape, a crossover at H 64, runs as ws and is reported as such).
--flashmla-sms N: FlashMLA's scheduler shares the work over N SMs (default: the device's); --topk K...:
the top-k values to time (multiples of 64, <= 4096); with two or more, the per-tile time and the fixed
cost of each kernel are fitted and printed (tile_fits). --clock-probe S: after the timing, each kernel
runs back to back for S seconds while nvidia-smi samples the SM clock, power and clock-event reasons
(cupy_kernels/clock_probe.py); written to <out>-clocks.csv: a time gap split into cycles and clock.

Exit status: 0, all checks passed; 1, a check failed (the CSV is still written); 2, bad arguments,
missing pieces of DIR, or no PyTorch / CuPy / Hopper GPU.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import os
import statistics
import subprocess
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
from cupy_kernels.clock_probe import Sustained, sustained  # noqa: E402
from cupy_kernels.mla_reference import (  # noqa: E402
    D_LATENT,
    D_QK,
    FP8_ROW_BYTES,
    attention_flops,
    bf16_to_float,
    float_to_bf16,
    mla_decode_reference,
    pack_fp8_rows,
    unpack_fp8_rows,
)
from cupy_kernels.timing import time_calls  # noqa: E402

# The pins of benchmarks/fetch_flashmla.sh (tests/test_flashmla_compare.py holds the two to each other).
FLASHMLA_COMMIT = "9241ae3ef9bac614dd25e45e507e089f888280e0"  # FlashMLA main, 2026-04-29
CUTLASS_COMMIT = "147f5673d0c1c3dcf66f78d677fd647e4a020219"  # FlashMLA's csrc/cutlass submodule there

KERNEL_SOURCES = (  # FlashMLA's translation units we compile (paths inside DIR)
    "csrc/sm90/decode/sparse_fp8/instantiations/v32_persistent_h128.cu",
    "csrc/sm90/decode/sparse_fp8/instantiations/v32_persistent_h64.cu",
    "csrc/smxx/decode/get_decoding_sched_meta/get_decoding_sched_meta.cu",
    "csrc/smxx/decode/combine/combine.cu",
)
HEADERS = (  # headers the shim and those units include (a sample of each tree, checked up front)
    "csrc/params.h",
    "csrc/defines.h",
    "csrc/utils.h",
    "csrc/sm90/decode/sparse_fp8/splitkv_mla.h",
    "csrc/sm90/decode/sparse_fp8/splitkv_mla.cuh",
    "csrc/sm90/decode/sparse_fp8/config.h",
    "csrc/sm90/decode/sparse_fp8/components/dequant.h",
    "csrc/smxx/decode/combine/combine.h",
    "csrc/smxx/decode/get_decoding_sched_meta/get_decoding_sched_meta.h",
    "csrc/kerutils/include/kerutils/kerutils.cuh",
    "csrc/cutlass/include/cute/tensor.hpp",
    "csrc/cutlass/include/cutlass/cutlass.h",
    "csrc/cutlass/include/cutlass/cluster_launch.hpp",
)
INCLUDE_DIRS = ("csrc", "csrc/kerutils/include", "csrc/sm90", "csrc/cutlass/include")  # as FlashMLA's setup.py
SHIM = Path(__file__).resolve().with_name("flashmla_shim.cpp")
EXTENSION_NAME = "hisparse_flashmla_sm90_sparse_fp8"
ARCH_LIST = "9.0a"  # TORCH_CUDA_ARCH_LIST: -gencode=arch=compute_90a,code=sm_90a, FlashMLA's SM90 target
# FlashMLA's setup.py nvcc flags, less its sm_100 target, --source-in-ptx (PTX annotation only) and
# --threads (parallel over gencode targets: one here); -DFLASH_MLA_DISABLE_FP16 is its own switch
# that drops the fp16 combine instantiation we do not call.
NVCC_FLAGS = (
    "-O3", "-std=c++20", "-DNDEBUG", "-D_USE_MATH_DEFINES", "-Wno-deprecated-declarations",
    "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__", "-U__CUDA_NO_HALF2_OPERATORS__",
    "-U__CUDA_NO_BFLOAT16_CONVERSIONS__", "--expt-relaxed-constexpr", "--expt-extended-lambda",
    "--use_fast_math",
    "--ptxas-options=-v,--register-usage-level=10,--warn-on-spills,--warn-on-local-memory-usage,"
    "--warn-on-double-precision-use",
    "-lineinfo", "-DFLASH_MLA_DISABLE_FP16",
)
CXX_FLAGS = ("-O3", "-std=c++20", "-DNDEBUG", "-Wno-deprecated-declarations", "-DFLASH_MLA_DISABLE_FP16")

# FlashMLA's V3.2 FP8 KV row, byte ranges [start, end): 512 e4m3 "NoPE" values, 4 little-endian
# fp32 scales (scale i for values 128 i .. 128 i + 127; value = e4m3 x scale), 64 bf16 RoPE values.
V32_ROW = {"bytes": 656, "nope": (0, 512), "scales": (512, 528), "rope": (528, 656), "scale_block": 128}
HEADS = (64, 128)  # the SM90 kernel's instantiations (DISPATCH_NUM_HEADS)
TOPK_BLOCK = 64  # the kernel's TOPK_BLOCK_SIZE: top-k must be a multiple of it
PAGE_BLOCK = 64  # page size of FlashMLA's view of the pool (any size addresses row t as t)
REL_TOL = 2e-2  # tests/test_sparse_attention_gpu.py FP8_EXACT_TOL (FP8 rows against the exact reference)
LSE_TOL = 1e-2  # natural-log units
K = 2048
REGION = 4096


class SchedConfig(NamedTuple):
    """FlashMLA's Decode_Sm90_Impl::get_meta (csrc/api/sparse_decode.h) for one query token."""

    num_sm_parts: int  # persistent CTA groups the scheduler shares the requests among
    fixed_overhead_blocks: int
    block_size_topk: int


def sched_config(heads: int, n_sms: int) -> SchedConfig:
    """max(num_sms / s_q / (h_q / 64), 1) groups (s_q = 1), 5 blocks of fixed overhead, 64-token blocks."""
    return SchedConfig(max(n_sms // (heads // 64), 1), 5, TOPK_BLOCK)


def missing_pieces(src: Path) -> list[str]:
    """Paths of DIR the build needs that are absent (empty when DIR is complete)."""
    return missing_files(src, (*KERNEL_SOURCES, *HEADERS))


class Inputs(NamedTuple):
    """Host-side inputs of one shape: pool row r holds packed[r % len(packed)]."""

    values: np.ndarray  # [U, 576] float64, the rows before packing
    packed: np.ndarray  # [U, 656] uint8, pack_fp8_rows(values)
    q_bits: list[np.ndarray]  # per input set, [B, H, 576] uint16 bf16 bits
    slots: list[np.ndarray]  # per input set, [B, k] int32 pool rows, distinct within a request
    n_rows: int  # pool rows (a multiple of PAGE_BLOCK)


def make_inputs(batch: int, heads: int, k: int, n_sets: int, unique_rows: int, seed: int,
                region: int = REGION) -> Inputs:
    """Random standard-normal rows and queries; set s, request b picks k distinct rows of its own
    region [(s B + b) region, (s B + b + 1) region)."""
    if region % PAGE_BLOCK or region < k:
        raise ValueError(f"region must be a multiple of {PAGE_BLOCK} and >= k, got {region}")
    rng = np.random.default_rng(seed)
    values = rng.standard_normal((unique_rows, D_QK))
    packed = pack_fp8_rows(values)
    q_bits, slots = [], []
    for s in range(n_sets):
        q_bits.append(float_to_bf16(rng.standard_normal((batch, heads, D_QK))))
        pick = np.argsort(rng.random((batch, region)), axis=1)[:, :k]
        base = (s * batch + np.arange(batch))[:, None] * region
        slots.append(np.ascontiguousarray(base + pick, dtype=np.int32))
    return Inputs(values, packed, q_bits, slots, n_sets * batch * region)


def pool_rows(inputs: Inputs, rows: np.ndarray) -> np.ndarray:
    """The packed bytes of pool rows `rows` (what the GPU pool holds there)."""
    return inputs.packed[np.asarray(rows) % len(inputs.packed)]


def reference(inputs: Inputs, s: int, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """Float64 out [B, H, 512] and lse [B, H] of input set s, on the exactly dequantised rows."""
    q = bf16_to_float(inputs.q_bits[s]).astype(np.float64)
    rows = unpack_fp8_rows(inputs.packed)
    return mla_decode_reference(q, rows, inputs.slots[s] % len(inputs.packed), scale)


# --------------------------------------------------------------------------------------------
# Build
# --------------------------------------------------------------------------------------------
def build(src: Path, build_dir: Path, verbose: bool) -> Any:
    """Compile the shim and FlashMLA's SM90 sparse FP8 decode units into a Python extension."""
    from torch.utils.cpp_extension import load

    os.environ["TORCH_CUDA_ARCH_LIST"] = ARCH_LIST
    build_dir.mkdir(parents=True, exist_ok=True)
    return load(name=EXTENSION_NAME, sources=[str(SHIM), *(str(src / p) for p in KERNEL_SOURCES)],
                extra_include_paths=[str(src / d) for d in INCLUDE_DIRS], extra_cflags=list(CXX_FLAGS),
                extra_cuda_cflags=list(NVCC_FLAGS), build_directory=str(build_dir), verbose=verbose)


class FlashMLADecode:
    """FlashMLA's per-layer decode (split-KV kernel + combine) for one (B, H, k), on CuPy buffers."""

    def __init__(self, ext: Any, cp: Any, batch: int, heads: int, k: int, n_sms: int) -> None:
        if heads not in HEADS:
            raise ValueError(f"FlashMLA's SM90 sparse decode has H in {HEADS}, got {heads}")
        if k % TOPK_BLOCK:
            raise ValueError(f"top-k must be a multiple of {TOPK_BLOCK}, got {k}")
        self.ext, self.cp, self.batch, self.heads, self.k = ext, cp, batch, heads, k
        self.cfg = sched_config(heads, n_sms)
        parts = self.cfg.num_sm_parts
        self.meta = cp.zeros((parts, ext.sched_meta_ints()), cp.int32)
        self.num_splits = cp.zeros(batch + 1, cp.int32)
        self.o_accum = cp.empty((batch + parts, heads, D_LATENT), cp.float32)
        self.lse_accum = cp.empty((batch + parts, heads), cp.float32)

    def plan(self, stream: Any) -> None:
        """The scheduler-metadata launch (once per decode step in a model)."""
        self.ext.sched_meta(self.meta.data.ptr, self.num_splits.data.ptr, self.batch, self.k,
                            self.cfg.num_sm_parts, self.cfg.block_size_topk, self.cfg.fixed_overhead_blocks,
                            stream.ptr)

    def __call__(self, q: Any, kv: Any, slots: Any, out: Any, lse: Any, scale: float, stream: Any) -> None:
        cp, b, h = self.cp, self.batch, self.heads
        for name, a, dtype, shape in (("q", q, cp.uint16, (b, h, D_QK)), ("slots", slots, cp.int32, (b, self.k)),
                                      ("out", out, cp.uint16, (b, h, D_LATENT)), ("lse", lse, cp.float32, (b, h))):
            if a.dtype != dtype or a.shape != shape or not a.flags.c_contiguous:
                raise ValueError(f"{name} must be a contiguous {np.dtype(dtype).name} array of shape {shape}")
        if kv.dtype != cp.uint8 or kv.ndim != 2 or kv.shape[1] != FP8_ROW_BYTES or kv.shape[0] % PAGE_BLOCK \
                or not kv.flags.c_contiguous:
            raise ValueError(f"kv must be contiguous [N, {FP8_ROW_BYTES}] uint8 rows with N a multiple of {PAGE_BLOCK}")
        self.ext.decode(q.data.ptr, kv.data.ptr, slots.data.ptr, out.data.ptr, lse.data.ptr, self.o_accum.data.ptr,
                        self.lse_accum.data.ptr, self.meta.data.ptr, self.num_splits.data.ptr, b, h,
                        kv.shape[0] // PAGE_BLOCK, PAGE_BLOCK, self.k, self.cfg.num_sm_parts, float(scale), stream.ptr)


# --------------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------------
def capture(cp: Any, stream: Any, fn: Callable[[], None]) -> tuple[Callable[[], None] | None, str]:
    """(replay of a CUDA graph of fn, "") or (None, why capture failed)."""
    try:
        with stream:
            stream.begin_capture()
            try:
                fn()
            finally:
                graph = stream.end_capture()
    except Exception as exc:  # capture unsupported for a launch: report, time plain launches only
        return None, f"{type(exc).__name__}: {exc}"
    return (lambda: graph.launch(stream)), ""


class ShapeResult(NamedTuple):
    batch: int
    heads: int
    timing: str  # "graph" or "plain"
    variant: str  # our kernel's variant (the one that ran)
    ours_us: float
    flashmla_us: float
    meta_us: float
    ours_rel: float
    flashmla_rel: float
    pair_rel: float
    lse_diff: float
    repeat_same: bool
    agree: bool
    k: int = K  # top-k of the shape

    @property
    def ratio(self) -> float:
        return self.flashmla_us / self.ours_us

    def tflops(self, us: float) -> float:
        return attention_flops(self.batch, self.heads, self.k) / us * 1e-6


def run_shape(cp: Any, ext: Any, batch: int, heads: int, k: int, args: argparse.Namespace,
              n_sms: int, clocks: list[ClockRow] | None = None) -> list[ShapeResult]:
    """Check and time our variants and FlashMLA on one (B, H, k); one result per timing mode and variant.
    With ``--clock-probe``, each kernel then runs back to back that long and ``clocks`` gets its row."""
    from cupy_kernels.sparse_attention import WIDE_VARIANTS, sparse_mla_decode, workspace_elems

    variants = list(dict.fromkeys(v if WIDE_VARIANTS[v].runs("fp8", heads) else "ws" for v in args.variants))
    ours = [f"ours:{v}" for v in variants]

    scale = D_QK**-0.5
    t0 = time.perf_counter()
    inp = make_inputs(batch, heads, k, args.sets, args.unique_rows, args.seed + 1000 * batch + heads)
    packed = cp.asarray(inp.packed)
    pool = cp.ascontiguousarray(packed[cp.arange(inp.n_rows, dtype=cp.int64) % len(inp.packed)])
    del packed
    sets = []
    for q_bits, slots in zip(inp.q_bits, inp.slots, strict=True):
        sets.append({"q": cp.asarray(q_bits), "slots": cp.asarray(slots)}
                    | {n: (cp.empty((batch, heads, D_LATENT), cp.uint16), cp.empty((batch, heads), cp.float32))
                       for n in [*ours, "flashmla"]})
    ws = cp.empty(workspace_elems(batch, heads, k), cp.float32)  # our split partials (calls run in turn)
    flash = FlashMLADecode(ext, cp, batch, heads, k, n_sms)
    stream = cp.cuda.Stream(non_blocking=True)
    cp.cuda.Device().synchronize()  # inputs were made on the null stream

    def ours_one(st: dict, name: str) -> None:
        out, lse = st[name]
        sparse_mla_decode(st["q"], pool, st["slots"], scale, "fp8", out=out, lse=lse, workspace=ws,
                          variant=name.split(":", 1)[1])

    def flash_one(st: dict) -> None:
        out, lse = st["flashmla"]
        flash(st["q"], pool, st["slots"], out, lse, scale, stream)

    runs: dict[str, Callable[[], None]] = {n: (lambda n=n: [ours_one(st, n) for st in sets]) for n in ours}
    runs["flashmla"] = lambda: [flash_one(st) for st in sets]

    with stream:
        flash.plan(stream)
        for name in runs:  # set 0, outputs poisoned first
            sets[0][name][0].fill(0x7FC0)
            sets[0][name][1].fill(np.nan)
        for n in ours:
            ours_one(sets[0], n)
        flash_one(sets[0])
        stream.synchronize()
    ref, ref_lse = reference(inp, 0, scale)
    got = {n: (bf16_to_float(cp.asnumpy(sets[0][n][0])).astype(np.float64), cp.asnumpy(sets[0][n][1]).astype(np.float64))
           for n in runs}
    checked = {n: (cp.asnumpy(sets[0][n][0]), cp.asnumpy(sets[0][n][1])) for n in runs}
    flash_rel = rel_err(got["flashmla"][0], ref)
    checks = {}  # ours variant -> (out rel err, rel err against FlashMLA, lse max diff, agree)
    for n in ours:
        ours_rel, pair_rel = rel_err(got[n][0], ref), rel_err(got[n][0], got["flashmla"][0])
        lse_diff = max(max_abs(got[n][1], ref_lse), max_abs(got["flashmla"][1], ref_lse),
                       max_abs(got[n][1], got["flashmla"][1]))
        checks[n] = (ours_rel, pair_rel, lse_diff,
                     max(ours_rel, flash_rel, pair_rel) <= REL_TOL and lse_diff <= LSE_TOL)
    prep = time.perf_counter() - t0

    plan, _ = (None, "") if args.no_graph else capture(cp, stream, lambda: flash.plan(stream))
    with stream:  # a graph replay when it captures: the kernel's time, not the host's launch path
        meta_us = statistics.median(time_calls(cp, stream, plan or (lambda: flash.plan(stream)), args.reps,
                                               warmup=2)) * 1e6
    modes: dict[str, dict[str, Callable[[], None]]] = {"plain": dict(runs)}
    if not args.no_graph:
        graphs = {}
        for name, fn in runs.items():
            with stream:
                fn()
                stream.synchronize()
            replay, why = capture(cp, stream, fn)
            if replay is None:
                print(f"  ({name}: no CUDA graph: {why})", flush=True)
                break
            graphs[name] = replay
        if len(graphs) == len(runs):
            modes["graph"] = graphs
    samples = {(m, n): [] for m in modes for n in runs}
    for r in range(args.rounds):  # alternate which kernel goes first
        order = list(runs) if r % 2 == 0 else list(runs)[::-1]
        for mode, fns in modes.items():
            for name in order:
                with stream:
                    samples[(mode, name)] += time_calls(cp, stream, fns[name], args.reps, warmup=2)
    stream.synchronize()
    if args.clock_probe > 0 and clocks is not None:
        fns = modes.get("graph", modes["plain"])
        for name in runs:  # after the timing, so the timed samples are as before
            try:
                st = sustained(lambda f=fns[name]: f(), stream.synchronize, args.clock_probe, calls_per_launch=len(sets),
                               device=cp.cuda.Device().id)
            except (OSError, ValueError, subprocess.SubprocessError) as exc:
                print(f"  (clock probe of {name}: {exc})", flush=True)
                continue
            clocks.append(ClockRow(batch, heads, k, name.split(":", 1)[-1], st))
            print(f"  B={batch} H={heads} k={k} {name}: sustained {st.us_per_call:.1f} us/call at {st.sm_mhz:.0f} MHz "
                  f"({st.kcycles_per_call:.1f} kcycles), {st.power_w:.0f} W, {st.temp_c:.0f} C, reasons "
                  f"{st.reasons:#x}, {st.samples} samples", flush=True)
    same = all(np.array_equal(cp.asnumpy(sets[0][n][0]), checked[n][0])
               and np.array_equal(cp.asnumpy(sets[0][n][1]), checked[n][1]) for n in runs)
    text = "; ".join(f"{n}: out rel err {c[0]:.2e}, vs FlashMLA {c[1]:.2e}, lse max diff {c[2]:.2e}"
                     for n, c in checks.items())
    print(f"  B={batch} H={heads} k={k}: inputs + reference {prep:.1f} s; FlashMLA groups {flash.cfg.num_sm_parts}; "
          f"FlashMLA out rel err {flash_rel:.2e}; {text}; repeat bit-identical {same}", flush=True)
    per_call = {key: statistics.median(v) / len(sets) * 1e6 for key, v in samples.items()}
    return [ShapeResult(batch, heads, mode, n.split(":", 1)[1], per_call[(mode, n)], per_call[(mode, "flashmla")],
                        meta_us, checks[n][0], flash_rel, checks[n][1], checks[n][2], same, checks[n][3] and same, k)
            for mode in list(modes)[::-1] for n in ours]


class ClockRow(NamedTuple):
    """One kernel's sustained run (``--clock-probe``): its time per call and the clock it ran at."""

    batch: int
    heads: int
    k: int
    kernel: str  # our variant, or "flashmla"
    run: Sustained


def write_clocks_csv(path: Path, device: str, rows: Sequence[ClockRow]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["device", "B", "H", "K", "kernel", "calls", "us_per_call", "sm_mhz", "kcycles_per_call",
                    "power_w", "temp_c", "clock_event_reasons", "samples"])
        for r in rows:
            s = r.run
            w.writerow([device, r.batch, r.heads, r.k, r.kernel, s.calls, f"{s.us_per_call:.2f}", f"{s.sm_mhz:.0f}",
                        f"{s.kcycles_per_call:.2f}", f"{s.power_w:.1f}", f"{s.temp_c:.0f}", f"{s.reasons:#x}",
                        s.samples])


class TileFit(NamedTuple):
    """One kernel's time against the number of 64-token tiles, least squares: fixed + per_tile x tiles."""

    batch: int
    heads: int
    timing: str
    kernel: str  # our variant, or "flashmla"
    per_tile_us: float
    fixed_us: float
    points: int


def tile_fits(results: Sequence[ShapeResult]) -> list[TileFit]:
    """Per (B, H, timing), for each of our variants and for FlashMLA, the fit over the k values
    timed (two or more distinct k): separates what a tile costs from what a request costs once."""
    groups: dict[tuple[int, int, str], list[ShapeResult]] = {}
    for r in results:
        groups.setdefault((r.batch, r.heads, r.timing), []).append(r)
    fits = []
    for (batch, heads, timing), rows in groups.items():
        series = {"flashmla": {r.k: r.flashmla_us for r in rows}}
        for r in rows:
            series.setdefault(r.variant, {})[r.k] = r.ours_us
        for kernel, by_k in series.items():
            if len(by_k) < 2:
                continue
            tiles = np.array([k / TOPK_BLOCK for k in by_k], dtype=np.float64)
            slope, fixed = np.polyfit(tiles, np.array(list(by_k.values()), dtype=np.float64), 1)
            fits.append(TileFit(batch, heads, timing, kernel, float(slope), float(fixed), len(by_k)))
    return fits


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------
def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--flashmla", type=Path, required=True, help="the folder benchmarks/fetch_flashmla.sh filled")
    ap.add_argument("--batches", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--heads", type=int, nargs="+", default=[128, 64], help=f"each one of {HEADS}")
    ap.add_argument("--variants", nargs="+", default=["ws", "wsxr"],
                    help="our wide-kernel variants to time (keys of cupy_kernels.sparse_attention.WIDE_VARIANTS)")
    ap.add_argument("--reps", type=int, default=20, help="timed calls per kernel, mode and round")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds (samples = reps x rounds)")
    ap.add_argument("--sets", type=int, default=4, help="rotating input sets (one call each per timed sample)")
    ap.add_argument("--unique-rows", type=int, default=16384, help="distinct packed rows repeated over the pool")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--topk", type=int, nargs="+", default=[K],
                    help=f"selected tokens per request, each a multiple of {TOPK_BLOCK}, at most {REGION}; with two "
                         "or more the per-tile time and the fixed cost are fitted per kernel (tile_fits)")
    ap.add_argument("--no-graph", action="store_true", help="time plain launches only")
    ap.add_argument("--flashmla-sms", type=int, default=0,
                    help="SMs FlashMLA's scheduler shares the work over (default 0: the device's count; fewer "
                         "tests how much of its speed comes from using every SM)")
    ap.add_argument("--clock-probe", type=float, default=0.0, metavar="SECONDS",
                    help="after the timing, run each kernel back to back this long while nvidia-smi samples the SM "
                         "clock and power; writes OUT's -clocks.csv beside it (default 0: off)")
    ap.add_argument("--build-dir", type=Path, default=Path("/tmp/hisparse-flashmla-build"))
    ap.add_argument("--verbose-build", action="store_true", help="show the compiler's output (ptxas resource report)")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/flashmla_compare.csv"))
    args = ap.parse_args(argv)
    bad_k = [k for k in args.topk if k < TOPK_BLOCK or k % TOPK_BLOCK or k > REGION]
    if bad_k:
        raise UsageError(f"--topk must each be a multiple of {TOPK_BLOCK} in [{TOPK_BLOCK}, {REGION}], got {bad_k}")
    if not 0 <= args.clock_probe <= 600:
        raise UsageError(f"--clock-probe must be 0 (off) to 600 seconds, got {args.clock_probe}")
    if args.flashmla_sms < 0:
        raise UsageError(f"--flashmla-sms must be >= 0 (0: the device's count), got {args.flashmla_sms}")
    for name in ("reps", "rounds", "sets", "unique_rows"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    from cupy_kernels.sparse_attention import WIDE_VARIANTS

    bad = [v for v in args.variants if v not in WIDE_VARIANTS or "fp8" not in WIDE_VARIANTS[v].kv_dtypes]
    if bad:
        fp8 = [v for v, spec in WIDE_VARIANTS.items() if "fp8" in spec.kv_dtypes]
        raise UsageError(f"--variants must each be one of {fp8} (our FP8 wide kernels), got {bad}")
    if any(b < 1 for b in args.batches):
        raise UsageError(f"--batches must all be >= 1, got {args.batches}")
    if any(h not in HEADS for h in args.heads):
        raise UsageError(f"--heads must each be one of {HEADS} (FlashMLA's SM90 sparse decode), got {args.heads}")
    if not args.flashmla.is_dir():
        raise UsageError(f"--flashmla {args.flashmla}: no such folder (fill it with benchmarks/fetch_flashmla.sh "
                         f"{args.flashmla})")
    missing = missing_pieces(args.flashmla)
    if missing:
        raise UsageError(f"--flashmla {args.flashmla} lacks {len(missing)} file(s) the build needs, e.g. "
                         f"{', '.join(missing[:3])} (refill it with benchmarks/fetch_flashmla.sh)")
    return args


def load_gpu_stack() -> tuple[Any, Any]:
    """(torch, cupy) on a Hopper GPU, else UsageError."""
    torch = hopper_torch("FlashMLA")
    try:
        import cupy
    except ImportError as exc:
        raise UsageError(f"needs CuPy (our kernel): {exc}") from None
    return torch, cupy


def clocks_path(out: Path) -> Path:
    """Where ``--clock-probe``'s rows go: beside OUT, ``<stem>-clocks.csv``."""
    return out.with_name(f"{out.stem}-clocks.csv")


def write_csv(path: Path, device: str, results: list[ShapeResult]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["device", "B", "H", "K", "kv", "timing", "variant", "ours_us", "flashmla_us", "ours_tflops", "flashmla_tflops",
                    "ratio", "flashmla_meta_us", "ours_rel_err", "flashmla_rel_err", "ours_vs_flashmla_rel",
                    "lse_max_diff", "repeat_bit_identical", "agree"])
        for r in results:
            w.writerow([device, r.batch, r.heads, r.k, "fp8", r.timing, r.variant, f"{r.ours_us:.2f}", f"{r.flashmla_us:.2f}",
                        f"{r.tflops(r.ours_us):.1f}", f"{r.tflops(r.flashmla_us):.1f}", f"{r.ratio:.3f}",
                        f"{r.meta_us:.2f}", f"{r.ours_rel:.2e}", f"{r.flashmla_rel:.2e}", f"{r.pair_rel:.2e}",
                        f"{r.lse_diff:.2e}", r.repeat_same, r.agree])


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parse_args(argv)
        torch, cp = load_gpu_stack()
    except UsageError as exc:
        print(f"flashmla_compare: {exc}", file=sys.stderr)
        return 2
    fetched = read_fetched(args.flashmla)
    device = torch.cuda.get_device_name()
    print(f"{device}; FlashMLA {fetched.get('flashmla', '?')[:12]} CUTLASS {fetched.get('cutlass', '?')[:12]} "
          f"(pins {FLASHMLA_COMMIT[:12]} / {CUTLASS_COMMIT[:12]}); MAX_JOBS={os.environ.get('MAX_JOBS', '-')}",
          flush=True)
    t0 = time.perf_counter()
    try:
        ext = build(args.flashmla, args.build_dir, args.verbose_build)
    except Exception as exc:  # the compiler's own message, without a Python traceback
        print(f"flashmla_compare: building FlashMLA failed: {str(exc)[-6000:]}", file=sys.stderr)
        return 1
    print(f"built FlashMLA's SM90 sparse FP8 decode + shim in {time.perf_counter() - t0:.1f} s", flush=True)
    n_sms = args.flashmla_sms or cp.cuda.Device().attributes["MultiProcessorCount"]
    results: list[ShapeResult] = []
    clocks: list[ClockRow] = []
    failed = ""
    for batch, heads, k in itertools.product(args.batches, args.heads, args.topk):
        try:
            results += run_shape(cp, ext, batch, heads, k, args, n_sms, clocks)
        except Exception as exc:  # a launch or CUDA error: keep what was measured, say where it stopped
            failed = f"B={batch} H={heads} k={k}: {type(exc).__name__}: {exc}"
            print(f"flashmla_compare: stopped at {failed}", file=sys.stderr, flush=True)
            break
        cp.get_default_memory_pool().free_all_blocks()
    write_csv(args.out, device, results)
    print(f"\nwrote {args.out}\n")
    if clocks:
        write_clocks_csv(clocks_path(args.out), device, clocks)
        print(f"wrote {clocks_path(args.out)}\n")
    print(f"{device}, FP8 KV (656 B rows), one query token; us per call (median), TFLOP/s = "
          f"2 B H k (576 + 512) / time; ratio = FlashMLA time / our time (> 1: ours faster)")
    print("| B | H | k | timing | ours | ours us | FlashMLA us | ours TFLOP/s | FlashMLA TFLOP/s | ratio | agree |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r.batch} | {r.heads} | {r.k} | {r.timing} | {r.variant} | {r.ours_us:.1f} | {r.flashmla_us:.1f} | "
              f"{r.tflops(r.ours_us):.0f} | {r.tflops(r.flashmla_us):.0f} | {r.ratio:.2f}x | "
              f"{'yes' if r.agree else 'NO'} |")
    fits = tile_fits(results)
    if fits:
        print("\nleast squares over k: time = fixed + per_tile x k / 64 (us)")
        print("| B | H | timing | kernel | per tile | fixed | points |")
        print("|---|---|---|---|---|---|---|")
        for f in fits:
            print(f"| {f.batch} | {f.heads} | {f.timing} | {f.kernel} | {f.per_tile_us:.3f} | {f.fixed_us:.2f} | {f.points} |")
    if failed:
        print(f"stopped at {failed}")
    return 0 if results and not failed and all(r.agree for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
