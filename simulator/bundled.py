"""Data files the package reads from the checkout's ``traces/`` folder (the default trace, the
default scenario's generated trace, which would take ~40 s to draw on a wheel's first plan, the
generator's fitted presets, the published targets).

A checkout reads them where they are. A built wheel carries copies under ``simulator/_bundled/``
(``setup.py`` copies them at build time), so an installed package run from any folder finds the
same files: the top-level ``traces/`` layout stays the repository's, and the wheel still works.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
BUNDLED = PACKAGE / "_bundled"
CHECKOUT = PACKAGE.parent

# what the wheel carries, relative to the checkout (setup.py reads this list)
FILES = ("traces/glm51-longbench.hst", "traces/generated/*.hst", "traces/presets/*.toml", "traces/targets/*.toml")


def data_path(relative: str) -> Path:
    """The file or folder ``relative`` to the checkout (``traces/presets``): the wheel's copy when
    the package carries one, else the checkout's."""
    inside = BUNDLED / relative
    return inside if inside.exists() else CHECKOUT / relative
