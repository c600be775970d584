"""Random corruption of .hst files, in every byte region: the reader either names the file and
exits 2, or reads exactly the streams that were written; it never invents a stream, never
tracebacks and never changes the file. ``--recover`` keeps only true prefixes of the streams."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from simulator.trace import TraceWriter, open_trace
from simulator.trace.format import _CHUNK, _FOOT, TraceReader
from tests.fuzzing import assert_clean_error, fuzz_settings, run_cli
from tests.helpers import random_stream
from tests.hst_v1 import to_version_1

K = 16
pytestmark = pytest.mark.filterwarnings("ignore:.*no index")


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """A version-2 trace of 2 requests x 2 layers x 30 steps in 10-step chunks, its bytes, its
    streams and the byte ranges of each region."""
    path = tmp_path_factory.mktemp("fuzz") / "clean.hst"
    rng = np.random.default_rng(7)
    streams = [random_stream(rng, steps=30, k=K, ctx0=40, request=r, layer=layer, ragged=True)
               for r in range(2) for layer in range(2)]
    with TraceWriter(path, k=K, source={"kind": "test"}, chunk_steps=10) as w:
        for s in streams:
            w.write_stream(s)
    data = path.read_bytes()
    with TraceReader(path) as r:
        chunks = [(c, len(p)) for key in r.keys for c, p in r.chunks(key)]
        data_start = r._data_start
    index_at = int(np.frombuffer(data[-_FOOT.size:-_FOOT.size + 8], "<u8")[0])
    regions = {"header": (0, data_start),
               "chunk header": [(c.offset, c.offset + _CHUNK.size) for c, _ in chunks],
               "payload": [(c.offset + _CHUNK.size, c.offset + _CHUNK.size + n) for c, n in chunks],
               "index": (index_at, len(data) - _FOOT.size),
               "footer": (len(data) - _FOOT.size, len(data))}
    return data, {s.key: s for s in streams}, regions


@st.composite
def corruption(draw, regions):
    name = draw(st.sampled_from(sorted(regions)))
    spans = regions[name] if isinstance(regions[name], list) else [regions[name]]
    lo, hi = draw(st.sampled_from(spans))
    at = draw(st.integers(lo, hi - 1))
    return name, at, draw(st.integers(1, 255))


def _same_streams(path, originals, *, recover=False, prefix_ok=False):
    """The file reads back as the written streams (``prefix_ok``: a first part of some of them)."""
    trace = open_trace(path, recover=recover)
    for key in trace.keys:
        assert key in originals, f"invented stream {key}"
        got, want = trace.read(key), originals[key]
        n = got.steps if prefix_ok else want.steps
        assert got.steps == n and np.array_equal(got.ctx_len, want.ctx_len[:n])
        for a, b in zip(got.indices, want.indices[:n], strict=True):  # rows are stored sorted
            assert sorted(a[a >= 0]) == sorted(b[b >= 0])
    if not prefix_ok:
        assert set(trace.keys) == set(originals)


def test_regions_cover_every_byte(clean):
    data, _, regions = clean
    covered = set()
    for spans in regions.values():
        for lo, hi in (spans if isinstance(spans, list) else [spans]):
            covered.update(range(lo, hi))
    assert covered == set(range(len(data)))


@pytest.mark.parametrize("recover", [False, True], ids=["plain", "recover"])
def test_one_corrupt_byte_is_caught_or_harmless(clean, tmp_path_factory, capsys, recover):
    data, originals, regions = clean
    path = tmp_path_factory.mktemp("c") / "t.hst"

    @fuzz_settings(examples=60)
    @given(corruption(regions))
    def prop(change):
        name, at, xor = change
        bad = bytearray(data)
        bad[at] ^= xor
        path.write_bytes(bytes(bad))
        code, _, err = run_cli(["trace", "validate", str(path), *(["--recover"] if recover else [])], capsys)
        assert path.read_bytes() == bytes(bad), "the input changed"
        if code == 0:  # only a footer byte under --recover may be harmless: all else is checksummed
            assert recover and name == "footer", (name, at)
            _same_streams(path, originals, recover=True)
        else:
            assert_clean_error(code, err, str(path))

    prop()


def test_truncation_recovers_only_true_prefixes(clean, tmp_path_factory, capsys):
    data, originals, _ = clean
    path = tmp_path_factory.mktemp("t") / "t.hst"

    @fuzz_settings(examples=40)
    @given(st.integers(0, len(data) - 1))
    def prop(cut):
        path.write_bytes(data[:cut])
        code, _, err = run_cli(["trace", "validate", str(path)], capsys)
        assert_clean_error(code, err, str(path))
        code, _, err = run_cli(["trace", "validate", str(path), "--recover"], capsys)
        if code == 0:
            _same_streams(path, originals, recover=True, prefix_ok=True)
        else:
            assert_clean_error(code, err, str(path))

    prop()


def test_corrupt_bytes_never_change_a_replay(clean, tmp_path_factory, capsys):
    """The replay's fast path reads coded chunks itself: same rule, the result or a clean error."""
    data, _, regions = clean
    path = tmp_path_factory.mktemp("r") / "t.hst"
    path.write_bytes(data)
    argv = ["replay", str(path), "--buffer", str(K), "--policy", "lru,fifo", "--quiet", "--workers", "1"]
    code, want, _ = run_cli(argv, capsys)
    assert code == 0

    @fuzz_settings(examples=25)
    @given(corruption(regions), st.integers(2, 8))
    def prop(change, burst):
        _, at, xor = change
        bad = bytearray(data)
        for i in range(at, min(at + burst, len(bad))):
            bad[i] ^= xor
        path.write_bytes(bytes(bad))
        code, out, err = run_cli(argv, capsys)
        if code == 0:
            assert out == want
        else:
            assert_clean_error(code, err, str(path))

    prop()


def test_version_1_chunk_headers_are_checked_against_the_index(clean, tmp_path, capsys):
    """Version 1 files (the bundled traces; no chunk-header checksum): a damaged field of a chunk
    header still disagrees with the index and is refused."""
    from simulator.trace.format import _CHUNK_V1

    src = tmp_path / "src.hst"
    src.write_bytes(clean[0])
    to_version_1(src, src)
    with TraceReader(src) as r:
        assert r.version == 1
        offsets = [c.offset for key in r.keys for c, _ in r.chunks(key)]
    data = src.read_bytes()
    path = tmp_path / "v1.hst"
    fields = [(4, 24), (28, _CHUNK_V1.size)]  # every byte but the 3 pad bytes after `ordered`

    @fuzz_settings(examples=20)
    @given(st.sampled_from(offsets), st.sampled_from(fields).flatmap(lambda f: st.integers(*f)).filter(
        lambda i: i < 25 or i >= 28), st.integers(1, 255))
    def prop(offset, at, xor):
        bad = bytearray(data)
        bad[offset + at] ^= xor
        path.write_bytes(bytes(bad))
        code, _, err = run_cli(["trace", "validate", str(path)], capsys)
        assert_clean_error(code, err, str(path))

    prop()


def test_convert_rewrites_a_version_1_file_as_version_3_with_the_same_streams(clean, tmp_path, capsys):
    """The documented upgrade (traces/README.md): hisparse trace convert OLD --keep-order --out NEW."""
    src, new = tmp_path / "v1.hst", tmp_path / "v3.hst"
    (tmp_path / "orig.hst").write_bytes(clean[0])
    to_version_1(tmp_path / "orig.hst", src)
    code, _, err = run_cli(["trace", "convert", str(src), "--keep-order", "--out", str(new)], capsys)
    assert code == 0, err
    old, fresh = TraceReader(src), TraceReader(new)
    assert (old.version, fresh.version) == (1, 3)
    assert old.meta.source == fresh.meta.source and old.meta.extra == fresh.meta.extra
    assert old.keys == fresh.keys
    for key in old.keys:
        a, b = old.read(key), fresh.read(key)
        assert np.array_equal(a.ctx_len, b.ctx_len) and np.array_equal(a.indices, b.indices)
