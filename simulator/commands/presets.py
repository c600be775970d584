"""``hisparse presets``: the shipped presets, each kind's schema (from the spec dataclasses), one preset
as resolved (``show``), and a complete commented preset file written from an existing one (``new``)."""

from __future__ import annotations

import argparse
from typing import Any

from .common import Output, declare_io, print_json

KINDS = ("models", "gpus", "deployments", "workloads", "hisparse", "calibration", "clusters")


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "presets", help="list presets, print a kind's schema, or write a new preset file from one",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="hisparse presets: the shipped presets of every kind.\n"
                    "hisparse presets --schema KIND: every key of KIND's files (type, unit, meaning, required or "
                    "default, domain), read from the spec dataclasses that check them.\n"
                    "hisparse presets show KIND NAME [--json]: one preset (a shipped name or your own file) as "
                    "it resolves, every key with its defaults written out, printed as TOML (the text presets new "
                    "writes; --json: the same keys as one JSON object). A calibration shows its cost terms as the "
                    "planner reads them (a calibration JSON's fitted terms over the uncalibrated ones; --json adds "
                    "its measured GPU figures as gpu, and its collectives as comm).\n"
                    "hisparse presets new KIND --from NAME --out FILE: a complete, commented copy of a preset (every "
                    "key, defaults written out) to edit; it loads back as it is.\n"
                    f"Kinds: {', '.join(KINDS)} (singular names work too).")
    p.add_argument("action", nargs="?", choices=["new", "show"],
                   help="new: write a preset file (with KIND, --from, --out); show: print one (with KIND NAME)")
    p.add_argument("kind", nargs="?", metavar="KIND", help="the kind for new and show")
    p.add_argument("name", nargs="?", metavar="NAME", help="show: the preset name or .toml file to print")
    p.add_argument("--schema", metavar="KIND", default=None, help="print the keys of KIND's files")
    p.add_argument("--from", dest="source", metavar="NAME", default=None, help="new: the preset or file to start from")
    p.add_argument("--out", metavar="FILE", default=None, help="new: the .toml file to write")
    p.add_argument("--json", action="store_true", help="the list, the schema or the shown preset as JSON")
    p.set_defaults(run=run_presets_cmd)
    declare_io(p, inputs=["source", "name"], outputs=[Output("out", suffixes=(".toml",))], more_inputs=source_file)


def source_file(args: argparse.Namespace) -> list[tuple[str, str]]:
    """--from's file when it is a preset name: checked against --out like a path is (``--from h200
    --out simulator/presets/gpus/h200.toml`` overwrote the shipped preset). A name that does not
    resolve is left to the command, which says what is wrong with it."""
    from ..errors import HisparseError
    from ..serving.presets import resolve_or_none
    from ..serving.schema import kind_of

    if args.action != "new" or not args.kind or not args.source:
        return []
    try:
        path = resolve_or_none(kind_of(args.kind), args.source)
    except HisparseError:  # an unknown KIND: the command says so
        return []
    return [("--from", str(path))] if path else []


def run_presets_cmd(args: argparse.Namespace) -> int:
    from ..errors import HisparseError
    from ..serving import schema as S
    from ..serving.presets import preset_names

    if args.action == "show":
        return _show(args)
    if args.action == "new":
        if args.name:  # read as nothing: the file came from --from
            raise HisparseError(f"presets new: {args.name!r}: the preset to copy is given with --from (hisparse "
                                f"presets new {args.kind} --from {args.name} --out FILE)")
        if args.schema:
            raise HisparseError("presets new: --schema does not apply (give KIND --from NAME --out FILE)")
        if args.json:  # was ignored: new writes a TOML file and prints one line
            raise HisparseError("presets new: --json does not apply (it writes --out as TOML; --json is for the "
                                "list and --schema)")
        missing = [o for o, v in (("KIND", args.kind), ("--from", args.source), ("--out", args.out)) if not v]
        if missing:
            raise HisparseError(f"presets new: give {', '.join(missing)} (e.g. hisparse presets new gpu --from h200 "
                                "--out my-gpu.toml)")
        kind = S.kind_of(args.kind)
        S.write_new_preset(kind, args.source, args.out)
        print(f"wrote {args.out}: a complete {kind} preset from {args.source}; use it as "
              f"{S.use_file(kind, args.out)} (hisparse presets --schema {kind} explains each key)")
        return 0
    if args.kind:
        raise HisparseError(f"presets: {args.kind!r} given without new (hisparse presets new KIND --from NAME --out FILE)")
    for opt, v in (("--from", args.source), ("--out", args.out)):
        if v:
            raise HisparseError(f"presets: {opt} belongs to presets new")
    if args.schema:
        kind = S.kind_of(args.schema)
        if args.json:
            print_json({"kind": kind, "doc": S.schema_doc(kind), "keys": [k.as_dict() for k in S.schema(kind)]})
        else:
            print(S.format_schema(kind), end="")
        return 0
    listing = {k: preset_names(k) for k in KINDS}
    if args.json:
        print_json(listing)
        return 0
    for k, names in listing.items():
        print(f"{k}: {', '.join(names)}")
    return 0


def _show(args: argparse.Namespace) -> int:
    """``presets show KIND NAME``: what a preset holds once loaded (defaults written out), without
    writing a file to read it."""
    from ..errors import HisparseError
    from ..serving import schema as S

    for opt, v in (("--schema", args.schema), ("--from", args.source), ("--out", args.out)):
        if v:
            raise HisparseError(f"presets show: {opt} does not apply (hisparse presets show KIND NAME [--json]; "
                                "presets new KIND --from NAME --out FILE writes a file)")
    missing = [o for o, v in (("KIND", args.kind), ("NAME", args.name)) if not v]
    if missing:
        raise HisparseError(f"presets show: give {', '.join(missing)} (e.g. hisparse presets show gpu h200; "
                            "hisparse presets lists the names)")
    kind = S.kind_of(args.kind)
    text, extra = shown_preset(kind, args.name)
    if args.json:
        import tomllib

        print_json({**tomllib.loads(text), **extra})
    else:
        print(text, end="")
    return 0


def shown_preset(kind: str, name: str) -> tuple[str, dict[str, Any]]:
    """The TOML text of preset ``name`` as it resolves (``presets new``'s rendering, checked to load
    back to the same spec), and what a JSON view adds (a calibration's measured GPU figures and
    collectives, which its TOML form cannot hold)."""
    from ..serving import presets as P
    from ..serving import schema as S

    path = P.resolve(kind, name)
    if kind == "calibration":
        text, extra = _calibration_text(name, path)
    else:
        body = S.new_preset(kind, name).split("\n", 1)[1]  # its first line says `presets new` wrote it
        text, extra = f"# {kind} preset {S.in_comment(name)} as it resolves, from {S.in_comment(path)}\n" + body, {}
    S.check_loads(kind, text, str(path), source=name)
    return text, extra


def _calibration_text(name: str, path) -> tuple[str, dict[str, Any]]:
    """A calibration's cost terms as the planner reads them (``presets new`` writes no calibration:
    ``hisparse calibrate`` does), each with the schema's comment."""
    from ..serving import presets as P
    from ..serving import schema as S

    cal = P.load_calibration(name)
    lines = [f"# calibration {S.in_comment(name)} as it resolves, from {S.in_comment(path)}", f"# {S.schema_doc('calibration')}",
             "# Every key is listed; `hisparse presets --schema calibration` explains them.", ""]
    for k in S.schema("calibration"):
        need = "required" if k.required else f"default {S._toml_value(k.default)}"
        extra = ", ".join(x for x in (k.type, k.unit, k.domain) if x)
        if k.meaning:
            lines.append(f"# {k.meaning}")
        lines.append(f"{k.name} = {S._toml_value(getattr(cal.params, k.name))}    # {extra}; {need}")
    more: dict[str, Any] = {}
    if cal.gpu:
        more["gpu"] = dict(cal.gpu)
        lines += ["", "# measured GPU figures: they replace the GPU preset's where this calibration is used"]
        lines += [f"#   {k} = {S._toml_value(v)}" for k, v in cal.gpu.items()]
    if cal.comm:
        more["comm"] = dict(cal.comm)
        lines += ["", f"# measured collectives (comm: {', '.join(map(str, cal.comm))}): they replace the GPU "
                      "preset's [interconnect] where this calibration is used"]
    if cal.terms:
        lines += ["", f"# also in {S.in_comment(path)}, read by the cost model itself: {', '.join(map(str, cal.terms))}"]
    return "\n".join(lines) + "\n", more
