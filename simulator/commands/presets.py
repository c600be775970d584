"""``hisparse presets``: the shipped presets, each kind's schema (from the spec dataclasses), and a
complete commented preset file written from an existing one."""

from __future__ import annotations

import argparse

from .common import Output, declare_io, print_json

KINDS = ("models", "gpus", "deployments", "workloads", "hisparse", "calibration", "clusters")


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "presets", help="list presets, print a kind's schema, or write a new preset file from one",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="hisparse presets: the shipped presets of every kind.\n"
                    "hisparse presets --schema KIND: every key of KIND's files (type, unit, meaning, required or "
                    "default, domain), read from the spec dataclasses that check them.\n"
                    "hisparse presets new KIND --from NAME --out FILE: a complete, commented copy of a preset (every "
                    "key, defaults written out) to edit; it loads back as it is.\n"
                    f"Kinds: {', '.join(KINDS)} (singular names work too).")
    p.add_argument("action", nargs="?", choices=["new"], help="new: write a preset file (with KIND, --from, --out)")
    p.add_argument("kind", nargs="?", metavar="KIND", help="the kind for new")
    p.add_argument("--schema", metavar="KIND", default=None, help="print the keys of KIND's files")
    p.add_argument("--from", dest="source", metavar="NAME", default=None, help="new: the preset or file to start from")
    p.add_argument("--out", metavar="FILE", default=None, help="new: the .toml file to write")
    p.add_argument("--json", action="store_true", help="the list or the schema as JSON")
    p.set_defaults(run=run_presets_cmd)
    declare_io(p, inputs=["source"], outputs=[Output("out", suffixes=(".toml",))], more_inputs=source_file)


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

    if args.action == "new":
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
