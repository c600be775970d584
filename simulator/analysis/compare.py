"""`hisparse trace compare`: a trace's statistics beside published targets, as rows, JSON and a
plot (per-layer consecutive overlap; layer-averaged LRU miss ratio against B/k)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from .targets import Measure, Targets, report

CURVE_RATIOS = (1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0)  # B/k of the plotted LRU curve


def compare_trace(source, targets: Sequence[Targets], warmup: int | None = None,
                  curve: bool = False) -> dict[str, Any]:
    """Statistics of ``source`` (a TraceSource) against each targets file: one report per file,
    the per-layer overlaps and LRU miss ratio at B = 2k, and (``curve``) the LRU curve."""
    k = source.meta.k
    w = warmup if warmup is not None else (targets[0].shape.warmup if targets else 16)
    m = Measure(iter(source), k, w)
    out: dict[str, Any] = {
        "trace": str(source.path), "topk": k, "warmup": w, "layers": len(m.layers),
        "requests": len({s.request for s in m.streams}), "steps": int(min(s.steps for s in m.streams)),
        "per_layer": {"step_overlap": m.per_layer("step_overlap"),
                      "layer_overlap": m.per_layer("layer_overlap"),
                      "lru_miss_2k": m.per_layer("lru_miss", 2.0)},
        "targets": {str(t.path.stem): report(m, t.targets) for t in targets},
    }
    if curve:
        out["lru_curve"] = {r: m.value("lru_miss", None, r) for r in CURVE_RATIOS}
    return out


def plot_compare(result: dict[str, Any], targets: Sequence[Targets], path: str | os.PathLike | None):
    """Two panels: per-layer consecutive overlap (target bands as boxes) and the layer-averaged
    LRU miss ratio against B/k (targets as points with their tolerance)."""
    from ..plotting import finish, pyplot

    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    per = result["per_layer"]["step_overlap"]
    layers = sorted(per)
    a.plot(layers, [per[x] for x in layers], "o-", ms=3, label="trace")
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"][1:]
    for t, colour in zip(targets, colours, strict=False):
        first = True
        for tg in t.targets:
            if tg.statistic != "step_overlap":
                continue
            lo, hi = tg.layers or (0, max(layers))
            a.fill_between([lo - 0.4, hi + 0.4], tg.value - tg.tolerance, tg.value + tg.tolerance, color=colour,
                           alpha=0.2, label=f"{t.path.stem} targets" if first else None)
            first = False
    a.set_xlabel("layer")
    a.set_ylabel("|S_t & S_t-1| / k")
    a.set_ylim(0, 1)
    a.set_title("consecutive-step overlap per layer")
    a.legend(fontsize=8)
    curve = result.get("lru_curve", {})
    xs = sorted(curve)
    b.plot(xs, [curve[x] for x in xs], "o-", label="trace (batched LRU, all layers)")
    for t, colour in zip(targets, colours, strict=False):
        pts = [tg for tg in t.targets if tg.statistic == "lru_miss" and tg.layers is None]
        if pts:
            err = [tg.tolerance * (tg.value if tg.relative else 1.0) for tg in pts]
            b.errorbar([tg.buffer_ratio for tg in pts], [tg.value for tg in pts], yerr=err, fmt="s", color=colour,
                       capsize=3, label=f"{t.path.stem} targets")
    b.set_xscale("log", base=2)
    b.set_yscale("log")
    b.set_xlabel("buffer / k")
    b.set_ylabel("LRU miss ratio")
    b.set_title(f"miss ratio against buffer (steps >= {result['warmup']})")
    b.legend(fontsize=8)
    fig.suptitle(os.path.basename(result["trace"]))
    fig.tight_layout()
    return finish(fig, path)


def finite(x: float) -> float | None:
    return None if x is None or not np.isfinite(x) else float(x)
