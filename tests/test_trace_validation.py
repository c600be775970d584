"""Every class of bad input gets a clear error naming file, request, layer and step."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import zlib

import numpy as np
import pytest

from simulator.cli import main
from simulator.trace import TraceMeta, TraceWriter, write_trace
from simulator.trace.format import _HEAD, MAGIC
from tests.helpers import random_stream


def _run(argv, capsys):
    code = main(argv)
    err = capsys.readouterr().err
    return code, err


def _good_trace(path, **kw):
    s = random_stream(np.random.default_rng(0), request=3, layer=5, **kw)
    write_trace(path, TraceMeta(k=64, source={"kind": "test"}), [s])
    return s


def _npy(tmp_path, array, name="a.npy"):
    path = tmp_path / name
    np.save(path, array)
    return path


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda a: a.__setitem__((4, 2), 10_000), "step 4: index 10000 out of range for ctx_len"),
        (lambda a: a.__setitem__((6, 1), a[6, 0]), "step 6: index .* selected twice in one step"),
        (lambda a: a.__setitem__((2, 3), -5), "step 2: negative index -5"),
    ],
    ids=["out-of-range", "duplicate", "negative"],
)
def test_bad_npy_entries(tmp_path, capsys, mutate, message):
    a = random_stream(np.random.default_rng(1)).indices.copy()
    mutate(a)
    path = _npy(tmp_path, a)
    code, err = _run(["trace", "info", str(path), "--ctx0", "300"], capsys)
    assert code == 2
    assert str(path) in err and "request 0, layer 0" in err
    assert pytest.importorskip("re").search(message, err), err
    assert "Traceback" not in err


def test_npy_wrong_dtype_and_shape(tmp_path, capsys):
    code, err = _run(["trace", "info", str(_npy(tmp_path, np.zeros((3, 4)), "f.npy"))], capsys)
    assert code == 2 and "dtype float64" in err and "f.npy" in err
    code, err = _run(["trace", "info", str(_npy(tmp_path, np.arange(5), "v.npy"))], capsys)
    assert code == 2 and "shape (5,)" in err and "[steps, k]" in err
    code, err = _run(["trace", "info", str(_npy(tmp_path, np.zeros((10, 0), int), "w.npy"))], capsys)
    assert code == 2 and "shape (10, 0): no columns (k = 0)" in err


def test_npy_not_an_array(tmp_path, capsys):
    path = tmp_path / "junk.npy"
    path.write_bytes(b"not numpy at all")
    code, err = _run(["trace", "validate", str(path)], capsys)
    assert code == 2 and "not a readable .npy array" in err


def test_more_than_k_entries(tmp_path, capsys):
    path = tmp_path / "t.hst"
    _good_trace(path)
    data = path.read_bytes()
    meta_len = struct.unpack_from("<I", data, 12)[0]
    meta = json.loads(data[16 : 16 + meta_len])
    assert meta["k"] == 64
    new_meta = data[16 : 16 + meta_len].replace(b'"k": 64', b'"k": 60')
    rest = data[16 + meta_len + 4 :]
    path.write_bytes(data[:16] + new_meta + data[16 + meta_len : 16 + meta_len + 4] + rest)
    code, err = _run(["trace", "validate", str(path)], capsys)  # an edit the header checksum catches
    assert code == 2 and "corrupt header (checksum mismatch)" in err, err
    crc = struct.pack("<I", zlib.crc32(data[8:16] + new_meta))  # a consistent file that says k = 60
    path.write_bytes(data[:16] + new_meta + crc + rest)
    code, err = _run(["trace", "validate", str(path)], capsys)
    assert code == 2
    assert "request 3, layer 5, step 0: 64 entries in one step, more than k = 60" in err


def test_writer_refuses_more_than_k(tmp_path):
    from simulator.errors import TraceError

    with TraceWriter(tmp_path / "w.hst", k=2, source={}) as w:
        with pytest.raises(TraceError, match="request 1, layer 2, step 0: 3 entries in one step, more than k = 2"):
            w.write(1, 2, 0, 10, [1, 2, 3])


def test_ctx_len_going_down(tmp_path):
    from simulator.errors import TraceError

    s = random_stream(np.random.default_rng(2), request=1, layer=4)
    s.ctx_len[9] = s.ctx_len[8] - 1
    with pytest.raises(TraceError, match=r"request 1, layer 4, step 9: ctx_len goes down"):
        write_trace(tmp_path / "d.hst", TraceMeta(k=64, source={}), [s])


def test_truncated_file(tmp_path, capsys):
    path = tmp_path / "t.hst"
    _good_trace(path)
    data = path.read_bytes()
    for cut in (len(data) - 3, len(data) // 2, 20, 5):
        path.write_bytes(data[:cut])
        code, err = _run(["trace", "info", str(path)], capsys)
        assert code == 2 and str(path) in err, err
        assert "truncated" in err or "bad magic" in err, err
    # cut inside the header: the magic is right, so the file is truncated, not another format (was "bad magic")
    for cut in (8, 5, 12):
        path.write_bytes(data[:cut])
        code, err = _run(["trace", "info", str(path)], capsys)
        assert code == 2 and f"truncated: {cut} bytes, shorter than the 16-byte header" in err, err
    path.write_bytes(b"")
    code, err = _run(["trace", "info", str(path)], capsys)
    assert code == 2 and "an empty file (0 bytes), not a trace" in err, err


def test_corrupt_payload_names_stream(tmp_path, capsys):
    path = tmp_path / "t.hst"
    _good_trace(path)
    data = bytearray(path.read_bytes())
    meta_len = struct.unpack_from("<I", data, 12)[0]
    data[16 + meta_len + 60] ^= 0xFF  # inside the first chunk's payload
    path.write_bytes(bytes(data))
    code, err = _run(["trace", "validate", str(path)], capsys)
    assert code == 2 and "request 3, layer 5" in err and "checksum mismatch" in err


def test_unknown_version_and_missing_metadata(tmp_path, capsys):
    path = tmp_path / "t.hst"
    _good_trace(path)
    data = path.read_bytes()
    path.write_bytes(data[:8] + struct.pack("<I", 99) + data[12:])
    code, err = _run(["trace", "info", str(path)], capsys)
    assert code == 2 and "unknown format version 99" in err
    meta = json.dumps({"source": {}}).encode()
    path.write_bytes(_HEAD.pack(MAGIC, 1, len(meta)) + meta + data[16 + struct.unpack_from("<I", data, 12)[0]:])
    code, err = _run(["trace", "info", str(path)], capsys)
    assert code == 2 and "missing metadata 'k'" in err


def test_not_a_trace_and_missing_file(tmp_path, capsys):
    path = tmp_path / "x.hst"
    path.write_text("hello, world")
    code, err = _run(["trace", "info", str(path)], capsys)
    assert code == 2 and "not a hisparse trace file" in err
    code, err = _run(["trace", "info", str(tmp_path / "none.hst")], capsys)
    assert code == 2 and "cannot open trace" in err


def test_error_has_no_traceback_from_the_console(tmp_path):
    path = _npy(tmp_path, np.array([[1, 1, 2]]))
    proc = subprocess.run([sys.executable, "-m", "simulator.cli", "trace", "info", str(path)],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "request 0, layer 0, step 0: index 1 selected twice" in proc.stderr


def test_an_npy_header_claiming_more_than_the_file_holds_is_named(tmp_path, capsys):
    """A 64-byte payload under a header of shape (10**9, 10**9) made numpy allocate the claimed size first:
    'out of memory in hisparse replay', naming no file and blaming the machine. The sizes are compared first."""
    import io

    from numpy.lib import format as npy

    head = io.BytesIO()
    npy.write_array_header_1_0(head, {"descr": "<i4", "fortran_order": False, "shape": (10**9, 10**9)})
    path = tmp_path / "bomb.npy"
    path.write_bytes(head.getvalue() + bytes(64))
    code, err = _run(["replay", str(path), "--buffer", "4096", "--quiet"], capsys)
    assert code == 2 and str(path) in err and "truncated or damaged: its header says shape (1000000000, 1000000000)" in err
    assert "the file holds 64" in err and "out of memory" not in err


def test_npy_lookalikes_are_named(tmp_path, capsys):
    """A .npy whose header dict is damaged (numpy's tokenizer raised TokenError: a traceback), an .npz archive under
    a .npy name (np.load returned the archive: AttributeError), and an .hst trace under a .npy name (reported as
    "pickled data"): one line each, exit 2."""
    good = _npy(tmp_path, np.array([[0, 1], [1, 2]]), "good.npy")
    damaged = bytearray(good.read_bytes())
    damaged[20] = ord("{")
    (tmp_path / "hdr.npy").write_bytes(bytes(damaged))
    np.savez(tmp_path / "z.npz", a=np.zeros((2, 2), int))
    (tmp_path / "z.npy").write_bytes((tmp_path / "z.npz").read_bytes())
    hst = tmp_path / "t.hst"
    _good_trace(hst)
    (tmp_path / "h.npy").write_bytes(hst.read_bytes())
    for name, says in (("hdr.npy", "its header does not parse"), ("z.npy", "an .npz archive, not a .npy array"),
                       ("h.npy", "an .hst trace with a .npy name")):
        for command in (["trace", "info"], ["replay", "--quiet"]):
            code, err = _run([*command, str(tmp_path / name)], capsys)
            assert code == 2 and says in err and name in err and "Traceback" not in err, (name, command, err)


def test_bytes_appended_after_a_complete_trace_are_named(tmp_path, capsys):
    """A complete .hst with bytes appended was reported as "truncated file: no index at the end"; a truly truncated
    one still is."""
    path = tmp_path / "t.hst"
    _good_trace(path)
    data = path.read_bytes()
    path.write_bytes(data + b"garbage")
    code, err = _run(["trace", "info", str(path)], capsys)
    assert code == 2 and "7 byte(s) after the trace's end marker" in err and "Traceback" not in err
    path.write_bytes(data[:-30])
    code, err = _run(["trace", "info", str(path)], capsys)
    assert code == 2 and "truncated file: no index at the end" in err


def test_two_chunks_holding_the_same_steps_are_named(tmp_path, capsys):
    """An index whose two entries for a stream start at the same step (checksums recomputed: a hand-made file)
    was told "steps 64..-1 are missing"; it names the overlap."""
    import zlib

    from simulator.trace import format as hst
    from simulator.trace.stream import Stream

    path = tmp_path / "t.hst"
    rng = np.random.default_rng(0)
    steps, k = 64, 4
    idx = np.stack([rng.choice(100 + s, k, replace=False) for s in range(steps)]).astype(np.int32)
    with hst.TraceWriter(path, k=k, source={"kind": "test"}, chunk_steps=32) as w:
        w.write_stream(Stream(0, 0, np.arange(100, 100 + steps), idx))
    data = bytearray(path.read_bytes())
    offset, _, magic = hst._FOOT.unpack(data[-hst._FOOT.size:])
    index = bytearray(data[offset:len(data) - hst._FOOT.size])
    size = hst._ENTRY.size
    first = list(hst._ENTRY.unpack(index[8:8 + size]))
    second = list(hst._ENTRY.unpack(index[8 + size:8 + 2 * size]))
    second[2] = first[2]  # the second chunk claims the first chunk's steps
    index[8 + size:8 + 2 * size] = hst._ENTRY.pack(*second)
    data[offset:len(data) - hst._FOOT.size] = index
    data[-hst._FOOT.size:] = hst._FOOT.pack(offset, zlib.crc32(bytes(index)), magic)
    path.write_bytes(bytes(data))
    code, err = _run(["trace", "info", str(path)], capsys)
    assert code == 2 and "two chunks hold step 0 (steps 0..31 and 0..31)" in err and "..-1" not in err
