"""Batched and sequential S3-FIFO and LFU against plain references written here.

The engine's versions keep per-step scan cursors (S3-FIFO) and set protected heap entries aside
for a step (LFU); the references rescan from scratch for every victim, so any shortcut that
changes a victim shows up as a different miss count or final slot.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from simulator.replay.engine import replay_policy
from simulator.trace import Stream
from tests.helpers import random_stream


class S3Fifo:
    """S3-FIFO as the engine defines it (simulator/replay/policies/s3fifo.py), with lists."""

    def __init__(self, B: int) -> None:
        self.B, self.small = B, max(1, B // 10)
        self.S: list[int] = []
        self.M: list[int] = []
        self.G: list[int] = []  # ghost positions, oldest first
        self.cnt = [0] * B

    def _ghost(self, pos: int) -> None:
        if len(self.G) >= self.B - self.small:
            self.G.pop(0)
        self.G.append(pos)

    def victim(self, protected: set[int], slot_pos: list[int]) -> int:
        while True:
            s = next((x for x in self.S if x not in protected), None) if len(self.S) >= self.small else None
            if s is not None:
                self.S.remove(s)
                if self.cnt[s] > 1:
                    self.cnt[s] = 0
                    self.M.append(s)
                    continue
                self._ghost(slot_pos[s])
                return s
            m = next((x for x in self.M if x not in protected), None)
            if m is None:
                s = next(x for x in self.S if x not in protected)
                self.S.remove(s)
                self._ghost(slot_pos[s])
                return s
            self.M.remove(m)
            if self.cnt[m] > 0:
                self.cnt[m] -= 1
                self.M.append(m)
                continue
            return m

    def insert(self, slot: int, pos: int) -> None:
        self.cnt[slot] = 0
        if pos in self.G:
            self.G.remove(pos)
            self.M.append(slot)
        else:
            self.S.append(slot)

    def hit(self, slot: int) -> None:
        self.cnt[slot] = min(3, self.cnt[slot] + 1)


class Lfu:
    """LFU: the smallest (count, last-touch tick) among unprotected slots."""

    def __init__(self, B: int) -> None:
        self.key: dict[int, tuple[int, int]] = {}
        self.tick = 0

    def _set(self, slot: int, count: int) -> None:
        self.tick += 1
        self.key[slot] = (count, self.tick)

    def victim(self, protected: set[int], slot_pos: list[int]) -> int:
        v = min((k, s) for s, k in self.key.items() if s not in protected)[1]
        del self.key[v]
        return v

    def insert(self, slot: int, pos: int) -> None:
        self._set(slot, 1)

    def hit(self, slot: int) -> None:
        self._set(slot, self.key[slot][0] + 1)


def reference(policy_cls, stream: Stream, B: int, *, batched: bool, reserve: bool, prefix: bool):
    """The engine's step rules (fast path, fresh buffer, reserved newest slot, free slots first)
    around a plain policy. Returns (misses per step, final slot -> position)."""
    slot_pos, policy, free = [-1] * B, None, []
    started = fast = False
    misses = []
    for t in range(stream.steps):
        ctx = int(stream.ctx_len[t])
        if ctx <= B:
            misses.append(0)
            fast = True
            continue
        if not started or fast:
            policy, slot_pos, free = policy_cls(B), [-1] * B, list(range(B))
            if prefix or fast:
                for p in range(B):
                    slot_pos[p] = p
                    policy.insert(p, p)
                free = []
            started, fast = True, False
        row = [int(p) for p in stream.indices[t] if p >= 0 and not (reserve and p == ctx - 1)]
        groups = [row] if batched else [[p] for p in row]
        n = 0
        for group in groups:
            where = {p: s for s, p in enumerate(slot_pos) if p >= 0}
            hits = [where[p] for p in group if p in where]
            protected = set(hits)
            for p in group:
                if p in where:
                    continue
                v = free.pop(0) if free else policy.victim(protected, slot_pos)
                slot_pos[v] = p
                protected.add(v)
                policy.insert(v, p)
                n += 1
            for s in hits:
                policy.hit(s)
        misses.append(n)
    return np.array(misses), slot_pos


@pytest.mark.parametrize(("name", "cls"), [("s3fifo", S3Fifo), ("lfu", Lfu)])
@pytest.mark.parametrize("batched", [True, False])
def test_engine_matches_plain_reference(name, cls, batched):
    rng = np.random.default_rng(17 + batched)
    for _ in range(12):
        k = int(rng.integers(3, 30))
        stream = random_stream(rng, steps=int(rng.integers(10, 60)), k=k, ctx0=int(rng.integers(k + 1, 4 * k)),
                               overlap=float(rng.choice([0.5, 0.9, 0.97])), ragged=bool(rng.integers(2)))
        B = int(rng.integers(k, 2 * k + 2))
        for reserve, prefix in itertools.product([True, False], repeat=2):
            want, want_pos = reference(cls, stream, B, batched=batched, reserve=reserve, prefix=prefix)
            run = replay_policy(name, stream.indices, stream.ctx_len, B, reserve=reserve, prefix=prefix,
                                batched=batched, seed=0)
            np.testing.assert_array_equal(run.misses, want)
            assert run.slot_pos.tolist() == want_pos


def test_stale_compiled_copies_are_dropped_when_a_policy_changes(tmp_path, monkeypatch):
    """numba checks only a function's own file; the engine drops its cache when a policy changes."""
    from simulator.replay.compiled_cache import drop_stale_compiled_copies

    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    (tmp_path / "policies" / "__pycache__").mkdir(parents=True)
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "step.py").write_text("step")
    (tmp_path / "policies" / "lru.py").write_text("v1")
    cached = [tmp_path / "__pycache__" / "step.run-1.py311.nbi",
              tmp_path / "policies" / "__pycache__" / "lru.hits-2.py311.1.nbc"]
    other = tmp_path / "__pycache__" / "mrc.curve-3.py311.nbi"
    drop_stale_compiled_copies(tmp_path)  # first sight: no stamp yet
    for f in [*cached, other]:
        f.write_text("compiled")
    drop_stale_compiled_copies(tmp_path)  # nothing changed: kept
    assert all(f.exists() for f in [*cached, other])
    (tmp_path / "policies" / "lru.py").write_text("v2")
    drop_stale_compiled_copies(tmp_path)
    assert not any(f.exists() for f in cached) and other.exists()
