"""Throughput and TPOT against load (concurrency or arrival rate), one line per system and knob
set, with the TPOT target and the recommended point marked."""

from __future__ import annotations

import os

import pandas as pd

from ..plotting import finish, pyplot


def plot_throughput(df: pd.DataFrame, path: str | os.PathLike | None = None, recommendation: dict | None = None):
    """Write the figure to ``path``; with no path, return it (notebooks)."""
    plt = pyplot()

    open_loop = bool((df["concurrency"] == 0).all())
    x = "rate_per_s" if open_loop else "concurrency"
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for (system, buf, ratio), grp in df.groupby(["system", "device_buffer_size", "host_to_device_ratio"],
                                                dropna=False, sort=False):
        label = system if system == "baseline" else f"hisparse, buffer {int(buf)}, host x{ratio:g}"
        ax1.plot(grp[x], grp["steady_tok_s_deployment"], marker="o", ms=3, label=label)
        ax2.plot(grp[x], grp["tpot_p99_ms"], marker="o", ms=3, label=label)
    rec = recommendation or {}
    if rec.get("slo_tpot_ms"):
        ax2.axhline(rec["slo_tpot_ms"], color="grey", ls="--", lw=1, label=f"TPOT target {rec['slo_tpot_ms']:g} ms")
    choice = rec.get("choice")
    if choice:
        cx = choice["rate_per_s"] if open_loop else choice["concurrency"]
        ax1.plot([cx], [choice["steady_tok_s_deployment"]], marker="*", ms=14, color="black", ls="none",
                 label="recommended")
        ax2.plot([cx], [choice["tpot_p99_ms"]], marker="*", ms=14, color="black", ls="none")
    for ax, ylabel in ((ax1, "steady output throughput, deployment (tok/s)"), (ax2, "TPOT p99 (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("arrival rate (requests/s)" if open_loop else "concurrent requests")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    ax1.legend(fontsize=8)
    ax2.legend(fontsize=8)
    calibrated = bool(df["calibrated"].iloc[0]) if "calibrated" in df else False
    fig.suptitle("Baseline against HiSparse" + ("" if calibrated else " (uncalibrated cost model)"))
    return finish(fig, path)
