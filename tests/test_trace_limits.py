"""Issue #28, classes 5 and 6 for traces: headers crafted with valid checksums, and payloads that
inflate past what their header allows. Every field is typed and range-checked and agrees with the
payload; a chunk decodes to no more than its header (and the chunk budget) allows. The CLI either
reads exactly what was written or exits 2 with one line naming the file; never a traceback, never
memory the header did not promise."""

from __future__ import annotations

import json
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from simulator.errors import TraceError
from simulator.trace import TraceWriter
from simulator.trace.format import MAX_K, TraceReader, coded_bound
from tests.fuzzing import assert_clean_error, fuzz_settings, run_cli
from tests.hst_craft import Chunk, coded_chunk, craft

GOOD_META = {"format_version": 2, "k": 8, "source": {"kind": "test"}, "extra": {}}
ROWS = [[0, 1, 2], [1, 2, 5], [2, 5, 6, 7]]
CTX = [8, 9, 10]


def _meta(**kw) -> bytes:
    return json.dumps({**GOOD_META, **kw}).encode()


def _validate(path, capsys):
    return run_cli(["trace", "validate", str(path)], capsys)


def test_a_crafted_good_file_reads(tmp_path, capsys):
    """The crafting helper makes files the reader accepts: the refusals below are the fields'."""
    path = craft(tmp_path / "ok.hst", _meta(), [coded_chunk(ROWS, CTX)])
    code, out, err = _validate(path, capsys)
    assert code == 0, err
    assert "10 accesses" in out


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner,
                                                                                        max_size=3), max_leaves=8)


@st.composite
def bad_metadata(draw):
    """Metadata that is not an object, or whose k, source, extra or format_version is of the wrong
    type or out of range."""
    kind = draw(st.sampled_from(["not-object", "k", "source", "extra", "format_version"]))
    if kind == "not-object":
        return draw(json_values.filter(lambda v: not isinstance(v, dict)))
    meta = dict(GOOD_META)
    if kind == "k":
        meta["k"] = draw(st.one_of(st.integers(max_value=0), st.integers(min_value=MAX_K + 1), st.booleans(),
                                   st.floats(allow_nan=False), st.text(max_size=4), st.none(), st.lists(st.integers())))
    elif kind == "format_version":
        meta["format_version"] = draw(st.one_of(st.booleans(), st.text(max_size=3), st.floats(), st.none()))
    else:
        meta[kind] = draw(json_values.filter(lambda v: not isinstance(v, dict)))
    return meta


@fuzz_settings(40)
@given(meta=bad_metadata())
def test_mistyped_metadata_is_one_line(tmp_path_factory, capsys, meta):
    path = craft(tmp_path_factory.mktemp("meta") / "m.hst", json.dumps(meta).encode(), [coded_chunk(ROWS, CTX)])
    code, _, err = _validate(path, capsys)
    assert_clean_error(code, err, str(path), "metadata")


@fuzz_settings(20)
@given(depth=st.integers(65, 200_000), opener=st.sampled_from(["[", '{"a":']))
def test_deep_metadata_is_one_line(tmp_path_factory, capsys, depth, opener):
    closer = "]" if opener == "[" else "}"
    raw = ('{"k": 8, "source": {}, "extra": {"x": ' + opener * depth + "1" + closer * depth + "}}").encode()
    path = craft(tmp_path_factory.mktemp("deep") / "d.hst", raw, [coded_chunk(ROWS, CTX)])
    code, _, err = _validate(path, capsys)
    assert_clean_error(code, err, str(path), "nested")


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_nan_metadata_is_refused(tmp_path, capsys, literal):
    path = craft(tmp_path / "n.hst", f'{{"k": 8, "source": {{"x": {literal}}}}}'.encode(), [coded_chunk(ROWS, CTX)])
    code, _, err = _validate(path, capsys)
    assert_clean_error(code, err, str(path), "NaN")


def test_metadata_length_beyond_the_file_is_truncation(tmp_path, capsys):
    path = craft(tmp_path / "t.hst", _meta(), [coded_chunk(ROWS, CTX)])
    data = bytearray(path.read_bytes())
    data[12:16] = (2**32 - 1).to_bytes(4, "little")  # meta_len (the crc then fails too: either is named)
    path.write_bytes(bytes(data))
    code, _, err = _validate(path, capsys)
    assert_clean_error(code, err, str(path))


FIELDS = {"steps": st.integers(0, 2**32 - 1), "width": st.integers(0, 2**32 - 1),
          "accesses": st.integers(0, 2**64 - 1), "ctx_last": st.integers(0, 2**64 - 1),
          "ordered": st.integers(0, 255), "first_step": st.integers(0, 2**32 - 1)}


@fuzz_settings(60)
@given(changes=st.dictionaries(st.sampled_from(sorted(FIELDS)), st.integers(0, 2**64 - 1), min_size=1, max_size=3)
       .map(lambda d: {k: v % (2**32 if k in ("steps", "width", "first_step") else 2**8 if k == "ordered" else 2**64)
                       for k, v in d.items()}))
def test_crafted_chunk_fields_are_refused_or_agree(tmp_path_factory, capsys, changes):
    """Any chunk header (and index entry) over a real payload, checksums valid: the file either
    validates with what the payload holds, or is refused in one line; never a traceback or an
    allocation of what the fields claim (2**32 x 2**32 chunks)."""
    good = coded_chunk(ROWS, CTX)
    chunk = good.but(**changes)
    path = craft(tmp_path_factory.mktemp("fields") / "f.hst", _meta(), [chunk])
    code, out, err = _validate(path, capsys)
    if code == 0:
        # only changes that leave the header telling the truth are accepted
        assert (chunk.steps, chunk.width, chunk.accesses, chunk.ctx_last, chunk.ordered) == \
               (good.steps, good.width, good.accesses, good.ctx_last, good.ordered) or chunk.width >= good.width, changes
        assert f"{good.accesses} accesses" in out
    else:
        assert_clean_error(code, err, str(path))


@fuzz_settings(30)
@given(claimed=st.integers(0, 2**20).filter(lambda n: n != 10))
def test_accesses_must_agree_with_the_payload(tmp_path_factory, capsys, claimed):
    """The example: a header and index claiming 0 accesses over a payload of 320 passed validate."""
    path = craft(tmp_path_factory.mktemp("acc") / "a.hst", _meta(), [coded_chunk(ROWS, CTX, accesses=claimed)])
    code, _, err = _validate(path, capsys)
    assert_clean_error(code, err, str(path), "accesses")


def test_the_320_access_example(tmp_path, capsys):
    rows = [list(range(t, t + 32)) for t in range(10)]
    path = craft(tmp_path / "e.hst", json.dumps({**GOOD_META, "k": 32}).encode(),
                 [coded_chunk(rows, [100 + t for t in range(10)], accesses=0)])
    code, _, err = _validate(path, capsys)
    assert_clean_error(code, err, str(path), "0 accesses", "320")


@pytest.mark.parametrize("size_mb", [64])
@pytest.mark.parametrize("how", ["zlib", "stored-header"])
def test_a_decompression_bomb_stops_at_the_bound(tmp_path, capsys, size_mb, how):
    """A small payload whose checksum holds but which inflates to far more than the header's
    steps and accesses allow is refused after inflating at most the bound.

    The bound is checked by the memory the refusal allocated (tracemalloc sees zlib's output
    buffers: inflating the whole bomb peaks above 64 MiB), not by wall time or the process's
    peak RSS: inflating 64 MiB takes ~0.2 s (well inside any time limit load allows), and an
    earlier test may already have set the process's peak RSS higher."""
    import tracemalloc

    bomb = zlib.compress(b"\x00" * (size_mb * 2**20), 9)
    assert len(bomb) < size_mb * 2**20 // 500
    chunk = Chunk(steps=4, width=4, accesses=4, ctx_last=8, payload=bomb)
    path = craft(tmp_path / "bomb.hst", _meta(), [chunk])
    tracing = tracemalloc.is_tracing()
    if not tracing:
        tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    try:
        code, _, err = _validate(path, capsys)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        if not tracing:
            tracemalloc.stop()
    assert_clean_error(code, err, str(path), "inflates past")
    assert peak < 32 * 2**20, peak  # the 64 MiB were never produced
    # the coded path (the C replay reads the chunks still coded) stops at the same bound
    with TraceReader(path) as r:
        (coded,) = r.coded_chunks(r.keys[0])
        assert coded.bound == coded_bound(4, 4)
        assert coded.coded(bytearray()) is None


def test_a_chunk_above_the_chunk_budget_is_refused_up_front(tmp_path, capsys, monkeypatch):
    """A 2**31 x 2**31 chunk (or anything above HISPARSE_MAX_CHUNK_BYTES) is refused when the
    index is read, with the limit and how to raise it; raising it lets a real chunk through."""
    path = craft(tmp_path / "big.hst", _meta(), [coded_chunk(ROWS, CTX).but(steps=2**31, width=2**31)])
    code, _, err = _validate(path, capsys)
    assert_clean_error(code, err, str(path))
    small = craft(tmp_path / "small.hst", _meta(), [coded_chunk(ROWS, CTX)])
    monkeypatch.setenv("HISPARSE_MAX_CHUNK_BYTES", "16")
    code, _, err = _validate(small, capsys)
    assert_clean_error(code, err, str(small), "HISPARSE_MAX_CHUNK_BYTES")
    monkeypatch.setenv("HISPARSE_MAX_CHUNK_BYTES", "4096")
    assert _validate(small, capsys)[0] == 0


# -- the writer refuses what the reader would refuse, before creating anything ------------------
@fuzz_settings(40)
@given(k=st.one_of(st.booleans(), st.integers(max_value=0), st.integers(min_value=MAX_K + 1),
                   st.floats(), st.text(max_size=3), st.none()))
def test_writer_refuses_bad_k_and_leaves_nothing(tmp_path_factory, k):
    folder = tmp_path_factory.mktemp("wk")
    with pytest.raises(TraceError, match="k.? must be an integer"):
        TraceWriter(folder / "w.hst", k=k, source={"kind": "test"})
    assert list(folder.iterdir()) == []


@fuzz_settings(30)
@given(bad=st.sampled_from([float("nan"), float("inf"), -float("inf")]), where=st.sampled_from(["source", "extra"]),
       depth=st.integers(0, 3))
def test_writer_refuses_nan_metadata_and_leaves_nothing(tmp_path_factory, bad, where, depth):
    folder = tmp_path_factory.mktemp("wn")
    value = bad
    for _ in range(depth):
        value = {"x": [value]}
    kw = {"source": {"kind": "test"}, "extra": {}}
    kw[where] = {"v": value}
    with pytest.raises(TraceError, match="NaN"):
        TraceWriter(folder / "w.hst", k=4, **kw)
    assert list(folder.iterdir()) == []
