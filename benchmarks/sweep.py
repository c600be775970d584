"""Sweep speed: points/s on a local Ray instance (2 workers, start-up included) against a plain
single-process loop over the same grid, same run.

    python benchmarks/sweep.py
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

GRID = """kind = "replay"
[fixed]
trace = "traces/synthetic-dsa-like.hst"
[grid]
policy = ["lru", "fifo", "clock", "sieve", "random", "arc"]
buffer = [2048, 3072, 4096, 6144]
"""


def main() -> int:
    from simulator.sweep.grid import load_grid
    from simulator.sweep.points import run_point
    from simulator.sweep.runner import run_sweep

    with tempfile.TemporaryDirectory() as d:
        grid_path = Path(d) / "grid.toml"
        grid_path.write_text(GRID)
        grid = load_grid(grid_path)
        run_point("replay", grid.points[0])  # warm the compiled replay (numba cache) once
        t0 = time.perf_counter()
        plain = [run_point(grid.kind, p) for p in grid.points]
        t_plain = time.perf_counter() - t0
        t0 = time.perf_counter()
        table = run_sweep(grid, Path(d) / "ray", workers=2, use_ray=True)
        t_ray = time.perf_counter() - t0
    assert [r["misses"] for r in plain] == table["misses"].tolist()
    n = len(grid.points)
    print(f"{n} replay points (6 policies x 4 buffers, traces/synthetic-dsa-like.hst), {os.cpu_count()} cores\n")
    print("| runner | wall s | points/s |")
    print("|---|---|---|")
    print(f"| plain loop, one process | {t_plain:.1f} | {n / t_plain:.2f} |")
    print(f"| hisparse sweep, local Ray, 2 workers (start-up included) | {t_ray:.1f} | {n / t_ray:.2f} |")
    print(f"\nRay / plain points/s: {t_plain / t_ray:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
