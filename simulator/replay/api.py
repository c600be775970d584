"""Replay traces: per-step misses for policies x buffer sizes, as pandas DataFrames."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from ..errors import HisparseError
from ..trace.stream import Stream
from .policies import POLICIES, POLICY_IDS

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
    from .engine import replay_policy

    return replay_policy(cfg.policy, stream.indices, stream.ctx_len, cfg.buffer,
                         reserve=cfg.reserve_newest, prefix=cfg.initial == "prefix",
                         batched=cfg.semantics == "batched", seed=cfg.seed).misses


def expand_configs(policies: Sequence[str], buffers: Sequence[int], **common) -> list[ReplayConfig]:
    return [ReplayConfig(policy=p, buffer=int(b), **common) for p in policies for b in buffers]


def replay_trace(streams: Iterable[Stream], configs: Sequence[ReplayConfig], *, k: int,
                 workers: int = 2, per_step: bool = False,
                 on_stream: Callable[[], None] | None = None) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """Replay every stream under every config, ``workers`` threads at a time (the compiled
    replay releases the GIL). Returns (summary, per-step misses or None)."""
    for cfg in configs:
        cfg.check(k)
    totals = {cfg: [0, 0, 0, 0] for cfg in configs}  # streams, steps, accesses, misses
    rows: list[pd.DataFrame] = []
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        for stream in streams:
            futures = [(cfg, pool.submit(replay_stream, stream, cfg, k)) for cfg in configs]
            accesses = int(stream.accesses)
            for cfg, fut in futures:
                misses = fut.result()
                t = totals[cfg]
                t[0] += 1
                t[1] += stream.steps
                t[2] += accesses
                t[3] += int(misses.sum())
                if per_step:
                    rows.append(pd.DataFrame({
                        "request": stream.request, "layer": stream.layer,
                        "step": np.arange(stream.steps), "ctx_len": stream.ctx_len,
                        "policy": cfg.policy, "buffer": cfg.buffer, "misses": misses}))
            if on_stream:
                on_stream()
    summary = pd.DataFrame([
        {"policy": c.policy, "buffer": c.buffer, "semantics": c.semantics, "initial": c.initial,
         "reserve_newest": c.reserve_newest, "streams": s, "steps": n, "accesses": a, "misses": m,
         "miss_ratio": m / a if a else 0.0}
        for c, (s, n, a, m) in totals.items()])
    detail = pd.concat(rows, ignore_index=True) if per_step and rows else None
    return summary, detail


def with_policy(cfg: ReplayConfig, policy: str) -> ReplayConfig:
    return replace(cfg, policy=policy)
