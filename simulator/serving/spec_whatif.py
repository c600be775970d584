"""The what-if "does MTP pay off at this concurrency": the same plan with and without speculative
decoding, compared load point by load point and at each system's best point under the targets.

The plan rows carry a ``speculative`` column (the spec's label, or ``off``); this module reads only
rows, so the plan's table, JSON, plot and report show the same verdict.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .slo import MODEL_ERROR_BAND

OFF = "off"


def label(spec: Any) -> str:
    """The ``speculative`` column of a plan row."""
    return spec.label if spec is not None else OFF


def compare(rows: Sequence[dict], slo_tpot_ms: float, slo_ttft_s: float | None,
            band: float = MODEL_ERROR_BAND, column: str = "speculative", off_value: str = OFF) -> dict[str, Any]:
    """Per system: each load point's steady throughput and TPOT p99 with speculative decoding over
    without (same knobs, same load), and the best point of each under the targets; the verdict
    ``pays off`` / ``loses`` when the best points differ by more than the model's error ``band``,
    ``tie`` within it. ``column`` / ``off_value``: the row column that tells the two plans apart
    (``prefetch_whatif`` compares ``prefetch`` on / off the same way)."""
    from .planner import _load, _ok

    out: dict[str, Any] = {"band": band, "systems": {}}
    for system in sorted({r["system"] for r in rows}):
        mine = [r for r in rows if r["system"] == system]
        on = [r for r in mine if r.get(column, off_value) != off_value]
        off = [r for r in mine if r.get(column, off_value) == off_value]
        if not on or not off:
            continue
        key = lambda r: (r["device_buffer_size"], r["host_to_device_ratio"], _load(r))  # noqa: E731
        base = {key(r): r for r in off if not r.get("searched")}
        points = []
        for r in sorted(on, key=key):
            b = base.get(key(r))
            if b is None or r.get("searched"):
                continue
            points.append({"load": _load(r), "device_buffer_size": r["device_buffer_size"],
                           "throughput_ratio": _ratio(r["steady_tok_s_deployment"], b["steady_tok_s_deployment"]),
                           "tpot_p99_ratio": _ratio(r["tpot_p99_ms"], b["tpot_p99_ms"]),
                           "tpot_p99_ms": r["tpot_p99_ms"], "tpot_p99_ms_off": b["tpot_p99_ms"]})
        good_on = [r for r in on if _ok(r, slo_tpot_ms, slo_ttft_s)]
        good_off = [r for r in off if _ok(r, slo_tpot_ms, slo_ttft_s)]
        best_on = max(good_on, key=lambda r: r["steady_tok_s_deployment"]) if good_on else None
        best_off = max(good_off, key=lambda r: r["steady_tok_s_deployment"]) if good_off else None
        gain = (_ratio(best_on["steady_tok_s_deployment"], best_off["steady_tok_s_deployment"])
                if best_on and best_off else None)
        if gain is None:
            verdict = "pays off" if best_on and not best_off else "loses" if best_off and not best_on else "n/a"
        else:
            verdict = "pays off" if gain > 1 + band else "loses" if gain < 1 - band else "tie"
        out["systems"][system] = {column: on[0][column], "points": points, "best_on": best_on,
                                  "best_off": best_off, "gain": gain, "verdict": verdict}
    return out


def _ratio(a: float, b: float) -> float | None:
    return a / b if b and b == b and a == a else None


def best_text(s: dict[str, Any]) -> str:
    """One system's best points with and without the mechanism, as the what-if lines say them."""
    on, off = s["best_on"], s["best_off"]
    if on and off:
        return (f"best under the targets {on['steady_tok_s_deployment']:.0f} tok/s at load "
                f"{on['concurrency'] or on['rate_per_s']:g} with it, {off['steady_tok_s_deployment']:.0f} at "
                f"{off['concurrency'] or off['rate_per_s']:g} without (x{s['gain']:.2f})")
    if on or off:
        return "only " + ("with" if on else "without") + " it does a point meet the targets"
    return "no point meets the targets with or without it"


def summary_lines(cmp: dict[str, Any]) -> list[str]:
    """The plan's printed answer, one line per system and the per-load ratios."""
    lines = []
    for system, s in cmp["systems"].items():
        pts = ", ".join(f"{p['load']:g}: x{p['throughput_ratio']:.2f}" for p in s["points"]
                        if p["throughput_ratio"] is not None)
        best = best_text(s)
        lines.append(f"does {s['speculative']} pay off ({system}): {s['verdict'].upper()} "
                     f"(band {cmp['band']:.0%}); {best}; steady throughput with / without by load: {pts}")
    return lines
