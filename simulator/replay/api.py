"""``replay``: every stream of a trace under every config, the one entry point of the replay engine.

The CLI (``hisparse replay``, ``hisparse mrc``), the planner's miss profiles, sweeps and the
notebooks all call it; ``backend.py`` (imported as ``paths``) chooses the code that runs on the CPU,
``gpu.py`` the GPU backend. The summary needs neither numpy nor pandas on the compiled path (the
CLI's start-up); the frames load pandas when asked for.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from ..errors import HisparseError
from ..trace.stream import Stream
from . import backend as paths
from .config import ReplayConfig

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


SUMMARY_COLUMNS = ("policy", "buffer", "semantics", "initial", "reserve_newest", "streams", "steps", "accesses",
                   "misses", "miss_ratio")


@dataclass(frozen=True)
class ReplayResult:
    """What ``replay`` found: one summary record per config, and per-step misses when asked."""

    configs: tuple[ReplayConfig, ...]
    records: list[dict[str, Any]]  # SUMMARY_COLUMNS, one per config, in config order
    streams: list[StreamMisses] = field(default_factory=list)  # with per_step: stream order, then config
    by_layer: dict[ReplayConfig, dict[int, list[int]]] = field(default_factory=dict)  # layer -> [streams, accesses, misses]

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
        return per_step_frame(self.streams) if self.streams else None

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

    ``source`` is a trace source (``simulator.trace.open_trace``), one ``Stream``, or any
    iterable of streams (e.g. the generator's). ``k`` (default: the source's ``meta.k``, else each
    stream's width) is what a batched buffer must hold. ``per_step`` keeps every stream's
    per-step misses (``ReplayResult.streams``, ``.per_step``); ``progress`` shows a bar.
    ``backend="gpu"`` replays batched lru / salru in one kernel launch per batch of streams
    (``simulator.replay.gpu``; the same answer bit for bit)."""
    # A config named twice is replayed once (it used to be counted twice in its record).
    configs = (configs,) if isinstance(configs, ReplayConfig) else tuple(dict.fromkeys(configs))
    if isinstance(source, Stream):
        source = [source]
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
        return ReplayResult(configs, tally.records(), tally.kept)
    if not per_step and paths.uses_raw_path(source, configs):
        run = _replay_raw
    elif paths.uses_coded_path(source, configs):
        run = _replay_coded
    elif not per_step and paths.uses_coded_rows_path(source, configs):
        run = _replay_coded_rows
    else:
        run = _replay_streams
    run(source, configs, k, tally, max(1, workers), wrap)
    return ReplayResult(configs, tally.records(), tally.kept, tally.layers)


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
        if k is None:
            for cfg in configs:
                cfg.check_k(stream.indices.shape[1])
        return stream, int(stream.accesses), [(cfg, pool.submit(paths.stream_misses, stream, cfg)) for cfg in configs]

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

    def submit(pool, key):
        return key, pool.submit(paths.coded_misses, source.coded_chunks(key), configs, k,
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
    k = source.meta.k if k is None else k

    def work(chunks):
        into = local.__dict__.setdefault("into", bytearray())
        rows = paths.coded_rows(chunks, k, into)
        if rows is None:
            return None
        return rows.steps, rows.accesses, [paths.rows_misses(rows, cfg) for cfg in configs]

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
            tally.add(cfg, 0, 0, accesses, steps, paths.raw_misses(rows, steps, width, ctx_len, cfg))


def per_step_frame(kept: Iterable[StreamMisses]) -> pd.DataFrame:
    """Per-step misses as a DataFrame: request, layer, step, ctx_len, policy, buffer, misses."""
    import numpy as np
    import pandas as pd

    return pd.concat([pd.DataFrame({"request": m.request, "layer": m.layer, "step": m.first_step + np.arange(len(m.misses)),
                                    "ctx_len": m.ctx_len, "policy": str(m.config.policy), "buffer": m.config.buffer,
                                    "misses": m.misses}) for m in kept], ignore_index=True)
