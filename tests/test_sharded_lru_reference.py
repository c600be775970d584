"""The sharded-LRU kernels' algorithm (``cupy_kernels/sharded_lru_model.py``: arrays split and
rotated per shard, no lists) against the replay engine's ``lru`` (one shard of B ways) and
``salru`` (B / W shards), bit for bit: misses per step, every entry's slot, final slots and
order. Runs without a GPU: it proves the formulation the CUDA kernels implement."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cupy_kernels import sharded_lru_model as model
from simulator.replay.engine import replay_policy
from simulator.trace import open_trace
from tests.helpers import random_stream

ROOT = Path(__file__).resolve().parent.parent


def _engine(policy, idx, ctx, B, W, prefix, reserve):
    return replay_policy(policy, idx, ctx, B, reserve=reserve, prefix=prefix, batched=True, seed=0, record=True,
                         param=W if policy == "salru" else 0)


def _check(idx, ctx, B, W, prefix, reserve):
    policy = "lru" if W == B else "salru"
    ref = _engine(policy, idx, ctx, B, W, prefix, reserve)
    got = model.replay(idx, ctx, B, W, prefix=prefix, reserve=reserve)
    np.testing.assert_array_equal(got.misses, ref.misses)
    np.testing.assert_array_equal(np.where(got.slots == model.NOT_CACHED, -1, got.slots), ref.slots)
    np.testing.assert_array_equal(got.slot_pos, ref.slot_pos)
    np.testing.assert_array_equal(got.order, ref.order)
    return got


@pytest.mark.parametrize("B,W", [(64, 64), (64, 16), (64, 8), (96, 32), (48, 16), (80, 80)])
@pytest.mark.parametrize("prefix", [True, False])
@pytest.mark.parametrize("reserve", [True, False])
def test_model_matches_engine_random(B, W, prefix, reserve):
    rng = np.random.default_rng(B * 7 + W + 3 * prefix + reserve)
    for overlap, ragged in ((0.9, False), (0.5, True), (0.0, False)):
        s = random_stream(rng, steps=30, k=32, ctx0=150, overlap=overlap, ragged=ragged)
        _check(s.indices, s.ctx_len, B, W, prefix, reserve)


def test_model_overflow_is_exercised():
    """Small shards overflow on low-overlap steps: misses served but not cached occur, and the
    model still matches the engine."""
    rng = np.random.default_rng(5)
    s = random_stream(rng, steps=40, k=48, ctx0=400, overlap=0.2)
    got = _check(s.indices, s.ctx_len, 64, 4, True, True)
    assert (got.slots == model.NOT_CACHED).any()


def test_model_fast_path_and_back():
    """Contexts that shrink below the buffer and grow past it again (a fresh prefix each time)."""
    rng = np.random.default_rng(9)
    s = random_stream(rng, steps=30, k=16, ctx0=70, overlap=0.6)
    ctx = s.ctx_len.copy()
    ctx[10:14] = 60  # <= B: fast path (entries must stay below ctx)
    idx = s.indices.copy()
    idx[10:14] = np.where(idx[10:14] < 59, idx[10:14], -1)
    idx[10:14] = -np.sort(-idx[10:14], axis=1)  # padding at the end
    _check(idx, ctx, 64, 16, False, True)
    _check(idx, ctx, 64, 64, False, True)


@pytest.mark.parametrize("W", [32, 4096])
def test_model_matches_engine_bundled_trace(W):
    """The first stream of glm51-longbench (k 2048), 40 steps, B 4096: LRU and 128 shards."""
    src = open_trace(ROOT / "traces" / "glm51-longbench.hst")
    s = src.read(src.keys[0])
    _check(s.indices[:40], s.ctx_len[:40], 4096, W, True, True)
