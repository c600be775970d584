"""``trace info``: the shape of a trace and the structure measures real traces are judged by."""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit

from .sources import TraceSource
from .stream import Stream

SINK_TOKENS = 16
LOCAL_TOKENS = 128


@njit(cache=True)
def _row_intersections(a, b):  # pragma: no cover - compiled
    """|a[t] & b[t]| for rows sorted ascending with padding (>= 2**31 - 1) at the end."""
    steps = a.shape[0]
    out = np.zeros(steps, dtype=np.int64)
    for t in range(steps):
        i = 0
        j = 0
        n = 0
        while i < a.shape[1] and j < b.shape[1] and a[t, i] >= 0 and b[t, j] >= 0:
            x = a[t, i]
            y = b[t, j]
            if x == 2147483647 or y == 2147483647:
                break
            if x < y:
                i += 1
            elif y < x:
                j += 1
            else:
                n += 1
                i += 1
                j += 1
        out[t] = n
    return out


def sorted_rows(stream: Stream) -> np.ndarray:
    """Rows ascending with padding moved to the end as INT32_MAX (for merge-style set ops)."""
    keyed = np.where(stream.indices >= 0, stream.indices, np.iinfo(np.int32).max)
    return np.sort(keyed, axis=1)


def step_overlap(stream: Stream, k: int) -> np.ndarray:
    """|S_t & S_t-1| / k for t = 1..steps-1."""
    rows = sorted_rows(stream)
    if len(rows) < 2:
        return np.zeros(0)
    return _row_intersections(rows[1:], rows[:-1]) / k


def layer_overlap(upper: Stream, lower: Stream, k: int) -> np.ndarray:
    """|S_l,t & S_l-1,t| / k over the steps both streams have."""
    n = min(upper.steps, lower.steps)
    return _row_intersections(sorted_rows(upper)[:n], sorted_rows(lower)[:n]) / k


def region_shares(stream: Stream, sink: int = SINK_TOKENS, local: int = LOCAL_TOKENS) -> tuple[int, int]:
    """Accesses to the first ``sink`` positions and to the last ``local`` positions of context."""
    valid = stream.indices >= 0
    sinks = int(np.count_nonzero(valid & (stream.indices < sink)))
    recent = int(np.count_nonzero(valid & (stream.indices >= (stream.ctx_len - local)[:, None])))
    return sinks, recent


def reuse_gaps(streams: list[Stream], sink: int = SINK_TOKENS, local: int = LOCAL_TOKENS) -> tuple[np.ndarray, int]:
    """Arrivals between the sink and local regions (positions selected now, not at the previous
    step): the gaps in steps since each was last selected in its stream, and how many were
    never selected before."""
    gaps: list[np.ndarray] = []
    first = 0
    for s in streams:
        last = np.full(int(s.ctx_len.max()) + 1, -1, dtype=np.int64)
        for t in range(s.steps):
            row = s.step(t)
            row = row[row >= 0]
            if t:
                free = row[(row >= sink) & (row < int(s.ctx_len[t]) - local)]
                seen = last[free[last[free] != t - 1]]
                first += int(np.count_nonzero(seen < 0))
                gaps.append(t - seen[seen >= 0])
            last[row] = t
    return (np.concatenate(gaps) if gaps else np.zeros(0, dtype=np.int64)), first


def first_depth(streams: list[Stream], sink: int = SINK_TOKENS, local: int = LOCAL_TOKENS) -> float:
    """Mean distance from the newest token, in units of context, of the positions selected for
    the first time (between the sink and local regions, after step 0)."""
    depth: list[np.ndarray] = []
    for s in streams:
        seen = np.zeros(int(s.ctx_len.max()) + 1, dtype=bool)
        for t in range(s.steps):
            row = s.step(t)
            row = row[row >= 0]
            if t:
                ctx = int(s.ctx_len[t])
                free = row[(row >= sink) & (row < ctx - local)]
                new = free[~seen[free]]
                depth.append((ctx - new) / ctx)
            seen[row] = True
    d = np.concatenate(depth) if depth else np.zeros(0)
    return float(d.mean()) if d.size else 0.5


def trace_info(trace: TraceSource, *, sink: int = SINK_TOKENS, local: int = LOCAL_TOKENS) -> dict[str, Any]:
    """Summary of a trace, one stream in memory at a time (two for the layer overlap)."""
    k = trace.meta.k
    steps = accesses = sinks = recent = 0
    ctx_min, ctx_max = None, None
    overlaps: list[np.ndarray] = []
    layer_ov: list[np.ndarray] = []
    prev: Stream | None = None
    for s in trace:
        steps += s.steps
        accesses += s.accesses
        if s.steps:
            lo, hi = int(s.ctx_len.min()), int(s.ctx_len.max())
            ctx_min = lo if ctx_min is None else min(ctx_min, lo)
            ctx_max = hi if ctx_max is None else max(ctx_max, hi)
        overlaps.append(step_overlap(s, k))
        a, b = region_shares(s, sink, local)
        sinks, recent = sinks + a, recent + b
        if prev is not None and prev.request == s.request and prev.layer == s.layer - 1:
            layer_ov.append(layer_overlap(prev, s, k))
        prev = s
    ov = np.concatenate(overlaps) if overlaps else np.zeros(0)
    lov = np.concatenate(layer_ov) if layer_ov else np.zeros(0)
    return {
        "path": str(trace.path),
        "streams": len(trace),
        "requests": len({key.request for key in trace.keys}),
        "layers": len({key.layer for key in trace.keys}),
        "steps": steps,
        "accesses": accesses,
        "topk": k,
        "ctx_min": ctx_min,
        "ctx_max": ctx_max,
        "overlap_mean": float(ov.mean()) if ov.size else None,
        "overlap_p10": float(np.percentile(ov, 10)) if ov.size else None,
        "sink_share": sinks / accesses if accesses else None,
        "local_share": recent / accesses if accesses else None,
        "layer_overlap_mean": float(lov.mean()) if lov.size else None,
        "bytes_per_access": trace.file_bytes / accesses if accesses else None,
        "file_bytes": trace.file_bytes,
        "source": trace.meta.source,
        "format_version": trace.meta.format_version,
        "sink_tokens": sink,
        "local_tokens": local,
    }
