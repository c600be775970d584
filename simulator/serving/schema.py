"""The preset files' schema, read from the spec dataclasses (``specs.py``): every key with its
type, unit, meaning (the field's ``help`` or the comment beside or above it), whether it is required
and its default; and a complete, commented preset file written from an existing one.

Nothing here is a second copy of the rules: the keys, types and defaults are the dataclasses', the
domains their ``num(...)`` metadata, so the schema cannot drift from what ``presets.load`` checks.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import re
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path, PurePath
from typing import Any

from .. import inputs
from ..errors import HisparseError
from . import presets as P
from .specs import _domain, _hints

# a key's unit, from its name (the specs' naming convention)
_UNITS = (("_bytes", "bytes"), ("_bw", "bytes/s"), ("_flops", "FLOP/s"), ("_us", "microseconds"),
          ("_ms", "milliseconds"), ("_per_s", "per second"), ("_tok_s", "tokens/s"), ("_tokens", "tokens"),
          ("_buffer_size", "slots"), ("page_size", "slots"))
ALIASES = {"model": "models", "gpu": "gpus", "deployment": "deployments", "workload": "workloads",
           "calibrations": "calibration", "cluster": "clusters"}


def kind_of(name: str) -> str:
    """A preset kind from its plural or singular name; a one-line error naming the kinds."""
    kind = ALIASES.get(name, name)
    if kind not in P.KINDS:
        raise HisparseError(f"unknown preset kind {name!r} (kinds: {', '.join(P.KINDS)})")
    return kind


def option_for(kind: str) -> str:
    """The ``hisparse plan`` option that takes a file of this kind."""
    return {"models": "model", "gpus": "gpu", "deployments": "deployment", "workloads": "workload",
            "hisparse": "hisparse-config", "calibration": "calibration",
            "clusters": "set deployment.cluster="}[kind_of(kind)]


def use_file(kind: str, path: str) -> str:
    """The ``hisparse plan`` argument that uses ``path`` as a preset of this kind (``--gpu my.toml``;
    a cluster is a deployment key, with no space: ``--set deployment.cluster=my.toml``)."""
    opt = option_for(kind)
    return f"--{opt}{path}" if opt.endswith("=") else f"--{opt} {path}"


@dataclass(frozen=True)
class Key:
    name: str
    type: str
    unit: str
    meaning: str
    required: bool
    default: Any
    domain: str

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _type_name(typ: Any) -> str:
    if isinstance(typ, type) and issubclass(typ, StrEnum):
        return "one of " + " | ".join(m.value for m in typ)
    return {int: "integer", float: "number", bool: "true/false", str: "string"}.get(typ, getattr(typ, "__name__", str(typ)))


def _comments(cls: type) -> dict[str, str]:
    """Each field's comment in the class source: the one beside it, else the block just above it."""
    out: dict[str, str] = {}
    try:
        lines = inspect.getsource(cls).splitlines()
    except (OSError, TypeError):
        return out
    block: list[str] = []
    field_line = re.compile(r"^\s{4}(\w+)\s*:\s*[^=]+?(?:=.*?)?(?:#\s*(?P<c>.*))?$")
    for line in lines:
        s = line.strip()
        if s.startswith("#"):
            block.append(s.lstrip("#").strip())
            continue
        m = field_line.match(line)
        if m and not s.startswith(("def ", "return", "kind:")):
            comment = (m.group("c") or "").strip() or " ".join(block)
            if comment:
                out.setdefault(m.group(1), comment)
        block = []
    return out


def _first_sentence(doc: str) -> str:
    return " ".join(doc.split())


def schema(kind: str) -> list[Key]:
    """The keys of a preset kind's files, in the dataclass's order."""
    cls = P.KINDS[kind_of(kind)]
    hints = _hints(cls)
    notes = _comments(cls)
    keys = []
    for f in dataclasses.fields(cls):
        if f.name == "where":
            continue
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        default = None if required else (f.default if f.default is not dataclasses.MISSING else f.default_factory())
        if isinstance(default, StrEnum):
            default = default.value
        if isinstance(default, tuple):
            default = list(default)
        meaning = f.metadata.get("help") or notes.get(f.name, "")
        unit = next((u for suffix, u in _UNITS if f.name.endswith(suffix)), "")
        domain = _domain(f.metadata) if any(f.metadata.get(k) is not None for k in ("gt", "ge", "le")) else ""
        typ = hints[f.name]
        tname = _type_name(typ)
        if f.name == "interconnect":
            tname, meaning = "table", ("[interconnect]: name and source (strings), then one inline table per "
                                       "collective, all of all_reduce, all_gather, reduce_scatter, all_to_all: "
                                       "{ latency_us = us or { GPUs = us }, busbw = bytes/s or { GPUs = bytes/s }, "
                                       "source = \"...\" } (nccl-tests busbw convention)")
        elif f.name == "sources":
            tname = "table of strings"
            meaning = meaning or "per-key source notes"
        elif f.name == "unsourced":
            tname = "list of strings"
        keys.append(Key(f.name, tname, unit, meaning, required, default, domain))
    return keys


def schema_doc(kind: str) -> str:
    """The kind's spec docstring (what a file of this kind describes)."""
    return _first_sentence(inspect.getdoc(P.KINDS[kind_of(kind)]) or "")


def files_line(kind: str) -> str:
    """Where files of a kind come from and how to make one of your own. A calibration is not made by
    ``presets new`` (it refuses the kind): ``hisparse calibrate`` writes one, ``presets show`` prints one."""
    kind = kind_of(kind)
    if kind == "calibration":
        return ("files: simulator/presets/calibration/*.toml and *.json, or your own: hisparse calibrate --out DIR "
                "writes DIR/<gpu>.json from kernels timed on the GPU it runs on; hisparse presets show calibration "
                "NAME prints one as TOML (a start for a .toml of your own)")
    return f"files: simulator/presets/{kind}/*.toml, or your own (hisparse presets new {kind} --from NAME --out FILE)"


def paths_line(kind: str, code: bool = False) -> str:
    """How the kind's keys that name another file read a relative path (``FILE_RELATIVE_KEYS``); ""
    for a kind with none. ``code``: the key names in backticks (the Markdown reference)."""
    kind = kind_of(kind)
    keys = [f"`{k}`" if code else k for k in FILE_RELATIVE_KEYS.get(kind, ())]
    if not keys:
        return ""
    take = "takes" if len(keys) == 1 else "take"
    copy = "(presets new --out rewrites it to name the same file from the copy's folder)"
    if kind in P.NAMED_KEYS:
        return (f"paths: {_and(keys)} {take} a preset name or the path of a .toml file; a relative path is looked "
                f"for in this file's folder first, then in the working folder {copy}")
    return (f"paths: {_and(keys)} {take} a packaged name or the path of a calibration .json; a relative path is "
            f"read from this file's folder only {copy}")


def _and(names: tuple[str, ...] | list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def format_schema(kind: str) -> str:
    kind = kind_of(kind)
    rows = schema(kind)
    lines = [f"{kind}: {schema_doc(kind)}", files_line(kind)] + ([paths_line(kind)] if paths_line(kind) else []) + [""]
    for k in rows:
        need = "required" if k.required else f"default {_toml_value(k.default) if k.default is not None else '-'}"
        extra = ", ".join(x for x in (k.unit, k.domain) if x)
        lines.append(f"{k.name} ({k.type}{', ' + extra if extra else ''}; {need})")
        if k.meaning:
            lines.append(f"    {k.meaning}")
    return "\n".join(lines) + "\n"



def _cell(text: object) -> str:
    """A Markdown table cell: pipes escaped, one line."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown_reference() -> str:
    """Every preset kind's keys as one Markdown page (docs/presets-reference.md is this text, so the
    reference cannot drift from the specs: a test compares them)."""
    out = ["# Preset reference", "",
           "Every key of every preset kind, generated from the spec dataclasses that check the files",
           "(`python -m simulator.serving.schema > docs/presets-reference.md` rewrites this page;",
           "`hisparse presets --schema KIND` prints one kind). Start a file of your own with",
           "`hisparse presets new KIND --from NAME --out FILE.toml`: a complete, commented copy.", "",
           "A key that names another file takes a relative path from the folder of the file that holds it, not",
           "the folder `hisparse` runs in: `gpu = \"my-gpu.toml\"` in `mydeploy/dep.toml` names",
           "`mydeploy/my-gpu.toml` from any working folder. Where no such file is there, "
           + "; ".join(f"{_and([f'`{k}`' for k in keys])} of {kind}" for kind, keys in P.NAMED_KEYS.items()),
           "are looked for in the working folder, as before (an error names both places); a GPU's `calibration` is",
           "read from the GPU file's folder only. `presets new --out` rewrites such a path so that the copy",
           "names the same file.", ""]
    for kind in P.KINDS:
        out += [f"## {kind}", "", schema_doc(kind), "",
                f"Shipped files: `simulator/presets/{kind}/`; `hisparse plan {use_file(kind, 'NAME|FILE')}`."
                + (f" Paths: {paths_line(kind, code=True)[len('paths: '):]}." if paths_line(kind) else ""), "",
                "| key | type | unit / domain | required / default | meaning |", "|---|---|---|---|---|"]
        for k in schema(kind):
            need = "required" if k.required else (_toml_value(k.default) if k.default is not None else "-")
            extra = ", ".join(x for x in (k.unit, k.domain) if x)
            out.append(f"| `{k.name}` | {_cell(k.type)} | {_cell(extra)} | {_cell(need)} | {_cell(k.meaning)} |")
        out.append("")
    return "\n".join(out)


# -- writing a complete preset file -----------------------------------------------------------------
def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, StrEnum):
        return json.dumps(v.value)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        short = f"{v:.6g}"
        return short if float(short) == v and any(c in short for c in ".e") else repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{json.dumps(str(k))} = {_toml_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(f"no TOML form for {type(v).__name__}")


# Keys whose value may be a path the loader reads from the preset file's own folder, which a copy
# written into another folder (``presets new --out``) rewrites to name the same file. A GPU's
# ``calibration`` when it is a relative ``.json`` path, read from the GPU file's folder only
# (``presets._calibration_path``; a packaged name is the same from anywhere). A deployment's gpu,
# hisparse and cluster and a cluster's gpu (``presets.NAMED_KEYS``) when they are a path rather than a
# preset name (``presets.resolve``'s test: a .toml / .json value, or a file): a relative one is read
# from the file's folder first, then from the working folder (``presets.beside``).
FILE_RELATIVE_KEYS: dict[str, tuple[str, ...]] = {"gpus": ("calibration",),
                                                  **{k: tuple(keys) for k, keys in P.NAMED_KEYS.items()}}


def _is_path(kind: str, key: str, value: Any, where: str) -> bool:
    """Whether ``value`` of ``key`` in a file at ``where`` is a path the loader reads from that file's
    folder when relative (``FILE_RELATIVE_KEYS``), not a preset name."""
    kind = kind_of(kind)
    if key not in FILE_RELATIVE_KEYS.get(kind, ()) or not isinstance(value, str) or not value.strip():
        return False
    if key in P.NAMED_KEYS.get(kind, {}):
        return (PurePath(value).suffix in (".toml", ".json") or Path(value).exists()
                or P.beside(value, where) != value)
    return value.endswith(".json")


def _named_file(kind: str, key: str, value: Any, where: str) -> Any:
    """What ``value`` names for a file at ``where``: a path as the absolute file it resolves to
    (symbolic links followed, as opening it does); any other value as it is."""
    if not _is_path(kind, key, value, where):
        return value
    if key in P.NAMED_KEYS.get(kind_of(kind), {}):  # from the file's folder where it is there, else the working one
        return Path(os.path.realpath(P.beside(value, where)))
    return Path(os.path.realpath(Path(where).parent / value))  # an absolute value: itself


def _rebased(kind: str, key: str, value: Any, where: str, out: str | Path) -> Any:
    """``value`` (read from the file ``where``) rewritten to name the same file from ``out``'s folder:
    relative where the two folders allow it, else absolute. An absolute path, or a relative one that
    already names the same file from there, is kept."""
    if not _is_path(kind, key, value, where) or Path(value).is_absolute():
        return value
    target = _named_file(kind, key, value, where)
    if _named_file(kind, key, value, str(out)) == target:
        return value
    try:
        return PurePath(os.path.relpath(target, os.path.realpath(Path(out).parent))).as_posix()
    except ValueError:  # another drive (Windows): no relative path between them
        return target.as_posix()


def _as_written(kind: str, spec: Any, data: dict[str, Any]) -> dict[str, Any]:
    """``spec``'s ``presets.NAMED_KEYS`` values as its file ``data`` gives them (``presets.load`` names a
    path found beside the file from the working folder): a copy writes, and compares, those."""
    return {key: data.get(key, getattr(spec, key)) for key in P.NAMED_KEYS.get(kind_of(kind), {})}


def in_comment(text: object) -> str:
    """``text`` fit for a TOML comment, which may hold no control character but tab: a file name with a
    newline wrote a header the copy could not parse back (an AssertionError's traceback)."""
    return re.sub(r"[\x00-\x08\x0a-\x1f\x7f]", lambda m: json.dumps(m.group())[1:-1], str(text))


def new_preset(kind: str, source: str, out: str | Path | None = None) -> str:
    """A complete preset file: every key of ``source`` (a preset name or file) with its value, the
    defaults it left out written out, each with a comment (meaning, type, unit, required/default);
    tables (a GPU's [interconnect]) copied from the source as they are. With ``out`` (where the text
    will be written), a path the loader reads from the file's folder (``FILE_RELATIVE_KEYS``) is
    rewritten to name the same file from ``out``'s (copied as it was, ``calibration = "cal.json"``
    beside the source named a cal.json beside ``out``, which is not there)."""
    kind = kind_of(kind)
    if kind == "calibration":
        raise HisparseError("presets new: calibration files are written by hisparse calibrate (or copy "
                            "simulator/presets/calibration/uncalibrated.toml)")
    path = P.resolve(kind, source)
    spec = P.load(kind, str(path))
    text = inputs.read_text(path, what="preset file")
    as_written = _as_written(kind, spec, P.read_toml(path))
    lines = [f"# {kind} preset written by `hisparse presets new {kind} --from {in_comment(source)}` from "
             f"{in_comment(path)}",
             f"# {schema_doc(kind)}", "# Every key is listed; `hisparse presets --schema " + kind + "` explains them.", ""]
    for k in schema(kind):
        if k.name in ("interconnect", "sources"):
            continue
        need = "required" if k.required else f"default {_toml_value(k.default)}"
        extra = ", ".join(x for x in (k.type, k.unit, k.domain) if x)
        if k.meaning:
            lines.append(f"# {k.meaning}")
        value = as_written.get(k.name, getattr(spec, k.name))
        if out is not None:
            rebased = _rebased(kind, k.name, value, str(path), out)
            if rebased != value:
                lines.append(f"# {in_comment(path)} has {k.name} = {_toml_value(value)}, a path from its "
                             "folder: rewritten to name the same file from this one's")
                value = rebased
        lines.append(f"{k.name} = {_toml_value(value)}    # {extra}; {need}")
    tables = re.search(r"^\[", text, flags=re.M)
    copied = text[tables.start():].rstrip() if tables else ""
    lines += _tables_not_copied(P.read_toml(path), copied)
    if copied:
        lines += ["", f"# tables as in {in_comment(path)}", copied]
    return "\n".join(lines) + "\n"


def _tables_not_copied(data: dict[str, Any], copied: str) -> list[str]:
    """``sources`` / ``interconnect`` given inline (``sources = { ... }``) or as dotted keys above the
    source's first table header: the copied table text lacks them, and they were dropped silently."""
    import tomllib

    try:
        in_copy = set(tomllib.loads(copied)) if copied else set()
    except tomllib.TOMLDecodeError:  # a "[" line inside a multi-line value: write them out (a repeat is an error)
        in_copy = set()
    return [f"{name} = {_toml_value(data[name])}" for name in ("sources", "interconnect")
            if name in data and name not in in_copy]


def check_loads(kind: str, text: str, where: str, source: str | None = None) -> None:
    """The written file loads back to the same spec as its source (no key lost or changed): with
    ``source``, the two specs are compared, not only the new one built."""
    import tomllib

    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:  # a bug here, not the user's input
        raise AssertionError(f"presets new wrote invalid TOML: {exc}") from None
    written = P.build(P.KINDS[kind_of(kind)], data, where)
    if source is None:
        return
    original = P.load(kind_of(kind), source)
    # a path read from the file's folder is compared by the file it names (``new_preset`` rewrites it),
    # each as its file spells it
    named = kind_of(kind) in P.NAMED_KEYS  # the only kinds whose spec holds a path as ``load`` names it
    mine = _as_written(kind, written, data) if named else {}
    theirs = _as_written(kind, original, P.read_toml(P.resolve(kind_of(kind), source))) if named else {}
    changed = [f.name for f in dataclasses.fields(written)
               if f.name != "where" and _named_file(kind, f.name, mine.get(f.name, getattr(written, f.name)), written.where)
               != _named_file(kind, f.name, theirs.get(f.name, getattr(original, f.name)), original.where)]
    if changed:
        raise HisparseError(f"presets new: the copy of {source} would not load as it is ({', '.join(changed)} "
                            "differ); nothing written")


def write_new_preset(kind: str, source: str, out: str | Path) -> str:
    from ..fileio import atomic_output

    text = new_preset(kind, source, out)
    check_loads(kind, text, str(out), source=source)
    with atomic_output(out) as fh:
        fh.write(text.encode())
    return text


if __name__ == "__main__":
    print(markdown_reference(), end="")
