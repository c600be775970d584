"""Replay engine: exact misses per step for eviction policies and buffer sizes.

``replay(source, configs)`` is the entry point; ``ReplayConfig`` says what one replay is.
Names are imported on first use (the compiled engine loads numba).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "replay": ".api", "ReplayResult": ".api", "replay_stream": ".api",
    "ReplayConfig": ".config", "Semantics": ".config", "Initial": ".config", "expand_configs": ".config",
    "POLICIES": ".policies", "Policy": ".policies", "miss_ratio_curve": ".mrc",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
