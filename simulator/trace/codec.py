"""Compact coding of one stream's steps, and the checks every stream passes.

Each step is coded against the previous one (ctx_len delta, the ranks of the previous step's
entries that left, the gaps between the positions that arrived), the symbols are written as
LEB128 varints and the bytes compressed with zlib. On traces whose adjacent steps overlap by 90%,
that is well under one byte per access. Ordered streams (rows not sorted) also store each entry's
rank within its sorted row, so the stored order round-trips exactly.

The loops are compiled with numba: decoding must keep up with the replay engine.
"""

from __future__ import annotations

import zlib

import numpy as np
from numba import njit

from ..errors import TraceError

# Problems _check_rows can find, by code.
_PROBLEMS = {
    1: "negative index {value} (only -1 may pad a step)",
    2: "index {value} out of range for ctx_len {extra}",
    3: "index {value} selected twice in one step",
    4: "{value} entries in one step, more than k = {extra}",
    5: "ctx_len goes down, to {value} from {extra}",
    6: "ctx_len {value} is not positive",
    7: "padding -1 before a real entry",
}


@njit(cache=True)
def _check_rows(indices, ctx_len, k):  # pragma: no cover - compiled
    """First problem in a stream as (code, step, value, extra), or code 0."""
    steps, width = indices.shape
    cmax = 1
    for t in range(steps):
        if ctx_len[t] > cmax:
            cmax = ctx_len[t]
    seen = np.zeros(cmax, dtype=np.int64)
    for t in range(steps):
        c = ctx_len[t]
        if c < 1:
            return 6, t, c, 0
        if t > 0 and c < ctx_len[t - 1]:
            return 5, t, c, ctx_len[t - 1]
        n = 0
        padded = False
        for j in range(width):
            v = indices[t, j]
            if v == -1:
                padded = True
                continue
            if v < 0:
                return 1, t, v, 0
            if padded:
                return 7, t, v, 0
            if v >= c:
                return 2, t, v, c
            if seen[v] == t + 1:
                return 3, t, v, 0
            seen[v] = t + 1
            n += 1
        if n > k:
            return 4, t, n, k
    return 0, 0, 0, 0


def check_stream(indices: np.ndarray, ctx_len: np.ndarray, k: int) -> None:
    """Raise TraceError (with the step) if the stream breaks a rule of the trace model."""
    if indices.ndim != 2:
        raise TraceError(f"indices must be 2-D [steps, k], got shape {indices.shape}")
    if ctx_len.shape != (indices.shape[0],):
        raise TraceError(f"ctx_len has shape {ctx_len.shape}, expected ({indices.shape[0]},)")
    code, step, value, extra = _check_rows(indices, ctx_len, k)
    if code:
        raise TraceError(_PROBLEMS[code].format(value=value, extra=extra), step=int(step))


@njit(cache=True)
def _put(buf, pos, value, write):  # pragma: no cover - compiled
    """Append a LEB128 varint; return the new position (only counts when not writing)."""
    v = value
    while True:
        byte = v & 0x7F
        v >>= 7
        if v:
            if write:
                buf[pos] = byte | 0x80
            pos += 1
        else:
            if write:
                buf[pos] = byte
            return pos + 1


@njit(cache=True)
def _encode(sorted_rows, ranks, counts, ctx_len, ordered, buf, write):  # pragma: no cover
    """Code a stream of sorted rows; return bytes used. Run once to size buf, once to fill it."""
    steps = sorted_rows.shape[0]
    pos = 0
    prev_n = 0
    prev = np.empty(sorted_rows.shape[1], dtype=np.int64)
    prev_ctx = 0
    for t in range(steps):
        n = counts[t]
        d = ctx_len[t] - prev_ctx
        pos = _put(buf, pos, (d << 1) ^ (d >> 63), write)
        prev_ctx = ctx_len[t]
        # Merge-walk prev and cur (both ascending): count leavers and arrivals.
        i = 0
        j = 0
        n_rem = 0
        n_add = 0
        while i < prev_n or j < n:
            if j >= n or (i < prev_n and prev[i] < sorted_rows[t, j]):
                n_rem += 1
                i += 1
            elif i >= prev_n or sorted_rows[t, j] < prev[i]:
                n_add += 1
                j += 1
            else:
                i += 1
                j += 1
        pos = _put(buf, pos, n_rem, write)
        pos = _put(buf, pos, n_add, write)
        # Leavers as gaps between their ranks in prev.
        i = 0
        j = 0
        last = -1
        while i < prev_n:
            if j >= n or prev[i] < sorted_rows[t, j]:
                pos = _put(buf, pos, i - last - 1, write)
                last = i
                i += 1
            elif sorted_rows[t, j] < prev[i]:
                j += 1
            else:
                i += 1
                j += 1
        # Arrivals as gaps between their positions.
        i = 0
        last = -1
        for j in range(n):
            v = sorted_rows[t, j]
            while i < prev_n and prev[i] < v:
                i += 1
            if i < prev_n and prev[i] == v:
                continue
            pos = _put(buf, pos, v - last - 1, write)
            last = v
        if ordered:
            for j in range(n):
                pos = _put(buf, pos, ranks[t, j], write)
        for j in range(n):
            prev[j] = sorted_rows[t, j]
        prev_n = n
    return pos


@njit(cache=True)
def _get(buf, pos):  # pragma: no cover - compiled
    """Read a LEB128 varint at pos: (value, new pos), pos -1 when the bytes run out."""
    value = 0
    shift = 0
    n = buf.shape[0]
    while True:
        if pos >= n or shift > 56:
            return 0, -1
        byte = buf[pos]
        pos += 1
        value |= np.int64(byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


@njit(cache=True)
def _decode(buf, steps, width, ordered, out, ctx_out):  # pragma: no cover - compiled
    """Fill out [steps, width] and ctx_out; return (0, 0) or (error code, step)."""
    pos = 0
    prev = np.empty(width, dtype=np.int64)
    cur = np.empty(width, dtype=np.int64)
    rem = np.empty(width, dtype=np.int64)
    add = np.empty(width, dtype=np.int64)
    prev_n = 0
    prev_ctx = 0
    for t in range(steps):
        z, pos = _get(buf, pos)
        if pos < 0:
            return 1, t
        prev_ctx += (z >> 1) ^ -(z & 1)
        ctx_out[t] = prev_ctx
        n_rem, pos = _get(buf, pos)
        if pos < 0:
            return 1, t
        n_add, pos = _get(buf, pos)
        if pos < 0:
            return 1, t
        if n_rem > prev_n or n_add > width:
            return 2, t
        last = -1
        for r in range(n_rem):
            g, pos = _get(buf, pos)
            if pos < 0:
                return 1, t
            last += g + 1
            if last >= prev_n:
                return 2, t
            rem[r] = last
        last = -1
        for a in range(n_add):
            g, pos = _get(buf, pos)
            if pos < 0:
                return 1, t
            last += g + 1
            add[a] = last
        n = prev_n - n_rem + n_add
        if n > width:
            return 2, t
        # cur = merge(prev without the leavers, arrivals), ascending, no duplicates.
        i = 0
        r = 0
        a = 0
        m = 0
        while i < prev_n or a < n_add:
            if i < prev_n and r < n_rem and rem[r] == i:
                r += 1
                i += 1
                continue
            if a >= n_add or (i < prev_n and prev[i] < add[a]):
                v = prev[i]
                i += 1
            elif i >= prev_n or add[a] < prev[i]:
                v = add[a]
                a += 1
            else:
                return 2, t
            cur[m] = v
            m += 1
        if ordered:
            for j in range(n):
                rk, pos = _get(buf, pos)
                if pos < 0:
                    return 1, t
                if rk >= n:
                    return 2, t
                out[t, j] = cur[rk]
        else:
            for j in range(n):
                out[t, j] = cur[j]
        for j in range(n, out.shape[1]):
            out[t, j] = -1
        for j in range(n):
            prev[j] = cur[j]
        prev_n = n
    if pos != buf.shape[0]:
        return 3, steps
    return 0, 0


def encode_stream(indices: np.ndarray, ctx_len: np.ndarray, *, keep_order: bool) -> tuple[bytes, bool]:
    """Compress a checked stream. Returns (payload, ordered): ordered is False when every row
    is already ascending or when keep_order is False (rows are then stored sorted)."""
    counts = (indices >= 0).sum(axis=1).astype(np.int64)
    keyed = np.where(indices >= 0, indices, np.iinfo(np.int32).max).astype(np.int64)
    order = np.argsort(keyed, axis=1, kind="stable")
    sorted_rows = np.take_along_axis(keyed, order, axis=1)
    ordered = bool(keep_order and (order != np.arange(indices.shape[1])).any())
    ranks = np.argsort(order, axis=1).astype(np.int64) if ordered else np.zeros((1, 1), np.int64)
    ctx = ctx_len.astype(np.int64)
    empty = np.zeros(0, dtype=np.uint8)
    size = _encode(sorted_rows, ranks, counts, ctx, ordered, empty, False)
    buf = np.empty(size, dtype=np.uint8)
    _encode(sorted_rows, ranks, counts, ctx, ordered, buf, True)
    return zlib.compress(buf.tobytes(), 6), ordered


_DECODE_PROBLEMS = {1: "coded data ends early", 2: "coded data is inconsistent", 3: "coded data has trailing bytes"}


def decode_stream(payload: bytes, steps: int, width: int, ordered: bool,
                  out: np.ndarray | None = None, ctx_out: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of encode_stream: (indices int32 [steps, width], ctx_len int64 [steps]).

    ``out``/``ctx_out`` may be slices of a larger array (rows of a multi-chunk stream), decoded
    in place so that a long stream is never copied."""
    try:
        raw = np.frombuffer(zlib.decompress(payload), dtype=np.uint8)
    except zlib.error as exc:
        raise TraceError(f"corrupt stream data ({exc})") from None
    out = np.empty((steps, width), dtype=np.int32) if out is None else out
    ctx = np.empty(steps, dtype=np.int64) if ctx_out is None else ctx_out
    code, step = _decode(raw, steps, width, ordered, out, ctx)
    if code:
        raise TraceError(f"corrupt stream data: {_DECODE_PROBLEMS[code]}", step=int(step) if code != 3 else None)
    return out, ctx
