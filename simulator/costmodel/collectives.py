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

    def received_time_s(self, collective: Collective | str, n: int, nbytes: float) -> float:
        """Seconds for ``nbytes`` that one GPU receives in a ``collective`` over ``n`` GPUs, at a figure
        quoted on the bytes received, the GPU's own rows included (DeepEP's intranode benchmark:
        ``test_intranode.py`` divides ``recv_x.numel() * 2`` by the time): no (n - 1) / n bus factor."""
        f = self.collectives[Collective(collective)]
        if n <= 1 or nbytes <= 0:
            return 0.0
        return _by_count(f.latency_us, n) * 1e-6 + nbytes / _by_count(f.busbw, n)

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


# -- across nodes: DeepEP's internode dispatch / combine, NIC ring collectives ---------------------
@dataclass(frozen=True)
class DeepEPPoint:
    """One row of DeepEP's published benchmark table: the bytes one rank sends in the benchmark's
    setting and the time (or bandwidth) the README reports for it."""

    ep: int
    dispatch_bw: float  # bytes/s (the README's RDMA / bottleneck bandwidth)
    combine_bw: float
    dispatch_us: float = 0.0  # low-latency table only: the measured latency at the benchmark's batch
    combine_us: float = 0.0


# deepseek-ai/DeepEP, docs/legacy.md (the V1 README's "Performance" section), measured on H800 with one
# CX7 InfiniBand 400 Gb/s NIC per GPU ("~50 GB/s maximum bandwidth"):
# - normal kernels (NVLink + RDMA forwarding; prefill / training: 4096 tokens per batch, hidden 7168,
#   top-4 groups, top-8 experts, FP8 dispatch, BF16 combine), "bottleneck bandwidth" (RDMA):
#   EP16 43 / 43 GB/s, EP32 58 / 57, EP64 51 / 50 (dispatch / combine);
# - low-latency kernels (pure RDMA; decode: 128 tokens per batch, hidden 7168, top-8, FP8 dispatch, BF16
#   combine): dispatch 77 us 98 GB/s (EP8), 118 us 63 (16), 155 us 48 (32), 173 us 43 (64), 192 us 39 (128),
#   194 us 39 (256); combine 114 us 127 GB/s, 195 / 74, 273 / 53, 314 / 46, 369 / 39, 360 / 40.
# The low-latency bandwidth is the rank's bytes over the latency: 128 x 8 x (7168 + 4 x 56) B / 77 us =
# 98 GB/s, 128 x 8 x 7168 x 2 B / 114 us = 129 GB/s; so time = bytes / bandwidth reproduces each row.
DEEPEP_SOURCE = ("deepseek-ai/DeepEP docs/legacy.md (V1 README, Performance): H800 + CX7 InfiniBand 400 Gb/s "
                 "(~50 GB/s) per GPU; normal kernels 4096 tokens/batch, low-latency 128 tokens/batch, hidden "
                 "7168, top-8, FP8 dispatch / BF16 combine")
DEEPEP_REFERENCE_NIC_BW = 50e9  # the benchmark's NIC ("~50 GB/s maximum bandwidth")
DEEPEP_NORMAL = (DeepEPPoint(16, 43e9, 43e9), DeepEPPoint(32, 58e9, 57e9), DeepEPPoint(64, 51e9, 50e9))
DEEPEP_LOW_LATENCY = (DeepEPPoint(8, 98e9, 127e9, 77, 114), DeepEPPoint(16, 63e9, 74e9, 118, 195),
                      DeepEPPoint(32, 48e9, 53e9, 155, 273), DeepEPPoint(64, 43e9, 46e9, 173, 314),
                      DeepEPPoint(128, 39e9, 39e9, 192, 369), DeepEPPoint(256, 39e9, 40e9, 194, 360))


class DeepEPMode(StrEnum):
    NORMAL = "normal"  # prefill passes (SGLang --deepep-mode auto: normal for extend batches)
    LOW_LATENCY = "low_latency"  # decode passes (auto: low_latency for decode batches, CUDA-graph safe)


def _deepep_point(table: tuple[DeepEPPoint, ...], ep: int) -> DeepEPPoint:
    """The row at the nearest EP size not below ``ep`` (the largest when ``ep`` exceeds every row)."""
    for p in table:
        if p.ep >= ep:
            return p
    return table[-1]


def deepep_time_s(op: str, mode: DeepEPMode | str, ep: int, nbytes: float, *, nic_bw: float = DEEPEP_REFERENCE_NIC_BW,
                  floor_s: float = 0.0) -> float:
    """Seconds of one DeepEP ``dispatch`` or ``combine`` across nodes: the bytes one rank sends over the
    README's measured bandwidth for this EP size and kernel, scaled by the NIC's line rate over the
    benchmark's (a derivation: the kernels are NIC-bound), never below ``floor_s`` (the README gives no
    small-batch figure; the caller passes the NIC's round trip)."""
    if ep <= 1 or nbytes <= 0:
        return 0.0
    table = DEEPEP_LOW_LATENCY if DeepEPMode(mode) == DeepEPMode.LOW_LATENCY else DEEPEP_NORMAL
    p = _deepep_point(table, ep)
    bw = {"dispatch": p.dispatch_bw, "combine": p.combine_bw}[op] * (nic_bw / DEEPEP_REFERENCE_NIC_BW)
    return max(nbytes / bw, floor_s)


def expected_remote_nodes(nodes: int, experts_per_token: int) -> float:
    """Nodes other than its own that one token's experts land on, experts spread uniformly over the
    nodes (DeepEP's normal kernels send a token once per destination node, then forward over NVLink):
    (nodes - 1) x (1 - (1 - 1/nodes)^k)."""
    if nodes <= 1:
        return 0.0
    return (nodes - 1) * (1.0 - (1.0 - 1.0 / nodes) ** experts_per_token)


def nic_ring_time_s(collective: Collective | str, nodes: int, nbytes: float, nic_bw: float, latency_us: float) -> float:
    """A collective across ``nodes`` nodes whose inter-node hop is each GPU's NIC (a hierarchical ring:
    NVLink inside the node is faster, the NIC is the bottleneck): nccl-tests' bus factor over the nodes
    times the bytes over the NIC, plus one NIC latency per ring step (2 (n - 1) for all-reduce, n - 1
    otherwise)."""
    if nodes <= 1 or nbytes <= 0:
        return 0.0
    c = Collective(collective)
    steps = 2 * (nodes - 1) if c == Collective.ALL_REDUCE else nodes - 1
    return steps * latency_us * 1e-6 + bus_factor(c, nodes) * nbytes / nic_bw
