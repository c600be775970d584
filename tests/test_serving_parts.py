"""The serving model's parts on their own: the page-granular pool and the decode manager's memory
check and retraction, each on a hand-made case."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.errors import HisparseError
from simulator.serving.decode_manager import DecodeManager
from simulator.serving.pool import RankPool
from simulator.serving.state import Rank, Request


def _req(rid: int, n_in: int, generated: int, n_out: int = 1000) -> Request:
    return Request(rid, n_in, n_out, rid, 0.0, generated=generated, target=n_in)


def test_hisparse_available_is_the_smaller_of_logical_and_device():
    pool = RankPool(64, device_slots=1000, host_slots=8000, hisparse=True)
    assert pool.available() == 1000 and pool.available_logical() == 8000
    base = RankPool(64, device_slots=1000, host_slots=0, hisparse=False)
    assert base.available() == base.available_logical() == 1000


def test_a_chunk_that_does_not_fit_takes_nothing():
    pool = RankPool(64, device_slots=128, host_slots=10**6, hisparse=True)
    r = _req(0, 200, 0)
    assert not pool.alloc_prefill(r, 200)  # 256 slots (4 pages) > 128
    assert (pool.free_device, pool.free_host, r.slots_device, r.slots_host) == (128, 10**6, 0, 0)
    assert pool.alloc_prefill(r, 100)  # 2 pages
    assert (pool.free_device, r.slots_device, r.slots_host) == (0, 128, 128) and pool.peak_device == 128
    r.prefilled = 100
    assert pool.pages_opened(r.prefilled, 28) == 0 and pool.pages_opened(r.prefilled, 29) == 64


def test_decode_pages_go_to_logical_slots_under_hisparse_and_release_returns_all():
    pool = RankPool(64, device_slots=4160, host_slots=10**6, hisparse=True)
    r = _req(0, 128, 1)  # next KV position 128: opens a page
    pool.take(r, 4160, 128)
    pool.grow(r, 64)
    assert (r.slots_device, r.slots_host) == (4160, 192) and pool.free_device == 0
    pool.release(r)
    assert (pool.free_device, pool.free_host) == (4160, 10**6)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 300), min_size=1, max_size=6), st.integers(0, 2000), st.integers(1, 200))
def test_room_steps_is_the_last_step_whose_pages_fit(positions, free, n):
    """room_steps(n) counts the steps whose cumulative page openings fit the free slots: checked
    against stepping the requests one decode step at a time."""
    pool = RankPool(64, device_slots=free, host_slots=0, hisparse=False)
    reqs = [_req(i, p + 1, 0) for i, p in enumerate(positions)]  # next KV position p
    want, used = 0, 0
    for step in range(n):
        used += pool.page * sum(1 for p in positions if (p + step) % pool.page == 0)
        if used > free:
            break
        want = step + 1
    assert pool.room_steps(reqs, n) == want


def test_retraction_frees_requests_until_the_rest_fit():
    """Three requests each open a page next step (3 x 64 slots) with 130 free: retract_order's
    first victim goes back to the queue with its slots, the other two fit, the ratio is re-estimated."""
    pool = RankPool(64, device_slots=10**4, host_slots=0, hisparse=False)
    k = Rank(pool, ratio=0.5)
    for i, gen in enumerate((1, 65, 129)):
        r = _req(i, 64, gen)
        pool.take(r, 640, 0)
        k.running.append(r)
    pool.free_device = 130
    dm = DecodeManager(None, None, pd=False, kv_copy_time=lambda n: 0.0, files="t")
    dm.check(k)
    assert dm.retractions == 1 and len(k.running) == 2 and len(k.waiting) == 1
    out = k.waiting[0]
    assert pool.free_device == 130 + 640 and out.slots_device == 0
    assert out.target == out.input_tokens + out.generated and dm.reprefill_tokens == out.target
    assert k.ratio != 0.5 and not k.batch_is_full


def test_the_last_request_is_never_retracted():
    pool = RankPool(64, device_slots=64, host_slots=0, hisparse=False)
    k = Rank(pool, ratio=0.5)
    r = _req(0, 64, 1)
    pool.take(r, 64, 0)
    k.running.append(r)
    dm = DecodeManager(None, None, pd=False, kv_copy_time=lambda n: 0.0, files="the files")
    with pytest.raises(HisparseError, match="the files: out of KV memory with one request left"):
        dm.check(k)
    assert k.running == [r] and dm.retractions == 0


def test_pd_retraction_offloads_and_queues_for_resumption():
    pool = RankPool(64, device_slots=10**4, host_slots=0, hisparse=False)
    k = Rank(pool, ratio=0.5)
    r = _req(0, 1000, 11)
    pool.take(r, 1024, 0)
    dm = DecodeManager(None, None, pd=True, kv_copy_time=lambda n: n * 1e-6, files="t")
    dm.retract(k, r)
    assert k.retracted == [r] and not k.waiting and dm.pending_copy_s == pytest.approx(1010e-6)
    assert pool.free_device == 10**4 and r.slots_device == 0  # its slots back in the pool
