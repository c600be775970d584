"""The sharded-LRU kernels on the GPU against the replay engine, bit for bit (skipped without a
GPU): the whole-trace replay (many streams and configs in one launch) and the one-step swap-in
in both copy modes (rows checked byte for byte against the host pool)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from simulator.replay.engine import replay_policy
from simulator.replay.swap_in_reference import reference_swap_in
from simulator.trace import open_trace
from tests.helpers import random_stream

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.gpu


def _engine(idx, ctx, cfg):
    policy = "lru" if cfg.ways == cfg.buffer else "salru"
    return replay_policy(policy, idx, ctx, cfg.buffer, reserve=cfg.reserve, prefix=cfg.prefix, batched=True, seed=0,
                         param=cfg.ways if policy == "salru" else 0)


def _compare(streams, configs):
    from cupy_kernels.sharded_lru import replay

    got = replay(streams, configs)
    for c, cfg in enumerate(configs):
        for s, (idx, ctx) in enumerate(streams):
            ref = _engine(idx, ctx, cfg)
            np.testing.assert_array_equal(got.misses[c][s], ref.misses, err_msg=f"{cfg} stream {s}")
            np.testing.assert_array_equal(got.slot_pos[c][s], ref.slot_pos, err_msg=f"{cfg} stream {s}")
            np.testing.assert_array_equal(got.order[c][s], ref.order, err_msg=f"{cfg} stream {s}")
    return got


def test_replay_random_streams_many_configs():
    from cupy_kernels.sharded_lru import ShardConfig

    rng = np.random.default_rng(1)
    streams = []
    for i in range(12):
        s = random_stream(rng, steps=60, k=48, ctx0=200 + 13 * i, overlap=(0.9, 0.5, 0.1)[i % 3], ragged=i % 2 == 1)
        streams.append((s.indices, s.ctx_len))
    configs = [ShardConfig(64, 64), ShardConfig(64, 16), ShardConfig(96, 32, prefix=False),
               ShardConfig(128, 128, reserve=False), ShardConfig(64, 4), ShardConfig(80, 16)]
    _compare(streams, configs)


def test_replay_bundled_trace_streams():
    from cupy_kernels.sharded_lru import ShardConfig

    src = open_trace(ROOT / "traces" / "glm51-longbench.hst")
    streams = []
    for key in src.keys[:6]:
        s = src.read(key)
        streams.append((s.indices[:300], s.ctx_len[:300]))
    configs = [ShardConfig(4096, 4096), ShardConfig(4096, 32), ShardConfig(8192, 64), ShardConfig(2048, 2048, False)]
    _compare(streams, configs)


def _pool(R, C, row_bytes, rng):
    from cupy_kernels.swap_in import PinnedPool

    pool = PinnedPool(R * C * row_bytes)
    arr = pool.array.reshape(R, C, row_bytes)
    arr[:] = rng.integers(0, 256, arr.shape, dtype=np.uint8)
    return pool, arr, pool.device_ptr


@pytest.mark.parametrize("copy", ["inline", "plan"])
@pytest.mark.parametrize("B,W", [(256, 256), (256, 32), (256, 8)])
@pytest.mark.parametrize("initial", ["prefix", "empty"])
def test_swap_in_matches_engine_and_copies_rows(copy, B, W, initial):
    from cupy_kernels.sharded_lru import ShardedHotBuffer

    rng = np.random.default_rng(B + W)
    R, k, C, row = 5, 128, 1200, 656
    steps = 12
    idx = np.full((steps, R, k), -1, np.int32)
    ctx = np.zeros((steps, R), np.int64)
    for r in range(R):
        s = random_stream(rng, steps=steps, k=k, ctx0=(150 if r == 0 else 400 + 50 * r), overlap=(0.8, 0.3)[r % 2],
                          ragged=r == 3)
        idx[:, r], ctx[:, r] = s.indices, s.ctx_len
    ctx[4, 2] = 0  # an idle request this step
    idx[4, 2] = -1
    host, arr, ptr = _pool(R, C, row, rng)
    hb = ShardedHotBuffer(requests=R, max_ctx=C, buffer=B, ways=W, top_k=k, row_bytes=row, host_ptr=ptr,
                          initial=initial, copy=copy)
    ref = reference_swap_in(idx, ctx, B, initial=initial, policy="lru" if W == B else "salru", ways=W)
    rows = hb.dev.reshape(R, hb.rows, row)
    last_ctx = np.zeros(R, np.int64)  # ctx_len of each request's last active step (0: none yet)
    for t in range(steps):
        before, _ = hb.state()
        slots, misses = hb.swap_in(idx[t], ctx[t])
        slots = slots.get()
        live = ctx[t] > 0
        np.testing.assert_array_equal(misses.get()[live], ref.misses[t][live], err_msg=f"step {t}")
        np.testing.assert_array_equal(np.where(slots > B, -1, slots), ref.slots[t], err_msg=f"step {t}")
        dev = rows.get()
        for r in np.flatnonzero(live):
            fresh = last_ctx[r] <= B  # the step starts from a fresh state
            prefill = fresh and (initial == "prefix" or last_ctx[r] > 0)
            last_ctx[r] = ctx[t, r]
            if ctx[t, r] <= B:
                continue  # fast path: nothing loaded by this kernel
            held = set() if fresh else set(before[r][before[r] >= 0].tolist())
            for j in np.flatnonzero(idx[t, r] >= 0):
                p = int(idx[t, r, j])
                if p == ctx[t, r] - 1 or p in held or (prefill and p < B):
                    continue  # the reserved newest; a hit; the fresh prefix (prefill copies those rows)
                np.testing.assert_array_equal(dev[r, slots[r, j]], arr[r, p], err_msg=f"step {t} request {r}")
    sp, orders = hb.state()
    np.testing.assert_array_equal(sp, ref.slot_pos)
    for r in range(R):
        np.testing.assert_array_equal(orders[r], ref.orders[r])
    del host


def test_cli_gpu_backend_matches_cpu(capsys):
    """``hisparse replay --backend gpu`` prints the CPU engine's table (lru and salru, 2 sizes)."""
    from simulator.cli import main

    trace = str(ROOT / "traces" / "synthetic-dsa-like.hst")
    out = {}
    for backend in ("cpu", "gpu"):
        assert main(["replay", trace, "--policy", "lru,salru", "--buffer", "2048,4096", "--json", "--quiet",
                     "--backend", backend]) == 0
        out[backend] = capsys.readouterr().out
    assert out["gpu"] == out["cpu"]
