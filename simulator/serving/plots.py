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
    df = df.copy()
    for col, empty in (("residency", ""), ("nodes", 0), ("speculative", "off"), ("prefetch", "")):
        if col not in df:
            df[col] = empty
    df["residency"] = df["residency"].fillna("")
    df["nodes"] = df["nodes"].fillna(0)
    several_nodes = df["nodes"].nunique() > 1
    df["prefetch"] = df["prefetch"].fillna("")
    for (system, buf, ratio, res, nodes, sp, pf), grp in df.groupby(
            ["system", "device_buffer_size", "host_to_device_ratio", "residency", "nodes", "speculative", "prefetch"],
            dropna=False, sort=False):
        label = system if system == "baseline" else f"hisparse, buffer {int(buf)}, host x{ratio:g}"
        if res and res != "swap":  # --residency: the dynamic policies' lines
            label += f", {res}"
        if several_nodes:  # --nodes: one line per node count
            label += f", {int(nodes)} node(s)"
        label += "" if sp == "off" else f", {sp}"
        label += f", prefetch {pf}" if pf else ""  # --compare-prefetch: IndexShare prefetch on / off
        line, = ax1.plot(grp[x], grp["steady_tok_s_deployment"], marker="o", ms=3, label=label)
        ax2.plot(grp[x], grp["tpot_p99_ms"], marker="o", ms=3, label=label, color=line.get_color())
        if "band" in grp and grp["band"].notna().all():  # the validation error band (serving.bands)
            g = grp.sort_values(x)
            for ax, key in ((ax1, "steady_tok_s_deployment"), (ax2, "tpot_p99_ms")):
                ax.fill_between(g[x], g[key] * (1 - g["band"]), g[key] * (1 + g["band"]), color=line.get_color(),
                                alpha=0.12, lw=0)
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


def plot_validation(rows: list[dict], path: str | os.PathLike | None = None, band: float = 0.15):
    """Measured against predicted for every published point (``hisparse plan --validate``): one
    panel per metric unit (throughputs; running requests), the y = x line and a +-``band`` band (the
    accuracy target), markers by set, hollow for HiSparse; points the model cannot run are listed
    under the panels instead of drawn. Write the figure to ``path``; with no path, return it."""
    plt = pyplot()

    df = pd.DataFrame(rows)
    ran = df[df["predicted"].notna()]
    groups = [("output tokens/s (deployment)", ran[ran["metric"] != "max_running"]),
              ("running requests (deployment)", ran[ran["metric"] == "max_running"])]
    groups = [(title, g) for title, g in groups if len(g)]
    fig, axes = plt.subplots(1, max(len(groups), 1), figsize=(5.6 * max(len(groups), 1), 5.0), squeeze=False)
    if not groups:
        axes[0][0].axis("off")
        axes[0][0].text(0.5, 0.5, "no point the model can run", ha="center", va="center")
    markers = {name: "osD^vP"[i % 6] for i, name in enumerate(sorted(df["set"].unique()))}
    for ax, (title, g) in zip(axes[0][:len(groups)], groups, strict=True):
        lo = 0.8 * min(g["measured"].min(), g["predicted"].min())
        hi = 1.25 * max(g["measured"].max(), g["predicted"].max())
        xs = [lo, hi]
        ax.plot(xs, xs, color="black", lw=1, label="predicted = measured")
        ax.fill_between(xs, [x * (1 - band) for x in xs], [x * (1 + band) for x in xs], color="grey", alpha=0.2,
                        label=f"within {band:.0%}")
        for (name, system), pts in g.groupby(["set", "system"], sort=True):
            hollow = system == "hisparse"
            ax.scatter(pts["measured"], pts["predicted"], marker=markers[name], s=36,
                       facecolors="none" if hollow else None, edgecolors="C0" if hollow else None,
                       color=None if hollow else "C1", label=f"{name}, {system}")
            for _, r in pts.iterrows():
                ax.annotate(f"{r['error']:+.0%}", (r["measured"], r["predicted"]), fontsize=7,
                            xytext=(4, -3), textcoords="offset points")
        if hi / lo > 4:  # throughputs span decades: log axes, plain labels
            from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

            ax.set_xscale("log")
            ax.set_yscale("log")
            for axis in (ax.xaxis, ax.yaxis):
                axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
                axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
                axis.set_minor_formatter(NullFormatter())
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_xlabel(f"measured, {title}")
        ax.set_ylabel(f"predicted, {title}")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7, loc="upper left")
    missing = df[df["predicted"].isna()]
    if len(missing):
        fig.text(0.01, -0.02, "not run by the model: " + "; ".join(f"{r['set']}: {r['label']}" for _, r in
                                                                 missing.iterrows()), fontsize=7)
    errs = ran["error"].abs()
    told = f"median |error| {errs.median():.0%}, max {errs.max():.0%}" if len(ran) else "no prediction"
    fig.suptitle(f"Published runs: {told} over {len(ran)} of {len(df)} points (nothing fitted to them)")
    return finish(fig, path)


def plot_frontier(report: dict, path: str | os.PathLike | None = None):
    """``hisparse plan --search``: every simulated point's tok/s/GPU against tok/s/user (one colour
    per configuration's system), the Pareto frontier as a line, the TPOT target as a vertical line
    (1000 / TPOT ms tok/s/user) and the best configuration starred."""
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(8, 5))
    pts = pd.DataFrame(report["points"])
    ttft = report["targets"]["slo_ttft_s"]
    if len(pts):
        pts = pts[pts["tok_s_per_user"] > 0]
        within = pts["ttft_p99_s"] <= ttft if ttft else pts["ttft_p99_s"] == pts["ttft_p99_s"]
        for system, marker in (("baseline", "s"), ("hisparse", "o")):
            g = pts[(pts["system"] == system) & within]
            ax.scatter(g["tok_s_per_user"], g["steady_tok_s_per_gpu"], s=14, marker=marker, alpha=0.5, label=system)
            g = pts[(pts["system"] == system) & ~within]
            ax.scatter(g["tok_s_per_user"], g["steady_tok_s_per_gpu"], s=10, marker=marker, alpha=0.2, color="grey",
                       label=f"{system}, past the TTFT target" if len(g) else None)
    fr = pd.DataFrame(report["frontier"])
    if len(fr):
        ax.plot(fr["tok_s_per_user"], fr["tok_s_per_gpu"], color="black", lw=1.5, drawstyle="steps-post",
                label="Pareto frontier")
        if "band" in fr and fr["band"].notna().all():  # each frontier point's validation band (serving.bands)
            ax.errorbar(fr["tok_s_per_user"], fr["tok_s_per_gpu"], yerr=fr["band"] * fr["tok_s_per_gpu"], fmt="none",
                        ecolor="black", elinewidth=0.8, capsize=2, label="validation band")
    tpot = report["targets"]["slo_tpot_ms"]
    ax.axvline(1e3 / tpot, color="#c00", ls="--", lw=1, label=f"TPOT target {tpot:g} ms")
    best = report.get("best")
    if best:
        ax.plot([best["tok_s_per_user"]], [best["tok_s_per_gpu"]], marker="*", ms=16, color="#e0a000",
                markeredgecolor="black", ls="none", label="best under the targets")
    ax.set_xlabel("output tokens/s per user (1000 / TPOT mean ms)")
    ax.set_ylabel("output tokens/s per GPU (steady)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("Configuration search: throughput per GPU against per user")
    return finish(fig, path)
