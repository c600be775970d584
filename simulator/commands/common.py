"""Options and output helpers shared by the commands.

The rules every command follows live here once: argparse types with ranges (a value out of its
domain is refused while parsing, before any work), one comma-list parser, one policy-list check,
and the declaration of each command's input files and outputs, which ``check_io`` tests before
the command runs (``simulator.fileio.check_output``).
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..inputs import json_safe  # noqa: F401 - the commands' name for it

# Slots are int32 in the replay engine and the C fast path (simulator/native/_native.c refuses
# buffer >= INT32_MAX): the largest buffer a replay can hold.
MAX_BUFFER = 2**31 - 2


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (exit 2): ``hisparse replay: error: argument --window: ...``."""

    def error(self, message: str):  # noqa: D102 - argparse's hook
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def _print_message(self, message, file=None):  # noqa: D102 - argparse's hook
        # argparse's own swallows OSError: `--help > /dev/full` printed nothing and exited 0; the
        # error goes up to cli.main, which names standard output (a reader that left stays quiet)
        if message:
            (file or sys.stderr).write(message)

    def parse_args(self, args=None, namespace=None):  # noqa: D102 - argparse's entry point
        # argparse reports an unknown argument from the top-level parser ("see hisparse --help"),
        # whose help does not list the command's options: name the command the user ran instead
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            words = [w for w in (getattr(parsed, "command", None), getattr(parsed, "trace_command", None))
                     if isinstance(w, str)]
            prog = " ".join([self.prog, *words])
            self.exit(2, f"{prog}: error: unrecognized arguments: {' '.join(extras)} (see {prog} --help)\n")
        return parsed

    def _get_values(self, action, arg_strings):
        # argparse drops a "--" value (``--steps=--``) and would hand the command an empty list
        if action.option_strings and action.nargs is None and arg_strings == ["--"]:
            raise argparse.ArgumentError(action, "expected a value, got '--'")
        return super()._get_values(action, arg_strings)


# -- options whose argparse default is None ---------------------------------------------------
# A table of (dest, option, default) rows: the parser's default is None, so an option the user gave
# is told apart from the default (refused where it would be ignored), and the default filled in after.
OptionDefaults = tuple[tuple[str, str, Any], ...]


def given_options(args: argparse.Namespace, table: OptionDefaults) -> list[str]:
    """The options of ``table`` the user gave."""
    return [option for dest, option, _ in table if getattr(args, dest) is not None]


def fill_defaults(args: argparse.Namespace, table: OptionDefaults) -> None:
    """Each option of ``table`` the user left out takes its default."""
    for dest, _, default in table:
        if getattr(args, dest) is None:
            setattr(args, dest, default)


# -- argparse types with ranges ----------------------------------------------------------------
def _parse_int(text: str) -> int:
    try:
        return int(str(text).strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def _parse_float(text: str) -> float:
    try:
        value = float(str(text).strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def int_in(lo: int | None = None, hi: int | None = None, *, what: str = "") -> Callable[[str], int]:
    """An argparse type: an integer in [lo, hi] (either bound may be open)."""
    def parse(text: str) -> int:
        value = _parse_int(text)
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise argparse.ArgumentTypeError(f"expected {what or _range(lo, hi, 'an integer')}, got {text!r}")
        return value

    parse.__name__ = what or "integer"
    return parse


def _range(lo, hi, noun: str) -> str:
    if lo is not None and hi is not None:
        return f"{noun} from {lo} to {hi}"
    if lo == 1:
        return f"a positive {noun.split()[-1]} (>= 1)"
    if lo == 0:
        return f"a non-negative {noun.split()[-1]} (>= 0)"
    return f"{noun} >= {lo}" if lo is not None else f"{noun} <= {hi}"


# Counts and sizes end up in numpy int64 (a window of 10**20 was an OverflowError traceback)
MAX_INT = 2**63 - 1
positive_int = int_in(1, MAX_INT, what="a positive integer (>= 1, at most 2**63 - 1)")
nonneg_int = int_in(0, MAX_INT, what="a non-negative integer (>= 0, at most 2**63 - 1)")
buffer_size = int_in(1, MAX_BUFFER, what=f"a buffer size from 1 to {MAX_BUFFER} slots")
# Seeds go to numpy's generators (non-negative) and to compiled code as int64.
seed_int = int_in(0, 2**63 - 1, what="a seed from 0 to 2**63 - 1")


# A value that becomes part of a file name (``calibrate --gpu h200`` writes OUT/h200.json) is a
# name, never a path: no "/" or "..", no NUL, a portable charset, a length every file system takes.
NAME_MAX_CHARS = 64
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")


def file_name(text: str) -> str:
    """An argparse type: a name that is safe as part of a file name inside an output folder."""
    value = str(text)
    if len(value) > NAME_MAX_CHARS or not _NAME.fullmatch(value) or ".." in value:
        raise argparse.ArgumentTypeError(
            f"expected a name (letters, digits and . _ + -, starting with a letter or digit, no '..', at most "
            f"{NAME_MAX_CHARS} characters): it names files in the output folder; got {value[:80]!r}")
    return value


def positive_float(text: str) -> float:
    """An argparse type: a finite number > 0."""
    value = _parse_float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number (> 0), got {text!r}")
    return value


def nonneg_float(text: str) -> float:
    """An argparse type: a finite number >= 0."""
    value = _parse_float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative number (>= 0), got {text!r}")
    return value


def comma_list(item: Callable[[str], Any] = str, *, unique: bool = True) -> Callable[[str], list]:
    """An argparse type: comma-separated values, each parsed by ``item``; at least one value, and
    (``unique``) no value twice (a repeated value would count its work twice)."""
    def parse(text: str) -> list:
        parts = [p.strip() for p in str(text).split(",")]
        if not any(parts):
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of values, got {text!r}")
        if "" in parts:
            raise argparse.ArgumentTypeError(f"empty item in {text!r}")
        values = []
        for p in parts:
            try:
                values.append(item(p))
            except argparse.ArgumentTypeError as exc:
                raise argparse.ArgumentTypeError(f"{exc} (in {text!r})" if len(parts) > 1 else str(exc)) from None
        if unique:
            seen = set()
            for p, v in zip(parts, values, strict=True):
                if v in seen:
                    raise argparse.ArgumentTypeError(f"{p} is given twice in {text!r}")
                seen.add(v)
        return values

    parse.__name__ = "list"
    parse.item = item  # type: ignore[attr-defined] - what each element is parsed by (tests read it)
    return parse


def check_policies(names: Sequence[str], valid: Sequence[str], option: str = "--policy") -> list[str]:
    """The policy list of ``option``, checked against ``valid`` (the registry's names): at least
    one, each known, none twice. Raises HisparseError naming the option."""
    from ..errors import HisparseError

    names = [n.strip() for n in names]
    known = ", ".join(valid)
    if not names or any(not n for n in names):
        raise HisparseError(f"{option}: give at least one policy, comma-separated (policies: {known})")
    for n in names:
        if n not in valid:
            raise HisparseError(f"{option}: unknown policy {n!r} (policies: {known})")
    dup = next((n for i, n in enumerate(names) if n in names[:i]), None)
    if dup is not None:
        raise HisparseError(f"{option}: {dup} is given twice (each policy once)")
    return list(names)


# -- inputs and outputs, checked before a command runs -------------------------------------------
@dataclass(frozen=True)
class Output:
    """An output option: ``dest`` on the namespace, a file or a folder, allowed suffixes."""

    dest: str
    kind: str = "file"
    suffixes: tuple[str, ...] = ()
    # a folder's files (names inside it; "parts/" a sub-folder), or a function of the arguments
    # giving them: each is checked against every input, as the output itself is
    files: tuple[str, ...] | Callable[[argparse.Namespace], Sequence[str]] = ()
    # a file output written as several files (one per k, a .partial beside each): their paths
    expand: Callable[[argparse.Namespace], Sequence[str]] | None = None

    @property
    def option(self) -> str:
        return "--" + self.dest.replace("_", "-")


def declare_io(parser: argparse.ArgumentParser, *, inputs: Sequence[str] = (),
               outputs: Sequence[Output] = (), more_inputs: Callable[[argparse.Namespace], Any] | None = None,
               streams: Sequence[str] = ()) -> None:
    """Name the namespace fields that hold input paths (a path, a comma list or a list of them)
    and the outputs; ``check_io`` tests them before the command runs. ``more_inputs(args)``
    gives the (option, path) pairs of files the command reads that no option names as given
    (a preset name's file, the traces a grid file names). ``streams``: the input fields that
    take /dev/stdin by design (read whole from descriptor 0)."""
    options = {a.dest: (a.option_strings[0] if a.option_strings else (a.metavar or a.dest.upper()))
               for a in parser._actions}
    parser.set_defaults(_inputs=tuple((dest, options.get(dest, "--" + dest.replace("_", "-"))) for dest in inputs),
                        _outputs=tuple(outputs), _more_inputs=more_inputs,
                        _streams=tuple(options.get(d, d) for d in streams))


def _input_paths(args: argparse.Namespace) -> list[tuple[str, str]]:
    """(option, path) of every input path the user gave."""
    paths: list[tuple[str, str]] = []
    for dest, option in getattr(args, "_inputs", ()):
        value = getattr(args, dest, None)
        if value is None:
            continue
        items = value if isinstance(value, list | tuple) else str(value).split(",")
        paths.extend((option, str(v)) for v in items if str(v))
    return paths


def _exists(path: str) -> bool:
    import os

    try:
        os.lstat(path)
    except (OSError, ValueError):  # missing, a name too long, a NUL byte: the command says what
        return False
    return True


def check_io(args: argparse.Namespace) -> None:
    """Every input that is a file is a regular one (a FIFO would block the first ``open()``);
    every declared output is writable, of the right kind and suffix, and neither it nor any
    file it will hold is an input (before any work: a mistake costs nothing and overwrites
    nothing)."""
    from ..fileio import OutputError, check_input, check_output

    named = _input_paths(args)
    more = getattr(args, "_more_inputs", None)
    if more is not None:
        named += [(option, str(path)) for option, path in more(args)]
    streams = getattr(args, "_streams", ())
    for option, path in named:
        if _exists(path):  # a missing one may be a preset name: the command says which it is
            check_input(path, option=option, special_ok=option in streams)
    inputs = [path for _, path in named]
    claimed: dict[str, str] = {}  # the paths earlier outputs write: what writes each
    for out in getattr(args, "_outputs", ()):
        path = getattr(args, out.dest, None)
        if path is None:
            continue
        path = str(path)
        files = out.files(args) if callable(out.files) else out.files
        check_output(path, option=out.option, kind=out.kind, inputs=inputs, files=files)
        _claim(claimed, out, path, files)
        for written in out.expand(args) if out.expand else ():
            if str(written) != path:
                check_output(str(written), option=out.option, kind=out.kind, inputs=inputs)
        if out.suffixes and not path.lower().endswith(out.suffixes):
            raise OutputError(f"{out.option} {path}: use a {' or '.join(out.suffixes)} file name")


def _claim(claimed: dict[str, str], out: Output, path: str, files: Sequence[str]) -> None:
    """Record the paths ``out`` writes (a folder: the folder and its files), refusing one an
    earlier output writes too: ``plan --out D --report D`` wrote D's files, then failed on the
    page with the folder half of the run's output."""
    import os

    from ..fileio import OutputError

    real = os.path.realpath(path)
    mine = {real: f"{out.option}'s {'folder' if out.kind == 'dir' else 'file'}"}
    if out.kind == "dir":
        mine |= {os.path.join(real, f.rstrip("/")): f"{f.rstrip('/')} in {out.option}'s folder" for f in files}
    for where in mine:
        if where in claimed:
            what = "is also" if where == real else f"would write {where}, also"
            raise OutputError(f"{out.option} {path}: {what} {claimed[where]}; give each output its own path")
    claimed.update(mine)


# -- trace input -----------------------------------------------------------------------------
def add_trace_input(parser: argparse.ArgumentParser) -> None:
    """The TRACE argument every trace-reading command takes, with .npy interop options."""
    parser.add_argument("trace", metavar="TRACE", help="a .hst trace file, or a .npy int array [steps, k] (-1 pads)")
    parser.add_argument("--ctx0", type=positive_int, default=None, metavar="N",
                        help=".npy only: ctx_len at step 0, growing by one per step "
                             "(default: the largest index in step 0, plus one)")
    parser.add_argument("--recover", action="store_true",
                        help="read the complete chunks of a trace whose writer never closed it")


def open_input(args: argparse.Namespace, *, need_accesses: bool = False):
    """The trace of ``args.trace``; ``need_accesses`` refuses one with nothing to replay."""
    from ..trace import open_trace

    trace = open_trace(args.trace, ctx0=args.ctx0, recover=args.recover)
    if need_accesses:
        require_accesses(trace, args.trace)
    return trace


def require_accesses(trace, path) -> None:
    """Refuse a trace with nothing to replay (no streams, or only empty / -1 padded steps): its
    miss ratio would print as 0 and mean nothing."""
    from ..errors import TraceError

    if trace.accesses == 0:
        what = "no streams" if len(trace) == 0 else "no accesses (every step is empty or -1 padding)"
        raise TraceError(f"the trace holds {what}: nothing to replay", path=path)


def print_json(obj: Any) -> None:
    """Strict JSON on stdout: NaN and infinity print as null (``json_safe``), never bare."""
    import json  # not with the module: a replay's table needs no JSON (start-up)

    json.dump(json_safe(obj), sys.stdout, indent=2, default=_jsonable, allow_nan=False)
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
