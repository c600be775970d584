"""The one reader of TOML and JSON inputs: a size budget and a nesting bound, checked before parsing.

Every TOML or JSON file a command reads (presets, grids, knobs, targets, calibration JSON, a
trace's metadata) goes through ``read_toml`` / ``read_json`` / ``parse_json``, so one set of
limits holds for all of them:

- at most ``max_input_bytes()`` bytes are read (``HISPARSE_MAX_INPUT_BYTES``, default 16 MiB):
  ``/dev/zero`` or a multi-gigabyte file is refused after reading the budget, not when memory
  runs out;
- arrays and tables nest at most ``max_depth()`` levels (``HISPARSE_MAX_NESTING``, default 64;
  the shipped files nest 3): the text is scanned for its bracket depth before the parser sees it,
  so a 5,000-deep array is a one-line error, never a RecursionError;
- a leading UTF-8 byte-order mark is dropped before parsing (``_text`` says why);
- JSON has no NaN or Infinity: ``NaN``, ``Infinity`` and ``-Infinity`` literals are refused
  (Python's json module would accept them and write them back as bare, invalid JSON).

Errors are ``HisparseError`` naming the file (and how to raise a limit).
"""

from __future__ import annotations

import math
import os
import re
from typing import Any

from .errors import HisparseError

DEFAULT_MAX_INPUT_BYTES = 16 * 2**20
DEFAULT_MAX_DEPTH = 64


def env_limit(name: str, default: int) -> int:
    """A positive integer limit from the environment variable ``name`` (``default`` if unset);
    a malformed value is a user error naming the variable."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = int(float(text)) if re.fullmatch(r"[0-9.eE+]+", text) else int(text)
    except (ValueError, OverflowError):
        raise HisparseError(f"environment variable {name}={text!r}: expected a positive integer") from None
    if value < 1:
        raise HisparseError(f"environment variable {name}={text!r}: expected a positive integer")
    return value


READ_PIECE = 1 << 24  # bytes read_bytes asks for at a time


def max_input_bytes() -> int:
    return env_limit("HISPARSE_MAX_INPUT_BYTES", DEFAULT_MAX_INPUT_BYTES)


def max_depth() -> int:
    return env_limit("HISPARSE_MAX_NESTING", DEFAULT_MAX_DEPTH)


def read_bytes(path: str | os.PathLike, *, what: str = "file", limit: int | None = None) -> bytes:
    """At most ``limit`` bytes of ``path`` (default ``max_input_bytes()``); more is an error."""
    from .fileio import check_input

    limit = max_input_bytes() if limit is None else limit
    if os.path.exists(path) or os.path.islink(path):
        check_input(path)  # from stat alone: a FIFO, device or socket would block or never end
    try:
        with open(path, "rb") as fh:
            # in pieces: read(limit + 1) allocates its argument up front, so a raised limit
            # (HISPARSE_MAX_INPUT_BYTES=1e11, 2**63) failed every small read: out of memory, OverflowError
            pieces, got = [], 0
            while got <= limit:
                piece = fh.read(min(limit + 1 - got, READ_PIECE))
                if not piece:
                    break
                pieces.append(piece)
                got += len(piece)
            data = b"".join(pieces)
    except FileNotFoundError:
        raise HisparseError(f"{path}: no such {what}") from None
    except OSError as exc:
        raise HisparseError(f"{path}: cannot read the {what} ({exc.strerror or exc})") from None
    if len(data) > limit:
        raise HisparseError(f"{path}: {what} larger than {limit} bytes, the input size limit "
                            "(set HISPARSE_MAX_INPUT_BYTES to raise it)")
    return data


UTF8_BOM = b"\xef\xbb\xbf"


def _text(data: bytes, where: str, what: str) -> str:
    """A file's bytes as text. One leading UTF-8 byte-order mark is dropped: it is the encoding's
    signature, not content (Windows editors, Notepad's "UTF-8 with BOM", write it), and neither
    tomllib nor json take it (a BOM-marked grid was "not valid TOML (Invalid statement at line 1,
    column 1)"); RFC 8259 lets a JSON parser ignore it. A byte offset in an error counts from the
    file's first byte, BOM included."""
    start = len(UTF8_BOM) if data.startswith(UTF8_BOM) else 0
    try:
        return data[start:].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HisparseError(f"{where}: not a UTF-8 text {what} ({exc.reason} at byte {exc.start + start})") from None


# What can hold a bracket that is not nesting: strings (and TOML comments). Scanned in this order.
_TOML_TOKENS = re.compile(r'"""[\s\S]*?"""|\'\'\'[\s\S]*?\'\'\'|"(?:[^"\\\n]|\\.)*"|\'[^\'\n]*\'|#[^\n]*|[\[\]{}]')
_JSON_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def nesting_depth(text: str, *, toml: bool, stop: int | None = None) -> int:
    """The deepest bracket nesting of ``text`` outside strings (and comments): an upper bound
    of the parsed data's depth (a TOML table header ``[[a.b]]`` counts 2). Stops early once
    past ``stop``."""
    depth = deepest = 0
    for m in (_TOML_TOKENS if toml else _JSON_TOKENS).finditer(text):
        c = m.group()
        if c in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if stop is not None and deepest > stop:
                    return deepest
        elif c in "]}":
            depth = max(depth - 1, 0)
    return deepest


def _check_depth(text: str, where: str, *, toml: bool) -> None:
    limit = max_depth()
    if nesting_depth(text, toml=toml, stop=limit) > limit:
        raise HisparseError(f"{where}: arrays or tables nested more than {limit} levels deep "
                            "(set HISPARSE_MAX_NESTING to raise the limit)")


def parse_toml(text: str, where: str) -> dict[str, Any]:
    """Parse TOML text (already within the size budget) with the nesting bound."""
    import tomllib

    _check_depth(text, where, toml=True)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise HisparseError(f"{where}: not valid TOML ({exc})") from None
    except RecursionError:  # the scan's bound is above what the parser can take
        raise HisparseError(f"{where}: arrays or tables nested too deep") from None


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON (JSON has no NaN or infinity)")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object's members, refusing a name given twice (json keeps the last one silently, where
    TOML refuses it: ``{"gpu": {"link_bw": 5.5e10, "link_bw": 1}}`` priced the link at 1 B/s)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"key {key!r} is given twice in one object")
        out[key] = value
    return out


def parse_json(text: str | bytes, where: str) -> Any:
    """Parse JSON text with the nesting bound, refusing NaN and Infinity literals and a key given
    twice in one object."""
    import json

    if isinstance(text, bytes | bytearray | memoryview):
        text = _text(bytes(text), where, "JSON file")
    _check_depth(text, where, toml=False)
    try:
        return json.loads(text, parse_constant=_no_constant, object_pairs_hook=_no_duplicates)
    except ValueError as exc:
        raise HisparseError(f"{where}: not valid JSON ({exc})") from None
    except RecursionError:
        raise HisparseError(f"{where}: arrays or objects nested too deep") from None


def read_text(path: str | os.PathLike, *, what: str = "file") -> str:
    """A UTF-8 text file, read within the size budget, a leading byte-order mark dropped (``_text``)."""
    return _text(read_bytes(path, what=what), str(path), what)


def read_toml(path: str | os.PathLike, *, what: str = "TOML file") -> dict[str, Any]:
    """A TOML file, read within the size budget and parsed with the nesting bound. A leading UTF-8
    byte-order mark is accepted (dropped), though tomllib refuses it: editors on Windows save "UTF-8
    with BOM", and refusing a grid or preset for an invisible encoding signature helps no one."""
    return parse_toml(read_text(path, what=what), str(path))


def read_json(path: str | os.PathLike, *, what: str = "JSON file") -> Any:
    """A JSON file, read within the size budget and parsed with the nesting bound."""
    return parse_json(read_bytes(path, what=what), str(path))


def json_safe(value: Any) -> Any:
    """``value`` with every NaN or infinity (Python or numpy) as None: JSON has no NaN, and
    ``json.dumps`` would write a bare ``NaN`` that strict parsers refuse."""
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if getattr(value, "ndim", 0) and hasattr(value, "tolist"):  # a numpy array: its elements
        return json_safe(value.tolist())
    if isinstance(value, float) or (hasattr(value, "item") and hasattr(value, "dtype") and value.dtype.kind == "f"):
        value = float(value)
        return value if math.isfinite(value) else None
    return value


def dumps_json(obj: Any, **kw: Any) -> str:
    """Strict JSON (no NaN or infinity: they become null), for every JSON this project writes."""
    import json

    return json.dumps(json_safe(obj), allow_nan=False, **kw)
