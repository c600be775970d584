"""Replay traces: per-step misses for policies x buffer sizes, as pandas DataFrames."""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, NamedTuple

from .. import native
from ..errors import HisparseError
from ..trace.stream import Stream
from .policies import POLICIES, POLICY_IDS

if TYPE_CHECKING:  # numpy loads on first use: the CLI's fast path never needs it
    import numpy as np

SEMANTICS = ("batched", "sequential")
INITIAL = ("prefix", "empty")


@dataclass(frozen=True)
class ReplayConfig:
    """One replay: a policy, a buffer size (slots per request and layer) and the step rules."""

    policy: str = "lru"
    buffer: int = 4096
    semantics: str = "batched"
    initial: str = "prefix"
    reserve_newest: bool = True
    seed: int = 0

    def check(self, k: int | None = None) -> ReplayConfig:
        if self.policy not in POLICIES:
            raise HisparseError(f"unknown policy {self.policy!r} (policies: {', '.join(POLICIES)})")
        if self.semantics not in SEMANTICS:
            raise HisparseError(f"unknown semantics {self.semantics!r} (batched or sequential)")
        if self.initial not in INITIAL:
            raise HisparseError(f"unknown initial buffer {self.initial!r} (prefix or empty)")
        if self.buffer < 1:
            raise HisparseError(f"buffer must be >= 1 slot, got {self.buffer}")
        if k is not None and self.semantics == "batched" and self.buffer < k and self.policy in POLICY_IDS:
            raise HisparseError(f"buffer {self.buffer} is smaller than k = {k}: a batched step needs "
                                f"room for all its entries (HiSparse requires device_buffer_size >= top_k)")
        return self


def _stateless_misses(cfg: ReplayConfig, stream: Stream) -> np.ndarray:
    """``none`` loads every selected entry; ``static-prefix`` every entry at or past the buffer."""
    import numpy as np
    idx = stream.indices
    counted = idx >= 0
    if cfg.reserve_newest:
        counted &= idx != (stream.ctx_len - 1)[:, None]
    if cfg.policy == "static-prefix":
        counted &= idx >= cfg.buffer
    return counted.sum(axis=1).astype(np.int64)


def replay_stream(stream: Stream, cfg: ReplayConfig, k: int | None = None) -> np.ndarray:
    """Misses at every step of one stream (int64 [steps])."""
    cfg.check(k if k is not None else stream.indices.shape[1])
    if cfg.policy not in POLICY_IDS:
        return _stateless_misses(cfg, stream)
    if cfg.policy == "lru" and cfg.semantics == "batched" and native.available():
        # The engine's batched LRU in O(changes) per step, checked against it in tests/test_native.py.
        return native.lru_batched(stream.indices, stream.ctx_len, cfg.buffer, reserve=cfg.reserve_newest,
                                  prefix=cfg.initial == "prefix").misses
    from .engine import replay_policy

    return replay_policy(cfg.policy, stream.indices, stream.ctx_len, cfg.buffer,
                         reserve=cfg.reserve_newest, prefix=cfg.initial == "prefix",
                         batched=cfg.semantics == "batched", seed=cfg.seed).misses


def expand_configs(policies: Sequence[str], buffers: Sequence[int], **common) -> list[ReplayConfig]:
    return [ReplayConfig(policy=p, buffer=int(b), **common) for p in policies for b in buffers]


class StreamMisses(NamedTuple):
    """Per-step misses of one stream under one config."""

    request: int
    layer: int
    ctx_len: np.ndarray
    config: ReplayConfig
    misses: np.ndarray


def replay_totals(streams: Iterable[Stream], configs: Sequence[ReplayConfig], *, k: int, workers: int = 2,
                  keep_steps: bool = False) -> tuple[list[dict], list[StreamMisses]]:
    """Replay every stream under every config, ``workers`` threads at a time (the compiled
    replay releases the GIL). Returns one summary record per config, and the per-stream misses
    when ``keep_steps``. Needs no pandas (the CLI's fast path)."""
    for cfg in configs:
        cfg.check(k)
    totals = {cfg: [0, 0, 0, 0] for cfg in configs}  # streams, steps, accesses, misses
    kept: list[StreamMisses] = []
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        pending: list = []
        for stream in streams:
            accesses = int(stream.accesses)
            pending.append((stream, accesses, [(cfg, pool.submit(replay_stream, stream, cfg, k)) for cfg in configs]))
            if len(pending) >= 2:  # one stream replaying while the next is read: bounded memory
                _collect(pending.pop(0), totals, kept, keep_steps)
        for item in pending:
            _collect(item, totals, kept, keep_steps)
    return _records(totals), kept


def replay_source(source, configs: Sequence[ReplayConfig], *, k: int, workers: int = 2, keep_steps: bool = False,
                  wrap=None) -> tuple[list[dict], list[StreamMisses]]:
    """``replay_totals`` over every stream of a trace source (``open_trace``); ``wrap`` wraps the
    iteration (a progress bar). Batched LRU on a ``.hst`` file replays the coded chunks directly
    (``coded.py``: the same misses, without materialising the rows)."""
    from . import coded

    wrap = wrap or (lambda it: it)
    if not coded.applies(source, configs):
        return replay_totals(wrap(iter(source)), configs, k=k, workers=workers, keep_steps=keep_steps)
    for cfg in configs:
        cfg.check(k)
    totals = {cfg: [0, 0, 0, 0] for cfg in configs}
    kept: list[StreamMisses] = []

    def finish(key, fut) -> None:
        res = fut.result()
        if res is None:  # a chunk is not clean: the ordinary reader raises the error
            stream = source.read(key)
            res = coded.CodedMisses(stream.ctx_len, int(stream.accesses), [replay_stream(stream, c, k) for c in configs])
        per_config, ctx_len = res.misses, res.ctx_len
        if keep_steps:  # numpy views of the int64 buffers, for the per-step frame
            import numpy as np

            per_config = [np.frombuffer(m, dtype=np.int64) for m in per_config]
            ctx_len = np.frombuffer(ctx_len, dtype=np.int64)
        for cfg, misses in zip(configs, per_config, strict=True):
            _add(totals, kept, keep_steps, key.request, key.layer, ctx_len, res.accesses, cfg, misses)

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        pending: list = []
        for key in wrap(iter(source.keys)):
            pending.append((key, pool.submit(coded.replay_coded, source.chunks(key), configs, k)))
            if len(pending) > 2 * max(1, workers):
                finish(*pending.pop(0))
        for item in pending:
            finish(*item)
    return _records(totals), kept


def _records(totals: dict) -> list[dict]:
    return [{"policy": c.policy, "buffer": c.buffer, "semantics": c.semantics, "initial": c.initial,
             "reserve_newest": c.reserve_newest, "streams": s, "steps": n, "accesses": a, "misses": m,
             "miss_ratio": m / a if a else 0.0} for c, (s, n, a, m) in totals.items()]


def _add(totals, kept, keep_steps, request, layer, ctx_len, accesses, cfg, misses) -> None:
    t = totals[cfg]
    t[0] += 1
    t[1] += len(misses)
    t[2] += accesses
    t[3] += int(sum(misses)) if isinstance(misses, array) else int(misses.sum())
    if keep_steps:
        kept.append(StreamMisses(request, layer, ctx_len, cfg, misses))


def _collect(item, totals, kept, keep_steps) -> None:
    stream, accesses, futures = item
    for cfg, fut in futures:
        _add(totals, kept, keep_steps, stream.request, stream.layer, stream.ctx_len, accesses, cfg, fut.result())


def per_step_frame(kept: Sequence[StreamMisses]):
    """Per-step misses as a DataFrame: request, layer, step, ctx_len, policy, buffer, misses."""
    import numpy as np
    import pandas as pd

    return pd.concat([pd.DataFrame({"request": m.request, "layer": m.layer, "step": np.arange(len(m.misses)),
                                    "ctx_len": m.ctx_len, "policy": m.config.policy, "buffer": m.config.buffer,
                                    "misses": m.misses}) for m in kept], ignore_index=True)


def replay_trace(streams: Iterable[Stream], configs: Sequence[ReplayConfig], *, k: int, workers: int = 2,
                 per_step: bool = False):
    """``replay_totals`` as DataFrames: (summary, per-step misses or None)."""
    import pandas as pd

    records, kept = replay_totals(streams, configs, k=k, workers=workers, keep_steps=per_step)
    return pd.DataFrame(records), (per_step_frame(kept) if per_step and kept else None)


def with_policy(cfg: ReplayConfig, policy: str) -> ReplayConfig:
    return replace(cfg, policy=policy)
