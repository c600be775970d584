"""``hisparse``: the command line. Start-up stays light: each command imports what it needs."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from .commands.common import Parser, check_io
from .errors import HisparseError
from .interrupts import TERMINATED, Terminated, sigterm_as_interrupt

DESCRIPTION = """\
hisparse-sim: plan and validate hierarchical sparse KV memory (SGLang HiSparse).

Traces of the top-k positions sparse attention selects each decode step drive an exact
replay of hot-buffer eviction policies and a serving model of baseline versus HiSparse.
Traces are .hst files (hisparse trace --help; the format: traces/README.md in the source
repository) or plain .npy int arrays [steps, k] (-1 pads).
"""


def _add_trace_commands(sub: argparse._SubParsersAction) -> None:
    from .commands import trace as cmd

    trace = sub.add_parser("trace", help="generate, inspect, check and convert top-k traces",
                           description="Generate, inspect, check and convert top-k traces.")
    tsub = trace.add_subparsers(dest="trace_command", required=True, metavar="COMMAND")
    cmd.add_parsers(tsub)


def _add_module_commands(name: str, adder: str = "add_parsers") -> Callable[[argparse._SubParsersAction], None]:
    def add(sub: argparse._SubParsersAction) -> None:
        import importlib

        getattr(importlib.import_module(f".commands.{name}", __package__), adder)(sub)

    return add


# The module adding each command's parser, in --help order. `hisparse replay ...` builds only
# the replay parser: the others import the serving model and the sweep grid (~25 ms of CPU,
# a seventh of replaying a 41 M-access stream; BENCHMARKS.md "Replay engine"), and even mrc's
# parser is ~1 ms of a .npy replay's ~50 ms process.
COMMANDS: dict[str, Callable[[argparse._SubParsersAction], None]] = {
    "trace": _add_trace_commands,
    "replay": _add_module_commands("replay", "add_replay_parser"),
    "mrc": _add_module_commands("replay", "add_mrc_parser"),
    "plan": _add_module_commands("plan"),
    "sweep": _add_module_commands("sweep"),
    "presets": _add_module_commands("presets"),
    **dict.fromkeys(("calibrate", "validate"), _add_module_commands("calibrate")),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole command line, or (``command``) only the parsers of that command's module."""
    parser = Parser(prog="hisparse", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    from . import __version__

    parser.add_argument("--version", action="version", version=f"hisparse-sim {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    adders = [COMMANDS[command]] if command in COMMANDS else list(dict.fromkeys(COMMANDS.values()))
    for add in adders:
        add(sub)
    return parser


@contextlib.contextmanager
def _one_line_warnings() -> Iterator[None]:
    """Warnings for the user (a recovered trace) as one ``hisparse: warning:`` line each."""
    import warnings

    def one_line(message, category, filename, lineno, line=None):
        return f"hisparse: warning: {message}\n"

    previous, warnings.formatwarning = warnings.formatwarning, one_line
    try:
        yield
    finally:
        warnings.formatwarning = previous


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; user errors print one line and exit 2, with no traceback."""
    try:
        return _main(sys.argv[1:] if argv is None else list(argv))
    except KeyboardInterrupt:  # Ctrl-C while the parser was built or read the options (the first ~0.1 s)
        print("hisparse: interrupted", file=sys.stderr)
        return 130


def _main(argv: list[str]) -> int:
    parser = build_parser(argv[0] if argv else None)
    try:
        with _stdout_named():
            try:
                args = parser.parse_args(argv)
            except SystemExit as exc:  # --help, --version, or a bad option (one line, status 2)
                code = 0 if exc.code is None else exc.code if isinstance(exc.code, int) else 2
                sys.stdout.flush()  # the help text's last part, written here: a full disk is an error
                return code
    except BrokenPipeError:
        return 0
    except OSError as exc:  # `--help > /dev/full`
        print(f"hisparse: error: {_os_error_line(exc)}", file=sys.stderr)
        return 2
    empty = _empty_argument(argv, _required_options(parser))
    if empty:
        print(f"hisparse: error: {empty}", file=sys.stderr)
        return 2
    try:
        with sigterm_as_interrupt(), _one_line_warnings(), _stdout_named():
            check_io(args)  # outputs writable and no input overwritten, before any work
            code = int(args.run(args) or 0)
            sys.stdout.flush()  # a write error on what was printed is this command's error, not exit's
            return code
    except HisparseError as exc:
        print(f"hisparse: error: {exc}", file=sys.stderr)
        return 2
    except MemoryError:
        command = " ".join(filter(None, (args.command, getattr(args, "trace_command", None))))
        print(f"hisparse: error: out of memory in `hisparse {command}`: its inputs need more memory than "
              "this machine has (smaller buffers, fewer workers or a smaller trace or grid need less)",
              file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        print("hisparse: interrupted", file=sys.stderr)
        return 143 if isinstance(exc, Terminated) or TERMINATED.is_set() else 130
    except BrokenPipeError:
        return 0
    except OSError as exc:  # a reader or writer the checks could not foresee (EIO, ENOSPC): one line
        print(f"hisparse: error: {_os_error_line(exc)}", file=sys.stderr)
        return 2
    except UnicodeDecodeError as exc:
        print(f"hisparse: error: an input is not UTF-8 text ({exc.reason} at byte {exc.start})", file=sys.stderr)
        return 2


class _NamedStdout:
    """Standard output whose write errors (``> /dev/full``, a failing disk) name it, as a file's errors name the
    file; a reader that left (BrokenPipeError) stays what it is."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def _named(self, call: Callable[..., Any], *args: Any) -> Any:
        try:
            return call(*args)
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror, "standard output") from None

    def write(self, text: str) -> int:
        return self._named(self._stream.write, text)

    def flush(self) -> None:
        self._named(self._stream.flush)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def _stdout_named() -> Iterator[None]:
    """``sys.stdout`` wrapped in ``_NamedStdout`` while a command runs."""
    previous = sys.stdout
    sys.stdout = _NamedStdout(previous)
    try:
        yield
    finally:
        sys.stdout = previous


def _required_options(parser: argparse.ArgumentParser) -> set[str]:
    """The option strings of every required option, the subcommands' included."""
    out: set[str] = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                out |= _required_options(sub)
        elif action.required and action.option_strings:
            out |= set(action.option_strings)
    return out


def _empty_argument(argv: Sequence[str], required: set[str] = frozenset()) -> str | None:
    """An empty argument (``--model ''``, ``--gpu=``, a trace named ``''``) was read as the working folder, or as
    not given (``--validate ''`` ran a plan): name it instead. No option takes an empty value. ``required``: options
    that cannot be left out (the hint said to, for ``--out ''`` of trace export)."""
    def hint(option: str) -> str:
        return "give one" if option in required else "give one, or leave the option out"

    for i, token in enumerate(argv):
        if token.startswith("--") and token.endswith("=") and "=" not in token[:-1]:
            return f"{token[:-1]}: an empty value ({hint(token[:-1])})"
        if token == "":
            before = argv[i - 1] if i else ""
            if before.startswith("-") and "=" not in before:
                return f"{before}: an empty value ({hint(before)})"
            return f"argument {i + 1} of the command line is empty (a file or name was expected)"
    return None


def _os_error_line(exc: OSError) -> str:
    """An OSError as one line naming its file(s), as the readers' own errors do."""
    from .fileio import why_os

    names = [str(n) for n in (exc.filename, exc.filename2) if n is not None]
    return f"{' -> '.join(names)}: {why_os(exc)}" if names else why_os(exc)


if __name__ == "__main__":
    sys.exit(main())
