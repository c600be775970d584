"""GPU replay backend against the CPU engine, same streams, same run (issue #30 item 2).

Streams: the 78 layers of traces/glm51-longbench.hst (k 2048, 128 steps each), taken round
robin up to ``--batch`` streams (batch 100: 78 + 22 again). Each case is replayed on the GPU
(``cupy_kernels.sharded_lru.replay``: one launch, one block per stream and config) and on the CPU
(the engine's compiled C batched LRU, ``simulator.native.lru_batched``, one stream at a time on
one core; salru through the numba engine), the per-step misses compared bit for bit, and timed:
accesses per second = accesses x configs / seconds (kernel: device events around the launch;
call: the whole Python call with transfers).

    python benchmarks/gpu_replay.py --batch 100 --out benchmarks/results/gpu_replay-h200.csv
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def load_streams(path: Path, batch: int, steps: int | None) -> list[tuple[np.ndarray, np.ndarray]]:
    from simulator.trace import open_trace

    src = open_trace(path)
    base = [src.read(k) for k in src.keys]
    out = []
    for i in range(batch):
        s = base[i % len(base)]
        n = s.steps if steps is None else min(steps, s.steps)
        out.append((np.ascontiguousarray(s.indices[:n]), np.ascontiguousarray(s.ctx_len[:n])))
    return out


def cpu_misses(streams, cfg) -> tuple[list[np.ndarray], float]:
    from simulator import native
    from simulator.replay.engine import replay_policy

    t0 = time.perf_counter()
    out = []
    for idx, ctx in streams:
        if cfg.ways == cfg.buffer and native.available():
            out.append(native.lru_batched(idx, ctx, cfg.buffer, reserve=cfg.reserve, prefix=cfg.prefix).misses)
        else:
            pol = "lru" if cfg.ways == cfg.buffer else "salru"
            out.append(replay_policy(pol, idx, ctx, cfg.buffer, reserve=cfg.reserve, prefix=cfg.prefix, batched=True,
                                     seed=0, param=cfg.ways if pol == "salru" else 0).misses)
    return out, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", default=str(ROOT / "traces" / "glm51-longbench.hst"))
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 10, 100, 400])
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import cupy as cp
    import pandas as pd

    from cupy_kernels.sharded_lru import ShardConfig, replay
    from simulator import native

    cases = {
        "lru B4096": [ShardConfig(4096, 4096)],
        "salru B4096 W32": [ShardConfig(4096, 32)],
        "lru B2048..8192 (5 sizes)": [ShardConfig(b, b) for b in (2048, 3072, 4096, 6144, 8192)],
    }
    print(f"# {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}, native C built: {native.available()}")
    rows = []
    for batch in args.batch:
        streams = load_streams(Path(args.trace), batch, args.steps)
        acc = sum(int((i >= 0).sum()) for i, _ in streams)
        for name, cfgs in cases.items():
            replay(streams, cfgs)  # warm-up: module load, first touch
            kern, call = [], []
            for _ in range(args.reps):
                t0 = time.perf_counter()
                run = replay(streams, cfgs, check=False)
                call.append(time.perf_counter() - t0)
                kern.append(run.seconds)
            exact, cpu_s = True, 0.0
            if batch <= 100 or name.startswith("lru B4096"):
                for c, cfg in enumerate(cfgs):
                    ref, sec = cpu_misses(streams, cfg)
                    cpu_s += sec
                    exact &= all(np.array_equal(a, b) for a, b in zip(run.misses[c], ref, strict=True))
            total = acc * len(cfgs)
            row = {"case": name, "streams": batch, "accesses": total, "kernel_s": float(np.median(kern)),
                   "call_s": float(np.median(call)), "cpu_1core_s": cpu_s,
                   "gpu_Gacc_per_s": total / np.median(kern) / 1e9, "gpu_call_Gacc_per_s": total / np.median(call) / 1e9,
                   "cpu_Macc_per_s": total / cpu_s / 1e6 if cpu_s else float("nan"),
                   "kernel_vs_cpu": cpu_s / np.median(kern) if cpu_s else float("nan"), "bit_exact": exact}
            rows.append(row)
            print(f"{name:28s} streams {batch:4d}  {total / 1e6:8.1f} M acc  kernel {row['kernel_s'] * 1e3:8.2f} ms "
                  f"({row['gpu_Gacc_per_s']:6.2f} G/s)  call {row['call_s'] * 1e3:8.1f} ms  "
                  f"cpu {cpu_s:7.3f} s ({row['cpu_Macc_per_s']:6.1f} M/s)  x{row['kernel_vs_cpu']:7.1f}  exact={exact}",
                  flush=True)
    if args.out:
        pd.DataFrame(rows).to_csv(args.out, index=False)


if __name__ == "__main__":
    main()
