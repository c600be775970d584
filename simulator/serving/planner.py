"""Capacity planning: sweep the load (and HiSparse knobs), baseline against HiSparse, search between
the swept points for the highest load that meets the TPOT and TTFT targets, and pick the best
configuration that serves the load it is offered (a tie when the two systems are closer than the
model's error, a flag when the pick is at the edge of the searched range)."""

from __future__ import annotations

import dataclasses
import math
import numbers
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import HisparseError
from ..replay.config import is_bool as _is_bool
from .memory import check_fits, plan_memory
from .misses import MissProfiles, scenario_profiles, speculative_policy
from .model import RunResult, System
from .prefetch import simulate  # model.simulate, or a point prefetch.prefetch simulated ahead
from .scenario import Scenario, load_scenario
from .slo import (
    DEFAULT_SLO_TPOT_MS,
    DEFAULT_SLO_TTFT_S,
    MAX_SEARCH_STEPS,
    MODEL_ERROR_BAND,
    MODEL_ERROR_SOURCE,
    SEARCH_REL_TOL,
)
from .spec_whatif import label
from .specs import Arrival, HiSparseSpec, Mode

# Where a swept HiSparse knob's value comes from, for errors about it: a plan point of a sweep grid
# takes it from the grid key, ``hisparse plan`` from its option (the grid has no residency key).
KNOB_INPUTS = {
    "device_buffer_size": "hisparse plan --sweep-buffer, or device_buffer_size in a sweep grid",
    "host_to_device_ratio": "hisparse plan --sweep-host-ratio, or host_to_device_ratio in a sweep grid",
    "residency": "hisparse plan --residency",
}


@dataclass(frozen=True)
class PlanInputs:
    model: str = "glm-5.1-fp8"
    gpu: str | None = None  # default: the deployment's GPU
    deployment: str = "8xh200-colocated-dp8"
    workload: str = "32k-in-8k-out"
    hisparse: str | None = None  # default: the deployment's hisparse key, else blog-8xh200
    calibration: str = "auto"  # the calibration the GPU file names, else uncalibrated
    trace: str | None = None  # default: misses.DEFAULT_TRACE
    concurrency: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    rates: tuple[float, ...] = ()  # open loop: sweep arrival rates (requests/s) instead of concurrency
    slo_tpot_ms: float = DEFAULT_SLO_TPOT_MS
    slo_ttft_s: float | None = DEFAULT_SLO_TTFT_S  # None: no TTFT target
    buffers: tuple[int, ...] = ()  # sweep device_buffer_size (empty: the config's)
    host_ratios: tuple[float, ...] = ()  # sweep host_to_device_ratio (empty: the config's)
    seed: int = 0
    overrides: tuple[str, ...] = ()  # --set KIND.KEY=VALUE, applied after the calibration
    speculative: Any = None  # speculative.SpeculativeSpec (--speculative), or None
    residencies: tuple[str, ...] = ()  # sweep HiSparse residency policies (serving/residency.py; empty: the config's)

    def __post_init__(self) -> None:
        self._normalise()
        if not self.concurrency or min(self.concurrency) < 1:
            raise HisparseError("--concurrency needs positive integers")
        if self.rates and min(self.rates) <= 0:
            raise HisparseError("--rate needs positive arrival rates")
        if not self.slo_tpot_ms > 0:
            raise HisparseError(f"--slo-tpot-ms {self.slo_tpot_ms:g} must be > 0")
        if self.slo_ttft_s is not None and not self.slo_ttft_s > 0:
            raise HisparseError(f"--slo-ttft-s {self.slo_ttft_s:g} must be > 0")
        for b in self.buffers:
            if b < 1:
                raise HisparseError(f"--sweep-buffer {b} must be >= 1 (in a sweep grid, the device_buffer_size key)")
        for r in self.host_ratios:
            if not r >= 1:
                raise HisparseError(f"--sweep-host-ratio {r:g} must be >= 1 (SGLang's host_to_device_ratio; in a "
                                    "sweep grid, the host_to_device_ratio key)")
        from .residency import RESIDENCY_POLICIES

        for name in self.residencies:
            if name not in RESIDENCY_POLICIES:
                raise HisparseError(f"--residency {name}: unknown (residency policies: {', '.join(RESIDENCY_POLICIES)})")

    def _normalise(self) -> None:
        """Each field as the plan reads it, or the caller's error naming the field and value: the
        sequences become tuples (a list made the frozen inputs unhashable), their items whole
        numbers or finite numbers, and no value twice (it counted its work twice). A string where
        a list goes was iterated by character (``residencies="swap"`` was residency "s"), a float
        concurrency or buffer, a NaN rate, a bool and a string seed were taken as they came."""
        import os

        def put(name: str, value: Any) -> None:
            object.__setattr__(self, name, value)

        for name in ("model", "deployment", "workload", "calibration", "gpu", "hisparse", "trace"):
            value = getattr(self, name)
            if isinstance(value, os.PathLike):
                value = os.fspath(value)
            if not (isinstance(value, str) or (value is None and name in ("gpu", "hisparse", "trace"))):
                raise HisparseError(f"PlanInputs: {name} must be a preset name or a file path (str), got {value!r}")
            put(name, value)
        for name, item in (("concurrency", _whole), ("buffers", _whole), ("rates", _finite),
                           ("host_ratios", _finite), ("overrides", _text), ("residencies", _text)):
            value = getattr(self, name)
            if isinstance(value, str | bytes) or not isinstance(value, Sequence | set | frozenset):
                raise HisparseError(f"PlanInputs: {name} must be a tuple, got {value!r}")
            items = tuple(item(name, v) for v in value)
            if name != "overrides" and len(set(items)) != len(items):
                raise HisparseError(f"PlanInputs: {name} {items}: a value given twice (its work would count twice)")
            put(name, items)
        put("slo_tpot_ms", _finite("slo_tpot_ms", self.slo_tpot_ms, inf=True))
        if self.slo_ttft_s is not None:
            put("slo_ttft_s", _finite("slo_ttft_s", self.slo_ttft_s, inf=True))
        seed = _whole("seed", self.seed)
        if not 0 <= seed <= 2**63 - 1:
            raise HisparseError(f"PlanInputs: seed must be from 0 to 2**63 - 1, got {seed}")
        put("seed", seed)

    def scenario(self) -> Scenario:
        """The scenario, its trace chosen for the model and workload (``trace_choice``: the model's
        fitted generator preset at the workload's context, unless ``--trace`` names one)."""
        from .trace_choice import choose_trace

        sc = load_scenario(model=self.model, gpu=self.gpu, deployment=self.deployment, workload=self.workload,
                           hisparse=self.hisparse, calibration=self.calibration, trace=self.trace,
                           overrides=self.overrides, speculative=self.speculative)
        if self.trace is None:  # a trace may be drawn for this model: first what fails without one
            from .memory import plan_memory

            plan_memory(sc.model, sc.gpu, sc.deployment, None, where=sc.files)
        choice = choose_trace(sc.model, sc.workload, self.trace)
        return sc.replace(trace=choice.trace, trace_how=choice.how)


def _whole(name: str, value: Any) -> int:
    """A whole number (numpy's too), not a bool, a float or a string."""
    if not _is_bool(value):
        try:
            return operator.index(value)
        except TypeError:
            pass
    raise HisparseError(f"PlanInputs: {name} takes whole numbers, got {value!r}")


def _finite(name: str, value: Any, inf: bool = False) -> float:
    """A real number (numpy's too), not a bool or a string; finite unless ``inf`` (a target of inf is
    no target), never NaN."""
    if not _is_bool(value) and isinstance(value, numbers.Real) and not math.isnan(value) \
            and (inf or math.isfinite(value)):
        return float(value)
    raise HisparseError(f"PlanInputs: {name} takes {'' if inf else 'finite '}numbers, got {value!r}")


def _text(name: str, value: Any) -> str:
    if isinstance(value, str):
        return value
    raise HisparseError(f"PlanInputs: {name} takes strings, got {value!r}")


@dataclass(frozen=True)
class KnobResult:
    """What a HiSparse knob set's trace replay gave (the plan names it)."""

    device_buffer_size: int
    host_to_device_ratio: float
    trace: str
    policy: str
    miss_ratio: float  # over all the trace's steps, the cold start after prefill included
    notes: tuple[str, ...]
    trace_steps: int = 0  # decode steps the trace holds (miss_ratio's span)
    steady_from: int = 0  # the first steady-state step (trace compare's warm-up)
    steady_miss_ratio: float = float("nan")  # over steps >= steady_from
    residency: str = "swap"  # the residency policy of the knob set (serving/residency.py)


@dataclass(frozen=True)
class Plan:
    scenario: Scenario
    results: tuple[tuple[RunResult, int | None, float | None], ...]  # (result, buffer, host ratio)
    knobs: tuple[KnobResult, ...]
    searched: frozenset[int] = frozenset()  # indices into results found by the search, not swept
    profiles: tuple[MissProfiles, ...] = dataclasses.field(default=(), compare=False)  # per knob set
    # per system the search ran for: the last passing and failing loads, points simulated, converged
    brackets: dict = dataclasses.field(default_factory=dict, compare=False)
    cannot_run: tuple[tuple[str, str], ...] = ()  # (system and knobs, why) left out (``Prepared.cannot_run``)

    def rows(self) -> list[dict[str, Any]]:
        """One plain row per point (the edge: tables, JSON, CSV), each system and knob set's points
        in load order; ``searched`` marks the points the bisection added between swept ones."""
        out = []
        for i, (r, buf, ratio) in enumerate(self.results):
            row = dataclasses.asdict(r)
            row["device_buffer_size"] = buf
            row["host_to_device_ratio"] = ratio
            row["calibrated"] = self.scenario.params.calibrated
            row["calibration"] = self.scenario.calibration
            row["searched"] = i in self.searched
            row["speculative"] = label(self.scenario.speculative)
            out.append(row)
        order = {}
        for row in out:
            order.setdefault(_group(row), len(order))
        out.sort(key=lambda r: (order[_group(r)], r["concurrency"], r["rate_per_s"]))
        return out


def _group(row: dict) -> tuple:
    """A row's line in the tables and the plot: system and HiSparse knob set (residency included)."""
    return (row["system"], row["device_buffer_size"], row["host_to_device_ratio"], row.get("residency", ""))


def _points(sc: Scenario, inp: PlanInputs) -> list[tuple[int, float]]:
    """(concurrency, rate) per load point."""
    if inp.rates:
        return [(0, r) for r in inp.rates]
    if sc.workload.arrival == Arrival.OPEN:
        return [(0, sc.workload.rate_per_s)]
    return [(c, 0.0) for c in inp.concurrency]


def _knob_sets(sc: Scenario, inp: PlanInputs) -> list:
    """One HiSparse spec per swept (buffer, host ratio, residency). A residency policy with its own hot
    buffer (vLLM's 2 x top-k rows) takes it unless --sweep-buffer gives the buffers."""
    from .residency import residency_policy

    hs0 = sc.hisparse
    out = []
    for res in inp.residencies or (hs0.residency,):
        for b in inp.buffers or (hs0.device_buffer_size,):
            if not inp.buffers:
                b = residency_policy(res).hot_rows(hs0.top_k, b)
            for ratio in inp.host_ratios or (hs0.host_to_device_ratio,):
                if (b, ratio, res) == (hs0.device_buffer_size, hs0.host_to_device_ratio, hs0.residency):
                    out.append(hs0)
                else:
                    out.append(dataclasses.replace(hs0, device_buffer_size=b, host_to_device_ratio=ratio, residency=res,
                                                   where=_knob_where(hs0, b, ratio, res, bool(inp.buffers))))
    return out


def _knob_where(hs0: HiSparseSpec, buffer: int, ratio: float, residency: str, buffer_swept: bool) -> str:
    """A swept knob set's ``where``: the file, then each value that differs from it and what sets that
    value in a plan and in a sweep grid (an error about it names what to change, not a plan option
    that a sweep grid does not have)."""
    changed = []
    if residency != hs0.residency:
        changed.append(f"residency {residency} ({KNOB_INPUTS['residency']})")
    if buffer != hs0.device_buffer_size:
        how = KNOB_INPUTS["device_buffer_size"] if buffer_swept else f"residency {residency}'s hot buffer"
        changed.append(f"device_buffer_size {buffer} ({how})")
    if ratio != hs0.host_to_device_ratio:
        changed.append(f"host_to_device_ratio {ratio:g} ({KNOB_INPUTS['host_to_device_ratio']})")
    return f"{hs0.where} with " + "; ".join(changed)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _runs(points: Sequence, baseline: bool, knob_sets: Sequence) -> str:
    """What a plan simulates, for the work-budget errors: each load point once per system (the
    baseline, each HiSparse knob set); a one-point sweep grid's plan is 1 load point x 2 systems."""
    systems = (["baseline"] if baseline else []) + ([_count(len(knob_sets), "HiSparse knob set")] if knob_sets else [])
    return f"{_count(len(points), 'load point')} x ({' + '.join(systems)})"


@dataclass(frozen=True)
class Prepared:
    """A plan checked before any simulation: its scenario, load points and HiSparse knob sets."""

    scenario: Scenario
    points: tuple[tuple[int, float], ...]
    knob_sets: tuple[HiSparseSpec, ...]
    steps: int = 0  # scheduler steps it is estimated to simulate (limits.plan_steps)
    baseline: bool = True  # False: no request of the workload fits the baseline's pool (``cannot_run`` says why)
    cannot_run: tuple[tuple[str, str], ...] = ()  # (system and knobs, why): pieces left out, the rest planned

    @property
    def swept_points(self) -> int:
        """The points ``run_plan_full`` simulates (each load for the baseline, when it runs, and for each
        knob set): a bar's total."""
        return len(self.points) * (int(self.baseline) + len(self.knob_sets))


def prepare(inp: PlanInputs, scenario: Scenario | None = None, *, search: bool = False) -> Prepared:
    """Every check a plan makes before it simulates, in one place (``hisparse plan`` and a plan
    sweep grid both call it): the scenario's files, each swept knob set (``--sweep-buffer``,
    ``--sweep-host-ratio``: a spec each, checked as the file's values are), the deployment's room
    for the weights, and the work budgets (``simulator.limits``): the swept points, each knob set's
    trace replay, and with ``search`` the bisection's points (up to ``MAX_SEARCH_STEPS`` a system, each
    below a swept load)."""
    from .. import limits

    sc = scenario or inp.scenario()
    if sc.workload.output_tokens < 2:  # gave NaN TPOT columns, 0 tok/s steady and "nothing meets the targets"
        raise HisparseError(f"{sc.workload.where}: output_tokens = {sc.workload.output_tokens}: a plan needs at least 2 "
                            "output tokens (TPOT is (latency - TTFT) / (output - 1), bench_serving's, and a 1-token "
                            "request never decodes); for prompt-only TTFT use a published set's 1-token points with "
                            "--validate")
    points = tuple(_points(sc, inp))
    baseline, knob_sets, cannot_run = _runnable(sc, _knob_sets(sc, inp))
    systems = int(baseline) + len(knob_sets)  # a system that cannot run is not simulated
    n = len(points) * systems
    runs = _runs(points, baseline, knob_sets)
    limits.check(n, "HISPARSE_MAX_POINTS", f"plan of {runs}", unit="simulated points",
                 hint="fewer --concurrency/--rate values or swept knobs")
    d, w = sc.deployment, sc.workload
    each = [limits.plan_steps(ranks=d.ranks_per_instance, instances=d.instances, concurrency=c, rate=rate,
                              requests_per_client=w.requests_per_client, input_tokens=w.input_tokens,
                              output_tokens=w.output_tokens, length_jitter=w.length_jitter,
                              prefill_chunk_tokens=d.prefill_chunk_tokens) for c, rate in points]
    steps = sum(each) * systems
    extra = []
    if search and len(points) > 1:  # each searched system bisects below one of its swept loads
        searched = int(baseline) + int(bool(knob_sets))
        steps += searched * MAX_SEARCH_STEPS * max(each)
        extra.append(f"the search's up to {MAX_SEARCH_STEPS} points a system (--no-search)")
    replays = len({(hs.device_buffer_size, hs.policy) for hs in knob_sets})  # misses are replayed per buffer
    if replays:
        from pathlib import Path

        from .misses import trace_accesses

        if sc.trace is not None and not Path(sc.trace).is_file():
            # was found by the first knob set's replay, after every baseline point had been simulated
            what = "is a folder, not a trace file" if Path(sc.trace).is_dir() else "no such trace file"
            raise HisparseError(f"{sc.trace}: {what} (--trace, the trace the HiSparse misses are replayed from)")
        accesses = trace_accesses(sc.trace)
        steps += limits.replay_steps(replays, accesses)
        if replays > 1:
            extra.append(f"{replays} trace replays of {accesses:,} accesses")
    limits.check(steps, "HISPARSE_MAX_SIM_STEPS",
                 f"plan of {runs}{''.join(' + ' + e for e in extra)} ({w.where}: requests_per_client "
                 f"{w.requests_per_client}, {w.input_tokens} + {w.output_tokens} tokens; {d.where}: "
                 f"prefill_chunk_tokens {d.prefill_chunk_tokens})",
                 unit="scheduler steps to simulate", hint="fewer or lower loads, fewer swept buffers, a smaller "
                 "requests_per_client or larger prefill chunks")
    _check_horizon(sc, points)
    return Prepared(sc, points, tuple(knob_sets), steps, baseline, tuple(cannot_run))


def _runnable(sc: Scenario, knob_sets: Sequence[HiSparseSpec]) -> tuple[bool, list, list[tuple[str, str]]]:
    """Which systems can run the workload at all. A deployment with no room for the weights, or a
    knob set whose pools do not fit, is the plan's error; a system whose pool cannot hold one
    request of the workload's lengths (``check_fits``) is left out with its reason and the rest is
    planned (a 128K prompt that a colocated HiSparse pool cannot prefill still has a baseline
    answer); only when nothing can run is it an error."""
    from .model import _max_len

    d, w = sc.deployment, sc.workload
    n_in, n_out = _max_len(w.input_tokens, w.length_jitter), _max_len(w.output_tokens, w.length_jitter)
    cannot: list[tuple[str, str]] = []
    base = plan_memory(sc.model, sc.gpu, d, None, where=sc.files)  # a deployment with no room fails first
    try:
        check_fits(base, n_in, n_out, d.mode, sc.files)
        baseline = True
    except HisparseError as exc:
        baseline = False
        cannot.append(("baseline", str(exc)))
    kept = []
    for hs in knob_sets:  # and each knob set's pools, before the first point is simulated
        files = sc.files_with(hs)  # a swept set: its values and what sets them
        plan = plan_memory(sc.model, sc.gpu, d, hs, where=files)
        try:
            check_fits(plan, n_in, n_out, d.mode, files)
            kept.append(hs)
        except HisparseError as exc:
            cannot.append((f"hisparse (device_buffer_size {hs.device_buffer_size}, host ratio "
                           f"{hs.host_to_device_ratio:g})", str(exc)))
    if not baseline and not kept:
        raise HisparseError("no system can run this workload: " + "; ".join(f"{who}: {why}" for who, why in cannot))
    return baseline, kept, cannot


# The simulated clock is a float of seconds: past ~1e9 s its resolution (~1e-7 s) nears a decode
# step's microseconds of detail, and at 1e300 s a step adds nothing (TPOT 0.0 ms). A point whose
# arrivals or prefills alone would take longer is refused, not simulated into silent zeros.
MAX_SIM_SECONDS = 1e9


def _check_horizon(sc: Scenario, points: Sequence[tuple[int, float]]) -> None:
    d, w = sc.deployment, sc.workload
    for _, rate in points:
        if rate > 0:
            arrivals = w.requests_per_client * 16 * d.ranks  # InstanceSim.run's open-loop request count
            if arrivals / rate > MAX_SIM_SECONDS:
                where = f"{w.where}: rate_per_s" if rate == w.rate_per_s and w.arrival == Arrival.OPEN else "--rate"
                raise HisparseError(f"{where} {rate:g}: its {arrivals} requests take about {arrivals / rate:.3g} s "
                                    f"to arrive, past the {MAX_SIM_SECONDS:g} s the simulated clock resolves "
                                    f"(give a rate of at least {arrivals / MAX_SIM_SECONDS:.3g} requests/s)")
    if d.mode == Mode.PD_DECODE and d.prefill_tok_s > 0:
        clients = max((c for c, _ in points), default=0) or 16 * d.ranks
        tokens = w.requests_per_client * clients * w.input_tokens
        if tokens / d.prefill_tok_s > MAX_SIM_SECONDS:
            raise HisparseError(f"{d.where}: prefill_tok_s = {d.prefill_tok_s:g}: prefilling {tokens} input tokens "
                                f"takes about {tokens / d.prefill_tok_s:.3g} s, past the {MAX_SIM_SECONDS:g} s the "
                                f"simulated clock resolves (at least {tokens / MAX_SIM_SECONDS:.3g} tokens/s, or 0 "
                                "for the prefill instance the cost model derives)")


def run_plan_full(inp: PlanInputs, on_point: Callable[[], None] | None = None,
                  scenario: Scenario | None = None, search: bool = False, prepared: Prepared | None = None) -> Plan:
    """Every swept point (after ``prepare``'s checks); with ``search``, then the bisection between
    swept points (``search_plan``)."""
    prep = prepared or prepare(inp, scenario)
    sc, points, knob_sets = prep.scenario, prep.points, prep.knob_sets
    initial = "prefix" if sc.deployment.mode == Mode.COLOCATED else "empty"
    results: list[tuple[RunResult, int | None, float | None]] = []
    for c, rate in points if prep.baseline else ():
        results.append((simulate(sc, System.BASELINE, concurrency=c, rate_per_s=rate, seed=inp.seed), None, None))
        if on_point:
            on_point()
    knobs = []
    all_profiles = []
    for hs in knob_sets:
        hsc = sc.replace(hisparse=hs)
        profiles: MissProfiles = scenario_profiles(sc, hs, initial)
        all_profiles.append(profiles)
        w = sc.workload
        policy = speculative_policy(hs.policy)[0] if sc.speculative is not None else hs.policy
        knobs.append(KnobResult(hs.device_buffer_size, hs.host_to_device_ratio, profiles.source, policy,
                                profiles.mean_share(),
                                tuple(profiles.mapping_notes(top_k=hs.top_k, buffer=hs.device_buffer_size,
                                                             output_tokens=w.output_tokens,
                                                             input_tokens=w.input_tokens)),
                                profiles.steps, profiles.steady_from(),
                                profiles.mean_share(profiles.steady_from()), hs.residency))
        for c, rate in points:
            r = simulate(hsc, System.HISPARSE, concurrency=c, rate_per_s=rate, profiles=profiles, seed=inp.seed)
            results.append((r, hs.device_buffer_size, hs.host_to_device_ratio))
            if on_point:
                on_point()
    plan = Plan(sc, tuple(results), tuple(knobs), frozenset(), tuple(all_profiles), cannot_run=prep.cannot_run)
    return search_plan(plan, inp, on_point) if search else plan


def run_plan(inp: PlanInputs, on_point: Callable[[], None] | None = None) -> list[dict]:
    """One row per (system, knobs, load point)."""
    return run_plan_full(inp, on_point).rows()


def _ok(row: dict, slo_tpot_ms: float, slo_ttft_s: float | None) -> bool:
    """Meets the targets and serves what it is offered (open loop: keeps up with arrivals; closed
    loop: no client waits for a running slot)."""
    if row["overloaded"]:
        return False
    if not row["tpot_p99_ms"] <= slo_tpot_ms:
        return False
    if slo_ttft_s is not None and not (row["ttft_p99_s"] <= slo_ttft_s or math.isnan(row["ttft_p99_s"])):
        return False
    return True


def _load(row: dict) -> float:
    return row["concurrency"] or row["rate_per_s"]


def _mid(lo: float, hi: float, closed: bool) -> float:
    """The next load to try: the geometric midpoint (loads span decades), whole clients for a closed
    loop, strictly inside the bracket."""
    m = math.sqrt(lo * hi)
    if closed:
        return min(max(int(round(m)), int(lo) + 1), int(hi) - 1)
    return m


def search_steps(lo: float, hi: float, closed: bool) -> int:
    """How many points the bisection simulates at most between a passing ``lo`` and a failing ``hi``
    (the bracket's lower end rising each time: the longest path)."""
    n = 0
    while _wide(lo, hi, closed) and n < MAX_SEARCH_STEPS:
        lo = _mid(lo, hi, closed)
        n += 1
    return n


def _wide(lo: float, hi: float, closed: bool) -> bool:
    if closed:
        return hi - lo > max(1, math.floor(lo * SEARCH_REL_TOL))
    return (hi - lo) > lo * SEARCH_REL_TOL


def search_plan(plan: Plan, inp: PlanInputs, on_point: Callable[[], None] | None = None) -> Plan:
    """For each system (HiSparse: the knob set whose swept points serve the most under the targets),
    bisect between the highest swept load that meets the targets and the next swept load, which does
    not, until the bracket is within ``SEARCH_REL_TOL``: the highest load that meets them, to that
    tolerance (a failing point is taken as failing every load above it)."""
    sc = plan.scenario
    closed = not inp.rates and sc.workload.arrival != Arrival.OPEN
    results = list(plan.results)
    searched = set(plan.searched)
    rows = plan.rows()
    brackets: dict[str, dict] = {}
    knob_of = {(k.device_buffer_size, k.host_to_device_ratio, k.residency): i for i, k in enumerate(plan.knobs)}
    for system in (System.BASELINE.value, System.HISPARSE.value):
        mine = [r for r in rows if r["system"] == system]
        good = [r for r in mine if _ok(r, inp.slo_tpot_ms, inp.slo_ttft_s)]
        if not good:
            continue
        best = max(good, key=lambda r: r["steady_tok_s_deployment"])
        key = (best["device_buffer_size"], best["host_to_device_ratio"], best.get("residency") or "swap")
        same = sorted((r for r in mine if (r["device_buffer_size"], r["host_to_device_ratio"],
                                           r.get("residency") or "swap") == key), key=_load)
        passing = [r for r in same if _ok(r, inp.slo_tpot_ms, inp.slo_ttft_s)]
        lo = _load(passing[-1])
        above = [r for r in same if _load(r) > lo]
        if not above:
            continue  # the edge of the swept range: recommend() flags it
        hi = _load(above[0])
        if system == System.BASELINE.value:
            sc_sys, profiles = sc, None
        else:
            i = knob_of[key]
            hs = dataclasses.replace(sc.hisparse, device_buffer_size=key[0], host_to_device_ratio=key[1],
                                     residency=key[2])
            sc_sys, profiles = sc.replace(hisparse=hs), plan.profiles[i]
        steps = 0
        while _wide(lo, hi, closed) and steps < MAX_SEARCH_STEPS:
            steps += 1
            mid = _mid(lo, hi, closed)
            c, rate = (int(mid), 0.0) if closed else (0, float(mid))
            r = simulate(sc_sys, System(system), concurrency=c, rate_per_s=rate, profiles=profiles, seed=inp.seed)
            searched.add(len(results))
            results.append((r, key[0], key[1]))
            if on_point:
                on_point()
            if _ok(dataclasses.asdict(r), inp.slo_tpot_ms, inp.slo_ttft_s):
                lo = mid
            else:
                hi = mid
        brackets[system] = {"passes": lo, "fails": hi, "points": steps, "converged": not _wide(lo, hi, closed)}
    return dataclasses.replace(plan, results=tuple(results), searched=frozenset(searched), brackets=brackets)


def tie_reason(baseline_radix_cache: bool) -> str:
    """Why a tie names the baseline: it pins no host pool, and, where the deployment keeps SGLang's
    radix cache (``radix_cache``), it keeps prefix reuse that HiSparse turns off."""
    if baseline_radix_cache:
        return "no pinned host pool; it keeps the radix cache, which HiSparse disables"
    return "no pinned host pool"


def recommend(rows: Sequence[dict], slo_tpot_ms: float, slo_ttft_s: float | None = None,
              band: float = MODEL_ERROR_BAND, baseline_radix_cache: bool = False) -> dict:
    """The highest steady-throughput row meeting the targets, per system and overall.

    Two systems within ``band`` of each other are a ``tie``: the choice is then the baseline
    (``tie_reason``: no pinned host pool, and the radix cache where the deployment keeps it). ``edge`` names
    each system whose best row is the highest (or only) load searched: a higher load may meet the
    targets too."""
    for name, value in (("slo_tpot_ms", slo_tpot_ms), ("slo_ttft_s", slo_ttft_s), ("band", band)):
        # a string target compared to every row raised a TypeError deep in _ok, and a NaN one met nothing
        if value is None and name == "slo_ttft_s":
            continue
        if _is_bool(value) or not isinstance(value, numbers.Real) or math.isnan(value) or not value >= 0 \
                or (name != "band" and not value > 0):
            raise HisparseError(f"recommend: {name} must be a number {'>= 0' if name == 'band' else '> 0'}, "
                                f"got {value!r}")
    best: dict = {}
    edge: dict = {}
    for system in (System.BASELINE.value, System.HISPARSE.value):
        mine = [r for r in rows if r["system"] == system]
        ok = [r for r in mine if _ok(r, slo_tpot_ms, slo_ttft_s)]
        best[system] = max(ok, key=lambda r: r["steady_tok_s_deployment"]) if ok else None
        if best[system] is not None:
            top = max(_load(r) for r in mine)
            edge[system] = _load(best[system]) >= top
    b, h = best["baseline"], best["hisparse"]
    choice = max((x for x in (b, h) if x), key=lambda r: r["steady_tok_s_deployment"]) if (b or h) else None
    gain = (h["steady_tok_s_deployment"] / b["steady_tok_s_deployment"]) if (b and h and b["steady_tok_s_deployment"]) else None
    tie = False
    if b and h:
        hi_, lo_ = max(b["steady_tok_s_deployment"], h["steady_tok_s_deployment"]), min(
            b["steady_tok_s_deployment"], h["steady_tok_s_deployment"])
        tie = hi_ > 0 and (hi_ - lo_) / hi_ <= band
        if tie:
            choice = b
    return {"slo_tpot_ms": slo_tpot_ms, "slo_ttft_s": slo_ttft_s, "baseline": b, "hisparse": h, "choice": choice,
            "hisparse_over_baseline": gain, "tie": tie, "tie_band": band,
            "tie_reason": tie_reason(baseline_radix_cache), "tie_band_source": MODEL_ERROR_SOURCE,
            "edge": edge, "choice_at_edge": bool(choice and edge.get(choice["system"])),
            "search_rel_tol": SEARCH_REL_TOL}
