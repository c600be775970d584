"""The .hst format: round trips, chunking, compactness and atomic writes."""

from __future__ import annotations

import os

import numpy as np
import pytest

from simulator.errors import TraceError
from simulator.trace import TraceMeta, TraceReader, TraceWriter, open_trace, write_trace
from simulator.trace.generator import PRESETS, generate
from simulator.trace.stats import trace_info
from tests.helpers import random_stream

META = TraceMeta(k=64, source={"kind": "test"})


def _sorted_rows(indices: np.ndarray) -> np.ndarray:
    keyed = np.where(indices >= 0, indices, np.iinfo(np.int32).max)
    return np.sort(keyed, axis=1)


@pytest.mark.parametrize("ragged", [False, True])
def test_round_trip_sorted_keeps_sets_and_ctx(tmp_path, ragged):
    rng = np.random.default_rng(1)
    streams = [random_stream(rng, request=r, layer=layer, ragged=ragged) for r in range(2) for layer in range(3)]
    path = tmp_path / "t.hst"
    write_trace(path, META, streams)
    with TraceReader(path) as reader:
        assert reader.keys == [s.key for s in streams]
        assert reader.meta.k == 64 and reader.meta.source == {"kind": "test"}
        for s in streams:
            back = reader.read(s.key)
            np.testing.assert_array_equal(back.ctx_len, s.ctx_len)
            np.testing.assert_array_equal(_sorted_rows(back.indices), _sorted_rows(s.indices))
            assert (np.diff(back.step(0)) > 0).all(), "default storage is sorted"


def test_round_trip_keep_order_is_exact(tmp_path):
    rng = np.random.default_rng(2)
    s = random_stream(rng, ragged=True)
    path = tmp_path / "o.hst"
    write_trace(path, META, [s], keep_order=True)
    back = open_trace(path).read((0, 0))
    np.testing.assert_array_equal(back.indices, s.indices)


def test_chunked_and_stepwise_writes_read_back_as_one_stream(tmp_path):
    rng = np.random.default_rng(3)
    s = random_stream(rng, steps=37)
    path = tmp_path / "c.hst"
    with TraceWriter(path, k=64, source={}, chunk_steps=8, keep_order=True) as w:
        for t in range(s.steps):
            w.write(request=5, layer=7, step=t, ctx_len=int(s.ctx_len[t]), indices=s.step(t))
    back = open_trace(path).read((5, 7))
    np.testing.assert_array_equal(back.indices, s.indices)
    np.testing.assert_array_equal(back.ctx_len, s.ctx_len)


def test_stepwise_write_out_of_order_is_refused(tmp_path):
    with TraceWriter(tmp_path / "x.hst", k=4, source={}) as w:
        w.write(0, 0, 0, 10, [1, 2])
        with pytest.raises(TraceError, match="step 2 written out of order, expected step 1"):
            w.write(0, 0, 2, 11, [1, 2])


def test_compactness_on_high_overlap_trace(tmp_path):
    """>= 90% adjacent-step overlap must cost at most 1.0 byte per access on disk."""
    path = tmp_path / "h.hst"
    streams = generate(PRESETS["high-locality"], steps=200, layers=2, requests=1, k=2048, ctx0=32768, seed=0)
    write_trace(path, TraceMeta(k=2048, source={}), streams)
    info = trace_info(open_trace(path))
    assert info["overlap_mean"] >= 0.9
    assert info["bytes_per_access"] <= 1.0
    assert info["bytes_per_access"] == os.path.getsize(path) / info["accesses"]


def test_atomic_write_leaves_nothing_on_error(tmp_path):
    path = tmp_path / "a.hst"
    bad = random_stream(np.random.default_rng(4))
    bad.indices[3, 0] = 10_000  # out of range
    with pytest.raises(TraceError):
        write_trace(path, META, [random_stream(np.random.default_rng(5)), bad])
    assert list(tmp_path.iterdir()) == []


def test_crash_mid_write_leaves_readable_file(tmp_path):
    """A non-atomic writer that dies keeps every complete chunk readable with recover=True."""
    rng = np.random.default_rng(6)
    s = random_stream(rng, steps=40)
    path = tmp_path / "live.hst"
    w = TraceWriter(path, k=64, source={"kind": "hook"}, atomic=False, chunk_steps=10)
    for t in range(35):  # 3 chunks flushed, 5 steps buffered, then the process "dies"
        w.write(0, 0, t, int(s.ctx_len[t]), s.step(t))
    w._fh.flush()
    # cut into the middle of nothing: the file ends after chunk 3
    with pytest.raises(TraceError, match="truncated file"):
        TraceReader(path)
    with pytest.warns(UserWarning, match="recovered 3 complete chunks"):
        back = TraceReader(path, recover=True).read((0, 0))
    assert back.steps == 30
    np.testing.assert_array_equal(_sorted_rows(back.indices), _sorted_rows(s.indices[:30]))
    # a chunk cut in half is dropped, the ones before it kept
    data = path.read_bytes()
    path.write_bytes(data[:-7])
    with pytest.warns(UserWarning, match="recovered 2 complete chunks"):
        assert TraceReader(path, recover=True).read((0, 0)).steps == 20
