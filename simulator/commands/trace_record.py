"""``hisparse trace record | fit``: traces from real models, and generator knobs fitted to them."""

from __future__ import annotations

import argparse


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Add the record and fit sub-commands to ``hisparse trace``."""
