"""The trace ``hisparse plan`` replays when none is given, named in one place (light: the CLI's
help reads it without loading numpy)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DefaultTrace:
    """A generator preset with fixed arguments, and the bundled file (repository-relative) that
    holds exactly that output (used when present, regenerated when not)."""

    generator_preset: str
    file: str
    steps: int
    layers: int
    requests: int
    k: int
    ctx0: int
    seed: int


DEFAULT_TRACE = DefaultTrace(generator_preset="dsa-like", file="traces/synthetic-dsa-like.hst",
                             steps=512, layers=4, requests=2, k=2048, ctx0=32768, seed=0)
