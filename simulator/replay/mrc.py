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
OPT and every other policy, on a grid of sizes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd
from numba import njit

from ..trace.stream import Stream
from .api import replay
from .config import Initial, ReplayConfig, Semantics
from .policies import Policy


@njit(cache=True, nogil=True)
def _stack_distance_histogram(indices, ctx_len, reserve, max_size):  # pragma: no cover - compiled
    """hist[d] = accesses with LRU stack distance d (1..max_size); hist[0] counts cold misses and
    distances above max_size."""
    steps, width = indices.shape
    n = 0
    cmax = 1
    for t in range(steps):
        cmax = max(cmax, ctx_len[t])
        for j in range(width):
            if indices[t, j] >= 0:
                n += 1
    tree = np.zeros(n + 1, dtype=np.int64)  # Fenwick over access times (1-based)
    last = np.zeros(cmax, dtype=np.int64)  # latest access time of each position, 0 = never
    hist = np.zeros(max_size + 1, dtype=np.int64)
    now = 0
    live = 0
    for t in range(steps):
        newest = ctx_len[t] - 1
        for j in range(width):
            p = indices[t, j]
            if p < 0:
                break
            if reserve and p == newest:
                continue
            now += 1
            prev = last[p]
            if prev == 0:
                hist[0] += 1
            else:
                # distinct positions touched after prev = live marks in (prev, now)
                s = 0
                i = now - 1
                while i > 0:
                    s += tree[i]
                    i -= i & -i
                i = prev
                while i > 0:
                    s -= tree[i]
                    i -= i & -i
                d = s + 1
                if d > max_size:
                    hist[0] += 1
                else:
                    hist[d] += 1
                i = prev
                while i <= n:
                    tree[i] -= 1
                    i += i & -i
                live -= 1
            i = now
            while i <= n:
                tree[i] += 1
                i += i & -i
            live += 1
            last[p] = now
    return hist


def one_pass_applies(cfg: ReplayConfig, min_ctx: int, max_buffer: int) -> bool:
    """True when stack distances give the exact misses of every size (see the module doc)."""
    return (cfg.policy is Policy.LRU and cfg.semantics is Semantics.SEQUENTIAL and cfg.initial is Initial.EMPTY
            and min_ctx > max_buffer)


def lru_stack_misses(streams: Iterable[Stream], sizes: np.ndarray, reserve: bool) -> tuple[np.ndarray, int]:
    """Sequential LRU misses at each size (one pass per stream) and the access count."""
    max_size = int(sizes.max())
    hist = np.zeros(max_size + 1, dtype=np.int64)
    accesses = 0
    for s in streams:
        hist += _stack_distance_histogram(np.ascontiguousarray(s.indices, dtype=np.int32),
                                          s.ctx_len.astype(np.int64), reserve, max_size)
        accesses += s.accesses
    # misses(C) = cold + distances > C
    beyond = hist[0] + (hist[1:].sum() - np.cumsum(hist[1:]))  # index C-1 -> size C
    return beyond[sizes - 1], accesses


def miss_ratio_curve(source: Any, cfg: ReplayConfig, sizes: Sequence[int], *, k: int | None = None,
                     min_ctx: int | None = None, workers: int = 2,
                     progress: bool = False) -> tuple[pd.DataFrame, str]:
    """Misses at each size for one policy; returns (curve, method) with method "one-pass" or
    "per-size". ``source`` is what ``replay`` takes, iterable again for each pass (a trace
    source, a list of streams); ``min_ctx`` (default: read from it) is its smallest ctx_len.
    ``progress`` shows a bar over the streams (per-size: every size of a stream replays on the
    ``workers`` threads, the compiled loops releasing the GIL)."""
    sizes = np.asarray(sorted(set(int(s) for s in sizes)), dtype=np.int64)
    if min_ctx is None:
        min_ctx = min((int(s.ctx_len.min()) for s in source if s.steps), default=0)
    if one_pass_applies(cfg, min_ctx, int(sizes.max())):
        streams = iter(source)
        if progress:
            from ..progress import progress as bar

            streams = bar(streams, total=len(source) if hasattr(source, "__len__") else None,
                          desc=f"{cfg.policy} one-pass", unit="stream")
        misses, accesses = lru_stack_misses(streams, sizes, cfg.reserve_newest)
        curve = pd.DataFrame({"policy": str(cfg.policy), "buffer": sizes, "accesses": accesses,
                              "misses": misses})
        method = "one-pass"
    else:
        summary = replay(source, [replace(cfg, buffer=int(b)) for b in sizes], k=k, workers=workers,
                         progress=progress).summary
        curve = summary[["policy", "buffer", "accesses", "misses"]].copy()
        method = "per-size"
    curve["semantics"] = str(cfg.semantics)
    curve["miss_ratio"] = curve["misses"] / curve["accesses"].where(curve["accesses"] > 0, 1)
    return curve.reset_index(drop=True), method
