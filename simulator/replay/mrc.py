"""Miss-ratio curves: misses for every buffer size, in one pass where the semantics allow it.

Sequential LRU is a stack algorithm (Mattson et al., 1970): a buffer of C slots holds exactly
the C most recently used positions, so one pass that records each access's stack distance (a
Fenwick tree over access times) gives the misses of every size at once. That holds for
``--initial empty`` while no step takes the fast path (every ctx_len above the largest size):
a prefix-filled buffer is not the top of one LRU stack (size C holds positions 0..C-1 with 0
oldest; size C+1 would drop position 0 first), and the fast path resets the buffer at a point
that depends on the size.

HiSparse's batched order is not a stack algorithm: a step's misses rank below its hits, and
which entries miss depends on the size, so the recency order differs between sizes (with 2
slots an entry can end below another that it ends above with 3: ``tests/test_mrc.py``) and no
single LRU stack, hence no stack-distance pass, describes every size. Contents still nested (a
larger buffer held everything a smaller one did) in every case of a randomized search, so the
curve falls with size in practice, but the command replays batched LRU size by size, as it does
every other policy, on a grid of sizes.

OPT (Belady) is a stack algorithm under both step rules and either initial buffer (its priority,
the next use, does not depend on the size; ``opt_stack.py`` has the argument and the update), so
one pass of ``native.opt_stack_hist`` gives its misses at every size where no step takes the
fast path. Without the compiled module OPT is replayed size by size (the plain reference,
``opt_stack.opt_stack_histogram``, is for tests: it walks the whole stack every step).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import native
from ..trace.sources import CodedSource
from ..trace.stream import Stream
from .api import replay
from .config import Initial, ReplayConfig, Semantics
from .policies import Policy

if TYPE_CHECKING:  # pandas loads only for the frame: `hisparse mrc`'s table needs none (a third of a second)
    import pandas as pd


def one_pass_applies(cfg: ReplayConfig, min_ctx: int, max_buffer: int) -> bool:
    """True when stack depths give the exact misses of every size (see the module doc): no step
    takes the fast path at any size, and sequential LRU from an empty buffer, or OPT with the
    compiled module built."""
    if min_ctx <= max_buffer:
        return False
    if cfg.policy is Policy.LRU:
        return cfg.semantics is Semantics.SEQUENTIAL and cfg.initial is Initial.EMPTY
    return cfg.policy is Policy.OPT and native.available()


def _add_histogram(hist: np.ndarray, rows, steps: int, width: int, ctx_len, cfg: ReplayConfig,
                   min_size: int = 1) -> None:
    """hist[d] += the accesses at stack depth d of one stream's rows (int32 [steps, width],
    int64 ctx_len; numpy arrays or buffers), hist[0] the cold ones and those past the largest
    size. LRU: in C (``native.lru_stack_hist``), else the numba reference (``mrc_jit``); OPT: in C
    (``native.opt_stack_hist``; ``one_pass_applies`` asks for it), exact for sizes >= ``min_size``
    only (the depths above it are one set: hist[min_size] counts them)."""
    if cfg.policy is Policy.OPT:
        native._native.opt_stack_hist(rows, steps, width, ctx_len, cfg.reserve_newest, cfg.prefix, cfg.batched,
                                      min_size, len(hist) - 1, hist)
        return
    if native.available():
        native._native.lru_stack_hist(rows, steps, width, ctx_len, cfg.reserve_newest, len(hist) - 1, hist)
        return
    from .mrc_jit import stack_distance_histogram

    hist += stack_distance_histogram(np.frombuffer(rows, dtype=np.int32).reshape(steps, width),
                                     np.frombuffer(ctx_len, dtype=np.int64), cfg.reserve_newest, len(hist) - 1)


def stack_misses(streams: Iterable[Stream], sizes: np.ndarray, cfg: ReplayConfig,
                 workers: int = 1) -> tuple[np.ndarray, int]:
    """Misses of ``cfg``'s policy and step rules at each size (one pass per stream, ``workers``
    streams at a time; the caller checks ``one_pass_applies``) and the access count."""

    def work(s: Stream) -> tuple[np.ndarray, int]:
        rows = np.ascontiguousarray(s.indices, dtype=np.int32)
        return _stream_hist(sizes, cfg, rows, *rows.shape, np.ascontiguousarray(s.ctx_len, dtype=np.int64)), s.accesses

    return _summed(streams, work, sizes, workers)


def _stream_hist(sizes: np.ndarray, cfg: ReplayConfig, rows, steps: int, width: int, ctx_len) -> np.ndarray:
    hist = np.zeros(int(sizes.max()) + 1, dtype=np.int64)
    _add_histogram(hist, rows, steps, width, ctx_len, cfg, int(sizes.min()))
    return hist


def _summed(items, work, sizes: np.ndarray, workers: int) -> tuple[np.ndarray, int] | None:
    """The histograms of ``work(item)`` (each a histogram and an access count, or None: give up)
    summed, on ``workers`` threads (the compiled passes release the GIL); misses at each size."""
    from ..thread_pool import run_in_order

    total = np.zeros(int(sizes.max()) + 1, dtype=np.int64)
    accesses, clean = 0, True

    def collect(job) -> None:
        nonlocal accesses, clean
        done = job.result()
        if done is None:
            clean = False
        elif clean:
            np.add(total, done[0], out=total)
            accesses += int(done[1])

    run_in_order(items, max(1, workers), 2 * max(1, workers), lambda pool, item: pool.submit(work, item), collect)
    return (_misses_at(total, sizes), accesses) if clean else None


def lru_stack_misses(streams: Iterable[Stream], sizes: np.ndarray, reserve: bool) -> tuple[np.ndarray, int]:
    """Sequential LRU misses from an empty buffer at each size (one pass per stream) and the access count."""
    cfg = ReplayConfig(policy=Policy.LRU, semantics=Semantics.SEQUENTIAL, initial=Initial.EMPTY,
                       reserve_newest=reserve)
    return stack_misses(streams, sizes, cfg)


def _coded_stack_misses(source: CodedSource, keys, sizes: np.ndarray, cfg: ReplayConfig, k: int,
                        workers: int = 1) -> tuple[np.ndarray, int] | None:
    """``stack_misses`` of a ``.hst`` source's streams, their rows decoded and checked in C
    (``backend.coded_rows``, each thread into its own buffer); None when a chunk is not clean
    (the caller reads the streams the ordinary way, which raises the error)."""
    import threading

    from . import backend

    local = threading.local()

    def work(chunks) -> tuple[np.ndarray, int] | None:
        into = local.__dict__.setdefault("into", bytearray())
        rows = backend.coded_rows(chunks, k, into)
        if rows is None:
            return None
        hist = _stream_hist(sizes, cfg, rows.rows, rows.steps, rows.width, rows.ctx_len)
        accesses = rows.accesses
        del rows  # its view of ``into``, which the next stream may grow
        return hist, accesses

    return _summed((source.coded_chunks(key) for key in keys), work, sizes, workers)


def _misses_at(hist: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Misses at each size from a stack-distance histogram."""
    # misses(C) = cold + distances > C
    beyond = hist[0] + (hist[1:].sum() - np.cumsum(hist[1:]))  # index C-1 -> size C
    return beyond[sizes - 1]


def miss_ratio_curve(source: Any, cfg: ReplayConfig, sizes: Sequence[int], *, k: int | None = None,
                     min_ctx: int | None = None, workers: int = 2,
                     progress: bool = False) -> tuple[pd.DataFrame, str]:
    """Misses at each size for one policy; returns (curve, method) with method "one-pass" or
    "per-size". ``source`` is what ``replay`` takes, iterable again for each pass (a trace
    source, a list of streams); ``min_ctx`` (default: read from it) is its smallest ctx_len.
    ``progress`` shows a bar over the streams (per-size: every size of a stream replays on the
    ``workers`` threads, the compiled loops releasing the GIL). ``curve_records`` without pandas."""
    import pandas as pd

    records, method = curve_records(source, cfg, sizes, k=k, min_ctx=min_ctx, workers=workers, progress=progress)
    return pd.DataFrame(records, columns=list(CURVE_COLUMNS)), method


CURVE_COLUMNS = ("policy", "buffer", "accesses", "misses", "semantics", "miss_ratio")


def curve_records(source: Any, cfg: ReplayConfig, sizes: Sequence[int], *, k: int | None = None,
                  min_ctx: int | None = None, workers: int = 2,
                  progress: bool = False) -> tuple[list[dict[str, Any]], str]:
    """``miss_ratio_curve`` as one record (``CURVE_COLUMNS``, plain Python values) per size."""
    sizes = np.asarray(sorted(set(int(s) for s in sizes)), dtype=np.int64)
    if min_ctx is None:
        min_ctx = min((int(s.ctx_len.min()) for s in source if s.steps), default=0)
    if one_pass_applies(cfg, min_ctx, int(sizes.max())):
        wrap = lambda it: it  # noqa: E731
        if progress:
            from ..progress import progress as bar

            def wrap(it):
                return bar(it, total=len(source) if hasattr(source, "__len__") else None,
                           desc=f"{cfg.policy} one-pass", unit="stream")
        done = None
        if native.available() and isinstance(source, CodedSource):
            done = _coded_stack_misses(source, wrap(source.keys), sizes, cfg, source.meta.k if k is None else k,
                                       workers)
        misses, accesses = done if done is not None else stack_misses(wrap(iter(source)), sizes, cfg, workers)
        rows = [(int(b), int(accesses), int(m)) for b, m in zip(sizes, misses, strict=True)]
        method = "one-pass"
    else:
        summary = replay(source, [replace(cfg, buffer=int(b)) for b in sizes], k=k, workers=workers,
                         progress=progress).records
        rows = [(r["buffer"], r["accesses"], r["misses"]) for r in summary]
        method = "per-size"
    return [{"policy": str(cfg.policy), "buffer": b, "accesses": a, "misses": m, "semantics": str(cfg.semantics),
             "miss_ratio": m / (a if a > 0 else 1)} for b, a, m in rows], method
