"""GPU checks of the swap-in kernel against the replay engine (bit for bit) and the host rows.

Every step: slots and miss counts equal the engine's (``reference_swap_in``), and every selected
entry's device row equals its host row byte for byte (device rows are poisoned first). At the
end: each request's slot -> position table and LRU order equal the engine's final state, and
every occupied slot holds its position's row. Fresh random seeds; the seed is in every message.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from cupy_kernels.swap_in import HotBuffer, PinnedPool, SwapInError
from simulator.replay.swap_in_reference import reference_swap_in
from tests.test_swap_in_reference import random_batch

pytestmark = pytest.mark.gpu
TRACES = Path(__file__).resolve().parents[1] / "traces"


def _fresh_seed() -> int:
    return int.from_bytes(os.urandom(4), "little")


def _buffer(rng, *, requests, max_ctx, buffer, k, row_bytes, initial="prefix", layers=2, copy_order="flat",
            dup_check="bitmap", pdl=False, pool=None):
    import cupy as cp

    hb = HotBuffer(layers=layers, requests=requests, max_ctx=max_ctx, device_buffer_size=buffer, top_k=k,
                   row_bytes=row_bytes, initial=initial, copy_order=copy_order, dup_check=dup_check, pdl=pdl,
                   pool=pool)
    assert hb.copy_order == copy_order
    assert hb.dup_check == dup_check
    for lyr in range(layers):
        hb.host_rows(lyr)[:] = rng.integers(0, 256, hb.host_rows(lyr).shape, dtype=np.uint8)
    hb._dev.fill(0xA5)  # poison: an unwritten slot fails the row checks
    cp.cuda.Device().synchronize()
    return hb


def _run_and_check(hb, layer, idx, ctx, initial, msg, *, check_rows=True):
    """Run every step on the GPU, compare with the engine; returns the per-step miss counts."""
    import cupy as cp

    g = hb.geometry
    steps, n_req, _ = idx.shape
    d_idx, d_ctx = cp.asarray(idx), cp.asarray(ctx)
    slots = cp.full(idx.shape, -7, cp.int32)
    misses = cp.full((steps, n_req), -7, cp.int32)
    host_dev = cp.asarray(hb.host_rows(layer))
    dev = hb.device_rows(layer).reshape(n_req, g.buffer + 1, g.row_bytes)
    r_idx = cp.arange(n_req)[:, None]
    bad_rows = cp.zeros((), cp.int64)
    errors = cp.zeros((), cp.int64)
    for t in range(steps):
        hb.swap_in(layer, d_idx[t], d_ctx[t], slots_out=slots[t], misses_out=misses[t], check=False)
        errors += cp.count_nonzero(hb._errors[:, 0])
        if check_rows:
            live = d_idx[t] >= 0
            got = dev[r_idx, cp.where(live, slots[t], 0)]
            want = host_dev[r_idx, cp.where(live, d_idx[t], 0)]
            bad_rows += cp.count_nonzero((got != want).any(axis=2) & live)
    assert int(errors) == 0, f"kernel reported input errors ({msg})"
    assert int(bad_rows) == 0, f"{int(bad_rows)} selected entries read a wrong row ({msg})"
    return _compare(hb, layer, idx, ctx, initial, slots.get(), misses.get(), msg)


def _compare(hb, layer, idx, ctx, initial, got_slots, got_misses, msg):
    """Slots, miss counts, final tables, LRU orders and resident rows against the engine."""
    g = hb.geometry
    steps, n_req, _ = idx.shape
    dev = hb.device_rows(layer).reshape(n_req, g.buffer + 1, g.row_bytes)
    ref = reference_swap_in(idx, ctx, g.buffer, initial=initial)
    for t in range(steps):  # first differing step, for a readable failure
        if not (np.array_equal(got_slots[t], ref.slots[t]) and np.array_equal(got_misses[t], ref.misses[t])):
            r = int(np.flatnonzero((got_slots[t] != ref.slots[t]).any(axis=1) | (got_misses[t] != ref.misses[t]))[0])
            raise AssertionError(f"step {t} request {r}: misses {got_misses[t, r]} vs {ref.misses[t, r]}, "
                                 f"slots {got_slots[t, r][:16]} vs {ref.slots[t, r][:16]} ({msg})")
    state = hb.state(layer)
    for r in range(n_req):
        np.testing.assert_array_equal(state.slot_pos[r], ref.slot_pos[r], err_msg=f"slot_pos r={r} ({msg})")
        np.testing.assert_array_equal(state.orders[r], ref.orders[r], err_msg=f"order r={r} ({msg})")
        last = np.flatnonzero(ctx[:, r] > 0)
        if last.size and ctx[last[-1], r] > g.buffer:  # after a long step every occupied slot is right
            occ = np.flatnonzero(state.slot_pos[r] >= 0)
            rows = dev[r].get()[occ]
            np.testing.assert_array_equal(rows, hb.host_rows(layer)[r, state.slot_pos[r, occ]],
                                          err_msg=f"resident rows r={r} ({msg})")
    return got_misses


@pytest.mark.parametrize("initial, row_bytes, copy_order, dup_check",
                         [("prefix", 656, "flat", "bitmap"), ("empty", 512, "flat", "bitmap"),
                          ("prefix", 656, "flat", "hash"), ("prefix", 656, "request", "bitmap"),
                          ("prefix", 656, "hybrid", "bitmap"), ("empty", 512, "hybrid", "hash"),
                          ("prefix", 656, "early", "bitmap"), ("empty", 512, "early", "bitmap"),
                          ("prefix", 1152, "early", "hash")])
def test_random_streams_bit_exact(initial, row_bytes, copy_order, dup_check):
    seed = _fresh_seed()
    rng = np.random.default_rng(seed)
    idx, ctx = random_batch(rng, steps=1500, requests=4, k=48, buffer=64, max_ctx=300)
    hb = _buffer(rng, requests=4, max_ctx=300, buffer=64, k=48, row_bytes=row_bytes, initial=initial,
                 copy_order=copy_order, dup_check=dup_check)
    misses = _run_and_check(hb, 1, idx, ctx, initial,
                            f"seed={seed} initial={initial} row={row_bytes} order={copy_order} dup={dup_check}")
    assert misses.sum() > 10_000  # the streams really exercise evictions
    assert (hb.state(0).started == 0).all()  # layer 0 untouched


@pytest.mark.parametrize("dup_check", ["bitmap", "hash"])
def test_wide_steps_bit_exact(dup_check):
    """k 2600 and B 2800: more entries per thread than the kernel's batched first pass of loads
    (STEP_BATCH x THREADS = 2048), so the remainder loop runs too."""
    seed = _fresh_seed()
    rng = np.random.default_rng(seed)
    steps, n_req, k = 24, 2, 2600
    idx = np.full((steps, n_req, k), -1, np.int32)
    ctx = np.tile(4000 + np.arange(steps, dtype=np.int64)[:, None], (1, n_req))
    for r in range(n_req):
        prev = np.zeros(0, np.int64)
        for t in range(steps):
            n = int(rng.integers(2049, k + 1))
            keep = prev[rng.random(prev.size) < 0.75]
            fresh = rng.choice(int(ctx[t, r]), size=n, replace=False)
            sel = rng.permutation(np.unique(np.r_[keep, fresh]))[:n]
            idx[t, r, :n] = sel
            prev = sel
    hb = _buffer(rng, requests=2, max_ctx=4500, buffer=2800, k=2600, row_bytes=512, layers=1, initial="empty",
                 copy_order="early", dup_check=dup_check)
    misses = _run_and_check(hb, 0, idx, ctx, "empty", f"seed={seed} wide dup={dup_check}")
    assert (idx[:, :, 2048:] >= 0).any() and misses.sum() > 1000


@pytest.mark.parametrize("buffer, copy_order", [(32, "request"), (320, "early")])
def test_more_requests_than_blocks(buffer, copy_order):
    seed = _fresh_seed()
    rng = np.random.default_rng(seed)
    idx, ctx = random_batch(rng, steps=40, requests=300, k=16, buffer=buffer, max_ctx=buffer + 100)
    hb = _buffer(rng, requests=300, max_ctx=buffer + 100, buffer=buffer, k=16, row_bytes=1152, layers=1,
                 copy_order=copy_order)
    assert hb.max_grid < 300  # blocks loop over requests (R + 1 > B 32: the per-request copy order)
    _run_and_check(hb, 0, idx, ctx, "prefix", f"seed={seed} R=300 B={buffer} order={copy_order}")


def _trace_batch(max_streams: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Streams of the traces under traces/ (real ones too, if any) as one batch of requests."""
    from simulator.trace import open_trace

    files = sorted(TRACES.glob("*.hst"))
    every = [(s.layer, n, s) for n, path in enumerate(files) for s in open_trace(path)]
    streams = [s for _, _, s in sorted(every, key=lambda x: x[:2])][:max_streams]  # layer 0 first
    assert streams, "no .hst traces under traces/"
    steps = min(len(s.ctx_len) for s in streams)
    k = max(s.indices.shape[1] for s in streams)
    idx = np.full((steps, len(streams), k), -1, np.int32)
    ctx = np.zeros((steps, len(streams)), np.int64)
    for r, s in enumerate(streams):
        idx[:, r, : s.indices.shape[1]] = s.indices[:steps]
        ctx[:, r] = s.ctx_len[:steps]
    return idx, ctx, k


@pytest.mark.parametrize("buffer, initial", [(4096, "prefix"), (8192, "empty")])
def test_trace_streams_bit_exact(buffer, initial):
    seed = _fresh_seed()
    rng = np.random.default_rng(seed)
    idx, ctx, k = _trace_batch(8)
    max_ctx = int(ctx.max()) + 1
    hb = _buffer(rng, requests=idx.shape[1], max_ctx=max_ctx, buffer=buffer, k=k, row_bytes=656,
                 initial=initial, layers=1)
    misses = _run_and_check(hb, 0, idx, ctx, initial, f"seed={seed} traces B={buffer}")
    if initial == "empty":
        live = (idx[0] >= 0) & (idx[0] != ctx[0][:, None] - 1)
        long = ctx[0] > buffer  # (short real traces start in the fast path: no misses)
        assert (misses[0][long] == live.sum(axis=1)[long]).all()  # all but the newest miss


def test_generated_streams_cross_fast_path():
    from simulator.trace.generator import PRESETS, generate

    seed = _fresh_seed()
    rng = np.random.default_rng(seed)
    streams = list(generate(PRESETS["bursty"], steps=400, layers=2, requests=2, k=256, ctx0=300, seed=seed % 1000))
    idx = np.stack([s.indices for s in streams], axis=1)
    ctx = np.stack([s.ctx_len for s in streams], axis=1)
    assert (ctx <= 512).any() and (ctx > 512).any()
    hb = _buffer(rng, requests=len(streams), max_ctx=int(ctx.max()) + 1, buffer=512, k=idx.shape[2],
                 row_bytes=1152, layers=1)
    _run_and_check(hb, 0, idx, ctx, "prefix", f"seed={seed} generated")


def test_prefill_then_steps():
    import cupy as cp

    seed = _fresh_seed()
    rng = np.random.default_rng(seed)
    hb = _buffer(rng, requests=3, max_ctx=400, buffer=96, k=40, row_bytes=656, layers=2)
    hb.prefill()
    cp.cuda.Device().synchronize()
    dev = hb.device_rows(1).reshape(3, 97, 656).get()
    np.testing.assert_array_equal(dev[:, :96], hb.host_rows(1)[:, :96])
    idx, ctx = random_batch(rng, steps=300, requests=3, k=40, buffer=96, max_ctx=300, idle=0.0, restart=0.0)
    ctx = ctx - ctx.min() + 97  # long from the first step: the prefilled state is the initial prefix
    _run_and_check(hb, 1, idx, ctx, "prefix", f"seed={seed} prefill")


def test_bad_inputs_reported_and_state_kept():
    import cupy as cp

    seed = _fresh_seed()
    rng = np.random.default_rng(seed)
    hb = _buffer(rng, requests=3, max_ctx=300, buffer=64, k=32, row_bytes=512, layers=1)
    idx = np.tile(np.arange(100, 132, dtype=np.int32), (3, 1))
    ctx = np.full(3, 200, np.int64)
    hb.swap_in(0, idx, ctx)
    before = hb.state(0)
    bad = idx.copy()
    bad[0, 5] = 250  # outside [0, ctx_len)
    bad[2, 3] = -1  # padding in the middle
    with pytest.raises(SwapInError, match="request 0: entry 5 holds position 250.*request 2: a real entry"):
        hb.swap_in(0, cp.asarray(bad), cp.asarray(ctx))  # device inputs: found by the kernel
    after = hb.state(0)
    for r in (0, 2):
        np.testing.assert_array_equal(after.slot_pos[r], before.slot_pos[r])
        np.testing.assert_array_equal(after.orders[r], before.orders[r])
    with pytest.raises(SwapInError, match="request 1: ctx_len 301"):
        hb.swap_in(0, cp.asarray(idx), cp.asarray(np.array([200, 301, 200])))
    with pytest.raises(SwapInError, match="request 0: entry 5 holds position 250"):
        hb.swap_in(0, bad, ctx)  # host inputs: found before the launch
    rep = idx.copy()
    rep[1, 9] = rep[1, 2]
    with pytest.raises(SwapInError, match="request 1: position 102 appears more than once"):
        hb.swap_in(0, cp.asarray(rep), cp.asarray(ctx))
    np.testing.assert_array_equal(hb.state(0).slot_pos[1], after.slot_pos[1])
    with pytest.raises(ValueError, match="C-contiguous int32"):
        hb.swap_in(0, cp.asarray(idx, cp.int64), cp.asarray(ctx))


@pytest.mark.parametrize("backing", ["register", "register-thp"])
def test_registered_pools_bit_exact(backing):
    """Host pools pinned with cudaHostRegister (4 KB or transparent 2 MB pages) read through the
    kernel exactly as the driver-allocated one: same slots and misses as the engine, same rows."""
    seed = _fresh_seed()
    rng = np.random.default_rng(seed)
    idx, ctx = random_batch(rng, steps=400, requests=4, k=48, buffer=64, max_ctx=300)
    pool = PinnedPool(3 << 20, backing=backing)  # larger than the 2 x 4 x 300 x 656 B the buffer uses
    assert pool.backing == backing and pool.device_ptr != 0
    hb = _buffer(rng, requests=4, max_ctx=300, buffer=64, k=48, row_bytes=656, copy_order="early", pool=pool)
    misses = _run_and_check(hb, 1, idx, ctx, "prefix", f"seed={seed} backing={backing}")
    assert misses.sum() > 1000


@pytest.mark.parametrize("copy_order", ["flat", "request", "hybrid", "early"])
def test_small_for_sanitizer(copy_order):
    """Small: the case run under compute-sanitizer memcheck and racecheck (fast path and long)."""
    seed = _fresh_seed()
    rng = np.random.default_rng(seed)
    idx, ctx = random_batch(rng, steps=40, requests=3, k=32, buffer=64, max_ctx=200)
    ctx[20:] += 100  # the later steps past the buffer (their positions stay valid)
    hb = _buffer(rng, requests=3, max_ctx=300, buffer=64, k=32, row_bytes=656, layers=1, copy_order=copy_order)
    _run_and_check(hb, 0, idx, ctx, "prefix", f"seed={seed} sanitizer order={copy_order}")


@pytest.mark.parametrize("copy_order", ["early", "flat"])
def test_pdl_small_for_sanitizer(copy_order):
    """Programmatic dependent launches: two layers stepped in turn (each launch follows the other
    layer's, so each may overlap it), then both compared with the engine."""
    import cupy as cp

    seed = _fresh_seed()
    rng = np.random.default_rng(seed)
    steps, n_req, k, B, C = 60, 3, 32, 64, 300
    batches = [random_batch(rng, steps=steps, requests=n_req, k=k, buffer=B, max_ctx=C) for _ in range(2)]
    hb = _buffer(rng, requests=n_req, max_ctx=C, buffer=B, k=k, row_bytes=656, layers=2, copy_order=copy_order,
                 pdl=True)
    d = [(cp.asarray(i), cp.asarray(c)) for i, c in batches]
    slots = [cp.full(batches[0][0].shape, -7, cp.int32) for _ in range(2)]
    misses = [cp.full((steps, n_req), -7, cp.int32) for _ in range(2)]
    errors = cp.zeros((), cp.int64)
    bad_rows = cp.zeros((), cp.int64)
    host_dev = [cp.asarray(hb.host_rows(lyr)) for lyr in (0, 1)]
    dev = [hb.device_rows(lyr).reshape(n_req, B + 1, 656) for lyr in (0, 1)]
    r_idx = cp.arange(n_req)[:, None]
    modes = []
    for t in range(steps):
        for lyr in (0, 1):  # layer 1's launch follows layer 0's directly; the error word is shared
            hb.swap_in(lyr, d[lyr][0][t], d[lyr][1][t], slots_out=slots[lyr][t], misses_out=misses[lyr][t],
                       check=False)
            modes.append(hb.launch_mode)
        errors += cp.count_nonzero(hb._errors[:, 0])
        if t % 2:  # rows byte-equal (on even steps layer 0's launch follows layer 1's directly too)
            for lyr in (0, 1):
                live = d[lyr][0][t] >= 0
                got = dev[lyr][r_idx, cp.where(live, slots[lyr][t], 0)]
                want = host_dev[lyr][r_idx, cp.where(live, d[lyr][0][t], 0)]
                bad_rows += cp.count_nonzero((got != want).any(axis=2) & live)
    assert int(errors) == 0, f"kernel reported input errors (seed={seed})"
    assert int(bad_rows) == 0, f"{int(bad_rows)} selected entries read a wrong row (seed={seed})"
    assert modes[0] == "plain" and set(modes[1:]) <= {"pdl+cooperative", "pdl"}, set(modes)
    for lyr in (0, 1):
        _compare(hb, lyr, batches[lyr][0], batches[lyr][1], "prefix", slots[lyr].get(), misses[lyr].get(),
                 f"seed={seed} pdl layer={lyr} order={copy_order} ({modes[-1]})")
