"""The what-if "how much does IndexShare prefetch hide": the same HiSparse plan with SGLang's
prefetch of the shared layers' swap-in (PR #29637, the default) and without it
(``SGLANG_DISABLE_HISPARSE_PREFETCH=1``, here ``--set hisparse.prefetch=false``), compared load point
by load point and at each plan's best point under the targets.

The rows carry a ``prefetch`` column (``on`` / ``off``; empty on the baseline, which has no host
tier); the comparison is ``spec_whatif.compare`` on that column, so the table, JSON, plot and report
read the same rows. The baseline is planned once (prefetch changes nothing there).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import HisparseError
from .slo import MODEL_ERROR_BAND
from .spec_whatif import best_text
from .spec_whatif import compare as _compare

COLUMN = "prefetch"
ON, OFF = "on", "off"
OFF_OVERRIDE = "hisparse.prefetch=false"


def check(scenario: Any, where: str = "--compare-prefetch") -> None:
    """The what-if needs a plan whose prefetch is on: an IndexShare model (shared layers), HiSparse
    with ``prefetch = true``, no pipeline parallelism (SGLang turns it off under PP)."""
    m, hs, d = scenario.model, scenario.hisparse, scenario.deployment
    if not m.shared_layers:
        raise HisparseError(f"{where}: model {m.where} has no IndexShare shared layers (index_topk_freq / "
                            "anchor layers): prefetch has nothing to hide; use an IndexShare model (glm-5.2-fp8)")
    if hs is None or not hs.prefetch:
        raise HisparseError(f"{where}: the HiSparse config has prefetch = false (or --set hisparse.prefetch=false): "
                            "the plan to compare against must run with it on")
    if getattr(d, "pp", 1) != 1:
        raise HisparseError(f"{where}: deployment {d.where} runs pipeline parallelism, under which SGLang "
                            "disables the prefetch: there is nothing to compare")


def tag(rows: Sequence[dict], value: str) -> list[dict]:
    """Rows with their ``prefetch`` column set (``value`` on HiSparse rows, empty on the baseline)."""
    out = []
    for r in rows:
        r = dict(r)
        r[COLUMN] = value if r["system"] != "baseline" else ""
        out.append(r)
    return out


def compare(rows: Sequence[dict], slo_tpot_ms: float, slo_ttft_s: float | None,
            band: float = MODEL_ERROR_BAND) -> dict[str, Any]:
    """``spec_whatif.compare`` on the ``prefetch`` column: per load the steady throughput and TPOT
    p99 with / without, the best point of each under the targets, and the verdict (``pays off`` /
    ``loses`` past the model's error ``band``, ``tie`` within it)."""
    hs = [r for r in rows if r["system"] != "baseline"]
    out = _compare(hs, slo_tpot_ms, slo_ttft_s, band, column=COLUMN, off_value=OFF)
    out["off_by"] = f"--set {OFF_OVERRIDE} (SGLANG_DISABLE_HISPARSE_PREFETCH=1)"
    return out


def summary_lines(cmp: dict[str, Any]) -> list[str]:
    """The plan's printed answer: the verdict, the best points, and per load the throughput and
    TPOT p99 ratios with / without the prefetch."""
    lines = []
    for system, s in cmp["systems"].items():
        tok = ", ".join(f"{p['load']:g}: x{p['throughput_ratio']:.2f}" for p in s["points"]
                        if p["throughput_ratio"] is not None)
        tpot = ", ".join(f"{p['load']:g}: x{p['tpot_p99_ratio']:.2f}" for p in s["points"]
                         if p["tpot_p99_ratio"] is not None)
        best = best_text(s)
        lines.append(f"does IndexShare prefetch pay off ({system}): {s['verdict'].upper()} (band {cmp['band']:.0%}); "
                     f"{best}; with / without by load: steady throughput {tok}; TPOT p99 {tpot}")
    return lines
