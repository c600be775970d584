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


# The grounded GLM-5.1 trace: the glm51-longbench preset (fitted to the HiSparse paper's LRU misses on
# LongBenchV2: 0.300 / 0.134 / 0.067 at B = k / 2k / 4k, all 78 layers; traces/README.md), 1 request x
# 78 layers x 128 steps at a 100,384-token context, as bundled in traces/glm51-longbench.hst.
DEFAULT_TRACE = DefaultTrace(generator_preset="glm51-longbench", file="traces/glm51-longbench.hst",
                             steps=128, layers=78, requests=1, k=2048, ctx0=100384, seed=0)
