"""Compact coding of one stream's steps, and the checks every stream passes.

Each step is coded against the previous one (ctx_len delta, the ranks of the previous step's
entries that left, the gaps between the positions that arrived), the symbols are written as
LEB128 varints and the bytes compressed with zlib. On traces whose adjacent steps overlap by 90%,
that is well under one byte per access. Ordered streams (rows not sorted) also store each entry's
rank within its sorted row, so the stored order round-trips exactly.

The loops are compiled: the numba references in ``codec_jit.py``, or the C versions of
``simulator.native`` for decoding and checking when built (no numba import on the read path).
"""

from __future__ import annotations

import zlib
from typing import TYPE_CHECKING

from .. import native
from ..errors import TraceError
from .problems import DECODE_MESSAGES, ROW_MESSAGES, DecodeProblem, RowProblem

if TYPE_CHECKING:  # numpy loads on first use: the CLI's fast path never needs it
    import numpy as np

def _first_problem(indices: np.ndarray, ctx_len: np.ndarray, k: int) -> tuple[int, int, int, int]:
    import numpy as np
    if native.available() and (indices.dtype == np.int32 or not indices.size
                               or (indices.min() >= -2**31 and indices.max() < 2**31)):
        return native.check_rows(indices, ctx_len, k)
    from . import codec_jit

    return codec_jit.check_rows(indices, np.ascontiguousarray(ctx_len, dtype=np.int64), k)


def check_stream(indices: np.ndarray, ctx_len: np.ndarray, k: int) -> None:
    """Raise TraceError (with the step) if the stream breaks a rule of the trace model."""
    if indices.ndim != 2:
        raise TraceError(f"indices must be 2-D [steps, k], got shape {indices.shape}")
    if ctx_len.shape != (indices.shape[0],):
        raise TraceError(f"ctx_len has shape {ctx_len.shape}, expected ({indices.shape[0]},)")
    code, step, value, extra = _first_problem(indices, ctx_len, k)
    if code:
        raise TraceError(ROW_MESSAGES[RowProblem(code)].format(value=value, extra=extra), step=int(step))


# How a payload's coded steps are compressed: the zlib level for each name. Both are zlib
# streams, so every reader reads both; "stored" (deflate's uncompressed blocks) is larger but is
# copied out, where zlib inflates at ~170-250 MB/s of output whatever level wrote it: on the
# bundled glm51-longbench trace in coding 3, inflating costs more CPU than decoding the steps
# (traces/README.md). "auto" (the default) keeps a chunk's zlib stream only where it saves at
# least AUTO_SAVING of the bytes, and stores the chunk otherwise: churning synthetic traces
# (zlib saves ~15%) are stored, recorded ones (30-40%) stay compressed.
COMPRESSION_LEVELS = {"zlib": 6, "stored": 0}
COMPRESSIONS = ("auto", *COMPRESSION_LEVELS)
AUTO_SAVING = 0.25


# How steps are coded, by the format version that writes them: 2 (versions 1 and 2) names a
# step's leavers by their ranks in the previous sorted row; 3 by their places in the decoder's
# slot array (``codec_jit.encode3``), so that replaying the changes needs no sorted row.
CODING_OF_VERSION = {1: 2, 2: 2, 3: 3}


def compress(coded: bytes, compression: str) -> bytes:
    """A payload: ``coded`` as a zlib stream, compressed or stored (COMPRESSIONS)."""
    if compression != "auto":
        return zlib.compress(coded, COMPRESSION_LEVELS[compression])
    packed = zlib.compress(coded, COMPRESSION_LEVELS["zlib"])
    return packed if len(packed) <= (1 - AUTO_SAVING) * len(coded) else zlib.compress(coded, 0)


def encode_stream(indices: np.ndarray, ctx_len: np.ndarray, *, keep_order: bool,
                  compression: str = "auto", coding: int = 3) -> tuple[bytes, bool]:
    """Compress a checked stream. Returns (payload, ordered): ordered is False when every row
    is already ascending or when keep_order is False (rows are then stored sorted).
    ``compression`` is one of COMPRESSIONS, ``coding`` a value of CODING_OF_VERSION."""
    import numpy as np
    counts = (indices >= 0).sum(axis=1).astype(np.int64)
    keyed = np.where(indices >= 0, indices, np.iinfo(np.int32).max).astype(np.int64)
    order = np.argsort(keyed, axis=1, kind="stable")
    sorted_rows = np.take_along_axis(keyed, order, axis=1)
    ordered = bool(keep_order and (order != np.arange(indices.shape[1])).any())
    ranks = np.argsort(order, axis=1).astype(np.int64) if ordered else np.zeros((1, 1), np.int64)
    ctx = ctx_len.astype(np.int64)
    from .codec_jit import encode, encode3

    _encode = encode3 if coding == 3 else encode
    empty = np.zeros(0, dtype=np.uint8)
    size = _encode(sorted_rows, ranks, counts, ctx, ordered, empty, False)
    buf = np.empty(size, dtype=np.uint8)
    _encode(sorted_rows, ranks, counts, ctx, ordered, buf, True)
    return compress(buf.tobytes(), compression), ordered


def decode_stream(payload: bytes, steps: int, width: int, ordered: bool,
                  out: np.ndarray | None = None, ctx_out: np.ndarray | None = None, *,
                  max_coded: int | None = None, coding: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of encode_stream: (indices int32 [steps, width], ctx_len int64 [steps]).

    ``out``/``ctx_out`` may be slices of a larger array (rows of a multi-chunk stream), decoded
    in place so that a long stream is never copied. ``max_coded`` (the bound a chunk header
    gives, ``format.coded_bound``): the payload is inflated no further than that."""
    import numpy as np
    try:
        if max_coded is None:
            raw = np.frombuffer(zlib.decompress(payload), dtype=np.uint8)
        else:
            inflater = zlib.decompressobj()
            data = inflater.decompress(payload, max_coded + 1)
            if len(data) > max_coded:
                raise TraceError(f"corrupt stream data (it inflates past {max_coded} bytes, the most the "
                                 "chunk header's steps and accesses allow)")
            if not inflater.eof:
                raise zlib.error("incomplete or truncated stream")
            raw = np.frombuffer(data, dtype=np.uint8)
    except zlib.error as exc:
        raise TraceError(f"corrupt stream data ({exc})") from None
    out = np.empty((steps, width), dtype=np.int32) if out is None else out
    ctx = np.empty(steps, dtype=np.int64) if ctx_out is None else ctx_out
    if native.available() and out.dtype == np.int32 and out.flags.c_contiguous and ctx.flags.c_contiguous:
        code, step = native.decode(raw, steps, width, ordered, out, ctx, coding=coding)
    else:
        from .codec_jit import decode, decode3

        code, step = (decode3 if coding == 3 else decode)(raw, steps, width, ordered, out, ctx)
    if code:
        problem = DecodeProblem(code)
        raise TraceError(f"corrupt stream data: {DECODE_MESSAGES[problem]}",
                         step=None if problem is DecodeProblem.TRAILING_BYTES else int(step))
    return out, ctx
