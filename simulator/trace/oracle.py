"""Export a stream as libCacheSim ``oracleGeneral`` records, for comparisons with its policies.

Each record is 24 bytes, little-endian and packed: u32 clock_time (the step), u64 obj_id (the
token position), u32 obj_size (1), i64 next_access_vtime (the next record that reads the same
position, counted from 1 as libCacheSim's own converter counts it: ``traceConvOracleGeneral.cpp``, "the
reference count of the next access ... (reference count starts with 1)", i.e. its 0-based index + 1;
-1 when there is none). Accesses follow the stream's stored order within a step.
"""

from __future__ import annotations

import os

import numpy as np

from ..fileio import atomic_output
from .stream import Stream

ORACLE_DTYPE = np.dtype([("clock_time", "<u4"), ("obj_id", "<u8"), ("obj_size", "<u4"),
                         ("next_access_vtime", "<i8")])
assert ORACLE_DTYPE.itemsize == 24


def oracle_records(stream: Stream) -> np.ndarray:
    """The stream's accesses as oracleGeneral records, next-access times filled in."""
    valid = stream.indices >= 0
    obj = stream.indices[valid].astype(np.int64)
    clock = np.broadcast_to(np.arange(stream.steps, dtype=np.int64)[:, None], valid.shape)[valid]
    n = obj.size
    order = np.lexsort((np.arange(n), obj))  # by object, then by time
    nxt = np.full(n, -1, dtype=np.int64)
    same = obj[order[1:]] == obj[order[:-1]]
    nxt[order[:-1][same]] = order[1:][same] + 1  # 1-based, libCacheSim's (it wrote 0-based: one early)
    rec = np.empty(n, dtype=ORACLE_DTYPE)
    rec["clock_time"], rec["obj_id"], rec["obj_size"], rec["next_access_vtime"] = clock, obj, 1, nxt
    return rec


def write_oracle_general(stream: Stream, path: str | os.PathLike) -> int:
    """Write the records to exactly ``path`` (atomically); return the record count."""
    rec = oracle_records(stream)
    with atomic_output(path) as fh:
        fh.write(rec.tobytes())
    return int(rec.size)
