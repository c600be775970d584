"""Generator, info statistics, .npy interop and the oracleGeneral export, through the CLI too."""

from __future__ import annotations

import json

import numpy as np
import pytest

from simulator.cli import main
from simulator.trace import Stream, TraceMeta, open_trace, write_trace
from simulator.trace.generator import (
    PRESETS,
    GeneratorKnobs,
    generate,
    knobs_dict,
    knobs_to_toml,
    load_knobs,
)
from simulator.trace.oracle import ORACLE_DTYPE, oracle_records
from simulator.trace.stats import trace_info
from tests.helpers import random_stream


def _gen(tmp_path, name, *extra):
    path = tmp_path / name
    assert main(["trace", "gen", "--steps", "60", "--layers", "2", "--requests", "2", "--topk", "256",
                 "--ctx0", "3000", "--quiet", "--out", str(path), *extra]) == 0
    return path


def test_gen_same_seed_same_bytes(tmp_path):
    a = _gen(tmp_path, "a.hst", "--seed", "7")
    b = _gen(tmp_path, "b.hst", "--seed", "7")
    c = _gen(tmp_path, "c.hst", "--seed", "8")
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes() != c.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.hst", "b.hst", "c.hst"]  # no temp files left


def test_stored_compression_same_streams_larger_file(tmp_path, capsys):
    """--compression stored: deflate's uncompressed blocks (any zlib reader reads them), the same
    streams and replay as the default, a larger file, and the same bytes for the same seed;
    convert rewrites a file either way. An unknown name is refused with the choices."""
    from simulator.errors import TraceError
    from simulator.trace import TraceWriter

    z = _gen(tmp_path, "z.hst", "--seed", "7", "--compression", "zlib")
    s1 = _gen(tmp_path, "s1.hst", "--seed", "7", "--compression", "stored")
    s2 = _gen(tmp_path, "s2.hst", "--seed", "7", "--compression", "stored")
    assert s1.read_bytes() == s2.read_bytes()
    assert s1.stat().st_size > 1.2 * z.stat().st_size
    a, b = open_trace(z), open_trace(s1)
    assert a.keys == b.keys
    for key in a.keys:
        x, y = a.read(key), b.read(key)
        assert np.array_equal(x.indices, y.indices) and np.array_equal(x.ctx_len, y.ctx_len)
    capsys.readouterr()
    outs = []
    for path in (z, s1):
        assert main(["replay", str(path), "--policy", "lru", "--buffer", "512", "--quiet", "--json"]) == 0
        outs.append(json.loads(capsys.readouterr().out))
    assert outs[0] == outs[1]
    back = tmp_path / "back.hst"
    assert main(["trace", "convert", str(s1), "--out", str(back), "--compression", "zlib"]) == 0
    assert back.read_bytes() == z.read_bytes()
    with pytest.raises(TraceError, match="unknown compression 'lz4'"):
        TraceWriter(tmp_path / "x.hst", k=4, source={"kind": "test"}, compression="lz4")
    assert main(["trace", "convert", str(z), "--out", str(back), "--compression", "lz4"]) == 2
    assert "--compression: invalid choice: 'lz4'" in capsys.readouterr().err


def test_auto_compression_keeps_zlib_only_where_it_saves_a_quarter(tmp_path):
    """The default (auto): each chunk is its zlib stream where that is at most 3/4 of the coded
    bytes, else stored; a churning stream and a nearly static one land on either side."""
    import zlib

    from simulator.trace import Stream, TraceReader, TraceWriter
    from simulator.trace.format import CodedChunk
    from tests.helpers import random_stream

    rng = np.random.default_rng(3)
    churn = random_stream(rng, steps=60, k=256, ctx0=50_000, overlap=0.3)  # scattered positions: zlib gains little
    still = random_stream(rng, steps=60, k=256, ctx0=400, overlap=1.0)  # the same row again and again
    path = tmp_path / "auto.hst"
    with TraceWriter(path, k=256, source={"kind": "test"}) as w:
        w.write_stream(churn)
        w.write_stream(Stream(0, 1, still.ctx_len, still.indices))
    kinds = {}
    with TraceReader(path) as r:
        for key in r.keys:
            (c, payload), = r.chunks(key)
            coded = zlib.decompress(payload)
            stored = CodedChunk(c.steps, c.width, c.ordered, payload).coded(bytearray()) is not None and \
                payload == zlib.compress(coded, 0)
            assert stored == (len(zlib.compress(coded, 6)) > 0.75 * len(coded))
            kinds[key.layer] = stored
    assert kinds == {0: True, 1: False}


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_generated_structure(preset):
    k, ctx0 = 256, 3000
    streams = list(generate(PRESETS[preset], steps=80, layers=2, requests=1, k=k, ctx0=ctx0, seed=1))
    knobs = PRESETS[preset]
    for s in streams:
        assert (s.counts == k).all()
        for t in range(s.steps):
            row = s.step(t)
            assert np.unique(row).size == k and row.min() >= 0 and row.max() < s.ctx_len[t]
            assert s.ctx_len[t] - 1 in row, "the newest token is selected every step"
            assert set(range(knobs.sinks)) <= set(row.tolist())


def test_presets_differ_in_locality():
    def overlap(name):
        src = list(generate(PRESETS[name], steps=120, layers=1, requests=1, k=512, ctx0=8000, seed=3))
        return _info_of(src, 512)["overlap_mean"], _info_of(src, 512)["overlap_p10"]

    hi, dsa, bursty = overlap("high-locality"), overlap("dsa-like"), overlap("bursty")
    assert hi[0] >= 0.9
    assert hi[0] > dsa[0] > bursty[0]
    assert bursty[1] < dsa[1]  # bursts make a heavier low tail


def test_layer_correlation_knob_raises_adjacent_layer_overlap():
    def lov(corr):
        knobs = GeneratorKnobs(layer_corr=corr)
        return _info_of(list(generate(knobs, steps=60, layers=3, requests=1, k=256, ctx0=4000, seed=2)), 256)[
            "layer_overlap_mean"]

    assert lov(0.9) > lov(0.0) + 0.2


def test_short_context_selects_everything():
    (s,) = generate(PRESETS["dsa-like"], steps=5, layers=1, requests=1, k=64, ctx0=60, seed=0)
    assert s.step(0).tolist() == list(range(60))
    assert s.step(4).size == 64  # ctx 64: still all of it
    assert s.indices.shape == (5, 64)


def test_knobs_toml_round_trip_and_errors(tmp_path):
    knobs = GeneratorKnobs(retention=0.8, run_mean=4.0)
    path = tmp_path / "k.toml"
    path.write_text(knobs_to_toml(knobs, "fitted"))
    assert load_knobs(str(path)) == knobs
    path.write_text("[knobs]\nretention = 1.5\n")
    with pytest.raises(Exception, match="retention = 1.5 must lie in"):
        load_knobs(str(path))
    path.write_text("[knobs]\nretentoin = 0.5\n")
    with pytest.raises(Exception, match="unknown knob"):
        load_knobs(str(path))
    with pytest.raises(Exception, match="unknown preset 'nope'"):
        load_knobs("nope")
    # beside [knobs] nothing else is read: a misspelt table or a stray key was ignored (defaults generated)
    path.write_text("[knobz]\nretention = 0.5\n[knobs.profile]\nretention = [[0.0, 0.5], [1.0, 0.6]]\n")
    with pytest.raises(Exception, match=r"k.toml: unknown key\(s\) or table\(s\) knobz beside \[knobs\]"):
        load_knobs(str(path))
    path.write_text("bogus = 1\n[knobs]\nretention = 0.5\n")
    with pytest.raises(Exception, match="bogus beside"):
        load_knobs(str(path))
    # a flat knob's error is its own, not the profile's (was "profile retention: knob sinks = -1 ...")
    path.write_text("[knobs]\nsinks = -1\n[knobs.profile]\nretention = [[0.0, 0.5], [1.0, 0.6]]\n")
    with pytest.raises(Exception, match=r"k.toml: knob sinks = -1 must be >= 0") as err:
        load_knobs(str(path))
    assert "profile" not in str(err.value)


def _info_of(streams, k, tmp=None):
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "t.hst"
        write_trace(path, TraceMeta(k=k, source={}), streams)
        return trace_info(open_trace(path))


def test_info_statistics_match_brute_force():
    rng = np.random.default_rng(4)
    streams = [random_stream(rng, layer=0, ragged=True), random_stream(rng, layer=1, ragged=True)]
    info = _info_of(streams, 64)
    ov = [len(set(s.step(t)) & set(s.step(t - 1))) / 64 for s in streams for t in range(1, s.steps)]
    assert info["overlap_mean"] == pytest.approx(np.mean(ov))
    assert info["overlap_p10"] == pytest.approx(np.percentile(ov, 10))
    a, b = streams
    lov = [len(set(a.step(t)) & set(b.step(t))) / 64 for t in range(a.steps)]
    assert info["layer_overlap_mean"] == pytest.approx(np.mean(lov))
    acc = sum(s.accesses for s in streams)
    sinks = sum(int((s.step(t) < 16).sum()) for s in streams for t in range(s.steps))
    local = sum(int((s.step(t) >= s.ctx_len[t] - 128).sum()) for s in streams for t in range(s.steps))
    assert info["sink_share"] == pytest.approx(sinks / acc)
    assert info["local_share"] == pytest.approx(local / acc)
    assert (info["streams"], info["steps"], info["topk"]) == (2, 100, 64)
    assert (info["ctx_min"], info["ctx_max"]) == (300, 349)


def test_info_json_keys(tmp_path, capsys):
    path = _gen(tmp_path, "g.hst")
    assert main(["trace", "info", str(path), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    for key in ("streams", "steps", "topk", "ctx_min", "ctx_max", "overlap_mean", "overlap_p10",
                "sink_share", "local_share", "layer_overlap_mean", "bytes_per_access", "source"):
        assert key in info
    assert info["source"]["kind"] == "synthetic" and info["source"]["seed"] == 0
    # the default preset, glm51-longbench, with its per-layer profile
    assert info["source"]["preset"] == "glm51-longbench"
    assert info["source"]["knobs"] == json.loads(json.dumps(knobs_dict(load_knobs("glm51-longbench"))))


def test_npy_interop_ctx0_and_padding(tmp_path, capsys):
    a = np.array([[5, 1, -1, 3], [1, -1, -1, 6], [7, 1, 3, 6]])
    path = tmp_path / "a.npy"
    np.save(path, a)
    s = open_trace(path).read((0, 0))
    assert s.ctx_len.tolist() == [6, 7, 8]  # default: max of step 0, plus one
    assert s.indices[0].tolist() == [5, 1, 3, -1]  # order kept, padding moved to the end
    assert open_trace(path, ctx0=100).read((0, 0)).ctx_len.tolist() == [100, 101, 102]
    assert main(["trace", "info", str(path), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["accesses"] == 9 and info["topk"] == 4 and info["source"]["kind"] == "npy"
    out = tmp_path / "a.hst"
    assert main(["trace", "convert", str(path), "--keep-order", "--out", str(out)]) == 0
    np.testing.assert_array_equal(open_trace(out).read((0, 0)).indices, s.indices)


def test_oracle_general_records(tmp_path, capsys):
    s = Stream(0, 0, np.array([10, 11, 12]), np.array([[4, 2, -1], [2, 9, 4], [9, 1, -1]], dtype=np.int32))
    rec = oracle_records(s)
    assert ORACLE_DTYPE.itemsize == 24
    assert rec["obj_id"].tolist() == [4, 2, 2, 9, 4, 9, 1]
    assert rec["clock_time"].tolist() == [0, 0, 1, 1, 1, 2, 2]
    # the next read's record counted from 1, as libCacheSim's traceConvOracleGeneral writes it (0-based + 1)
    assert rec["next_access_vtime"].tolist() == [5, 3, -1, 6, -1, -1, -1]
    assert (rec["obj_size"] == 1).all()
    path = tmp_path / "s.npy"
    np.save(path, s.indices)
    out = tmp_path / "s.oracleGeneral.bin"
    assert main(["trace", "export", str(path), "--ctx0", "10", "--format", "oracle-general", "--out", str(out)]) == 0
    assert out.stat().st_size == 24 * 7
    back = np.fromfile(out, dtype=ORACLE_DTYPE)
    np.testing.assert_array_equal(back, rec)
