"""Figures of the calibration report, rebuilt from the committed JSON/CSV files (no GPU)."""

from __future__ import annotations

import os

import numpy as np

from ..plotting import finish, pyplot


def plot_validation(report: dict, path: str | os.PathLike | None = None):
    """Predicted against measured decode-step time, one colour per validation configuration."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 5))
    hi = 0.0
    for c in report["configs"]:
        m, p = np.asarray(c["measured_s"]) * 1e3, np.asarray(c["predicted_s"]) * 1e3
        hi = max(hi, m.max(), p.max())
        ax.scatter(m, p, s=10, label=f"R {c['requests']}, L {c['layers']}, buffer {c['hot']}, H {c['heads']}, "
                                     f"{c['row_bytes']} B")
    ax.plot([0, hi * 1.05], [0, hi * 1.05], "k--", lw=0.8)
    for f in (0.9, 1.1):
        ax.plot([0, hi * 1.05], [0, hi * 1.05 * f], ":", color="grey", lw=0.8)
    ax.set_xlabel("measured step time (ms)")
    ax.set_ylabel("predicted step time (ms)")
    ax.set_title(f"Validation on {report['gpu']}: median error {report['step_time_median_abs_err']:.1%}, "
                 f"p90 {report['step_time_p90_abs_err']:.1%}", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return finish(fig, path)


def plot_layer_validation(report: dict, path: str | os.PathLike | None = None):
    """Predicted against measured step time of the full-layer loop, one colour per configuration."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 5))
    hi = 0.0
    for c in report["configs"]:
        m, p = np.asarray(c["measured_s"]) * 1e3, np.asarray(c["predicted_s"]) * 1e3
        hi = max(hi, m.max(), p.max())
        ax.scatter(m, p, s=10, label=f"R {c['requests']}, ctx {c['ctx0'] // 1000}K+, L {c['layers']} "
                                     f"({c['dense']} dense), buffer {c['hot']}, {c['row_bytes']} B")
    ax.plot([0, hi * 1.05], [0, hi * 1.05], "k--", lw=0.8)
    for f in (0.9, 1.1):
        ax.plot([0, hi * 1.05], [0, hi * 1.05 * f], ":", color="grey", lw=0.8)
    ax.set_xlabel("measured step time (ms)")
    ax.set_ylabel("predicted step time (ms)")
    ax.set_title(f"Full DSA layers (GLM-5.1 per-GPU shapes) on {report['gpu']}: median error "
                 f"{report['step_time_median_abs_err']:.1%}, p90 {report['step_time_p90_abs_err']:.1%}", fontsize=8)
    ax.legend(fontsize=6)
    ax.grid(alpha=0.3)
    return finish(fig, path)
