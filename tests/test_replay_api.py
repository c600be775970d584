"""``replay``, the one entry point: the same answer from every kind of source and backend."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.errors import HisparseError
from simulator.replay import ReplayConfig, replay, replay_stream
from simulator.replay.engine import replay_policy
from simulator.trace import Stream, TraceMeta, TraceReader, open_trace, write_trace
from tests.helpers import random_stream


def _streams(rng) -> list[Stream]:
    return [Stream(r, layer, s.ctx_len, s.indices) for r in range(2) for layer in range(2)
            for s in [random_stream(rng, steps=50, k=16, ctx0=30, overlap=0.8)]]


def test_sources_of_every_kind_give_the_same_records(tmp_path):
    rng = np.random.default_rng(1)
    streams = _streams(rng)
    path = tmp_path / "t.hst"
    write_trace(path, TraceMeta(k=16, source={"kind": "test"}), streams)
    streams = list(open_trace(path))  # as stored: rows sorted (stored order matters to a batched step)
    configs = [ReplayConfig(policy=p, buffer=b) for p in ("lru", "fifo", "none") for b in (16, 24)]
    from_reader = replay(open_trace(path), configs)
    from_list = replay(streams, configs, k=16)
    from_generator = replay((s for s in streams), configs, k=16)
    lru_only = replay(TraceReader(path), [c for c in configs if c.policy == "lru"])  # the coded path
    assert from_reader.records == from_list.records == from_generator.records
    assert lru_only.records == [r for r in from_list.records if r["policy"] == "lru"]
    assert list(from_reader.summary.columns)[:2] == ["policy", "buffer"] and len(from_reader.summary) == 6
    for cfg, rec in zip(configs, from_list.records, strict=True):
        want = sum(int(replay_stream(s, cfg).sum()) for s in streams)
        assert (rec["policy"], rec["buffer"], rec["misses"], rec["streams"]) == (cfg.policy, cfg.buffer, want, 4)


def test_per_step_misses_match_the_engine(tmp_path):
    rng = np.random.default_rng(2)
    streams = _streams(rng)
    cfg = ReplayConfig(policy="arc", buffer=20, semantics="sequential")
    result = replay(streams, [cfg], per_step=True, k=16)
    assert result.per_step is not None and len(result.per_step) == sum(s.steps for s in streams)
    for s in streams:
        want = replay_policy("arc", s.indices, s.ctx_len, 20, reserve=True, prefix=True, batched=False, seed=0)
        assert np.array_equal(result.misses(cfg, request=s.request, layer=s.layer), want.misses)
    with pytest.raises(ValueError, match="4 replayed streams match"):
        result.misses(cfg)
    assert replay(streams, cfg, k=16).per_step is None


def test_one_stream_and_the_k_check():
    rng = np.random.default_rng(3)
    s = random_stream(rng, steps=20, k=16, ctx0=30)
    assert replay(s, ReplayConfig(buffer=20)).records[0]["streams"] == 1
    with pytest.raises(HisparseError, match="smaller than k = 16"):
        replay(s, ReplayConfig(buffer=12))
    with pytest.raises(HisparseError, match="smaller than k = 32"):
        replay([s], ReplayConfig(buffer=20), k=32)
    assert replay(s, ReplayConfig(buffer=12, semantics="sequential")).records[0]["misses"] > 0


def test_a_config_named_twice_counts_once():
    rng = np.random.default_rng(4)
    s = random_stream(rng, steps=20, k=16, ctx0=30)
    once = replay(s, ReplayConfig(buffer=20)).records
    twice = replay(s, [ReplayConfig(buffer=20), ReplayConfig(policy="lru", buffer=20)]).records
    assert twice == once and once[0]["streams"] == 1
