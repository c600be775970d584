"""Time DeepGEMM's SM90 `fp8_mqa_logits`, the lightning indexer's scoring in SGLang's prefill, at the
shapes the serving model prices a prompt chunk's indexer at.

Usage (on one H100 / H200, with the DeepGEMM build SGLang pins installed; nothing of it is committed here):
  pip install --no-deps sgl_deep_gemm-0.1.3-*.whl apache_tvm_ffi-0.1.9-*.whl   # SGLang 0.5.14's pins
  python benchmarks/deepgemm_mqa_logits.py [--heads 64 32] [--chunk 4096] [--contexts 4096 32768 163840]

Why: SGLang's DSA indexer scores a prompt chunk with `deep_gemm.fp8_mqa_logits(q, (k, k_scale), weights,
ks, ke, clean_logits=False)` (`layers/attention/dsa/dsa_indexer.py` `_get_topk_ragged`): per query i and
key j in [ks_i, ke_i), logit = sum over heads h of w[i, h] x relu(q[i, h] . k[j] x k_scale[j]) in fp32.
The serving model prices it from this benchmark's table (`simulator/costmodel/prompt_chunk.py`, measured
on an H200 2026-12-07: 2 x heads x 128 FLOPs per (query, key) pair over the measured rate); before it, at the
calibration's fitted FP8 GEMM rate, with the ReLU, multiply and sum over the heads per score beside the tensor
cores unmeasured. This times the kernel at one request's chunk: queries at positions ctx - chunk .. ctx - 1, ks 0, ke
position + 1 (causal), q e4m3 [chunk, heads, 128], k e4m3 [ctx, 128] with an fp32 scale per key,
weights fp32 [chunk, heads] (SGLang's shapes: DeepSeek-V3.2 64 indexer heads, GLM-5.x 32).
TFLOP/s = 2 x heads x 128 x (causal pairs) / time. Timing: a CUDA graph of --sets launches over
rotating key copies (no call's keys in L2 for the next), replayed --reps times, median per launch.
Check, per shape: 4 rows of logits against a float32 reference of the same formula, within REL_TOL.

Exit status: 0, every check passed; 1, a check or a launch failed (the CSV holds what was timed);
2, bad arguments, or no PyTorch / Hopper GPU / deep_gemm.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.fetched_build import UsageError, hopper_deep_gemm  # noqa: E402
from cupy_kernels.timing import l2_cold_sets, time_calls_torch, torch_graph  # noqa: E402

HEAD_DIM = 128
HEADS = (32, 64)  # GLM-5.x and DeepSeek-V3.2 indexer heads
REL_TOL = 2e-2


def causal_pairs(chunk: int, ctx: int) -> int:
    """(query, key) pairs a chunk of ``chunk`` queries ending at ``ctx`` scores: position p sees p + 1 keys."""
    first = ctx - chunk
    return chunk * (first + 1) + chunk * (chunk - 1) // 2


def logits_flops(chunk: int, ctx: int, heads: int) -> float:
    """Tensor-core FLOPs of the scores: 2 x heads x 128 per causal pair."""
    return 2.0 * heads * HEAD_DIM * causal_pairs(chunk, ctx)


def reference(torch: Any, q: Any, k: Any, k_scale: Any, w: Any) -> Any:
    """float32 logits [rows, keys]: sum_h w[r, h] relu(q[r, h] . k[j] x k_scale[j])."""
    s = torch.einsum("rhd,kd->rhk", q.float(), k.float()) * k_scale.float()[None, None, :]
    return (torch.relu(s) * w.float()[:, :, None]).sum(dim=1)


class Row(NamedTuple):
    heads: int
    chunk: int
    ctx: int
    sets: int
    us: float
    rel_err: float

    @property
    def tflops(self) -> float:
        return logits_flops(self.chunk, self.ctx, self.heads) / (self.us * 1e-6) / 1e12

    @property
    def ok(self) -> bool:
        return self.rel_err <= REL_TOL


def run_shape(torch: Any, dg: Any, heads: int, chunk: int, ctx: int, args: argparse.Namespace, l2: int) -> Row:
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(args.seed)
    fp8 = torch.float8_e4m3fn
    q = (torch.randn((chunk, heads, HEAD_DIM), generator=gen, device=dev) * 0.5).to(fp8)
    sets = l2_cold_sets(ctx * (HEAD_DIM + 4), l2)
    keys = [(torch.randn((ctx, HEAD_DIM), generator=gen, device=dev) * 0.5).to(fp8) for _ in range(sets)]
    scales = [torch.rand((ctx,), generator=gen, device=dev) * 0.1 + 0.01 for _ in range(sets)]
    w = torch.randn((chunk, heads), generator=gen, device=dev) * 0.1
    positions = torch.arange(ctx - chunk, ctx, device=dev, dtype=torch.int32)
    ks = torch.zeros((chunk,), dtype=torch.int32, device=dev)
    ke = positions + 1
    out = dg.fp8_mqa_logits(q, (keys[0], scales[0]), w, ks, ke, clean_logits=False)
    torch.cuda.synchronize()
    rows = [0, 1, chunk // 2, chunk - 1]
    rel = 0.0
    for r in rows:
        n = int(ke[r])
        ref = reference(torch, q[r:r + 1], keys[0][:n], scales[0][:n], w[r:r + 1])[0]
        got = out[r, :n].float()
        rel = max(rel, float(torch.linalg.norm(got - ref) / torch.linalg.norm(ref)) if torch.isfinite(got).all()
                  else math.inf)
    del out
    graph, outs = torch_graph(torch, lambda s: dg.fp8_mqa_logits(q, (keys[s], scales[s]), w, ks, ke, clean_logits=False),
                              sets)
    times = time_calls_torch(torch, graph.replay, args.reps, warmup=1)
    del graph, outs
    return Row(heads, chunk, ctx, sets, float(np.median(times)) * 1e6 / sets, rel)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--heads", type=int, nargs="+", default=[64, 32], help=f"indexer heads, each one of {HEADS}")
    ap.add_argument("--chunk", type=int, default=4096, help="query tokens per launch (SGLang: the chunk per rank)")
    ap.add_argument("--contexts", type=int, nargs="+", default=[4096, 16384, 32768, 65536, 163840],
                    help="prompt length at the chunk's end (each >= --chunk)")
    ap.add_argument("--reps", type=int, default=20, help="graph replays timed per shape")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/deepgemm_mqa_logits.csv"))
    args = ap.parse_args(argv)
    if any(h not in HEADS for h in args.heads):
        raise UsageError(f"--heads must each be one of {HEADS}, got {args.heads}")
    if args.chunk < 4:
        raise UsageError(f"--chunk must be >= 4 (the check reads 4 rows), got {args.chunk}")
    short = [c for c in args.contexts if c < args.chunk]
    if short:
        raise UsageError(f"--contexts must each be >= --chunk {args.chunk}, got {short}")
    if args.reps < 1:
        raise UsageError(f"--reps must be >= 1, got {args.reps}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parse_args(argv)
        torch, dg = hopper_deep_gemm()
    except UsageError as exc:
        print(f"deepgemm_mqa_logits: {exc}", file=sys.stderr)
        return 2
    props = torch.cuda.get_device_properties(0)
    l2 = int(getattr(props, "L2_cache_size", 50 * 2**20))
    print(f"{props.name} ({props.multi_processor_count} SMs); deep_gemm {getattr(dg, '__version__', '?')} from "
          f"{Path(dg.__file__).parent}", flush=True)
    rows: list[Row] = []
    failed = ""
    for heads in args.heads:
        for ctx in args.contexts:
            try:
                r = run_shape(torch, dg, heads, args.chunk, ctx, args, l2)
            except Exception as exc:  # a launch or CUDA error: keep what was measured, say where it stopped
                failed = f"h={heads} ctx={ctx}: {type(exc).__name__}: {str(exc)[:400]}"
                print(f"deepgemm_mqa_logits: stopped at {failed}", file=sys.stderr, flush=True)
                break
            rows.append(r)
            print(f"h {heads} ctx {ctx}: {r.us:.1f} us, {r.tflops:.0f} TFLOP/s, x {r.sets}, rel err {r.rel_err:.1e}",
                  flush=True)
            torch.cuda.empty_cache()
        if failed:
            break
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", newline="") as f:
        wr = csv.writer(f)
        wr.writerow(["device", "heads", "chunk", "ctx", "pairs", "sets", "us", "tflops", "rel_err"])
        for r in rows:
            wr.writerow([props.name, r.heads, r.chunk, r.ctx, causal_pairs(r.chunk, r.ctx), r.sets, f"{r.us:.1f}",
                         f"{r.tflops:.1f}", f"{r.rel_err:.2e}"])
    print(f"\nwrote {args.out}")
    print("| heads | ctx | us | TFLOP/s | check |\n|---|---|---|---|---|")
    for r in rows:
        print(f"| {r.heads} | {r.ctx} | {r.us:.0f} | {r.tflops:.0f} | {'ok' if r.ok else f'FAILED {r.rel_err:.1e}'} |")
    if failed:
        print(f"stopped at {failed}")
    return 0 if rows and not failed and all(r.ok for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
