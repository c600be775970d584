"""The plan's tables without pandas (commands/text_table.py) read character for character as
pandas' ``to_string(index=False, float_format=...)``, which stays the reference here."""

from __future__ import annotations

import json
import math
import random

import pandas as pd
import pytest

from simulator.cli import main
from simulator.commands import plan_text as plan_cmd
from simulator.commands.text_table import supported, to_string


def _pandas(columns, ff):
    return pd.DataFrame({h: list(v) for h, v in columns}).to_string(index=False, float_format=ff)


def _value(rng: random.Random, kind: str):
    if kind == "int":
        return rng.choice([0, 1, 7, 256, -3, 12345678])
    if kind == "float":
        return rng.choice([0.0, 0.133, 41.2, 1534.6, -5.0, 1e-7, 2.5e12, math.nan, math.inf, -math.inf, 9.99, 10.0])
    if kind == "str":
        return rng.choice(["", "yes", "search", "a b", "x" * 12])
    if kind == "bool":
        return rng.choice([True, False])
    return None


@pytest.mark.parametrize("seed", range(40))
def test_random_columns_match_pandas(seed):
    rng = random.Random(seed)
    n = rng.randint(1, 6)
    columns = []
    for c in range(rng.randint(1, 6)):
        mix = rng.choice([("int",), ("float",), ("str",), ("bool",), ("int", "none"), ("float", "none"),
                          ("int", "float"), ("str", "none"), ("none",), ("int", "float", "none")])
        columns.append((rng.choice(["conc", "TPOT p99 ms", "a", "over", "found", f"c{c}"]) + str(c),
                        [_value(rng, rng.choice(mix)) for _ in range(n)]))
    ff = plan_cmd._table_float
    assert to_string(columns, ff) == _pandas(columns, ff)


def test_numpy_integers_are_left_to_pandas():
    import numpy as np

    assert supported([1, 2.0, None, "x", True, np.float64(3.0)])
    assert not supported([np.int64(3)]) and not supported([np.bool_(True)])


def _rows(capsys, *argv):
    assert main(["plan", "--json", "--quiet", "--no-search", *argv]) == 0
    return json.loads(capsys.readouterr().out)["rows"]


def test_plan_tables_match_pandas_on_real_rows(capsys):
    rows = _rows(capsys, "--concurrency", "1,2", "--sweep-buffer", "2048,4096", "--price-gpu-hour", "2.5")
    rows[1]["ttft_p99_s"] = math.nan  # a figure the model cannot give
    rows[2]["usd_per_m_output_tokens"] = None
    cols = plan_cmd._table_columns(rows)
    assert plan_cmd._point_tables(rows) == plan_cmd._point_tables_pandas(rows, cols)
    assert len(plan_cmd._point_tables(rows)) == 3  # baseline and the two buffers
    for r in rows:
        r["usd_per_m_output_tokens"] = None  # no prices: the column is left out
    cols = plan_cmd._table_columns(rows)
    assert "usd_per_m_output_tokens" not in cols
    assert plan_cmd._point_tables(rows) == plan_cmd._point_tables_pandas(rows, cols)


def test_open_loop_tables_match_pandas(capsys):
    rows = _rows(capsys, "--concurrency", "1,2")
    for i, r in enumerate(rows):  # laid out as an open-loop sweep's rows
        r["concurrency"], r["rate_per_s"] = 0, [0.5, 2.0][i % 2]
    cols = plan_cmd._table_columns(rows)
    assert cols[0] == "rate_per_s"
    assert plan_cmd._point_tables(rows) == plan_cmd._point_tables_pandas(rows, cols)
