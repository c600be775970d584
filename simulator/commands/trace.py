"""``hisparse trace gen | info | compare | validate | convert | export``."""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings

from ..limits import check_context_memory
from .common import (
    Output,
    add_trace_input,
    declare_io,
    nonneg_int,
    open_input,
    positive_int,
    print_json,
    print_table,
    seed_int,
)

# .hst outputs end in .hst: every command reads any other name ending in .npy as a numpy array.
HST_OUT = Output("out", suffixes=(".hst",))


def add_parsers(sub: argparse._SubParsersAction) -> None:
    gen = sub.add_parser("gen", help="write a synthetic trace",
                         description="Write a synthetic trace with the structure of real top-k traces "
                                     "(sinks, local window, retention, recall of dropped entries, passages, bursts, "
                                     "layer correlation). "
                                     "The same arguments and seed give the same bytes.")
    src = gen.add_mutually_exclusive_group()
    src.add_argument("--preset", default="glm51-longbench",
                     help="knob preset (default glm51-longbench): glm51-longbench and dsv32 are fitted to "
                          "published DSA statistics (traces/targets/); high-overlap (formerly dsa-like: ~95%% "
                          "adjacent-step overlap, which no DSA measurement supports), high-locality, bursty")
    src.add_argument("--knobs", metavar="FILE", help="a knobs .toml file (from `trace fit` or edited by hand)")
    gen.add_argument("--steps", type=positive_int, default=None,
                     help="decode steps per stream (default: a fitted preset's shape, else 512)")
    gen.add_argument("--layers", type=positive_int, default=None,
                     help="layers per request; a profile spreads over them by depth (default: a fitted "
                          "preset's model, e.g. 78 for glm51-longbench, else 4)")
    gen.add_argument("--requests", type=positive_int, default=None,
                     help="requests (default: a fitted preset's shape, else 2)")
    gen.add_argument("--topk", type=positive_int, default=None, help="k, entries selected per step (default 2048)")
    gen.add_argument("--ctx0", type=positive_int, default=None,
                     help="context length at step 0 (default: a fitted preset's, e.g. 100384, else 32768)")
    gen.add_argument("--seed", type=seed_int, default=None, help="random seed (default: a fitted preset's, else 0)")
    gen.add_argument("--index-share", metavar="FREQ:OFFSET", type=_index_share, default=None,
                     help="IndexShare: only the anchor layers draw selections, each shared layer repeats its "
                          "anchor's (config.json index_topk_freq:index_skip_topk_offset; GLM-5.2: 4:3); "
                          "default: the knobs' share_freq / share_offset (off)")
    gen.add_argument("--out", required=True, metavar="PATH", help="output .hst path (written atomically)")
    add_compression(gen)
    gen.add_argument("--quiet", action="store_true", help="no progress bar")
    gen.set_defaults(run=run_gen)
    declare_io(gen, inputs=["knobs"], outputs=[HST_OUT])

    info = sub.add_parser("info", help="summarise a trace (structure measures, compactness)",
                          description="Streams, steps, k, context range, adjacent-step overlap "
                                      "(|S_t & S_t-1| / k: mean and 10th percentile), sink and local "
                                      "shares, adjacent-layer overlap, bytes per access and source.")
    add_trace_input(info)
    info.add_argument("--sink", type=nonneg_int, default=16, metavar="N", help="sink region: first N positions (default 16)")
    info.add_argument("--local", type=nonneg_int, default=128, metavar="N",
                      help="local region: last N positions of context (default 128)")
    info.add_argument("--json", action="store_true", help="print JSON")
    info.set_defaults(run=run_info)

    val = sub.add_parser("validate", help="check every stream of a trace",
                         description="Decode and check every stream: exit 0 if the trace is valid, "
                                     "else print what is wrong and where, and exit 2.")
    add_trace_input(val)
    val.set_defaults(run=run_validate)

    conv = sub.add_parser("convert", help="convert a trace (e.g. .npy) to the .hst format",
                          description="Write any readable trace as a compact .hst file.")
    add_trace_input(conv)
    conv.add_argument("--out", required=True, metavar="PATH", help="output .hst path (written atomically)")
    conv.add_argument("--keep-order", action="store_true",
                      help="keep each step's stored order (larger files); default stores steps sorted")
    add_compression(conv)
    conv.set_defaults(run=run_convert)
    declare_io(conv, inputs=["trace"], outputs=[HST_OUT])

    cmp = sub.add_parser("compare", help="a trace's statistics beside published targets",
                         description="Measure a trace's statistics (per-layer consecutive-step overlap, "
                                     "adjacent-layer overlap, batched LRU miss ratio at B/k, first-step misses "
                                     "from an empty buffer; steps before the warm-up left out) and print them "
                                     "beside the targets of a targets file, or of both shipped presets "
                                     "(glm51-longbench, dsv32). Targets on layers the trace lacks show as '-'.")
    add_trace_input(cmp)
    cmp.add_argument("--targets", metavar="T.toml", action="append",
                     help="targets file or shipped name; repeat for several (default: every shipped one)")
    cmp.add_argument("--warmup", type=nonneg_int, default=None, metavar="N",
                     help="steps left out of steady-state statistics (default: the targets' [shape] warmup)")
    cmp.add_argument("--per-layer", action="store_true", help="also print the per-layer table")
    cmp.add_argument("--json", action="store_true", help="print JSON (targets, per-layer statistics, LRU curve)")
    cmp.add_argument("--plot", metavar="PNG",
                     help="plot per-layer consecutive overlap and LRU miss ratio against B/k, with the targets")
    cmp.set_defaults(run=run_compare)
    declare_io(cmp, inputs=["trace", "targets"], outputs=[Output("plot", suffixes=(".png",))])

    exp = sub.add_parser("export", help="export one stream for other tools (libCacheSim)",
                         description="Export one stream as libCacheSim oracleGeneral records "
                                     "(24 bytes each, next-access times filled in).")
    add_trace_input(exp)
    exp.add_argument("--format", required=True, choices=["oracle-general"], help="output format")
    exp.add_argument("--request", type=nonneg_int, default=None, help="request of the stream (default: the first)")
    exp.add_argument("--layer", type=nonneg_int, default=None, help="layer of the stream (default: the first)")
    exp.add_argument("--out", required=True, metavar="PATH", help="output path (written atomically)")
    exp.set_defaults(run=run_export)
    declare_io(exp, inputs=["trace"], outputs=[Output("out")])

    from . import trace_record  # record and fit: real-model traces (issue 4)

    trace_record.add_parsers(sub)


def add_compression(parser: argparse.ArgumentParser) -> None:
    from ..trace.codec import COMPRESSIONS

    parser.add_argument("--compression", choices=list(COMPRESSIONS), default="auto",
                        help="how chunk payloads are compressed (default auto: zlib where it saves at least a "
                             "quarter of a chunk's bytes, else stored); stored writes deflate's uncompressed blocks, "
                             "copied out when read where zlib inflates at ~200 MB/s; every reader reads both")


def _open(args: argparse.Namespace, *, need_accesses: bool = False):
    """The command's trace; a note where --recover is given for a .npy array, which it does
    not apply to (as ``hisparse replay`` says): it was silently ignored."""
    if args.recover and str(args.trace).lower().endswith(".npy"):
        print("# --recover is unused: it applies to .hst traces, not a .npy array", file=sys.stderr)
    return open_input(args, need_accesses=need_accesses)


def _index_share(text: str) -> tuple[int, int]:
    """--index-share FREQ:OFFSET: two whole numbers, FREQ >= 1, OFFSET >= 0."""
    parts = str(text).split(":")
    try:
        freq, offset = (int(p) for p in parts) if len(parts) == 2 else (None, None)
    except ValueError:
        freq = offset = None
    if freq is None or offset is None or freq < 1 or offset < 0:
        raise argparse.ArgumentTypeError(f"needs FREQ:OFFSET, whole numbers FREQ >= 1 and OFFSET >= 0 (GLM-5.2: 4:3), "
                                         f"got {text!r}")
    return freq, offset


def run_gen(args: argparse.Namespace) -> int:
    from ..errors import HisparseError
    from ..progress import counter
    from ..trace import TraceWriter
    from ..trace.generator import generate, knobs_dict, load_knobs

    if args.knobs and not os.path.isfile(args.knobs):
        what = "is a folder; give a knobs .toml file" if os.path.isdir(args.knobs) else "no such file"
        raise HisparseError(f"--knobs {args.knobs}: {what}")
    spec = args.knobs or args.preset
    knobs = load_knobs(spec)
    if args.index_share is not None:
        from dataclasses import replace

        knobs = replace(knobs, share_freq=args.index_share[0], share_offset=args.index_share[1])
    _shape_defaults(args, None if args.knobs else args.preset)
    if args.topk > args.ctx0:
        raise HisparseError(f"--topk {args.topk} is larger than the context (--ctx0 {args.ctx0}): "
                            "a step selects at most ctx_len positions")
    from .. import limits

    limits.check(args.requests * args.layers * args.steps * args.topk, "HISPARSE_MAX_TRACE_ENTRIES",
                 f"trace gen of --requests {args.requests} x --layers {args.layers} x --steps {args.steps} x "
                 f"--topk {args.topk}", unit="top-k entries", hint="fewer requests, layers or steps")
    knobs, notes = knobs.for_k(args.topk)  # recorded as generated
    for note in notes:
        warnings.warn(f"{spec}: {note}", stacklevel=1)
    source = {"kind": "synthetic", "generator": "hisparse-sim", "preset": spec if not args.knobs else None,
              "knobs": knobs_dict(knobs), "seed": args.seed}
    # counted in steps, so the bar moves within a stream (one long stream showed 0/1 for minutes)
    tick = counter(args.requests * args.layers * args.steps, desc="steps drawn", quiet=args.quiet, unit="step")
    streams = generate(knobs, steps=args.steps, layers=args.layers, requests=args.requests,
                       k=args.topk, ctx0=args.ctx0, seed=args.seed, on_steps=tick)
    with TraceWriter(args.out, k=args.topk, source=source, compression=args.compression) as writer:
        for s in streams:
            writer.write_stream(s)
    return 0


def _shape_defaults(args: argparse.Namespace, preset: str | None) -> None:
    """Unset shape options: a fitted preset's targets shape, else the historical defaults."""
    from ..trace.generator import FITTED_PRESETS

    base = dict(steps=512, layers=4, requests=2, topk=2048, ctx0=32768, seed=0)
    if preset in FITTED_PRESETS:
        from ..analysis.targets import load_targets

        sh = load_targets(preset).shape
        base = dict(steps=sh.steps, layers=sh.layers, requests=sh.requests, topk=sh.topk, ctx0=sh.ctx0, seed=sh.seed)
    for name, value in base.items():
        if getattr(args, name) is None:
            setattr(args, name, value)


def print_target_rows(rows: list[dict]) -> None:
    """Targets against measured values: one line each, with its source."""
    print(f"{'target':<28} {'layers':>7} {'B/k':>4} {'published':>10} {'tolerance':>10} {'measured':>9} {'met':>4}")
    for r in rows:
        layers = f"{r['layers'][0]}-{r['layers'][1]}" if r["layers"] else "all"
        ratio = f"{r['buffer_ratio']:g}" if r["buffer_ratio"] is not None else ""
        tol = f"{r['tolerance']:.0%} rel" if r["relative"] else f"+-{r['tolerance']:g}"
        got = r["measured"]
        shown = f"{got:9.4f}" if got == got else f"{'-':>9}"
        print(f"{r['name']:<28} {layers:>7} {ratio:>4} {r['target']:10.4f} {tol:>10} {shown} "
              f"{('yes' if r['met'] else 'NO'):>4}")


def run_compare(args: argparse.Namespace) -> int:
    from ..analysis.compare import compare_trace, finite, plot_compare
    from ..analysis.targets import load_targets, shipped_targets

    targets = [load_targets(t) for t in (args.targets or shipped_targets())]
    trace = _open(args, need_accesses=True)
    check_context_memory("compare", args.trace, getattr(trace, "max_ctx", None))
    _check_compare_buffers(args, trace.meta.k, targets)
    result = compare_trace(trace, targets, warmup=args.warmup, curve=bool(args.json or args.plot))
    if args.plot:
        plot_compare(result, targets, args.plot)
    if args.json:
        for rows in result["targets"].values():
            for r in rows:
                r["measured"] = finite(r["measured"])
        result["per_layer"] = {name: {str(k): finite(v) for k, v in d.items()} for name, d in result["per_layer"].items()}
        result["lru_curve"] = {str(k): finite(v) for k, v in result.get("lru_curve", {}).items()}
        print_json(result)
        return 0
    print(f"{result['trace']}: {result['requests']} request(s) x {result['layers']} layers x {result['steps']} steps, "
          f"k {result['topk']}; steady state from step {result['warmup']}")
    shapes = {t.path.stem: t.shape for t in targets}
    for name, rows in result["targets"].items():
        met = sum(r["met"] for r in rows)
        sh = shapes[name]
        other = f"; measured on {sh.model}'s {sh.layers} layers, bands are layer indices" \
            if sh.layers != result["layers"] else ""
        print(f"\ntargets {name} ({met}/{len(rows)} met{other}):")
        print_target_rows(rows)
    if args.per_layer:
        per = result["per_layer"]
        print(f"\n{'layer':>5} {'overlap':>8} {'layer ov.':>9} {'LRU 2k':>7}")
        for layer in sorted(per["step_overlap"]):
            vals = [per[n][layer] for n in ("step_overlap", "layer_overlap", "lru_miss_2k")]
            print(f"{layer:>5} " + " ".join(f"{v:8.4f}" if v == v else f"{'-':>8}" for v in vals))
    return 0


def _check_compare_buffers(args: argparse.Namespace, k: int, targets: list) -> None:
    """Refuse, before any replay, a buffer of B/k x k slots that the replay engine cannot hold
    (a trace of k near 2**31: its B = 2k raised ValueError from the engine, a traceback)."""
    from ..analysis.compare import CURVE_RATIOS
    from ..errors import HisparseError
    from .common import MAX_BUFFER

    ratios = [2.0] + [t.buffer_ratio for tg in targets for t in tg.targets if t.buffer_ratio is not None]
    if args.json or args.plot:
        ratios += list(CURVE_RATIOS)
    ratio = max(ratios)
    if round(ratio * k) > MAX_BUFFER:
        raise HisparseError(f"{args.trace}: k = {k} is too large to compare: its LRU miss ratio at B/k = {ratio:g} "
                            f"needs a buffer of {round(ratio * k):,} slots, more than the replay engine's "
                            f"{MAX_BUFFER:,}")


def run_info(args: argparse.Namespace) -> int:
    from ..trace.stats import trace_info

    info = trace_info(_open(args), sink=args.sink, local=args.local)
    if not info.get("accesses"):
        print(f"hisparse: note: {args.trace} holds {_nothing(info.get('streams', 0))}: nothing to replay",
              file=sys.stderr)
    if args.json:
        print_json(info)
    else:
        rows = [(k, v) for k, v in info.items() if k != "source"]
        rows.append(("source", json.dumps(info["source"], sort_keys=True)))
        print_table(rows)
    return 0


def _nothing(streams: int) -> str:
    """Why a trace has nothing to replay: no streams at all (a writer closed before its first
    chunk, a --recover that kept none), or streams whose steps are all empty."""
    return "no streams" if not streams else "no accesses (every step is empty or -1 padding)"


def run_validate(args: argparse.Namespace) -> int:
    trace = _open(args)
    n = steps = accesses = 0
    for s in trace:
        n += 1
        steps += s.steps
        accesses += s.accesses
    note = "" if accesses else f"; {_nothing(n)}, nothing to replay"
    if getattr(trace, "version", 2) < 2:
        from ..trace.stream import FORMAT_VERSION

        note += ("; format version 1: chunk headers are checked against the index only "
                 f"(hisparse trace convert --keep-order rewrites it as version {FORMAT_VERSION})")
    print(f"{args.trace}: valid ({n} streams, {steps} steps, {accesses} accesses, k = {trace.meta.k}{note})")
    return 0


def run_convert(args: argparse.Namespace) -> int:
    from ..trace import TraceWriter

    trace = _open(args)
    check_context_memory("convert", args.trace, getattr(trace, "max_ctx", None))
    with TraceWriter(args.out, k=trace.meta.k, source=trace.meta.source, extra=trace.meta.extra,
                     keep_order=args.keep_order, compression=args.compression) as writer:
        for s in trace:
            writer.write_stream(s)
    return 0


def run_export(args: argparse.Namespace) -> int:
    from ..trace.oracle import write_oracle_general

    trace = _open(args, need_accesses=True)
    keys = trace.keys
    request = keys[0].request if args.request is None else args.request
    layer = keys[0].layer if args.layer is None else args.layer
    n = write_oracle_general(trace.read((request, layer)), args.out)
    print(f"wrote {n} records (request {request}, layer {layer}) to {args.out}")
    return 0
