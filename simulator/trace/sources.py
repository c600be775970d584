"""Open any trace a command accepts: a ``.hst`` file or a plain ``.npy`` [steps, k] array."""

from __future__ import annotations

import math
import os
import tokenize
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from ..errors import TraceError
from .stream import Stream, StreamKey, TraceMeta

if TYPE_CHECKING:  # numpy loads on first use: the CLI's fast path never needs it
    import numpy as np

    from .format import CodedChunk


class TraceSource(Protocol):
    """What the tools need from a trace: metadata, stream keys, and streams one at a time."""

    path: Path
    meta: TraceMeta
    file_bytes: int

    @property
    def keys(self) -> list[StreamKey]: ...

    @property
    def accesses(self) -> int: ...

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[Stream]: ...

    def read(self, key: StreamKey | tuple[int, int]) -> Stream: ...


@runtime_checkable
class CodedSource(Protocol):
    """The optional extra of a source whose streams are stored coded (the ``.hst`` reader): each
    stream's chunks still coded, so that a consumer can work on the step changes without
    materialising rows. ``isinstance(source, CodedSource)`` tells whether a source has it."""

    def coded_chunks(self, key: StreamKey | tuple[int, int]) -> list[CodedChunk]: ...


class NpyTrace:
    """A ``.npy`` int array [steps, k] read as one stream (request 0, layer 0).

    -1 pads short steps. ctx_len at step 0 is ``ctx0`` (default: the largest index in step 0,
    plus one) and grows by one token per step.
    """

    raw_rows: tuple | None = None  # (rows buffer, steps, k, ctx_len array('q'), accesses), see _open_plain

    def __init__(self, path: str | os.PathLike, *, ctx0: int | None = None) -> None:
        self.path = Path(path)
        self._stream_cache: Stream | None = None
        if self._open_plain(ctx0):
            return
        import numpy as np

        from ..fileio import InputError, check_input

        try:
            check_input(self.path)  # a FIFO would block in open(), a device never end
        except InputError as exc:
            raise TraceError(exc.problem, path=path) from None
        _check_npy_magic(self.path)
        _check_npy_size(self.path)
        try:
            # read, not mapped: a mapped file truncated under the reader faults (SIGBUS)
            array = np.load(self.path, allow_pickle=False)
        except FileNotFoundError:
            raise TraceError("no such file", path=path) from None
        except (ValueError, OSError, EOFError, SyntaxError) as exc:
            raise TraceError(f"not a readable .npy array ({exc})", path=path) from None
        if not isinstance(array, np.ndarray):  # zip data: np.load hands back an .npz archive
            array.close()
            raise TraceError("an .npz archive, not a .npy array (save the one [steps, k] array with np.save)",
                             path=path)
        if not np.issubdtype(array.dtype, np.integer):
            raise TraceError(f"dtype {array.dtype}: a trace array must hold integers", path=path)
        if array.ndim != 2:
            raise TraceError(f"shape {array.shape}: a trace array must be 2-D [steps, k]", path=path)
        if array.shape[1] < 1:
            raise TraceError(f"shape {array.shape}: no columns (k = 0); a trace array needs k >= 1 entries per step",
                             path=path)
        if array.shape[0] == 0:
            raise TraceError(f"shape {array.shape}: the array holds no steps", path=path)
        _check_int32(array, path)
        self.file_bytes = os.path.getsize(self.path)
        indices = _pad_at_end(array.astype(np.int32, copy=False))
        inferred = ctx0 is None
        if inferred:
            first = indices[0] if len(indices) else np.zeros(0, np.int32)
            ctx0 = int(first.max()) + 1 if (first >= 0).any() else 1
        if ctx0 < 1:
            raise TraceError(f"--ctx0 must be positive, got {ctx0}", path=path)
        ctx_len = ctx0 + np.arange(len(indices), dtype=np.int64)
        self.meta = TraceMeta(k=int(array.shape[1]), source={"kind": "npy", "file": self.path.name, "ctx0": ctx0})
        try:
            from .codec import check_stream

            check_stream(indices, ctx_len, self.meta.k)
        except TraceError as exc:
            if inferred and "out of range for ctx_len" in exc.problem:  # say where ctx_len came from
                basis = f"its largest index + 1 = {ctx0}" if (indices[0] >= 0).any() else "no index there, so 1"
                exc = TraceError(f"{exc.problem} (ctx_len was inferred from step 0: {basis}, growing by one "
                                 "per step; --ctx0 sets it)", step=exc.step)
            raise exc.at(path=path, request=0, layer=0) from None
        self._stream_cache = Stream(0, 0, ctx_len, indices)

    def _open_plain(self, ctx0: int | None) -> bool:
        """The common case without numpy (~0.1 s of a replay's start-up, more than replaying a
        recorded stream): a little-endian int32 C-order [steps, k] array whose rows pass the
        compiled checks as stored (padding already at the ends), read whole. False for
        anything else, which the numpy path then reads, pads or refuses with its error."""
        from .. import native
        if not native.available():
            return False
        import ast

        from ..fileio import InputError, check_input

        try:
            check_input(self.path)  # a FIFO would block in open(), a device never end
        except InputError as exc:
            raise TraceError(exc.problem, path=self.path) from None
        try:
            with open(self.path, "rb") as fh:
                head = fh.read(12)
                if len(head) < 10 or head[:6] != b"\x93NUMPY" or head[6] not in (1, 2, 3):
                    return False
                size, start = (int.from_bytes(head[8:10], "little"), 10) if head[6] == 1 \
                    else (int.from_bytes(head[8:12], "little"), 12)
                if size > 1 << 16:  # numpy's own reader refuses such headers, with its message
                    return False
                fh.seek(start)
                header = ast.literal_eval(fh.read(size).decode("latin1"))
                shape = header.get("shape")
                if header.get("descr") != "<i4" or header.get("fortran_order") is not False \
                        or not isinstance(shape, tuple) or len(shape) != 2 or shape[0] < 1 or shape[1] < 1:
                    return False
                steps, k = shape
                offset = start + size
                if os.fstat(fh.fileno()).st_size != offset + 4 * steps * k:
                    return False
                fh.seek(offset)
                data = fh.read(4 * steps * k)  # read, not mapped: a mapped file truncated under the reader faults
        except (OSError, ValueError, SyntaxError, AttributeError, MemoryError):
            return False
        if len(data) != 4 * steps * k:  # shrunk since the size was read
            return False
        rows = memoryview(data)
        if ctx0 is None:
            ctx0 = max(max(rows[:4 * k].cast("i")) + 1, 1)
        if ctx0 < 1:
            return False
        from array import array
        ctx_len = array("q", range(ctx0, ctx0 + steps))
        if native._native.check_rows(rows, steps, k, ctx_len, k)[0]:
            return False
        self.raw_rows = (rows, steps, k, ctx_len, native._native.count_entries(rows, steps, k))
        self.file_bytes = os.path.getsize(self.path)
        self.meta = TraceMeta(k=k, source={"kind": "npy", "file": self.path.name, "ctx0": ctx0})
        return True

    @property
    def _stream(self) -> Stream:
        if self._stream_cache is None:  # the plain path's rows as arrays (views of the mapping)
            import numpy as np
            rows, steps, k, ctx_len, _ = self.raw_rows
            self._stream_cache = Stream(0, 0, np.frombuffer(ctx_len, dtype=np.int64).copy(),
                                        np.frombuffer(rows, dtype=np.int32).reshape(steps, k))
        return self._stream_cache

    @property
    def keys(self) -> list[StreamKey]:
        return [StreamKey(0, 0)]

    @property
    def accesses(self) -> int:
        return self.raw_rows[4] if self.raw_rows is not None else self._stream.accesses

    @property
    def max_ctx(self) -> int:
        """The largest ctx_len (the last step's)."""
        if self.raw_rows is not None:
            return self.raw_rows[3][-1]
        return int(self._stream.ctx_len[-1])

    def __len__(self) -> int:
        return 1

    def __iter__(self) -> Iterator[Stream]:
        yield self._stream

    def read(self, key: StreamKey | tuple[int, int]) -> Stream:
        if tuple(key) != (0, 0):
            raise TraceError("a .npy trace holds one stream: request 0, layer 0", path=self.path)
        return self._stream


def _check_npy_magic(path) -> None:
    """What the file is when it is not a .npy array: an .hst trace under a .npy name was read by
    np.load as "pickled data", which it is not."""
    from .format import MAGIC

    try:
        with open(path, "rb") as fh:
            head = fh.read(len(MAGIC))
    except OSError:
        return  # np.load meets the same and says why
    if head == MAGIC:
        raise TraceError("an .hst trace with a .npy name (hisparse reads a file by its suffix: name it .hst)",
                         path=path)
    if head and not head.startswith((b"\x93NUMPY", b"PK\x03\x04")):
        raise TraceError("not a readable .npy array (it does not start with numpy's magic bytes \\x93NUMPY)", path=path)


def _check_npy_size(path) -> None:
    """A .npy whose header claims more data than the file holds (shape (10**9, 10**9) over 64 bytes) made
    numpy allocate the claimed size first: "out of memory", naming no file. Compare before reading."""
    from numpy.lib import format as npy

    try:
        with open(path, "rb") as fh:
            major, _ = npy.read_magic(fh)
            read_header = npy.read_array_header_1_0 if major == 1 else npy.read_array_header_2_0
            shape, _, dtype = read_header(fh, max_header_size=1 << 16)
            start, size = fh.tell(), os.fstat(fh.fileno()).st_size
    except tokenize.TokenError as exc:  # a damaged header dict (numpy's parser lets this one through)
        raise TraceError(f"not a readable .npy array (its header does not parse: {exc.args[0]})", path=path) from None
    except (OSError, ValueError, EOFError, SyntaxError):
        return  # np.load meets the same and says why
    if dtype.hasobject:
        return
    need = math.prod(shape) * dtype.itemsize
    if need > size - start:
        raise TraceError(f"truncated or damaged: its header says shape {shape} of {dtype} ({need:,} bytes of data), "
                         f"the file holds {max(size - start, 0):,}", path=path)


INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def _check_int32(array: np.ndarray, path) -> None:
    """Positions are int32 in a trace: refuse a wider array's values that a cast would wrap
    (2**40 would become 0), naming the first step that holds one."""
    import numpy as np
    info = np.iinfo(array.dtype)
    if info.min >= INT32_MIN and info.max <= INT32_MAX:
        return
    block = 4096
    for a in range(0, len(array), block):
        rows = array[a:a + block]
        bad = (rows > INT32_MAX) if info.min >= 0 else ((rows > INT32_MAX) | (rows < INT32_MIN))
        if bad.any():
            t, j = map(int, np.argwhere(bad)[0])
            raise TraceError(f"index {int(rows[t, j])} is outside int32, the width of a position "
                             "(a cast would wrap it)",
                             path=path, request=0, layer=0, step=a + t)


def _pad_at_end(indices: np.ndarray) -> np.ndarray:
    """Move -1 padding to the end of each row, keeping the order of the real entries."""
    import numpy as np
    block = 4096  # rows at a time: no full-size temporaries for the common, well-padded array
    if not any(((p := indices[a:a + block] == -1)[:, :-1] & ~p[:, 1:]).any()
               for a in range(0, len(indices), block)):
        return indices
    pad = indices == -1
    order = np.argsort(pad, axis=1, kind="stable")
    return np.take_along_axis(indices, order, axis=1)


def open_trace(path: str | os.PathLike, *, ctx0: int | None = None, recover: bool = False) -> TraceSource:
    """Open a trace by its file: ``.npy`` arrays (the suffix in any case: ``T5.NPY``) as one
    stream, anything else as ``.hst``."""
    if str(path).lower().endswith(".npy"):
        return NpyTrace(path, ctx0=ctx0)
    if ctx0 is not None:
        raise TraceError("--ctx0 applies to .npy arrays only (.hst files carry ctx_len)", path=path)
    from .format import TraceReader  # not imported with the module: a .npy replay never needs it

    return TraceReader(path, recover=recover)
