"""One typed, frozen, validated scenario: what ``hisparse plan`` simulates.

``load_scenario`` reads the presets (or the user's files), picks the calibration that applies and
returns a ``Scenario``; every check names the file and key. The calibration that applies is the
``--calibration`` option, or with ``auto`` the one the GPU file names (its ``calibration`` key; the
shipped H200 preset names the packaged ``h200`` fit, a user's GPU file names one or none). Measured
GPU figures of a calibration replace the GPU file's, and ``notes`` lists each replacement.

What-if overrides (``hisparse plan --set gpu.link_bw=27.5e9``, repeatable) apply last, after the
calibration, so a value given there is the value simulated; each is parsed by the spec field's type
and checked by the spec's own rules, and ``notes`` says what it replaces (the calibration's measured
figure, or the file's value).
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..costmodel.collectives import COMM_META
from ..costmodel.pricing import GpuTerms, terms_for
from ..errors import HisparseError
from . import presets as P
from .cluster import ClusterSpec, check_layout
from .specs import CostParams, DeploymentSpec, GpuSpec, HiSparseSpec, ModelSpec, WorkloadSpec
from .speculative import SpeculativeSpec

if TYPE_CHECKING:
    from ..costmodel import CostModel


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
    overrides: tuple[str, ...] = ()  # the --set options applied, as given
    speculative: SpeculativeSpec | None = None  # speculative decoding (--speculative), or None
    trace_how: str = ""  # how the trace was chosen for this model and workload (trace_choice.choose_trace)
    cluster: ClusterSpec | None = None  # the deployment's cluster preset (serving/cluster.py), None: one node

    def __post_init__(self) -> None:
        if self.hisparse.top_k != self.model.top_k:
            raise HisparseError(f"{self.hisparse.where}: top_k = {self.hisparse.top_k} differs from the model's "
                                f"top_k {self.model.top_k} ({self.model.where})")
        d, g, m, w = self.deployment, self.gpu, self.model, self.workload
        check_layout(d, g, self.cluster, d.where)  # TP inside a node; an instance across nodes needs a cluster
        longest = round(w.input_tokens * (1 + w.length_jitter)) + round(w.output_tokens * (1 + w.length_jitter))
        if m.context_length and longest > m.context_length:
            raise HisparseError(f"{w.where}: requests of up to {longest} tokens ({w.input_tokens} in + "
                                f"{w.output_tokens} out, length_jitter {w.length_jitter:g}) exceed the model's "
                                f"context_length {m.context_length} ({m.where})")

    def cost_model(self, *, model: ModelSpec | None = None, deployment: DeploymentSpec | None = None,
                   spec: Any = None, prefetch: bool = False) -> CostModel:
        """The scenario's ``CostModel``: its model, GPU, deployment, parameters, measured terms and
        cluster, in one place (``model`` / ``deployment`` replace the scenario's where given)."""
        from ..costmodel import CostModel

        return CostModel(model or self.model, self.gpu, deployment or self.deployment, self.params, self.terms,
                         spec=spec, cluster=self.cluster, prefetch=prefetch)

    @property
    def files(self) -> str:
        """The input files, for error messages."""
        return self.files_with(self.hisparse)

    def files_with(self, hisparse: HiSparseSpec) -> str:
        """``files`` with ``hisparse``'s ``where`` for the scenario's (a swept knob set names its values)."""
        return ", ".join(s.where for s in (self.model, self.gpu, self.deployment, self.workload, hisparse))

    def replace(self, **changes) -> Scenario:
        return dataclasses.replace(self, **changes)


def _calibration_for(gpu: GpuSpec, calibration: str) -> P.Calibration:
    if calibration == "auto":
        path = P._calibration_path(gpu)
        return P.load_calibration(str(path) if path else P.UNCALIBRATED)
    if calibration in ("none", ""):
        return P.load_calibration(P.UNCALIBRATED)
    return P.load_calibration(calibration)


# --set KIND.KEY=VALUE: the spec each kind names
OVERRIDE_KINDS: dict[str, type] = {"model": ModelSpec, "gpu": GpuSpec, "deployment": DeploymentSpec,
                                   "workload": WorkloadSpec, "hisparse": HiSparseSpec}


@dataclass(frozen=True)
class Override:
    """One ``--set KIND.KEY=VALUE``, its value parsed by the field's type (``parse_override``)."""

    kind: str
    key: str
    value: Any
    text: str

    @property
    def option(self) -> str:
        return f"--set {self.kind}.{self.key}={self.text}"


def settable_keys(cls: type) -> list[str]:
    """The keys ``--set`` takes for a spec: scalars, strings and enums (not tables)."""
    from .specs import _hints

    hints = _hints(cls)
    return [f.name for f in dataclasses.fields(cls) if f.name != "where" and _scalar(hints[f.name])]


def _scalar(typ: Any) -> bool:
    return typ in (int, float, bool, str) or (isinstance(typ, type) and issubclass(typ, StrEnum))


def parse_override(text: str) -> Override:
    """``KIND.KEY=VALUE`` -> Override; a one-line error naming ``--set`` for bad syntax, an unknown
    kind or key, or a value of the wrong type (the domain is the spec's check, at load)."""
    from .specs import _hints

    head, eq, raw = str(text).partition("=")
    kind, dot, key = head.strip().partition(".")
    raw = raw.strip()
    if eq and dot and key and not raw:
        raise HisparseError(f"--set {text}: an empty value (give {kind}.{key}=VALUE; "
                            f"hisparse presets --schema {kind} lists each key's type)")
    if not eq or not dot or not key or not raw:
        raise HisparseError(f"--set {text}: expected KIND.KEY=VALUE, e.g. gpu.link_bw=27.5e9 "
                            f"(kinds: {', '.join(OVERRIDE_KINDS)})")
    if kind not in OVERRIDE_KINDS:
        raise HisparseError(f"--set {text}: unknown kind {kind!r} (kinds: {', '.join(OVERRIDE_KINDS)})")
    cls = OVERRIDE_KINDS[kind]
    keys = settable_keys(cls)
    if key not in keys:
        other = {f.name for f in dataclasses.fields(cls)} - {"where"}
        why = "a table: edit the file (hisparse presets new)" if key in other else "unknown key"
        raise HisparseError(f"--set {text}: {kind}.{key}: {why} (keys: {', '.join(keys)})")
    typ = _hints(cls)[key]
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw  # a bare word: a string or an enum's name
    if typ is str or (isinstance(typ, type) and issubclass(typ, StrEnum)):
        value = raw.strip('"').strip("'") if isinstance(value, str) else raw
    elif typ is bool and not isinstance(value, bool):
        raise HisparseError(f"--set {text}: {kind}.{key} takes true or false")
    elif typ in (int, float) and (isinstance(value, bool) or not isinstance(value, int | float)):
        raise HisparseError(f"--set {text}: {kind}.{key} takes a number, got {raw!r}")
    elif typ is int and isinstance(value, float) and not value.is_integer():
        raise HisparseError(f"--set {text}: {kind}.{key} takes a whole number, got {raw!r}")
    return Override(kind, key, value, raw)


def parse_overrides(texts: Sequence[str]) -> tuple[Override, ...]:
    out: list[Override] = []
    for t in texts:
        o = parse_override(t)
        if any((p.kind, p.key) == (o.kind, o.key) for p in out):
            raise HisparseError(f"--set {o.kind}.{o.key} is given twice")
        out.append(o)
    return tuple(out)


def _apply(spec, overrides: Sequence[Override], kind: str, notes: list[str], calibrated: dict | None = None,
           cal_label: str = ""):
    """``spec`` with the ``kind`` overrides, checked by the spec (its error names the option)."""
    mine = [o for o in overrides if o.kind == kind]
    if not mine:
        return spec
    where = f"{spec.where} with {' '.join(o.option for o in mine)}"
    for o in mine:
        old = getattr(spec, o.key)
        if calibrated is not None and o.key in calibrated:
            notes.append(f"{o.option}: {o.key} {_fmt(o.value)} replaces the calibrated {_fmt(old)} measured in "
                         f"{cal_label}")
        else:
            notes.append(f"{o.option}: {o.key} {_fmt(o.value)} replaces {_fmt(old)} of {spec.where}")
    try:
        return dataclasses.replace(spec, **{o.key: o.value for o in mine}, where=where)
    except TypeError as exc:  # not a field of a frozen spec: parse_override refuses it first
        raise HisparseError(f"{where}: {exc}") from None


def load_scenario(*, model: str = "glm-5.1-fp8", gpu: str | None = None, deployment: str = "8xh200-colocated-dp8",
                  workload: str = "32k-in-8k-out", hisparse: str | None = None, calibration: str = "auto",
                  trace: str | None = None, overrides: Sequence[Override | str] = (),
                  speculative: SpeculativeSpec | None = None) -> Scenario:
    """Load every input and combine them. ``gpu`` None: the deployment's GPU; ``hisparse`` None: the
    deployment's ``hisparse`` key, else ``DEFAULT_HISPARSE`` (the blog's 8xH200 config). ``overrides``
    (``--set``) apply after the calibration; a deployment's ``gpu`` and a GPU's ``calibration``
    before they are read."""
    ovs = parse_overrides([o for o in overrides if isinstance(o, str)]) + tuple(o for o in overrides
                                                                                if isinstance(o, Override))
    set_notes: list[str] = []
    dep_file = P.load("deployments", deployment)
    dep = _apply(dep_file, ovs, "deployment", set_notes)
    gpu_spec = P.load("gpus", gpu) if gpu else _named(dep, dep_file, "gpu", ovs)
    pre = [o for o in ovs if o.kind == "gpu" and o.key == "calibration"]
    gpu_spec = _apply(gpu_spec, pre, "gpu", set_notes)
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
    post = [o for o in ovs if not (o.kind == "gpu" and o.key == "calibration")]
    gpu_spec = _apply(gpu_spec, post, "gpu", set_notes, dict(cal.gpu), cal.label)
    terms = terms_for(gpu_spec, cal.terms, cal.label)
    if cal.terms and any(o.kind == "gpu" and o.key in _STEP_TERM_INPUTS for o in post) and terms.source.startswith("measured"):
        set_notes.append(f"the step kernels are measured in {cal.label}: --set gpu.hbm_bw / bf16_flops do not move "
                         "them (--calibration none scales the H200's terms by the GPU's datasheet figures: --set "
                         "gpu.datasheet_hbm_bw / datasheet_bf16_flops)")
    else:  # scaled terms follow the datasheet figures where the GPU file gives them, not hbm_bw / bf16_flops
        for key, sheet in (("hbm_bw", "datasheet_hbm_bw"), ("bf16_flops", "datasheet_bf16_flops")):
            if any(o.kind == "gpu" and o.key == key for o in post) and getattr(gpu_spec, sheet):
                set_notes.append(f"--set gpu.{key}: the step's kernel terms scale by gpu.{sheet} "
                                 f"({getattr(gpu_spec, sheet):.4g}, from {gpu_spec.where}), which this does not "
                                 f"change; --set gpu.{sheet} for that what-if")
    model_spec = _apply(P.load("models", model), ovs, "model", set_notes)
    workload_spec = _apply(P.load("workloads", workload), ovs, "workload", set_notes)
    implicit = hisparse is None or hisparse == DEFAULT_HISPARSE  # not chosen by the user: may follow the model
    if hisparse is None and dep.hisparse:
        hs_file = _named(dep, dep_file, "hisparse", ovs)
    else:
        hs_file = P.load("hisparse", hisparse or DEFAULT_HISPARSE)
    if implicit and model_spec.top_k != hs_file.top_k and model_spec.name in P.preset_names("hisparse"):
        # the shipped configs are GLM's (top_k 2048): a model with another index_topk takes its own preset
        notes.append(f"--hisparse-config: {model_spec.name}'s preset (top_k {model_spec.top_k}), not "
                     f"{Path(hs_file.where).stem}'s (top_k {hs_file.top_k})")
        hs_file = P.load("hisparse", model_spec.name)
    hisparse_spec = _apply(hs_file, ovs, "hisparse", set_notes)
    cluster_spec = None
    if dep.cluster:
        cluster_spec = _named(dep, dep_file, "cluster", ovs)
    return Scenario(model=model_spec, gpu=gpu_spec, deployment=dep, cluster=cluster_spec,
                    workload=workload_spec, hisparse=hisparse_spec,
                    params=cal.params, calibration=cal.label, trace=trace, notes=tuple(notes + set_notes),
                    terms=terms, overrides=tuple(o.option for o in ovs), speculative=speculative)


def _named(dep, dep_file, key: str, overrides: Sequence[Override]):
    """The preset the deployment's ``key`` names (``P.NAMED_KEYS``: a relative path from the deployment
    file's folder, else the working folder; a ``--set deployment.KEY`` value from the working folder).
    Its error names the key and the deployment file, and both places a missing file was looked for."""
    value = getattr(dep, key)
    try:
        return P.load(P.NAMED_KEYS["deployments"][key], value)
    except HisparseError as exc:
        set_here = any(o.kind == "deployment" and o.key == key for o in overrides)
        why = None if set_here else P.looked_in(value, dep_file.where)
        raise HisparseError(f"{dep.where}: {key} = {value!r}: {why or exc}") from None


DEFAULT_HISPARSE = "blog-8xh200"  # the blog's 8xH200 colocated --hisparse-config
_STEP_TERM_INPUTS = ("hbm_bw", "bf16_flops", "datasheet_hbm_bw", "datasheet_bf16_flops", "sm_boost_mhz")


def _fmt(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)
