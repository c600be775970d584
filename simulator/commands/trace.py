"""``hisparse trace gen | info | validate | convert | export``."""

from __future__ import annotations

import argparse
import json
import os
import sys

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
    src.add_argument("--preset", default="dsa-like", help="knob preset: dsa-like, high-locality or bursty (default dsa-like)")
    src.add_argument("--knobs", metavar="FILE", help="a knobs .toml file (from `trace fit` or edited by hand)")
    gen.add_argument("--steps", type=positive_int, default=512, help="decode steps per stream (default 512)")
    gen.add_argument("--layers", type=positive_int, default=4, help="layers per request (default 4)")
    gen.add_argument("--requests", type=positive_int, default=2, help="requests (default 2)")
    gen.add_argument("--topk", type=positive_int, default=2048, help="k, entries selected per step (default 2048)")
    gen.add_argument("--ctx0", type=positive_int, default=32768, help="context length at step 0 (default 32768)")
    gen.add_argument("--seed", type=seed_int, default=0, help="random seed (default 0)")
    gen.add_argument("--out", required=True, metavar="PATH", help="output .hst path (written atomically)")
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
    conv.set_defaults(run=run_convert)
    declare_io(conv, inputs=["trace"], outputs=[HST_OUT])

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


def run_gen(args: argparse.Namespace) -> int:
    from ..progress import progress
    from ..trace import TraceWriter
    from ..trace.generator import generate, knobs_dict, load_knobs

    if args.topk > args.ctx0:
        from ..errors import HisparseError

        raise HisparseError(f"--topk {args.topk} is larger than the context (--ctx0 {args.ctx0}): "
                            "a step selects at most ctx_len positions")
    if args.knobs and not os.path.isfile(args.knobs):
        from ..errors import HisparseError

        raise HisparseError(f"--knobs {args.knobs}: no such file")
    spec = args.knobs or args.preset
    knobs = load_knobs(spec)
    source = {"kind": "synthetic", "generator": "hisparse-sim", "preset": spec if not args.knobs else None,
              "knobs": knobs_dict(knobs), "seed": args.seed}
    streams = generate(knobs, steps=args.steps, layers=args.layers, requests=args.requests,
                       k=args.topk, ctx0=args.ctx0, seed=args.seed)
    with TraceWriter(args.out, k=args.topk, source=source) as writer:
        for s in progress(streams, total=args.requests * args.layers, desc="streams", quiet=args.quiet):
            writer.write_stream(s)
    return 0


def run_info(args: argparse.Namespace) -> int:
    from ..trace.stats import trace_info

    info = trace_info(open_input(args), sink=args.sink, local=args.local)
    if not info.get("accesses"):
        print(f"hisparse: note: {args.trace} holds no accesses (every step is empty or -1 padding): "
              "nothing to replay", file=sys.stderr)
    if args.json:
        print_json(info)
    else:
        rows = [(k, v) for k, v in info.items() if k != "source"]
        rows.append(("source", json.dumps(info["source"], sort_keys=True)))
        print_table(rows)
    return 0


def run_validate(args: argparse.Namespace) -> int:
    trace = open_input(args)
    n = steps = accesses = 0
    for s in trace:
        n += 1
        steps += s.steps
        accesses += s.accesses
    note = "" if accesses else "; no accesses: every step is empty or -1 padding, nothing to replay"
    if getattr(trace, "version", 2) < 2:
        note += ("; format version 1: chunk headers are checked against the index only "
                 "(hisparse trace convert --keep-order rewrites it as version 2)")
    print(f"{args.trace}: valid ({n} streams, {steps} steps, {accesses} accesses, k = {trace.meta.k}{note})")
    return 0


def run_convert(args: argparse.Namespace) -> int:
    from ..trace import TraceWriter

    trace = open_input(args)
    with TraceWriter(args.out, k=trace.meta.k, source=trace.meta.source, extra=trace.meta.extra,
                     keep_order=args.keep_order) as writer:
        for s in trace:
            writer.write_stream(s)
    return 0


def run_export(args: argparse.Namespace) -> int:
    from ..trace.oracle import write_oracle_general

    trace = open_input(args, need_accesses=True)
    keys = trace.keys
    request = keys[0].request if args.request is None else args.request
    layer = keys[0].layer if args.layer is None else args.layer
    n = write_oracle_general(trace.read((request, layer)), args.out)
    print(f"wrote {n} records (request {request}, layer {layer}) to {args.out}")
    return 0
