"""Time the lightning-indexer kernel (scoring + exact top-2048) on one GPU.

Usage (on the H200):  python benchmarks/indexer.py --out benchmarks/results/indexer-h200.csv

For every batch in {1, 8, 32, 64, 128}, context in {8K, 32K, 64K, 128K, 160K}, query dtype
(bf16, fp8) and heads (32: GLM-5.1, 64: DeepSeek-V3.2) it times, in one process:
- the kernel (score + select) and the scoring launch alone, launches queued behind a spin kernel
  so CUDA events time the GPU, median per call, key rows rotating over enough copies that L2
  holds no previous call's rows;
- the peer: the key reads at the HBM copy bandwidth measured at the start of the run (the floor);
  and on a subset, the PyTorch eager version a user would write (dequantise, bmm, relu, weighted
  head sum, torch.topk).
Columns: batch, ctx, q_dtype, heads, us, score_us, torch_us, floor_us, tokens_per_s, key_gbps,
hbm_pct (key bytes / us against the copy bandwidth), score_hbm_pct.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cupy_kernels.indexer import HEAD_DIM, ROW_BYTES, lightning_indexer, random_key_rows  # noqa: E402
from simulator.calibration.measure import hbm_gbps, time_queued  # noqa: E402
from simulator.calibration.step_measure import rotating  # noqa: E402

BATCHES = (1, 8, 32, 64, 128)
CONTEXTS = (8192, 32768, 65536, 131072, 163840)
L2_FLUSH_BYTES = 256 << 20


def run(cp: Any, torch: Any | None, out: Path, reps: int, quick: bool) -> list[dict]:
    hbm = hbm_gbps(cp) * 1e9
    print(f"HBM copy {hbm / 1e9:.0f} GB/s", flush=True)
    biggest = max(BATCHES) * max(CONTEXTS)
    pool = random_key_rows(cp, biggest + 64 * max(CONTEXTS), seed=1)
    rows = []
    batches, contexts = ((1, 32, 128), (8192, 65536, 163840)) if quick else (BATCHES, CONTEXTS)
    for q_dtype in ("fp8", "bf16"):
        for heads in (32, 64):
            for b in batches:
                for ctx in contexts:
                    rows.append(_one(cp, torch, pool, b, ctx, heads, q_dtype, reps, hbm))
                    r = rows[-1]
                    print(f"{q_dtype:4s} H {heads} B {b:3d} ctx {ctx:6d}: {r['us']:9.1f} us (score {r['score_us']:8.1f}), "
                          f"{r['tokens_per_s'] / 1e9:6.2f} Gtok/s, keys {r['hbm_pct']:5.1f}% of HBM "
                          f"(score alone {r['score_hbm_pct']:5.1f}%)"
                          + (f", torch {r['torch_us']:.0f} us" if r["torch_us"] else ""), flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as fh:
        wr = csv.DictWriter(fh, fieldnames=list(rows[0]))
        wr.writeheader()
        wr.writerows(rows)
    return rows


def _one(cp, torch, pool, b, ctx, heads, q_dtype, reps, hbm) -> dict:
    import numpy as np

    per_set = b * ctx
    sets = max(1, min(reps, -(-L2_FLUSH_BYTES // (per_set * ROW_BYTES)), pool.shape[0] // per_set))
    keys = [pool[i * per_set:(i + 1) * per_set].reshape(b, ctx, ROW_BYTES) for i in range(sets)]
    rng = np.random.default_rng(b * 7 + ctx)
    if q_dtype == "bf16":
        q = cp.asarray(rng.integers(0x3C00, 0x3F00, (b, heads, HEAD_DIM), dtype=np.uint16))
    else:
        q = cp.asarray(rng.integers(0x20, 0x50, (b, heads, HEAD_DIM), dtype=np.uint8))
    w = cp.asarray(rng.uniform(-0.5, 1.0, (b, heads)).astype(np.float32))
    c = cp.full(b, ctx, cp.int32)
    scores = cp.empty((b, ctx), cp.float32)
    idx = cp.empty((b, 2048), cp.int32)
    full = time_queued(cp, rotating(lightning_indexer, keys, q, w, c, out=idx, scores=scores), reps)
    score = time_queued(cp, rotating(lightning_indexer, keys, q, w, c, scores=scores, select=False), reps)
    torch_us = _torch_peer(torch, keys[0], q, w, ctx, q_dtype) if torch is not None and b in (1, 32, 128) \
        and ctx in (8192, 65536, 163840) and heads == 64 and q_dtype == "fp8" else None
    key_bytes = per_set * ROW_BYTES
    return dict(batch=b, ctx=ctx, q_dtype=q_dtype, heads=heads, us=full, score_us=score, torch_us=torch_us,
                floor_us=key_bytes / hbm * 1e6, tokens_per_s=per_set / (full * 1e-6),
                key_gbps=key_bytes / (full * 1e-6) / 1e9, hbm_pct=100 * key_bytes / (full * 1e-6) / hbm,
                score_hbm_pct=100 * key_bytes / (score * 1e-6) / hbm)


def _torch_peer(torch, keys, q, w, ctx, q_dtype) -> float:
    """PyTorch eager: the same scores and torch.topk (median of 5 event-timed calls)."""
    kt = torch.as_tensor(keys, device="cuda")
    qt = torch.as_tensor(q, device="cuda").view(torch.float8_e4m3fn).to(torch.bfloat16)
    wt = torch.as_tensor(w, device="cuda")

    def call():
        k8 = kt[..., :HEAD_DIM].contiguous().view(torch.float8_e4m3fn).to(torch.bfloat16)
        sc = kt[..., HEAD_DIM:].contiguous().view(torch.float32)[..., 0]
        logits = torch.relu(torch.bmm(k8, qt.transpose(1, 2)).float())  # [B, L, H]
        s = (logits * wt[:, None, :]).sum(-1) * sc
        return torch.topk(s, 2048, dim=-1).indices

    times = []
    for i in range(7):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        call()
        e1.record()
        e1.synchronize()
        if i >= 2:
            times.append(e0.elapsed_time(e1) * 1e3)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/indexer-h200.csv"))
    ap.add_argument("--reps", type=int, default=20, help="timed calls per configuration (default 20)")
    ap.add_argument("--quick", action="store_true", help="3 batches x 3 contexts only")
    ap.add_argument("--no-torch", action="store_true", help="skip the PyTorch eager peer")
    args = ap.parse_args(argv)
    import cupy as cp

    torch = None
    if not args.no_torch:
        try:
            import torch
        except ImportError:
            torch = None
    run(cp, torch, args.out, args.reps, args.quick)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
