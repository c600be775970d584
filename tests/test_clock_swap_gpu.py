"""The CLOCK multi-step swap-in kernel on the GPU against the replay engine's ``sglang-clock``,
bit for bit (skipped without a GPU; tests/test_clock_swap_reference.py checks the same algorithm
on the CPU): misses per step, every entry's slot after its commit, final slot contents, and the
copied rows byte for byte against the host pool, in both copy modes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from simulator.replay.engine import replay_policy
from simulator.trace import open_trace
from tests.helpers import random_stream

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.gpu


def _pool(R, C, row_bytes, rng):
    from cupy_kernels.swap_in import PinnedPool

    pool = PinnedPool(R * C * row_bytes)
    arr = pool.array.reshape(R, C, row_bytes)
    arr[:] = rng.integers(0, 256, arr.shape, dtype=np.uint8)
    return pool, arr, pool.device_ptr


def _run(streams, B, S, *, initial="prefix", copy="inline", row=656, idle=(), check_rows=True):
    """streams: per request (indices [T, k], ctx [T]), T a multiple of S; idle: (request, commit)
    pairs left out of that request's stream (ctx 0 for the commit)."""
    from cupy_kernels.clock_swap import ClockHotBuffer

    rng = np.random.default_rng(B + S)
    R = len(streams)
    T, k = streams[0][0].shape
    C = int(max(c.max() for _, c in streams)) + 1
    host, arr, ptr = _pool(R, C, row, rng)
    hb = ClockHotBuffer(requests=R, max_ctx=C, buffer=B, steps=S, top_k=k, row_bytes=row, host_ptr=ptr,
                        initial=initial, copy=copy)
    commits = T // S
    want = []
    for r, (idx, ctx) in enumerate(streams):
        keep = np.ones(T, bool)
        for rr, c in idle:
            if rr == r:
                keep[c * S:(c + 1) * S] = False
        want.append((keep, replay_policy("sglang-clock", idx[keep], ctx[keep], B, reserve=True,
                                         prefix=initial == "prefix", batched=True, seed=0, record=True, group=S)))
    got_slots = [np.full((T, k), -1, np.int32) for _ in range(R)]
    got_miss = [np.zeros(T, np.int64) for _ in range(R)]
    rows = hb.dev.reshape(R, hb.rows, row)
    last_ctx = np.zeros(R, np.int64)
    for c in range(commits):
        sl = slice(c * S, (c + 1) * S)
        idx = np.stack([s[0][sl] for s in streams])
        ctx = np.stack([s[1][sl] for s in streams]).astype(np.int64)
        for rr, cc in idle:
            if cc == c:
                ctx[rr] = 0
                idx[rr] = -1
        before = hb.state()
        slots, misses = hb.swap_in(idx, ctx)
        slots, misses = slots.get(), misses.get()
        dev = rows.get() if check_rows else None
        for r in range(R):
            if ctx[r, -1] == 0:
                continue
            got_slots[r][sl] = np.where(slots[r] > B, -1, slots[r])
            got_miss[r][sl] = misses[r]
            fresh = last_ctx[r] <= B
            prefill = fresh and (initial == "prefix" or last_ctx[r] > 0)
            last_ctx[r] = ctx[r, -1]
            if not check_rows or ctx[r, -1] <= B:
                continue
            held = set() if fresh else set(before[r][before[r] >= 0].tolist())
            for t in range(S):
                for j in np.flatnonzero(idx[r, t] >= 0):
                    p = int(idx[r, t, j])
                    if p >= ctx[r, 0] - 1 or p in held or (prefill and p < B):
                        continue  # reserved; a hit; the fresh prefix (prefill copies those rows)
                    v = int(slots[r, t, j])  # a miss: its victim slot, or B + 1 + i if not cached
                    assert v >= 0 and v != B, f"commit {c} request {r}: miss {p} has slot {v}"
                    np.testing.assert_array_equal(dev[r, v], arr[r, p], err_msg=f"commit {c} request {r}")
    final = hb.state()
    for r, (keep, ref) in enumerate(want):
        np.testing.assert_array_equal(got_miss[r][keep], ref.misses, err_msg=f"request {r}")
        np.testing.assert_array_equal(got_slots[r][keep], ref.slots, err_msg=f"request {r}")
        np.testing.assert_array_equal(final[r], ref.slot_pos, err_msg=f"request {r}")
    del host


@pytest.mark.parametrize("copy", ["inline", "plan"])
@pytest.mark.parametrize("S", [1, 2, 4])
@pytest.mark.parametrize("B", [256, 192])
@pytest.mark.parametrize("initial", ["prefix", "empty"])
def test_clock_kernel_matches_engine_random(copy, S, B, initial):
    rng = np.random.default_rng(S * 7 + B)
    streams = []
    for r in range(5):
        s = random_stream(rng, steps=8 * S, k=96, ctx0=(150 if r == 0 else 400 + 60 * r),
                          overlap=(0.85, 0.4, 0.1, 0.0, 0.6)[r], ragged=r == 3)
        streams.append((s.indices, s.ctx_len))
    _run(streams, B, S, initial=initial, copy=copy, idle=[(2, 3)])


@pytest.mark.parametrize("S", [1, 2, 4])
def test_clock_kernel_matches_engine_bundled_trace(S):
    """glm51-longbench streams (k 2048) at B 4096: both CLOCK paths at S = 4."""
    src = open_trace(ROOT / "traces" / "glm51-longbench.hst")
    streams = []
    for key in src.keys[:4]:
        s = src.read(key)
        streams.append((s.indices[:8 * S], s.ctx_len[:8 * S]))
    _run(streams, 4096, S, check_rows=S == 4)
