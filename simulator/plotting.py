"""Matplotlib set-up shared by the figures: no display needed, atomic PNG files."""

from __future__ import annotations

import os


def pyplot():
    """matplotlib.pyplot, on the Agg backend unless a notebook chose inline plotting."""
    import matplotlib

    if "inline" not in matplotlib.get_backend():
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def finish(fig, path: str | os.PathLike | None):
    """Write the figure to ``path`` (atomically) and close it; with no path, return it (notebooks)."""
    if path is None:
        return fig
    from .fileio import atomic_output

    with atomic_output(path) as fh:
        fig.savefig(fh, format="png", dpi=120, bbox_inches="tight")
    pyplot().close(fig)
    return None
