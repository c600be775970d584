"""Which code replays what: the one place that chooses the compiled C path or the numba engine.

- ``none`` and ``static-prefix`` hold no replacement state: their misses are counted directly
  (``static-prefix`` from an empty initial buffer loads each pinned position once).
- Batched LRU runs in C when ``simulator.native`` is built (O(changes) per step, checked bit for
  bit against the engine in tests/test_native.py): from a coded source's chunks without
  materialising a row (``coded_misses``: a 41 M-access stream costs a few MB instead of 164 MB,
  and no numpy is loaded), or over a stream's rows.
- Sequential LRU, and OPT and LFU in either semantics, run in C over a stream's rows when built
  (``native.lru_sequential``, ``native.keyed_sequential``, checked bit for bit against the engine
  in tests/test_native.py); from a coded source without per-step output, the rows are decoded
  and checked in C too (``coded_rows``: no numpy).
- Everything else runs in the numba engine (``engine.replay_policy``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from .. import native
from ..trace.sources import CodedSource
from .config import ReplayConfig
from .policies import Policy

if TYPE_CHECKING:  # numpy loads on first use: the CLI's fast path never needs it
    import numpy as np

    from ..trace.format import CodedChunk
    from ..trace.stream import Stream


def _native_lru(cfg: ReplayConfig) -> bool:
    return cfg.policy is Policy.LRU and cfg.batched and native.available()


def uses_coded_path(source: object, configs: Sequence[ReplayConfig]) -> bool:
    """Whether every config is batched LRU, C is built and the source offers coded chunks."""
    return bool(configs) and all(_native_lru(c) for c in configs) and isinstance(source, CodedSource)


def uses_raw_path(source: object, configs: Sequence[ReplayConfig]) -> bool:
    """Whether every config is LRU (either semantics), C is built and the source offers its rows
    as a plain int32 buffer (``NpyTrace.raw_rows``)."""
    return bool(configs) and getattr(source, "raw_rows", None) is not None and native.available() \
        and all(c.policy is Policy.LRU for c in configs)


def _native_rows(cfg: ReplayConfig) -> bool:
    """A config the C replays take from a stream's rows as plain buffers: LRU, OPT and LFU, in
    either semantics."""
    return native.available() and cfg.policy in (Policy.LRU, Policy.OPT, Policy.LFU)


def uses_coded_rows_path(source: object, configs: Sequence[ReplayConfig]) -> bool:
    """Whether every config runs in C on rows (``_native_rows``) and the source offers coded
    chunks: its streams are then decoded and checked in C (``coded_rows``), no numpy loaded.
    (All batched LRU takes ``uses_coded_path`` first: the changes, not the rows.)"""
    return bool(configs) and all(_native_rows(c) for c in configs) and isinstance(source, CodedSource)


def coded_rows(chunks: Sequence[CodedChunk], k: int, into: bytearray | None = None) -> native.Rows | None:
    """One stream's rows decoded and checked in C from its coded chunks (into ``into``, reused);
    None when a chunk is not clean (read the stream the ordinary way to get the error)."""
    return native.coded_rows([(c.steps, c.width, c.ordered, c.coded, c.accesses, c.ctx_last, c.coding)
                              for c in chunks], k, into)


def rows_misses(rows: native.Rows, cfg: ReplayConfig) -> int:
    """Total misses of one stream's rows (``coded_rows``) under a config ``_native_rows`` takes."""
    if cfg.policy is Policy.LRU:
        return native.lru_total(rows.rows, rows.steps, rows.width, rows.ctx_len, cfg.buffer,
                                reserve=cfg.reserve_newest, prefix=cfg.prefix, batched=cfg.batched)
    return native.keyed_total(str(cfg.policy), rows.rows, rows.steps, rows.width, rows.ctx_len, cfg.buffer,
                              reserve=cfg.reserve_newest, prefix=cfg.prefix, batched=cfg.batched)


def raw_misses(rows, steps: int, width: int, ctx_len, cfg: ReplayConfig) -> int:
    """Total LRU misses of one stream given as an int32 rows buffer and an int64 ctx_len buffer."""
    return native.lru_total(rows, steps, width, ctx_len, cfg.buffer, reserve=cfg.reserve_newest, prefix=cfg.prefix,
                            batched=cfg.batched)


def coded_misses(chunks: Sequence[CodedChunk], configs: Sequence[ReplayConfig], k: int, *,
                 per_step: bool, pool: native.LruPool | None = None) -> native.CodedLruRun | None:
    """Batched LRU of one stream, given as its coded chunks, under each config (states from
    ``pool``, reused between streams); None when a chunk is not clean (read the stream the
    ordinary way to get the error)."""
    return native.lru_replay_chunks([(c.steps, c.width, c.ordered, c.coded, c.coding, c.accesses, c.ctx_last)
                                     for c in chunks],
                                    [(c.buffer, c.reserve_newest, c.prefix) for c in configs], k, per_step=per_step,
                                    pool=pool)


def _stateless_misses(cfg: ReplayConfig, stream: Stream) -> np.ndarray:
    """``none`` loads every selected entry; ``static-prefix`` pins positions [0, buffer) and loads
    every entry past them. The pinned prefix is the initial buffer's: ``--initial empty`` starts
    without it, so from the first step until a fast-path step (which leaves the buffer holding
    [0, buffer), as for every policy) a prefix position misses once, at its first read."""
    import numpy as np
    idx = stream.indices
    counted = idx >= 0
    if cfg.reserve_newest:
        counted &= idx != (stream.ctx_len - 1)[:, None]
    if cfg.policy is not Policy.STATIC_PREFIX:
        return counted.sum(axis=1).astype(np.int64)
    misses = (counted & (idx >= cfg.buffer)).sum(axis=1).astype(np.int64)
    fast = stream.ctx_len <= cfg.buffer
    if cfg.prefix or not len(fast) or fast[0]:
        return misses
    end = int(fast.argmax()) if fast.any() else len(fast)  # the first fast step refills the prefix
    pinned = counted[:end] & (idx[:end] < cfg.buffer)
    steps = np.nonzero(pinned)[0]  # row-major: the stored order of the reads
    _, first = np.unique(idx[:end][pinned], return_index=True)
    misses[:end] += np.bincount(steps[first], minlength=end)
    return misses


def stream_misses(stream: Stream, cfg: ReplayConfig) -> np.ndarray:
    """Misses at every step of one stream (int64 [steps]); the config is already checked."""
    if not cfg.stateful:
        return _stateless_misses(cfg, stream)
    if _native_lru(cfg):
        return native.lru_batched(stream.indices, stream.ctx_len, cfg.buffer, reserve=cfg.reserve_newest,
                                  prefix=cfg.prefix).misses
    if cfg.policy is Policy.LRU and native.available():  # sequential: one compiled call, no numba
        return native.lru_sequential(stream.indices, stream.ctx_len, cfg.buffer, reserve=cfg.reserve_newest,
                                     prefix=cfg.prefix).misses
    if cfg.policy in (Policy.OPT, Policy.LFU) and native.available():
        return native.keyed_sequential(str(cfg.policy), stream.indices, stream.ctx_len, cfg.buffer,
                                       reserve=cfg.reserve_newest, prefix=cfg.prefix, batched=cfg.batched)[0]
    from .engine import replay_policy

    return replay_policy(cfg.policy, stream.indices, stream.ctx_len, cfg.buffer, reserve=cfg.reserve_newest,
                         prefix=cfg.prefix, batched=cfg.batched, seed=stream_seed(cfg.seed, stream.request, stream.layer),
                         group=cfg.mtp_steps, param=cfg.param).misses


def stream_seed(seed: int, request: int, layer: int) -> int:
    """The random policy's 32-bit generator seed for one (request, layer) stream: drawn from
    (``seed``, request, layer), so each stream's draws are its own (one seed for every stream gave
    every stream the same sequence of victims' draws, correlating their misses) and a stream's
    misses do not depend on which other streams are replayed or in which order."""
    import numpy as np

    return int(np.random.SeedSequence([seed, request, layer]).generate_state(1, np.uint32)[0])
