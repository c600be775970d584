"""Random .npy arrays (shapes, dtypes, values): a command reads exactly the array's entries, or
exits 2 naming the file; no value is wrapped by a cast, nothing tracebacks."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from simulator.trace import open_trace
from tests.fuzzing import assert_clean_error, fuzz_settings, run_cli

DTYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64, np.float32,
          np.float64, np.bool_]


@st.composite
def arrays(draw):
    dtype = np.dtype(draw(st.sampled_from(DTYPES)))
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=6))
    if draw(st.booleans()) and np.issubdtype(dtype, np.integer):  # mostly valid-looking traces
        lo = -1 if np.issubdtype(dtype, np.signedinteger) else 0
        hi = min(int(np.iinfo(dtype).max), 40)
        elements = st.one_of(st.integers(lo, hi), st.sampled_from([int(np.iinfo(dtype).max), int(np.iinfo(dtype).min)]))
        return draw(hnp.arrays(dtype, shape, elements=elements))
    return draw(hnp.arrays(dtype, shape))


def _expected_rows(array):
    """What a correct reader returns: each row's entries, -1 pads removed, in stored order."""
    return [[int(v) for v in row if v != -1] for row in array]


def test_random_arrays_read_exactly_or_refuse(tmp_path, capsys):
    path = tmp_path / "a.npy"

    @fuzz_settings(examples=120)
    @given(arrays(), st.sampled_from([None, "1", "64", "100000"]))
    def prop(array, ctx0):
        np.save(path, array)
        before = path.read_bytes()
        argv = ["trace", "validate", str(path), *(["--ctx0", ctx0] if ctx0 else [])]
        code, out, err = run_cli(argv, capsys)
        assert path.read_bytes() == before
        if code:
            assert_clean_error(code, err, str(path))
            return
        assert array.ndim == 2 and array.shape[0] >= 1 and np.issubdtype(array.dtype, np.integer)
        stream = open_trace(path, ctx0=int(ctx0) if ctx0 else None).read((0, 0))
        got = [[int(v) for v in row if v != -1] for row in stream.indices]
        assert got == _expected_rows(array)  # no value wrapped, none lost
        for t, row in enumerate(got):
            assert all(0 <= v < stream.ctx_len[t] for v in row) and len(set(row)) == len(row)

    prop()


def test_wide_values_are_refused_not_wrapped(tmp_path, capsys):
    path = tmp_path / "w.npy"

    @fuzz_settings(examples=40)
    @given(st.sampled_from([np.int64, np.uint32, np.uint64]), st.integers(0, 4), st.integers(0, 3),
           st.integers(2**31, 2**63 - 1))
    def prop(dtype, step, col, big):
        if dtype == np.uint32:
            big = min(big, 2**32 - 1)
        array = np.tile(np.arange(4, dtype=dtype), (5, 1))
        array[step, col] = big
        np.save(path, array)
        for command in (["trace", "validate"], ["replay", "--quiet", "--buffer", "4"]):
            code, _, err = run_cli([*command[:2], str(path), *command[2:]], capsys)
            assert_clean_error(code, err, str(path), f"step {step}", str(big))

    prop()


def test_empty_and_all_padding_arrays_say_so(tmp_path, capsys):
    for name, array, message in [("e.npy", np.zeros((0, 4), np.int32), "holds no steps"),
                                 ("p.npy", np.full((6, 4), -1, np.int64), "no accesses"),
                                 ("q.npy", np.full((1, 1), -1, np.int8), "no accesses")]:
        path = tmp_path / name
        np.save(path, array)
        for command in (["replay", "--quiet", "--buffer", "4"], ["mrc", "--quiet"],
                        ["trace", "export", "--format", "oracle-general", "--out", str(tmp_path / "o.bin")]):
            argv = [*command[:1], str(path), *command[1:]] if command[0] != "trace" else \
                [*command[:2], str(path), *command[2:]]
            code, _, err = run_cli(argv, capsys)
            assert_clean_error(code, err, str(path), message)
        if message == "no accesses":  # a valid trace, but validate says plainly it holds nothing
            code, out, _ = run_cli(["trace", "validate", str(path)], capsys)
            assert code == 0 and "0 accesses" in out and "nothing to replay" in out
