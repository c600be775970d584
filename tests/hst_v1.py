"""Write a version-1 .hst file (no header checksums, no ctx_last) from a version-2 or 3 one, so the
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


def to_version_2(src: str | Path, dst: str | Path) -> None:
    """The same streams, chunk for chunk, in format version 2 (coding 2)."""
    from simulator.trace import Stream, TraceWriter

    with TraceReader(src) as reader:
        chunks = [(key, c) for key in reader.keys for c, _ in reader.chunks(key)]
        with TraceWriter(dst, k=reader.meta.k, source=reader.meta.source, extra=reader.meta.extra, keep_order=True,
                         chunk_steps=max(c.steps for _, c in chunks), version=2) as w:
            for key in reader.keys:
                s = reader.read(key)
                row = 0
                for c in (c for k, c in chunks if k == key):
                    w.write_stream(Stream(key.request, key.layer, s.ctx_len[row:row + c.steps],
                                          s.indices[row:row + c.steps], c.first_step))
                    row += c.steps


def to_version_1(src: str | Path, dst: str | Path) -> None:
    data = Path(src).read_bytes()
    magic, version, meta_len = _HEAD.unpack_from(data)
    if version == 3:  # coding 3: rewritten as version 2 first (version 1 payloads are coding 2)
        to_version_2(src, dst)
        src = dst
        data = Path(dst).read_bytes()
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



