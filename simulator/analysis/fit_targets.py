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


def _params(targets: Targets) -> list[Param]:
    out = []
    for i, p in enumerate(targets.fit.get("param", [])):
        where = f"{targets.path}: [[fit.param]] {i + 1} ({p.get('name', '?')})"
        try:
            param = Param(str(p["name"]), tuple(p["knobs"]), str(p.get("mode", "set")), float(p["lo"]), float(p["hi"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise HisparseError(f"{where}: needs name, knobs = [...], lo and hi ({exc})") from None
        if param.mode not in ("set", "add") or not param.lo < param.hi:
            raise HisparseError(f"{where}: mode must be 'set' or 'add' and lo < hi")
        out.append(param)
    if not out:
        raise HisparseError(f"{targets.path}: no [[fit.param]] tables: nothing to fit")
    return out


def start_knobs(targets: Targets) -> GeneratorKnobs:
    """The knobs the fit starts from (and the parameters' references are checked against)."""
    fit = targets.fit
    if "knobs" in fit:
        return knobs_from_dict(fit["knobs"], f"{targets.path} [fit.knobs]")
    if "start" not in fit:
        raise HisparseError(f"{targets.path}: [fit] needs start = PRESET or a [fit.knobs] table")
    return load_knobs(str(fit["start"]))


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


def draw(knobs: GeneratorKnobs, targets: Targets, steps: int | None = None) -> Measure:
    sh = targets.shape
    streams = generate(knobs, steps=steps or sh.steps, layers=sh.layers, requests=sh.requests, k=sh.topk,
                       ctx0=sh.ctx0, seed=sh.seed)
    return Measure(streams, sh.topk, sh.warmup)


def fit_targets(targets: Targets, *, iterations: int = 6, on_eval: Callable[[str], None] | None = None) -> TargetFit:
    """Knobs whose draw meets ``targets`` (as near as the parameters allow); see the module doc."""
    params = _params(targets)
    start = start_knobs(targets)
    check_refs(start, params, targets.path)
    x = np.array([(0.0 if p.mode == "add" else _get(start, p.refs[0])) for p in params], dtype=float)
    if "initial" in targets.fit:  # an explicit starting value per parameter
        init = targets.fit["initial"]
        x = np.array([float(init.get(p.name, v)) for p, v in zip(params, x, strict=True)])
    lo, hi = np.array([p.lo for p in params]), np.array([p.hi for p in params])
    x = np.clip(x, lo, hi)
    steps = targets.fit.get("steps")
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
