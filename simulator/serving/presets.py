"""Presets as data files shipped inside the package: models, GPUs, deployments, HiSparse configs,
workloads (TOML), cost parameters (TOML) and calibrations (the JSON ``hisparse calibrate`` writes).

Each option takes a preset name (a file under ``simulator/presets/KIND/``, read through
``importlib.resources``: never the current directory or a checkout) or the path of the user's own
file. A key inside a preset file that names another file takes a relative path from that file's
folder (``NAMED_KEYS``, ``_calibration_path``). Unknown, missing or out-of-range keys are errors
naming the file and key; the checks themselves live in the specs' ``__post_init__`` (``specs.py``).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import Any, TypeVar

from .. import inputs
from ..costmodel.calibration_file import read_calibration
from ..costmodel.collectives import Interconnect, parse_interconnect
from ..errors import HisparseError
from .cluster import ClusterSpec
from .specs import CostParams, DeploymentSpec, GpuSpec, HiSparseSpec, ModelSpec, WorkloadSpec

PRESET_DIR = Path(str(files("simulator").joinpath("presets")))

T = TypeVar("T")
KINDS: dict[str, type] = {"models": ModelSpec, "gpus": GpuSpec, "deployments": DeploymentSpec,
                          "hisparse": HiSparseSpec, "workloads": WorkloadSpec, "calibration": CostParams,
                          "clusters": ClusterSpec}
UNCALIBRATED = "uncalibrated"
# top-level groups of a calibration JSON the serving model reads; any other group is carried along
_CALIBRATION_READ = ("params", "gpu", "comm")
# fitted parameters the serving model reads from the calibration's ``fit`` group (costmodel/pricing.py) instead
_READ_FROM_FIT = ("attention_efficiency", "attention_efficiency_fp8", "attention_launch_us", "attention_launch_fp8_us")


PUBLISHED_DIR = PRESET_DIR / "published"


def published_names() -> list[str]:
    """The shipped published-run sets (simulator/presets/published/*.toml)."""
    return sorted(p.stem for p in PUBLISHED_DIR.glob("*.toml"))


def preset_names(kind: str) -> list[str]:
    exts = ("*.toml", "*.json") if kind == "calibration" else ("*.toml",)
    return sorted({p.stem for ext in exts for p in (PRESET_DIR / kind).glob(ext)})


def _singular(kind: str) -> str:
    return {"models": "model", "gpus": "gpu", "deployments": "deployment", "workloads": "workload",
            "clusters": "cluster"}.get(kind, kind)


def calibration_base(out_json: str | os.PathLike) -> Path | None:
    """The calibration a run writing ``out_json`` (``OUT/<gpu>.json``) builds on: that file where it
    exists, else the package's calibration of the same GPU, else None (``calibrate --refit`` and
    ``--comm-refit`` keep its other groups; ``validate`` checks it)."""
    out_json = Path(out_json)
    if out_json.exists():
        return out_json
    packaged = PRESET_DIR / "calibration" / out_json.name
    return packaged if packaged.is_file() else None


# The plan options (and plan grid keys) that name a preset, by name or file, and the kind each is
# looked up in; read by ``hisparse plan``'s input checks and by the sweep's grid checks.
PRESET_KEYS = {"model": "models", "gpu": "gpus", "deployment": "deployments", "workload": "workloads",
               "hisparse": "hisparse", "calibration": "calibration"}
# values of those keys that name no file (``--calibration auto`` / ``none``)
NO_FILE = ("auto", "none", "")


def resolve(kind: str, spec: str) -> Path:
    """The file behind a preset name or a user's path."""
    if not spec.strip():  # Path("") is ".", the working folder: "'': not a file" said nothing useful
        raise HisparseError(f"empty {_singular(kind)}: give a preset name ({', '.join(preset_names(kind))}) or a "
                            ".toml file")
    path = Path(spec)
    if path.suffix in (".toml", ".json") or path.exists():
        if not path.is_file():
            raise HisparseError(f"{spec}: no such file" if not path.exists() else f"{spec}: not a file")
        return path
    for ext in (".toml", ".json") if kind == "calibration" else (".toml",):
        preset = PRESET_DIR / kind / f"{spec}{ext}"
        if preset.is_file():
            return preset
    # a calibration may also be the JSON hisparse calibrate writes
    files = "a .toml or calibration .json file" if kind == "calibration" else "a .toml file"
    raise HisparseError(f"unknown {_singular(kind)} preset {spec!r} (presets: {', '.join(preset_names(kind))}; "
                        f"or give {files})")


# Keys of a preset kind that name another preset, by name or by the path of a file, and the kind each
# names. A relative path is read from the folder of the file that holds the key first, then from the
# working folder (``beside``): a deployment kept beside its GPU file loads from any folder, and one
# naming a file in the working folder still loads as before. A preset name is looked up as
# ``resolve`` does. (A GPU's ``calibration`` path is read from the GPU file's folder only:
# ``_calibration_path``.) ``schema.FILE_RELATIVE_KEYS`` lists them for ``presets new``.
NAMED_KEYS: dict[str, dict[str, str]] = {"deployments": {"gpu": "gpus", "hisparse": "hisparse", "cluster": "clusters"},
                                         "clusters": {"gpu": "gpus"}}


def beside(value: str, where: str) -> str:
    """What a preset file at ``where`` reads for ``value`` of a ``NAMED_KEYS`` key: a relative path
    naming a file from that file's folder, as that path (``../mydeploy/gpu.toml``); else ``value`` as it
    is (a preset name, an absolute path, a relative path read from the working folder as before, or one
    that names the same file from both folders: it reads as it did, and compares as it did with the
    same spelling elsewhere, a cluster's gpu with its deployment's)."""
    if not isinstance(value, str) or not value.strip() or where.startswith("<"):  # "<deployment>": no file
        return value
    path = Path(value)
    if path.is_absolute():
        return value
    near = Path(where).parent / path
    if not near.is_file() or (path.is_file() and os.path.samefile(near, path)):
        return value
    return str(near)


def looked_in(value: str, where: str) -> str | None:
    """Why a relative path (a .toml or .json value, ``resolve``'s test) that a ``NAMED_KEYS`` key of
    the file at ``where`` gives reads nothing: a file in neither place ``beside`` looks, both named.
    None where ``resolve``'s own error says what is wrong (a preset name, a folder, an absolute path)."""
    if not isinstance(value, str) or not value.strip() or where.startswith("<"):
        return None
    path = Path(value)
    if path.is_absolute() or path.suffix not in (".toml", ".json") or path.exists() or (Path(where).parent / path).exists():
        return None
    return f"no such file in its folder ({Path(where).parent / path}) or the working folder ({Path.cwd() / path})"


def _read_beside(kind: str, data: dict[str, Any], where: str) -> dict[str, Any]:
    """``data`` of the file ``where`` with each ``NAMED_KEYS`` path found beside it named from the
    working folder, so that every reader of the spec (``load(kind, spec.gpu)``) reads that file."""
    for key in NAMED_KEYS.get(kind, {}):
        if key in data:
            data[key] = beside(data[key], where)
    return data


def deployment_files(deployment: str, gpu: str | None = None) -> list[tuple[str, Path]]:
    """(key, file) of each file a deployment reads through its ``NAMED_KEYS`` (its GPU, unless ``gpu``
    names one, its hisparse config, its cluster and the cluster's GPU) and its GPU's calibration
    file: the inputs behind the files a user names, for the input-against-output checks. What does not
    load is left out (the run says what is wrong with it)."""
    found: list[tuple[str, Path]] = []

    def named(kind: str, spec: Any) -> Any:
        try:
            spec_ = load(kind, spec)
        except (HisparseError, OSError, ValueError):
            return None
        found.append((_singular(kind), Path(spec_.where)))
        return spec_

    try:
        dep = load("deployments", deployment)
    except (HisparseError, OSError, ValueError):
        return []
    gpu_spec = named("gpus", gpu or dep.gpu)
    if dep.hisparse:
        named("hisparse", dep.hisparse)
    if dep.cluster and (cluster := named("clusters", dep.cluster)) is not None and cluster.gpu:
        named("gpus", cluster.gpu)
    if gpu_spec is not None:
        try:
            cal = _calibration_path(gpu_spec)
        except HisparseError:
            cal = None
        if cal is not None:
            found.append(("calibration", cal))
    return found


def resolve_or_none(kind: str, spec: str) -> Path | None:
    """``resolve``'s file, or None where the name does not resolve: for the input-against-output
    checks, which leave a bad name to the run that reads it (it says what is wrong)."""
    try:
        return resolve(kind, spec)
    except (HisparseError, OSError, ValueError):
        return None


def read_toml(path: Path) -> dict[str, Any]:
    """A preset TOML file, within the input size and nesting limits (``simulator.inputs``)."""
    return inputs.read_toml(path)


def load(kind: str, spec: str | Mapping[str, Any], **overrides: Any):
    """Load and check one preset (a name, a path, or an already-parsed mapping). A calibration may
    be a TOML parameter set or a calibration JSON (its fitted ``params`` over the uncalibrated
    defaults)."""
    cls = KINDS[kind]
    if kind == "calibration" and isinstance(spec, str):
        return load_calibration(spec).params
    if isinstance(spec, Mapping):
        where, data = f"<{_singular(kind)}>", dict(spec)
    else:
        path = resolve(kind, spec)
        where = str(path)
        data = _read_beside(kind, read_toml(path), where)
    data.update({k: v for k, v in overrides.items() if v is not None})
    return build(cls, data, where)


def build(cls: type[T], data: Mapping[str, Any], where: str) -> T:
    """A spec from parsed data: unknown and missing keys named here, values checked by the spec."""
    data = dict(data)
    known = {f.name: f for f in dataclasses.fields(cls) if f.name != "where"}
    if cls is GpuSpec:
        if "interconnect" not in data:
            raise HisparseError(f"{where}: missing [interconnect] table (GPU-to-GPU collectives with sources)")
        data["interconnect"] = parse_interconnect(data["interconnect"], where)
        if not isinstance(data.get("sources", {}), Mapping):
            raise HisparseError(f"{where}: sources must be a table")
    if cls is CostParams and "unsourced" in data:
        if not isinstance(data["unsourced"], (list, tuple)) or not all(isinstance(u, str) for u in data["unsourced"]):
            raise HisparseError(f"{where}: unsourced must be a list of term names")
        data["unsourced"] = tuple(data["unsourced"])
    unknown = sorted(set(data) - set(known))
    retired = [k for k in unknown if k in cls.retired]
    if retired:
        raise HisparseError(f"{where}: {retired[0]} is no longer read: {cls.retired[retired[0]]}")
    if unknown:
        raise HisparseError(f"{where}: unknown key(s) {', '.join(unknown)} (known: {', '.join(known)})")
    missing = [n for n, f in known.items() if n not in data and f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING]
    if missing:
        raise HisparseError(f"{where}: missing key(s) {', '.join(missing)}")
    return cls(**data, where=where)


# -- calibrations -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Calibration:
    """What a calibration supplies: cost parameters, measured GPU figures (which replace the GPU
    file's, and the plan output lists each one), measured collectives (``comm``), and any other
    term group the file holds (carried unread, so newer calibration files load)."""

    label: str
    params: CostParams
    gpu: Mapping[str, float] = field(default_factory=dict)
    comm: Mapping[str, Any] = field(default_factory=dict)
    terms: Mapping[str, Any] = field(default_factory=dict)
    unknown_params: Mapping[str, Any] = field(default_factory=dict)


def _uncalibrated_data() -> dict[str, Any]:
    return read_toml(PRESET_DIR / "calibration" / f"{UNCALIBRATED}.toml")


def load_calibration(spec: str) -> Calibration:
    """A calibration by name (``uncalibrated``, or a packaged JSON such as ``h200``) or by path."""
    path = resolve("calibration", spec)
    if path.suffix != ".json":
        return Calibration(str(path), build(CostParams, read_toml(path), str(path)))
    where = str(path)
    cal = read_calibration(path)
    if not cal.params:
        raise HisparseError(f"{where}: no 'params' object (write it with hisparse calibrate)")
    known = {f.name for f in dataclasses.fields(CostParams)} - {"where"}
    params = _uncalibrated_data()
    fitted = {k: v for k, v in cal.params.items() if k in known}
    params.update(fitted)
    # a fitted term has its source now
    params["unsourced"] = tuple(u for u in params.get("unsourced", ()) if u not in fitted)
    params["source"] = f"{where}: {cal.source}"
    gpu_known = {f.name for f in dataclasses.fields(GpuSpec)}
    bad = sorted(set(cal.gpu) - gpu_known)
    if bad:
        raise HisparseError(f"{where}: gpu.{bad[0]} is not a GPU figure (known: {', '.join(sorted(gpu_known))})")
    groups = cal.groups()
    return Calibration(where, build(CostParams, params, where), dict(cal.gpu), dict(cal.comm or {}),
                       {k: v for k, v in groups.items() if k not in _CALIBRATION_READ},
                       {k: v for k, v in cal.params.items() if k not in known and k not in _READ_FROM_FIT})


def calibration_params(path: str | Path) -> dict[str, Any]:
    """The uncalibrated defaults with a calibration JSON's fitted parameters on top (as a dict)."""
    p = load_calibration(str(path)).params
    return {f.name: getattr(p, f.name) for f in dataclasses.fields(p) if f.name != "where"}


def calibration_gpu(path: str | Path) -> dict[str, Any]:
    """GPU figures a calibration JSON measured (link and HBM bandwidth, gather efficiency)."""
    return dict(load_calibration(str(path)).gpu)


def load_gpu(name: str, calibration: str | None = None) -> GpuSpec:
    """A GPU preset, with the figures a calibration JSON measured on top (and its measured
    collectives in place of the preset's)."""
    gpu = load("gpus", name)
    if not calibration:
        return gpu
    cal = load_calibration(calibration)
    return apply_calibration(gpu, cal)


def apply_calibration(gpu: GpuSpec, cal: Calibration) -> GpuSpec:
    if not cal.gpu and not cal.comm:
        return gpu
    ic: Interconnect = gpu.interconnect.with_overrides(cal.comm, cal.label) if cal.comm else gpu.interconnect
    return dataclasses.replace(gpu, **cal.gpu, interconnect=ic, where=f"{gpu.where} (figures from {cal.label})")


def calibration_file(gpu: str) -> Path | None:
    """The packaged calibration a GPU preset or file names (its ``calibration`` key), if any."""
    spec = load("gpus", gpu)
    return _calibration_path(spec)


def _calibration_path(gpu: GpuSpec) -> Path | None:
    if not gpu.calibration:
        return None
    name = gpu.calibration
    base = Path(gpu.where).parent
    if name.endswith(".json"):
        path = Path(name) if Path(name).is_absolute() else base / name
        if not path.is_file():
            raise HisparseError(f"{gpu.where}: calibration = {name!r}: no such file {path}")
        return path
    try:
        return resolve("calibration", name)
    except HisparseError:
        raise HisparseError(f"{gpu.where}: calibration = {name!r}: no such packaged calibration "
                            f"(packaged: {', '.join(preset_names('calibration'))})") from None
