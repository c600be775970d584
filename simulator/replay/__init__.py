"""Replay engine: exact misses per step for eviction policies and buffer sizes.

Names are imported on first use (the compiled engine loads numba).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "ReplayConfig": ".api", "replay_stream": ".api", "replay_trace": ".api", "expand_configs": ".api",
    "POLICIES": ".policies", "miss_ratio_curve": ".mrc",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
