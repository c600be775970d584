"""How long ``hisparse plan`` (the default scenario) takes, against a fixed SimPy baseline timed in the
same run, so that a loaded or slower machine reads the same ratio (issue 30: plan <= 2 s on 2 cores).

The baseline is a fixed SimPy program (an M/M/c queue: 12,000 customers through 8 servers, seeded;
72,000 events), pure Python and SimPy like the serving model. Every figure is the median of
``--runs`` whole processes (interpreter start-up, imports, the plan's printing included), timed
one after another in the order baseline, plan serial (``HISPARSE_JOBS=1``), plan on every core
(and with ``--against DIR``, the same plan in another checkout, e.g. the code before a change).
The plan's JSON must be the same in every run (and, with ``--expect FILE``, equal to that file).

    python benchmarks/plan_speed.py --runs 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

BASELINE = r"""
import random, simpy
def customer(env, servers, rng):
    with servers.request() as req:
        yield req
        yield env.timeout(rng.expovariate(1.0))
def source(env, servers, rng, n):
    for _ in range(n):
        env.process(customer(env, servers, rng))
        yield env.timeout(rng.expovariate(7.5))
rng = random.Random(0)
env = simpy.Environment()
servers = simpy.Resource(env, capacity=8)
env.process(source(env, servers, rng, 12000))
env.run()
"""


def _timed(cmd: list[str], env: dict[str, str] | None = None, cwd: Path = ROOT) -> tuple[float, float, bytes]:
    """(wall s, CPU s of the process and its children, stdout)."""
    before = os.times()
    t0 = time.perf_counter()
    out = subprocess.run(cmd, check=True, capture_output=True, env=env, cwd=cwd).stdout
    wall = time.perf_counter() - t0
    after = os.times()
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    return wall, cpu, out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--expect", type=Path, default=None, help="plan --json output the runs must equal")
    ap.add_argument("--against", type=Path, default=None, help="another checkout whose plan is timed too")
    args = ap.parse_args()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    plan = [sys.executable, "-m", "simulator.cli", "plan", "--quiet", "--json"]
    rows: dict[str, list[tuple[float, float]]] = {"simpy baseline": [], "plan, 1 job": [], "plan, all cores": []}
    if args.against:
        rows["plan, --against"] = []
    outputs = set()
    for _ in range(args.runs):
        w, c, _ = _timed([sys.executable, "-c", BASELINE], env)
        rows["simpy baseline"].append((w, c))
        w, c, out = _timed(plan, dict(env, HISPARSE_JOBS="1"))
        rows["plan, 1 job"].append((w, c))
        outputs.add(out)
        w, c, out = _timed(plan, {k: v for k, v in env.items() if k != "HISPARSE_JOBS"})
        rows["plan, all cores"].append((w, c))
        outputs.add(out)
        if args.against:
            other = {k: v for k, v in env.items() if k != "HISPARSE_JOBS"} | {"PYTHONPATH": str(args.against)}
            w, c, out_other = _timed(plan, other, cwd=args.against)
            rows["plan, --against"].append((w, c))
            if out_other.replace(str(args.against).encode(), str(ROOT).encode()) != out:
                print("note: --against's plan JSON differs from this checkout's", file=sys.stderr)
    if len(outputs) != 1:
        print("FAIL: the plan's JSON differs between runs", file=sys.stderr)
        return 1
    if args.expect is not None and args.expect.read_bytes() != outputs.pop():
        print(f"FAIL: the plan's JSON differs from {args.expect}", file=sys.stderr)
        return 1
    base = statistics.median(w for w, _ in rows["simpy baseline"])
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"{args.runs} runs each, medians; {cpus} CPUs, load average {load:.2f} at the end")
    print(f"{'':<16} {'wall s':>8} {'CPU s':>8} {'x baseline':>11}")
    for name, vals in rows.items():
        w = statistics.median(v[0] for v in vals)
        c = statistics.median(v[1] for v in vals)
        print(f"{name:<16} {w:>8.2f} {c:>8.2f} {w / base:>11.2f}")
    print("plan's JSON identical in every run" + (f" and equal to {args.expect}" if args.expect else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
