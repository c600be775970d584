"""Policy-comparison figures (matplotlib, written to PNG without a display)."""

from __future__ import annotations

import os

import pandas as pd

from ..plotting import finish, pyplot


def plot_rolling_misses(per_step: pd.DataFrame, path: str | os.PathLike | None = None, *, window: int = 100,
                        title: str = ""):
    """Misses per step (mean over streams), rolling mean over ``window`` steps: one line per
    policy x buffer (the figure the HiSparse authors used)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for (policy, buffer), grp in per_step.groupby(["policy", "buffer"], sort=False):
        series = grp.groupby("step")["misses"].mean().rolling(window, min_periods=1).mean()
        ax.plot(series.index, series.values, label=f"{policy}, {buffer} slots", lw=1.2)
    ax.set_xlabel("decode step")
    ax.set_ylabel(f"misses per step ({window}-step rolling mean)")
    ax.set_title(title or "Hot-buffer misses per step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
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
