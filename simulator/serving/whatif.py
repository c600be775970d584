"""The plan's what-if answers beyond baseline against HiSparse: "device-resident or swap at this load"
(``--residency``: HiSparse knob sets that differ only in their residency policy) and "one node or two"
(``--nodes``: the same plan on each node count, ``cluster.deployment_for_nodes``).

Both compare the best row meeting the targets (``planner._ok``) of each alternative; alternatives
closer than the model's error band (``slo.MODEL_ERROR_BAND``) are a tie, and the tie goes to the
simpler one (``swap``: HiSparse as released; fewer nodes)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .planner import _ok
from .slo import MODEL_ERROR_BAND


def _best(rows: Sequence[dict], slo_tpot_ms: float, slo_ttft_s: float | None, key: str = "steady_tok_s_deployment"):
    ok = [r for r in rows if _ok(r, slo_tpot_ms, slo_ttft_s)]
    return max(ok, key=lambda r: r[key]) if ok else None


def residency_summary(rows: Sequence[dict], slo_tpot_ms: float, slo_ttft_s: float | None,
                      band: float = MODEL_ERROR_BAND) -> dict | None:
    """Per residency policy the best HiSparse row under the targets among the swept loads (the same
    loads for every policy), the policies side by side at each load, and the choice (None when the
    plan ran one policy)."""
    hs = [r for r in rows if r["system"] == "hisparse"]
    policies = list(dict.fromkeys(r.get("residency") or "swap" for r in hs))
    if len(policies) < 2:
        return None
    swept = [r for r in hs if not r.get("searched")]  # the loads every policy ran (the search runs for one knob set)
    best = {p: _best([r for r in swept if (r.get("residency") or "swap") == p], slo_tpot_ms, slo_ttft_s) for p in policies}
    loads = sorted({(r["concurrency"], r["rate_per_s"]) for r in hs if not r.get("searched")})
    by_load = []
    for c, rate in loads:
        here = {(r.get("residency") or "swap"): r for r in hs if (r["concurrency"], r["rate_per_s"]) == (c, rate)
                and not r.get("searched")}
        by_load.append({"concurrency": c, "rate_per_s": rate,
                        **{p: {"steady_tok_s": here[p]["steady_tok_s_deployment"], "tpot_p99_ms": here[p]["tpot_p99_ms"],
                               "resident_share": here[p].get("resident_share", 0.0),
                               "demotions": here[p].get("demotions", 0)} for p in policies if p in here}})
    ranked = sorted((p for p in policies if best[p]), key=lambda p: -best[p]["steady_tok_s_deployment"])
    choice, tie = (ranked[0] if ranked else None), False
    if choice and "swap" in ranked and choice != "swap":
        top, swap = best[choice]["steady_tok_s_deployment"], best["swap"]["steady_tok_s_deployment"]
        if top > 0 and (top - swap) / top <= band:
            choice, tie = "swap", True
    return {"policies": policies, "best": best, "by_load": by_load, "choice": choice, "tie": tie, "tie_band": band}


def nodes_summary(choices: Mapping[int, dict | None], gpus: Mapping[int, int], band: float = MODEL_ERROR_BAND) -> dict:
    """Per node count its plan's recommended row (``planner.recommend``'s choice: the best under the
    targets, ties to the baseline) and its per-GPU throughput; the choice is the node count with the
    most output tokens/s per GPU (the cost of a token), a tie within ``band`` going to fewer nodes;
    ``most_served`` is the one that serves the most in all."""
    best = dict(choices)
    out = {"nodes": sorted(best), "gpus": dict(gpus), "best": best}
    have = [n for n in sorted(best) if best[n]]
    if not have:
        return out | {"choice": None, "most_served": None, "tie": False, "tie_band": band}
    per_gpu = {n: best[n]["steady_tok_s_per_gpu"] for n in have}
    top = max(per_gpu.values())
    close = [n for n in have if top <= 0 or (top - per_gpu[n]) / top <= band]
    most = max(have, key=lambda n: best[n]["steady_tok_s_deployment"])
    return out | {"choice": min(close), "most_served": most, "tie": len(close) > 1, "tie_band": band,
                  "per_gpu": per_gpu}
