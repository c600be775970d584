"""The calibration file (``<gpu>.json``): what ``hisparse calibrate`` measured on one GPU, as one
typed record with one reader and one writer.

A file holds, for its GPU: ``params`` (the fitted cost parameters: swap-in launch and per-request
costs, the attention fit's launch and efficiency), ``gpu`` (figures measured there, which replace the
GPU preset's: link and HBM bandwidth, gather efficiency), ``fit`` and ``grid`` (the swap-in and
attention fits and the grids they were timed on), ``step_terms`` (every kernel of a decode step,
``costmodel.terms.StepTerms``), and ``comm`` (NCCL collectives, ``calibrate --comm``). Groups a
newer writer adds are carried unread in ``extra``. ``version`` says which layout the file has;
version 1 is every file written before the field existed.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import HisparseError

VERSION = 2
_GROUPS = ("params", "gpu", "fit", "grid", "step_terms", "comm")


@dataclass(frozen=True)
class CalibrationFile:
    source: str  # what was measured, on which GPU, by which command
    params: Mapping[str, Any] = field(default_factory=dict)
    gpu: Mapping[str, float] = field(default_factory=dict)
    fit: Mapping[str, Any] = field(default_factory=dict)
    grid: Mapping[str, Any] = field(default_factory=dict)
    step_terms: Mapping[str, Any] | None = None
    comm: Mapping[str, Any] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    version: int = VERSION
    where: str = field(default="<calibration>", compare=False)

    def groups(self) -> dict[str, Any]:
        """The measured groups by name (``StepTerms.from_calibration`` reads ``step_terms`` and ``fit``)."""
        out = {k: getattr(self, k) for k in _GROUPS if getattr(self, k) is not None}
        return out | dict(self.extra)

    def replace(self, **changes: Any) -> CalibrationFile:
        return dataclasses.replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "source": self.source, **self.groups()}


def read_calibration(path: str | os.PathLike) -> CalibrationFile:
    """The file at ``path``; every error names the file and the key."""
    from ..inputs import read_json

    where = str(path)
    if not Path(path).exists():
        raise HisparseError(f"{where}: no such calibration file")
    data = read_json(path, what="calibration file")  # size and nesting bounded; special files refused
    return from_json(data, where)


def from_json(data: Any, where: str) -> CalibrationFile:
    if not isinstance(data, dict):
        raise HisparseError(f"{where}: expected a JSON object, got {type(data).__name__}")
    version = data.get("version", 1)
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= VERSION:
        raise HisparseError(f"{where}: version = {version!r}: this hisparse-sim reads calibration files of version "
                            f"1 to {VERSION} (a newer one needs a newer hisparse-sim)")
    for key in _GROUPS:
        if key in data and not isinstance(data[key], dict):
            raise HisparseError(f"{where}: '{key}' must be an object, got {type(data[key]).__name__}")
    for key, value in data.get("gpu", {}).items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise HisparseError(f"{where}: gpu.{key} = {value!r} must be a finite number")
    source = data.get("source", "hisparse calibrate")
    if not isinstance(source, str):
        raise HisparseError(f"{where}: source must be a string")
    extra = {k: v for k, v in data.items() if k not in (*_GROUPS, "source", "version")}
    return CalibrationFile(source, dict(data.get("params", {})), dict(data.get("gpu", {})), dict(data.get("fit", {})),
                           dict(data.get("grid", {})), data.get("step_terms"), data.get("comm"), extra, VERSION,
                           where)


def write_calibration(cal: CalibrationFile, path: str | os.PathLike) -> None:
    """Write ``cal`` atomically (a temp file renamed over ``path``), strict JSON, the current version."""
    from ..fileio import atomic_output

    try:
        text = json.dumps(cal.replace(version=VERSION).to_json(), indent=2, allow_nan=False)
    except ValueError as exc:
        raise HisparseError(f"{path}: a fitted figure is not finite ({exc}); nothing written") from None
    with atomic_output(str(path)) as fh:
        fh.write(text.encode())
