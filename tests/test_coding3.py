"""Format version 3's coding (leavers by their place in the decoder's slot array): the writer, the
numba reference decoder and the C decoders (rows, checked rows, step changes) against each other
on good data and on crafted payloads whose checksums all hold; version 2 files still read."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from simulator import native
from simulator.errors import TraceError
from simulator.replay import ReplayConfig, replay
from simulator.replay import backend as paths
from simulator.replay.engine import replay_policy
from simulator.trace import Stream, TraceMeta, TraceReader, codec_jit, write_trace
from simulator.trace.codec import encode_stream
from tests.helpers import random_stream
from tests.hst_craft import Chunk, craft

needs_c = pytest.mark.skipif(not native.available(), reason="HISPARSE_NATIVE=0: no compiled decoders")


def _sorted_rows(indices: np.ndarray) -> np.ndarray:
    """Each row ascending, its -1 padding kept at the end (how unordered rows are stored)."""
    big = np.iinfo(np.int32).max
    return np.where((rows := np.sort(np.where(indices < 0, big, indices), axis=1)) == big, -1, rows).astype(np.int32)


def test_slot_array_rule_on_every_shape():
    """slots_apply, the rule writer and readers share: arrivals fill the leavers' places in order,
    extra arrivals go at the end, and a shrinking set moves its tail entries (in order) into the
    places left below the new count; slot_of follows every move."""
    rng = np.random.default_rng(0)
    for _ in range(300):
        n_prev = int(rng.integers(0, 12))
        slots = np.full(16, -7, np.int64)
        slots[:n_prev] = rng.choice(100, size=n_prev, replace=False)
        slot_of = np.full(200, -1, np.int64)
        slot_of[slots[:n_prev]] = np.arange(n_prev)
        leave = np.sort(rng.choice(n_prev, size=int(rng.integers(0, n_prev + 1)), replace=False)).astype(np.int64)
        pool = np.setdiff1d(np.arange(100, 200), slots[:n_prev])
        arrive = np.sort(rng.choice(pool, size=int(rng.integers(0, 16 - n_prev + len(leave) + 1)), replace=False))
        kept = [int(p) for i, p in enumerate(slots[:n_prev]) if i not in set(leave.tolist())]
        n = codec_jit.slots_apply(slots, n_prev, leave, len(leave), arrive.astype(np.int64), len(arrive), slot_of)
        assert n == n_prev - len(leave) + len(arrive)
        assert sorted(slots[:n].tolist()) == sorted(kept + arrive.tolist())
        assert all(slot_of[p] == i for i, p in enumerate(slots[:n]))
        assert (slot_of >= 0).sum() == n
        placed = {int(leave[i]): int(arrive[i]) for i in range(min(len(leave), len(arrive)))}
        assert all(slots[i] == p for i, p in placed.items())  # arrivals in the leavers' places, in order


@pytest.mark.parametrize("keep_order", [False, True])
def test_coding_3_round_trips_and_is_smaller_than_coding_2(keep_order):
    """Every row comes back (sorted, or in stored order with keep_order); on churning steps the
    bitmap of leavers keeps the coded bytes below coding 2's."""
    rng = np.random.default_rng(1 + keep_order)
    sizes = {2: 0, 3: 0}
    for overlap in (0.0, 0.5, 0.9, 1.0):
        s = random_stream(rng, steps=40, k=64, ctx0=500, overlap=overlap, ragged=True)
        for coding in (2, 3):
            payload, ordered = encode_stream(s.indices, s.ctx_len, keep_order=keep_order, coding=coding)
            raw = np.frombuffer(zlib.decompress(payload), np.uint8)
            sizes[coding] += len(raw)
            out, ctx = np.empty(s.indices.shape, np.int32), np.empty(s.steps, np.int64)
            assert tuple((codec_jit.decode3 if coding == 3 else codec_jit.decode)(raw, s.steps, 64, ordered, out,
                                                                                   ctx)) == (0, 0)
            assert np.array_equal(ctx, s.ctx_len)
            assert np.array_equal(out, s.indices if ordered else _sorted_rows(s.indices))
    assert sizes[3] < sizes[2]


def _mutate(raw: bytes, rng: np.random.Generator) -> bytes:
    b = bytearray(raw)
    kind = int(rng.integers(5))
    at = int(rng.integers(len(b))) if b else 0
    if kind == 0 and b:
        b[at] ^= int(rng.integers(1, 256))
    elif kind == 1:
        b = b[:at]
    elif kind == 2:
        b[at:at] = bytes([int(rng.integers(256))])
    elif kind == 3 and b:
        del b[at]
    else:  # a varint made large: an arrival far past ctx_len, a gap past the set
        b[at:at + 1] = bytes([0xFF, 0xFF, 0xFF, 0x7F])
    return bytes(b)


@needs_c
@pytest.mark.parametrize("coding", [2, 3])
@pytest.mark.parametrize("keep_order", [False, True])
def test_crafted_payloads_fast_paths_and_reader_agree(tmp_path, coding, keep_order):
    """Coded steps damaged and compressed again, in files whose checksums all hold: the C
    decoder returns numba's code and step; where the reader refuses the stream, both coded
    replay paths give up (and replay() raises the reader's error); where it reads it, they give
    the engine's misses."""
    rng = np.random.default_rng(40 + coding + 2 * keep_order)
    k = 12
    configs = [ReplayConfig(buffer=b, reserve_newest=r) for b in (12, 20) for r in (True, False)]
    seq = [ReplayConfig(policy=p, buffer=8, semantics="sequential") for p in ("lru", "opt", "lfu")]
    refused = read = 0
    for case in range(120):
        s = random_stream(rng, steps=int(rng.integers(2, 25)), k=k, ctx0=int(rng.integers(13, 40)),
                          overlap=float(rng.choice([0.2, 0.7, 0.95])), ragged=bool(rng.integers(2)))
        payload, ordered = encode_stream(s.indices, s.ctx_len, keep_order=keep_order, coding=coding)
        raw = zlib.decompress(payload) if case % 5 == 0 else _mutate(zlib.decompress(payload), rng)
        out = [np.full(s.indices.shape, 5, np.int32) for _ in range(2)]
        ctx = [np.zeros(s.steps, np.int64) for _ in range(2)]
        buf = np.frombuffer(raw, np.uint8)
        ref = tuple(int(v) for v in (codec_jit.decode3 if coding == 3 else codec_jit.decode)(
            buf, s.steps, k, ordered, out[0], ctx[0]))
        assert ref == native.decode(raw, s.steps, k, ordered, out[1], ctx[1], coding=coding)
        accesses, ctx_last = s.accesses, int(s.ctx_len[-1])
        if ref == (0, 0) and case % 2 and 1 <= ctx[0][-1] < 2**62:  # the header agrees: the rules decide
            accesses, ctx_last = int((out[0] >= 0).sum()), int(ctx[0][-1])
        chunk = Chunk(steps=s.steps, width=k, ordered=int(ordered), accesses=accesses, ctx_last=ctx_last,
                      payload=zlib.compress(raw))
        path = craft(tmp_path / f"c{case}.hst", b'{"k": %d, "source": {}}' % k, [chunk],
                     version=3 if coding == 3 else 2)
        reader = TraceReader(path)
        coded = reader.coded_chunks((0, 0))
        fast = paths.coded_misses(coded, configs, k, per_step=True)
        rows = paths.coded_rows(coded, k)
        try:
            stream = reader.read((0, 0))
        except TraceError:
            refused += 1
            assert fast is None and rows is None, case
            with pytest.raises(TraceError):
                replay(TraceReader(path), configs + seq)
            continue
        read += 1
        assert fast is not None and rows is not None, case
        for cfg, misses in zip(configs, fast.misses, strict=True):
            ref_m = replay_policy("lru", stream.indices, stream.ctx_len, cfg.buffer, reserve=cfg.reserve_newest,
                                  prefix=True, batched=True, seed=0).misses
            assert np.array_equal(misses, ref_m), case
        for cfg in seq:
            ref_m = replay_policy(str(cfg.policy), stream.indices, stream.ctx_len, cfg.buffer, reserve=True,
                                  prefix=True, batched=False, seed=0).misses
            assert paths.rows_misses(rows, cfg) == int(ref_m.sum()), case
    assert refused > 40 and read > 20  # both sides of the agreement were exercised


def test_version_2_files_still_read_and_replay_as_version_3(tmp_path):
    """The same streams written as version 2 (coding 2) and 3: the same rows, the same replay on
    every path (changes, rows, the numba engine)."""
    rng = np.random.default_rng(5)
    streams = [Stream(0, layer, s.ctx_len, s.indices) for layer in range(3)
               for s in [random_stream(rng, steps=50, k=16, ctx0=30, overlap=0.6, ragged=True)]]
    configs = [ReplayConfig(buffer=24), ReplayConfig(buffer=16, semantics="sequential", policy="opt"),
               ReplayConfig(buffer=20, policy="lfu", semantics="sequential")]
    results = []
    for version in (2, 3):
        path = tmp_path / f"v{version}.hst"
        write_trace(path, TraceMeta(k=16, source={"kind": "test"}), streams, version=version)
        reader = TraceReader(path)
        assert reader.version == version and reader.meta.format_version == version
        for key, s in zip(reader.keys, streams, strict=True):
            assert np.array_equal(reader.read(key).indices, _sorted_rows(s.indices))
        results.append(replay(TraceReader(path), configs).records)
    assert results[0] == results[1]


def test_a_version_this_reader_cannot_write_is_refused(tmp_path):
    from simulator.trace import TraceWriter

    with pytest.raises(TraceError, match="cannot write format version 1"):
        TraceWriter(tmp_path / "x.hst", k=4, source={}, version=1)
