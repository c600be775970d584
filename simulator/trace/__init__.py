"""Top-k traces: the model, the ``.hst`` format, validation, generation and statistics.

Names are imported on first use, so that the CLI starts without loading numba.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "FORMAT_VERSION": ".stream", "Stream": ".stream", "StreamKey": ".stream", "TraceMeta": ".stream",
    "TraceReader": ".format", "TraceWriter": ".format", "write_trace": ".format",
    "NpyTrace": ".sources", "TraceSource": ".sources", "CodedSource": ".sources", "open_trace": ".sources",
    "CodedChunk": ".format",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
