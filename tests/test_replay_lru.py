"""Batched LRU (HiSparse's semantics) against a plain reference written here, and the step rules."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.replay import ReplayConfig, replay_stream
from simulator.replay.engine import replay_policy
from simulator.trace import Stream
from simulator.trace.generator import PRESETS, generate
from tests.helpers import random_stream


def reference_batched_lru(stream: Stream, B: int, *, reserve: bool = True, prefix: bool = True):
    """Obviously-correct HiSparse LRU: an explicit recency list, oldest first, of positions.

    Returns (misses per step, slot of every entry after each step, final slot->position,
    final order of slots oldest first)."""
    order: list[int] = []  # slots, oldest first
    slot_pos: list[int] = [-1] * B
    free: list[int] = []
    started = fast = False
    misses, slots = [], []
    for t in range(stream.steps):
        ctx = int(stream.ctx_len[t])
        row = [int(p) for p in stream.indices[t] if p >= 0]
        if ctx <= B:
            misses.append(0)
            fast = True
            slots.append([B if reserve and p == ctx - 1 else p for p in row])
            continue
        if not started or fast:
            if prefix or fast:
                slot_pos, order, free = list(range(B)), list(range(B)), []
            else:
                slot_pos, order, free = [-1] * B, [], list(range(B))
            started, fast = True, False
        where = {p: s for s, p in enumerate(slot_pos) if p >= 0}
        selected = [p for p in row if not (reserve and p == ctx - 1)]
        hit_slots = {where[p] for p in selected if p in where}
        missed = [p for p in selected if p not in where]
        stale = [s for s in order if s not in hit_slots]
        victims = []
        for p in missed:
            v = free.pop(0) if free else stale.pop(0)
            slot_pos[v] = p
            victims.append(v)
        order = stale + victims + [s for s in order if s in hit_slots]
        misses.append(len(missed))
        where = {p: s for s, p in enumerate(slot_pos) if p >= 0}
        slots.append([B if reserve and p == ctx - 1 else where[p] for p in row])
    return np.array(misses), slots, slot_pos, order


def _check_against_reference(stream, B, **kw):
    want_m, want_slots, want_pos, want_order = reference_batched_lru(stream, B, **kw)
    run = replay_policy("lru", stream.indices, stream.ctx_len, B, reserve=kw.get("reserve", True),
                        prefix=kw.get("prefix", True), batched=True, seed=0, record=True)
    np.testing.assert_array_equal(run.misses, want_m)
    for t, row in enumerate(want_slots):
        assert run.slots[t, : len(row)].tolist() == row, f"step {t}"
    assert run.slot_pos.tolist() == want_pos
    assert run.order.tolist() == want_order


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("reserve", [True, False])
@pytest.mark.parametrize("prefix", [True, False])
def test_batched_lru_matches_reference_on_random_streams(seed, reserve, prefix):
    rng = np.random.default_rng(seed)
    stream = random_stream(rng, steps=60, k=48, ctx0=200, overlap=0.7, ragged=True)
    _check_against_reference(stream, B=64, reserve=reserve, prefix=prefix)


def test_batched_lru_matches_reference_on_generated_stream_through_fast_path():
    (s,) = generate(PRESETS["bursty"], steps=120, layers=1, requests=1, k=64, ctx0=70, seed=3)
    assert s.ctx_len[0] <= 96 < s.ctx_len[-1]  # starts inside the fast path, leaves it
    _check_against_reference(s, B=96)


def test_hits_are_protected_and_hits_become_most_recent():
    # B = 3, initial prefix [0, 1, 2] (0 oldest). Step selects {0, 5, 6}: 0 hits, so 5 and 6
    # take slots 1 and 2 (the oldest non-hit), and the order becomes 5, 6, then 0.
    s = Stream(0, 0, np.array([10, 11]), np.array([[0, 5, 6], [7, 0, 5]], dtype=np.int32))
    run = replay_policy("lru", s.indices, s.ctx_len, 3, reserve=False, prefix=True, batched=True, seed=0,
                        record=True)
    assert run.misses.tolist() == [2, 1]
    # step 1: hits 0 (slot 0) and 5 (slot 1); 7 takes slot 2 (holding 6, the only stale one)
    assert run.slot_pos.tolist() == [0, 5, 7]
    # order after step 0: [1, 2, 0]; step 1: stale none, loaded slot 2, hits in old order 1, 0
    assert run.order.tolist() == [2, 1, 0]


def test_newest_token_is_reserved():
    s = Stream(0, 0, np.array([10, 11]), np.array([[9, 1], [10, 9]], dtype=np.int32))
    run = replay_policy("lru", s.indices, s.ctx_len, 4, reserve=True, prefix=False, batched=True, seed=0,
                        record=True)
    # step 0: 9 is the newest (reserved slot 4), 1 misses; step 1: 10 is newest, 9 now misses
    assert run.misses.tolist() == [1, 1]
    assert run.slots[0].tolist() == [4, 0] and run.slots[1].tolist() == [4, 1]


def test_fast_path_has_no_misses():
    s = Stream(0, 0, np.arange(3, 8), np.array([[0, 1], [2, 3], [4, 0], [5, 1], [6, 2]], dtype=np.int32))
    # ctx 3 and 4 fit in 4 slots: no misses. Leaving the fast path the buffer holds [0, 4):
    # step 2 hits 0 and loads 4 into slot 1 (evicting 1); steps 3 and 4 then miss twice each.
    m = replay_stream(s, ReplayConfig(buffer=4, initial="empty", reserve_newest=False))
    assert m.tolist() == [0, 0, 1, 2, 2]
    # with the newest reserved, only 0, 1, 2 are looked up, and they are all resident
    assert replay_stream(s, ReplayConfig(buffer=4, initial="empty")).tolist() == [0, 0, 0, 0, 0]


def test_fast_path_leaves_no_recency_so_a_larger_buffer_can_miss_more(tmp_path, capsys):
    """SGLang's kernel skips LRU updates on its fast path and leaves it with slots in position
    order (step.py's docstring): documented, so inclusion across buffer sizes does not hold.
    The engine, the C path and the CLI on a .npy array agree."""
    from simulator.cli import main

    rows = np.array([[0], [-1], [3], [0]], dtype=np.int32)
    s = Stream(0, 0, np.arange(3, 7), rows)
    # 2 slots: LRU from step 0, reading 0 makes 1 the victim for 3; 3 slots: fast path at step 0
    # (ctx 3), then [0, 1, 2] with 0 oldest: 3 evicts 0, which misses again at step 3
    expect = {2: [0, 0, 1, 0], 3: [0, 0, 1, 1]}
    for b, want in expect.items():
        engine = replay_policy("lru", rows, s.ctx_len, b, reserve=True, prefix=True, batched=True, seed=0)
        assert engine.misses.tolist() == want, b
        assert replay_stream(s, ReplayConfig(buffer=b)).tolist() == want, b  # the C path when built
    path = tmp_path / "mono.npy"
    np.save(path, rows)
    assert main(["replay", str(path), "--ctx0", "3", "--buffer", "2,3", "--json", "--quiet"]) == 0
    import json

    assert [r["misses"] for r in json.loads(capsys.readouterr().out)] == [1, 2]
