"""Every policy: invariants, OPT as the lower bound, determinism, and libCacheSim cross-checks."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.errors import HisparseError
from simulator.replay import POLICIES, Initial, Policy, ReplayConfig, Semantics, replay_stream
from simulator.trace.generator import PRESETS, generate
from simulator.trace.oracle import write_oracle_general
from tests.helpers import random_stream

STATEFUL = [p for p in POLICIES if p not in ("none", "static-prefix")]


def _streams():
    (a,) = generate(PRESETS["bursty"], steps=120, layers=1, requests=1, k=128, ctx0=2500, seed=11)
    (b,) = generate(PRESETS["dsa-like"], steps=120, layers=1, requests=1, k=128, ctx0=2500, seed=12)
    c = random_stream(np.random.default_rng(13), steps=80, k=96, ctx0=600, overlap=0.8, ragged=True)
    return [a, b, c]


@pytest.mark.parametrize("semantics", ["batched", "sequential"])
def test_invariants_and_opt_lower_bound(semantics):
    for s in _streams():
        for buffer in (s.indices.shape[1], 2 * s.indices.shape[1]):
            got = {p: replay_stream(s, ReplayConfig(policy=p, buffer=buffer, semantics=semantics)) for p in POLICIES}
            none = got["none"]
            for p, m in got.items():
                assert (m >= 0).all() and (m <= none).all(), p  # never more loads than entries
            for p in STATEFUL:
                assert got["opt"].sum() <= got[p].sum(), (p, semantics, buffer)
            assert got["none"].sum() == sum(
                int(((s.step(t) != s.ctx_len[t] - 1)).sum()) for t in range(s.steps))


def test_static_prefix_counts_entries_past_the_buffer():
    s = random_stream(np.random.default_rng(2), steps=30, k=40, ctx0=400)
    m = replay_stream(s, ReplayConfig(policy="static-prefix", buffer=100, reserve_newest=False))
    assert m.tolist() == [int((s.step(t) >= 100).sum()) for t in range(s.steps)]


def test_larger_buffers_never_hurt_opt_and_lru_batched():
    s = _streams()[0]
    for p in ("opt",):
        totals = [replay_stream(s, ReplayConfig(policy=p, buffer=b)).sum() for b in (128, 160, 256, 512)]
        assert totals == sorted(totals, reverse=True)


def test_random_policy_is_seeded():
    s = _streams()[1]
    a = replay_stream(s, ReplayConfig(policy="random", buffer=160, seed=1))
    b = replay_stream(s, ReplayConfig(policy="random", buffer=160, seed=1))
    c = replay_stream(s, ReplayConfig(policy="random", buffer=160, seed=2))
    assert (a == b).all() and not (a == c).all()


def test_buffer_smaller_than_k_is_refused_in_batched_mode():
    s = _streams()[0]
    with pytest.raises(HisparseError, match="smaller than k = 128"):
        replay_stream(s, ReplayConfig(policy="lru", buffer=100))
    assert replay_stream(s, ReplayConfig(policy="lru", buffer=100, semantics="sequential")).sum() > 0


def test_unknown_policy_and_options():
    with pytest.raises(HisparseError, match="unknown policy 'lruu'"):
        ReplayConfig(policy="lruu")
    with pytest.raises(HisparseError, match="unknown initial"):
        ReplayConfig(initial="full")
    with pytest.raises(HisparseError, match="unknown semantics"):
        ReplayConfig(semantics="parallel")
    with pytest.raises(HisparseError, match="buffer must be >= 1"):
        ReplayConfig(buffer=0)
    cfg = ReplayConfig(policy="opt", semantics="sequential", initial="empty", buffer=np.int64(7))
    assert (cfg.policy, cfg.semantics, cfg.initial, cfg.buffer) == (Policy.OPT, Semantics.SEQUENTIAL, Initial.EMPTY, 7)
    assert type(cfg.buffer) is int and cfg == ReplayConfig(policy=Policy.OPT, semantics="sequential",
                                                          initial=Initial.EMPTY, buffer=7)


# libCacheSim (GPL-3, test-only) processes oracleGeneral records one at a time: our sequential
# semantics from an empty buffer with no reserved slot is the same classic cache simulation.
LCS = {"lru": "LRU", "fifo": "FIFO", "opt": "Belady", "clock": "Clock", "sieve": "Sieve", "lfu": "LFU"}


@pytest.mark.parametrize("policy", sorted(LCS))
def test_sequential_matches_libcachesim_exactly(tmp_path, policy):
    import libcachesim as lcs  # in the test extra: a missing install must fail, not skip
    for i, s in enumerate(_streams()):
        path = tmp_path / f"s{i}.bin"
        write_oracle_general(s, path)
        for buffer in (64, 150, 300):
            reader = lcs.TraceReader(trace=str(path), trace_type=lcs.TraceType.ORACLE_GENERAL_TRACE)
            ratio, _ = getattr(lcs, LCS[policy])(cache_size=buffer).process_trace(reader)
            ours = replay_stream(s, ReplayConfig(policy=policy, buffer=buffer, semantics="sequential",
                                                 initial="empty", reserve_newest=False)).sum()
            assert ours == round(ratio * s.accesses), (policy, i, buffer)
