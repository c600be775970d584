"""Time the GPU idle gap of DeepEP normal-mode dispatch's host wait, and eager launch costs.

DeepEP's normal ``Buffer.dispatch`` without ``num_worst_tokens`` (SGLang's extend passes under
``--moe-a2a-backend deepep``) launches ``notify_dispatch``, then the CPU busy-waits on a counter in
mapped pinned memory (``moe_recv_counter``, written by the GPU) before it allocates the receive
tensors and launches the dispatch kernel (deepseek-ai/DeepEP ``csrc/legacy/buffer.hpp``
``intranode_dispatch``: "Synchronize total received tokens and tokens per expert"). The GPU has
nothing queued during that wait, so each MoE layer of such a pass exposes the time from the GPU's
write of the counter to the start of the next kernel. This script times that gap on one GPU:

- ``sync_gap``: kernel A spins a while (so the CPU is already waiting), then writes a flag into
  mapped pinned memory; the CPU polls it, allocates ``--allocs`` CUDA tensors (DeepEP's receive
  tensors: recv_x, its scales, src_idx, topk_idx, topk_weights, channel prefix matrix, send_head)
  and launches kernel B. CUDA events around the gap give the GPU-side idle time.
- ``eager_launch``: CPU time per back-to-back launch of a small PyTorch op (GPU never the limit),
  the rate at which an eager pass issues kernels.

    python benchmarks/host_sync.py --out benchmarks/results/host_sync-h100.csv

Needs CuPy (the flag-writing kernel) and PyTorch on the GPU machine.
"""

from __future__ import annotations

import argparse
import csv
import ctypes
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.machine import cpu_name  # noqa: E402

_SPIN_THEN_FLAG = r"""
extern "C" __global__ void spin_then_flag(unsigned long long host_flag, long long cycles, int value) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) { }
    volatile int* f = (volatile int*)host_flag;
    __threadfence_system();
    *f = value;
    __threadfence_system();
}
"""


def sync_gap(reps: int, allocs: int, spin_us: float) -> list[float]:
    """GPU idle microseconds between the flag write and the next kernel, ``reps`` times."""
    import cupy as cp
    import torch

    dev = torch.device("cuda")
    stream = torch.cuda.current_stream()
    cstream = cp.cuda.ExternalStream(stream.cuda_stream)
    kern = cp.RawKernel(_SPIN_THEN_FLAG, "spin_then_flag")
    host = cp.cuda.runtime.hostAlloc(64, 2)  # cudaHostAllocMapped; UVA: the same address on the GPU
    flag = ctypes.c_int.from_address(host)
    clock_khz = cp.cuda.runtime.getDeviceProperties(0)["clockRate"]
    cycles = int(spin_us * clock_khz / 1e3)
    tiny = torch.zeros(16, device=dev)
    gaps = []
    for i in range(reps + 5):
        flag.value = -1
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with cstream:
            kern((1,), (1,), (host, cycles, i), stream=cstream)
        e0.record(stream)
        while flag.value != i:  # DeepEP's busy-wait on moe_recv_counter
            pass
        bufs = [torch.empty((1024, 6144), dtype=torch.float8_e4m3fn, device=dev) for _ in range(allocs)]
        e1.record(stream)
        tiny.add_(1.0)  # the dispatch kernel's launch
        torch.cuda.synchronize()
        if i >= 5:
            gaps.append(e0.elapsed_time(e1) * 1e3)
        del bufs
    cp.cuda.runtime.freeHost(host)
    return gaps


def eager_launch(n: int) -> float:
    """CPU microseconds per back-to-back launch of a small elementwise op."""
    import torch

    x = torch.zeros(4096, device="cuda")
    for _ in range(200):
        x.add_(1.0)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        x.add_(1.0)
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=2000)
    ap.add_argument("--allocs", type=int, default=7, help="CUDA tensors allocated after the wait (DeepEP: 7)")
    ap.add_argument("--spin-us", type=float, default=50.0, help="kernel A's spin before it writes the flag")
    ap.add_argument("--out", type=Path, default=None, help="CSV of the figures")
    a = ap.parse_args(argv)
    import torch

    gpu = torch.cuda.get_device_name(0)
    cpu = cpu_name()
    rows = []
    for allocs in (0, a.allocs):
        g = sorted(sync_gap(a.reps, allocs, a.spin_us))
        rows.append({"what": f"sync_gap_allocs{allocs}", "median_us": statistics.median(g),
                     "p10_us": g[len(g) // 10], "p90_us": g[9 * len(g) // 10], "n": len(g)})
    per = sorted(eager_launch(5000) for _ in range(5))
    rows.append({"what": "eager_launch_add", "median_us": statistics.median(per), "p10_us": per[0],
                 "p90_us": per[-1], "n": 5})
    for r in rows:
        r.update(gpu=gpu, cpu=cpu, torch=torch.__version__)
        print(f"{r['what']:22s} median {r['median_us']:7.2f} us  p10 {r['p10_us']:7.2f}  p90 {r['p90_us']:7.2f}"
              f"  ({gpu}; {cpu})")
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        with a.out.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
