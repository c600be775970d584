"""One typed, frozen, validated scenario: what ``hisparse plan`` simulates.

``load_scenario`` reads the presets (or the user's files), picks the calibration that applies and
returns a ``Scenario``; every check names the file and key. The calibration that applies is the
``--calibration`` option, or with ``auto`` the one the GPU file names (its ``calibration`` key; the
shipped H200 preset names the packaged ``h200`` fit, a user's GPU file names one or none). Measured
GPU figures of a calibration replace the GPU file's, and ``notes`` lists each replacement.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..errors import HisparseError
from . import presets as P
from .comm import COMM_META
from .specs import CostParams, DeploymentSpec, GpuSpec, HiSparseSpec, ModelSpec, WorkloadSpec
from .step_costs import GpuTerms, terms_for


@dataclass(frozen=True)
class Scenario:
    model: ModelSpec
    gpu: GpuSpec
    deployment: DeploymentSpec
    workload: WorkloadSpec
    hisparse: HiSparseSpec
    params: CostParams
    calibration: str = "uncalibrated"  # the calibration file that applies
    trace: str | None = None  # the trace whose replay gives the misses (None: the default)
    notes: tuple[str, ...] = ()  # how the inputs were combined (calibration figures replacing the GPU file's)
    terms: GpuTerms | None = None  # the measured step terms (None: the H200's scaled to ``gpu``)

    def __post_init__(self) -> None:
        if self.hisparse.top_k != self.model.top_k:
            raise HisparseError(f"{self.hisparse.where}: top_k = {self.hisparse.top_k} differs from the model's "
                                f"top_k {self.model.top_k} ({self.model.where})")
        d, g, m, w = self.deployment, self.gpu, self.model, self.workload
        if d.tp > g.scale_up_gpus:
            raise HisparseError(f"{d.where}: tp = {d.tp} spans more GPUs than one NVLink domain of {g.name} "
                                f"({g.scale_up_gpus}: gpus_per_node {g.gpus_per_node}, {g.where}); the model prices "
                                "an instance's collectives within one domain (give nvlink_domain_gpus in the GPU "
                                "file for a larger domain, or a smaller tp)")
        longest = round(w.input_tokens * (1 + w.length_jitter)) + round(w.output_tokens * (1 + w.length_jitter))
        if m.context_length and longest > m.context_length:
            raise HisparseError(f"{w.where}: requests of up to {longest} tokens ({w.input_tokens} in + "
                                f"{w.output_tokens} out, length_jitter {w.length_jitter:g}) exceed the model's "
                                f"context_length {m.context_length} ({m.where})")

    @property
    def files(self) -> str:
        """The input files, for error messages."""
        return ", ".join(s.where for s in (self.model, self.gpu, self.deployment, self.workload, self.hisparse))

    def replace(self, **changes) -> Scenario:
        return dataclasses.replace(self, **changes)


def _calibration_for(gpu: GpuSpec, calibration: str) -> P.Calibration:
    if calibration == "auto":
        path = P._calibration_path(gpu)
        return P.load_calibration(str(path) if path else P.UNCALIBRATED)
    if calibration in ("none", ""):
        return P.load_calibration(P.UNCALIBRATED)
    return P.load_calibration(calibration)


def load_scenario(*, model: str = "glm-5.1-fp8", gpu: str | None = None, deployment: str = "8xh200-colocated-dp8",
                  workload: str = "32k-in-8k-out", hisparse: str = "blog-8xh200", calibration: str = "auto",
                  trace: str | None = None) -> Scenario:
    """Load every input and combine them. ``gpu`` None: the deployment's GPU."""
    dep = P.load("deployments", deployment)
    if gpu:
        gpu_spec = P.load("gpus", gpu)
    else:
        try:
            gpu_spec = P.load("gpus", dep.gpu)
        except HisparseError as exc:
            raise HisparseError(f"{dep.where}: gpu = {dep.gpu!r}: {exc}") from None
    cal = _calibration_for(gpu_spec, calibration)
    notes = []
    for key, value in cal.gpu.items():
        old = getattr(gpu_spec, key)
        notes.append(f"{key} {_fmt(value)} measured in {cal.label} (GPU file {gpu_spec.where}: {_fmt(old)})")
    if cal.comm:
        notes.append(f"collectives {', '.join(sorted(k for k in cal.comm if k not in COMM_META))} measured in "
                     f"{cal.label} replace {gpu_spec.where}'s")
    if cal.unknown_params:
        notes.append(f"{cal.label}: parameters not used by this model, carried: {', '.join(sorted(cal.unknown_params))}")
    gpu_spec = P.apply_calibration(gpu_spec, cal)
    terms = terms_for(gpu_spec, cal.terms, cal.label)
    return Scenario(model=P.load("models", model), gpu=gpu_spec, deployment=dep,
                    workload=P.load("workloads", workload), hisparse=P.load("hisparse", hisparse),
                    params=cal.params, calibration=cal.label, trace=trace, notes=tuple(notes),
                    terms=terms)


def _fmt(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)
