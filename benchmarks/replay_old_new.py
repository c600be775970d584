"""`hisparse replay` of one checkout against another (e.g. before and after a change), whole
processes, interleaved, on the rows users wait on; medians of wall and CPU (user + system).

    git archive COMMIT simulator traces setup.py pyproject.toml | tar -x -C OLD
    (cd OLD && python setup.py build_ext --inplace -q)
    python benchmarks/replay_speed.py --rows npy --repeats 1   # makes the .npy files once
    python benchmarks/replay_old_new.py OLD [--repeats 3] [--rows "glm51 batched,..."]

Rows: batched and sequential LRU on the bundled glm51-longbench trace, a plain .npy stream,
sequential and batched OPT / LFU on the high-overlap trace, batched OPT on glm51-longbench.

Each checkout runs from its own folder with PYTHONPATH set to itself (``python -m`` puts the
working folder first on sys.path) on its own bundled traces (``{traces}`` in a row: a checkout
reads the trace format it ships; the rows assert the same misses); the .npy files are shared.
OLD needs its ``traces/`` too: ``git archive COMMIT simulator traces setup.py pyproject.toml``.
"""

from __future__ import annotations

import argparse
import compileall
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def rows(data: Path) -> dict[str, list[str]]:
    glm, dsa = "{traces}/glm51-longbench.hst", "{traces}/synthetic-dsa-like.hst"
    seq = ["--semantics", "sequential", "--initial", "empty", "--no-reserve-newest"]
    return {
        "glm51 batched": ["--policy", "lru", "--buffer", "4096", glm],
        "glm51 sequential": ["--policy", "lru", "--buffer", "4096", *seq, glm],
        "npy layer 0 batched": ["--policy", "lru", "--buffer", "1024", "--ctx0", "7168",
                                str(data / "smollm2-gpl3-k512-layer0.npy")],
        "dsa-like OPT sequential": ["--policy", "opt", "--buffer", "4096", *seq, dsa],
        "dsa-like LFU sequential": ["--policy", "lfu", "--buffer", "4096", *seq, dsa],
        "dsa-like OPT batched": ["--policy", "opt", "--buffer", "4096", dsa],
        "dsa-like LFU batched": ["--policy", "lfu", "--buffer", "4096", dsa],
        "glm51 OPT batched": ["--policy", "opt", "--buffer", "4096", glm],
    }


def run(checkout: Path, args: list[str]) -> tuple[float, float, str]:
    args = [a.replace("{traces}", str(checkout / "traces")) for a in args]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "simulator.cli", "replay", "--quiet", *args],
                         cwd=checkout, env={**os.environ, "PYTHONPATH": str(checkout)}, capture_output=True, text=True,
                         check=True).stdout
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, out.splitlines()[-1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("old", type=Path, help="the other checkout (its C extension built in place)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rows", default=None, help="comma-separated row names (default all)")
    args = parser.parse_args()
    from simulator.serving.misses import cache_dir

    table = rows(cache_dir() / "bench-speed")
    names = args.rows.split(",") if args.rows else list(table)
    for checkout in (args.old, ROOT):
        compileall.compile_dir(checkout / "simulator", quiet=1)
    print("| row | old wall / CPU s | new wall / CPU s | old / new, wall | CPU |")
    print("|---|---|---|---|---|")
    for name in names:
        got: dict[str, list[tuple[float, float]]] = {"old": [], "new": []}
        last = {}
        for checkout in (args.old, ROOT):  # untimed: numba compiles a checkout's policies on first use
            run(checkout, table[name])
        for _ in range(args.repeats):
            for tag, checkout in (("old", args.old), ("new", ROOT)):
                wall, cpu, last[tag] = run(checkout, table[name])
                got[tag].append((wall, cpu))
        assert last["old"] == last["new"], (name, last)  # the same summary row: same misses
        (ow, oc), (nw, nc) = ([statistics.median(x[i] for x in got[t]) for i in (0, 1)] for t in ("old", "new"))
        print(f"| {name} | {ow:.2f} / {oc:.2f} | {nw:.2f} / {nc:.2f} | {ow / nw:.2f}x | {oc / nc:.2f}x |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
