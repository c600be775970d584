"""Miss-ratio curves: one pass where LRU is a stack algorithm, and why batched order is not one."""

from __future__ import annotations

import numpy as np

from simulator.replay import ReplayConfig, replay_stream
from simulator.replay.engine import replay_policy
from simulator.replay.mrc import lru_stack_misses, miss_ratio_curve
from simulator.trace import Stream
from simulator.trace.generator import PRESETS, generate
from tests.helpers import random_stream


def test_one_pass_stack_distances_equal_per_size_replays():
    streams = list(generate(PRESETS["bursty"], steps=80, layers=2, requests=1, k=64, ctx0=900, seed=4))
    sizes = np.arange(1, 400)
    for reserve in (True, False):
        misses, accesses = lru_stack_misses(streams, sizes, reserve)
        assert accesses == sum(s.accesses for s in streams)
        for b in (1, 2, 63, 64, 65, 100, 257, 399):
            cfg = ReplayConfig(policy="lru", buffer=int(b), semantics="sequential", initial="empty",
                               reserve_newest=reserve)
            assert misses[b - 1] == sum(replay_stream(s, cfg).sum() for s in streams), (reserve, b)


def test_miss_ratio_curve_picks_the_method():
    streams = list(generate(PRESETS["dsa-like"], steps=40, layers=1, requests=1, k=64, ctx0=900, seed=1))
    seq = ReplayConfig(policy="lru", semantics="sequential", initial="empty")
    curve, method = miss_ratio_curve(streams, seq, range(64, 200), k=64, min_ctx=900)
    assert method == "one-pass" and len(curve) == 136
    batched = ReplayConfig(policy="lru")
    curve_b, method_b = miss_ratio_curve(streams, batched, [64, 128, 192], k=64, min_ctx=900)
    assert method_b == "per-size"
    want = [replay_stream(streams[0], ReplayConfig(policy="lru", buffer=b)).sum() for b in (64, 128, 192)]
    assert curve_b["misses"].tolist() == want
    assert (np.diff(curve_b["miss_ratio"]) <= 0).all()


def test_batched_order_differs_between_sizes():
    """A step's misses rank below its hits, and what misses depends on the size: with 2 slots,
    e misses at step 2 and ends below m; with 3 slots e hits and ends above m. No single LRU
    stack orders both caches, so stack distances cannot give the batched curve."""
    e, h, x, m = 10, 11, 12, 13
    s = Stream(0, 0, np.full(3, 100), np.array([[e, h], [x, -1], [e, m]], dtype=np.int32))
    orders = {}
    for B in (2, 3):
        run = replay_policy("lru", s.indices, s.ctx_len, B, reserve=False, prefix=False, batched=True, seed=0)
        orders[B] = [int(run.slot_pos[slot]) for slot in run.order]
    assert orders[2] == [e, m]
    assert orders[3] == [x, m, e]


def test_batched_lru_contents_nest_across_sizes_in_random_search():
    """No proof, but no counterexample: the smaller buffer's contents stay inside the larger's."""
    rng = np.random.default_rng(0)
    for _ in range(150):
        s = random_stream(rng, steps=10, k=4, ctx0=12, overlap=0.5, ragged=True)
        for B in range(4, 10):
            for T in (3, 6, 10):
                runs = [replay_policy("lru", s.indices[:T], s.ctx_len[:T], b, reserve=False, prefix=True,
                                      batched=True, seed=0) for b in (B, B + 1)]
                small, large = ({int(p) for p in r.slot_pos if p >= 0} for r in runs)
                assert small <= large


def test_stack_distances_in_c_equal_the_numba_reference(tmp_path):
    """native.lru_stack_hist against mrc_jit's numba pass, and the .hst one-pass path (rows
    decoded in C) against the streams' path: the same curve."""
    from simulator import native
    from simulator.replay.mrc_jit import stack_distance_histogram
    from simulator.trace import TraceMeta, TraceReader, write_trace

    if not native.available():
        return  # the numba pass is then the only one, tested above
    streams = list(generate(PRESETS["bursty"], steps=60, layers=2, requests=2, k=64, ctx0=900, seed=6))
    for reserve in (True, False):
        for s in streams:
            rows, ctx = np.ascontiguousarray(s.indices, dtype=np.int32), s.ctx_len.astype(np.int64)
            want = stack_distance_histogram(rows, ctx, reserve, 300)
            got = np.zeros(301, dtype=np.int64)
            native._native.lru_stack_hist(rows, *rows.shape, ctx, reserve, 300, got)
            assert np.array_equal(got, want)
    path = tmp_path / "b.hst"
    write_trace(path, TraceMeta(k=64, source={"kind": "test"}), streams)
    cfg = ReplayConfig(policy="lru", semantics="sequential", initial="empty")
    a, how_a = miss_ratio_curve(TraceReader(path), cfg, range(64, 400, 7), k=64)
    b, how_b = miss_ratio_curve(streams, cfg, range(64, 400, 7), k=64)
    assert how_a == how_b == "one-pass"
    assert a.equals(b)
