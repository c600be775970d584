"""Validation against published end-to-end runs: measured figures beside the model's prediction.

A published set is a TOML file (shipped ones under ``simulator/presets/published/``)::

    name = "..."
    source = "where the figures come from"
    uncertainty = "how far to trust them"
    [scenario]                     # preset names or files, as for hisparse plan
    model = "glm-5.1-fp8"
    deployment = "8xh200-colocated-dp8"
    hisparse = "blog-8xh200"
    [[point]]
    label = "32K/8K baseline peak"
    system = "baseline"            # or "hisparse"
    metric = "makespan_tok_s"      # Metric below: throughputs, running counts, TPOT / ITL / TTFT mean,
                                   # median, p99 (tpot_p99_ms, ttft_mean_s, ...)
    concurrency = [16, 32, 64]     # one value, or several for a throughput: the prediction is the peak
    input_tokens = 32768
    output_tokens = 8192
    requests_per_client = 4        # waves per client (a benchmark's num_prompts / concurrency)
    measured = 624.0
    note = "..."                   # optional: what was assumed
    kind = "estimate"              # optional: "measurement" (default) or "estimate" (a figure the
                                   # source derived, e.g. a capacity from HBM sizes, not a run's
                                   # reading); estimates are reported but kept out of the median

No term of the model is fitted to these figures; they are here to report its error.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from ..errors import HisparseError
from . import presets as P
from .misses import scenario_profiles
from .model import RunResult, System, simulate
from .scenario import Scenario, load_scenario
from .specs import Mode

PUBLISHED_DIR = P.PUBLISHED_DIR
published_names = P.published_names


class Metric(StrEnum):
    """What a published point measured, and the model's figure for it (bench_serving's definitions:
    TPOT per request, ITL per token gap, TTFT per request; throughputs of the whole deployment
    unless per GPU)."""

    MAKESPAN_TOK_S = "makespan_tok_s"  # output tokens / benchmark duration (bench_serving's output throughput)
    STEADY_TOK_S = "steady_tok_s"  # output tokens/s while the running set is steady (decode logs)
    MAX_RUNNING = "max_running"  # requests the deployment runs at once
    OUTPUT_TOK_S_PER_GPU = "output_tok_s_per_gpu"  # makespan output throughput / GPUs
    TOTAL_TOK_S_PER_GPU = "total_tok_s_per_gpu"  # (input + output) tokens / duration / GPUs (cookbook tables)
    RUNNING = "running"  # mean running requests (deployment)
    TPOT_MEAN_MS = "tpot_mean_ms"
    TPOT_MEDIAN_MS = "tpot_median_ms"
    TPOT_P99_MS = "tpot_p99_ms"
    ITL_MEAN_MS = "itl_mean_ms"
    ITL_MEDIAN_MS = "itl_median_ms"
    ITL_P99_MS = "itl_p99_ms"
    TTFT_MEAN_S = "ttft_mean_s"
    TTFT_MEDIAN_S = "ttft_median_s"
    TTFT_P99_S = "ttft_p99_s"

    @property
    def is_latency(self) -> bool:
        """A latency is read at one load point (a throughput may be the peak over several)."""
        return self.value.startswith(("tpot", "itl", "ttft")) or self is Metric.RUNNING

    def of(self, r: RunResult) -> float:
        return {Metric.MAKESPAN_TOK_S: r.makespan_tok_s_deployment, Metric.STEADY_TOK_S: r.steady_tok_s_deployment,
                Metric.MAX_RUNNING: float(r.max_running_deployment),
                Metric.OUTPUT_TOK_S_PER_GPU: r.makespan_tok_s_deployment / r.gpus,
                Metric.TOTAL_TOK_S_PER_GPU: r.total_tok_s_per_gpu, Metric.RUNNING: r.running_deployment,
                Metric.TPOT_MEAN_MS: r.tpot_mean_ms, Metric.TPOT_MEDIAN_MS: r.tpot_p50_ms,
                Metric.TPOT_P99_MS: r.tpot_p99_ms, Metric.ITL_MEAN_MS: r.itl_mean_ms,
                Metric.ITL_MEDIAN_MS: r.itl_p50_ms, Metric.ITL_P99_MS: r.itl_p99_ms,
                Metric.TTFT_MEAN_S: r.ttft_mean_s, Metric.TTFT_MEDIAN_S: r.ttft_p50_s,
                Metric.TTFT_P99_S: r.ttft_p99_s}[self]


@dataclass(frozen=True)
class PublishedPoint:
    label: str
    system: System
    metric: Metric
    concurrency: tuple[int, ...]
    input_tokens: int
    output_tokens: int
    requests_per_client: int
    measured: float
    note: str = ""
    kind: str = "measurement"  # or "estimate": reported, not in the summary's median / max


POINT_KINDS = ("measurement", "estimate")
# A measured figure's sane range in every metric's unit (tok/s, requests, ms, s): the smallest a
# benchmark reports is ~1e-3 (a TTFT in s), the largest ~1e6 (tok/s of a cluster). Outside it the
# figure is a typo, and the error (predicted / measured - 1) overflowed to inf% at 5e-324.
MEASURED_RANGE = (1e-6, 1e9)


@dataclass(frozen=True)
class PublishedSet:
    name: str
    source: str
    uncertainty: str
    scenario: Mapping[str, str]
    points: tuple[PublishedPoint, ...]
    where: str


_SCENARIO_KEYS = ("model", "gpu", "deployment", "workload", "hisparse", "calibration", "trace", "speculative")
_POINT_KEYS = {"label", "system", "metric", "concurrency", "input_tokens", "output_tokens", "requests_per_client",
               "measured", "note", "kind"}


def load_published(spec: str) -> PublishedSet:
    """A shipped set by name, or a TOML file."""
    path = Path(spec)
    if not (path.suffix == ".toml" or path.exists()):
        path = PUBLISHED_DIR / f"{spec}.toml"
        if not path.is_file():
            raise HisparseError(f"unknown published set {spec!r} (shipped: {', '.join(published_names())}; "
                                "or give a .toml file)")
    elif path.is_dir():
        raise HisparseError(f"{spec}: is a folder, not a published set (a shipped name, all, or a .toml file)")
    elif not path.is_file():
        raise HisparseError(f"{spec}: no such file")
    where = str(path)
    data = P.read_toml(path)
    unknown = sorted(set(data) - {"name", "source", "uncertainty", "scenario", "point"})
    if unknown:
        raise HisparseError(f"{where}: unknown key(s) {', '.join(unknown)}")
    for key in ("name", "source"):
        if not isinstance(data.get(key), str) or not data[key].strip():
            raise HisparseError(f"{where}: {key} missing (a string: every published figure carries its source)")
    if not isinstance(data.get("uncertainty", ""), str):
        raise HisparseError(f"{where}: uncertainty = {data['uncertainty']!r} must be a string (how far to trust "
                            "the figures)")
    scenario = data.get("scenario", {})
    if not isinstance(scenario, dict) or set(scenario) - set(_SCENARIO_KEYS):
        raise HisparseError(f"{where}: [scenario] takes {', '.join(_SCENARIO_KEYS)}")
    for key, value in scenario.items():  # a number here reached the preset lookup as a TypeError
        if key != "speculative" and (not isinstance(value, str) or not value.strip()):
            raise HisparseError(f"{where}: [scenario] {key} = {value!r} must be a preset name or a file path "
                                "(a non-empty string)")
    base = path.parent
    if "speculative" in scenario:  # [scenario.speculative]: the run's speculative decoding (speculative.from_table)
        from .speculative import from_table

        if not isinstance(scenario["speculative"], dict):
            raise HisparseError(f"{where}: [scenario.speculative] must be a table (speculative = \"eagle:5-1-6\", "
                                "accept_len = 3.5)")
        from_table(scenario["speculative"], f"{where}: [scenario.speculative]")  # checked at load
    resolved = {k: _relative(v, base) for k, v in scenario.items()}
    raw_points = data.get("point")
    if not isinstance(raw_points, list) or not raw_points:
        raise HisparseError(f"{where}: no [[point]] tables")
    points = tuple(_point(p, f"{where}: point {i + 1}") for i, p in enumerate(raw_points))
    return PublishedSet(data["name"], data["source"], str(data.get("uncertainty", "")), resolved, points, where)


def _relative(value: Any, base: Path) -> Any:
    """A scenario file given relative to the published set's own file."""
    if isinstance(value, str) and value.endswith((".toml", ".json", ".hst")) and not Path(value).is_absolute():
        candidate = base / value
        return str(candidate) if candidate.exists() else value
    return value


def _point(raw: Any, where: str) -> PublishedPoint:
    if not isinstance(raw, dict):
        raise HisparseError(f"{where}: not a table")
    unknown = sorted(set(raw) - _POINT_KEYS)
    if unknown:
        raise HisparseError(f"{where}: unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(_POINT_KEYS))})")
    missing = sorted({"label", "system", "metric", "concurrency", "input_tokens", "output_tokens", "measured"} - set(raw))
    if missing:
        raise HisparseError(f"{where}: missing key(s) {', '.join(missing)}")
    parsed = {}
    for key, enum in (("system", System), ("metric", Metric)):
        try:
            parsed[key] = enum(raw[key])
        except ValueError:
            raise HisparseError(f"{where}: {key} = {raw[key]!r} must be one of {', '.join(enum)}") from None
    system, metric = parsed["system"], parsed["metric"]
    for key in ("label", "note"):
        if key in raw and (not isinstance(raw[key], str) or (key == "label" and not raw[key].strip())):
            raise HisparseError(f"{where}: {key} = {raw[key]!r} must be a {'non-empty ' if key == 'label' else ''}"
                                "string")
    conc = raw["concurrency"]
    conc = tuple(conc) if isinstance(conc, list) else (conc,)
    if not conc:
        raise HisparseError(f"{where}: concurrency = []: give one load point, or several for a throughput")
    if metric.is_latency and len(conc) != 1:
        raise HisparseError(f"{where}: metric {metric.value} is read at one load point: concurrency must be one "
                            f"value, not {list(conc)}")
    ints = {"input_tokens": raw["input_tokens"], "output_tokens": raw["output_tokens"],
            "requests_per_client": raw.get("requests_per_client", 4)}
    for key, v in list(ints.items()) + [(f"concurrency[{i}]", c) for i, c in enumerate(conc)]:
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise HisparseError(f"{where}: {key} = {v!r} must be a positive integer")
    twice = sorted({c for c in conc if conc.count(c) > 1})
    if twice:
        raise HisparseError(f"{where}: concurrency = {list(conc)}: {', '.join(map(repr, twice))} given twice "
                            "(each load point once)")
    measured = raw["measured"]
    lo, hi = MEASURED_RANGE
    if isinstance(measured, bool) or not isinstance(measured, (int, float)) or not lo <= measured <= hi:
        raise HisparseError(f"{where}: measured = {measured!r} must be a positive finite number from {lo:g} to "
                            f"{hi:g} (in {metric.value}'s unit)")
    kind = raw.get("kind", "measurement")
    if kind not in POINT_KINDS:
        raise HisparseError(f"{where}: kind = {kind!r} must be one of {', '.join(POINT_KINDS)}")
    return PublishedPoint(str(raw["label"]), system, metric, conc, ints["input_tokens"], ints["output_tokens"],
                          ints["requests_per_client"], float(measured), str(raw.get("note", "")), kind)


def validate(ps: PublishedSet, on_point: Callable[[], None] | None = None, seed: int = 0,
             overrides: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """One row per published point: measured, predicted, the relative error and where the peak was.
    ``overrides`` replace scenario inputs of the set (e.g. another trace or calibration)."""
    inputs = dict(ps.scenario) | dict(overrides or {})
    if "speculative" in inputs:
        from .speculative import from_table

        inputs["speculative"] = from_table(inputs["speculative"], f"{ps.where}: [scenario.speculative]")
    try:
        sc0 = load_scenario(**inputs)
    except HisparseError as exc:  # a preset the set's [scenario] names: say which set and key led there
        named = [f"{k} = {v!r}" for k, v in ps.scenario.items()
                 if isinstance(v, str) and v in str(exc) and k not in (overrides or {})]
        if not named:
            raise
        raise HisparseError(f"{ps.where}: [scenario] {', '.join(named)}: {exc}") from None
    _check_budget(ps, sc0)
    initial = "prefix" if sc0.deployment.mode == Mode.COLOCATED else "empty"
    profiles = None
    cache: dict[tuple, RunResult] = {}
    rows = []
    for p in ps.points:
        w = dataclasses.replace(sc0.workload, input_tokens=p.input_tokens, output_tokens=p.output_tokens,
                                requests_per_client=p.requests_per_client, length_jitter=0.0,
                                where=f"{ps.where}: {p.label}")
        try:
            sc: Scenario | None = sc0.replace(workload=w)
        except HisparseError as exc:  # e.g. past the model's context_length: reported, not fatal
            sc, refused = None, _reason(exc, (w.where, sc0.files))
        if sc is None:
            predicted, at, note = math.nan, 0, f"{p.note}; MODEL CANNOT RUN IT: {refused}".lstrip("; ")
            rows.append(_row(ps, p, predicted, at, note))
            if on_point:
                on_point()
            continue
        if p.system == System.HISPARSE and profiles is None:
            hs = sc.hisparse
            profiles = scenario_profiles(sc, hs, initial)
        best: tuple[float, int] = (math.nan, 0)
        failure = ""
        for c in p.concurrency:
            key = (p.system, c, p.input_tokens, p.output_tokens, p.requests_per_client)
            if key not in cache:
                try:
                    cache[key] = simulate(sc, p.system, concurrency=c, seed=seed,
                                          profiles=profiles if p.system == System.HISPARSE else None)
                except HisparseError as exc:  # the model says this run cannot happen: report it, go on
                    cache[key] = _reason(exc, (sc.files,))
            if isinstance(cache[key], str):
                failure = cache[key]
                continue
            value = p.metric.of(cache[key])
            if math.isnan(best[0]) or value > best[0]:
                best = (value, c)
        if on_point:
            on_point()
        predicted, at = best
        note = p.note if not failure else f"{p.note}; MODEL CANNOT RUN IT: {failure}".lstrip("; ")
        rows.append(_row(ps, p, predicted, at, note))
    return rows


def _reason(exc: HisparseError, prefixes: tuple[str, ...]) -> str:
    """The model's refusal without the input files it names first (the note is already the point's):
    the whole message where it names other places, never a cut inside the reason itself."""
    text = str(exc)
    for prefix in prefixes:
        if text.startswith(prefix + ": "):
            return text[len(prefix) + 2:]
    return text


def _check_budget(ps: PublishedSet, sc: Scenario) -> None:
    """The set's simulated points against ``HISPARSE_MAX_SIM_STEPS``, before any of them runs (as
    ``planner.prepare`` checks a plan): a point with ``concurrency = 100000000000`` would simulate
    for days. The error names the set's file and its largest point."""
    from .. import limits

    d = sc.deployment
    steps: dict[tuple, int] = {}
    largest: tuple[int, str, int] = (0, "", 0)
    for p in ps.points:
        for c in p.concurrency:
            key = (p.system, c, p.input_tokens, p.output_tokens, p.requests_per_client)
            n = steps.setdefault(key, limits.plan_steps(
                ranks=d.ranks_per_instance, instances=d.instances, concurrency=c, rate=0.0,
                requests_per_client=p.requests_per_client, input_tokens=p.input_tokens,
                output_tokens=p.output_tokens, length_jitter=0.0, prefill_chunk_tokens=d.prefill_chunk_tokens))
            if n > largest[0]:
                largest = (n, p.label, c)
    limits.check(sum(steps.values()), "HISPARSE_MAX_SIM_STEPS",
                 f"{ps.where}: {len(steps)} simulated point(s), the largest point {largest[1]!r} at concurrency "
                 f"{largest[2]} ({d.where}: prefill_chunk_tokens {d.prefill_chunk_tokens})",
                 unit="scheduler steps to simulate", hint="a lower concurrency or requests_per_client")


def _row(ps, p, predicted: float, at: int, note: str) -> dict[str, Any]:
    return {"set": ps.name, "label": p.label, "system": p.system.value, "metric": p.metric.value,
            "measured": p.measured, "predicted": predicted, "error": predicted / p.measured - 1.0,
            "at_concurrency": at, "note": note, "kind": p.kind}


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Median and maximum |error| over the measured points the model predicted; estimates (a
    source's derived figure, ``kind = "estimate"``) are counted apart and left out of both."""
    measured = [r for r in rows if r.get("kind", "measurement") == "measurement"]
    errs = [abs(r["error"]) for r in measured if r["error"] is not None and not math.isnan(r["error"])]
    out = {"points": len(measured), "predicted": len(errs), "estimates": len(rows) - len(measured),
           "median_abs_error": statistics.median(errs) if errs else None,
           "max_abs_error": max(errs) if errs else None, "no_error_why": None}
    if not errs:  # None, not NaN (the text printed 'nan%'): and why there is no figure
        out["no_error_why"] = ("no measured point, estimates only" if not measured else
                               f"the model cannot run any of the {len(measured)} measured point(s)")
    return out


def error_text(s: Mapping[str, Any], points: str = "points") -> str:
    """A ``summary``'s line: median and max |error| over the points predicted, or n/a and why."""
    if s["median_abs_error"] is None:
        return f"median |error| n/a, max |error| n/a: {s['no_error_why']}"
    return (f"median |error| {s['median_abs_error']:.0%}, max |error| {s['max_abs_error']:.0%} over "
            f"{s['predicted']} of {s['points']} {points}")
