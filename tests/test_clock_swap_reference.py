"""The CLOCK multi-step swap-in kernel's algorithm (``cupy_kernels/clock_model.py``: disjoint
sample sets in parallel, the approximate path in rounds, probes in order) against the replay
engine's ``sglang-clock`` (SGLang PR #32162), bit for bit: misses per step, every entry's slot
after its commit, final slot contents. Runs without a GPU: it proves the formulation the CUDA
kernel implements."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cupy_kernels import clock_model as model
from simulator.replay.engine import replay_policy
from simulator.trace import open_trace
from tests.helpers import random_stream

ROOT = Path(__file__).resolve().parent.parent


def _check(idx, ctx, B, steps, prefix=True, reserve=True):
    ref = replay_policy("sglang-clock", idx, ctx, B, reserve=reserve, prefix=prefix, batched=True, seed=0,
                        record=True, group=steps)
    got = model.replay(idx, ctx, B, steps, prefix=prefix, reserve=reserve)
    np.testing.assert_array_equal(got.misses, ref.misses)
    np.testing.assert_array_equal(got.slots, ref.slots)
    np.testing.assert_array_equal(got.slot_pos, ref.slot_pos)
    return got


@pytest.mark.parametrize("B", [64, 48, 96])
@pytest.mark.parametrize("steps", [1, 2, 4])
@pytest.mark.parametrize("prefix", [True, False])
def test_model_matches_engine_random(B, steps, prefix):
    rng = np.random.default_rng(B * 11 + steps + 5 * prefix)
    for overlap, ragged, k in ((0.9, False, 24), (0.5, True, 32), (0.1, False, 40), (0.0, True, 48)):
        s = random_stream(rng, steps=24, k=k, ctx0=160, overlap=overlap, ragged=ragged)
        _check(s.indices, s.ctx_len, B, steps, prefix, reserve=bool(rng.integers(0, 2)))


def test_model_takes_both_paths_and_needs_rounds():
    """Low overlap at 4 steps per commit overflows the buffer (the approximate path). With B a
    power of two the candidate lists never collide (j -> j * HASH mod B is a bijection), so one
    round settles every miss; with B = 48 or 96 some commits need more, and the model still
    matches the engine."""
    rng = np.random.default_rng(3)
    seen_rounds = 0
    for trial in range(6):
        s = random_stream(rng, steps=32, k=40, ctx0=300, overlap=0.2 * trial / 5)
        got = _check(s.indices, s.ctx_len, (48, 96)[trial % 2], 4)
        seen_rounds = max(seen_rounds, got.rounds)
    assert seen_rounds >= 2


def test_model_fast_path_and_back():
    rng = np.random.default_rng(9)
    s = random_stream(rng, steps=24, k=16, ctx0=70, overlap=0.6)
    ctx = s.ctx_len.copy()
    idx = s.indices.copy()
    ctx[8:12] = 60 + np.arange(4)  # <= B: fast path
    idx[8:12] = np.where(idx[8:12] < 59, idx[8:12], -1)
    idx[8:12] = -np.sort(-idx[8:12], axis=1)
    for steps in (1, 2, 4):
        _check(idx, ctx, 64, steps, prefix=False)


@pytest.mark.parametrize("steps", [1, 4])
def test_model_matches_engine_bundled_trace(steps):
    """The first stream of glm51-longbench (k 2048), B 4096."""
    src = open_trace(ROOT / "traces" / "glm51-longbench.hst")
    s = src.read(src.keys[0])
    _check(s.indices[:24], s.ctx_len[:24], 4096, steps)
