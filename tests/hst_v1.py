"""Write a version-1 .hst file (no header checksums, no ctx_last) from a version-2 one, so the
tests of reading old files do not depend on which bundled traces are still version 1."""

from __future__ import annotations

import zlib
from pathlib import Path

from simulator.trace.format import (
    _CHUNK,
    _CHUNK_V1,
    _ENTRY_V1,
    _FOOT,
    _HEAD,
    _U32,
    END_MAGIC,
    TraceReader,
)


def to_version_1(src: str | Path, dst: str | Path) -> None:
    data = Path(src).read_bytes()
    magic, version, meta_len = _HEAD.unpack_from(data)
    assert version == 2
    out = bytearray(_HEAD.pack(magic, 1, meta_len) + data[_HEAD.size:_HEAD.size + meta_len])
    with TraceReader(src) as reader:
        chunks = sorted((c for key in reader.keys for c, _ in reader.chunks(key)), key=lambda c: c.offset)
    entries = []
    for c in chunks:
        fields = _CHUNK.unpack_from(data, c.offset)
        plen, crc = fields[9], fields[10]
        payload = data[c.offset + _CHUNK.size:c.offset + _CHUNK.size + plen]
        entries.append(_ENTRY_V1.pack(c.request, c.layer, c.first_step, c.steps, c.width, c.ordered, c.accesses,
                                      len(out)))
        out += _CHUNK_V1.pack(b"CHNK", c.request, c.layer, c.first_step, c.steps, c.width, c.ordered, c.accesses,
                              plen, crc) + payload
    index_at = len(out)
    index = b"INDX" + _U32.pack(len(entries)) + b"".join(entries)
    out += index + _FOOT.pack(index_at, zlib.crc32(index), END_MAGIC)
    Path(dst).write_bytes(bytes(out))



