"""``hisparse replay`` and ``hisparse mrc``: exact misses for policies and buffer sizes."""

from __future__ import annotations

import argparse
import os
import sys

from ..replay.config import MAX_SEED, Initial, Semantics
from ..replay.policies import POLICIES, help_text
from .common import (
    Output,
    add_trace_input,
    buffer_size,
    check_policies,
    comma_list,
    declare_io,
    int_in,
    open_input,
    positive_int,
    print_json,
)

# Per-size replays of one curve: each is a whole replay of the trace.
MAX_GRID_SIZES = 10_000
# The random policy's generator takes a 32-bit seed (replay/config.py): common.seed_int's 2**63 - 1
# let a larger seed repeat a smaller one's draws without a word.
replay_seed = int_in(0, MAX_SEED, what="a seed from 0 to 2**32 - 1 (the random policy's generator takes 32 bits)")


class _Given(argparse.Action):
    """Stores the value and remembers that the user gave the option (``args.given``): a note
    says when an option given explicitly does not apply (``_print_params``), never a default."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        setattr(namespace, self.dest, values)
        namespace.given = {*getattr(namespace, "given", ()), self.dest}


def _add_step_rules(p: argparse.ArgumentParser) -> None:
    p.add_argument("--semantics", choices=[m.value for m in Semantics], default=Semantics.BATCHED.value,
                   help="batched: HiSparse's step (hits protected, miss i takes the i-th victim; "
                        "default); sequential: one access at a time (classic, as libCacheSim)")
    p.add_argument("--initial", choices=[m.value for m in Initial], default=Initial.PREFIX.value,
                   help="initial buffer: prefix (colocated: first prompt positions; default) or "
                        "empty (disaggregated decode)")
    p.add_argument("--no-reserve-newest", dest="reserve_newest", action="store_false",
                   help="treat the newest token as an ordinary access (default: it sits in a reserved slot)")
    p.add_argument("--seed", type=replay_seed, default=0, action=_Given,
                   help="seed for the random policy, 0 to 2**32 - 1 (default 0)")
    p.add_argument("--ways", type=positive_int, default=32, action=_Given,
                   help="salru: ways per shard; shards = buffer / ways (default 32, as SGLang PR #31341's "
                        "benchmark: 256 x 32 for 8192 slots)")
    p.add_argument("--mtp-steps", type=positive_int, default=1,
                   help="salru, sglang-clock: consecutive trace steps per swap commit, standing in for the "
                        "speculative positions of one MTP step (default 1)")
    p.add_argument("--vs", metavar="POLICY", default=None,
                   help="also replay POLICY (e.g. lru) at each buffer size and report each policy's hit "
                        "penalty against it: hit_penalty = its miss ratio minus POLICY's (points of hit "
                        "ratio lost), miss_x = its misses / POLICY's (inf where POLICY has none, NaN for 0 / 0; "
                        "both null in --json, which has no inf or NaN)")
    p.add_argument("--workers", type=positive_int, default=min(2, os.cpu_count() or 1),
                   help="threads replaying streams in parallel (default 2, or 1 on one core)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Both commands' parsers (``hisparse replay`` and ``hisparse mrc``)."""
    add_replay_parser(sub)
    add_mrc_parser(sub)


def add_replay_parser(sub: argparse._SubParsersAction) -> None:
    rp = sub.add_parser("replay", help="exact misses per step for policies x buffer sizes",
                        description="Replay a trace through per-(request, layer) hot buffers and count "
                                    "the misses at every step, for each policy and buffer size. As in "
                                    "SGLang, a step whose context fits the buffer misses nothing and "
                                    "leaves no recency (the buffer then holds positions 0..buffer-1, "
                                    "0 oldest), so a larger buffer can miss more: LRU's inclusion "
                                    "property does not hold across sizes (docs/replay-engine.md).")
    add_trace_input(rp)
    rp.add_argument("--policy", type=comma_list(str, unique=False), default=["lru"],
                    help=f"comma-separated (default lru); {help_text()}")
    rp.add_argument("--buffer", type=comma_list(buffer_size), default=[4096],
                    help="comma-separated buffer sizes in slots per request and layer (default 4096)")
    _add_step_rules(rp)
    rp.add_argument("--index-share", metavar="FREQ:OFFSET", default=None,
                    help="also count misses per IndexShare group (anchor layers, which run the indexer; shared "
                         "layers, which reuse an anchor's top-k) with config.json's index_topk_freq:"
                         "index_skip_topk_offset (GLM-5.2: 4:3); default: the trace's own (a trace generated "
                         "with --index-share), else no groups")
    rp.add_argument("--json", action="store_true",
                    help="print the summary as a JSON list of records, one per policy x buffer; with IndexShare "
                         "groups (see --index-share) each record also has \"groups\": its records per group")
    rp.add_argument("--backend", choices=["cpu", "gpu"], default="cpu",
                    help="cpu (default) or gpu: batched lru / salru, every stream and buffer in one CUDA launch "
                         "per batch of streams (CuPy, sm_90; the same misses bit for bit)")
    rp.add_argument("--out", metavar="PATH", help="write per-step misses (request, layer, step, ctx_len, "
                                                 "policy, buffer, misses) to .parquet or .csv")
    rp.add_argument("--plot", metavar="PNG", help="plot misses per step, rolling mean, per policy x buffer")
    rp.add_argument("--window", type=positive_int, default=100, action=_Given,
                    help="rolling window of --plot, in steps (default 100)")
    rp.set_defaults(run=run_replay)
    declare_io(rp, inputs=["trace"], outputs=[Output("out", suffixes=(".parquet", ".csv")),
                                              Output("plot", suffixes=(".png",))])


def add_mrc_parser(sub: argparse._SubParsersAction) -> None:
    mp = sub.add_parser("mrc", help="miss-ratio curve: misses for every buffer size",
                        description="Misses against buffer size. Sequential LRU from an empty buffer, "
                                    "and OPT under either semantics and initial buffer, are stack "
                                    "algorithms: one pass gives every size exactly. Batched (HiSparse) "
                                    "order breaks LRU's stack inclusion, so batched LRU, prefix-initialised "
                                    "LRU and the other policies are replayed size by size on a grid "
                                    "(--step; salru's in whole shards of --ways); the output says which "
                                    "method ran. A context that fits the buffer leaves no recency (as in "
                                    "SGLang), so a per-size curve need not fall with size.")
    add_trace_input(mp)
    mp.add_argument("--policy", type=comma_list(str, unique=False), default=["lru"],
                    help=f"comma-separated, of: {', '.join(POLICIES)} (default lru)")
    mp.add_argument("--min-buffer", type=buffer_size, default=None, help="smallest size (default k)")
    mp.add_argument("--max-buffer", type=buffer_size, default=None, help="largest size (default 4k)")
    mp.add_argument("--step", type=positive_int, default=None,
                    help="grid step for per-size replays (default k/8); the one-pass method gives every size")
    _add_step_rules(mp)
    mp.add_argument("--json", action="store_true", help="print JSON records")
    mp.add_argument("--out", metavar="CSV", help="write the curve (policy, buffer, semantics, accesses, misses, miss_ratio)")
    mp.add_argument("--plot", metavar="PNG", help="plot miss ratio against buffer size")
    mp.set_defaults(run=run_mrc)
    declare_io(mp, inputs=["trace"], outputs=[Output("out", suffixes=(".parquet", ".csv")),
                                              Output("plot", suffixes=(".png",))])


def _configs(args: argparse.Namespace, policies: list[str], buffers: list[int],
             option: str = "--buffer") -> list:
    """Every policy x buffer with the step rules of ``args``; a combination the engine refuses
    is an error that names the options which set it (``option``: the one that gave the sizes)."""
    from ..errors import HisparseError
    from ..replay.config import ReplayConfig
    from ..replay.policies import SHARDED

    placed = _placed_policies()
    common = dict(semantics=args.semantics, initial=args.initial, reserve_newest=args.reserve_newest, seed=args.seed,
                  ways=args.ways)
    configs = []
    for p in policies:
        mtp = args.mtp_steps if p in placed else 1
        for b in buffers:
            try:
                configs.append(ReplayConfig(policy=p, buffer=int(b), **common, mtp_steps=mtp))
            except HisparseError as exc:
                given = [f"--policy {p}"] + ([f"{option} {b}", f"--ways {args.ways}"] if p in SHARDED else []) \
                    + ([f"--mtp-steps {mtp}", f"--semantics {args.semantics}"] if mtp > 1 else [])
                raise HisparseError(f"{', '.join(given)}: {exc}") from None
    return configs


def _placed_policies() -> set[str]:
    from ..replay.policies import REGISTRY

    return {e.name for e in REGISTRY if e.placed}


def _with_baseline(args, policies):
    """The policies with --vs's appended (once)."""
    if args.vs is None:
        return policies
    check_policies([args.vs], POLICIES, option="--vs")
    return policies if args.vs in policies else [*policies, args.vs]


def _add_penalty(rows: list[dict], base: str) -> None:
    """hit_penalty (miss ratio minus the baseline's at the same buffer) and miss_x (misses over its; inf over a
    baseline with no misses, NaN for 0 / 0 or no baseline at that buffer)."""
    ref = {r["buffer"]: r for r in rows if r["policy"] == base}
    for r in rows:
        b = ref.get(r["buffer"])
        r["hit_penalty"] = r["miss_ratio"] - b["miss_ratio"] if b else float("nan")
        if not b:
            r["miss_x"] = float("nan")
        elif b["misses"]:
            r["miss_x"] = r["misses"] / b["misses"]
        else:  # as mrc --vs: inf over a baseline with no misses, NaN for 0 / 0
            r["miss_x"] = float("inf") if r["misses"] else float("nan")


def _checked(cfg, k: int, option: str):
    """The config checked against the trace's k; the error names the option that set it."""
    from ..errors import HisparseError

    try:
        cfg.check_k(k)
    except HisparseError as exc:
        raise HisparseError(f"{option} {cfg.buffer} (--policy {cfg.policy}): {exc}") from None
    return cfg


# Memory a replay needs per worker thread, from the engine's allocations (simulator/replay/engine.py
# _replay: per position pw 3 x int64 and pos_slot int64, plus OPT's next-use int64; per slot sw 5 x 8
# int64 words, slot_pos and mark int64). An upper bound for every policy; the C LRU needs less.
BYTES_PER_POSITION = 5 * 8
BYTES_PER_SLOT = (5 * 8 + 2) * 8


def _check_memory(trace, buffer: int, workers: int) -> None:
    """Refuse, before any work, a replay whose context or buffer needs more memory than the
    machine has (a position near 2**31 in a .npy array makes a 2**31-token context)."""
    from .. import limits
    from ..errors import HisparseError

    max_ctx = getattr(trace, "max_ctx", None)
    available = limits.available_memory()
    if max_ctx is None or available is None:
        return
    threads = max(1, min(workers, len(trace)))
    need = threads * (BYTES_PER_POSITION * max_ctx + BYTES_PER_SLOT * min(buffer, max_ctx + 1))
    if need > available:
        raise HisparseError(f"{trace.path}: contexts up to {max_ctx} tokens with buffers up to {buffer} slots need "
                            f"about {need / 2**30:.1f} GiB for {threads} worker(s); {available / 2**30:.1f} GiB "
                            "are available (fewer --workers, or check the trace's positions and --ctx0)")


# The engine allocates a few words per slot (simulator/replay/engine.py: 5 x 8 words of int64 per
# slot, then per-slot arrays): up to 2**20 slots that is a few hundred MB; above it a buffer is
# first checked against the trace's largest context, past which every size misses the same.
LARGE_BUFFER = 2**20


def _check_large_buffers(trace, buffers, option: str = "--buffer", largest: int | None = None) -> None:
    """Refuse a buffer above LARGE_BUFFER that is also above the trace's largest context
    (``largest`` when the caller has it): it misses as that context does, at gigabytes of slots."""
    from ..errors import HisparseError

    big = [b for b in buffers if b > LARGE_BUFFER]
    if not big:
        return
    largest = largest or getattr(trace, "max_ctx", None) or max(int(s.ctx_len.max()) for s in trace if s.steps)
    for b in big:
        if b > largest:
            raise HisparseError(f"{option} {b}: larger than the trace's largest context ({largest}); a buffer "
                                f"of {largest} slots already holds every position (and misses the same), "
                                "while the engine's memory grows with the slots")


def _write_table(df, path: str) -> None:
    """``path`` ends in .parquet or .csv (checked with the other outputs before the replay)."""
    from ..fileio import atomic_output

    with atomic_output(path) as fh:
        if path.lower().endswith(".parquet"):
            df.to_parquet(fh, index=False)
        else:
            fh.write(df.to_csv(index=False).encode())


def _print_records(records: list[dict], cols: list[str]) -> None:
    """A plain aligned table (no pandas: keeps the command's start-up light)."""
    cells = [[f"{r[c]:.4f}" if isinstance(r[c], float) else str(r[c]) for c in cols] for r in records]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    print("  ".join(c.rjust(w) for c, w in zip(cols, widths, strict=True)))
    for row in cells:
        print("  ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)))


def check_configs(trace, configs, workers: int, option: str = "--buffer") -> list:
    """Every check a replay makes before it runs, in one place (``hisparse replay`` and a replay
    sweep grid both call it): each buffer against the trace's k, past its largest context, and
    the memory the largest needs."""
    from .. import limits

    configs = [_checked(c, trace.meta.k, option) for c in configs]
    where = f"{trace.path}: {len(configs)} replay(s) (policies x buffers)"
    limits.check(len(configs), "HISPARSE_MAX_POINTS", where, unit="replays", hint="fewer policies or buffers")
    limits.check(len(configs) * trace.accesses, "HISPARSE_MAX_REPLAY_ACCESSES", f"{where} of {trace.accesses} accesses",
                 unit="accesses to replay", hint="fewer policies or buffers")
    buffers = sorted({c.buffer for c in configs})
    _check_large_buffers(trace, buffers, option)
    _check_memory(trace, max(buffers), workers)
    return configs


def run_replay(args: argparse.Namespace) -> int:
    from ..replay.api import replay

    policies = _with_baseline(args, check_policies(args.policy, POLICIES))
    trace = open_input(args, need_accesses=True)
    configs = check_configs(trace, _configs(args, policies, args.buffer), args.workers)
    want_steps = bool(args.out or args.plot)
    if args.backend == "gpu":
        from ..replay import gpu

        gpu.check(configs)
    result = replay(trace, configs, per_step=want_steps, workers=args.workers, progress=not args.quiet,
                    backend=args.backend)
    if want_steps:
        from ..fileio import output_set

        per_step = result.per_step
        with output_set():  # the table and the plot together: an interrupt leaves both as they were
            if args.out:
                _write_table(per_step, args.out)
            if args.plot:
                from ..replay.plots import effective_window, plot_rolling_misses, plotted_steps

                steps = plotted_steps(per_step)
                if effective_window(args.window, steps) != args.window:
                    print(f"# --window {args.window} is not shorter than the trace's {steps} plotted step(s): "
                          f"--plot's rolling mean uses {effective_window(args.window, steps)}", file=sys.stderr)
                plot_rolling_misses(per_step, args.plot, window=args.window,
                                    title=f"{os.path.basename(args.trace)}, {args.semantics} semantics")
    cols = ["policy", "buffer", "semantics", "streams", "steps", "accesses", "misses", "miss_ratio"]
    rows = [{c: r[c] for c in cols} for r in result.records]
    if args.vs is not None:
        _add_penalty(rows, args.vs)
        cols += ["hit_penalty", "miss_x"]
    _print_params(args, policies, trace)
    groups = _group_rows(args, trace, result)
    if args.json:  # always a list (as --help says): each record carries its own groups
        print_json(rows if groups is None else _with_groups(rows, groups))
    else:
        _print_records(rows, cols)
        if groups:
            print("# per IndexShare group (anchor: runs the indexer; shared: attends with its anchor's top-k)")
            _print_records(groups, ["policy", "buffer", "group", "layers", "streams", "accesses", "misses", "miss_ratio"])
    return 0


def _with_groups(rows: list[dict], groups: list[dict]) -> list[dict]:
    """Each record with ``"groups"``: its own per-group records (policy and buffer, which name the
    record, left out). A list of records either way, so a script reads every trace alike."""
    mine: dict[tuple, list[dict]] = {}
    for g in groups:
        mine.setdefault((g["policy"], g["buffer"]), []).append(
            {c: v for c, v in g.items() if c not in ("policy", "buffer")})
    return [{**r, "groups": mine.get((r["policy"], r["buffer"]), [])} for r in rows]


def _group_rows(args, trace, result) -> list[dict] | None:
    """Misses per IndexShare group, with --index-share or the trace's own share knobs; None without."""
    from ..errors import HisparseError
    from ..layer_groups import anchor_map

    spec = args.index_share
    if spec is None:
        knobs = (getattr(getattr(trace, "meta", None), "source", None) or {}).get("knobs") or {}
        if int(knobs.get("share_freq", 1)) <= 1:
            return None
        freq, offset = int(knobs["share_freq"]), int(knobs.get("share_offset", 0))
    else:
        from .trace import _index_share

        try:
            freq, offset = _index_share(spec)
        except argparse.ArgumentTypeError as exc:
            raise HisparseError(f"--index-share: {exc}") from None
    layers = 1 + max((layer for per in result.by_layer.values() for layer in per), default=0)
    return result.group_records(anchor_map(layers, freq, offset))


def _print_params(args, policies, trace=None) -> None:
    """The placed policies' parameters, on stderr (the table and JSON stay one record per config),
    and a note for each option given explicitly that nothing replayed here uses."""
    from ..replay.policies import OPTION_USERS

    given = getattr(args, "given", set())
    for dest, users in OPTION_USERS.items():
        if dest in given and not users & set(policies):
            print(f"# --{dest} {getattr(args, dest)} is unused: it applies to {', '.join(sorted(users))}, which is not "
                  "replayed here", file=sys.stderr)
    if "window" in given and not getattr(args, "plot", None):
        print(f"# --window {args.window} is unused: it applies to --plot, which is not given", file=sys.stderr)
    if getattr(args, "recover", False) and trace is not None and _is_npy(trace):
        print("# --recover is unused: it applies to .hst traces, not a .npy array", file=sys.stderr)
    if "salru" in policies:
        print(f"# salru: shards of {args.ways} ways (shards = buffer / {args.ways})", file=sys.stderr)
    if args.mtp_steps > 1:
        placed = [p for p in policies if p in _placed_policies()]
        if placed:
            print(f"# {', '.join(placed)}: {args.mtp_steps} trace steps per commit", file=sys.stderr)
        else:  # printed "# : 4 trace steps per commit"
            print(f"# --mtp-steps {args.mtp_steps} is unused: it applies to {', '.join(sorted(_placed_policies()))}, "
                  "none of which is replayed here", file=sys.stderr)


def _is_npy(trace) -> bool:
    from ..trace.sources import NpyTrace

    return isinstance(trace, NpyTrace)


def run_mrc(args: argparse.Namespace) -> int:
    from ..errors import HisparseError
    from ..replay.mrc import curve_records, one_pass_applies

    policies = _with_baseline(args, check_policies(args.policy, POLICIES))
    if args.min_buffer and args.max_buffer and args.max_buffer < args.min_buffer:
        raise HisparseError(f"--max-buffer {args.max_buffer} is below --min-buffer {args.min_buffer}")
    trace = open_input(args, need_accesses=True)
    k = trace.meta.k
    lo = args.min_buffer or k
    hi = args.max_buffer or 4 * k
    step = args.step or max(1, k // 8)
    if hi < lo:  # both given: refused above, before reading the trace
        raise HisparseError(f"the default largest size (4k = {hi}) is below --min-buffer {lo}: "
                            "pass --max-buffer" if args.max_buffer is None
                            else f"--max-buffer {hi} is below the smallest size (k = {lo}): pass --min-buffer")
    _check_memory(trace, hi, args.workers)
    spans = [(int(s.ctx_len.min()), int(s.ctx_len.max())) for s in trace if s.steps]
    min_ctx, max_ctx = min(a for a, _ in spans), max(b for _, b in spans)
    # a curve of sizes past the largest context (--min-buffer above it) is one size that misses as
    # that context does; past LARGE_BUFFER the engine would first allocate words for every slot
    _check_large_buffers(trace, [lo], "--min-buffer", largest=max_ctx)
    if hi > max(lo, max_ctx):  # a buffer that holds the whole context misses the same at any size
        print(f"hisparse: note: sizes above the largest context ({max_ctx}) miss as {max_ctx} does: "
              f"the curve stops at {max(lo, max_ctx)}, not --max-buffer {hi}", file=sys.stderr)
        hi = max(lo, max_ctx)

    plans = []  # (config, sizes, one pass), all checked before the first replay
    for policy in policies:
        sizes = _shard_grid(args, lo, hi, step) if policy == "salru" else None
        (cfg,) = _configs(args, [policy], [sizes[0] if sizes else lo], option="--min-buffer")
        cfg = _checked(cfg, k, "--min-buffer")
        one_pass = one_pass_applies(cfg, min_ctx, hi)
        if sizes is None:
            sizes = list(range(lo, hi + 1, 1 if one_pass else step))
            if sizes[-1] != hi:
                sizes.append(hi)
        plans.append((cfg, sizes, one_pass))
    if args.vs is not None:
        plans = _baseline_at_every_size(plans, args.vs)
    for cfg, sizes, one_pass in plans:
        if not one_pass and len(sizes) > MAX_GRID_SIZES:
            raise HisparseError(f"--step {step}: {len(sizes)} sizes from {lo} to {hi} for {cfg.policy}, each one "
                                f"replay (at most {MAX_GRID_SIZES}); give a larger --step or a narrower range")
    rows, methods = [], {}
    for cfg, sizes, _ in plans:
        curve, method = curve_records(trace, cfg, sizes, k=k, min_ctx=min_ctx, workers=args.workers,
                                      progress=not args.quiet)
        methods[str(cfg.policy)] = method
        rows += curve
    if args.vs is not None:  # the baseline at every size any curve has (one-pass curves have them all)
        _add_curve_penalty(rows, args.vs)
    _print_params(args, policies, trace)
    if args.out or args.plot:
        import pandas as pd

        from ..fileio import output_set

        table = pd.DataFrame(rows)
        with output_set():  # the table and the plot together
            if args.out:
                _write_table(table, args.out)
            if args.plot:
                from ..replay.plots import plot_miss_ratio_curves

                plot_miss_ratio_curves(table, args.plot, title=f"{os.path.basename(args.trace)}, {args.semantics}")
    if args.json:
        print_json({"methods": methods, "curve": rows})
    else:
        for policy, method in methods.items():
            print(f"# {policy}: {method}")
        print(_curve_text(_shown_rows(rows, methods, lo, hi, step)))
    return 0


def _shown_rows(rows: list[dict], methods: dict[str, str], lo: int, hi: int, step: int) -> list[dict]:
    """The rows the text table prints: every row of a short curve; of a long one, a one-pass
    curve (every size) thinned to the --step grid and its last size, and every row of a per-size
    curve (its own grid already: salru's in whole shards, a --vs baseline's at the others' sizes)."""
    if len(rows) <= 60:
        return rows
    return [r for r in rows if methods.get(str(r["policy"])) != "one-pass"
            or r["buffer"] == hi or (r["buffer"] - lo) % step == 0]


def _baseline_at_every_size(plans: list[tuple], base: str) -> list[tuple]:
    """A per-size --vs baseline replayed at every size another per-size curve has too (salru's
    shard grid, a finer or coarser grid), those the baseline can take (salru: whole shards):
    without them ``hit_penalty`` and ``miss_x`` were null wherever the grids differed. A one-pass
    curve has every size; the baseline keeps its --step grid against it."""
    from ..replay.policies import SHARDED

    (cfg, sizes, one_pass), = [p for p in plans if str(p[0].policy) == base]
    if one_pass:
        return plans
    extra = {b for c, s, o in plans if not o and c is not cfg for b in s}
    if cfg.policy in SHARDED:
        extra = {b for b in extra if b % cfg.ways == 0}
    merged = sorted(set(sizes) | extra)
    return [(c, merged if c is cfg else s, o) for c, s, o in plans]


def _shard_grid(args, lo: int, hi: int, step: int) -> list[int]:
    """salru's sizes: whole shards of --ways from the first multiple at or above ``lo`` to the last
    at or below ``hi``, --step rounded up to whole shards; a note when that is not the asked grid."""
    from ..errors import HisparseError

    ways = args.ways
    first, last = -(-lo // ways) * ways, hi // ways * ways
    if first > last:
        raise HisparseError(f"--policy salru: no size from {lo} to {hi} is a whole number of shards of --ways {ways} "
                            "(buffer = shards x ways); widen --min-buffer / --max-buffer or change --ways")
    shard_step = -(-step // ways) * ways
    sizes = list(range(first, last + 1, shard_step))
    if sizes[-1] != last:
        sizes.append(last)
    if (first, last, shard_step) != (lo, hi, step):
        print(f"# salru: sizes in whole shards of --ways {ways}: {first} to {last} in steps of {shard_step} "
              f"({len(sizes)} sizes)", file=sys.stderr)
    return sizes


def _add_curve_penalty(rows: list[dict], base: str) -> None:
    """hit_penalty and miss_x against ``base``'s curve at the same size, as pandas computes them
    (NaN where the baseline has no such size; miss_x inf over no baseline misses, NaN for 0 / 0)."""
    ref = {r["buffer"]: r for r in rows if r["policy"] == base}
    nan = float("nan")
    for r in rows:
        b = ref.get(r["buffer"])
        r["hit_penalty"] = r["miss_ratio"] - b["miss_ratio"] if b else nan
        if not b:
            r["miss_x"] = nan
        elif b["misses"]:
            r["miss_x"] = r["misses"] / b["misses"]
        else:
            r["miss_x"] = nan if r["misses"] == 0 else float("inf")


def _curve_text(rows: list[dict]) -> str:
    """The curve as ``pandas.DataFrame(rows).to_string(index=False)`` lays it out (``text_table``;
    pandas itself only for a value the rules do not cover)."""
    from .text_table import supported, to_string

    def fmt(v: float) -> str:
        return f"{v:.4f}"

    columns = [(c, [r[c] for r in rows]) for c in rows[0]]
    if all(supported(values) for _, values in columns):
        return to_string(columns, fmt)
    import pandas as pd

    return pd.DataFrame(rows).to_string(index=False, float_format=fmt)
