"""Plain-text tables laid out as ``pandas.DataFrame(rows).to_string(index=False, float_format=f)``
lays them out, without importing pandas (a third of a second of ``hisparse plan``'s start-up).

The rules, read from pandas' ``io/formats/format.py`` (3.x) and checked against it on real plan
rows in ``tests/test_text_table.py``: a column's kind is inferred as ``DataFrame`` infers its
dtype (all ints: int; ints, floats and missing values: float, missing as NaN; all bools: bool;
strings and missing values: pandas 3's string dtype, missing as NaN; anything else: object); a numeric column's header gets one leading space; floats go through
``float_format`` (NaN as ``NaN``), ints as ``{:d}``, everything else through ``str`` (None as
``None``, a float NaN as ``NaN``); every cell and the header are right-justified to the column's
widest, and columns are joined by one space.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any


def _is_missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def _kind(values: Sequence[Any]) -> str:
    if values and all(isinstance(v, bool) for v in values):
        return "bool"
    if values and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return "int"
    numbers = [v for v in values if not _is_missing(v)]
    if numbers and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in numbers):
        return "float"  # ints with floats or missing values: pandas' float64
    if numbers and all(type(v) is str for v in numbers):
        return "str"  # pandas 3's string dtype: a missing value prints as NaN
    return "object"


def supported(values: Sequence[Any]) -> bool:
    """Whether every value is of a type these rules cover (None, str, int, bool, float and its
    subclasses such as numpy.float64; not numpy's integers or bools, whose dtypes differ)."""
    return all(v is None or type(v) in (str, int, bool) or isinstance(v, float) for v in values)


def to_string(columns: Sequence[tuple[str, Sequence[Any]]], float_format: Callable[[float], str]) -> str:
    """``columns``: (header, values) in order, every column as long as the first."""
    cols = []
    for header, values in columns:
        kind = _kind(values)
        if kind == "float":
            cells = ["NaN" if _is_missing(v) else float_format(float(v)) for v in values]
        elif kind == "int":
            cells = [f"{v:d}" for v in values]
        elif kind == "str":
            cells = ["NaN" if _is_missing(v) else v for v in values]
        else:
            cells = ["None" if v is None else "NaN" if _is_missing(v) else str(v) for v in values]
        head = " " + header if kind in ("int", "float", "bool") else header
        width = max([len(head), *map(len, cells)])
        cols.append([head.rjust(width)] + [c.rjust(width) for c in cells])
    return "\n".join(" ".join(col[i] for col in cols) for i in range(len(cols[0])))
