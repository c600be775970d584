"""GPU-to-GPU collectives: time = latency + factor(collective, n) x bytes / busbw.

The figures follow nccl-tests' conventions (``doc/PERFORMANCE.md`` of NVIDIA/nccl-tests): ``bytes``
is the collective's total message size as nccl-tests counts it (all_reduce: the buffer each rank
reduces; all_gather: the whole gathered output; reduce_scatter: the whole input; all_to_all: the
whole send buffer of one rank), ``algbw = bytes / time`` and ``busbw = algbw x factor`` with

    all_reduce      2 (n - 1) / n
    all_gather      (n - 1) / n
    reduce_scatter  (n - 1) / n
    all_to_all      (n - 1) / n

so ``time = bytes x factor / busbw``: a measured busbw carries over between GPU counts and sizes
as long as the link stays the bottleneck. ``latency_us`` is the small-message floor.

A GPU preset's ``[interconnect]`` table holds one inline table per collective::

    all_reduce = { latency_us = 8.0, busbw = 3.6e11, source = "..." }
    all_gather = { latency_us = { 2 = 6.0, 8 = 9.0 }, busbw = { 2 = 1.5e11, 8 = 3.4e11 }, source = "..." }

``latency_us`` and ``busbw`` (bytes/s) are each a scalar or a table by GPU count; a table is read at
the nearest count not below ``n`` (the largest count when ``n`` exceeds every entry). A calibration
JSON's top-level ``"comm"`` object in the same shape replaces the preset's figures collective by
collective (``with_overrides``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from ..errors import HisparseError


class Collective(StrEnum):
    ALL_REDUCE = "all_reduce"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_TO_ALL = "all_to_all"


def bus_factor(collective: Collective, n: int) -> float:
    """nccl-tests' bus-bandwidth factor for ``n`` ranks."""
    if n <= 1:
        return 0.0
    return 2.0 * (n - 1) / n if collective == Collective.ALL_REDUCE else (n - 1) / n


def _by_count(value: float | Mapping[int, float], n: int) -> float:
    """A scalar, or a per-GPU-count table read at the nearest count not below n (else the largest)."""
    if not isinstance(value, Mapping):
        return float(value)
    counts = sorted(value)
    for c in counts:
        if c >= n:
            return float(value[c])
    return float(value[counts[-1]])


@dataclass(frozen=True)
class CollectiveFigures:
    latency_us: float | Mapping[int, float]
    busbw: float | Mapping[int, float]  # bytes/s, nccl-tests busbw convention
    source: str

    def time_s(self, collective: Collective, n: int, nbytes: float) -> float:
        if n <= 1 or nbytes <= 0:
            return 0.0
        return _by_count(self.latency_us, n) * 1e-6 + bus_factor(collective, n) * nbytes / _by_count(self.busbw, n)


@dataclass(frozen=True)
class Interconnect:
    """The GPU-to-GPU fabric of a GPU preset: one figure set per collective, each with its source."""

    name: str
    source: str
    collectives: Mapping[Collective, CollectiveFigures] = field(default_factory=dict)

    def time_s(self, collective: Collective | str, n: int, nbytes: float) -> float:
        """Seconds for one ``collective`` over ``n`` GPUs of a ``nbytes`` message (nccl-tests size)."""
        return self.collectives[Collective(collective)].time_s(Collective(collective), n, nbytes)

    def with_overrides(self, comm: Mapping[str, Any], where: str) -> Interconnect:
        """The same fabric with a calibration's measured figures in place of the preset's."""
        merged = dict(self.collectives)
        measured = []
        for name, raw in comm.items():
            if name in COMM_META:
                continue
            c = _collective(name, f"{where}: comm")
            merged[c] = parse_figures(raw, f"{where}: comm.{name}", default_source=comm.get("source") or where,
                                      extra=FIT_KEYS)
            measured.append(name)
        source = f"{self.source}; measured figures from {where} for {', '.join(sorted(measured))}"
        return Interconnect(self.name, source, merged)


def _collective(name: str, where: str) -> Collective:
    try:
        return Collective(name)
    except ValueError:
        raise HisparseError(f"{where}: unknown collective {name!r} (known: {', '.join(c.value for c in Collective)})") from None


def _positive_table(value: Any, where: str, key: str) -> float | dict[int, float]:
    def positive(v: Any, label: str) -> float:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0 or v != v or v == float("inf"):
            raise HisparseError(f"{where}.{label} = {v!r} must be a positive number")
        return float(v)

    if isinstance(value, Mapping):
        if not value:
            raise HisparseError(f"{where}.{key}: empty table (give a number or {{ 8 = ... }})")
        out: dict[int, float] = {}
        for count, v in value.items():
            try:
                c = int(count)
            except (TypeError, ValueError):
                raise HisparseError(f"{where}.{key}: key {count!r} is not a GPU count") from None
            if c < 2:
                raise HisparseError(f"{where}.{key}: GPU count {c} must be >= 2")
            out[c] = positive(v, f"{key}.{count}")
        return out
    return positive(value, key)


# keys of a calibration's "comm" object that are not collectives, and per-collective fit statistics
# (simulator/calibration/comm.py writes them beside the figures)
COMM_META = ("name", "source", "command")
FIT_KEYS = ("r2", "points", "max_rel_err")


def parse_figures(raw: Any, where: str, *, default_source: str | None = None,
                  extra: tuple[str, ...] = ()) -> CollectiveFigures:
    """One collective's table: ``{ latency_us, busbw, source }`` (a calibration's measured figures
    take the ``comm`` object's source and may carry its fit statistics, ``extra``)."""
    if not isinstance(raw, Mapping):
        raise HisparseError(f"{where}: expected a table {{ latency_us = ..., busbw = ..., source = \"...\" }}")
    unknown = sorted(set(raw) - {"latency_us", "busbw", "source", *extra})
    if unknown:
        raise HisparseError(f"{where}: unknown key(s) {', '.join(unknown)} (known: latency_us, busbw, source)")
    if default_source and "source" not in raw:
        raw = {**raw, "source": default_source}
    missing = [k for k in ("latency_us", "busbw", "source") if k not in raw]
    if missing:
        raise HisparseError(f"{where}: missing key(s) {', '.join(missing)} (every figure carries its source)")
    if not isinstance(raw["source"], str) or not raw["source"].strip():
        raise HisparseError(f"{where}.source: must name where the figures come from")
    return CollectiveFigures(_positive_table(raw["latency_us"], where, "latency_us"),
                             _positive_table(raw["busbw"], where, "busbw"), raw["source"])


def parse_interconnect(raw: Any, where: str) -> Interconnect:
    """A GPU preset's ``[interconnect]`` table; every collective the model uses must be there."""
    if not isinstance(raw, Mapping):
        raise HisparseError(f"{where}: [interconnect] must be a table")
    for key in ("name", "source"):
        if not isinstance(raw.get(key), str) or not raw[key].strip():
            raise HisparseError(f"{where}: interconnect.{key} missing (a string)")
    collectives = {}
    for name, value in raw.items():
        if name in ("name", "source"):
            continue
        collectives[_collective(name, f"{where}: interconnect")] = parse_figures(value, f"{where}: interconnect.{name}")
    missing = [c.value for c in Collective if c not in collectives]
    if missing:
        raise HisparseError(f"{where}: interconnect lacks {', '.join(missing)}")
    return Interconnect(raw["name"], raw["source"], collectives)
