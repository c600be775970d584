"""``replay``: every stream of a trace under every config, the one entry point of the replay engine.

The CLI (``hisparse replay``, ``hisparse mrc``), the planner's miss profiles, sweeps and the
notebooks all call it; ``backend.py`` (imported as ``paths``) chooses the code that runs on the CPU,
``gpu.py`` the GPU backend. The summary needs neither numpy nor pandas on the compiled path (the
CLI's start-up); the frames load pandas when asked for.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, NamedTuple

from ..errors import HisparseError
from ..trace.stream import Stream
from . import backend as paths
from .config import ReplayConfig, is_bool
from .policies import SHARDED

if TYPE_CHECKING:  # numpy loads on first use: the CLI's fast path never needs it
    import numpy as np
    import pandas as pd


class StreamMisses(NamedTuple):
    """Per-step misses of one stream under one config."""

    request: int
    layer: int
    ctx_len: np.ndarray
    config: ReplayConfig
    misses: np.ndarray
    first_step: int = 0  # the step number of misses[0]


# Above this many slots a buffer is cut to the largest context it replays (``_fitted``): on a source
# that does not say its largest context up front (a version-1 .hst, a list of streams), such a
# replay reads each stream's rows to find it.
LARGE_BUFFER = 2**20

SUMMARY_COLUMNS = ("policy", "buffer", "semantics", "initial", "reserve_newest", "streams", "steps", "accesses",
                   "misses", "miss_ratio")


@dataclass(frozen=True)
class ReplayResult:
    """What ``replay`` found: one summary record per config, and per-step misses when asked."""

    configs: tuple[ReplayConfig, ...]
    records: list[dict[str, Any]]  # SUMMARY_COLUMNS, one per config, in config order
    streams: list[StreamMisses] = field(default_factory=list)  # with per_step: stream order, then config
    by_layer: dict[ReplayConfig, dict[int, list[int]]] = field(default_factory=dict)  # layer -> [streams, accesses, misses]
    kept_steps: bool = False  # replayed with per_step (``per_step`` is then a frame, empty for no streams)

    def group_records(self, anchor_of: Sequence[int]) -> list[dict[str, Any]]:
        """Misses per IndexShare group (``anchor``: the layers that run the indexer; ``shared``: the
        layers that reuse an anchor's top-k), per config. A layer beyond ``anchor_of`` is an error."""
        from ..layer_groups import group_of

        out = []
        for cfg in self.configs:
            sums: dict[str, list[int]] = {}
            for layer, (n, a, m) in sorted(self.by_layer.get(cfg, {}).items()):
                if layer >= len(anchor_of):
                    raise ValueError(f"layer {layer} is beyond the {len(anchor_of)} layers of the IndexShare map")
                t = sums.setdefault(group_of(tuple(anchor_of), layer), [0, 0, 0, 0])
                t[0] += 1
                t[1] += n
                t[2] += a
                t[3] += m
            for group in ("anchor", "shared"):
                if group in sums:
                    layers, n, a, m = sums[group]
                    out.append({"policy": str(cfg.policy), "buffer": cfg.buffer, "group": group, "layers": layers,
                                "streams": n, "accesses": a, "misses": m, "miss_ratio": m / a if a else 0.0})
        return out

    @property
    def summary(self) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame(self.records, columns=list(SUMMARY_COLUMNS))

    @property
    def per_step(self) -> pd.DataFrame | None:
        """request, layer, step, ctx_len, policy, buffer, misses (None without per_step)."""
        return per_step_frame(self.streams) if self.streams or self.kept_steps else None

    def misses(self, config: ReplayConfig | None = None, *, request: int | None = None,
               layer: int | None = None) -> np.ndarray:
        """Per-step misses of the one stream (and config) that matches (needs per_step)."""
        found = [m for m in self.streams if (config is None or m.config == config)
                 and (request is None or m.request == request) and (layer is None or m.layer == layer)]
        if len(found) != 1:
            raise ValueError(f"{len(found)} replayed streams match (config {config}, request {request}, "
                             f"layer {layer}); replay with per_step=True and name one")
        return found[0].misses


def replay(source: Any, configs: ReplayConfig | Sequence[ReplayConfig], *, per_step: bool = False,
           workers: int = 2, progress: bool = False, k: int | None = None, backend: str = "cpu") -> ReplayResult:
    """Replay every stream of ``source`` under every config, ``workers`` threads at a time (the
    compiled replays release the GIL).

    ``source`` is a trace source (``simulator.trace.open_trace``), a trace file's path (opened with
    ``open_trace``), one ``Stream``, or any iterable of streams (e.g. the generator's). ``configs``
    is one ``ReplayConfig`` or a sequence of them; a config named twice is replayed once, so
    ``result.configs`` (and the summary's rows) hold each once, in first-seen order. ``k``
    (default: the source's ``meta.k``, else each stream's width) is what a batched buffer must
    hold; a stream that selects more entries in a step than ``k`` is checked at its own count. A
    buffer larger than a stream's largest context misses as that context's size does (the whole
    replay is on the fast path) and is replayed at that size. ``per_step`` keeps every stream's
    per-step misses (``ReplayResult.streams``, ``.per_step``); ``progress`` shows a bar.
    ``backend="gpu"`` replays batched lru / salru in one kernel launch per batch of streams
    (``simulator.replay.gpu``; the same answer bit for bit)."""
    configs = _configs(configs)
    source = _source(source)
    if k is not None:
        k = _count("k", k)
    workers = _count("workers", workers)
    for name, flag in (("per_step", per_step), ("progress", progress)):
        if not is_bool(flag):
            raise HisparseError(f"replay: {name} must be True or False, got {flag!r}")
    per_step, progress = bool(per_step), bool(progress)
    if k is None and hasattr(source, "meta"):
        k = source.meta.k
    if k is not None:
        for cfg in configs:
            cfg.check_k(k)
    wrap = _progress(source) if progress else (lambda it: it)
    tally = _Tally(configs, per_step)
    if backend not in ("cpu", "gpu"):
        raise HisparseError(f"unknown replay backend {backend!r} (one of: cpu, gpu)")
    if backend == "gpu":
        from . import gpu

        gpu.check(configs)
        gpu.replay_streams(wrap(iter(source)), configs,
                           lambda s, cfg, m: tally.add_stream(s, int(s.accesses), cfg, m))
        return ReplayResult(configs, tally.records(), tally.kept, tally.layers, per_step)
    if _max_ctx(source) is None and any(cfg.buffer > LARGE_BUFFER for cfg in configs):
        run = _replay_streams  # each stream's buffers cut to its largest context (``_fitted``)
    elif not per_step and paths.uses_raw_path(source, configs):
        run = _replay_raw
    elif paths.uses_coded_path(source, configs):
        run = _replay_coded
    elif not per_step and paths.uses_coded_rows_path(source, configs):
        run = _replay_coded_rows
    else:
        run = _replay_streams
    run(source, configs, k, tally, workers, wrap)
    return ReplayResult(configs, tally.records(), tally.kept, tally.layers, per_step)


def _configs(configs: Any) -> tuple[ReplayConfig, ...]:
    """One config or a sequence of them, each named once (a config named twice used to be counted
    twice in its record); anything else is the caller's error, not an AttributeError later."""
    if isinstance(configs, ReplayConfig):
        return (configs,)
    if isinstance(configs, str | bytes | dict) or not isinstance(configs, Iterable):
        raise HisparseError(f"replay: configs must be a ReplayConfig or a list of them, got {configs!r}")
    out = tuple(configs)
    for cfg in out:
        if not isinstance(cfg, ReplayConfig):
            raise HisparseError(f"replay: configs must be ReplayConfig objects, got {cfg!r} "
                                f"(e.g. ReplayConfig(policy={str(cfg)!r}))" if isinstance(cfg, str) else
                                f"replay: configs must be ReplayConfig objects, got {cfg!r}")
    return tuple(dict.fromkeys(out))


def _source(source: Any) -> Any:
    """A path is opened (``open_trace``: a missing file or a folder is its TraceError); a stream is
    one stream; anything else must be iterable."""
    import os

    if isinstance(source, str | os.PathLike):
        from ..trace import open_trace

        return open_trace(source)
    if isinstance(source, Stream):
        return [source]
    if not isinstance(source, Iterable):
        raise HisparseError(f"replay: source must be a trace (open_trace(path)), a path, a Stream or streams, "
                            f"got {source!r}")
    return source


def _count(name: str, value: Any) -> int:
    """A whole number >= 1 (numpy integers too; not a bool, a float or a string)."""
    if not is_bool(value):
        try:
            value = operator.index(value)
        except TypeError:
            pass
        else:
            if value >= 1:
                return value
    raise HisparseError(f"replay: {name} must be a whole number >= 1, got {value!r}")


def _fitted(cfg: ReplayConfig, max_ctx: int | None) -> ReplayConfig:
    """``cfg`` with its buffer cut to the stream's largest context (at least ``max_ctx`` slots, a
    whole number of shards for salru) when it is larger: every step is then on the fast path
    (``ctx_len <= buffer``: position p in slot p, nothing evicted), so the misses are the same,
    while the engine's memory grows with the slots (a 2**31-slot buffer took 23 GB to replay a
    30-step stream)."""
    if max_ctx is None or cfg.buffer <= max_ctx:
        return cfg
    size = max(int(max_ctx), 1)
    if cfg.policy in SHARDED:
        size = -(-size // cfg.ways) * cfg.ways
    return cfg if size >= cfg.buffer else replace(cfg, buffer=size)


def replay_stream(stream: Stream, cfg: ReplayConfig, k: int | None = None) -> np.ndarray:
    """Misses at every step of one stream under one config: ``replay`` of that stream."""
    return replay(stream, cfg, per_step=True, workers=1, k=k).streams[0].misses


def _progress(source: Any):
    from ..progress import progress

    total = len(source) if hasattr(source, "__len__") else None
    return lambda it: progress(it, total=total, desc="streams", unit="stream")


class _Tally:
    """Totals per config (streams, steps, accesses, misses), and per-step misses when kept."""

    def __init__(self, configs: Sequence[ReplayConfig], per_step: bool) -> None:
        self.totals = {cfg: [0, 0, 0, 0] for cfg in configs}
        self.layers: dict[ReplayConfig, dict[int, list[int]]] = {cfg: {} for cfg in configs}
        self.per_step = per_step
        self.kept: list[StreamMisses] = []

    def add(self, cfg: ReplayConfig, request: int, layer: int, accesses: int, steps: int, misses_total: int,
            ctx_len=None, misses=None, first_step: int = 0) -> None:
        t = self.totals[cfg]
        t[0] += 1
        t[1] += steps
        t[2] += accesses
        t[3] += misses_total
        per_layer = self.layers[cfg].setdefault(int(layer), [0, 0, 0])
        per_layer[0] += 1
        per_layer[1] += accesses
        per_layer[2] += misses_total
        if self.per_step:
            self.kept.append(StreamMisses(request, layer, ctx_len, cfg, misses, first_step))

    def add_stream(self, stream: Stream, accesses: int, cfg: ReplayConfig, misses: np.ndarray) -> None:
        self.add(cfg, stream.request, stream.layer, accesses, len(misses), int(misses.sum()), stream.ctx_len, misses,
                 getattr(stream, "first_step", 0))

    def records(self) -> list[dict[str, Any]]:
        return [{"policy": str(c.policy), "buffer": c.buffer, "semantics": str(c.semantics), "initial": str(c.initial),
                 "reserve_newest": c.reserve_newest, "streams": s, "steps": n, "accesses": a, "misses": m,
                 "miss_ratio": m / a if a else 0.0} for c, (s, n, a, m) in self.totals.items()]


def _in_threads(items, workers: int, ahead: int, submit, collect) -> None:
    """``thread_pool.run_in_order`` (not imported with the module: the .npy path needs no threads)."""
    from ..thread_pool import run_in_order

    run_in_order(items, workers, ahead, submit, collect)


def _replay_read(source, key, configs, tally: _Tally) -> None:
    """A stream whose coded chunks are not clean, through the ordinary reader (which raises its error)."""
    stream = source.read(key)
    for cfg in configs:
        tally.add_stream(stream, int(stream.accesses), cfg, paths.stream_misses(stream, cfg))


def _replay_streams(source, configs, k, tally: _Tally, workers: int, wrap) -> None:
    """Each stream's rows through each config (``paths.stream_misses``)."""

    def submit(pool, stream: Stream):
        import numpy as np

        if not isinstance(stream, Stream):
            raise HisparseError(f"replay: the source yielded a {type(stream).__name__}, not a Stream "
                                "(simulator.trace.Stream(request, layer, ctx_len, indices))")
        for name in ("indices", "ctx_len"):
            if not isinstance(getattr(stream, name), np.ndarray):
                raise HisparseError(f"replay: request {stream.request}, layer {stream.layer}: {name} must be a numpy "
                                    f"array, got {type(getattr(stream, name)).__name__}")
        if stream.indices.ndim != 2 or stream.ctx_len.shape != stream.indices.shape[:1]:
            raise HisparseError(f"replay: request {stream.request}, layer {stream.layer}: indices must be "
                                f"[steps, width] and ctx_len [steps], got shapes {stream.indices.shape} and "
                                f"{stream.ctx_len.shape}")
        # A batched buffer must hold a step's entries. A k below what the stream selects (k=0, or a
        # list of streams wider than the k given) skipped the check, and the compiled engine wrote
        # past its slots: a segfault (fifo, arc), a hang (random).
        need = stream.indices.shape[1] if k is None else max(k, int(stream.counts.max(initial=0)))
        for cfg in configs:
            cfg.check_k(need)
        cmax = int(stream.ctx_len.max(initial=0))
        return stream, int(stream.accesses), [(cfg, pool.submit(paths.stream_misses, stream, _fitted(cfg, cmax)))
                                              for cfg in configs]

    def collect(item) -> None:
        stream, accesses, futures = item
        for cfg, fut in futures:
            tally.add_stream(stream, accesses, cfg, fut.result())

    # one stream replaying while the next is read
    _in_threads(wrap(iter(source)), workers, 1, submit, collect)


def _replay_coded(source, configs, k, tally: _Tally, workers: int, wrap) -> None:
    """Batched LRU on the source's coded chunks (``paths.coded_misses``), no rows materialised."""
    from .. import native

    states = native.LruPool()  # reused between streams (fresh ones cost their page faults each time)

    fitted = [_fitted(cfg, _max_ctx(source)) for cfg in configs]

    def submit(pool, key):
        return key, pool.submit(paths.coded_misses, source.coded_chunks(key), fitted, k,
                                per_step=tally.per_step, pool=states)

    def finish(item) -> None:
        key, fut = item
        run = fut.result()
        if run is None:
            _replay_read(source, key, configs, tally)
            return
        for i, cfg in enumerate(configs):
            tally.add(cfg, key.request, key.layer, run.accesses, run.steps, run.totals[i], run.ctx_len,
                      run.misses[i] if run.misses is not None else None,
                      source.first_step(key) if hasattr(source, "first_step") else 0)

    _in_threads(wrap(iter(source.keys)), workers, 2 * workers, submit, finish)


def _replay_coded_rows(source, configs, k, tally: _Tally, workers: int, wrap) -> None:
    """Configs that run in C on rows (sequential LRU, OPT, LFU; batched LRU among them), each
    stream decoded and checked in C from its coded chunks (``paths.coded_rows``): no numpy."""
    import threading

    local = threading.local()  # each thread's rows buffer, reused from stream to stream
    fitted = [_fitted(cfg, _max_ctx(source)) for cfg in configs]
    k = source.meta.k if k is None else k

    def work(chunks):
        into = local.__dict__.setdefault("into", bytearray())
        rows = paths.coded_rows(chunks, k, into)
        if rows is None:
            return None
        return rows.steps, rows.accesses, [paths.rows_misses(rows, cfg) for cfg in fitted]

    def submit(pool, key):
        return key, pool.submit(work, source.coded_chunks(key))  # file reads in this thread

    def finish(item) -> None:
        key, fut = item
        done = fut.result()
        if done is None:
            _replay_read(source, key, configs, tally)
            return
        steps, accesses, totals = done
        for cfg, total in zip(configs, totals, strict=True):
            tally.add(cfg, key.request, key.layer, accesses, steps, total)

    _in_threads(wrap(iter(source.keys)), workers, 2 * workers, submit, finish)


def _replay_raw(source, configs, k, tally: _Tally, workers: int, wrap) -> None:
    """LRU on a ``.npy`` source's mapped rows (``paths.raw_misses``): no numpy on the path."""
    rows, steps, width, ctx_len, accesses = source.raw_rows
    for _ in wrap(range(1)):
        for cfg in configs:
            tally.add(cfg, 0, 0, accesses, steps,
                      paths.raw_misses(rows, steps, width, ctx_len, _fitted(cfg, _max_ctx(source))))


def _max_ctx(source) -> int | None:
    """A source's largest context from its index (None where it does not say)."""
    value = getattr(source, "max_ctx", None)
    return value if isinstance(value, int) and value > 0 else None


def per_step_frame(kept: Iterable[StreamMisses]) -> pd.DataFrame:
    """Per-step misses as a DataFrame: request, layer, step, ctx_len, policy, buffer, misses."""
    import numpy as np
    import pandas as pd

    kept = list(kept)
    if not kept:  # replayed with per_step, but no stream: the columns, no rows
        return pd.DataFrame({"request": np.zeros(0, np.int64), "layer": np.zeros(0, np.int64),
                             "step": np.zeros(0, np.int64), "ctx_len": np.zeros(0, np.int64),
                             "policy": pd.Series([], dtype="str"), "buffer": np.zeros(0, np.int64),
                             "misses": np.zeros(0, np.int64)})
    return pd.concat([pd.DataFrame({"request": m.request, "layer": m.layer, "step": m.first_step + np.arange(len(m.misses)),
                                    "ctx_len": m.ctx_len, "policy": str(m.config.policy), "buffer": m.config.buffer,
                                    "misses": m.misses}) for m in kept], ignore_index=True)
