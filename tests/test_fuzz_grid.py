"""Random values for every key of a sweep grid: the grid is refused before any point runs with
an error naming the file and the key, or every point's value has its type and range."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from simulator.commands import sweep as sweep_cmd
from simulator.errors import HisparseError
from simulator.sweep.grid import OPTIONS, load_grid
from tests.fuzzing import fuzz_settings

SCALARS = st.one_of(st.integers(-2**63, 2**63 - 1), st.integers(-3, 10), st.floats(), st.booleans(),
                    st.text(max_size=8), st.sampled_from(["lru", "opt", "batched", "sequential", "prefix", "empty",
                                                          "traces/synthetic-dsa-like.hst"]))


def _toml(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value == math.inf else "-inf" if value == -math.inf
                                                else repr(value))
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in value.items()) + "}"
    return str(value)


@pytest.mark.parametrize("kind, key", [(k, o) for k in OPTIONS for o in OPTIONS[k]])
def test_random_grid_values(tmp_path, kind, key):
    path = tmp_path / "grid.toml"
    actions = sweep_cmd.cli_actions(kind)

    @fuzz_settings(examples=15)
    @given(st.one_of(SCALARS, st.lists(SCALARS, max_size=3)))
    def prop(value):
        fixed = 'trace = "traces/synthetic-dsa-like.hst"\n' if kind == "replay" and key != "trace" else ""
        path.write_text(f'kind = "{kind}"\n[fixed]\n{fixed}[grid]\n{key} = {_toml(value)}\n')
        try:
            grid = load_grid(path)
            sweep_cmd.check_values(grid, str(path))
        except HisparseError as exc:
            message = str(exc)
            assert str(path) in message and "\n" not in message
            assert key in message or "not valid TOML" in message, message
            return
        typ = OPTIONS[kind][key]
        action = actions.get(sweep_cmd.OPTION_DEST[kind].get(key, key))
        for point in grid.points:
            v = point[key]
            assert isinstance(v, typ) and not (typ is int and isinstance(v, bool))
            if action is not None and action.type is not None and not isinstance(v, bool):
                action.type(str(v))  # in range for the command's own option: does not raise

    prop()


KEYS = st.sampled_from(["kind", "fixed", "grid", "trace", "policy", "buffer", "concurrency", "x"])
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                      st.dictionaries(KEYS, inner, max_size=3)), max_leaves=6)


def test_random_grid_documents(tmp_path):
    """Any TOML document: a grid, or one line naming the file (never a traceback)."""
    path = tmp_path / "grid.toml"

    @fuzz_settings(examples=150)
    @given(st.dictionaries(KEYS, VALUES, max_size=4), st.sampled_from(["replay", "plan", None]))
    def prop(doc, kind):
        if kind is not None:
            doc = {"kind": kind, **doc}
        path.write_text("\n".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in doc.items()) + "\n")
        try:
            grid = load_grid(path)
            sweep_cmd.check_values(grid, str(path))
        except HisparseError as exc:
            assert str(path) in str(exc) and "\n" not in str(exc)
            return
        assert grid.kind in OPTIONS and all(set(p) <= set(OPTIONS[grid.kind]) for p in grid.points)

    prop()
