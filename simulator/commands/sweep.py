"""``hisparse sweep``: many replay or plan points, on Ray."""

from __future__ import annotations

import argparse
import os
import sys

from ..sweep.address import parse_address
from .common import Output, declare_io, positive_int

# grid keys whose command-line option has another name
OPTION_DEST = {"plan": {"device_buffer_size": "sweep_buffer", "host_to_device_ratio": "sweep_host_ratio"},
               "replay": {}}


def _grid_keys() -> str:
    from ..sweep.grid import OPTIONS

    return "\n".join(f"  {kind}: {', '.join(opts)}" for kind, opts in OPTIONS.items())


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sweep", help="run a grid of replay or plan points on Ray (resumable)",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Expand a grid file (any option of replay or plan may be a list) into points "
                                   "and run them on Ray: a local instance by default, or an existing cluster "
                                   "with --address. Each finished point is written at once (OUT/parts/); "
                                   "OUT/results.parquet holds one row per point, inputs and outputs. A failing "
                                   "point records its error and the sweep goes on; the exit status is 1 if "
                                   "any point failed (0 with --keep-going).\n\nGrid file (the source repository's examples/ has "
                                   "one of each kind; my.hst from hisparse trace gen --preset glm51-longbench "
                                   "--out my.hst):\n"
                                   "  kind = \"replay\"\n  [fixed]\n  trace = \"my.hst\"\n"
                                   "  [grid]\n  policy = [\"lru\", \"opt\"]\n  buffer = [2048, 4096]\n\n"
                                   "Each value of a list once: a value given twice, or one file named two ways (a "
                                   "relative and an absolute path, ./x and x, a preset name and its file), is "
                                   "refused. Paths are relative to the folder the sweep runs in.\n\n"
                                   "Grid keys (the options of hisparse replay / hisparse plan):\n" + _grid_keys())
    p.add_argument("grid", metavar="GRID.toml", help="grid file")
    p.add_argument("--out", default="sweep-out", metavar="DIR", help="output folder (default sweep-out)")
    p.add_argument("--address", type=parse_address, default=None,
                   help="Ray cluster address: host:port (the head's GCS), ray://host[:port], or auto; it must "
                        "answer within HISPARSE_RAY_TIMEOUT seconds, 15 unless set (default: start a local instance)")
    p.add_argument("--workers", type=positive_int, default=None,
                   help="CPUs of the local Ray instance (default: this machine's cores); not with --address or "
                        "--no-ray")
    p.add_argument("--resume", action="store_true", help="skip points already finished in --out")
    p.add_argument("--no-ray", dest="use_ray", action="store_false", help="run the points in this process")
    p.add_argument("--keep-going", action="store_true",
                   help="exit 0 even if some points failed (they are listed and recorded either way)")
    p.add_argument("--max-points", type=positive_int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--report", metavar="FILE.html", default=None,
                   help="also write one self-contained HTML page (plotly.js inlined, no network): every row of "
                        "the results, the failed points with their error, and plots by the grid's kind (replay: "
                        "miss ratio against buffer per policy; plan: throughput and TPOT p99 against the load "
                        "per system and knob set); docs/reports.md")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(run=run_sweep_cmd)
    declare_io(p, inputs=["grid"], outputs=[Output("out", kind="dir", files=("results.parquet", "parts/")),
                                            Output("report", suffixes=(".html", ".htm"))],
               more_inputs=grid_files)


def grid_files(args: argparse.Namespace) -> list[tuple[str, str]]:
    """(where, file) of every file the grid's points read: its traces and, for a plan grid, the
    files behind its preset names. A grid that does not load is left to the run (same error)."""
    from ..errors import HisparseError
    from ..serving.planner import PlanInputs
    from ..serving.presets import NO_FILE, PRESET_KEYS, deployment_files, resolve_or_none
    from ..sweep.grid import load_grid

    try:
        grid = load_grid(args.grid)
    except (HisparseError, OSError, ValueError):
        return []
    found: dict[str, str] = {}
    seen: set[tuple[str, str]] = set()
    for point in grid.points:
        for key, value in point.items():
            if not isinstance(value, str) or (key, value) in seen:
                continue
            seen.add((key, value))
            where = f"{args.grid}: {key} ="
            if key == "trace":
                found.setdefault(value, where)
            elif grid.kind == "plan" and key in PRESET_KEYS and value not in NO_FILE:
                if path := resolve_or_none(PRESET_KEYS[key], value):
                    found.setdefault(str(path), where)
        if grid.kind == "plan":  # what the point's deployment names: its GPU, hisparse config, cluster, calibration
            dep, gpu = point.get("deployment", PlanInputs.deployment), point.get("gpu")
            if ("deployment files", f"{dep}\0{gpu}") not in seen:
                seen.add(("deployment files", f"{dep}\0{gpu}"))
                for key, path in deployment_files(dep, gpu if gpu not in NO_FILE else None):
                    if key != "calibration" or point.get("calibration", "auto") == "auto":
                        found.setdefault(str(path), f"{args.grid}: the {key} deployment {dep!r} reads:")
    return [(where, path) for path, where in found.items()]


def cli_actions(kind: str) -> dict[str, argparse.Action]:
    """The argparse actions of ``hisparse replay`` / ``hisparse plan``, by dest: a grid value is
    parsed by its option's own type (and choices), the one definition of its range."""
    from . import plan, replay
    from .common import Parser

    parser = Parser(prog="hisparse")
    (replay if kind == "replay" else plan).add_parsers(parser.add_subparsers())
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[kind]
    return {a.dest: a for a in sub._actions}


def _check_option(actions: dict, kind: str, key: str, value, path: str) -> None:
    from ..errors import HisparseError

    action = actions.get(OPTION_DEST[kind].get(key, key))
    if action is None:
        return
    if action.type is not None and not isinstance(value, bool):
        try:
            action.type(str(value))
        except argparse.ArgumentTypeError as exc:
            raise HisparseError(f"{path}: {key} = {value!r}: {exc}") from None
    if action.choices is not None and value not in action.choices:
        raise HisparseError(f"{path}: {key} = {value!r}: expected one of {', '.join(map(str, action.choices))}")


def check_values(grid, path: str) -> None:
    """Every point checked as the command itself checks it, before any point runs: each value by
    its option's argparse type, then each point by the command's own up-front checks
    (``replay.check_configs``, ``planner.prepare``: the files it names loaded and checked, buffers
    against k and the trace, the work budgets)."""
    from ..replay.policies import POLICIES
    from ..serving.presets import PRESET_KEYS
    from .common import check_policies

    actions = cli_actions(grid.kind)
    seen: set = set()
    for point in grid.points:
        for key, value in point.items():
            if (key, value) in seen:
                continue
            if key == "policy" and grid.kind == "replay":
                check_policies([value], POLICIES, option=f"{path}: policy")
            elif grid.kind == "plan" and key in PRESET_KEYS:
                _check_preset(key, value, path)
            else:
                _check_option(actions, grid.kind, key, value, path)
            seen.add((key, value))
    if grid.kind == "replay":
        _check_unused_options(grid, path)
    (_check_replay_points if grid.kind == "replay" else _check_plan_points)(grid, path)


def _check_unused_options(grid, path: str) -> None:
    """seed (random) and ways (salru) change only their policy's replay. Given where no point replays it,
    a list of values repeated the same points (each run and recorded, rc 0) and a single value went
    unnoticed; hisparse replay notes such an option unused. A list is refused, a single value warned of."""
    import warnings

    from ..errors import HisparseError
    from ..replay.config import ReplayConfig
    from ..replay.policies import OPTION_USERS

    default = str(ReplayConfig.__dataclass_fields__["policy"].default)
    policies = {str(p.get("policy", default)) for p in grid.points}
    for key, users in OPTION_USERS.items():
        values = sorted({p[key] for p in grid.points if key in p})
        if not values or policies & users:
            continue
        what = f"{key} applies to {', '.join(sorted(users))}, which no point of the grid replays"
        if len(values) > 1:
            raise HisparseError(f"{path}: {key} = {values}: {what} (the points would repeat; give policy "
                                f"{', '.join(sorted(users))}, or drop {key})")
        warnings.warn(f"{path}: {key} = {values[0]} is unused: {what}", stacklevel=1)


def _check_preset(key: str, value: str, path: str) -> None:
    """A plan grid's preset name is shipped, or its path is a file (the presets' own lookup);
    the point checks then load it."""
    from ..errors import HisparseError
    from ..serving.presets import NO_FILE, PRESET_KEYS, resolve

    if key == "calibration" and value in NO_FILE:
        return
    try:
        resolve(PRESET_KEYS[key], value)
    except HisparseError as exc:
        raise HisparseError(f"{path}: {key} = {value!r}: {exc}") from None


def _where(point: dict) -> str:
    return ", ".join(f"{k} = {v!r}" for k, v in sorted(point.items()))


def _check_replay_points(grid, path: str) -> None:
    from ..errors import HisparseError
    from ..sweep.points import replay_config
    from ..trace import open_trace
    from .common import require_accesses
    from .replay import check_configs

    by_trace: dict[str, list] = {}
    for point in grid.points:
        try:
            by_trace.setdefault(point["trace"], []).append(replay_config(point))
        except HisparseError as exc:
            raise HisparseError(f"{path}: point {_where(point)}: {exc}") from None
    for value, configs in by_trace.items():
        if not os.path.isfile(value):
            raise HisparseError(f"{path}: trace = {value!r}: no such file (paths are relative to the "
                                "folder the sweep runs in)")
        try:
            trace = open_trace(value)
            require_accesses(trace, value)
            check_configs(trace, list(dict.fromkeys(configs)), workers=1, option="buffer")
        except HisparseError as exc:
            raise HisparseError(f"{path}: trace = {value!r}: {exc}") from None


def _check_plan_points(grid, path: str) -> None:
    from .. import limits
    from ..errors import HisparseError
    from ..serving.planner import prepare
    from ..sweep.points import plan_inputs

    scenarios: dict = {}
    steps = 0
    for point in grid.points:
        try:
            inp = plan_inputs(point)
            key = (inp.model, inp.gpu, inp.deployment, inp.workload, inp.hisparse, inp.calibration, inp.trace)
            if key not in scenarios:
                if inp.trace:
                    _check_trace(inp.trace, path)
                scenarios[key] = inp.scenario()
            prep = prepare(inp, scenarios[key])
        except HisparseError as exc:
            raise HisparseError(f"{path}: point {_where(point)}: {exc}") from None
        steps += prep.steps
    limits.check(steps, "HISPARSE_MAX_SIM_STEPS", f"{path}: {len(grid.points)} plan points", unit="scheduler steps to simulate",
                 hint="fewer points")


def _check_trace(value: str, path: str) -> None:
    """A grid's trace exists, reads, and holds accesses."""
    from ..errors import HisparseError
    from ..trace import open_trace
    from .common import require_accesses

    if not os.path.isfile(value):
        raise HisparseError(f"{path}: trace = {value!r}: no such file (paths are relative to the "
                            "folder the sweep runs in)")
    try:
        require_accesses(open_trace(value), value)
    except HisparseError as exc:
        raise HisparseError(f"{path}: trace = {value!r}: {exc}") from None


def _print_failures(table, limit: int = 20) -> None:
    """One stderr line per failed point: its options and its error."""
    from ..sweep.grid import OPTIONS

    failed = table[table["error"] != ""]
    for _, row in failed.head(limit).iterrows():
        options = [k for k in OPTIONS[row["kind"]] if k in row.index and row[k] == row[k]]  # not NaN
        where = ", ".join(f"{k}={row[k]}" for k in options)
        print(f"hisparse: point {row['point']} ({where}) failed: {row['error']}", file=sys.stderr)
    if len(failed) > limit:
        print(f"hisparse: ... and {len(failed) - limit} more failed points (see the error column)", file=sys.stderr)


def run_sweep_cmd(args: argparse.Namespace) -> int:
    from ..errors import HisparseError
    from ..sweep.grid import load_grid
    from ..sweep.runner import run_sweep

    ray_only = [o for o, v in (("--address", args.address), ("--workers", args.workers)) if v is not None]
    if not args.use_ray and ray_only:  # were ignored: the points ran here, not on the cluster named
        raise HisparseError(f"{' and '.join(ray_only)}: set{'s' if len(ray_only) == 1 else ''} the Ray cluster; "
                            "not with --no-ray (the points run in this process)")
    if args.address is not None and args.workers is not None:  # was ignored: the cluster's CPUs run the points
        raise HisparseError("--workers: sets the CPUs of the local Ray instance; not with --address (the points "
                            "run on that cluster's CPUs)")
    grid = load_grid(args.grid)
    check_values(grid, args.grid)

    def bar(total: int, done: int):
        if args.quiet or not sys.stderr.isatty():
            return None
        from tqdm import tqdm

        return tqdm(total=total, initial=done, desc="points", unit="pt", file=sys.stderr)

    def report(table) -> None:
        from ..report.sweep_html import sweep_data, write_sweep_report

        write_sweep_report(sweep_data(table, kind=grid.kind, axes=grid.axes, grid=args.grid,
                                      results=os.path.join(args.out, "results.parquet")), args.report)

    table = run_sweep(grid, args.out, address=args.address, workers=args.workers or os.cpu_count() or 2,
                      resume=args.resume, use_ray=args.use_ray, max_points=args.max_points, progress=bar,
                      after=report if args.report else None)  # the report with the results table, as one set
    failed = int((table["error"] != "").sum()) if "error" in table else 0
    if failed:
        _print_failures(table)
    print(f"{len(table)} of {len(grid.points)} points in {os.path.join(args.out, 'results.parquet')}"
          f" ({failed} failed)")
    return 1 if failed and not args.keep_going else 0
