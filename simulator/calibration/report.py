"""Figures of the calibration report, rebuilt from the committed JSON/CSV files (no GPU)."""

from __future__ import annotations

import os

import numpy as np

from ..plotting import finish, pyplot


def _plot_predicted_vs_measured(report: dict, label, title: str, path, legend_size: int):
    """Predicted against measured step time, one colour per configuration, with the 1:1 and
    +-10% lines; ``label(config)`` names a configuration."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 5))
    hi = 0.0
    for c in report["configs"]:
        m, p = np.asarray(c["measured_s"]) * 1e3, np.asarray(c["predicted_s"]) * 1e3
        hi = max(hi, m.max(), p.max())
        ax.scatter(m, p, s=10, label=label(c))
    ax.plot([0, hi * 1.05], [0, hi * 1.05], "k--", lw=0.8)
    for f in (0.9, 1.1):
        ax.plot([0, hi * 1.05], [0, hi * 1.05 * f], ":", color="grey", lw=0.8)
    ax.set_xlabel("measured step time (ms)")
    ax.set_ylabel("predicted step time (ms)")
    ax.set_title(f"{title}: median error {report['step_time_median_abs_err']:.1%}, "
                 f"p90 {report['step_time_p90_abs_err']:.1%}", fontsize=9 if legend_size > 6 else 8)
    ax.legend(fontsize=legend_size)
    ax.grid(alpha=0.3)
    return finish(fig, path)


def plot_validation(report: dict, path: str | os.PathLike | None = None):
    """Predicted against measured decode-step time of the swap-in + attention loop."""
    return _plot_predicted_vs_measured(
        report, lambda c: f"R {c['requests']}, L {c['layers']}, buffer {c['hot']}, H {c['heads']}, {c['row_bytes']} B",
        f"Validation on {report['gpu']}", path, legend_size=7)


def plot_layer_validation(report: dict, path: str | os.PathLike | None = None):
    """Predicted against measured step time of the full-layer loop."""
    return _plot_predicted_vs_measured(
        report, lambda c: (f"R {c['requests']}, ctx {c['ctx0'] // 1000}K+, L {c['layers']} ({c['dense']} dense), "
                           f"buffer {c['hot']}, {c['row_bytes']} B"),
        f"Full DSA layers (GLM-5.1 per-GPU shapes) on {report['gpu']}", path, legend_size=6)


def plot_comm(measured, fits, path: str | os.PathLike | None = None):
    """Measured collective time against bytes (log-log, p10-p90 bars where the CSV has them), with
    the fitted latency + bytes / bandwidth line, one panel per collective, one colour per GPU count."""
    from .comm import busbw_factor

    plt = pyplot()
    colls = list(dict.fromkeys(fits["collective"]))
    fig, axes = plt.subplots(1, len(colls), figsize=(4 * len(colls), 3.6), squeeze=False)
    for ax, coll in zip(axes[0], colls, strict=True):
        for k, (_, f) in enumerate(fits[fits.collective == coll].iterrows()):
            g = measured[(measured.collective == coll) & (measured.n_gpus == f.n_gpus)].sort_values("bytes")
            colour = f"C{k}"
            if {"time_us_p10", "time_us_p90"} <= set(g.columns):
                ax.errorbar(g["bytes"], g["time_us"], yerr=[g["time_us"] - g["time_us_p10"],
                            g["time_us_p90"] - g["time_us"]], fmt=".", ms=4, lw=0.6, color=colour)
            else:
                ax.plot(g["bytes"], g["time_us"], ".", ms=4, color=colour)
            x = np.geomspace(g["bytes"].min(), g["bytes"].max(), 50)
            ax.plot(x, f.latency_us + busbw_factor(coll, f.n_gpus) * x / f.busbw * 1e6, "-", lw=0.9, color=colour,
                    label=f"{f.n_gpus} GPUs: {f.latency_us:.1f} us + {f.busbw / 1e9:.0f} GB/s")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("bytes (nccl-tests size)")
        ax.set_title(coll, fontsize=9)
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3, which="both")
    axes[0][0].set_ylabel("time per collective (us)")
    return finish(fig, path)
