"""Presets as TOML data files: models, GPUs, deployments, HiSparse configs, workloads and cost
parameters. Each option takes a preset name (a file under ``simulator/presets/KIND/``) or the
path of the user's own file; unknown, missing or out-of-range keys get an error naming the file.
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, TypeVar

from ..errors import HisparseError

PRESET_DIR = Path(__file__).resolve().parent.parent / "presets"


@dataclass(frozen=True)
class ModelSpec:
    name: str
    layers: int
    dense_layers: int
    attention_heads: int
    kv_row_bytes: int
    indexer_row_bytes: int
    indexer_heads: int
    indexer_head_dim: int
    top_k: int
    weight_bytes: float
    active_params: float
    expert_share: float
    experts: int
    experts_per_token: int

    def kv_bytes_per_token(self) -> int:
        return self.layers * self.kv_row_bytes

    def indexer_bytes_per_token(self) -> int:
        return self.layers * self.indexer_row_bytes


@dataclass(frozen=True)
class GpuSpec:
    name: str
    hbm_bytes: float
    hbm_bw: float
    bf16_flops: float
    link: str
    link_bw: float
    gather_efficiency: float
    gather_efficiency_large_rows: float

    def swap_bw(self, row_bytes: int) -> float:
        """Achievable zero-copy gather bandwidth over the host link for rows of this size."""
        eff = self.gather_efficiency_large_rows if row_bytes >= 1024 else self.gather_efficiency
        return self.link_bw * eff


@dataclass(frozen=True)
class DeploymentSpec:
    name: str
    gpu: str
    gpus: int
    tp: int
    dp: int
    mode: str
    mem_fraction: float
    activation_reserve_bytes: float
    host_bytes: float
    prefill_chunk_tokens: int


@dataclass(frozen=True)
class HiSparseSpec:
    top_k: int
    device_buffer_size: int
    host_to_device_ratio: float
    policy: str = "lru"


@dataclass(frozen=True)
class WorkloadSpec:
    name: str
    input_tokens: int
    output_tokens: int
    length_jitter: float
    arrival: str
    rate_per_s: float
    requests_per_client: int


@dataclass(frozen=True)
class CostParams:
    calibrated: bool
    source: str
    hbm_efficiency: float
    matmul_efficiency: float
    attention_efficiency: float
    per_layer_overhead_us: float
    swap_in_launch_us: float
    swap_in_overlap: float
    backup_overlap: float
    prefill_efficiency: float
    attention_launch_us: float = 0.0  # fixed cost of one attention launch (fitted by calibration)
    swap_in_per_request_us: float = 0.0  # swap-in bookkeeping per request per launch (fitted)
    attention_efficiency_fp8: float = 0.0  # for 656 B FP8 rows; 0: same as attention_efficiency
    attention_launch_fp8_us: float = 0.0  # FP8 rows' attention launch; 0: same as attention_launch_us
    swap_in_launch_fp8_us: float = 0.0  # 656 B rows' swap-in launch; 0: same as swap_in_launch_us
    swap_in_per_request_fp8_us: float = 0.0  # 656 B rows' per-request cost; 0: same as swap_in_per_request_us


T = TypeVar("T")
KINDS = {"models": ModelSpec, "gpus": GpuSpec, "deployments": DeploymentSpec, "hisparse": HiSparseSpec,
         "workloads": WorkloadSpec, "calibration": CostParams}
_SHARES = {"attention_efficiency_fp8", "expert_share", "gather_efficiency", "gather_efficiency_large_rows", "mem_fraction",
           "hbm_efficiency", "matmul_efficiency", "attention_efficiency", "swap_in_overlap",
           "backup_overlap", "prefill_efficiency", "length_jitter"}


def preset_names(kind: str) -> list[str]:
    return sorted(p.stem for p in (PRESET_DIR / kind).glob("*.toml"))


def _resolve(kind: str, spec: str) -> Path:
    path = Path(spec)
    if path.suffix == ".toml" or path.exists():
        if not path.exists():
            raise HisparseError(f"{spec}: no such file")
        return path
    preset = PRESET_DIR / kind / f"{spec}.toml"
    if not preset.exists():
        raise HisparseError(f"unknown {kind[:-1] if kind.endswith('s') else kind} preset {spec!r} "
                            f"(presets: {', '.join(preset_names(kind))}; or give a .toml file)")
    return preset


def load(kind: str, spec: str | dict[str, Any], **overrides: Any):
    """Load and check one preset (a name, a path, or an already-parsed dict). A calibration may
    also be the JSON that ``hisparse calibrate`` writes: its fitted ``params`` replace the
    uncalibrated defaults."""
    cls = KINDS[kind]
    if kind == "calibration" and isinstance(spec, str) and spec.endswith(".json"):
        spec = calibration_params(spec)
    if isinstance(spec, dict):
        where, data = f"<{kind}>", dict(spec)
    else:
        path = _resolve(kind, spec)
        where = str(path)
        try:
            data = tomllib.loads(path.read_text())
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise HisparseError(f"{where}: not valid TOML ({exc})") from None
    data.update({k: v for k, v in overrides.items() if v is not None})
    return _build(cls, data, where)


def _build(cls: type[T], data: dict[str, Any], where: str) -> T:
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise HisparseError(f"{where}: unknown key(s) {', '.join(unknown)} (known: {', '.join(known)})")
    missing = [n for n, f in known.items() if n not in data and f.default is dataclasses.MISSING]
    if missing:
        raise HisparseError(f"{where}: missing key(s) {', '.join(missing)}")
    values = {}
    for name, value in data.items():
        typ = known[name].type
        try:
            if typ in ("int", int):
                if isinstance(value, float) and not value.is_integer():
                    raise ValueError("not a whole number")
                value = int(value)
            elif typ in ("float", float):
                value = float(value)
            elif typ in ("bool", bool):
                if not isinstance(value, bool):
                    raise ValueError("not true/false")
            elif typ in ("str", str):
                value = str(value)
        except (TypeError, ValueError) as exc:
            raise HisparseError(f"{where}: {name} = {value!r}: {exc}") from None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if value < 0 or (name in _SHARES and value > 1):
                bound = "in [0, 1]" if name in _SHARES else ">= 0"
                raise HisparseError(f"{where}: {name} = {value} must be {bound}")
        values[name] = value
    obj = cls(**values)
    _check(obj, where)
    return obj


def _check(obj: Any, where: str) -> None:
    """Cross-field rules."""
    if isinstance(obj, HiSparseSpec):
        if obj.device_buffer_size < obj.top_k:
            raise HisparseError(f"{where}: device_buffer_size {obj.device_buffer_size} < top_k {obj.top_k} "
                                "(HiSparse needs room for a whole step's selection)")
        if obj.host_to_device_ratio < 1:
            raise HisparseError(f"{where}: host_to_device_ratio must be >= 1")
    if isinstance(obj, DeploymentSpec):
        if obj.mode not in ("colocated", "disaggregated"):
            raise HisparseError(f"{where}: mode must be colocated or disaggregated, not {obj.mode!r}")
        if obj.dp < 1 or obj.gpus % obj.dp or obj.tp < 1:
            raise HisparseError(f"{where}: gpus ({obj.gpus}) must be a multiple of dp ({obj.dp}), tp >= 1")
    if isinstance(obj, WorkloadSpec):
        if obj.arrival not in ("closed", "open"):
            raise HisparseError(f"{where}: arrival must be closed or open, not {obj.arrival!r}")
        if obj.input_tokens < 1 or obj.output_tokens < 1 or obj.requests_per_client < 1:
            raise HisparseError(f"{where}: input_tokens, output_tokens and requests_per_client must be >= 1")
    if isinstance(obj, ModelSpec) and obj.experts_per_token > obj.experts:
        raise HisparseError(f"{where}: experts_per_token > experts")


def calibration_params(path: str | Path) -> dict[str, Any]:
    """The uncalibrated defaults with a calibration JSON's fitted parameters on top."""
    import json

    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise HisparseError(f"{path}: no such calibration file") from None
    except ValueError as exc:
        raise HisparseError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data.get("params"), dict):
        raise HisparseError(f"{path}: no 'params' object (write it with hisparse calibrate)")
    base = tomllib.loads((PRESET_DIR / "calibration" / "uncalibrated.toml").read_text())
    base.update(data["params"])
    base["source"] = f"{path}: " + str(data.get("source", "hisparse calibrate"))
    return base


def calibration_gpu(path: str | Path) -> dict[str, Any]:
    """GPU figures a calibration JSON measured (link and HBM bandwidth, gather efficiency)."""
    import json

    return dict(json.loads(Path(path).read_text()).get("gpu", {}))


def load_gpu(name: str, calibration: str) -> GpuSpec:
    """A GPU preset, with the figures a calibration JSON measured on top (a TOML calibration or
    preset name measures none)."""
    return load("gpus", name, **(calibration_gpu(calibration) if calibration.endswith(".json") else {}))


CALIBRATION_DIR = Path(__file__).resolve().parents[2] / "calibration"


def calibration_file(gpu: str) -> Path | None:
    """calibration/<gpu>.json from ``hisparse calibrate``, if the repository holds one."""
    for base in (Path.cwd() / "calibration", CALIBRATION_DIR):
        path = base / f"{Path(gpu).stem}.json"
        if path.exists():
            return path
    return None
