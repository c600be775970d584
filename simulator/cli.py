"""``hisparse``: the command line. Start-up stays light: each command imports what it needs."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .errors import HisparseError

DESCRIPTION = """\
hisparse-sim: plan and validate hierarchical sparse KV memory (SGLang HiSparse).

Traces of the top-k positions sparse attention selects each decode step drive an exact
replay of hot-buffer eviction policies and a serving model of baseline versus HiSparse.
Traces are .hst files (see traces/README.md) or plain .npy int arrays [steps, k] (-1 pads).
"""


def _add_trace_commands(sub: argparse._SubParsersAction) -> None:
    from .commands import trace as cmd

    trace = sub.add_parser("trace", help="generate, inspect, check and convert top-k traces",
                           description="Generate, inspect, check and convert top-k traces.")
    tsub = trace.add_subparsers(dest="trace_command", required=True, metavar="COMMAND")
    cmd.add_parsers(tsub)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hisparse", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    from . import __version__

    parser.add_argument("--version", action="version", version=f"hisparse-sim {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_trace_commands(sub)
    from .commands import replay

    replay.add_parsers(sub)
    from .commands import plan

    plan.add_parsers(sub)
    from .commands import sweep

    sweep.add_parsers(sub)
    from .commands import calibrate

    calibrate.add_parsers(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; user errors print one line and exit 2, with no traceback."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except HisparseError as exc:
        print(f"hisparse: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("hisparse: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
