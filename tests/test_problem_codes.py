"""One table of problem codes (simulator/trace/problems.py) for the Python codec, the numba codec
and the C file: the same names and numbers, and each code found by both checkers on a stream
that breaks exactly its rule."""

from __future__ import annotations

import numpy as np
import pytest

from simulator import native
from simulator.errors import TraceError
from simulator.trace import codec_jit
from simulator.trace.codec import check_stream, decode_stream, encode_stream
from simulator.trace.problems import DECODE_MESSAGES, ROW_MESSAGES, DecodeProblem, RowProblem

needs_c = pytest.mark.skipif(not native.available(), reason="simulator/native not built or HISPARSE_NATIVE=0")


def test_every_code_has_a_message():
    assert set(ROW_MESSAGES) == set(RowProblem)
    assert set(DECODE_MESSAGES) == set(DecodeProblem)


@needs_c
def test_the_c_module_defines_the_same_codes():
    from simulator.native import _native

    exported = {name: getattr(_native, name) for name in dir(_native) if name.startswith(("ROW_", "DECODE_"))}
    table = {**{f"ROW_{m.name}": m.value for m in RowProblem}, **{f"DECODE_{m.name}": m.value for m in DecodeProblem}}
    assert exported == table


# (problem, rows with -1 padding, ctx_len, k): each breaks exactly one rule, at step 1.
CASES = [
    (RowProblem.NEGATIVE, [[0, 1], [0, -3]], [5, 6], 2),
    (RowProblem.OUT_OF_RANGE, [[0, 1], [0, 6]], [5, 6], 2),
    (RowProblem.REPEATED, [[0, 1], [2, 2]], [5, 6], 2),
    (RowProblem.TOO_MANY, [[0, -1], [0, 1]], [5, 6], 1),
    (RowProblem.CTX_DOWN, [[0, 1], [0, 1]], [5, 4], 2),
    (RowProblem.CTX_NOT_POSITIVE, [[-1, -1], [-1, -1]], [5, 0], 2),
    (RowProblem.PAD_BEFORE_ENTRY, [[0, 1], [-1, 1]], [5, 6], 2),
]


@pytest.mark.parametrize(("problem", "rows", "ctx", "k"), CASES, ids=[c[0].name for c in CASES])
def test_numba_and_c_checkers_report_the_code_and_python_names_it(problem, rows, ctx, k):
    idx = np.array(rows, dtype=np.int32)
    ctx_len = np.array(ctx, dtype=np.int64)
    code, step, value, extra = codec_jit.check_rows(idx, ctx_len, k)
    assert (code, step) == (problem, 1)
    if native.available():
        assert native.check_rows(idx, ctx_len, k) == tuple(codec_jit.check_rows(idx, ctx_len, k))
    with pytest.raises(TraceError) as err:
        check_stream(idx, ctx_len, k)
    assert err.value.step == 1
    assert err.value.problem == ROW_MESSAGES[problem].format(value=value, extra=extra)


def _coded(rows, ctx, coding: int) -> np.ndarray:
    import zlib

    payload, _ = encode_stream(np.array(rows, dtype=np.int64), np.array(ctx, dtype=np.int64), keep_order=False,
                               coding=coding)
    return np.frombuffer(zlib.decompress(payload), dtype=np.uint8)


@pytest.mark.parametrize("coding", [2, 3])
@pytest.mark.parametrize("problem", [DecodeProblem.ENDS_EARLY, DecodeProblem.TRAILING_BYTES])
def test_numba_and_c_decoders_report_the_code(problem, coding):
    raw = _coded([[0, 1], [1, 2]], [5, 6], coding)
    bad = raw[:-1] if problem is DecodeProblem.ENDS_EARLY else np.concatenate([raw, np.zeros(1, np.uint8)])
    out = np.empty((2, 2), dtype=np.int32)
    ctx = np.empty(2, dtype=np.int64)
    assert (codec_jit.decode3 if coding == 3 else codec_jit.decode)(bad, 2, 2, False, out, ctx)[0] == problem
    if native.available():
        assert native.decode(bad.tobytes(), 2, 2, False, out, ctx, coding=coding)[0] == problem
    import zlib

    with pytest.raises(TraceError, match=DECODE_MESSAGES[problem]):
        decode_stream(zlib.compress(bad.tobytes()), 2, 2, False, coding=coding)
