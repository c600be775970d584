"""``hisparse sweep``: many replay or plan points, on Ray."""

from __future__ import annotations

import argparse
import os


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sweep", help="run a grid of replay or plan points on Ray (resumable)",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Expand a grid file (any option of replay or plan may be a list) into points "
                                   "and run them on Ray: a local instance by default, or an existing cluster "
                                   "with --address. Each finished point is written at once (OUT/parts/); "
                                   "OUT/results.parquet holds one row per point, inputs and outputs. A failing "
                                   "point records its error and the sweep goes on.\n\nGrid file:\n"
                                   "  kind = \"replay\"\n  [fixed]\n  trace = \"traces/synthetic-dsa-like.hst\"\n"
                                   "  [grid]\n  policy = [\"lru\", \"opt\"]\n  buffer = [2048, 4096]")
    p.add_argument("grid", metavar="GRID.toml", help="grid file")
    p.add_argument("--out", default="sweep-out", metavar="DIR", help="output folder (default sweep-out)")
    p.add_argument("--address", default=None, help="Ray cluster address (default: start a local instance)")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 2, help="CPUs of the local Ray instance")
    p.add_argument("--resume", action="store_true", help="skip points already finished in --out")
    p.add_argument("--no-ray", dest="use_ray", action="store_false", help="run the points in this process")
    p.add_argument("--max-points", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(run=run_sweep_cmd)


def run_sweep_cmd(args: argparse.Namespace) -> int:
    import sys

    from ..sweep.grid import load_grid
    from ..sweep.runner import run_sweep

    grid = load_grid(args.grid)

    def bar(total: int, done: int):
        if args.quiet or not sys.stderr.isatty():
            return None
        from tqdm import tqdm

        return tqdm(total=total, initial=done, desc="points", unit="pt", file=sys.stderr)

    table = run_sweep(grid, args.out, address=args.address, workers=args.workers, resume=args.resume,
                      use_ray=args.use_ray, max_points=args.max_points, progress=bar)
    failed = int((table["error"] != "").sum()) if "error" in table else 0
    print(f"{len(table)} of {len(grid.points)} points in {os.path.join(args.out, 'results.parquet')}"
          f" ({failed} failed)")
    return 0
