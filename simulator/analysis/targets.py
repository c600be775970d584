"""Published statistics of real top-k traces (targets files) and the same statistics measured on
a trace: what `hisparse trace compare` prints and `hisparse trace fit --targets` fits to.

A targets file (TOML, ``traces/targets/*.toml``) has a ``[shape]`` table (the trace the preset
is drawn as: model, layers, k, ctx0, steps, requests, seed, warmup) and ``[[target]]`` tables:
``name``, ``statistic`` (one of STATISTICS), its parameters (``layers = [first, last]``, both
included, default all; ``buffer_ratio`` for miss ratios), ``value``, ``tolerance``,
``relative`` (tolerance as a share of value; default false) and ``source`` (where the figure
was published). An optional ``[fit]`` table says which knobs ``trace fit --targets`` may move.

Statistics (one stream = one request and layer; steps before ``warmup`` are left out of the
steady-state ones, as a published 1,000-step average all but ignores them):
- ``lru_miss``: misses / accesses of HiSparse's batched LRU (the replay engine's defaults: the
  newest token in its reserved slot, the buffer starting with the prompt's first positions) at
  buffer = ``buffer_ratio`` x k, steps >= warmup, over the layers named.
- ``step_overlap``: mean |S_t & S_t-1| / k over steps >= warmup and the layers named.
- ``layer_overlap``: mean |S_l,t & S_l-1,t| / k for the layers l named (l - 1 also drawn).
- ``first_step_miss``: misses / accesses at step 0 with an empty buffer (SGLang PD decode).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..bundled import data_path
from ..errors import HisparseError
from ..replay import ReplayConfig, replay_stream
from ..trace.stats import layer_overlap, step_overlap
from ..trace.stream import Stream
from . import STEADY_WARMUP_STEPS

STATISTICS = ("lru_miss", "step_overlap", "layer_overlap", "first_step_miss")
TARGETS_DIR = data_path("traces/targets")
SHAPE_KEYS = {"model": str, "layers": int, "topk": int, "ctx0": int, "steps": int, "requests": int,
              "seed": int, "warmup": int, "index_topk_freq": int, "index_skip_topk_offset": int}


@dataclass(frozen=True)
class Target:
    """One published statistic: what is measured, its value and how close is close enough."""

    name: str
    statistic: str
    value: float
    tolerance: float
    relative: bool = False
    source: str = ""
    layers: tuple[int, int] | None = None  # first and last layer, both included
    buffer_ratio: float | None = None

    def error(self, measured: float) -> float:
        """Distance in units of the tolerance (|error| <= 1: met)."""
        scale = self.tolerance * (abs(self.value) if self.relative else 1.0)
        return (measured - self.value) / scale

    def met(self, measured: float) -> bool:
        return bool(np.isfinite(measured)) and abs(self.error(measured)) <= 1.0 + 1e-12

    def describe(self) -> str:
        where = f"layers {self.layers[0]}-{self.layers[1]}" if self.layers else "all layers"
        what = f"{self.statistic} B/k={self.buffer_ratio:g}" if self.buffer_ratio is not None else self.statistic
        tol = f"+-{self.tolerance:.0%} rel." if self.relative else f"+-{self.tolerance:g}"
        return f"{what}, {where}: {self.value:g} {tol}"


@dataclass(frozen=True)
class Shape:
    """The trace a targets file's statistics are drawn and measured on."""

    model: str = ""
    layers: int = 1
    topk: int = 2048
    ctx0: int = 32768
    steps: int = 128
    requests: int = 1
    seed: int = 0
    warmup: int = STEADY_WARMUP_STEPS
    # IndexShare of the measured model (config.json; GLM-5.2: 4 and 3): the fit draws shared layers
    # as copies of their anchor's (``trace.generator`` share_freq / share_offset)
    index_topk_freq: int = 1
    index_skip_topk_offset: int = 0


@dataclass(frozen=True)
class Targets:
    path: Path
    shape: Shape
    targets: tuple[Target, ...]
    fit: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)


def targets_path(spec: str) -> Path:
    """A shipped targets name (``glm51-longbench``) or a path."""
    if (TARGETS_DIR / f"{spec}.toml").exists():
        return TARGETS_DIR / f"{spec}.toml"
    return Path(spec)


def shipped_targets() -> list[str]:
    return sorted(p.stem for p in TARGETS_DIR.glob("*.toml"))


def load_targets(spec: str) -> Targets:
    """Read and check a targets file; errors name the file, target and key."""
    path = targets_path(spec)
    if not path.exists():
        raise HisparseError(f"targets file {spec!r} not found (shipped: {', '.join(shipped_targets())})")
    if path.is_dir():
        raise HisparseError(f"{path}: is a folder; give a targets .toml file")
    from ..inputs import read_toml

    data = read_toml(path, what="targets file")
    raw_shape = _table(path, data, "shape")
    stray = sorted(set(data) - set(TOP_KEYS))
    if stray:  # a misspelt [shap] left the shape at its defaults and failed later, naming a target
        raise HisparseError(f"{path}: unknown key(s) or table(s) {', '.join(stray)} (a targets file holds "
                            f"{', '.join(f'[{k}]' if k != 'target' else '[[target]]' for k in TOP_KEYS)})")
    unknown = sorted(set(raw_shape) - set(SHAPE_KEYS))
    if unknown:
        raise HisparseError(f"{path}: [shape]: unknown key(s) {', '.join(unknown)} (known: {', '.join(SHAPE_KEYS)})")
    shape = Shape(**{k: _shape_value(path, k, v) for k, v in raw_shape.items()})
    raw_targets = data.get("target", [])
    if not isinstance(raw_targets, list) or not all(isinstance(t, dict) for t in raw_targets):
        raise HisparseError(f"{path}: target must be [[target]] tables, got {raw_targets!r}")
    targets = tuple(_target(path, i, t, shape) for i, t in enumerate(raw_targets))
    if not targets:
        raise HisparseError(f"{path}: no [[target]] tables")
    names = [t.name for t in targets]
    twice = next((n for i, n in enumerate(names) if n in names[:i]), None)
    if twice is not None:  # a target given twice weighs twice in the fit and reads as one in the report
        raise HisparseError(f"{path}: target {names.index(twice) + 1} and {names.index(twice, names.index(twice) + 1) + 1} "
                            f"are both named {twice!r} (each name once)")
    return Targets(path, shape, targets, _table(path, data, "fit"))


TOP_KEYS = ("shape", "target", "fit")  # what a targets file holds at its top level


def _table(path: Path, data: dict[str, Any], key: str) -> dict[str, Any]:
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise HisparseError(f"{path}: {key} must be a [{key}] table, got {value!r}")
    return value


# The lowest value of each integer [shape] key (seed and warm-up may be 0).
_SHAPE_LOWEST = {"layers": 1, "topk": 1, "ctx0": 1, "steps": 1, "requests": 1, "seed": 0, "warmup": 0,
                 "index_topk_freq": 1, "index_skip_topk_offset": 0}


def _shape_value(path: Path, key: str, v: Any) -> Any:
    if SHAPE_KEYS[key] is str:
        if not isinstance(v, str):
            raise HisparseError(f"{path}: [shape] {key} must be a string, got {v!r}")
        return v
    lowest = _SHAPE_LOWEST[key]
    if isinstance(v, bool) or not isinstance(v, int) or v < lowest:
        raise HisparseError(f"{path}: [shape] {key} must be an integer >= {lowest}, got {v!r}")
    return v


def _number(where: str, key: str, v: Any, lowest: float | None = None, above: float | None = None) -> float:
    """A finite TOML number (int or float, not a boolean), at least ``lowest`` / above ``above``."""
    ok = not isinstance(v, bool) and isinstance(v, int | float) and bool(np.isfinite(v))
    ok = ok and (lowest is None or v >= lowest) and (above is None or v > above)
    if not ok:
        bound = f" >= {lowest:g}" if lowest is not None else f" > {above:g}" if above is not None else ""
        raise HisparseError(f"{where}: {key} must be a finite number{bound}, got {v!r}")
    return float(v)


def _target(path: Path, i: int, t: dict[str, Any], shape: Shape) -> Target:
    where = f"{path}: target {i + 1} ({t.get('name', '?')})"
    known = {"name", "statistic", "value", "tolerance", "relative", "source", "layers", "buffer_ratio"}
    if set(t) - known:
        raise HisparseError(f"{where}: unknown key(s) {', '.join(sorted(set(t) - known))}")
    for key in ("name", "statistic", "value", "tolerance"):
        if key not in t:
            raise HisparseError(f"{where}: missing key {key!r}")
    for key in ("name", "statistic", "source"):
        if key in t and not isinstance(t[key], str):
            raise HisparseError(f"{where}: {key} must be a string, got {t[key]!r}")
    if t["statistic"] not in STATISTICS:
        raise HisparseError(f"{where}: statistic {t['statistic']!r} unknown (known: {', '.join(STATISTICS)})")
    if not isinstance(t.get("relative", False), bool):
        raise HisparseError(f"{where}: relative must be true or false, got {t['relative']!r}")
    layers = t.get("layers")
    if layers is not None:
        if (not isinstance(layers, list) or len(layers) != 2
                or not all(isinstance(x, int) and not isinstance(x, bool) for x in layers)
                or not 0 <= layers[0] <= layers[1] < shape.layers):
            raise HisparseError(f"{where}: layers must be [first, last] within 0..{shape.layers - 1}, got {layers}")
        layers = (int(layers[0]), int(layers[1]))
    ratio = t.get("buffer_ratio")
    if t["statistic"] == "lru_miss" and ratio is None:
        raise HisparseError(f"{where}: lru_miss needs buffer_ratio >= 1 (buffer = ratio x k)")
    if ratio is not None:
        # at most 2**16 x k: a buffer the engine holds (< 2**31 slots) for any k up to 2**14
        ratio = _number(where, "buffer_ratio", ratio, lowest=1.0)
        if ratio > 2**16:
            raise HisparseError(f"{where}: buffer_ratio must be <= {2**16} (buffer = ratio x k), got {ratio:g}")
    value = _number(where, "value", t["value"])
    tolerance = _number(where, "tolerance", t["tolerance"], above=0.0)
    return Target(t["name"], t["statistic"], value, tolerance, bool(t.get("relative", False)),
                  str(t.get("source", "")), layers, ratio)


class Measure:
    """The statistics of a set of streams (one trace), computed once per stream and layer and
    cached, so that many targets over the same layers cost one replay per buffer."""

    def __init__(self, streams: Iterable[Stream], k: int, warmup: int = 16) -> None:
        self.streams = sorted(streams, key=lambda s: (s.request, s.layer))
        self.k, self.warmup = k, warmup
        self._cache: dict[tuple, tuple[float, float]] = {}
        self.layers = sorted({s.layer for s in self.streams})
        if not self.streams:
            raise HisparseError("no streams to measure")
        by_key = {(s.request, s.layer): s for s in self.streams}
        self._above = {(s.request, s.layer): by_key.get((s.request, s.layer - 1)) for s in self.streams}

    def _layer(self, stat: str, s: Stream, ratio: float | None) -> tuple[float, float]:
        """(sum, count) of one statistic on one stream."""
        key = (stat, s.request, s.layer, ratio)
        if key not in self._cache:
            w = min(self.warmup, max(0, s.steps - 2))
            if stat == "lru_miss":
                m = replay_stream(s, ReplayConfig(policy="lru", buffer=int(round(ratio * self.k))), self.k)
                acc = np.count_nonzero(s.indices[w:] >= 0)
                val = (float(m[w:].sum()), float(acc))
            elif stat == "first_step_miss":
                m = replay_stream(Stream(s.request, s.layer, s.ctx_len[:1], s.indices[:1]),
                                  ReplayConfig(policy="lru", buffer=max(self.k, 1), initial="empty"), self.k)
                val = (float(m[0]), float(np.count_nonzero(s.indices[0] >= 0)))
            elif stat == "step_overlap":
                ov = step_overlap(s, self.k)[max(0, w - 1):]
                val = (float(ov.sum()), float(ov.size))
            else:  # layer_overlap
                up = self._above[s.request, s.layer]
                if up is None:
                    val = (0.0, 0.0)
                else:
                    ov = layer_overlap(up, s, self.k)[w:]
                    val = (float(ov.sum()), float(ov.size))
            self._cache[key] = val
        return self._cache[key]

    def value(self, stat: str, layers: tuple[int, int] | None = None, buffer_ratio: float | None = None) -> float:
        chosen = [s for s in self.streams if layers is None or layers[0] <= s.layer <= layers[1]]
        parts = [self._layer(stat, s, buffer_ratio) for s in chosen]
        total, count = sum(p[0] for p in parts), sum(p[1] for p in parts)
        return total / count if count else float("nan")

    def target(self, t: Target) -> float:
        return self.value(t.statistic, t.layers, t.buffer_ratio)

    def per_layer(self, stat: str, buffer_ratio: float | None = None) -> dict[int, float]:
        return {layer: self.value(stat, (layer, layer), buffer_ratio) for layer in self.layers}


def report(measure: Measure, targets: Sequence[Target]) -> list[dict[str, Any]]:
    """One row per target: what it is, the published value, the measured one, whether it is met."""
    rows = []
    for t in targets:
        if t.layers and not any(t.layers[0] <= layer <= t.layers[1] for layer in measure.layers):
            got = float("nan")
        else:
            got = measure.target(t)
        rows.append({"name": t.name, "statistic": t.statistic, "layers": list(t.layers) if t.layers else None,
                     "buffer_ratio": t.buffer_ratio, "target": t.value, "tolerance": t.tolerance,
                     "relative": t.relative, "measured": got,
                     "error": t.error(got) if np.isfinite(got) else None, "met": t.met(got), "source": t.source})
    return rows
