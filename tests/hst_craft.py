"""Craft .hst files (version 3 unless told; version 2 has the same fields) field by field with every
checksum valid: what a hostile writer can make, so that the reader's range and agreement checks
(not its checksums) are what is tested."""

from __future__ import annotations

import zlib
from dataclasses import dataclass, replace
from pathlib import Path

from simulator.trace.format import _CHUNK_HEAD, _ENTRY, _FOOT, _HEAD, _U32, END_MAGIC, MAGIC


@dataclass(frozen=True)
class Chunk:
    request: int = 0
    layer: int = 0
    first_step: int = 0
    steps: int = 1
    width: int = 1
    ordered: int = 0
    accesses: int = 1
    ctx_last: int = 1
    payload: bytes = b""

    def but(self, **kw) -> Chunk:
        return replace(self, **kw)


def craft(path: str | Path, meta: bytes, chunks: list[Chunk], version: int = 3) -> Path:
    """Write ``meta`` (raw JSON bytes) and ``chunks`` as a .hst file whose checksums all hold."""
    head = _HEAD.pack(MAGIC, version, len(meta)) + meta
    out = bytearray(head + _U32.pack(zlib.crc32(head[8:])))
    entries = []
    for c in chunks:
        offset = len(out)
        h = _CHUNK_HEAD.pack(b"CHNK", c.request, c.layer, c.first_step, c.steps, c.width, c.ordered, c.accesses,
                             c.ctx_last, len(c.payload), zlib.crc32(c.payload))
        out += h + _U32.pack(zlib.crc32(h)) + c.payload
        entries.append(_ENTRY.pack(c.request, c.layer, c.first_step, c.steps, c.width, c.ordered, c.accesses,
                                   offset, c.ctx_last))
    index_at = len(out)
    index = b"INDX" + _U32.pack(len(entries)) + b"".join(entries)
    out += index + _FOOT.pack(index_at, zlib.crc32(index), END_MAGIC)
    Path(path).write_bytes(bytes(out))
    return Path(path)


def coded_chunk(rows: list[list[int]], ctx: list[int], *, coding: int = 3, **kw) -> Chunk:
    """A chunk of real coded steps (rows sorted, no padding beyond width), in ``coding``
    (``codec.CODING_OF_VERSION``: 3 for the version-3 files ``craft`` writes by default)."""
    import numpy as np

    from simulator.trace.codec import encode_stream

    width = max(1, max(len(r) for r in rows))
    arr = np.full((len(rows), width), -1, dtype=np.int64)
    for i, r in enumerate(rows):
        arr[i, :len(r)] = sorted(r)
    payload, _ = encode_stream(arr, np.asarray(ctx, dtype=np.int64), keep_order=False, coding=coding)
    fields = dict(steps=len(rows), width=width, accesses=int((arr >= 0).sum()), ctx_last=int(ctx[-1]), payload=payload)
    fields.update(kw)
    return Chunk(**fields)
