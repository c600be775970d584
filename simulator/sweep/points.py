"""Run one sweep point: the same code ``hisparse replay`` and ``hisparse plan`` run."""

from __future__ import annotations

import time
import traceback
from typing import Any

from ..errors import HisparseError


def run_point(kind: str, point: dict[str, Any]) -> dict[str, Any]:
    """Outputs of one point as a flat record; a failure becomes an ``error`` column, not a raise."""
    t0 = time.perf_counter()
    try:
        out = _replay(point) if kind == "replay" else _plan(point)
        out["error"] = ""
    except Exception as exc:  # a failing point is recorded and the sweep goes on
        out = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc(limit=3)}
    out["seconds"] = time.perf_counter() - t0
    return out


def _replay(p: dict[str, Any]) -> dict[str, Any]:
    from ..replay import replay
    from ..trace import open_trace

    trace = open_trace(p["trace"])  # each worker reads the shared file itself, a stream at a time
    cfg = replay_config(p)
    (record,) = replay(trace, cfg, workers=1).records
    return {k: record[k] for k in ("streams", "steps", "accesses", "misses", "miss_ratio")}


def replay_config(p: dict[str, Any]):
    """The ReplayConfig of a replay point (the sweep's up-front check builds the same one)."""
    from dataclasses import fields

    from ..replay import ReplayConfig

    return ReplayConfig(**{f.name: p[f.name] for f in fields(ReplayConfig) if f.name in p})


def plan_inputs(p: dict[str, Any]):
    """The PlanInputs of a plan point (the sweep's up-front check builds the same one)."""
    import dataclasses

    from ..serving import presets as P
    from ..serving.planner import PlanInputs

    inp = PlanInputs(**{k: p[k] for k in ("model", "gpu", "deployment", "workload", "hisparse", "calibration",
                                          "trace", "slo_tpot_ms", "slo_ttft_s", "seed") if k in p},
                     concurrency=(p.get("concurrency", 64),), rates=(p["rate"],) if "rate" in p else ())
    if "device_buffer_size" in p or "host_to_device_ratio" in p:
        hs = inp.scenario().hisparse if inp.hisparse is None else P.load("hisparse", inp.hisparse)
        inp = dataclasses.replace(inp, buffers=(p.get("device_buffer_size", hs.device_buffer_size),),
                                  host_ratios=(p.get("host_to_device_ratio", hs.host_to_device_ratio),))
    return inp


# what a plan point records of each system's row (as <system>_<key>)
PLAN_KEYS = ("steady_tok_s_deployment", "makespan_tok_s_deployment", "tpot_p50_ms", "tpot_p99_ms", "ttft_p50_s",
             "running_deployment", "max_running_deployment", "kv_used_gb_per_gpu", "host_used_gb_per_gpu",
             "miss_share", "overloaded")


def _plan(p: dict[str, Any]) -> dict[str, Any]:
    """A plan point's figures per system. A system the plan leaves out (it cannot run at this point:
    no request fits its pool) gets no figures and its reason in ``<system>_cannot_run``, and the
    other system's figures stay: one system left out is an answer about this point, not its failure."""
    from ..serving.planner import run_plan_full

    plan = run_plan_full(plan_inputs(p))
    rows = plan.rows()
    if not rows:  # neither system can run: the point's error names both reasons
        raise HisparseError("; ".join(f"{who}: {why}" for who, why in plan.cannot_run) or "nothing could run")
    out: dict[str, Any] = {}
    for row in rows:
        for key in PLAN_KEYS:
            out[f"{row['system']}_{key}"] = row[key]
    for who, why in plan.cannot_run:
        out[f"{who.split()[0]}_cannot_run"] = why
    base, hs = out.get("baseline_steady_tok_s_deployment"), out.get("hisparse_steady_tok_s_deployment")
    out["hisparse_over_baseline"] = hs / base if base and hs is not None else float("nan")
    out["calibrated"] = rows[0]["calibrated"]
    return out
