"""Policy-comparison figures (matplotlib, written to PNG without a display)."""

from __future__ import annotations

import os

import pandas as pd

from ..plotting import finish, pyplot

# Policies that hold no state: every selected entry (none) or every entry past the buffer
# (static-prefix) is loaded. Their misses are a different scale, so they get their own panel.
BASELINES = ("none", "static-prefix")
# Line style by buffer size (colour is the policy): up to 8 sizes stay distinct.
_STYLES = ["-", "--", ":", "-.", (0, (5, 1)), (0, (3, 1, 1, 1)), (0, (1, 3)), (0, (8, 2, 2, 2))]


def _colours(policies: list[str]) -> dict[str, object]:
    """One colour per policy, none repeated (tab10, then tab20's lighter tones)."""
    plt = pyplot()
    palette = list(plt.get_cmap("tab10").colors) + list(plt.get_cmap("tab20").colors[1::2])
    return {p: palette[i % len(palette)] for i, p in enumerate(policies)}


def effective_window(window: int, steps: int) -> int:
    """The rolling window a plot of ``steps`` steps (after the cold start) draws with: ``window``
    when the trace is longer than it, else a quarter of the steps (at least 1). A window as long as
    the trace left one point (an empty-looking plot) and none past it."""
    return window if steps > window else max(1, steps // 4)


def plotted_steps(per_step: pd.DataFrame) -> int:
    """The steps the rolling mean runs over: those after the cold start (step 0), or step 0
    itself when the trace has nothing else."""
    steps = per_step["step"].nunique() - int((per_step["step"] == 0).any())
    return steps or 1


def plot_rolling_misses(per_step: pd.DataFrame, path: str | os.PathLike | None = None, *, window: int = 100,
                        title: str = ""):
    """Misses per step, averaged over the streams (request x layer) and then over a rolling
    window of ``window`` steps: one line per policy x buffer, colour by policy, line style by
    buffer, the stateless baselines in a panel of their own.

    Step 0 is the cold start (the buffer fills: up to k misses) and is left out of the rolling
    mean: kept in, it dominates the first window and makes a false drop when it leaves it. The
    mean is drawn from the first full window on; the shaded band before it is the warm-up. A trace
    no longer than ``window`` is drawn with ``effective_window``'s shorter one (the labels say which)."""
    from matplotlib.lines import Line2D

    plt = pyplot()
    policies = list(dict.fromkeys(per_step["policy"]))
    buffers = sorted(set(per_step["buffer"]))
    colour = _colours(policies)
    style = {b: _STYLES[i % len(_STYLES)] for i, b in enumerate(buffers)}
    groups = [[p for p in policies if p not in BASELINES], [p for p in policies if p in BASELINES]]
    groups = [g for g in groups if g]
    fig, axes = plt.subplots(1, len(groups), figsize=(9 if len(groups) == 1 else 12, 4.8), squeeze=False,
                             gridspec_kw={"width_ratios": [3, 1.4][:len(groups)]})
    streams = per_step.groupby(["request", "layer"]).ngroups
    last = int(per_step["step"].max())
    window = effective_window(window, plotted_steps(per_step))
    later = bool((per_step["step"] > 0).any())  # else the one step there is (step 0) is drawn
    for ax, group in zip(axes[0], groups, strict=True):
        for policy in group:
            for buffer in buffers:
                grp = per_step[(per_step["policy"] == policy) & (per_step["buffer"] == buffer)]
                if grp.empty:
                    continue
                kept = grp[grp["step"] > 0] if later else grp
                mean = kept.groupby("step")["misses"].mean()  # over streams; cold start out
                series = mean.rolling(window, min_periods=min(window, len(mean))).mean().dropna()
                ax.plot(series.index, series.values, color=colour[policy], ls=style[buffer], lw=1.3,
                        marker="o" if len(series) == 1 else None, ms=4)
        if window > 1:
            ax.axvspan(0, min(window, last), color="0.85", alpha=0.5, lw=0)
        ax.set_xlim(0, max(last, 1))
        ax.set_xlabel("decode step")
        ax.grid(alpha=0.3)
        ax.set_title("no-cache baselines" if group[0] in BASELINES else "eviction policies", fontsize=10)
    axes[0][0].set_ylabel(f"misses per step\n(mean over {streams} streams, {window}-step rolling mean)")
    note = (f"shaded: warm-up (first {window} steps);\n" if window > 1 else "") + \
        ("step 0 (cold start) left out" if later else "one step: the cold start")
    axes[0][0].text(0.01, 0.98, note,
                    transform=axes[0][0].transAxes, va="top", fontsize=7, color="0.35")
    handles = [Line2D([], [], color=colour[p], lw=2, label=p) for p in policies]
    if len(buffers) > 1:
        handles.append(Line2D([], [], ls="none", label=""))
        handles += [Line2D([], [], color="0.2", ls=style[b], lw=1.3, label=f"{b} slots") for b in buffers]
    else:
        handles.append(Line2D([], [], ls="none", label=f"buffer {buffers[0]} slots"))
    fig.legend(handles=handles, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8, frameon=False)
    fig.suptitle(title or "Hot-buffer misses per step")
    fig.tight_layout()
    return finish(fig, path)


def plot_miss_ratio_curves(curves: pd.DataFrame, path: str | os.PathLike | None = None, *, title: str = ""):
    """Miss ratio against buffer size, one line per policy."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for policy, grp in curves.groupby("policy", sort=False):
        grp = grp.sort_values("buffer")
        ax.plot(grp["buffer"], grp["miss_ratio"], label=policy, lw=1.4,
                marker="o" if len(grp) <= 40 else None, ms=3)
    ax.set_xlabel("hot-buffer slots per request and layer")
    ax.set_ylabel("miss ratio")
    ax.set_title(title or "Miss ratio against buffer size")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return finish(fig, path)
