"""The ``.hst`` trace file: a header with JSON metadata, coded chunks, an index and a footer.

    header  b"HSPTRACE" u32 format_version, u32 meta_len, meta JSON, u32 header_crc32
    chunk   b"CHNK" request layer first_step steps width ordered accesses ctx_last payload_len
            payload_crc32 chunk_header_crc32, payload
    index   b"INDX" u32 n, n entries (request layer first_step steps width ordered accesses offset
            ctx_last)
    footer  u64 index_offset, u32 index_crc32, b"HSPEND!!"

Every byte is covered by a checksum: the header's (version, meta_len and metadata), each chunk
header's own (so a damaged header is caught before its fields are trusted: ``--recover`` stops
there instead of inventing a request), each payload's, and the index's. A chunk header must also
agree with its index entry. ``ctx_last`` (a chunk's largest ctx_len) lets a reader size a replay
from the index alone. Version 1 files (no header checksums, no ctx_last) are still read: their chunk
headers are checked against the index; ``hisparse trace convert OLD --keep-order --out NEW``
rewrites one as version 2 with the same streams.

A stream is one or more chunks of consecutive steps (a deployment hook writes them as they
come). Streams are decoded one at a time, so memory is bounded by one stream. A file without a
footer (a writer that crashed) is refused as truncated unless read with ``recover=True``, which
keeps every complete chunk.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
import warnings
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from .. import native
from ..errors import TraceError
from ..fileio import (
    InputError,
    OutputError,
    check_input,
    replace_into,
    special_output,
    temp_beside,
    why_os,
)
from .codec import CODING_OF_VERSION, COMPRESSIONS, check_stream, decode_stream, encode_stream
from .stream import FORMAT_VERSION, Stream, StreamKey, TraceMeta

if TYPE_CHECKING:  # numpy loads on first use: the CLI's fast path never needs it
    import numpy as np

MAGIC = b"HSPTRACE"
END_MAGIC = b"HSPEND!!"
_HEAD = struct.Struct("<8sII")
_CHUNK_V1 = struct.Struct("<4sIIIIIB3xQQI")
_CHUNK_HEAD = struct.Struct("<4sIIIIIB3xQQQI")  # version 2: + ctx_last (the chunk's largest ctx_len)
_CHUNK = struct.Struct("<4sIIIIIB3xQQQII")  # version 2 as stored: + crc32 of the 56 bytes before it
READ_VERSIONS = (1, 2, 3)
WRITE_VERSIONS = (2, 3)  # 3 (the default) codes steps for replay (coding 3); 2 for readers that predate it
_ENTRY_V1 = struct.Struct("<IIIIIB3xQQ")
_ENTRY = struct.Struct("<IIIIIB3xQQQ")  # version 2: + ctx_last
_FOOT = struct.Struct("<QI8s")
_U32 = struct.Struct("<I")
SUFFIX = ".hst"
# k, widths and positions are int32 in the decoded rows and the C fast path.
MAX_K = 2**31 - 2
MAX_CTX = 2**63 - 1
DEFAULT_MAX_CHUNK_BYTES = 256 * 2**20
DEFAULT_MAX_STREAM_BYTES = 8 * 2**30


def max_chunk_bytes() -> int:
    """What one chunk may decode to (its rows, and its inflated coded steps), in bytes."""
    from ..inputs import env_limit

    return env_limit("HISPARSE_MAX_CHUNK_BYTES", DEFAULT_MAX_CHUNK_BYTES)


def max_stream_bytes() -> int:
    """What one decoded stream (all its chunks' rows) may take, in bytes."""
    from ..inputs import env_limit

    return env_limit("HISPARSE_MAX_STREAM_BYTES", DEFAULT_MAX_STREAM_BYTES)


def rows_bytes(steps: int, width: int) -> int:
    """Memory of ``steps`` decoded rows of ``width``: int32 positions and an int64 ctx_len."""
    return steps * (4 * width + 8)


def coded_bound(steps: int, accesses: int) -> int:
    """The most bytes a chunk's coded steps can inflate to, from its header (``codec_jit.encode``):
    per step a ctx_len delta and two counts, per access at most one leaver gap, one arrival gap
    and one rank, each a LEB128 varint of at most 10 bytes. A payload that inflates past it is
    refused before it takes more memory than its header promised."""
    return 30 * steps + 30 * accesses


def check_meta(meta: Any, where: object = None) -> tuple[int, dict, dict]:
    """A trace's metadata, typed and range-checked: (k, source, extra). Raises TraceError naming
    the key. The one check for what a writer writes and what a reader reads."""
    if not isinstance(meta, dict):
        raise TraceError(f"metadata must be a JSON object, got {type(meta).__name__}", path=where)
    for name in ("k", "source"):
        if name not in meta:
            raise TraceError(f"missing metadata '{name}'", path=where)
    k = meta["k"]
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
        raise TraceError(f"metadata 'k' must be an integer from 1 to {MAX_K}, got {_short(k)}", path=where)
    source, extra = meta["source"], meta.get("extra", {})
    for name, value in (("source", source), ("extra", extra)):
        if not isinstance(value, dict):
            raise TraceError(f"metadata '{name}' must be a JSON object, got {type(value).__name__} {_short(value)}",
                             path=where)
    version = meta.get("format_version", FORMAT_VERSION)
    if isinstance(version, bool) or not isinstance(version, int):
        raise TraceError(f"metadata 'format_version' must be an integer, got {_short(version)}", path=where)
    return k, source, extra


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def meta_bytes(meta: TraceMeta, where: object = None) -> bytes:
    """The metadata JSON a writer stores: strict JSON (no NaN or infinity) within the size and
    nesting limits a reader applies (``simulator.inputs``)."""
    from ..inputs import max_depth, max_input_bytes, nesting_depth

    check_meta(meta.to_json(), where)
    try:
        text = json.dumps(meta.to_json(), sort_keys=True, allow_nan=False)
    except ValueError as exc:
        raise TraceError(f"metadata cannot be stored: {exc} (JSON has no NaN or infinity)", path=where) from None
    except TypeError as exc:
        raise TraceError(f"metadata cannot be stored: {exc}", path=where) from None
    except RecursionError:
        raise TraceError("metadata cannot be stored: nested too deep", path=where) from None
    if nesting_depth(text, toml=False, stop=max_depth()) > max_depth():
        raise TraceError(f"metadata nested more than {max_depth()} levels deep (set HISPARSE_MAX_NESTING "
                         "to raise the limit)", path=where)
    raw = text.encode()
    if len(raw) > max_input_bytes():
        raise TraceError(f"metadata of {len(raw)} bytes is larger than the input size limit {max_input_bytes()} "
                         "(set HISPARSE_MAX_INPUT_BYTES to raise it)", path=where)
    return raw


@dataclass(frozen=True)
class ChunkInfo:
    request: int
    layer: int
    first_step: int
    steps: int
    width: int
    ordered: bool
    accesses: int
    offset: int
    ctx_last: int = 0  # the chunk's last (largest) ctx_len; 0 in version-1 files (not stored)

    def entry(self) -> bytes:
        return _ENTRY.pack(self.request, self.layer, self.first_step, self.steps, self.width,
                           self.ordered, self.accesses, self.offset, self.ctx_last)


U32_MAX = 2**32 - 1


def _check_u32_fields(path: object, key: StreamKey, first_step: int, steps: int) -> None:
    """Request, layer and step numbers are stored as u32: refuse one out of that range with a
    TraceError naming it (struct.pack raised "argument out of range", naming nothing)."""
    for name, value in (("request", key.request), ("layer", key.layer), ("first step", first_step)):
        if not 0 <= value <= U32_MAX:
            raise TraceError(f"{name} {value} cannot be stored (a trace stores requests, layers and steps "
                             f"as whole numbers from 0 to {U32_MAX})", path=path)
    if first_step + steps - 1 > U32_MAX:
        raise TraceError(f"steps {first_step}..{first_step + steps - 1} cannot be stored: step numbers go up to "
                         f"{U32_MAX}", path=path, request=key.request, layer=key.layer)


def _chunk_header(info: ChunkInfo, payload_len: int, payload_crc: int) -> bytes:
    """A version-2 chunk header: its fields, then the crc32 of those fields."""
    head = _CHUNK_HEAD.pack(b"CHNK", info.request, info.layer, info.first_step, info.steps, info.width,
                            info.ordered, info.accesses, info.ctx_last, payload_len, payload_crc)
    return head + _U32.pack(zlib.crc32(head))


class CodedChunk(NamedTuple):
    """One chunk of a stream as stored: its steps still coded (``codec.py``), for consumers that
    work on the coded form directly (the compiled batched-LRU replay reads the step changes)."""

    steps: int
    width: int
    ordered: bool
    payload: bytes  # compressed, checksum verified
    accesses: int = -1  # from the header: bounds what the payload may inflate to (-1: the chunk budget only)
    ctx_last: int = 0  # from the header: the last step's ctx_len (0: not stored, version 1)
    coding: int = 3  # how the steps are coded (codec.CODING_OF_VERSION of the file's version)

    @property
    def bound(self) -> int:
        """The most bytes its coded steps may inflate to (``coded_bound``, within the chunk budget)."""
        limit = max_chunk_bytes()
        return limit if self.accesses < 0 else min(coded_bound(self.steps, self.accesses), limit)

    def coded(self, into: bytearray | None = None) -> bytes | memoryview | None:
        """The coded steps (``codec.py``'s varint stream), or None when the payload does not
        decompress (``TraceReader.read`` of the stream then raises the error).

        The reader has checked every byte of the payload against its crc32, so the deflate data
        is inflated raw, past the 2-byte zlib header, without computing the adler32 of the
        output a second time (a tenth of inflating); the deflate stream must still end exactly
        4 bytes (the adler32) before the payload does. With ``into`` (and the compiled module),
        a payload of stored blocks only (``--compression stored``) is copied into that buffer,
        grown as needed, and a view of it returned: no new memory for the kernel to zero."""
        p, bound = self.payload, self.bound
        if len(p) < 6 or p[0] & 0x0F != 8 or p[1] & 0x20 or (p[0] << 8 | p[1]) % 31:
            try:  # not a plain zlib header: zlib decides
                return bounded_inflate(p, bound)
            except zlib.error:
                return None
        if into is not None and native.available():
            size = native.unstore(p)
            if size == -2 or size > bound:
                return None
            if size >= 0:
                try:
                    if len(into) < size:
                        into.extend(bytes(size - len(into)))
                    native.unstore(p, into)
                    return memoryview(into)[:size]
                except BufferError:  # still viewed by an earlier caller: inflate into new memory
                    pass
        inflater = zlib.decompressobj(-15)
        try:
            out = inflater.decompress(memoryview(p)[2:], bound + 1)
        except zlib.error:
            return None
        if len(out) > bound:
            return None
        return out if inflater.eof and len(inflater.unused_data) == 4 else None


def bounded_inflate(payload: bytes | memoryview, bound: int) -> bytes:
    """A zlib payload inflated, refusing (zlib.error) one whose output would pass ``bound`` bytes:
    never more than bound + 1 bytes are produced, whatever the payload claims."""
    inflater = zlib.decompressobj()
    out = inflater.decompress(payload, bound + 1)
    if len(out) > bound:
        raise zlib.error(f"inflates past {bound} bytes, the most its header allows")
    if not inflater.eof:
        raise zlib.error("incomplete or truncated stream")
    return out


class TraceWriter:
    """Write a trace, whole streams at a time or one step at a time (for deployment hooks).

    >>> with TraceWriter("t.hst", k=2048, source={"kind": "recorded", "model": "m"}) as w:
    ...     w.write(request=0, layer=0, step=0, ctx_len=9000, indices=topk)   # doctest: +SKIP

    ``atomic=True`` (the default) writes a temp file and renames it to ``path`` on close, so a
    failed run leaves nothing. A hook in a live server should pass ``atomic=False``: every
    complete chunk is then flushed to ``path`` as it is written, and if the process dies the file
    still reads with ``recover=True``. ``compression`` (codec.COMPRESSIONS): "auto" (the default)
    compresses a chunk with zlib where that saves at least a quarter of its bytes and stores it
    in deflate's uncompressed blocks otherwise; "zlib" and "stored" do one or the other always.
    ``version`` (WRITE_VERSIONS): 3, or 2 for a reader that predates coding 3.
    """

    def __init__(self, path: str | os.PathLike, *, k: int, source: dict[str, Any],
                 extra: dict[str, Any] | None = None, keep_order: bool = False,
                 atomic: bool = True, chunk_steps: int = 1024, compression: str = "auto",
                 version: int = FORMAT_VERSION) -> None:
        if compression not in COMPRESSIONS:
            raise TraceError(f"unknown compression {compression!r} (one of {', '.join(COMPRESSIONS)})", path=path)
        if isinstance(k, bool) or not hasattr(k, "__index__"):
            raise TraceError(f"k must be an integer from 1 to {MAX_K}, got {_short(k)}", path=path)
        if isinstance(chunk_steps, bool) or not hasattr(chunk_steps, "__index__") or int(chunk_steps) < 1:
            raise TraceError(f"chunk_steps must be a positive integer, got {_short(chunk_steps)}", path=path)
        for name, value in (("source", source), ("extra", extra or {})):
            if not isinstance(value, dict):
                raise TraceError(f"{name} must be a dict, got {type(value).__name__}", path=path)
        if version not in WRITE_VERSIONS:
            raise TraceError(f"cannot write format version {_short(version)} (one of "
                             f"{', '.join(map(str, WRITE_VERSIONS))})", path=path)
        self.compression = compression
        self.version = version
        self.path = Path(path)
        self.meta = TraceMeta(k=int(k), source=dict(source), extra=dict(extra or {}), format_version=version)
        meta = meta_bytes(self.meta, path)  # checked before anything is created
        self.keep_order = keep_order
        self.chunk_steps = int(chunk_steps)
        # a device or pipe (a symlink to /dev/full) is written in place, as atomic_output does: the rename replaced
        # the link with a regular file and reported success
        atomic = atomic and not special_output(self.path)
        self._atomic = atomic
        if atomic:
            self._fh, self._tmp = temp_beside(self.path)
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._tmp = None
            self._fh = open(self.path, "wb")  # noqa: SIM115 - closed in close()
        self._closed = False
        head = _HEAD.pack(MAGIC, version, len(meta)) + meta
        try:
            self._put(head + _U32.pack(zlib.crc32(head[8:])))
        except BaseException:  # no ``with`` block yet to drop the temp file
            self.abort()
            raise
        self._chunks: list[ChunkInfo] = []
        self._next_step: dict[StreamKey, int] = {}
        self._last_ctx: dict[StreamKey, int] = {}
        self._pending: dict[StreamKey, tuple[int, list[tuple[int, np.ndarray]]]] = {}

    def _put(self, data: bytes) -> None:
        """Write to the file; an OS error (disk full, quota) is one line naming the trace (the
        ``with`` block then drops the temp file)."""
        try:
            self._fh.write(data)
        except OSError as exc:
            raise OutputError(f"{self.path}: cannot write ({why_os(exc)})") from None

    # -- whole streams -------------------------------------------------------------------
    def write_stream(self, stream: Stream) -> None:
        """Check and write a whole stream (or its continuation) in chunks of chunk_steps. A new
        stream starts at its ``first_step``; a continuation follows what was written."""
        self._flush_key(stream.key)
        if stream.steps == 0:
            # a chunk holds at least one step (a reader refuses one of none): a new stream of no
            # steps cannot be stored, and a continuation of none adds nothing
            if stream.key in self._next_step:
                return
            raise TraceError("a stream of no steps cannot be stored (every stream holds at least one step)",
                             path=self.path, request=stream.request, layer=stream.layer)
        for s in range(0, stream.steps, self.chunk_steps):
            e = min(stream.steps, s + self.chunk_steps)
            start = None if stream.key in self._next_step else stream.first_step + s
            self._write_chunk(stream.key, stream.ctx_len[s:e], stream.indices[s:e], first_step=start)

    # -- one step at a time ------------------------------------------------------------------
    def write(self, request: int, layer: int, step: int, ctx_len: int, indices) -> None:
        """Buffer one step of (request, layer); a full buffer becomes a chunk on disk.

        A stream's first step may have any number; after that steps must follow one by one."""
        import numpy as np
        key = StreamKey(int(request), int(layer))
        first, rows = self._pending.get(key, (self._next_step.get(key, step), []))
        if step != first + len(rows):
            raise TraceError(f"step {step} written out of order, expected step {first + len(rows)}",
                             path=self.path, request=key.request, layer=key.layer)
        _check_u32_fields(self.path, key, first, len(rows) + 1)  # now, not when the chunk is flushed
        row = np.asarray(indices).reshape(-1)
        if row.size > self.meta.k:
            raise TraceError(f"{row.size} entries in one step, more than k = {self.meta.k}",
                             path=self.path, request=key.request, layer=key.layer, step=step)
        rows.append((int(ctx_len), row))
        self._pending[key] = (first, rows)
        if len(rows) >= self.chunk_steps:
            self._flush_key(key)

    def flush(self) -> None:
        """Write every buffered step to disk as chunks."""
        for key in list(self._pending):
            self._flush_key(key)

    def _flush_key(self, key: StreamKey) -> None:
        import numpy as np
        first, pending = self._pending.pop(key, (0, []))
        if not pending:
            return
        width = max(1, max(row.size for _, row in pending))
        rows = np.full((len(pending), width), -1, dtype=np.int64)
        for t, (_, row) in enumerate(pending):
            rows[t, : row.size] = row
        ctx = np.array([c for c, _ in pending], dtype=np.int64)
        self._write_chunk(key, ctx, rows, first_step=first)

    def _write_chunk(self, key: StreamKey, ctx_len: np.ndarray, indices: np.ndarray,
                     first_step: int | None = None) -> None:
        import numpy as np
        if self._closed:
            raise TraceError("write after close", path=self.path)
        indices = np.asarray(indices)
        ctx_len = np.asarray(ctx_len)
        if indices.ndim != 2 or not np.issubdtype(indices.dtype, np.integer):
            raise TraceError(f"indices must be a 2-D integer array, got {indices.dtype} {indices.shape}",
                             path=self.path, request=key.request, layer=key.layer)
        need, limit = rows_bytes(*indices.shape), max_chunk_bytes()
        if need > limit:
            raise TraceError(f"a chunk of {indices.shape[0]} steps x {indices.shape[1]} entries decodes to {need} "
                             f"bytes, more than the chunk limit {limit} (fewer chunk_steps, or set "
                             "HISPARSE_MAX_CHUNK_BYTES)", path=self.path, request=key.request, layer=key.layer)
        last_ctx = self._last_ctx.get(key, 0)
        start = self._next_step.get(key, 0) if first_step is None else first_step
        _check_u32_fields(self.path, key, start, int(indices.shape[0]))
        try:
            check_stream(indices.astype(np.int64, copy=False), ctx_len.astype(np.int64, copy=False), self.meta.k)
        except TraceError as exc:
            step = None if exc.step is None else exc.step + start
            raise TraceError(exc.problem, path=self.path, request=key.request, layer=key.layer, step=step) from None
        if len(ctx_len) and ctx_len[0] < last_ctx:
            raise TraceError(f"ctx_len goes down, to {int(ctx_len[0])} from {last_ctx}",
                             path=self.path, request=key.request, layer=key.layer, step=start)
        payload, ordered = encode_stream(indices, ctx_len, keep_order=self.keep_order, compression=self.compression,
                                         coding=CODING_OF_VERSION[self.version])
        info = ChunkInfo(key.request, key.layer, start, int(indices.shape[0]), int(indices.shape[1]),
                         ordered, int(np.count_nonzero(indices >= 0)), self._fh.tell(),
                         int(ctx_len[-1]) if len(ctx_len) else last_ctx)
        self._put(_chunk_header(info, len(payload), zlib.crc32(payload)))
        self._put(payload)
        if not self._atomic:
            self._flush_file()
        self._chunks.append(info)
        self._next_step[key] = start + info.steps
        self._last_ctx[key] = int(ctx_len[-1]) if len(ctx_len) else last_ctx

    def close(self) -> None:
        """Write buffered steps, the index and the footer; rename into place when atomic."""
        if self._closed:
            return
        try:
            self.flush()
            index_offset = self._fh.tell()
            index = b"INDX" + _U32.pack(len(self._chunks)) + b"".join(c.entry() for c in self._chunks)
            self._put(index)
            self._put(_FOOT.pack(index_offset, zlib.crc32(index), END_MAGIC))
            self._flush_file()
        except BaseException:  # disk full at the end, Ctrl-C: nothing half-written is left
            self.abort()
            raise
        self._fh.close()
        self._closed = True
        if self._tmp:
            replace_into(self._tmp, self.path)

    def _flush_file(self) -> None:
        """Flush buffered bytes (where a full disk shows up last), mapped like ``_put``."""
        try:
            self._fh.flush()
        except OSError as exc:
            raise OutputError(f"{self.path}: cannot write ({why_os(exc)})") from None

    def abort(self) -> None:
        """Drop the file (atomic) or leave what was flushed (non-atomic): used on errors."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(OSError):  # buffered bytes that cannot be written: dropped anyway
            self._fh.close()
        if self._tmp:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._tmp)

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


class TraceReader:
    """Read a ``.hst`` file: metadata and index up front, streams decoded one at a time."""

    def __init__(self, path: str | os.PathLike, *, recover: bool = False) -> None:
        self.path = Path(path)
        try:
            check_input(self.path)  # a FIFO would block in open(), a device never end
            self._fh = open(self.path, "rb")  # noqa: SIM115 - closed in close()
        except InputError as exc:
            raise TraceError(f"cannot open trace ({exc.problem})", path=path) from None
        except OSError as exc:
            raise TraceError(f"cannot open trace ({why_os(exc)})", path=path) from None
        try:
            self.file_bytes = os.fstat(self._fh.fileno()).st_size
            self.meta, self._data_start = self._read_header()
            self.recovered = False
            chunks = self._read_index(recover)
        except OSError as exc:  # EIO (/proc/self/mem), a disk gone: one line naming the file
            self._fh.close()
            raise TraceError(f"cannot read trace ({why_os(exc)})", path=path) from None
        self._streams: dict[StreamKey, list[ChunkInfo]] = {}
        for c in chunks:
            self._streams.setdefault(StreamKey(c.request, c.layer), []).append(c)
        for key, cs in self._streams.items():
            cs.sort(key=lambda c: c.first_step)
            for a, b in zip(cs, cs[1:], strict=False):
                end = a.first_step + a.steps
                if b.first_step < end:  # read as "steps 64..-1 are missing"
                    raise TraceError(f"two chunks hold step {b.first_step} (steps {a.first_step}..{end - 1} and "
                                     f"{b.first_step}..{b.first_step + b.steps - 1})",
                                     path=path, request=key.request, layer=key.layer)
                if b.first_step != end:
                    raise TraceError(f"steps {end}..{b.first_step - 1} are missing",
                                     path=path, request=key.request, layer=key.layer)
            need, limit = rows_bytes(sum(c.steps for c in cs), max(c.width for c in cs)), max_stream_bytes()
            if need > limit:
                raise TraceError(f"the stream decodes to {need} bytes, more than the stream limit {limit} "
                                 "(set HISPARSE_MAX_STREAM_BYTES to raise it)", path=path, request=key.request,
                                 layer=key.layer)

    def _fail(self, problem: str) -> TraceError:
        return TraceError(problem, path=self.path)

    def _read_header(self) -> tuple[TraceMeta, int]:
        head = self._fh.read(_HEAD.size)
        if not head:
            raise self._fail("an empty file (0 bytes), not a trace; traces are .hst files or .npy arrays")
        if head[:8] == MAGIC[:len(head[:8])] and len(head) < _HEAD.size:  # the magic, cut short after it
            raise self._fail(f"truncated: {len(head)} bytes, shorter than the {_HEAD.size}-byte header that "
                             "follows a trace's magic (an interrupted copy or write?)")
        if head.startswith(b"\x93NUMPY"):  # read as .hst because of its name
            raise self._fail("a .npy array, not a hisparse trace (bad magic): hisparse reads a file by its "
                             "suffix; name it .npy")
        if len(head) < _HEAD.size or head[:8] != MAGIC:
            raise self._fail("not a hisparse trace file (bad magic); traces are .hst files or .npy arrays")
        _, version, meta_len = _HEAD.unpack(head)
        if version not in READ_VERSIONS:
            raise self._fail(f"unknown format version {version} (this hisparse-sim reads versions "
                             f"{', '.join(map(str, READ_VERSIONS))})")
        self.version = version
        self.coding = CODING_OF_VERSION[version]
        self._chunk_struct = _CHUNK if version >= 2 else _CHUNK_V1
        self._entry_struct = _ENTRY if version >= 2 else _ENTRY_V1
        from ..inputs import max_input_bytes, parse_json

        if meta_len > self.file_bytes - _HEAD.size:
            raise self._fail(f"truncated file: the header says {meta_len} bytes of metadata, the file has "
                             f"{self.file_bytes} in all")
        if meta_len > max_input_bytes():
            raise self._fail(f"metadata of {meta_len} bytes is larger than the input size limit {max_input_bytes()} "
                             "(set HISPARSE_MAX_INPUT_BYTES to raise it)")
        raw = self._fh.read(meta_len)
        if len(raw) < meta_len:
            raise self._fail("truncated file: metadata is cut short")
        data_start = _HEAD.size + meta_len
        if version >= 2:
            crc = self._fh.read(_U32.size)
            if len(crc) < _U32.size:
                raise self._fail("truncated file: header is cut short")
            if _U32.unpack(crc)[0] != zlib.crc32(head[8:] + raw):
                raise self._fail("corrupt header (checksum mismatch)")
            data_start += _U32.size
        from ..errors import HisparseError
        from ..inputs import max_depth, max_input_bytes

        max_depth(), max_input_bytes()  # a bad HISPARSE_MAX_* is the environment's error, not a corrupt trace
        try:
            meta = parse_json(raw, "metadata")
        except HisparseError as exc:  # "metadata: not valid JSON (...)", nested too deep, NaN
            raise self._fail(f"corrupt {exc}") from None
        k, source, extra = check_meta(meta, self.path)
        return TraceMeta(k=k, source=source, format_version=version, extra=extra), data_start

    def _read_index(self, recover: bool) -> list[ChunkInfo]:
        if self.file_bytes >= self._data_start + _FOOT.size:
            self._fh.seek(self.file_bytes - _FOOT.size)
            offset, crc, magic = _FOOT.unpack(self._fh.read(_FOOT.size))
            if magic == END_MAGIC:
                if not self._data_start <= offset <= self.file_bytes - _FOOT.size:
                    raise self._fail("corrupt footer (index offset out of range)")
                self._fh.seek(offset)
                index = self._fh.read(self.file_bytes - _FOOT.size - offset)
                n = _U32.unpack(index[4:8])[0] if len(index) >= 8 else -1
                size = self._entry_struct.size
                if zlib.crc32(index) != crc or index[:4] != b"INDX" or len(index) != 8 + n * size:
                    raise self._fail("corrupt index (checksum mismatch)")
                entries = list(self._entry_struct.iter_unpack(index[8:]))
                for e in entries:
                    problem = self._field_problem(e[3], e[4], e[5], e[6], e[8] if len(e) > 8 else None, e[7])
                    if problem:
                        raise TraceError(f"index entry at step {e[2]}: {problem}", path=self.path,
                                         request=e[0], layer=e[1])
                return [ChunkInfo(*e[:5], bool(e[5]), *e[6:]) for e in entries]
        if not recover:
            extra = self._bytes_after_footer()
            if extra:  # was told "truncated", which it is not
                raise self._fail(f"{extra:,} byte(s) after the trace's end marker (appended to a complete trace?); "
                                 "cut them off, or pass --recover to read the complete chunks it has")
            raise self._fail("truncated file: no index at the end (was the writer closed?); "
                             "pass --recover to read the complete chunks it has")
        return self._scan_chunks()

    def _bytes_after_footer(self, window: int = 1 << 20) -> int:
        """How many bytes follow an end marker found in the file's last ``window`` bytes (0: none found)."""
        start = max(self._data_start, self.file_bytes - window)
        self._fh.seek(start)
        tail = self._fh.read(self.file_bytes - start)
        at = tail.rfind(END_MAGIC)
        if at < 0 or start + at + len(END_MAGIC) < self._data_start + _FOOT.size:
            return 0
        return self.file_bytes - (start + at + len(END_MAGIC))

    def _scan_chunks(self) -> list[ChunkInfo]:
        """Walk chunk headers from the start; keep every complete chunk with a good checksum."""
        chunks, pos, size = [], self._data_start, self._chunk_struct.size
        next_step: dict[tuple[int, int], int] = {}
        while pos + size <= self.file_bytes:
            self._fh.seek(pos)
            info, plen, crc, _ = self._chunk_at(pos, self._fh.read(size))
            if info is None or pos + size + plen > self.file_bytes or zlib.crc32(self._fh.read(plen)) != crc:
                break  # a damaged header or payload: everything from here on is untrusted
            key = (info.request, info.layer)
            if next_step.get(key, info.first_step) != info.first_step:
                break
            next_step[key] = info.first_step + info.steps
            chunks.append(info)
            pos += size + plen
        self.recovered = True
        note = ("" if self.version >= 2 else "; format version 1 has no chunk-header checksums: "
                "rewrite it with hisparse trace convert --keep-order")
        warnings.warn(f"{self.path}: no index (unclosed writer); recovered {len(chunks)} complete chunks{note}",
                      stacklevel=3)
        return chunks

    def _chunk_at(self, pos: int, raw: bytes) -> tuple[ChunkInfo | None, int, int, str]:
        """The chunk header at ``pos``: (info, payload_len, payload_crc, problem); info is None
        when the header is cut short, not a chunk or (version 2) fails its checksum."""
        size = self._chunk_struct.size
        if len(raw) < size:
            return None, 0, 0, "truncated chunk header"
        fields = self._chunk_struct.unpack(raw)
        if fields[0] != b"CHNK":
            return None, 0, 0, "corrupt chunk header (bad magic)"
        if self.version >= 2 and zlib.crc32(raw[:-_U32.size]) != fields[-1]:
            return None, 0, 0, "corrupt chunk header (checksum mismatch)"
        if self.version >= 2:
            _, req, layer, first, steps, width, ordered, acc, ctx_last, plen, crc, _ = fields
        else:
            (_, req, layer, first, steps, width, ordered, acc, plen, crc), ctx_last = fields, 0
        problem = self._field_problem(steps, width, ordered, acc, ctx_last if self.version >= 2 else None, pos)
        if problem:
            return None, 0, 0, f"corrupt chunk header ({problem})" if "limit" not in problem else problem
        if plen > self.file_bytes - pos - size:
            return None, 0, 0, "truncated or corrupt chunk (its payload runs past the end of the file)"
        return ChunkInfo(req, layer, first, steps, width, bool(ordered), acc, pos, ctx_last), plen, crc, ""

    def _field_problem(self, steps: int, width: int, ordered: int, accesses: int, ctx_last: int | None,
                       offset: int) -> str:
        """What is impossible about a chunk's fields ("" if nothing), or the budget it exceeds."""
        if ordered > 1 or steps < 1 or width < 1:
            return "impossible field values"
        if width > MAX_K + 1:
            return f"width {width} is more than the {MAX_K + 1} entries a step can hold"
        if accesses > steps * width:
            return f"{accesses} accesses in {steps} steps of width {width}"
        if ctx_last is not None and not 1 <= ctx_last <= MAX_CTX:
            return f"ctx_last {ctx_last} out of range"
        if not self._data_start <= offset < self.file_bytes:
            return f"offset {offset} out of the file"
        need, limit = rows_bytes(steps, width), max_chunk_bytes()
        if need > limit:
            return (f"a chunk of {steps} steps x {width} entries decodes to {need} bytes, more than the chunk "
                    f"limit {limit} (set HISPARSE_MAX_CHUNK_BYTES to raise it)")
        return ""

    # -- the trace interface shared with NpyTrace -------------------------------------------
    @property
    def keys(self) -> list[StreamKey]:
        return list(self._streams)

    @property
    def accesses(self) -> int:
        return sum(c.accesses for cs in self._streams.values() for c in cs)

    @property
    def max_ctx(self) -> int | None:
        """The largest ctx_len of any stream, from the index (None for version 1: not stored)."""
        if self.version < 2:
            return None
        return max((c.ctx_last for cs in self._streams.values() for c in cs), default=0)

    def __len__(self) -> int:
        return len(self._streams)

    def __iter__(self) -> Iterator[Stream]:
        for key in self._streams:
            yield self.read(key)

    def chunks(self, key: StreamKey | tuple[int, int], *, views: bool = False) -> list[tuple[ChunkInfo, bytes]]:
        """A stream's chunks in step order, each with its checksummed, still compressed payload.

        Payloads are read with ordinary reads, never mapped: a file truncated while mapped
        faults (SIGBUS) on the next page touched, while a short read here is a TraceError
        naming the chunk. ``views``: payloads as read-only views of one buffer per stream,
        reused for a later stream once no view of it is left (``_buffer``): no fresh memory
        for the kernel to zero on every stream (BENCHMARKS.md "Trace reading without mmap")."""
        key = StreamKey(*key)
        if key not in self._streams:
            raise TraceError("no such stream in this trace", path=self.path, request=key.request, layer=key.layer)
        fail = dict(path=self.path, request=key.request, layer=key.layer)
        heads = []
        try:
            for c in self._streams[key]:
                self._fh.seek(c.offset)
                info, plen, crc, problem = self._chunk_at(c.offset, self._fh.read(self._chunk_struct.size))
                if info is None:
                    raise TraceError(f"{problem} at step {c.first_step}", **fail)
                if info != c:  # the index and the chunk's own header must tell the same story
                    raise TraceError(f"corrupt chunk header at step {c.first_step} (disagrees with the index)",
                                     **fail)
                heads.append((c, plen, crc))
            view = self._buffer(sum(plen for _, plen, _ in heads)) if views else None
            out, pos = [], 0
            for c, plen, crc in heads:
                self._fh.seek(c.offset + self._chunk_struct.size)
                if view is not None:
                    got = self._fh.readinto(view[pos:pos + plen])
                    payload = view[pos:pos + plen].toreadonly()
                    pos += plen
                else:
                    payload = self._fh.read(plen)
                    got = len(payload)
                if got != plen:  # the file shrank since it was opened, or lies about its size
                    raise TraceError(f"truncated or corrupt chunk at step {c.first_step}", **fail)
                if zlib.crc32(payload) != crc:
                    raise TraceError(f"corrupt chunk at step {c.first_step} (checksum mismatch)", **fail)
                out.append((c, payload))
        except OSError as exc:
            raise TraceError(f"cannot read trace ({why_os(exc)})", **fail) from None
        return out

    _POOL = 4  # buffers kept for reuse: the streams a replay has in flight (read ahead, replaying)

    def _buffer(self, size: int) -> memoryview:
        """A writable view of ``size`` bytes in a buffer no earlier payload view still uses."""
        pool = self.__dict__.setdefault("_pool", [])
        for buf in pool:
            try:  # resizing a bytearray that is still viewed raises BufferError: in use
                buf.append(0)
                buf.pop()
            except BufferError:
                continue
            if len(buf) < size:
                buf.extend(bytes(size - len(buf)))
            return memoryview(buf)[:size]
        buf = bytearray(size)
        if len(pool) < self._POOL:
            pool.append(buf)
        return memoryview(buf)

    def coded_chunks(self, key: StreamKey | tuple[int, int]) -> list[CodedChunk]:
        """A stream's chunks in step order, still coded (the optional method of ``TraceSource``
        that lets a consumer skip materialising rows). File reads happen here, in the caller's
        thread; ``CodedChunk.coded`` may then run in any thread."""
        return [CodedChunk(c.steps, c.width, c.ordered, payload, c.accesses, c.ctx_last if self.version >= 2 else 0,
                           self.coding)
                for c, payload in self.chunks(key, views=True)]

    def read(self, key: StreamKey | tuple[int, int]) -> Stream:
        """Decode and check one stream."""
        import numpy as np
        key = StreamKey(*key)
        chunks = self.chunks(key)
        width = max(c.width for c, _ in chunks)
        indices = np.empty((sum(c.steps for c, _ in chunks), width), dtype=np.int32)
        ctx_len = np.empty(indices.shape[0], dtype=np.int64)
        fail = dict(path=self.path, request=key.request, layer=key.layer)
        row = 0
        for c, payload in chunks:
            try:
                decode_stream(payload, c.steps, c.width, c.ordered, indices[row:row + c.steps],
                              ctx_len[row:row + c.steps], max_coded=CodedChunk(c.steps, c.width, c.ordered, b"",
                                                                             c.accesses).bound, coding=self.coding)
            except TraceError as exc:
                step = None if exc.step is None else exc.step + c.first_step
                raise TraceError(exc.problem, step=step, **fail) from None
            if self.version >= 2 and c.steps and int(ctx_len[row + c.steps - 1]) != c.ctx_last:
                raise TraceError(f"chunk at step {c.first_step}: its header says ctx_len reaches {c.ctx_last}, "
                                 f"its payload {int(ctx_len[row + c.steps - 1])}", **fail)
            held = int(np.count_nonzero(indices[row:row + c.steps] >= 0))
            if held != c.accesses:
                raise TraceError(f"chunk at step {c.first_step}: its header says {c.accesses} accesses, its payload "
                                 f"holds {held}", **fail)
            row += c.steps
        try:
            check_stream(indices, ctx_len, self.meta.k)
        except TraceError as exc:
            raise exc.at(path=self.path, request=key.request, layer=key.layer) from None
        return Stream(key.request, key.layer, ctx_len, indices, chunks[0][0].first_step)

    def first_step(self, key: StreamKey | tuple[int, int]) -> int:
        """The step number of a stream's first stored step (from the index)."""
        return self._streams[StreamKey(*key)][0].first_step

    def close(self) -> None:
        self._fh.close()
        self.__dict__.pop("_pool", None)  # buffers still viewed live on with their views

    def __enter__(self) -> TraceReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def write_trace(path: str | os.PathLike, meta: TraceMeta, streams, *, keep_order: bool = False,
                compression: str = "auto", version: int = FORMAT_VERSION) -> None:
    """Write streams (any iterable) to ``path`` atomically (``compression``: codec.COMPRESSIONS;
    ``version``: WRITE_VERSIONS)."""
    with TraceWriter(path, k=meta.k, source=meta.source, extra=meta.extra, keep_order=keep_order,
                     compression=compression, version=version) as w:
        for s in streams:
            w.write_stream(s)
