"""CPU checks of the swap-in kernel's host side and of the semantics it implements.

The semantics live in one place, the replay engine's batched ``lru``; these tests check the
properties of it that the kernel's algorithm relies on (victims = least recently used non-hit
slots, new order = stale + loaded misses + hits, first occurrence owns a duplicate, newest in
slot B, fast path p -> p), the batch wrapper ``reference_swap_in`` and the input validation.
"""

from __future__ import annotations

import numpy as np
import pytest

from cupy_kernels.swap_in import (
    ERR_CTX,
    ERR_DUP,
    ERR_PAD,
    ERR_POS,
    POOL_BACKINGS,
    SMEM_LIMIT,
    PinnedPool,
    SwapInError,
    decode_errors,
    host_errors,
    make_geometry,
    smem_bytes,
    validate_step,
)
from simulator.replay.engine import replay_policy
from simulator.replay.swap_in_reference import reference_swap_in
from tests.helpers import random_stream


def random_batch(rng: np.random.Generator, *, steps: int, requests: int, k: int, buffer: int,
                 max_ctx: int, idle: float = 0.02,
                 restart: float = 0.01) -> tuple[np.ndarray, np.ndarray]:
    """Independent random streams per request, [steps, R, k] int32 and [steps, R] int64.

    Each starts in the fast path (ctx <= buffer) and grows past it; contexts restart now and then
    (re-entering the fast path), requests go idle (ctx 0, all padding), steps keep ~75% of the
    previous selection, are shuffled and padded at the end; positions are distinct.
    """
    indices = np.full((steps, requests, k), -1, np.int32)
    ctx_len = np.zeros((steps, requests), np.int64)
    for r in range(requests):
        ctx = int(rng.integers(1, buffer))
        prev = np.zeros(0, np.int64)
        for t in range(steps):
            if rng.random() < idle:
                continue
            ctx = ctx + 1 if ctx < max_ctx and rng.random() >= restart else int(rng.integers(1, buffer))
            ctx_len[t, r] = ctx
            n = int(rng.integers(1, min(k, ctx) + 1))
            keep = prev[prev < ctx]
            keep = keep[rng.random(keep.size) < 0.75][:n]
            fresh = rng.choice(ctx, size=min(ctx, n), replace=False)
            sel = np.unique(np.r_[keep, fresh])
            sel = rng.permutation(sel)[:n]
            if rng.random() < 0.8 and (sel != ctx - 1).all():
                sel[-1] = ctx - 1  # the newest token, usually selected
            sel = rng.permutation(sel)
            indices[t, r, : sel.size] = sel
            prev = sel.astype(np.int64)
    return indices, ctx_len


# --------------------------------------------------------------------------------------------
# Geometry and validation
# --------------------------------------------------------------------------------------------
def _geom(**kw):
    args = dict(layers=2, requests=3, max_ctx=1000, device_buffer_size=128, top_k=64, row_bytes=656)
    args.update(kw)
    return make_geometry(**args)


def test_geometry_sizes():
    g = _geom()
    assert g.host_bytes == 2 * 3 * 1000 * 656
    assert g.layer_host_bytes == 3 * 1000 * 656
    assert g.device_row_bytes == 2 * 3 * 129 * 656
    assert g.copy_capacity == 3 * (128 + 64 + 1)
    ballots = (128 + 31) // 32 + 16
    assert g.smem_bytes == smem_bytes(128, 64) == 4 * (4 * 64 + 2 * 128 + ballots) + 128


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(device_buffer_size=32, top_k=64), "must be >= top_k"),
        (dict(row_bytes=650), "multiple of 16"),
        (dict(layers=0), "layers must be a positive integer"),
        (dict(top_k=2.5), "top_k must be a positive integer"),
        (dict(requests=100_000, max_ctx=100_000), "fit in int32"),
        (dict(device_buffer_size=60_000, top_k=2048), "shared memory"),
    ],
)
def test_geometry_errors(kw, match):
    with pytest.raises(ValueError, match=match):
        _geom(**kw)


def test_deployment_geometries_fit():
    for buffer in (4096, 6144, 8192, 16384):
        assert smem_bytes(buffer, 2048) <= SMEM_LIMIT
        make_geometry(layers=4, requests=256, max_ctx=40_000, device_buffer_size=buffer, top_k=2048,
                      row_bytes=1152)


def test_duplicate_bitmap_fits_or_falls_back():
    g = _geom(max_ctx=32832, device_buffer_size=4096, top_k=2048)
    assert g.dup_bitmap_words == 1026  # one bit per position
    assert smem_bytes(4096, 2048, 1026) == smem_bytes(4096, 2048) + 4 * 1026 <= SMEM_LIMIT
    huge = _geom(max_ctx=4_000_000, device_buffer_size=8192, top_k=2048)
    assert huge.dup_bitmap_words == 0  # 500 KB of bits do not fit: the hash table instead


@pytest.mark.parametrize("kw, match", [(dict(nbytes=0), "must be positive"),
                                       (dict(nbytes=1 << 20, backing="hugetlb"), "alloc, register, register-thp")])
def test_pinned_pool_arguments_checked_before_cuda(kw, match):
    """A bad size or backing is refused by name before CuPy is needed (this runs without a GPU)."""
    assert POOL_BACKINGS == ("alloc", "register", "register-thp")
    with pytest.raises(ValueError, match=match):
        PinnedPool(**kw)


def test_launch_ex_structs_and_arguments():
    """The ctypes mirrors of CUlaunchConfig / CUlaunchAttribute and the argument packing."""
    import ctypes

    from cupy_kernels import _launch

    assert ctypes.sizeof(_launch._Attr) == 72 and _launch._Attr.value.offset == 8
    assert ctypes.sizeof(_launch._Config) == 56 and _launch._Config.hStream.offset == 32
    assert _launch._Config.attrs.offset == 40 and _launch._Config.numAttrs.offset == 48
    assert _launch._param(np.int32(-3)).value == -3
    assert _launch._param(np.uint64(2**40)).value == 2**40
    assert isinstance(_launch._param(np.uint32(7)), ctypes.c_uint32)
    with pytest.raises(TypeError, match="float"):
        _launch._param(1.5)


def test_validate_step_shapes_and_dtypes():
    g = _geom()
    ok_idx, ok_ctx = np.tile(np.arange(64, dtype=np.int32), (3, 1)), np.full(3, 500, np.int64)
    validate_step(g, ok_idx, ok_ctx)
    validate_step(g, ok_idx[:, :10].astype(np.int64), ok_ctx)  # narrower steps, any int dtype on the host
    with pytest.raises(ValueError, match="indices must be"):
        validate_step(g, np.zeros((2, 64), np.int32), ok_ctx)
    with pytest.raises(ValueError, match="w <= top_k"):
        validate_step(g, np.zeros((3, 65), np.int32), ok_ctx)
    with pytest.raises(ValueError, match="ctx_len must be"):
        validate_step(g, ok_idx, np.full(4, 500))
    with pytest.raises(ValueError, match="integers"):
        validate_step(g, ok_idx.astype(np.float32), ok_ctx)
    with pytest.raises(ValueError, match="2 dimension"):
        validate_step(g, np.zeros(64, np.int32), ok_ctx)


def test_validate_step_values():
    g = _geom()
    idx = np.tile(np.arange(64, dtype=np.int32), (3, 1))
    ctx = np.array([500, 500, 500])
    bad = idx.copy()
    bad[1, 7] = 500
    with pytest.raises(SwapInError, match=r"request 1: entry 7 holds position 500, outside \[0, ctx_len=500\)"):
        validate_step(g, bad, ctx)
    with pytest.raises(SwapInError, match="request 2: ctx_len 1001 outside"):
        validate_step(g, idx, np.array([500, 500, 1001]))
    gap = idx.copy()
    gap[0, 10] = -1
    with pytest.raises(SwapInError, match="padding that starts at entry 10"):
        validate_step(g, gap, ctx)
    with pytest.raises(SwapInError, match="request 0: entry 0 holds position 0"):
        validate_step(g, idx, np.array([0, 500, 500]))  # idle requests must be all padding
    idle = idx.copy()
    idle[0] = -1
    validate_step(g, idle, np.array([0, 500, 500]))
    rep = idx.copy()
    rep[2, 40], rep[2, 50] = 7, 3  # 3 and 7 now appear twice: the smallest is named
    with pytest.raises(SwapInError, match="request 2: position 3 appears more than once"):
        validate_step(g, rep, ctx)


def test_host_and_kernel_error_messages_agree():
    idx = np.tile(np.arange(64), (3, 1))
    idx[0, 3] = 900
    idx[1, 5:] = -1
    idx[1, 9] = 4
    ctx = np.array([800, 800, 5000, 800])
    idx = np.r_[idx, idx[:1]]
    idx[3] = np.arange(64)
    idx[3, 60] = 11
    host = host_errors(_geom(requests=4), idx, ctx)
    kernel_words = np.array([[ERR_POS, 3], [ERR_PAD, 5], [ERR_CTX, -1], [ERR_DUP, 11]], np.int32)
    assert decode_errors(_geom(requests=4), kernel_words, idx, ctx) == host
    assert len(host) == 4


# --------------------------------------------------------------------------------------------
# The semantics, through the engine
# --------------------------------------------------------------------------------------------
def _run(indices, ctx, buffer, prefix=True):
    return replay_policy("lru", indices, ctx, buffer, reserve=True, prefix=prefix, batched=True, seed=0,
                         record=True)


@pytest.mark.parametrize("seed", range(4))
def test_batched_lru_step_is_partition_of_old_order(seed):
    """Victims are the oldest non-hit slots; new order = stale, loaded misses (stored order), hits."""
    rng = np.random.default_rng(seed)
    buffer = 48
    s = random_stream(rng, steps=25, k=32, ctx0=200, overlap=0.7, ragged=True)
    idx = s.indices.copy()
    for t in range(1, len(idx)):
        before, after = _run(idx[:t], s.ctx_len[:t], buffer), _run(idx[: t + 1], s.ctx_len[: t + 1], buffer)
        row = idx[t][idx[t] >= 0]
        newest = s.ctx_len[t] - 1
        old_order = list(before.order)
        resident = {int(before.slot_pos[x]): x for x in old_order}
        hits = {resident[p] for p in row if p != newest and p in resident}
        misses = list(dict.fromkeys(int(p) for p in row if p != newest and p not in resident))
        nonhit = [x for x in old_order if x not in hits]
        victims = nonhit[: len(misses)]
        assert after.misses[-1] == len(misses)
        assert [int(after.slot_pos[v]) for v in victims] == misses
        expect = nonhit[len(misses):] + victims + [x for x in old_order if x in hits]
        assert list(after.order) == expect
        slots = after.slots[-1]
        for j, p in enumerate(idx[t]):
            want = -1 if p < 0 else (buffer if p == newest else int(np.flatnonzero(after.slot_pos == p)[0]))
            assert slots[j] == want


def test_fast_path_and_initial_modes():
    buffer = 16
    idx = np.array([[0, 3, 9, -1], [2, 9, 10, -1], [0, 5, 17, 16]], np.int32)
    ctx = np.array([10, 11, 18])
    run = _run(idx, ctx, buffer)
    np.testing.assert_array_equal(run.slots[0], [0, 3, buffer, -1])  # newest 9 -> reserved slot
    np.testing.assert_array_equal(run.slots[1], [2, 9, buffer, -1])
    assert list(run.misses) == [0, 0, 1]  # leaving the fast path: prefix [0, 16) resident, 16 misses
    empty = _run(idx[2:], ctx[2:], buffer, prefix=False)
    assert list(empty.misses) == [3]  # 0, 5, 16 (17 is newest)
    np.testing.assert_array_equal(empty.slots[0], [0, 1, buffer, 2])  # free slots in order


def test_reference_batch_matches_engine_and_skips_idle_steps():
    rng = np.random.default_rng(7)
    idx, ctx = random_batch(rng, steps=300, requests=3, k=24, buffer=40, max_ctx=160)
    assert (ctx == 0).any() and (ctx > 40).any() and (ctx <= 40).any()
    for t in range(idx.shape[0]):
        validate_step(_geom(requests=3, max_ctx=160, device_buffer_size=40, top_k=24), idx[t], ctx[t])
    for initial in ("prefix", "empty"):
        ref = reference_swap_in(idx, ctx, 40, initial=initial)
        for r in range(3):
            live = ctx[:, r] > 0
            run = _run(idx[live, r], ctx[live, r], 40, prefix=initial == "prefix")
            np.testing.assert_array_equal(ref.slots[live, r], run.slots)
            np.testing.assert_array_equal(ref.misses[live, r], run.misses)
            assert (ref.slots[~live, r] == -1).all() and (ref.misses[~live, r] == 0).all()
            np.testing.assert_array_equal(ref.slot_pos[r], run.slot_pos)
            np.testing.assert_array_equal(ref.orders[r], run.order)
    with pytest.raises(ValueError, match="initial"):
        reference_swap_in(idx, ctx, 40, initial="warm")


def test_engine_needs_distinct_positions():
    """Why the kernel rejects repeated positions: the engine's batched LRU counts a repeated hit
    twice, and in a step that loads nothing its hit walk then revisits moved slots, so the new
    order departs from the documented stale + misses + hits (here [0, 2, 3, 1], not [0, 2, 1, 3]).
    Top-k steps never repeat a position (trace readers refuse it), so the kernel refuses it too."""
    ok = _run(np.array([[1, 3]], np.int32), np.array([10]), 4)
    rep = _run(np.array([[1, 1, 3]], np.int32), np.array([10]), 4)
    assert list(ok.order) == [0, 2, 1, 3]
    assert list(rep.order) in ([0, 2, 3, 1], [0, 2, 1, 3])  # the first until the engine counts distinct hits
