"""Capacity planning: sweep concurrency (and HiSparse knobs), baseline against HiSparse, and pick
the best configuration under a TPOT target."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..errors import HisparseError
from . import presets as P
from .misses import miss_profiles
from .model import simulate


@dataclass(frozen=True)
class PlanInputs:
    model: str = "glm-5.1-fp8"
    gpu: str | None = None  # default: the deployment's GPU
    deployment: str = "8xh200-colocated-dp8"
    workload: str = "32k-in-8k-out"
    hisparse: str = "blog-8xh200"
    calibration: str = "auto"  # calibration/<gpu>.json when committed, else "uncalibrated"
    trace: str | None = None  # default: the bundled DSA-like trace
    concurrency: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    rates: tuple[float, ...] = ()  # open loop: sweep arrival rates (requests/s) instead of concurrency
    slo_tpot_ms: float = 100.0
    buffers: tuple[int, ...] = ()  # sweep device_buffer_size (empty: the config's)
    host_ratios: tuple[float, ...] = ()  # sweep host_to_device_ratio (empty: the config's)
    seed: int = 0


def load_inputs(inp: PlanInputs):
    dep = P.load("deployments", inp.deployment)
    gpu_name = inp.gpu or dep.gpu
    calibration = inp.calibration
    if calibration == "auto":  # the GPU's own calibration when one was committed, else the defaults
        found = P.calibration_file(gpu_name)
        calibration = str(found) if found else "uncalibrated"
    gpu = P.load_gpu(gpu_name, calibration)
    return dict(model=P.load("models", inp.model), gpu=gpu, dep=dep,
                workload=P.load("workloads", inp.workload), params=P.load("calibration", calibration),
                hisparse=P.load("hisparse", inp.hisparse), calibration=calibration)


def run_plan(inp: PlanInputs, on_point: Callable[[], None] | None = None) -> list[dict]:
    """One row per (system, knobs, concurrency)."""
    if not inp.concurrency or min(inp.concurrency) < 1:
        raise HisparseError("--concurrency needs positive integers")
    if inp.rates and min(inp.rates) <= 0:
        raise HisparseError("--rate needs positive arrival rates")
    cfg = load_inputs(inp)
    # one load point per concurrency (closed loop) or per arrival rate (open loop)
    if inp.rates:
        points = [(0, dataclasses.replace(cfg["workload"], arrival="open", rate_per_s=r)) for r in inp.rates]
    elif cfg["workload"].arrival == "open":
        points = [(0, cfg["workload"])]
    else:
        points = [(c, cfg["workload"]) for c in inp.concurrency]
    hs0 = cfg["hisparse"]
    if hs0.top_k != cfg["model"].top_k:
        raise HisparseError(f"HiSparse top_k {hs0.top_k} differs from the model's top_k {cfg['model'].top_k}")
    knob_sets = [dataclasses.replace(hs0, device_buffer_size=b, host_to_device_ratio=r)
                 for b in (inp.buffers or (hs0.device_buffer_size,))
                 for r in (inp.host_ratios or (hs0.host_to_device_ratio,))]
    for hs in knob_sets:
        if hs.device_buffer_size < hs.top_k:
            raise HisparseError(f"device_buffer_size {hs.device_buffer_size} < top_k {hs.top_k}")
    initial = "prefix" if cfg["dep"].mode == "colocated" else "empty"
    common = dict(model=cfg["model"], gpu=cfg["gpu"], dep=cfg["dep"], params=cfg["params"], seed=inp.seed)
    rows: list[dict] = []
    for c, w in points:
        rows.append(_row(simulate("baseline", c, hisparse=None, profiles=None, workload=w, **common), None, cfg))
        if on_point:
            on_point()
    for hs in knob_sets:
        profiles = miss_profiles(inp.trace, top_k=hs.top_k, buffer=hs.device_buffer_size, policy=hs.policy,
                                 initial=initial)
        for c, w in points:
            rows.append(_row(simulate("hisparse", c, hisparse=hs, profiles=profiles, workload=w, **common), hs, cfg))
            if on_point:
                on_point()
    return rows


def _row(r, hs, cfg) -> dict:
    row = dataclasses.asdict(r)
    row.pop("extra", None)
    row["device_buffer_size"] = hs.device_buffer_size if hs else None
    row["host_to_device_ratio"] = hs.host_to_device_ratio if hs else None
    row["calibrated"] = cfg["params"].calibrated
    row["calibration"] = cfg["calibration"]
    return row


def recommend(rows: Sequence[dict], slo_tpot_ms: float) -> dict:
    """The highest-throughput row meeting the TPOT p99 target, per system and overall."""
    best: dict = {}
    for system in ("baseline", "hisparse"):
        ok = [r for r in rows if r["system"] == system and r["tpot_p99_ms"] <= slo_tpot_ms]
        best[system] = max(ok, key=lambda r: r["throughput_tok_s"]) if ok else None
    b, h = best["baseline"], best["hisparse"]
    choice = None
    if b or h:
        choice = max((x for x in (b, h) if x), key=lambda r: r["throughput_tok_s"])
    gain = (h["throughput_tok_s"] / b["throughput_tok_s"]) if (b and h and b["throughput_tok_s"]) else None
    return {"slo_tpot_ms": slo_tpot_ms, "baseline": b, "hisparse": h, "choice": choice,
            "hisparse_over_baseline": gain}
