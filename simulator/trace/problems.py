"""The problems the stream checker and decoder report, by code: the one table of them.

The numba references (``codec_jit.py``) return these codes, the C versions
(``simulator/native/_native.c``) define the same numbers under the same names (``ROW_*``,
``DECODE_*``, exported by the module), and ``codec.py`` turns a code into its message.
tests/test_trace_validation.py checks that the three agree. Imports neither numpy nor numba.
"""

from __future__ import annotations

from enum import IntEnum


class RowProblem(IntEnum):
    """A rule of the trace model that a stream breaks (``check_rows``: code, step, value, extra)."""

    NEGATIVE = 1
    OUT_OF_RANGE = 2
    REPEATED = 3
    TOO_MANY = 4
    CTX_DOWN = 5
    CTX_NOT_POSITIVE = 6
    PAD_BEFORE_ENTRY = 7


ROW_MESSAGES: dict[RowProblem, str] = {
    RowProblem.NEGATIVE: "negative index {value} (only -1 may pad a step)",
    RowProblem.OUT_OF_RANGE: "index {value} out of range for ctx_len {extra}",
    RowProblem.REPEATED: "index {value} selected twice in one step",
    RowProblem.TOO_MANY: "{value} entries in one step, more than k = {extra}",
    RowProblem.CTX_DOWN: "ctx_len goes down, to {value} from {extra}",
    RowProblem.CTX_NOT_POSITIVE: "ctx_len {value} is not positive",
    RowProblem.PAD_BEFORE_ENTRY: "padding -1 before a real entry",
}


class DecodeProblem(IntEnum):
    """Why coded steps do not decode (``decode``: code, step)."""

    ENDS_EARLY = 1
    INCONSISTENT = 2
    TRAILING_BYTES = 3
    BREAKS_RULE = 4  # the C coded replay only: a decoded step breaks a RowProblem rule


DECODE_MESSAGES: dict[DecodeProblem, str] = {
    DecodeProblem.ENDS_EARLY: "coded data ends early",
    DecodeProblem.INCONSISTENT: "coded data is inconsistent",
    DecodeProblem.TRAILING_BYTES: "coded data has trailing bytes",
    DecodeProblem.BREAKS_RULE: "a decoded step breaks a rule of the trace model",
}
