"""Open any trace a command accepts: a ``.hst`` file or a plain ``.npy`` [steps, k] array."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from ..errors import TraceError
from .codec import check_stream
from .format import CodedChunk, TraceReader
from .stream import Stream, StreamKey, TraceMeta

if TYPE_CHECKING:  # numpy loads on first use: the CLI's fast path never needs it
    import numpy as np


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

    def __init__(self, path: str | os.PathLike, *, ctx0: int | None = None) -> None:
        import numpy as np

        from ..fileio import InputError, check_input

        self.path = Path(path)
        try:
            check_input(self.path)  # a FIFO would block in open(), a device never end
        except InputError as exc:
            raise TraceError(exc.problem, path=path) from None
        try:
            # read, not mapped: a mapped file truncated under the reader faults (SIGBUS)
            array = np.load(self.path, allow_pickle=False)
        except FileNotFoundError:
            raise TraceError("no such file", path=path) from None
        except (ValueError, OSError, EOFError) as exc:
            raise TraceError(f"not a readable .npy array ({exc})", path=path) from None
        if not np.issubdtype(array.dtype, np.integer):
            raise TraceError(f"dtype {array.dtype}: a trace array must hold integers", path=path)
        if array.ndim != 2 or array.shape[1] < 1:
            raise TraceError(f"shape {array.shape}: a trace array must be 2-D [steps, k]", path=path)
        if array.shape[0] == 0:
            raise TraceError(f"shape {array.shape}: the array holds no steps", path=path)
        _check_int32(array, path)
        self.file_bytes = os.path.getsize(self.path)
        indices = _pad_at_end(array.astype(np.int32, copy=False))
        if ctx0 is None:
            first = indices[0] if len(indices) else np.zeros(0, np.int32)
            ctx0 = int(first.max()) + 1 if (first >= 0).any() else 1
        if ctx0 < 1:
            raise TraceError(f"--ctx0 must be positive, got {ctx0}", path=path)
        ctx_len = ctx0 + np.arange(len(indices), dtype=np.int64)
        self.meta = TraceMeta(k=int(array.shape[1]), source={"kind": "npy", "file": self.path.name, "ctx0": ctx0})
        try:
            check_stream(indices, ctx_len, self.meta.k)
        except TraceError as exc:
            raise exc.at(path=path, request=0, layer=0) from None
        self._stream = Stream(0, 0, ctx_len, indices)

    @property
    def keys(self) -> list[StreamKey]:
        return [StreamKey(0, 0)]

    @property
    def accesses(self) -> int:
        return self._stream.accesses

    @property
    def max_ctx(self) -> int:
        """The largest ctx_len (the last step's)."""
        return int(self._stream.ctx_len[-1])

    def __len__(self) -> int:
        return 1

    def __iter__(self) -> Iterator[Stream]:
        yield self._stream

    def read(self, key: StreamKey | tuple[int, int]) -> Stream:
        if tuple(key) != (0, 0):
            raise TraceError("a .npy trace holds one stream: request 0, layer 0", path=self.path)
        return self._stream


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
    """Open a trace by its file: ``.npy`` arrays as one stream, anything else as ``.hst``."""
    if str(path).endswith(".npy"):
        return NpyTrace(path, ctx0=ctx0)
    if ctx0 is not None:
        raise TraceError("--ctx0 applies to .npy arrays only (.hst files carry ctx_len)", path=path)
    return TraceReader(path, recover=recover)
