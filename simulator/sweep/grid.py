"""Sweep grids: a TOML file whose lists expand into points (the cartesian product).

    kind = "replay"                      # or "plan"
    [fixed]                              # options every point shares
    trace = "traces/synthetic-dsa-like.hst"
    [grid]                               # any option may be a list; points = the product
    policy = ["lru", "opt"]
    buffer = [2048, 4096]

``replay`` points take the options of ``hisparse replay`` (trace, policy, buffer, semantics,
initial, reserve_newest, seed); ``plan`` points those of ``hisparse plan`` with one concurrency
(or rate) each (model, gpu, deployment, workload, hisparse, calibration, trace, concurrency, rate,
device_buffer_size, host_to_device_ratio, slo_tpot_ms, slo_ttft_s, seed). A value in [fixed] may also be a
list: it then counts as a grid axis.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import HisparseError
from ..inputs import read_toml
from ..replay.config import option_types

OPTIONS = {
    "replay": {"trace": str, **option_types()},  # a ReplayConfig's fields
    "plan": {"model": str, "gpu": str, "deployment": str, "workload": str, "hisparse": str, "calibration": str,
             "trace": str, "concurrency": int, "rate": float, "device_buffer_size": int,
             "host_to_device_ratio": float, "slo_tpot_ms": float, "slo_ttft_s": float, "seed": int},
}
REQUIRED = {"replay": ("trace",), "plan": ()}


@dataclass(frozen=True)
class Grid:
    kind: str
    points: tuple[dict[str, Any], ...]
    axes: tuple[str, ...]


def point_id(point: dict[str, Any]) -> str:
    """A stable name for a point: the hash of its options."""
    return hashlib.sha256(json.dumps(point, sort_keys=True).encode()).hexdigest()[:16]


def _file_of(kind: str, key: str, value: str) -> tuple | None:
    """What a path-valued option's value reads, as a comparable identity: the file's (device, inode)
    where it exists (a symlink, a hard link, ``./`` or an absolute spelling: one file), else its
    normalised absolute path; None for a value that names no file (a preset name that does not
    resolve is left to the up-front checks, which say what is wrong)."""
    from ..serving.presets import NO_FILE, PRESET_KEYS

    if key == "trace":
        target: str | None = value
    elif kind == "plan" and key in PRESET_KEYS:
        if key == "calibration" and value in NO_FILE:
            return None
        from ..serving.presets import resolve_or_none

        found = resolve_or_none(PRESET_KEYS[key], value)  # a shipped name resolves to its packaged file
        target = str(found) if found is not None else None
    else:
        return None
    if not target:
        return None
    try:
        st = os.stat(target)
        return ("inode", st.st_dev, st.st_ino)
    except (OSError, ValueError):
        return ("path", os.path.normpath(os.path.abspath(target)))


def _refuse_same_file(kind: str, key: str, values: list, where: str) -> None:
    """Two spellings of one file (``traces/x.hst`` and ``./traces/x.hst``, a relative and an absolute
    path, a preset name and its file) are one input: they ran as two points with the same result,
    each counted in results.parquet. Refused like a value given twice, naming both spellings."""
    seen: dict[tuple, str] = {}
    for v in values:
        ident = _file_of(kind, key, v) if isinstance(v, str) else None
        if ident is None:
            continue
        if ident in seen:
            raise HisparseError(f"{where}: {seen[ident]!r} and {v!r} name the same file (each file once; paths "
                                "are relative to the folder the sweep runs in)")
        seen[ident] = v


def load_grid(path: str | Path) -> Grid:
    """Read and check a grid file; errors name the file and the key."""
    path = Path(path)
    data = read_toml(path, what="grid file")
    extra = sorted(set(data) - {"kind", "fixed", "grid"})
    if extra:  # first: a misspelt kind (Kind = "replay") was reported as a missing one
        raise HisparseError(f"{path}: unknown section(s) {', '.join(extra)} (kind, [fixed], [grid])")
    kind = data.get("kind")
    if kind is None:
        raise HisparseError(f"{path}: missing kind (a top-level line kind = \"replay\" or kind = \"plan\", "
                            "before the [fixed] and [grid] tables)")
    if not isinstance(kind, str) or kind not in OPTIONS:
        raise HisparseError(f"{path}: kind must be \"replay\" or \"plan\", got {kind!r}")
    merged: dict[str, list] = {}
    for section in ("fixed", "grid"):
        if not isinstance(data.get(section, {}), dict):
            raise HisparseError(f"{path}: {section} must be a table ([{section}] with key = value lines), "
                                f"got {data[section]!r}")
        for key, value in data.get(section, {}).items():
            if key not in OPTIONS[kind]:
                raise HisparseError(f"{path}: [{section}] {key}: not a {kind} option "
                                    f"(options: {', '.join(OPTIONS[kind])})")
            if key in merged:  # [grid] would silently replace [fixed]
                raise HisparseError(f"{path}: {key} is in both [fixed] and [grid]; give it once")
            values = value if isinstance(value, list) else [value]
            if not values:
                raise HisparseError(f"{path}: [{section}] {key}: empty list")
            typ = OPTIONS[kind][key]
            for v in values:
                ok = isinstance(v, typ) or (typ is float and isinstance(v, int) and not isinstance(v, bool))
                if not ok or (typ is int and isinstance(v, bool)):
                    raise HisparseError(f"{path}: [{section}] {key} = {v!r}: expected {typ.__name__}")
            merged[key] = [typ(v) for v in values]
            repeated = sorted({v for v in merged[key] if merged[key].count(v) > 1}, key=str)
            if repeated:  # the same point twice: run twice and counted twice in results.parquet
                raise HisparseError(f"{path}: [{section}] {key}: {', '.join(map(repr, repeated))} given twice "
                                    "(each value once)")
            _refuse_same_file(kind, key, merged[key], f"{path}: [{section}] {key}")
    for key in REQUIRED[kind]:
        if key not in merged:
            raise HisparseError(f"{path}: missing option {key!r}")
    if kind == "plan" and "concurrency" in merged and "rate" in merged:
        raise HisparseError(f"{path}: give concurrency or rate, not both")
    keys = sorted(merged)
    from .. import limits

    n = 1
    for k in keys:
        n *= len(merged[k])
    limits.check(n, "HISPARSE_MAX_POINTS", f"{path}: grid of {' x '.join(f'{len(merged[k])} {k}' for k in keys if len(merged[k]) > 1) or '1 point'}",
                 unit="points", hint="shorter lists")
    points = tuple(dict(zip(keys, combo, strict=True)) for combo in itertools.product(*(merged[k] for k in keys)))
    axes = tuple(k for k in keys if len(merged[k]) > 1)
    return Grid(kind, points, axes)
