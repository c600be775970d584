"""Batched LRU straight from a ``.hst`` file's coded chunks: the CLI's fast path.

The compiled decoder hands each step's changes (entries that left, entries that arrived) to the
compiled batched LRU, which needs only those (simulator/native/_native.c). No row of the stream
is materialised: a 41 M-access stream costs a few MB of memory instead of 164 MB. Results are the
replay engine's, bit for bit (tests/test_native.py). A chunk that is corrupt or breaks a rule
of the trace model gives up the fast path; the stream is then read the ordinary way, which
raises the error with its file, request, layer and step.
"""

from __future__ import annotations

import zlib
from array import array
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

from .. import native
from ..trace.format import ChunkInfo, TraceReader
from .api import ReplayConfig


class CodedMisses(NamedTuple):
    """Int64 buffers (``array('q')``: no numpy import on this path; ``np.asarray`` views them)."""

    ctx_len: array  # [steps]
    accesses: int
    misses: list[array]  # per config, [steps]


def applies(source, configs: Sequence[ReplayConfig]) -> bool:
    """Whether every config is batched LRU and the source is a ``.hst`` reader (and C is built)."""
    return (native.available() and isinstance(source, TraceReader) and bool(configs)
            and all(c.policy == "lru" and c.semantics == "batched" for c in configs))


GROUP = 64  # buffers replayed per decoding pass (the C side's limit)


def replay_coded(chunks: Sequence[tuple[ChunkInfo, bytes]], configs: Sequence[ReplayConfig], k: int) -> CodedMisses | None:
    """Per-step misses of one stream (its chunks from ``TraceReader.chunks``) for each config, or
    None when a chunk is not clean (read the stream the ordinary way to get the error). Up to
    64 configs share one decoding pass."""
    parts = [_replay_group(chunks, configs[i:i + GROUP], k) for i in range(0, len(configs), GROUP)]
    if not parts or any(p is None for p in parts):
        return None
    return CodedMisses(parts[0].ctx_len, parts[0].accesses, [m for p in parts for m in p.misses])


def _replay_group(chunks: Sequence[tuple[ChunkInfo, bytes]], configs: Sequence[ReplayConfig], k: int) -> CodedMisses | None:
    steps = sum(c.steps for c, _ in chunks)
    lrus = [native.BatchedLru(c.buffer, reserve=c.reserve_newest, prefix=c.initial == "prefix") for c in configs]
    misses = [array("q", bytes(8 * steps)) for _ in configs]
    ctx_len = array("q", bytes(8 * steps))
    row, prev_ctx, accesses = 0, 0, 0
    for (info, _), raw in zip(chunks, inflated([p for _, p in chunks]), strict=True):
        if raw is None:
            return None
        end = row + info.steps
        code, _, acc = native.lru_replay_coded(lrus, [memoryview(m)[row:end] for m in misses], raw, info.steps,
                                               info.width, info.ordered, k, prev_ctx, memoryview(ctx_len)[row:end])
        if code:
            return None
        accesses += acc
        prev_ctx = ctx_len[end - 1] if info.steps else prev_ctx
        row = end
    return CodedMisses(ctx_len, accesses, misses)


def inflate(payload: bytes) -> bytes | None:
    """A chunk's payload inflated, or None when it does not inflate. The reader has checked
    every byte of the payload against its crc32, so the deflate data is read raw, past the zlib
    header, without computing the adler32 of the output again (a tenth of inflating); the
    stream must still end where the payload does, less the 4 adler32 bytes."""
    if len(payload) < 6 or payload[0] & 0x0F != 8 or payload[1] & 0x20 or (payload[0] << 8 | payload[1]) % 31:
        try:  # not a plain zlib header: zlib decides
            return zlib.decompress(payload)
        except zlib.error:
            return None
    inflater = zlib.decompressobj(-15)
    try:
        out = inflater.decompress(memoryview(payload)[2:])
    except zlib.error:
        return None
    return out if inflater.eof and len(inflater.unused_data) == 4 else None


def inflated(payloads: Sequence[bytes]) -> Iterator[bytes | None]:
    """Each payload inflated, in order (None: it does not inflate), the next one inflating on a
    second thread while the caller works on the current one. zlib releases the GIL while it
    inflates and the compiled replay releases it while it runs, so on two free cores the
    inflating (a third of the CPU time of a replay with churn) hides behind the replay."""
    if len(payloads) < 2:
        yield from (inflate(p) for p in payloads)
        return
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="inflate") as pool:
        ahead = pool.submit(inflate, payloads[0])
        for i in range(len(payloads)):
            current = ahead.result()
            if i + 1 < len(payloads):
                ahead = pool.submit(inflate, payloads[i + 1])
            yield current
