"""The compiled fast paths (simulator/native) against their numba references, bit for bit.

The replay engine defines batched LRU; the C version computes it from each step's changes and
must agree on every step's misses, every entry's slot, the final slot contents and the final
recency order. The C decoder and checker must agree with codec_jit on good and corrupt data.
"""

from __future__ import annotations

import itertools
import os
import zlib

import numpy as np
import pytest

from simulator import native
from simulator.replay import ReplayConfig, replay
from simulator.replay.backend import coded_misses
from simulator.replay.engine import replay_policy
from simulator.trace import (
    CodedChunk,
    Stream,
    TraceMeta,
    TraceReader,
    TraceWriter,
    codec_jit,
    write_trace,
)
from simulator.trace.codec import encode_stream
from tests.helpers import random_stream


def test_native_module_is_built():
    """CI installs with a C compiler: the fast paths must be there (HISPARSE_NATIVE=0 opts out)."""
    if os.environ.get("HISPARSE_NATIVE") == "0":
        assert not native.available()
    else:
        assert native.available(), "simulator/native/_native.c was not built by pip install"


def wandering_stream(rng: np.random.Generator, *, steps: int, k: int, ctx0: int, overlap: float) -> Stream:
    """Rows that keep ~overlap of the previous step, a context that grows by 0-2 tokens (so the
    newest token repeats), the newest token often selected, -1 padding on short rows, random
    stored order."""
    ctx = ctx0 + np.cumsum(rng.integers(0, 3, size=steps)).astype(np.int64)
    rows = np.full((steps, k), -1, dtype=np.int32)
    cur = rng.choice(ctx0, size=min(k, ctx0), replace=False)
    for t in range(steps):
        c = int(ctx[t])
        keep = cur[rng.random(len(cur)) < overlap]
        n = int(rng.integers(max(1, k // 2), k + 1))
        pool = np.setdiff1d(np.arange(c), keep)
        new = rng.choice(pool, size=max(0, min(n - len(keep), len(pool))), replace=False)
        cur = np.r_[keep[:n], new].astype(np.int64)
        if rng.random() < 0.5 and c - 1 not in cur:
            cur[-1] = c - 1
        rng.shuffle(cur)
        rows[t, :len(cur)] = cur
    return Stream(0, 0, ctx, rows)


def _engine(stream: Stream, B: int, reserve: bool, prefix: bool):
    return replay_policy("lru", stream.indices, stream.ctx_len, B, reserve=reserve, prefix=prefix, batched=True,
                         seed=0, record=True)


@pytest.mark.parametrize("seed", range(6))
def test_batched_lru_rows_match_engine(seed):
    rng = np.random.default_rng(seed)
    for _ in range(25):
        k = int(rng.integers(2, 40))
        stream = wandering_stream(rng, steps=int(rng.integers(1, 90)), k=k, ctx0=int(rng.integers(k + 1, 4 * k)),
                                  overlap=float(rng.choice([0.3, 0.8, 0.95, 1.0])))
        B = int(rng.integers(k, 3 * k + 2))  # batched needs B >= k; small B reaches the fast path
        for reserve, prefix in itertools.product([True, False], repeat=2):
            ref = _engine(stream, B, reserve, prefix)
            got = native.lru_batched(stream.indices, stream.ctx_len, B, reserve=reserve, prefix=prefix, record=True)
            assert np.array_equal(got.misses, ref.misses)
            assert np.array_equal(got.slots, ref.slots)
            assert np.array_equal(got.slot_pos, ref.slot_pos)
            assert np.array_equal(got.order, ref.order)


@pytest.mark.parametrize("seed", range(6))
def test_sequential_lru_rows_match_engine(seed):
    rng = np.random.default_rng(100 + seed)
    for _ in range(25):
        k = int(rng.integers(2, 40))
        stream = wandering_stream(rng, steps=int(rng.integers(1, 90)), k=k, ctx0=int(rng.integers(k + 1, 4 * k)),
                                  overlap=float(rng.choice([0.3, 0.8, 0.95, 1.0])))
        B = int(rng.integers(1, 3 * k + 2))  # sequential takes any B, smaller than a step too
        for reserve, prefix in itertools.product([True, False], repeat=2):
            ref = replay_policy("lru", stream.indices, stream.ctx_len, B, reserve=reserve, prefix=prefix,
                                batched=False, seed=0, record=True)
            got = native.lru_sequential(stream.indices, stream.ctx_len, B, reserve=reserve, prefix=prefix, record=True)
            assert np.array_equal(got.misses, ref.misses)
            assert np.array_equal(got.slots, ref.slots)
            assert np.array_equal(got.slot_pos, ref.slot_pos)
            assert np.array_equal(got.order, ref.order)


@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize("policy", ["opt", "lfu"])
@pytest.mark.parametrize("seed", range(6))
def test_keyed_rows_match_engine(seed, policy, batched):
    """OPT and LFU in C, sequential and batched (protected hits, victims in (key, slot) order),
    against the numba engine: every step's misses and the final slots, 100 replays each."""
    rng = np.random.default_rng(200 + seed + 10 * batched)
    for _ in range(25):
        k = int(rng.integers(2, 40))
        stream = wandering_stream(rng, steps=int(rng.integers(1, 90)), k=k, ctx0=int(rng.integers(k + 1, 4 * k)),
                                  overlap=float(rng.choice([0.3, 0.8, 0.95, 1.0])))
        B = int(rng.integers(k if batched else 1, 3 * k + 2))  # batched needs B >= k
        for reserve, prefix in itertools.product([True, False], repeat=2):
            ref = replay_policy(policy, stream.indices, stream.ctx_len, B, reserve=reserve, prefix=prefix,
                                batched=batched, seed=0)
            misses, slot_pos = native.keyed_sequential(policy, stream.indices, stream.ctx_len, B, reserve=reserve,
                                                       prefix=prefix, batched=batched)
            assert np.array_equal(misses, ref.misses)
            assert np.array_equal(slot_pos, ref.slot_pos)


def test_batched_lru_fed_in_pieces_equals_one_pass():
    rng = np.random.default_rng(7)
    stream = random_stream(rng, steps=120, k=32, ctx0=40, overlap=0.9)
    whole = native.lru_batched(stream.indices, stream.ctx_len, 48, reserve=True, prefix=False)
    lru = native.BatchedLru(48, reserve=True, prefix=False)
    parts = [lru.rows(stream.indices[a:b], stream.ctx_len[a:b])[0] for a, b in [(0, 5), (5, 6), (6, 77), (77, 120)]]
    assert np.array_equal(np.concatenate(parts), whole.misses)
    slot_pos, order = lru.result()
    assert np.array_equal(slot_pos, whole.slot_pos) and np.array_equal(order, whole.order)


def test_a_reset_state_replays_as_a_new_one():
    """LruPool's reuse between streams: after reset, a state that replayed other streams (past
    the fast path, larger contexts, or only fast-path steps) gives what a new state gives."""
    rng = np.random.default_rng(11)
    lru = native.BatchedLru(48, reserve=True, prefix=True)
    pool = native.LruPool()
    for i in range(30):
        fast_only = i % 5 == 0  # contexts stay within the buffer: 17 + 2 * 15 < 48
        stream = wandering_stream(rng, steps=15 if fast_only else int(rng.integers(1, 60)), k=16,
                                  ctx0=17 if fast_only else int(rng.integers(20, 400)),
                                  overlap=float(rng.choice([0.3, 0.9])))
        assert fast_only == bool(stream.ctx_len.max() <= 48)
        fresh = native.lru_batched(stream.indices, stream.ctx_len, 48, reserve=True, prefix=True, record=True)
        lru.reset()
        misses, slots = lru.rows(stream.indices, stream.ctx_len, record=True)
        slot_pos, order = lru.result()
        assert np.array_equal(misses, fresh.misses) and np.array_equal(slots, fresh.slots)
        assert np.array_equal(slot_pos, fresh.slot_pos) and np.array_equal(order, fresh.order)
        taken = pool.take(48, True, True)
        assert np.array_equal(taken.rows(stream.indices, stream.ctx_len)[0], fresh.misses)
        pool.give([taken])


def test_batched_lru_rejects_a_step_larger_than_the_buffer():
    stream = Stream(0, 0, np.array([50], dtype=np.int64), np.arange(10, dtype=np.int32)[None, :])
    with pytest.raises(ValueError, match="step 0 selects more entries than the buffer's 8 slots"):
        native.lru_batched(stream.indices, stream.ctx_len, 8, reserve=True, prefix=True)


@pytest.mark.parametrize("keep_order", [False, True])
def test_coded_replay_matches_engine_for_several_buffers_at_once(tmp_path, keep_order):
    rng = np.random.default_rng(11 + keep_order)
    configs = [ReplayConfig(buffer=b, initial=i, reserve_newest=r)
               for b in (24, 31, 64) for i in ("prefix", "empty") for r in (True, False)]
    streams = [wandering_stream(rng, steps=int(rng.integers(1, 150)), k=24, ctx0=int(rng.integers(25, 60)),
                                overlap=float(o)) for o in (0.5, 0.9, 0.97, 1.0)]
    streams = [Stream(i, 0, s.ctx_len, s.indices) for i, s in enumerate(streams)]
    path = tmp_path / "t.hst"
    write_trace(path, TraceMeta(k=24, source={"kind": "test"}), streams, keep_order=keep_order)
    reader = TraceReader(path)
    for key in reader.keys:
        stream = reader.read(key)
        got = coded_misses(reader.coded_chunks(key), configs, 24, per_step=True)
        assert got is not None
        assert np.array_equal(got.ctx_len, stream.ctx_len)
        assert got.accesses == stream.accesses
        # The same through the states themselves, to compare the final buffer and recency order.
        outs, lrus = _replay_changes(reader.coded_chunks(key), configs, 24)
        for cfg, misses, out, lru in zip(configs, got.misses, outs, lrus, strict=True):
            ref = _engine(stream, cfg.buffer, cfg.reserve_newest, cfg.initial == "prefix")
            assert np.array_equal(misses, ref.misses), (key, cfg)
            assert np.array_equal(out, ref.misses)
            slot_pos, order = lru.result()
            assert np.array_equal(slot_pos, ref.slot_pos) and np.array_equal(order, ref.order), (key, cfg)


def test_coded_replay_spans_chunks(tmp_path):
    """Small chunks: each chunk's first step has no coded changes; the replay carries on."""
    from simulator.trace import TraceWriter

    rng = np.random.default_rng(3)
    stream = wandering_stream(rng, steps=200, k=16, ctx0=20, overlap=0.9)
    path = tmp_path / "c.hst"
    with TraceWriter(path, k=16, source={"kind": "test"}, chunk_steps=7) as w:
        w.write_stream(stream)
    reader = TraceReader(path)
    chunks = reader.coded_chunks((0, 0))
    assert len(chunks) == 29
    cfg = ReplayConfig(buffer=20)
    got = coded_misses(chunks, [cfg], 16, per_step=True)
    assert np.array_equal(got.misses[0], _engine(stream, 20, True, True).misses)
    assert got.totals == [int(got.misses[0].sum())]


def test_coded_replay_gives_up_on_a_corrupt_chunk_and_the_reader_names_it(tmp_path):
    rng = np.random.default_rng(5)
    path = tmp_path / "bad.hst"
    write_trace(path, TraceMeta(k=16, source={"kind": "test"}), [random_stream(rng, steps=30, k=16, ctx0=20)])
    reader = TraceReader(path)
    (info, payload), = reader.chunks((0, 0))
    raw = bytearray(zlib.decompress(payload))
    raw[len(raw) // 2] ^= 0x55  # corrupt, then re-compress (the checksum would catch it otherwise)
    bad = CodedChunk(info.steps, info.width, info.ordered, zlib.compress(bytes(raw)))
    assert coded_misses([bad], [ReplayConfig(buffer=16)], 16, per_step=False) is None
    truncated = CodedChunk(info.steps, info.width, info.ordered, payload[:-3])  # does not decompress
    assert truncated.coded() is None
    assert coded_misses([truncated], [ReplayConfig(buffer=16)], 16, per_step=False) is None


def test_replay_native_and_reference_agree(tmp_path, monkeypatch):
    rng = np.random.default_rng(9)
    streams = [Stream(r, layer, s.ctx_len, s.indices) for r in range(2) for layer in range(2)
               for s in [random_stream(rng, steps=60, k=32, ctx0=40, overlap=0.9)]]
    path = tmp_path / "s.hst"
    write_trace(path, TraceMeta(k=32, source={"kind": "test"}), streams)
    configs = [ReplayConfig(buffer=b) for b in (32, 48)]
    fast = replay(TraceReader(path), configs, per_step=True)
    summary_only = replay(TraceReader(path), configs)
    monkeypatch.setenv("HISPARSE_NATIVE", "0")
    slow = replay(TraceReader(path), configs, per_step=True)
    assert fast.records == slow.records == summary_only.records
    assert not summary_only.streams
    for a, b in zip(fast.streams, slow.streams, strict=True):
        assert (a.request, a.layer, a.config) == (b.request, b.layer, b.config)
        assert np.array_equal(a.misses, b.misses) and np.array_equal(a.ctx_len, b.ctx_len)


def _decode_both(raw: np.ndarray, steps: int, width: int, ordered: bool, extra: int, coding: int):
    out = [np.full((steps, width + extra), 7, np.int32) for _ in range(2)]
    ctx = [np.zeros(steps, np.int64) for _ in range(2)]
    ref = tuple(int(v) for v in (codec_jit.decode3 if coding == 3 else codec_jit.decode)(raw, steps, width, ordered,
                                                                                          out[0], ctx[0]))
    got = tuple(native.decode(raw.tobytes(), steps, width, ordered, out[1], ctx[1], coding=coding))
    return ref, got, out, ctx


@pytest.mark.parametrize("coding", [2, 3])
@pytest.mark.parametrize("keep_order", [False, True])
def test_decoder_matches_reference_on_good_and_corrupt_data(keep_order, coding):
    rng = np.random.default_rng(21 + keep_order + 2 * coding)
    for _ in range(60):
        k = int(rng.integers(1, 40))
        stream = random_stream(rng, steps=int(rng.integers(1, 50)), k=k, ctx0=int(rng.integers(k + 1, 5 * k + 2)),
                               overlap=float(rng.choice([0.3, 0.9, 1.0])), ragged=bool(rng.integers(2)))
        payload, ordered = encode_stream(stream.indices, stream.ctx_len, keep_order=keep_order, coding=coding)
        raw = np.frombuffer(zlib.decompress(payload), np.uint8)
        extra = int(rng.integers(0, 3))
        ref, got, out, ctx = _decode_both(raw, stream.steps, k, ordered, extra, coding)
        assert ref == got == (0, 0)
        assert np.array_equal(out[0], out[1]) and np.array_equal(ctx[0], ctx[1])
        want = stream.indices if ordered else np.sort(np.where(stream.indices < 0, 2**31 - 1, stream.indices), axis=1)
        assert np.array_equal(np.where(out[0][:, :k] == -1, 2**31 - 1, out[0][:, :k]) if not ordered else out[0][:, :k],
                              want)
        for _ in range(6):  # truncated or with a flipped byte: the same error code and step
            bad = raw.copy()
            if rng.integers(2):
                bad = bad[: int(rng.integers(0, len(bad)))]
            else:
                bad[int(rng.integers(len(bad)))] ^= int(rng.integers(1, 256))
            ref, got, _, _ = _decode_both(bad, stream.steps, k, ordered, extra, coding)
            assert ref == got


@pytest.mark.parametrize("case", ["ok", "negative", "range", "twice", "too_many", "ctx_down", "ctx_zero", "pad"])
def test_checker_matches_reference(case):
    rng = np.random.default_rng(0)
    stream = random_stream(rng, steps=12, k=8, ctx0=20)
    idx, ctx, k = stream.indices.copy(), stream.ctx_len.copy(), 8
    if case == "negative":
        idx[4, 2] = -3
    elif case == "range":
        idx[5, 1] = ctx[5]
    elif case == "twice":
        idx[6, 3] = idx[6, 0]
    elif case == "too_many":
        k = 7
    elif case == "ctx_down":
        ctx[7] = ctx[6] - 1
    elif case == "ctx_zero":
        ctx[0] = 0
    elif case == "pad":
        idx[3, 1] = -1
    ref = tuple(int(v) for v in codec_jit.check_rows(idx, ctx, k))
    got = native.check_rows(idx, ctx, k)
    assert ref == got
    assert (ref[0] == 0) == (case == "ok")


def test_coded_replay_of_more_buffers_than_one_pass_takes(tmp_path):
    """70 buffers: two decoding passes (64 + 6), the same misses as one buffer at a time."""
    rng = np.random.default_rng(4)
    stream = random_stream(rng, steps=40, k=16, ctx0=100, overlap=0.9)
    path = tmp_path / "m.hst"
    write_trace(path, TraceMeta(k=16, source={"kind": "test"}), [stream])
    reader = TraceReader(path)
    chunks, stored = reader.coded_chunks((0, 0)), reader.read((0, 0))  # rows come back sorted
    configs = [ReplayConfig(buffer=b) for b in range(16, 86)]
    got = coded_misses(chunks, configs, 16, per_step=True)
    assert len(got.misses) == 70
    for cfg, misses in zip(configs, got.misses, strict=True):
        assert list(misses) == list(coded_misses(chunks, [cfg], 16, per_step=True).misses[0])
        assert np.array_equal(misses, _engine(stored, cfg.buffer, True, True).misses)


def test_replay_command_on_hst_imports_neither_numpy_nor_numba(tmp_path):
    """The start-up the speed target depends on: batched LRU on a .hst file loads no numpy/numba."""
    if not native.available():
        pytest.skip("HISPARSE_NATIVE=0: the reference path loads numba by design")
    import subprocess
    import sys
    from pathlib import Path

    rng = np.random.default_rng(8)
    path = tmp_path / "s.hst"
    write_trace(path, TraceMeta(k=16, source={"kind": "test"}), [random_stream(rng, steps=30, k=16, ctx0=40)])
    probe = ("import sys\nfrom simulator.cli import main\n"
             f"code = main(['replay', {str(path)!r}, '--policy', 'lru', '--buffer', '16,24', '--quiet', '--json'])\n"
             "print('LOADED', sorted(m for m in ('numpy', 'numba', 'pandas') if m in sys.modules))\n"
             "sys.exit(code)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).parent.parent).stdout
    assert '"misses"' in out
    assert "LOADED []" in out


def test_replay_command_on_npy_imports_neither_numpy_nor_numba(tmp_path):
    """LRU (both semantics) on a plain int32 .npy: the rows are mapped and replayed in C."""
    if not native.available():
        pytest.skip("HISPARSE_NATIVE=0: the reference path loads numba by design")
    import subprocess
    import sys
    from pathlib import Path

    path = tmp_path / "s.npy"
    np.save(path, random_stream(np.random.default_rng(9), steps=30, k=16, ctx0=40).indices.astype(np.int32))
    probe = ("import sys\nfrom simulator.cli import main\n"
             f"code = main(['replay', {str(path)!r}, '--ctx0', '40', '--policy', 'lru', '--buffer', '16,24', '--quiet', '--json'])\n"
             f"code |= main(['replay', {str(path)!r}, '--ctx0', '40', '--policy', 'lru', '--buffer', '8', '--semantics', 'sequential',"
             " '--quiet', '--json'])\n"
             "print('LOADED', sorted(m for m in ('numpy', 'numba', 'pandas') if m in sys.modules))\n"
             "sys.exit(code)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).parent.parent).stdout
    assert '"misses"' in out
    assert "LOADED []" in out


@pytest.mark.parametrize("ctx0", [200, 300, None])
def test_plain_npy_path_equals_the_numpy_path(tmp_path, monkeypatch, ctx0):
    """The mapped .npy rows give the same stream, accesses and LRU misses as np.load's path;
    arrays it does not take (padding inside a row, int64) go the numpy way, same results."""
    from simulator.replay import ReplayConfig, replay
    from simulator.trace.sources import NpyTrace

    rng = np.random.default_rng(10)
    rows = random_stream(rng, steps=60, k=24, ctx0=200, ragged=True).indices
    if ctx0 is None:  # the default ctx0 (step 0's largest index + 1) must hold the later steps
        rows = (np.arange(24)[None, :] + np.arange(60)[:, None]).astype(np.int32)
        rows[7::7, 20:] = -1
    inside = rows.copy()
    inside[3, :2] = -1, inside[3, 0]  # a -1 before an entry: the numpy path moves it to the end
    configs = [ReplayConfig(policy="lru", buffer=b, semantics=sem) for b in (24, 40) for sem in ("batched", "sequential")]
    for i, arr in enumerate([rows.astype(np.int32), inside.astype(np.int32), rows.astype(np.int64)]):
        path = tmp_path / f"a{i}.npy"
        np.save(path, arr)
        plain = NpyTrace(path, ctx0=ctx0)
        assert (plain.raw_rows is not None) == (i == 0)
        with monkeypatch.context() as m:
            m.setenv("HISPARSE_NATIVE", "0")
            ref = NpyTrace(path, ctx0=ctx0)
            ref_result = replay(ref, configs)
        assert ref.raw_rows is None
        a, b = plain.read((0, 0)), ref.read((0, 0))
        assert np.array_equal(a.indices, b.indices) and np.array_equal(a.ctx_len, b.ctx_len)
        assert plain.accesses == ref.accesses and plain.max_ctx == ref.max_ctx and plain.meta == ref.meta
        assert replay(plain, configs).records == ref_result.records
        assert replay(plain, configs, per_step=True).records == ref_result.records


def test_coded_replay_matches_engine_on_high_churn_with_large_steps(tmp_path):
    """Steps that change hundreds of entries (the radix sorts and the branch-free merge of the
    fast path; k = 24 above never reaches them) replay exactly as in the engine."""
    rng = np.random.default_rng(5)
    stream = wandering_stream(rng, steps=60, k=512, ctx0=4000, overlap=0.5)
    path = tmp_path / "churn.hst"
    write_trace(path, TraceMeta(k=512, source={"kind": "test"}), [stream])
    reader = TraceReader(path)
    stream = reader.read(reader.keys[0])
    configs = [ReplayConfig(buffer=b, initial=i) for b in (512, 768, 2048) for i in ("prefix", "empty")]
    outs, lrus = _replay_changes(reader.coded_chunks(reader.keys[0]), configs, 512)
    for cfg, out, lru in zip(configs, outs, lrus, strict=True):
        ref = _engine(stream, cfg.buffer, cfg.reserve_newest, cfg.initial == "prefix")
        assert np.array_equal(out, ref.misses), cfg
        assert out[1:].sum() > 0  # there is churn to replay
        slot_pos, order = lru.result()
        assert np.array_equal(slot_pos, ref.slot_pos) and np.array_equal(order, ref.order), cfg


def test_batched_lru_orders_stale_hits_whose_keys_lie_far_apart():
    """A stale hit's place in the new block comes from its queue key, ordered by a bitmap over
    the keys' span, which the queue's ring bounds by compacting. Here position 0 leaves the block
    at step 1 and returns at step 150 while 59 others rotate through 64 slots without a miss
    (each step drops ~15, pushing their keys on): its key would lie ~2,000 below theirs, past
    the ring's 512 entries, so the ring compacts under it, and the order still matches the
    engine's."""
    rng = np.random.default_rng(12)
    steps, k = 160, 32
    rows = np.full((steps, k), -1, dtype=np.int32)
    for t in range(steps):
        pick = rng.choice(np.arange(1, 60), size=31, replace=False)
        rows[t, :31] = np.r_[0, pick[:30]] if t in (0, 150) else pick
    stream = Stream(0, 0, np.full(steps, 200, dtype=np.int64), rows)
    for reserve, prefix in itertools.product([True, False], repeat=2):
        ref = _engine(stream, 64, reserve, prefix)
        got = native.lru_batched(stream.indices, stream.ctx_len, 64, reserve=reserve, prefix=prefix, record=True)
        assert np.array_equal(got.misses, ref.misses) and np.array_equal(got.slots, ref.slots)
        assert np.array_equal(got.slot_pos, ref.slot_pos) and np.array_equal(got.order, ref.order)


def _chunked_trace(tmp_path, monkeypatch=None, *, corrupt_chunk: int | None = None):
    """A 200-step stream in 29 chunks of 7 steps; with ``corrupt_chunk``, that chunk's coded bytes
    are damaged before compression (so its checksums hold and only decoding finds it)."""
    from simulator.trace import TraceWriter
    from simulator.trace import format as trace_format

    rng = np.random.default_rng(3)
    stream = wandering_stream(rng, steps=200, k=16, ctx0=20, overlap=0.6)
    if corrupt_chunk is not None:
        real, calls = trace_format.encode_stream, []

        def damaged(*args, **kw):
            payload, ordered = real(*args, **kw)
            calls.append(1)
            if len(calls) - 1 == corrupt_chunk:
                raw = bytearray(zlib.decompress(payload))
                raw[len(raw) // 2:] = b"\xff" * (len(raw) - len(raw) // 2)
                payload = zlib.compress(bytes(raw))
            return payload, ordered

        monkeypatch.setattr(trace_format, "encode_stream", damaged)
    path = tmp_path / f"c{corrupt_chunk}.hst"
    with TraceWriter(path, k=16, source={"kind": "test"}, chunk_steps=7) as w:
        w.write_stream(stream)
    if corrupt_chunk is not None:
        monkeypatch.undo()
    return path, stream


def test_inflating_ahead_gives_the_results_of_inflating_in_turn(tmp_path, monkeypatch):
    """The next chunk inflates on a second thread while the current one replays: the same misses
    as chunks made one after the other, and no thread left behind."""
    import threading

    path, _ = _chunked_trace(tmp_path)
    reader = TraceReader(path)
    chunks, stream = reader.coded_chunks((0, 0)), reader.read((0, 0))  # rows come back sorted
    configs = [ReplayConfig(buffer=b, initial=i) for b in (16, 24) for i in ("prefix", "empty")]
    monkeypatch.setattr(native, "_cpus", lambda: 2)  # inflating ahead needs a second CPU
    before = set(threading.enumerate())  # not a count: a thread of an earlier test may end meanwhile
    ahead = coded_misses(chunks, configs, 16, per_step=True)
    assert set(threading.enumerate()) <= before
    monkeypatch.setattr(native, "_ahead", lambda makers: (make() for make in makers))
    in_turn = coded_misses(chunks, configs, 16, per_step=True)
    for cfg, a, b in zip(configs, ahead.misses, in_turn.misses, strict=True):
        assert np.array_equal(a, b)
        assert np.array_equal(a, _engine(stream, cfg.buffer, True, cfg.initial == "prefix").misses)


def test_a_chunk_that_fails_to_decode_while_inflated_ahead_is_still_named(tmp_path, monkeypatch):
    """Chunk 3 of 29 (steps 21-27) decodes wrong though its checksums hold: the fast path gives up
    (its inflate thread ends) and replay() raises the reader's error with file, request, layer and
    step."""
    import threading

    from simulator.errors import TraceError

    path, _ = _chunked_trace(tmp_path, monkeypatch, corrupt_chunk=3)
    reader = TraceReader(path)
    monkeypatch.setattr(native, "_cpus", lambda: 2)  # the chunks inflated ahead, on a second thread
    before = set(threading.enumerate())
    assert coded_misses(reader.coded_chunks((0, 0)), [ReplayConfig(buffer=16)], 16, per_step=False) is None
    assert set(threading.enumerate()) <= before
    with pytest.raises(TraceError) as err:
        replay(TraceReader(path), [ReplayConfig(buffer=16)])
    assert err.value.path == str(path) and (err.value.request, err.value.layer) == (0, 0)
    assert err.value.step is not None and 21 <= err.value.step <= 27, str(err.value)


def test_coded_chunk_inflates_raw_as_zlib_would():
    """CodedChunk.coded() reads the deflate data past the zlib header (the payload's crc32 is
    checked by the reader): the same bytes as zlib.decompress, at any level; None when the
    stream is cut short or has bytes after its adler32."""
    raw = np.random.default_rng(1).integers(0, 40, size=50_000).astype(np.uint8).tobytes()
    for level in (0, 1, 6, 9):
        payload = zlib.compress(raw, level)
        assert CodedChunk(1, 1, False, payload).coded() == zlib.decompress(payload) == raw
    payload = zlib.compress(raw)
    assert CodedChunk(1, 1, False, payload[:-5]).coded() is None
    assert CodedChunk(1, 1, False, payload + b"\0").coded() is None
    assert CodedChunk(1, 1, False, b"\x00\x01" + payload[2:]).coded() is None  # not a zlib header


def _replay_changes(chunks, configs, k: int, bufs: tuple[int, ...] | None = None):
    """decode_changes + lru_apply_changes chunk by chunk in this thread: (misses per config, states)."""
    from array import array

    steps = sum(c.steps for c in chunks)
    ctx = array("q", bytes(8 * steps))
    outs = [np.zeros(steps, np.int64) for _ in configs]
    lrus = [native.BatchedLru(c.buffer, reserve=c.reserve_newest, prefix=c.initial == "prefix") for c in configs]
    space, row = native._native.changes_new(), 0
    for c in chunks:
        end = row + c.steps
        code, _, _ = native._native.decode_changes(space, c.coded(), c.steps, c.width, c.ordered, c.coding, k,
                                                   ctx[row - 1] if row else 0,
                                                   tuple(x.buffer for x in lrus) if bufs is None else bufs,
                                                   memoryview(ctx)[row:end])
        assert code == 0
        native._native.lru_apply_changes(tuple(x.state for x in lrus), tuple(o[row:end] for o in outs), space,
                                         c.steps, memoryview(ctx)[row:end])
        row = end
    return outs, lrus


@pytest.mark.parametrize("chunk_steps", [1, 5, 64, 1024])
def test_changes_replay_matches_engine_across_chunks_and_fresh_starts(tmp_path, chunk_steps):
    """The two halves (a chunk decoded into step changes, then replayed) against the engine:
    every step's misses, the final slots and the final recency order, for chunk boundaries
    anywhere, buffers that are not multiples of k, and contexts that pass a buffer's size in
    the middle of a chunk (its first step past B replays from the row)."""
    from simulator.trace import TraceWriter

    rng = np.random.default_rng(31 + chunk_steps)
    k = 24
    configs = [ReplayConfig(buffer=b, initial=i, reserve_newest=r)
               for b in (24, 37, 70, 90) for i in ("prefix", "empty") for r in (True, False)]
    for overlap in (0.4, 0.9):
        stream = wandering_stream(rng, steps=150, k=k, ctx0=30, overlap=overlap)  # ctx 30 -> ~180
        path = tmp_path / f"s{overlap}.hst"
        with TraceWriter(path, k=k, source={"kind": "test"}, chunk_steps=chunk_steps) as w:
            w.write_stream(stream)
        reader = TraceReader(path)
        stored = reader.read((0, 0))  # rows come back sorted
        chunks = reader.coded_chunks((0, 0))
        outs, lrus = _replay_changes(chunks, configs, k)
        with pytest.MonkeyPatch.context() as mp:  # two CPUs, whatever this machine has
            mp.setattr(native, "_cpus", lambda: 2)
            split = coded_misses(chunks, configs, k, per_step=True)  # the same halves on two threads
        with pytest.MonkeyPatch.context() as mp:  # one CPU: each chunk in one call instead
            mp.setattr(native, "_cpus", lambda: 1)
            whole = coded_misses(chunks, configs, k, per_step=True)
        assert all(np.array_equal(a, b) for a, b in zip(split.misses, whole.misses, strict=True))
        for cfg, out, lru, threaded in zip(configs, outs, lrus, split.misses, strict=True):
            ref = _engine(stored, cfg.buffer, cfg.reserve_newest, cfg.initial == "prefix")
            assert np.array_equal(out, ref.misses), (cfg, overlap)
            assert np.array_equal(threaded, ref.misses), (cfg, overlap)
            slot_pos, order = lru.result()
            assert np.array_equal(slot_pos, ref.slot_pos) and np.array_equal(order, ref.order), (cfg, overlap)


def test_changes_decoded_for_other_buffers_are_refused():
    """A step where a buffer's context first passes its size needs the whole row; changes decoded
    for other buffers lack it, and the replay says so rather than guessing."""
    rng = np.random.default_rng(2)
    stream = wandering_stream(rng, steps=40, k=8, ctx0=9, overlap=0.8)
    payload, _ = encode_stream(stream.indices, stream.ctx_len, keep_order=False)
    chunk = CodedChunk(stream.steps, 8, False, payload)
    with pytest.raises(AssertionError):  # decoded for B = 8 only: B = 30 starts fresh mid-chunk
        _check_refused(chunk, bufs=(8,))
    _check_refused(chunk, bufs=(8, 30))


def _check_refused(chunk: CodedChunk, bufs: tuple[int, ...]) -> None:
    try:
        _replay_changes([chunk], [ReplayConfig(buffer=30)], 8, bufs=bufs)
    except ValueError as exc:
        raise AssertionError(str(exc)) from None


def test_queue_compaction_keeps_the_recency_order():
    """The stale queue is a ring with lazy deletion; with no victims taken for hundreds of steps
    (everything fits) its dead entries fill it and it compacts, renumbering live entries. Misses,
    slots and the final order still match the engine, through the rows and the coded paths."""
    rng = np.random.default_rng(13)
    steps, k, B = 400, 16, 40
    rows = np.full((steps, k), -1, dtype=np.int32)
    for t in range(steps):  # 36 positions rotate through 40 slots: no victim after the first fills
        rows[t] = np.sort(rng.choice(36, size=k, replace=False))
    stream = Stream(0, 0, np.full(steps, 100, dtype=np.int64), rows)
    for reserve, prefix in itertools.product([True, False], repeat=2):
        ref = _engine(stream, B, reserve, prefix)
        got = native.lru_batched(stream.indices, stream.ctx_len, B, reserve=reserve, prefix=prefix, record=True)
        assert np.array_equal(got.misses, ref.misses) and np.array_equal(got.slots, ref.slots)
        assert np.array_equal(got.slot_pos, ref.slot_pos) and np.array_equal(got.order, ref.order)
    payload, _ = encode_stream(stream.indices, stream.ctx_len, keep_order=False)
    configs = [ReplayConfig(buffer=B, initial=i) for i in ("prefix", "empty")]
    outs, lrus = _replay_changes([CodedChunk(steps, k, False, payload)], configs, k)
    for cfg, out, lru in zip(configs, outs, lrus, strict=True):
        ref = _engine(stream, B, True, cfg.initial == "prefix")
        assert np.array_equal(out, ref.misses)
        slot_pos, order = lru.result()
        assert np.array_equal(slot_pos, ref.slot_pos) and np.array_equal(order, ref.order)


def test_stored_payloads_are_copied_out_as_zlib_would_inflate_them():
    """--compression stored writes deflate's uncompressed blocks: unstore copies their data
    (CodedChunk.coded(into)) and must give zlib's bytes; a compressed block is left to zlib (-1),
    broken framing (cut short, bytes after the adler32, a bad length) is refused (-2)."""
    rng = np.random.default_rng(4)
    for n in (0, 1, 65535, 65536, 200_001):
        raw = rng.integers(0, 30, size=n).astype(np.uint8).tobytes()
        payload = zlib.compress(raw, 0)
        assert native.unstore(payload) == n
        into = bytearray(3)  # grown as needed
        assert bytes(CodedChunk(1, 1, False, payload).coded(into)) == raw == zlib.decompress(payload)
        if n:
            assert native.unstore(payload[:-1]) == -2
            assert CodedChunk(1, 1, False, payload[:-1]).coded(bytearray()) is None
        assert native.unstore(payload + b"\0") == -2
    payload = zlib.compress(bytes(5000), 6)
    assert native.unstore(payload) == -1  # compressed: zlib inflates it
    assert CodedChunk(1, 1, False, payload).coded(bytearray()) == bytes(5000)
    bad = bytearray(zlib.compress(bytes(100), 0))
    bad[3] ^= 1  # LEN no longer the complement of NLEN
    assert native.unstore(bytes(bad)) == -2


@pytest.mark.parametrize("keep_order", [False, True])
def test_coded_rows_replay_matches_the_stream_path(tmp_path, monkeypatch, keep_order):
    """LRU, OPT and LFU (sequential and batched) from rows decoded and checked in C
    (``backend.coded_rows``: the summary path) equal the numba engine's totals; several chunks
    per stream, ragged and ordered rows, the newest token reserved or not."""
    rng = np.random.default_rng(31 + keep_order)
    streams = [Stream(0, layer, s.ctx_len, s.indices) for layer in range(3)
               for s in [wandering_stream(rng, steps=70, k=24, ctx0=30, overlap=0.8)]]
    path = tmp_path / "s.hst"
    with TraceWriter(path, k=24, source={"kind": "test"}, keep_order=keep_order, chunk_steps=16) as w:
        for s in streams:
            w.write_stream(s)
    configs = [ReplayConfig(policy=p, buffer=b, semantics=s, initial=i, reserve_newest=r)
               for p, s in [("lru", "sequential"), ("opt", "sequential"), ("lfu", "sequential"), ("lru", "batched"),
                            ("opt", "batched"), ("lfu", "batched")]
               for b in (24, 40) for i in ("empty", "prefix") for r in (True, False)]
    configs = [c for c in configs if c.semantics == "sequential" or c.buffer >= 24]
    from simulator.replay import backend

    assert backend.uses_coded_rows_path(TraceReader(path), [c for c in configs if c.semantics == "sequential"])
    fast = replay(TraceReader(path), [c for c in configs if c.semantics == "sequential"])
    mixed = replay(TraceReader(path), configs)  # batched policies beside them: the rows path takes all
    monkeypatch.setenv("HISPARSE_NATIVE", "0")
    slow = replay(TraceReader(path), configs)
    assert fast.records == [r for r in slow.records if r["semantics"] == "sequential"]
    assert mixed.records == slow.records


def test_coded_rows_give_up_where_the_reader_refuses(tmp_path):
    """A chunk that breaks a rule, or whose header disagrees with its payload, is None on the C
    path (the replay then reads the stream the ordinary way, which names the problem)."""
    from simulator.errors import TraceError
    from simulator.replay import backend
    from tests.hst_craft import coded_chunk, craft

    meta = b'{"format_version": 3, "k": 4, "source": {"kind": "test"}}'
    cases = {
        "ok": coded_chunk([[0, 1], [1, 2, 3]], [5, 6]),
        "out of range": coded_chunk([[0, 1], [1, 6]], [5, 6]),
        "too many": coded_chunk([[0, 1, 2, 3, 4]], [9], width=5),
        "ctx down": coded_chunk([[0, 1], [1, 2]], [5, 4]),
        "accesses": coded_chunk([[0, 1], [1, 2, 3]], [5, 6], accesses=4),
        "ctx_last": coded_chunk([[0, 1], [1, 2, 3]], [5, 6], ctx_last=7),
    }
    for name, chunk in cases.items():
        reader = TraceReader(craft(tmp_path / f"{name}.hst", meta, [chunk]))
        rows = backend.coded_rows(reader.coded_chunks((0, 0)), 4)
        cfg = ReplayConfig(policy="opt", buffer=2, semantics="sequential")
        if name == "ok":
            assert rows is not None and rows.accesses == 5 and list(rows.ctx_len) == [5, 6]
            assert list(rows.rows.cast("i")) == [0, 1, -1, 1, 2, 3]
            assert replay(reader, cfg).records[0]["misses"] == 2  # buffer starts {0, 1}: 2 and 3 miss
            continue
        assert rows is None, name
        with pytest.raises(TraceError):
            replay(reader, cfg)


def test_keyed_and_sequential_replay_on_hst_imports_neither_numpy_nor_numba(tmp_path):
    """Sequential LRU, and OPT and LFU in both semantics, on a .hst file: rows decoded in C, no
    numpy or numba."""
    if not native.available():
        pytest.skip("HISPARSE_NATIVE=0: the reference path loads numba by design")
    import subprocess
    import sys
    from pathlib import Path

    path = tmp_path / "s.hst"
    write_trace(path, TraceMeta(k=16, source={"kind": "test"}), [random_stream(np.random.default_rng(3), steps=30,
                                                                                k=16, ctx0=40)])
    probe = ("import sys\nfrom simulator.cli import main\ncode = 0\n"
             "for p in ('lru', 'opt', 'lfu'):\n"
             f"    code |= main(['replay', {str(path)!r}, '--policy', p, '--buffer', '8,24', '--semantics', 'sequential',"
             " '--quiet', '--json'])\n"
             "for p in ('opt', 'lfu'):\n"
             f"    code |= main(['replay', {str(path)!r}, '--policy', p, '--buffer', '16,24', '--quiet', '--json'])\n"
             "print('LOADED', sorted(m for m in ('numpy', 'numba', 'pandas') if m in sys.modules))\n"
             "sys.exit(code)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).parent.parent).stdout
    assert '"misses"' in out
    assert "LOADED []" in out
