"""Optional compiled fast paths (``_native.c``), built by ``pip install`` when a C compiler is there.

Each function reproduces a numba reference of the package bit for bit (tests/test_native.py):
the stream decoder and checker of ``simulator.trace.codec_jit``, and the replay engine's
batched and sequential LRU and sequential OPT and LFU. They keep numba out of ``hisparse replay``'s start-up, replay batched LRU in
O(changes) per step, and replay a coded ``.hst`` chunk without materialising its rows, in two
halves on two threads (a chunk decoded into its step changes while the one before replays).
Without the build, or with ``HISPARSE_NATIVE=0``, callers use the references.

The C functions fill caller-owned int64 buffers; the wrappers here hand back numpy arrays (or
plain ints), so nothing past this module sees a C buffer. The one exception to loading numpy is
``lru_replay_chunks`` without ``per_step``: ``hisparse replay``'s summary needs only totals, and
its start-up does not pay for numpy (tests/test_native.py checks that).
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:  # numpy loads on first use: the CLI's fast path never needs it
    import numpy as np


try:
    from . import _native
except ImportError:  # not built (no compiler at install time)
    _native = None


def available() -> bool:
    """Whether the compiled module is built and not switched off (HISPARSE_NATIVE=0)."""
    return _native is not None and os.environ.get("HISPARSE_NATIVE", "1") != "0"


def unstore(payload: bytes | memoryview, out: bytearray | None = None) -> int:
    """A zlib payload of stored deflate blocks only: its data's size (copied into ``out``); -1 when
    a block is compressed, -2 when the framing is broken (``format.CodedChunk.coded``)."""
    return _native.unstore(payload, out)


def decode(raw: np.ndarray | bytes, steps: int, width: int, ordered: bool, out: np.ndarray,
           ctx_out: np.ndarray, *, coding: int = 3) -> tuple[int, int]:
    """codec_jit.decode (coding 2) or decode3 (coding 3): fill out (int32 [steps, >= width],
    C-contiguous) and ctx_out (int64)."""
    import numpy as np
    if out.dtype != np.int32 or ctx_out.dtype != np.int64 or not out.flags.c_contiguous \
            or not ctx_out.flags.c_contiguous or out.shape[0] != steps or ctx_out.shape != (steps,):
        raise ValueError("decode: out must be C-contiguous int32 [steps, w], ctx_out int64 [steps]")
    return _native.decode(raw, steps, width, ordered, out, out.shape[1], ctx_out, coding)


def check_rows(indices: np.ndarray, ctx_len: np.ndarray, k: int) -> tuple[int, int, int, int]:
    """codec_jit.check_rows on int32-valued indices: the first problem as (code, step, value, extra)."""
    import numpy as np
    idx = np.ascontiguousarray(indices, dtype=np.int32)
    return _native.check_rows(idx, idx.shape[0], idx.shape[1], np.ascontiguousarray(ctx_len, dtype=np.int64), int(k))


class LruRun(NamedTuple):
    misses: np.ndarray  # int64 [steps]
    slot_pos: np.ndarray  # int64 [B]: position held by each slot at the end (-1: free)
    order: np.ndarray  # int64: recency order of occupied slots, oldest first
    slots: np.ndarray | None  # int32 [steps, width] when recorded


class BatchedLru:
    """One (request, layer) buffer under HiSparse's batched LRU, fed a stream piece by piece."""

    def __init__(self, buffer: int, *, reserve: bool, prefix: bool) -> None:
        self.buffer = int(buffer)
        self.key = (self.buffer, bool(reserve), bool(prefix))
        self.state = _native.lru_new(self.buffer, reserve, prefix)

    def reset(self) -> None:
        """As new (same buffer and rules), keeping the memory its tables grew to."""
        _native.lru_reset(self.state)

    def rows(self, indices: np.ndarray, ctx_len: np.ndarray, *, record: bool = False) -> tuple[np.ndarray, np.ndarray | None]:
        """Replay rows [steps, width] (stored order, -1 pads): misses per step, and the slot of
        every entry (buffer: the reserved newest slot) when ``record``."""
        import numpy as np
        idx = np.ascontiguousarray(indices, dtype=np.int32)
        steps, width = idx.shape
        misses = np.zeros(steps, dtype=np.int64)
        slots = np.empty((steps, width) if record else (1, 1), dtype=np.int32)
        _native.lru_rows(self.state, idx, steps, width, np.ascontiguousarray(ctx_len, dtype=np.int64), misses,
                         record, slots)
        return misses, (slots if record else None)

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        """(slot -> position, recency order of occupied slots, oldest first)."""
        import numpy as np
        slot_pos = np.empty(self.buffer, dtype=np.int64)
        order = np.empty(self.buffer, dtype=np.int64)
        n = _native.lru_result(self.state, slot_pos, order)
        return slot_pos, order[:n].copy()


def lru_batched(indices: np.ndarray, ctx_len: np.ndarray, buffer: int, *, reserve: bool, prefix: bool,
                record: bool = False) -> LruRun:
    """The engine's batched LRU over one stream (engine.replay_policy('lru', batched=True))."""
    lru = BatchedLru(buffer, reserve=reserve, prefix=prefix)
    misses, slots = lru.rows(indices, ctx_len, record=record)
    return LruRun(misses, *lru.result(), slots)


def lru_sequential(indices: np.ndarray, ctx_len: np.ndarray, buffer: int, *, reserve: bool, prefix: bool,
                   record: bool = False) -> LruRun:
    """The engine's sequential LRU over one stream (engine.replay_policy('lru', batched=False)):
    one access at a time in stored order, in one compiled call (no numba on the path)."""
    import numpy as np
    idx = np.ascontiguousarray(indices, dtype=np.int32)
    steps, width = idx.shape
    misses = np.zeros(steps, dtype=np.int64)
    slots = np.empty((steps, width) if record else (1, 1), dtype=np.int32)
    slot_pos = np.empty(int(buffer), dtype=np.int64)
    order = np.empty(int(buffer), dtype=np.int64)
    n = _native.lru_seq_rows(idx, steps, width, np.ascontiguousarray(ctx_len, dtype=np.int64), int(buffer), reserve,
                             prefix, misses, record, slots, slot_pos, order)
    return LruRun(misses, slot_pos, order[:n].copy(), slots if record else None)


KEYED = {("opt", False): "opt_seq_rows", ("lfu", False): "lfu_seq_rows", ("opt", True): "opt_batched_rows",
         ("lfu", True): "lfu_batched_rows"}  # the C replay of each (policy, batched)


def keyed_sequential(policy: str, indices: np.ndarray, ctx_len: np.ndarray, buffer: int, *, reserve: bool,
                     prefix: bool, batched: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The engine's ``opt`` or ``lfu`` over one stream (engine.replay_policy(policy, batched=...);
    sequential unless ``batched``): (misses per step, slot -> position at the end), in one
    compiled call (no numba)."""
    import numpy as np
    fn = getattr(_native, KEYED[policy, batched])
    idx = np.ascontiguousarray(indices, dtype=np.int32)
    steps, width = idx.shape
    misses = np.zeros(steps, dtype=np.int64)
    slot_pos = np.empty(int(buffer), dtype=np.int64)
    fn(idx, steps, width, np.ascontiguousarray(ctx_len, dtype=np.int64), int(buffer), reserve, prefix, misses, slot_pos)
    return misses, slot_pos


def opt_sequential(indices: np.ndarray, ctx_len: np.ndarray, buffer: int, *, reserve: bool,
                   prefix: bool) -> tuple[np.ndarray, np.ndarray]:
    """``keyed_sequential('opt', ...)``: sequential Belady."""
    return keyed_sequential("opt", indices, ctx_len, buffer, reserve=reserve, prefix=prefix)


def lru_total(rows, steps: int, width: int, ctx_len, buffer: int, *, reserve: bool, prefix: bool,
              batched: bool) -> int:
    """Total misses of batched or sequential LRU over rows given as buffers (int32 [steps, width]
    C order, int64 ctx_len [steps]), without numpy: ``lru_batched`` / ``lru_sequential``."""
    misses = array("q", bytes(8 * steps))
    if batched:
        _native.lru_rows(_native.lru_new(int(buffer), reserve, prefix), rows, steps, width, ctx_len, misses, False,
                         bytearray(4))
    else:
        _native.lru_seq_rows(rows, steps, width, ctx_len, int(buffer), reserve, prefix, misses, False, bytearray(4),
                             bytearray(8 * int(buffer)), bytearray(8 * int(buffer)))
    return sum(misses)


def keyed_total(policy: str, rows, steps: int, width: int, ctx_len, buffer: int, *, reserve: bool,
                prefix: bool, batched: bool = False) -> int:
    """Total misses of ``opt`` or ``lfu`` over rows given as buffers, without numpy:
    ``keyed_sequential``."""
    fn = getattr(_native, KEYED[policy, batched])
    misses = array("q", bytes(8 * steps))
    fn(rows, steps, width, ctx_len, int(buffer), reserve, prefix, misses, bytearray(8 * int(buffer)))
    return sum(misses)


class Rows(NamedTuple):
    """A stream's rows decoded and checked in C, as plain buffers (no numpy)."""

    rows: memoryview  # int32 [steps, width] in C order, -1 pads
    ctx_len: array  # int64 [steps]
    steps: int
    width: int
    accesses: int


def coded_rows(chunks: Sequence[tuple[int, int, bool, Callable[[bytearray], bytes | None], int, int, int]], k: int,
               into: bytearray | None = None) -> Rows | None:
    """A stream given as coded chunks (steps, width, ordered, a function giving the coded bytes
    or None, the header's accesses (-1: not known) and ctx_last (0: not stored), the coding) decoded into rows in ``into``
    (grown as needed; a fresh buffer without it), every rule of the trace model checked as
    ``TraceReader.read`` checks it. None when a chunk is corrupt, breaks a rule or disagrees
    with its header: the caller reads the stream the ordinary way, which raises the error."""
    steps = sum(c[0] for c in chunks)
    width = max((c[1] for c in chunks), default=1)
    need = 4 * steps * width
    if into is None:
        into = bytearray(need)
    elif len(into) < need:
        into.extend(bytes(need - len(into)))
    rows = memoryview(into)[:need]
    ctx = array("q", bytes(8 * steps))
    scratch = bytearray()
    row, prev_ctx, accesses = 0, 0, 0
    for n, w, ordered, coded, acc, ctx_last, coding in chunks:
        raw = coded(scratch)
        if raw is None:
            return None
        code, _, got = _native.decode_rows_checked(raw, n, w, ordered, coding, int(k), prev_ctx,
                                                   rows[4 * row * width:], width, memoryview(ctx)[row:row + n])
        if code or (acc >= 0 and got != acc) or (ctx_last and n and ctx[row + n - 1] != ctx_last):
            return None
        row += n
        prev_ctx = ctx[row - 1] if n else prev_ctx
        accesses += got
    return Rows(rows, ctx, steps, width, accesses)


GROUP = 64  # states one lru_replay_coded call takes (MAX_STATES in _native.c)


class CodedLruRun(NamedTuple):
    """Batched LRU over one coded stream, for several buffers at once."""

    steps: int
    accesses: int
    totals: list[int]  # misses per buffer
    ctx_len: np.ndarray | None  # int64 [steps] (with per_step)
    misses: list[np.ndarray] | None  # int64 [steps] per buffer (with per_step)


class LruPool:
    """Batched-LRU states kept between the streams of one replay, reset instead of made anew: a
    fresh state's position table (one int32 pair per context position, ~0.8 MB at 100k tokens)
    costs its page faults again for every stream, more than replaying a 128-step stream. Shared
    by the replay's threads (a lock guards the free lists)."""

    def __init__(self) -> None:
        import threading
        self._free: dict[tuple[int, bool, bool], list[BatchedLru]] = {}
        self._lock = threading.Lock()

    def take(self, buffer: int, reserve: bool, prefix: bool) -> BatchedLru:
        with self._lock:
            free = self._free.get((int(buffer), bool(reserve), bool(prefix)))
            lru = free.pop() if free else None
        if lru is None:
            return BatchedLru(buffer, reserve=reserve, prefix=prefix)
        lru.reset()
        return lru

    def give(self, lrus: Sequence[BatchedLru]) -> None:
        with self._lock:
            for x in lrus:
                self._free.setdefault(x.key, []).append(x)


def lru_replay_chunks(chunks: Sequence[tuple[int, int, bool, Callable[[bytearray], bytes | None], int, int, int]],
                      buffers: Sequence[tuple[int, bool, bool]], k: int, *, per_step: bool,
                      pool: LruPool | None = None) -> CodedLruRun | None:
    """The engine's batched LRU over one stream given as coded chunks (steps, width, ordered, a
    function giving the coded bytes or None, taking a bytearray it may inflate into: e.g.
    ``CodedChunk.coded``; the coding, ``codec.CODING_OF_VERSION``; the header's accesses, -1
    when not known, and ctx_last, 0 when not stored), for each (buffer, reserve, prefix): one decoding pass per 64
    buffers, the states taken from ``pool`` (and given back) when one is passed. None when a
    chunk is corrupt, breaks a rule of the trace model or disagrees with its header: the caller
    reads the stream the ordinary way, which raises the error with its context.

    Each chunk is inflated and decoded into its step changes (``decode_changes``), then replayed
    (``lru_apply_changes``); both release the GIL. With a second CPU the next chunk is decoded on
    a second thread while the current one replays; a process allowed one CPU runs the halves in
    turn. The results are the same either way (tests/test_native.py)."""
    steps = sum(c[0] for c in chunks)
    ctx = array("q", bytes(8 * steps))
    misses = [array("q", bytes(8 * steps)) for _ in buffers]
    taken: list[BatchedLru] = []
    try:
        return _replay_groups(chunks, buffers, k, per_step, pool, steps, ctx, misses, _cpus() > 1, taken)
    finally:
        if pool is not None:
            pool.give(taken)


def _replay_groups(chunks, buffers, k, per_step, pool, steps, ctx, misses, ahead, taken) -> CodedLruRun | None:
    """lru_replay_chunks' body: 64 buffers at a time (states from ``pool`` when given, each
    appended to ``taken``)."""
    accesses = 0
    for g in range(0, len(buffers), GROUP):
        lrus = [pool.take(b, r, p) if pool is not None else BatchedLru(b, reserve=r, prefix=p)
                for b, r, p in buffers[g:g + GROUP]]
        taken.extend(lrus)
        accesses = _replay_changes(chunks, tuple(x.state for x in lrus), misses[g:g + GROUP],
                                   tuple(x.buffer for x in lrus), k, ctx, ahead)
        if accesses is None:
            return None
    totals = [sum(m) for m in misses]
    if not per_step:
        return CodedLruRun(steps, accesses, totals, None, None)
    import numpy as np
    return CodedLruRun(steps, accesses, totals, np.frombuffer(ctx, dtype=np.int64),
                       [np.frombuffer(m, dtype=np.int64) for m in misses])


def _cpus() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _replay_changes(chunks: Sequence[tuple[int, int, bool, Callable[[bytearray], bytes | None], int, int, int]],
                    states: tuple,
                    outs: list[array], bufs: tuple[int, ...], k: int, ctx: array, ahead: bool) -> int | None:
    """Chunks through ``states``: each inflated and decoded into one of two changes buffers,
    chunk i + 1 on a second thread while chunk i's buffer replays here when ``ahead``. The
    accesses, or None when a chunk is not clean. A chunk's maker takes a bytearray it may inflate
    into."""
    spaces = (_native.changes_new(), _native.changes_new())
    starts = [0]
    for c in chunks:
        starts.append(starts[-1] + c[0])

    into = (bytearray(), bytearray())  # what stored payloads are copied into, reused

    def make(i: int) -> int | None:  # the makers run one after another, in chunk order
        n, width, ordered, coded, coding, header_acc, ctx_last = chunks[i]
        raw = coded(into[i % 2])
        if raw is None:
            return None
        row = starts[i]
        prev_ctx = ctx[row - 1] if row else 0  # written by chunk i - 1's maker
        code, _, acc = _native.decode_changes(spaces[i % 2], raw, n, width, ordered, coding, int(k), prev_ctx, bufs,
                                              memoryview(ctx)[row:row + n])
        if code or (header_acc >= 0 and acc != header_acc) or (ctx_last and n and ctx[row + n - 1] != ctx_last):
            return None  # corrupt, or disagrees with its header (TraceReader.read refuses both)
        return acc

    accesses = 0
    makers = [lambda i=i: make(i) for i in range(len(chunks))]
    for i, acc in enumerate(_ahead(makers) if ahead else (make() for make in makers)):
        if acc is None:
            return None
        row, end = starts[i], starts[i + 1]
        _native.lru_apply_changes(states, tuple(memoryview(m)[row:end] for m in outs), spaces[i % 2], end - row,
                                  memoryview(ctx)[row:end])
        accesses += acc
    return accesses


def _ahead(makers: Sequence[Callable[[], bytes | None]]) -> Iterator[bytes | None]:
    """Each maker's result in order, the next one running on a second thread while the caller
    works on the current one. zlib releases the GIL while it inflates and the C replay releases
    it while it runs, so with a free core the inflating (a third of a churning replay's CPU
    time) hides behind the replay; the results are the same either way."""
    if len(makers) < 2:
        yield from (make() for make in makers)
        return
    # not imported with the module: the .npy path needs no threads
    from ..thread_pool import ThreadPool

    with ThreadPool(1, name="inflate") as pool:
        ahead = pool.submit(makers[0])
        for i in range(len(makers)):
            current = ahead.result()
            if i + 1 < len(makers):
                ahead = pool.submit(makers[i + 1])
            yield current
