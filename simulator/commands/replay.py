"""``hisparse replay`` and ``hisparse mrc``: exact misses for policies and buffer sizes."""

from __future__ import annotations

import argparse
import os

from ..replay.config import Initial, Semantics
from ..replay.policies import POLICIES, help_text
from .common import add_trace_input, open_input, print_json


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one value")
    return values


def _str_list(text: str) -> list[str]:
    return [v.strip() for v in text.split(",") if v.strip()]


def _add_step_rules(p: argparse.ArgumentParser) -> None:
    p.add_argument("--semantics", choices=[m.value for m in Semantics], default=Semantics.BATCHED.value,
                   help="batched: HiSparse's step (hits protected, miss i takes the i-th victim; "
                        "default); sequential: one access at a time (classic, as libCacheSim)")
    p.add_argument("--initial", choices=[m.value for m in Initial], default=Initial.PREFIX.value,
                   help="initial buffer: prefix (colocated: first prompt positions; default) or "
                        "empty (disaggregated decode)")
    p.add_argument("--no-reserve-newest", dest="reserve_newest", action="store_false",
                   help="treat the newest token as an ordinary access (default: it sits in a reserved slot)")
    p.add_argument("--seed", type=int, default=0, help="seed for the random policy (default 0)")
    p.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1),
                   help="threads replaying streams in parallel (default: 2 or the core count)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def add_parsers(sub: argparse._SubParsersAction) -> None:
    rp = sub.add_parser("replay", help="exact misses per step for policies x buffer sizes",
                        description="Replay a trace through per-(request, layer) hot buffers and count "
                                    "the misses at every step, for each policy and buffer size.")
    add_trace_input(rp)
    rp.add_argument("--policy", type=_str_list, default=["lru"], help=f"comma-separated (default lru); {help_text()}")
    rp.add_argument("--buffer", type=_int_list, default=[4096], help="comma-separated buffer sizes in slots (default 4096)")
    _add_step_rules(rp)
    rp.add_argument("--json", action="store_true", help="print the summary as a JSON list of records")
    rp.add_argument("--out", metavar="PATH", help="write per-step misses (request, layer, step, ctx_len, "
                                                 "policy, buffer, misses) to .parquet or .csv")
    rp.add_argument("--plot", metavar="PNG", help="plot misses per step, rolling mean, per policy x buffer")
    rp.add_argument("--window", type=int, default=100, help="rolling window of --plot, in steps (default 100)")
    rp.set_defaults(run=run_replay)

    mp = sub.add_parser("mrc", help="miss-ratio curve: misses for every buffer size",
                        description="Misses against buffer size. Sequential LRU from an empty buffer "
                                    "is a stack algorithm: one pass gives every size exactly. Batched "
                                    "(HiSparse) order breaks stack inclusion, so batched LRU, OPT and "
                                    "prefix-initialised buffers are replayed size by size on a grid "
                                    "(--step); the output says which method ran.")
    add_trace_input(mp)
    mp.add_argument("--policy", type=_str_list, default=["lru"], help=f"comma-separated, of: {', '.join(POLICIES)} (default lru)")
    mp.add_argument("--min-buffer", type=int, default=None, help="smallest size (default k)")
    mp.add_argument("--max-buffer", type=int, default=None, help="largest size (default 4k)")
    mp.add_argument("--step", type=int, default=None,
                    help="grid step for per-size replays (default k/8); the one-pass method gives every size")
    _add_step_rules(mp)
    mp.add_argument("--json", action="store_true", help="print JSON records")
    mp.add_argument("--out", metavar="CSV", help="write the curve (policy, buffer, semantics, accesses, misses, miss_ratio)")
    mp.add_argument("--plot", metavar="PNG", help="plot miss ratio against buffer size")
    mp.set_defaults(run=run_mrc)


def _configs(args, policies, buffers):
    from ..replay.config import expand_configs

    return expand_configs(policies, buffers, semantics=args.semantics, initial=args.initial,
                          reserve_newest=args.reserve_newest, seed=args.seed)


def _write_table(df, path: str) -> None:
    from ..errors import HisparseError
    from ..trace.fileio import atomic_output

    if path.endswith(".parquet"):
        with atomic_output(path) as fh:
            df.to_parquet(fh, index=False)
    elif path.endswith(".csv"):
        with atomic_output(path) as fh:
            fh.write(df.to_csv(index=False).encode())
    else:
        raise HisparseError(f"--out {path}: use a .parquet or .csv file name")


def _print_records(records: list[dict], cols: list[str]) -> None:
    """A plain aligned table (no pandas: keeps the command's start-up light)."""
    cells = [[f"{r[c]:.4f}" if isinstance(r[c], float) else str(r[c]) for c in cols] for r in records]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    print("  ".join(c.rjust(w) for c, w in zip(cols, widths, strict=True)))
    for row in cells:
        print("  ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)))


def run_replay(args: argparse.Namespace) -> int:
    from ..replay.api import replay

    trace = open_input(args)
    configs = _configs(args, args.policy, args.buffer)
    want_steps = bool(args.out or args.plot)
    result = replay(trace, configs, per_step=want_steps, workers=args.workers, progress=not args.quiet)
    if want_steps:
        per_step = result.per_step
        if args.out:
            _write_table(per_step, args.out)
        if args.plot:
            from ..replay.plots import plot_rolling_misses

            plot_rolling_misses(per_step, args.plot, window=args.window,
                                title=f"{os.path.basename(args.trace)}, {args.semantics} semantics")
    cols = ["policy", "buffer", "semantics", "streams", "steps", "accesses", "misses", "miss_ratio"]
    rows = [{c: r[c] for c in cols} for r in result.records]
    if args.json:
        print_json(rows)
    else:
        _print_records(rows, cols)
    return 0


def run_mrc(args: argparse.Namespace) -> int:
    import pandas as pd

    from ..errors import HisparseError
    from ..replay.mrc import miss_ratio_curve, one_pass_applies

    trace = open_input(args)
    k = trace.meta.k
    lo = args.min_buffer or k
    hi = args.max_buffer or 4 * k
    step = args.step or max(1, k // 8)
    if hi < lo:
        raise HisparseError(f"--max-buffer {hi} is below the smallest size {lo}")
    min_ctx = min((int(s.ctx_len.min()) for s in trace if s.steps), default=0)
    curves, methods = [], {}
    for cfg in _configs(args, args.policy, [lo]):
        cfg.check_k(k)
        sizes = list(range(lo, hi + 1)) if one_pass_applies(cfg, min_ctx, hi) else list(range(lo, hi + 1, step))
        if sizes[-1] != hi:
            sizes.append(hi)
        curve, method = miss_ratio_curve(trace, cfg, sizes, k=k, min_ctx=min_ctx, workers=args.workers)
        methods[str(cfg.policy)] = method
        curves.append(curve)
    table = pd.concat(curves, ignore_index=True)
    if args.out:
        _write_table(table, args.out)
    if args.plot:
        from ..replay.plots import plot_miss_ratio_curves

        plot_miss_ratio_curves(table, args.plot, title=f"{os.path.basename(args.trace)}, {args.semantics}")
    if args.json:
        print_json({"methods": methods, "curve": table.to_dict(orient="records")})
    else:
        for policy, method in methods.items():
            print(f"# {policy}: {method}")
        shown = table if len(table) <= 60 else table[table["buffer"] % step == lo % step]
        print(shown.to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    return 0
