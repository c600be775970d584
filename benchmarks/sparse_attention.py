"""Time the sparse MLA decode kernel against a PyTorch bf16 eager reference on one GPU.

Usage (on the H200):  python benchmarks/sparse_attention.py --out benchmarks/results/sparse_attention-h200.csv

For every B in {1, 8, 32, 64, 128}, H in {8, 16, 64, 128} and KV layout (bf16 1152 B rows, fp8
656 B rows), with k = 2048, it times, in the same process (H 8 and 16 run the narrow kernel):
- the kernel: a CUDA graph of calls over rotating input sets (so L2 holds no previous call's rows),
  CUDA events, median per call over many replays;
- the reference a user would otherwise write: gather, bmm, masked softmax, bmm in PyTorch eager
  (fp8 rows dequantised to bf16 first), CUDA events around the same rotating calls, median;
- the roofline: max(min bytes / measured HBM copy bandwidth, FLOPs / measured bf16 GEMM rate),
  both ceilings measured at the start of the run.
Writes a CSV with columns B,H,K,kv_dtype,us,ref_us,roofline_us,tflops,kv_tbps (tensor-core
FLOP/s of the call; bytes of gathered KV rows per second, the figure of the few-heads shapes) and
prints a table.
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cupy_kernels.mla_reference import (  # noqa: E402
    D_LATENT,
    D_QK,
    FP8_ROW_BYTES,
    attention_flops,
    attention_min_bytes,
    gathered_kv_bytes,
)
from cupy_kernels.sparse_attention import (  # noqa: E402
    DEFAULT_NARROW_VARIANT,
    DEFAULT_WIDE_VARIANT,
    HEADS_PER_CTA,
    NARROW_VARIANTS,
    WIDE_VARIANTS,
    sparse_mla_decode,
    workspace_elems,
)
from cupy_kernels.timing import time_calls, time_calls_torch  # noqa: E402

K = 2048
REGION = 4096  # hot-buffer slots per request: top-k picks 2048 of them


def measure_copy_bandwidth(cp: Any, nbytes: int = 2 << 30, reps: int = 20) -> float:
    """Device-to-device copy, bytes read + written per second (median)."""
    src = cp.random.randint(0, 255, nbytes, dtype=cp.uint8)
    dst = cp.empty_like(src)
    times = time_calls(cp, None, lambda: cp.copyto(dst, src), reps, warmup=3)
    return 2 * nbytes / statistics.median(times)


def measure_gemm_rate(torch: Any, n: int = 8192, reps: int = 20) -> float:
    """bf16 n^3 matrix product on random data through PyTorch, FLOP/s (median)."""
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    times = time_calls_torch(torch, lambda: torch.matmul(a, b), reps, warmup=3)
    return 2 * n**3 / statistics.median(times)


def make_sets(cp: Any, batch: int, heads: int, kv_dtype: str, n_sets: int) -> tuple[Any, list]:
    """One KV pool and n_sets (q, slots, out, lse, workspace) sets touching disjoint pool regions."""
    n_rows = n_sets * batch * REGION
    if kv_dtype == "bf16":
        pool = _bf16_bits(cp, cp.random.standard_normal((n_rows, D_QK), dtype=cp.float32))
    else:
        pool = cp.empty((n_rows, FP8_ROW_BYTES), cp.uint8)
        mag = cp.random.randint(0, 0x7F, (n_rows, D_LATENT), dtype=cp.uint8)  # no NaN code
        pool[:, :D_LATENT] = mag | (cp.random.randint(0, 2, mag.shape, dtype=cp.uint8) << 7)
        scales = cp.random.uniform(0.001, 0.01, (n_rows, 4)).astype(cp.float32)
        pool[:, D_LATENT : D_LATENT + 16] = scales.view(cp.uint8)
        rope = _bf16_bits(cp, cp.random.standard_normal((n_rows, 64), dtype=cp.float32))
        pool[:, D_LATENT + 16 :] = rope.view(cp.uint8)
    sets = []
    for s in range(n_sets):
        q = _bf16_bits(cp, cp.random.standard_normal((batch, heads, D_QK), dtype=cp.float32))
        pick = cp.argsort(cp.random.random((batch, REGION)), axis=1)[:, :K]
        base = (s * batch + cp.arange(batch)[:, None]) * REGION
        slots = cp.ascontiguousarray((base + pick).astype(cp.int32))
        out = cp.empty((batch, heads, D_LATENT), cp.uint16)
        lse = cp.empty((batch, heads), cp.float32)
        ws = cp.empty(workspace_elems(batch, heads, K), cp.float32)
        sets.append((q, slots, out, lse, ws))
    return pool, sets


def _bf16_bits(cp: Any, x: Any) -> Any:
    """float32 -> bf16 bit patterns (round to nearest even), as uint16."""
    u = x.view(cp.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(cp.uint16)


def time_kernel(cp: Any, pool: Any, sets: list, kv_dtype: str, scale: float, reps: int, graph: bool,
                variant: str | None = None, narrow_variant: str | None = None) -> float:
    """Median us per call: a CUDA graph of one call per input set (or plain launches), replayed."""

    def run_all() -> None:
        for q, slots, out, lse, ws in sets:
            sparse_mla_decode(q, pool, slots, scale, kv_dtype, out=out, lse=lse, workspace=ws, variant=variant,
                              narrow_variant=narrow_variant)

    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        run_all()
        run_all()
        stream.synchronize()
        fn = run_all
        try:
            if not graph:
                raise RuntimeError("disabled by --no-graph")
            stream.begin_capture()
            run_all()
            g = stream.end_capture()
            fn = lambda: g.launch(stream)  # noqa: E731
        except Exception as exc:  # graph capture unavailable: plain launches
            try:
                stream.end_capture()
            except Exception:
                pass
            print(f"  (no CUDA graph: {exc}; timing plain launches)")
        times = time_calls(cp, stream, fn, reps, warmup=3)
    return statistics.median(times) / len(sets) * 1e6


def torch_reference(torch: Any, q: Any, rows_of: Any, slots: Any, scale: float) -> tuple[Any, Any]:
    """What a user writes: gather, bmm, masked softmax (fp32), bmm; bf16 tensors."""
    rows = rows_of(slots.clamp(min=0).long())  # [B, k, 576] bf16
    s = torch.bmm(q, rows.transpose(1, 2)).float() * scale
    s = s.masked_fill((slots < 0).unsqueeze(1), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.softmax(s, dim=-1).to(torch.bfloat16)
    return torch.bmm(p, rows[:, :, :D_LATENT]), lse


def torch_row_gather(torch: Any, pool_t: Any, kv_dtype: str) -> Any:
    """Row gather for the reference: bf16 rows directly, fp8 rows dequantised to bf16."""
    if kv_dtype == "bf16":
        return lambda idx: pool_t[idx]

    def gather_fp8(idx: Any) -> Any:
        raw = pool_t[idx]  # [B, k, 656] uint8
        lat = raw[..., :D_LATENT].view(torch.float8_e4m3fn).float()
        sc = raw[..., D_LATENT : D_LATENT + 16].contiguous().view(torch.float32)
        lat = (lat.unflatten(-1, (4, 128)) * sc.unsqueeze(-1)).flatten(-2)
        rope = raw[..., D_LATENT + 16 :].contiguous().view(torch.bfloat16)
        return torch.cat([lat.to(torch.bfloat16), rope], dim=-1)

    return gather_fp8


def time_reference(torch: Any, cp: Any, pool: Any, sets: list, kv_dtype: str, scale: float, reps: int) -> tuple[float, float]:
    """(median us per call, rel. difference kernel vs reference on set 0)."""
    pool_t = torch.from_dlpack(pool.view(cp.int16)).view(torch.bfloat16) if kv_dtype == "bf16" else torch.from_dlpack(pool)
    gather = torch_row_gather(torch, pool_t, kv_dtype)
    tsets = [(torch.from_dlpack(q.view(cp.int16)).view(torch.bfloat16), torch.from_dlpack(slots)) for q, slots, *_ in sets]
    cp.cuda.Device().synchronize()

    def run_all() -> None:
        for q_t, s_t in tsets:
            torch_reference(torch, q_t, gather, s_t, scale)

    times = time_calls_torch(torch, run_all, reps, warmup=2)
    ref_out, _ = torch_reference(torch, tsets[0][0], gather, tsets[0][1], scale)
    got = torch.from_dlpack(sets[0][2].view(cp.int16)).view(torch.bfloat16).float()
    rel = float((got - ref_out.float()).norm() / ref_out.float().norm())
    return statistics.median(times) / len(sets) * 1e6, rel


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/sparse_attention-h200.csv"))
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64, 128])
    ap.add_argument("--heads", type=int, nargs="+", default=[8, 16, 64, 128])
    ap.add_argument("--kv-dtypes", nargs="+", default=["bf16", "fp8"])
    ap.add_argument("--sets", type=int, default=4, help="rotating input sets per timed call group")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--ref-reps", type=int, default=10)
    ap.add_argument("--no-graph", action="store_true", help="time plain launches, not a CUDA graph")
    ap.add_argument("--no-ref", action="store_true", help="skip the PyTorch reference (ref_us = nan)")
    ap.add_argument("--variants", nargs="+", choices=list(WIDE_VARIANTS), default=list(WIDE_VARIANTS),
                    help="wide-kernel variants to time side by side on the same inputs (H a multiple of "
                         f"64; default: all, {', '.join(WIDE_VARIANTS)}); the PyTorch reference is "
                         "compared with the first")
    ap.add_argument("--narrow-variants", nargs="+", choices=list(NARROW_VARIANTS), default=list(NARROW_VARIANTS),
                    help=f"narrow-kernel variants likewise (other H; default: all, {', '.join(NARROW_VARIANTS)})")
    args = ap.parse_args(argv)
    import cupy as cp  # after the arguments: --help works without a GPU, as in the other benchmarks
    import torch

    bw = measure_copy_bandwidth(cp)
    rate = measure_gemm_rate(torch)
    print(f"{torch.cuda.get_device_name()}: HBM copy {bw / 1e9:.0f} GB/s, bf16 GEMM {rate / 1e12:.0f} TFLOP/s")
    scale = D_QK**-0.5
    rows = []
    for kv_dtype in args.kv_dtypes:
        for batch in args.batches:
            for heads in args.heads:
                pool, sets = make_sets(cp, batch, heads, kv_dtype, args.sets)
                cp.cuda.Device().synchronize()  # inputs are made on the null stream
                wide = heads % HEADS_PER_CTA == 0
                variants = ([v for v in args.variants if WIDE_VARIANTS[v].runs(kv_dtype, heads)] if wide
                            else args.narrow_variants)  # wsx: FP8, H a multiple of 128
                for vi, variant in enumerate(variants):
                    us = time_kernel(cp, pool, sets, kv_dtype, scale, args.reps, not args.no_graph,
                                     variant if wide else None, None if wide else variant)
                    # the reference once per shape, against the first variant's output
                    ref_us, rel = (float("nan"), float("nan")) if args.no_ref or vi > 0 else time_reference(
                        torch, cp, pool, sets, kv_dtype, scale, args.ref_reps)
                    roof = 1e6 * max(attention_min_bytes(batch, heads, K, kv_dtype) / bw,
                                     attention_flops(batch, heads, K) / rate)
                    tflops = attention_flops(batch, heads, K) / us * 1e-6
                    tbps = gathered_kv_bytes(batch, K, kv_dtype) / us * 1e-6
                    rows.append((batch, heads, K, kv_dtype, variant, us, ref_us, roof, tflops, tbps))
                    print(f"B={batch:4d} H={heads:3d} {kv_dtype:4s} {variant:6s} kernel {us:8.1f} us  torch {ref_us:8.1f} us  "
                          f"roofline {roof:7.1f} us  {100 * roof / us:5.1f}% roof  x{ref_us / us:5.1f}  "
                          f"{tflops:6.1f} TFLOP/s  {tbps:5.2f} TB/s KV  |kernel-torch|/|torch| {rel:.1e}", flush=True)
                del pool, sets
                cp.get_default_memory_pool().free_all_blocks()
                torch.cuda.empty_cache()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["B", "H", "K", "kv_dtype", "variant", "us", "ref_us", "roofline_us", "tflops", "kv_tbps"])
        for b, h, k, d, v, us, ref_us, roof, tf, tb in rows:
            w.writerow([b, h, k, d, v, f"{us:.1f}", f"{ref_us:.1f}", f"{roof:.1f}", f"{tf:.1f}", f"{tb:.2f}"])
    print(f"\nwrote {args.out}\n")
    print(f"(default variants: wide {DEFAULT_WIDE_VARIANT}, narrow {DEFAULT_NARROW_VARIANT})")
    print("| B | H | kv | variant | kernel us | torch us | roofline us | % roofline | speed-up | TFLOP/s | KV TB/s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for b, h, _, d, v, us, ref_us, roof, tf, tb in rows:
        print(f"| {b} | {h} | {d} | {v} | {us:.1f} | {ref_us:.1f} | {roof:.1f} | {100 * roof / us:.0f}% | "
              f"{ref_us / us:.1f}x | {tf:.0f} | {tb:.2f} |")
    return 0 if all(math.isfinite(r[5]) for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
