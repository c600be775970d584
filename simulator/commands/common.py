"""Options and output helpers shared by the commands."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def add_trace_input(parser: argparse.ArgumentParser) -> None:
    """The TRACE argument every trace-reading command takes, with .npy interop options."""
    parser.add_argument("trace", metavar="TRACE", help="a .hst trace file, or a .npy int array [steps, k] (-1 pads)")
    parser.add_argument("--ctx0", type=int, default=None, metavar="N",
                        help=".npy only: ctx_len at step 0, growing by one per step "
                             "(default: the largest index in step 0, plus one)")
    parser.add_argument("--recover", action="store_true",
                        help="read the complete chunks of a trace whose writer never closed it")


def open_input(args: argparse.Namespace):
    from ..trace import open_trace

    return open_trace(args.trace, ctx0=args.ctx0, recover=args.recover)


def print_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, indent=2, default=_jsonable)
    sys.stdout.write("\n")


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def print_table(rows: list[tuple[str, Any]]) -> None:
    """Key/value lines, aligned."""
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        if isinstance(value, float):
            value = f"{value:.4f}"
        print(f"{key:<{width}}  {value}")
