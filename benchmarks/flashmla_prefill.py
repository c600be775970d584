"""Time FlashMLA's SM90 sparse MLA prefill at the shapes the serving model prices a prompt chunk at.

Usage (on one H100 / H200; FlashMLA's source fetched first, nothing of it is committed here):
  bash benchmarks/fetch_flashmla.sh .flashmla-src
  python benchmarks/flashmla_prefill.py --flashmla .flashmla-src [--heads 128 64] [--chunk 4096]
      [--contexts 4096 32768 163840] [--patterns uniform trace] [--out CSV]

Why: SGLang's DSA backend runs a prompt chunk's sparse attention with FlashMLA's `flash_mla_sparse_fwd`
(`--dsa-prefill-backend flashmla_sparse`, the Hopper BF16-KV default; with FP8 KV it runs on the prefix
dequantised to BF16). The serving model prices that kernel from this benchmark's table
(`simulator/costmodel/prompt_chunk.py`, measured on an H200 2026-12-07; before it, at 0.83 x 769 TFLOP/s at
every context, from FlashMLA's README "up to 640 TFlops" on an H800). The kernel gathers each query's top-k rows (576 bf16, 1,152 B) from the prompt's whole
KV: 4.7 MB at a 4K prompt, inside L2; 189 MB at 160K, far past it. This times the kernel where the
model uses it, per context, so the model can price it from a measurement.

What runs: one launch of FlashMLA's SM90 kernel (`sm90::fwd::run_fwd_phase1_kernel<576, false>`,
FlashMLA 9241ae3, bound by benchmarks/flashmla_prefill_shim.cpp) over --chunk query tokens at
positions ctx - chunk .. ctx - 1 of one prompt, h heads (128: DeepSeek-V3.2 with DP attention; 64:
GLM-5.x), top-k --topk, q bf16 [chunk, h, 576], kv bf16 [ctx, 576] (one KV head), scale 1/sqrt(576).
Index patterns (each query's top-k among the positions up to its own, -1 where it has fewer):
  uniform  distinct positions drawn uniformly: the fewest rows shared between queries (L2's worst case);
  trace    the fitted DSA generator's top-k (--trace-preset, the layer at --trace-depth of its model's
           depth), consecutive decode positions standing for consecutive prompt positions.
Timing: --sets copies of kv (and of its indices) so that the rows of one call are not in L2 for the
next (a model's layers read different caches); a CUDA graph of one launch per set, replayed --reps
times, median per launch. TFLOP/s = 2 x chunk x h x topk x (576 + 512) / time: every top-k slot,
masked or not (the kernel computes them all); `valid` is the share of slots holding a position.
Check, per shape: the output of the first and last 8 queries against a float32 reference of the
same gather (torch), relative error <= REL_TOL.

Exit status: 0, every check passed; 1, a check or a launch failed (the CSV holds what was timed);
2, bad arguments, missing pieces of DIR, or no PyTorch / Hopper GPU.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.fetched_build import UsageError, hopper_torch, missing_files, read_fetched  # noqa: E402
from cupy_kernels.mla_reference import D_LATENT as D_V  # noqa: E402
from cupy_kernels.mla_reference import D_QK, attention_flops  # noqa: E402
from cupy_kernels.timing import l2_cold_sets, time_calls_torch, torch_graph  # noqa: E402

HEADS = (64, 128)  # the SM90 kernel's head counts (B_H 64 per CTA)
TOPK_BLOCK = 128  # the kernel asserts topk % (2 x B_TOPK) == 0
PATTERNS = ("uniform", "trace")
REL_TOL = 2e-2  # bf16 output against the float32 reference of the same gather
KERNEL_SOURCES = ("csrc/sm90/prefill/sparse/instantiations/phase1_k576.cu",)
HEADERS = (
    "csrc/params.h", "csrc/defines.h", "csrc/utils.h", "csrc/sm90/helpers.h",
    "csrc/sm90/prefill/sparse/phase1.h", "csrc/sm90/prefill/sparse/phase1.cuh", "csrc/sm90/prefill/sparse/config.h",
    "csrc/kerutils/include/kerutils/kerutils.cuh", "csrc/cutlass/include/cute/tensor.hpp",
    "csrc/cutlass/include/cutlass/cluster_launch.hpp",
)
SHIM = Path(__file__).resolve().with_name("flashmla_prefill_shim.cpp")
EXTENSION_NAME = "hisparse_flashmla_sm90_sparse_prefill"


def uniform_indices(rng: np.random.Generator, positions: np.ndarray, topk: int) -> np.ndarray:
    """[len(positions), topk] int32: for a query at position p, ``topk`` distinct positions drawn
    uniformly from 0 .. p (all of them, then -1, when p + 1 <= topk)."""
    out = np.full((len(positions), topk), -1, dtype=np.int32)
    for row, p in enumerate(positions.tolist()):
        n = p + 1
        if n <= topk:
            out[row, :n] = np.arange(n, dtype=np.int32)
        elif n < 4 * topk:
            out[row] = rng.choice(n, topk, replace=False)
        else:  # draws with replacement, first occurrences kept in draw order, until topk are distinct
            got = np.zeros(0, dtype=np.int64)
            while got.size < topk:
                draw = np.concatenate([got, rng.integers(0, n, size=topk + topk // 4)])
                _, first = np.unique(draw, return_index=True)
                got = draw[np.sort(first)]
            out[row] = got[:topk]
    return out


def trace_indices(preset: str, depth: float, positions: np.ndarray, topk: int, seed: int) -> np.ndarray:
    """[len(positions), topk] int32: the fitted generator's top-k for consecutive positions (the
    query at position p selects among 0 .. p), -1 padded; the layer at ``depth`` (0 .. 1) of its
    preset's profile."""
    from simulator.trace import generator

    knobs = generator.load_knobs(preset).at_depth(depth)
    first = int(positions[0])
    stream = next(iter(generator.generate(knobs, steps=len(positions), layers=1, requests=1, k=topk,
                                          ctx0=first + 1, seed=seed)))
    idx = np.full((len(positions), topk), -1, dtype=np.int32)
    got = np.asarray(stream.indices, dtype=np.int32)
    idx[:, : got.shape[1]] = got[:, :topk]
    return idx


class Row(NamedTuple):
    heads: int
    chunk: int
    ctx: int
    topk: int
    pattern: str
    sets: int
    us: float
    valid: float
    rel_err: float

    @property
    def tflops(self) -> float:
        return attention_flops(self.chunk, self.heads, self.topk) / (self.us * 1e-6) / 1e12

    @property
    def kv_mb(self) -> float:
        return self.ctx * D_QK * 2 / 1e6

    @property
    def ok(self) -> bool:
        return self.rel_err <= REL_TOL


def build(src: Path, build_dir: Path, verbose: bool) -> Any:
    """Compile the shim and FlashMLA's SM90 sparse prefill unit into a Python extension (the flags
    benchmarks/flashmla_compare.py uses: FlashMLA's setup.py's for sm_90a)."""
    from torch.utils.cpp_extension import load

    from benchmarks.flashmla_compare import ARCH_LIST, CXX_FLAGS, INCLUDE_DIRS, NVCC_FLAGS

    os.environ["TORCH_CUDA_ARCH_LIST"] = ARCH_LIST
    build_dir.mkdir(parents=True, exist_ok=True)
    return load(name=EXTENSION_NAME, sources=[str(SHIM), *(str(src / p) for p in KERNEL_SOURCES)],
                extra_include_paths=[str(src / d) for d in INCLUDE_DIRS], extra_cflags=list(CXX_FLAGS),
                extra_cuda_cflags=list(NVCC_FLAGS), build_directory=str(build_dir), verbose=verbose)


def reference(torch: Any, q: Any, kv: Any, idx: Any, scale: float) -> Any:
    """float32 O [rows, h, 512] of the sparse attention of q [rows, h, 576] over kv[idx] (-1 masked)."""
    valid = idx >= 0
    rows = kv[idx.clamp(min=0).long()].float()  # [r, k, 576]
    s = torch.einsum("rhd,rkd->rhk", q.float(), rows) * scale
    s = s.masked_fill(~valid[:, None, :], float("-inf"))
    p = torch.softmax(s, dim=-1)
    return torch.einsum("rhk,rkd->rhd", p, rows[:, :, :D_V])


def pattern_indices(pattern: str, chunk: int, ctx: int, args: argparse.Namespace) -> np.ndarray:
    """The top-k of the chunk's queries (positions ctx - chunk .. ctx - 1) under ``pattern``."""
    positions = np.arange(ctx - chunk, ctx, dtype=np.int64)
    if pattern == "uniform":
        return uniform_indices(np.random.default_rng(args.seed), positions, args.topk)
    return trace_indices(args.trace_preset, args.trace_depth, positions, args.topk, args.seed)


def run_shape(torch: Any, ext: Any, heads: int, chunk: int, ctx: int, pattern: str, idx_np: np.ndarray,
              args: argparse.Namespace, l2: int, n_sm: int) -> Row:
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(args.seed)
    valid = float((idx_np >= 0).mean())
    sets = l2_cold_sets(ctx * D_QK * 2, l2)
    q = (torch.randn((chunk, heads, D_QK), generator=gen, device=dev) * 0.5).to(torch.bfloat16)
    kvs = [(torch.randn((ctx, D_QK), generator=gen, device=dev) * 0.5).to(torch.bfloat16) for _ in range(sets)]
    idx = torch.from_numpy(idx_np).to(dev)
    idxs = [idx.clone() for _ in range(sets)]
    out = torch.empty((chunk, heads, D_V), dtype=torch.bfloat16, device=dev)
    mx = torch.empty((chunk, heads), dtype=torch.float32, device=dev)
    lse = torch.empty((chunk, heads), dtype=torch.float32, device=dev)
    scale = 1.0 / math.sqrt(D_QK)

    def launch(s: int) -> None:
        ext.prefill(q.data_ptr(), kvs[s].data_ptr(), idxs[s].data_ptr(), out.data_ptr(), mx.data_ptr(),
                    lse.data_ptr(), chunk, ctx, heads, args.topk, scale, n_sm, torch.cuda.current_stream().cuda_stream)

    out.fill_(float("nan"))
    launch(0)
    torch.cuda.synchronize()
    pick = torch.cat([torch.arange(0, 8), torch.arange(chunk - 8, chunk)]).to(dev)
    ref = reference(torch, q[pick], kvs[0], idx[pick], scale)
    got = out[pick].float()
    rel = float(torch.linalg.norm(got - ref) / torch.linalg.norm(ref)) if torch.isfinite(got).all() else math.inf
    graph, _ = torch_graph(torch, launch, sets)
    times = time_calls_torch(torch, graph.replay, args.reps, warmup=1)
    del graph
    return Row(heads, chunk, ctx, args.topk, pattern, sets, float(np.median(times)) * 1e6 / sets, valid, rel)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--flashmla", type=Path, required=True, help="the folder benchmarks/fetch_flashmla.sh filled")
    ap.add_argument("--heads", type=int, nargs="+", default=[128, 64], help=f"each one of {HEADS}")
    ap.add_argument("--chunk", type=int, default=4096, help="query tokens per launch (SGLang: the chunk per rank)")
    ap.add_argument("--contexts", type=int, nargs="+", default=[4096, 16384, 32768, 65536, 163840],
                    help="prompt length at the chunk's end (each >= --chunk)")
    ap.add_argument("--topk", type=int, default=2048, help=f"selected tokens per query (a multiple of {TOPK_BLOCK})")
    ap.add_argument("--patterns", nargs="+", default=list(PATTERNS), help=f"index patterns, of {PATTERNS}")
    ap.add_argument("--trace-preset", default="dsv32", help="the generator preset of the trace pattern")
    ap.add_argument("--trace-depth", type=float, default=0.5, help="the layer's depth in the preset's profile (0-1)")
    ap.add_argument("--reps", type=int, default=20, help="graph replays timed per shape")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--build-dir", type=Path, default=Path("/tmp/hisparse-flashmla-prefill-build"))
    ap.add_argument("--verbose-build", action="store_true", help="show the compiler's output")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/flashmla_prefill.csv"))
    args = ap.parse_args(argv)
    if any(h not in HEADS for h in args.heads):
        raise UsageError(f"--heads must each be one of {HEADS} (FlashMLA's SM90 sparse prefill), got {args.heads}")
    if args.chunk < 16:
        raise UsageError(f"--chunk must be >= 16 (the check reads its first and last 8 queries), got {args.chunk}")
    if args.topk < TOPK_BLOCK or args.topk % TOPK_BLOCK:
        raise UsageError(f"--topk must be a positive multiple of {TOPK_BLOCK}, got {args.topk}")
    short = [c for c in args.contexts if c < args.chunk]
    if short:
        raise UsageError(f"--contexts must each be >= --chunk {args.chunk}, got {short}")
    bad = [p for p in args.patterns if p not in PATTERNS]
    if bad:
        raise UsageError(f"--patterns must each be one of {PATTERNS}, got {bad}")
    if not 0.0 <= args.trace_depth <= 1.0:
        raise UsageError(f"--trace-depth must be in [0, 1], got {args.trace_depth}")
    if "trace" in args.patterns:
        from simulator.trace import generator

        if args.trace_preset not in generator.preset_names():
            raise UsageError(f"--trace-preset must be one of {generator.preset_names()}, got {args.trace_preset!r}")
    if args.reps < 1:
        raise UsageError(f"--reps must be >= 1, got {args.reps}")
    if not args.flashmla.is_dir():
        raise UsageError(f"--flashmla {args.flashmla}: no such folder (fill it with benchmarks/fetch_flashmla.sh "
                         f"{args.flashmla})")
    missing = missing_files(args.flashmla, (*KERNEL_SOURCES, *HEADERS))
    if missing:
        raise UsageError(f"--flashmla {args.flashmla} lacks {len(missing)} file(s) the build needs, e.g. "
                         f"{', '.join(missing[:3])} (refill it with benchmarks/fetch_flashmla.sh)")
    return args


def write_csv(path: Path, device: str, rows: list[Row]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["device", "heads", "chunk", "ctx", "topk", "pattern", "kv_mb", "sets", "us", "tflops", "valid",
                    "rel_err"])
        for r in rows:
            w.writerow([device, r.heads, r.chunk, r.ctx, r.topk, r.pattern, f"{r.kv_mb:.1f}", r.sets, f"{r.us:.1f}",
                        f"{r.tflops:.1f}", f"{r.valid:.4f}", f"{r.rel_err:.2e}"])


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parse_args(argv)
        torch = hopper_torch("FlashMLA")
    except UsageError as exc:
        print(f"flashmla_prefill: {exc}", file=sys.stderr)
        return 2
    fetched = read_fetched(args.flashmla)
    props = torch.cuda.get_device_properties(0)
    device = props.name
    l2 = int(getattr(props, "L2_cache_size", 50 * 2**20))
    print(f"{device} ({props.multi_processor_count} SMs, L2 {l2 / 2**20:.0f} MiB); FlashMLA "
          f"{fetched.get('flashmla', '?')[:12]}", flush=True)
    t0 = time.perf_counter()
    try:
        ext = build(args.flashmla, args.build_dir, args.verbose_build)
    except Exception as exc:  # the compiler's own message, without a Python traceback
        print(f"flashmla_prefill: building FlashMLA failed: {str(exc)[-6000:]}", file=sys.stderr)
        return 1
    print(f"built FlashMLA's SM90 sparse prefill + shim in {time.perf_counter() - t0:.1f} s", flush=True)
    rows: list[Row] = []
    failed = ""
    for pattern in args.patterns:
        for ctx in args.contexts:
            idx_np = pattern_indices(pattern, args.chunk, ctx, args)
            for heads in args.heads:
                try:
                    r = run_shape(torch, ext, heads, args.chunk, ctx, pattern, idx_np, args, l2,
                                  props.multi_processor_count)
                except Exception as exc:  # a launch or CUDA error: keep what was measured, say where it stopped
                    failed = f"h={heads} ctx={ctx} {pattern}: {type(exc).__name__}: {exc}"
                    print(f"flashmla_prefill: stopped at {failed}", file=sys.stderr, flush=True)
                    break
                rows.append(r)
                print(f"h {heads} ctx {ctx} {pattern}: {r.us:.1f} us, {r.tflops:.0f} TFLOP/s, valid {r.valid:.3f}, "
                      f"kv {r.kv_mb:.0f} MB x {r.sets}, rel err {r.rel_err:.1e}", flush=True)
                torch.cuda.empty_cache()
            if failed:
                break
        if failed:
            break
    write_csv(args.out, device, rows)
    print(f"\nwrote {args.out}\n")
    print(f"{device}: one launch of {args.chunk} query tokens, top-k {args.topk}, BF16 rows; us (median of "
          f"{args.reps} graph replays); TFLOP/s = 2 chunk h k (576 + 512) / time")
    print("| heads | pattern | ctx | KV MB | us | TFLOP/s | valid | check |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r.heads} | {r.pattern} | {r.ctx} | {r.kv_mb:.0f} | {r.us:.0f} | {r.tflops:.0f} | {r.valid:.3f} | "
              f"{'ok' if r.ok else f'FAILED {r.rel_err:.1e}'} |")
    if failed:
        print(f"stopped at {failed}")
    return 0 if rows and not failed and all(r.ok for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
