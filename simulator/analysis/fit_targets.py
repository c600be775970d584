"""Fit the generator's knobs to published statistics (a targets file), not to a trace.

The targets file's ``[fit]`` table names the starting knobs (``start``: a preset name or knobs
file, or an inline ``[fit.knobs]`` table) and the free parameters (``[[fit.param]]``: ``name``,
``knobs`` = the knob references it sets, ``mode`` "set" or "add" (added to the start values),
``lo``/``hi`` bounds). A knob reference is a knob name (``recall_gap``) or one breakpoint value of
its layer profile (``profile.retention.3``: the 4th breakpoint), so one parameter can move a
band of layers (two breakpoints) or a whole profile at once.

Each evaluation draws the targets' ``[shape]`` (same seed every time: common random numbers)
and measures every target with ``targets.Measure``, the code `trace compare` uses. The
parameters are moved by Levenberg-Marquardt on the errors in units of each target's tolerance,
with a forward-difference Jacobian (once all errors are below 1.5 tolerances, each error e
enters as e (1 + e^2), so that a target outside its tolerance outweighs several inside it):
a few dozen draws.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..errors import HisparseError
from ..trace.generator import GeneratorKnobs, generate, knobs_from_dict, load_knobs
from .targets import Measure, Targets, report


@dataclass(frozen=True)
class Param:
    name: str
    refs: tuple[str, ...]
    mode: str
    lo: float
    hi: float


@dataclass
class TargetFit:
    knobs: GeneratorKnobs
    rows: list[dict[str, Any]]
    evaluations: int
    params: dict[str, float]


def _finite(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, int | float) and bool(np.isfinite(v))


def _params(targets: Targets) -> list[Param]:
    out = []
    raw = targets.fit.get("param", [])
    if not isinstance(raw, list) or not all(isinstance(p, dict) for p in raw):
        raise HisparseError(f"{targets.path}: [fit] param must be [[fit.param]] tables, got {raw!r}")
    for i, p in enumerate(raw):
        where = f"{targets.path}: [[fit.param]] {i + 1} ({p.get('name', '?')})"
        refs, lo, hi = p.get("knobs"), p.get("lo"), p.get("hi")
        if (not isinstance(p.get("name"), str) or not isinstance(refs, list) or not refs
                or not all(isinstance(r, str) for r in refs) or not _finite(lo) or not _finite(hi)):
            raise HisparseError(f"{where}: needs name = \"...\", knobs = [\"knob\", ...] (at least one), "
                                "and finite numbers lo and hi")
        param = Param(p["name"], tuple(refs), str(p.get("mode", "set")), float(lo), float(hi))
        if any(q.name == param.name for q in out):  # the fit's values and [fit] initial are keyed by name
            raise HisparseError(f"{where}: name {param.name!r} is given to an earlier [[fit.param]] too (each once)")
        if param.mode not in ("set", "add") or not param.lo < param.hi:
            raise HisparseError(f"{where}: mode must be 'set' or 'add' and lo < hi")
        out.append(param)
    if not out:
        raise HisparseError(f"{targets.path}: no [[fit.param]] tables: nothing to fit")
    return out


def start_knobs(targets: Targets) -> GeneratorKnobs:
    """The knobs the fit starts from (and the parameters' references are checked against), with the
    measured model's IndexShare structure (``[shape] index_topk_freq`` / ``index_skip_topk_offset``):
    the fit draws, and the fitted knobs file keeps, shared layers as copies of their anchor's."""
    fit = targets.fit
    if "knobs" in fit:
        if not isinstance(fit["knobs"], dict):
            raise HisparseError(f"{targets.path}: [fit] knobs must be a [fit.knobs] table, got {fit['knobs']!r}")
        knobs = knobs_from_dict(fit["knobs"], f"{targets.path} [fit.knobs]")
    elif "start" not in fit:
        raise HisparseError(f"{targets.path}: [fit] needs start = PRESET or a [fit.knobs] table")
    else:
        knobs = load_knobs(str(fit["start"]))
    sh = targets.shape
    if sh.index_topk_freq > 1:
        knobs = replace(knobs, share_freq=sh.index_topk_freq, share_offset=sh.index_skip_topk_offset)
    return knobs


def _get(knobs: GeneratorKnobs, ref: str) -> float:
    if not ref.startswith("profile."):
        return float(getattr(knobs, ref))
    _, name, i = ref.split(".")
    return dict(knobs.profile)[name][int(i)][1]


def apply(knobs: GeneratorKnobs, params: list[Param], values: np.ndarray, start: GeneratorKnobs) -> GeneratorKnobs:
    """``start`` with each parameter's value written to its references."""
    base: dict[str, Any] = {}
    profile = {name: [list(p) for p in points] for name, points in start.profile}
    for p, v in zip(params, values, strict=True):
        for ref in p.refs:
            new = float(v) + (_get(start, ref) if p.mode == "add" else 0.0)
            if ref.startswith("profile."):
                _, name, i = ref.split(".")
                profile[name][int(i)][1] = new
            else:
                cast = type(getattr(start, ref))
                base[ref] = int(round(new)) if cast is int else new
    prof = tuple((name, tuple((float(d), float(x)) for d, x in points)) for name, points in profile.items())
    return replace(knobs, **base, profile=prof)


def check_refs(start: GeneratorKnobs, params: list[Param], path) -> None:
    prof = dict(start.profile)
    for p in params:
        for ref in p.refs:
            parts = ref.split(".")
            ok = (len(parts) == 1 and hasattr(start, ref) and ref != "profile") or (
                len(parts) == 3 and parts[0] == "profile" and parts[1] in prof and parts[2].isdigit()
                and int(parts[2]) < len(prof[parts[1]]))
            if not ok:
                raise HisparseError(f"{path}: [[fit.param]] {p.name}: knob reference {ref!r} names no knob "
                                    "or profile breakpoint of the start knobs")
            value = getattr(start, ref) if len(parts) == 1 else 0.0
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise HisparseError(f"{path}: [[fit.param]] {p.name}: knob {ref!r} is not a number "
                                    f"({type(value).__name__}); a parameter moves numeric knobs only")


def check_bounds(start: GeneratorKnobs, params: list[Param], x: np.ndarray, path) -> None:
    """Each parameter at its lo and its hi (the others at their start) gives valid knobs: a bound
    outside a knob's domain is named here, not as a bare knob error halfway through the fit."""
    for j, p in enumerate(params):
        for bound in (p.lo, p.hi):
            v = x.copy()
            v[j] = bound
            try:
                apply(start, params, v, start).check()
            except HisparseError as exc:
                raise HisparseError(f"{path}: [[fit.param]] {p.name}: at {bound:g} ({'lo' if bound == p.lo else 'hi'}) "
                                    f"{exc}") from None


def draw(knobs: GeneratorKnobs, targets: Targets, steps: int | None = None) -> Measure:
    sh = targets.shape
    streams = generate(knobs, steps=steps or sh.steps, layers=sh.layers, requests=sh.requests, k=sh.topk,
                       ctx0=sh.ctx0, seed=sh.seed, where=str(targets.path))
    return Measure(streams, sh.topk, sh.warmup)


def fit_targets(targets: Targets, *, iterations: int = 6, on_eval: Callable[[str], None] | None = None) -> TargetFit:
    """Knobs whose draw meets ``targets`` (as near as the parameters allow); see the module doc."""
    params = _params(targets)
    start = start_knobs(targets)
    check_refs(start, params, targets.path)
    x = np.array([(0.0 if p.mode == "add" else _get(start, p.refs[0])) for p in params], dtype=float)
    if "initial" in targets.fit:  # an explicit starting value per parameter
        init = targets.fit["initial"]
        names = {p.name for p in params}
        if not isinstance(init, dict) or set(init) - names or not all(_finite(v) for v in init.values()):
            raise HisparseError(f"{targets.path}: [fit.initial] must map parameter names "
                                f"({', '.join(sorted(names))}) to finite numbers, got {init!r}")
        x = np.array([float(init.get(p.name, v)) for p, v in zip(params, x, strict=True)])
    lo, hi = np.array([p.lo for p in params]), np.array([p.hi for p in params])
    x = np.clip(x, lo, hi)
    check_bounds(start, params, x, targets.path)
    steps = targets.fit.get("steps")
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
        raise HisparseError(f"{targets.path}: [fit] steps must be an integer >= 1, got {steps!r}")
    count = [0]
    cache: dict[tuple, np.ndarray] = {}

    def errors(v: np.ndarray) -> np.ndarray:
        """Each target's error in units of its tolerance, for parameter values ``v``."""
        key = tuple(np.round(v, 9))
        if key not in cache:
            count[0] += 1
            kn = apply(start, params, v, start)
            kn.check()
            m = draw(kn, targets, steps)
            cache[key] = np.array([t.error(m.target(t)) for t in targets.targets])
            if on_eval:
                on_eval(f"evaluation {count[0]}: worst error {np.max(np.abs(cache[key])):.2f} tolerances; "
                        + " ".join(f"{p.name}={val:.4g}" for p, val in zip(params, v, strict=True)))
        return cache[key]

    # Plain least squares while far off; near the targets each error e enters as e (1 + e^2), so
    # that a target outside its tolerance outweighs several inside it.
    weighted = [False]

    def residuals(v: np.ndarray) -> np.ndarray:
        e = errors(v)
        return e * (1.0 + e ** 2) if weighted[0] else e

    r = residuals(x)
    damping = 1e-2
    h = 0.02 * (hi - lo)
    for _ in range(iterations):
        e = errors(x)
        if np.all(np.abs(e) <= 0.25):  # every target well within its tolerance
            break
        if not weighted[0] and np.all(np.abs(e) <= 1.5):
            weighted[0] = True
            r = residuals(x)
        jac = np.empty((r.size, x.size))
        for j in range(x.size):
            step = h[j] if x[j] + h[j] <= hi[j] else -h[j]
            xj = x.copy()
            xj[j] += step
            jac[:, j] = (residuals(xj) - r) / step
        improved = False
        for _ in range(4):
            a = jac.T @ jac + damping * np.diag(np.diag(jac.T @ jac) + 1e-9)
            dx = np.linalg.solve(a, -jac.T @ r)
            cand = np.clip(x + dx, lo, hi)
            rc = residuals(cand)
            if np.sum(rc ** 2) < np.sum(r ** 2):
                x, r, improved = cand, rc, True
                damping = max(damping / 3, 1e-4)
                break
            damping *= 4
        if not improved:
            break
    knobs = apply(start, params, x, start)
    rows = report(draw(knobs, targets), targets.targets)
    return TargetFit(knobs, rows, count[0], {p.name: float(v) for p, v in zip(params, x, strict=True)})
