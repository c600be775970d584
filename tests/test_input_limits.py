"""Issue #28, classes 5 and 7 for TOML and JSON inputs: every input goes through one reader
(``simulator/inputs.py``) that reads at most a size budget and bounds nesting before parsing. A
member of either class, in any input of any command, is one line naming the file, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from simulator import inputs
from simulator.errors import HisparseError
from simulator.trace import TraceMeta, write_trace
from tests.fuzzing import assert_clean_error, fuzz_settings, run_cli
from tests.helpers import random_stream

# (name, suffix, the command reading it: FILE and TRACE are filled in)
TOML_INPUTS = [("grid", ".toml", ["sweep", "FILE", "--out", "OUTDIR", "--no-ray"]),
               ("model", ".toml", ["plan", "--model", "FILE"]),
               ("workload", ".toml", ["plan", "--workload", "FILE"]),
               ("deployment", ".toml", ["plan", "--deployment", "FILE"]),
               ("hisparse", ".toml", ["plan", "--hisparse-config", "FILE"]),
               ("calibration-toml", ".toml", ["plan", "--calibration", "FILE"]),
               ("published", ".toml", ["plan", "--validate", "FILE"]),
               ("knobs", ".toml", ["trace", "gen", "--knobs", "FILE", "--out", "OUTDIR/t.hst"]),
               ("targets", ".toml", ["trace", "compare", "TRACE", "--targets", "FILE"])]
JSON_INPUTS = [("calibration-json", ".json", ["plan", "--calibration", "FILE"])]


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("tr") / "t.hst"
    write_trace(path, TraceMeta(k=16, source={"kind": "test"}),
                [random_stream(np.random.default_rng(0), steps=20, k=16, ctx0=40)])
    return str(path)


def _argv(template, file, trace, outdir):
    return [a.replace("FILE", str(file)).replace("TRACE", trace).replace("OUTDIR", str(outdir)) for a in template]


def _deep_toml(depth: int, table: bool) -> str:
    if table:
        return "x = " + "{a = " * depth + "1" + "}" * depth + "\n"
    return "x = " + "[" * depth + "1" + "]" * depth + "\n"


def _deep_json(depth: int, table: bool) -> str:
    inner = ('{"a": ' * depth + "1" + "}" * depth) if table else ("[" * depth + "1" + "]" * depth)
    return '{"params": {}, "x": ' + inner + "}"


@fuzz_settings(30)
@given(which=st.sampled_from(TOML_INPUTS + JSON_INPUTS), depth=st.integers(65, 20_000), table=st.booleans())
def test_deep_nesting_in_any_input_is_one_line(tmp_path_factory, capsys, trace, which, depth, table):
    name, suffix, template = which
    folder = tmp_path_factory.mktemp("deep")
    path = folder / f"{name}{suffix}"
    path.write_text(_deep_json(depth, table) if suffix == ".json" else _deep_toml(depth, table))
    code, _, err = run_cli(_argv(template, path, trace, folder / "out"), capsys)
    assert_clean_error(code, err, str(path), "nested")
    assert "RecursionError" not in err


@fuzz_settings(20)
@given(which=st.sampled_from(TOML_INPUTS + JSON_INPUTS), extra=st.integers(1, 5000))
def test_inputs_over_the_size_budget_are_refused(tmp_path_factory, capsys, trace, monkeypatch, which, extra):
    """An input over HISPARSE_MAX_INPUT_BYTES (above every packaged file) is refused naming the file and the
    variable; at most the budget + 1 bytes are read."""
    name, suffix, template = which
    folder = tmp_path_factory.mktemp("big")
    path = folder / f"{name}{suffix}"
    body = '{"params": {}}' if suffix == ".json" else 'kind = "replay"\n'
    path.write_text(body + " " * (40_000 + extra))
    monkeypatch.setenv("HISPARSE_MAX_INPUT_BYTES", "40000")
    code, _, err = run_cli(_argv(template, path, trace, folder / "out"), capsys)
    assert_clean_error(code, err, str(path), "HISPARSE_MAX_INPUT_BYTES")


@pytest.mark.parametrize("template", [t for n, _, t in TOML_INPUTS if n in ("grid", "targets", "model")])
def test_dev_zero_as_an_input_stops_at_the_budget(tmp_path, capsys, trace, monkeypatch, template):
    """The examples: /dev/zero as a grid or targets file read until memory ran out."""
    monkeypatch.setenv("HISPARSE_MAX_INPUT_BYTES", str(2**20))
    code, _, err = run_cli(_argv(template, "/dev/zero", trace, tmp_path / "out"), capsys)
    assert_clean_error(code, err, "/dev/zero")


@fuzz_settings(40)
@given(depth=st.integers(1, 64), table=st.booleans())
def test_nesting_within_the_bound_parses(depth, table):
    """The bound refuses nothing it should not: up to 64 levels parse, in TOML and JSON."""
    toml = inputs.parse_toml(_deep_toml(depth - 1, table) if depth > 1 else "x = 1\n", "t.toml")
    assert "x" in toml
    assert "x" in inputs.parse_json(_deep_json(depth - 2, table) if depth > 2 else '{"x": 1}', "t.json")


@fuzz_settings(60)
@given(st.text(alphabet='[]{}"\'#\\\n ax=,', max_size=60))
def test_brackets_inside_strings_and_comments_do_not_count(text):
    """The depth scan skips strings and comments: a document of shallow data with any brackets
    in its strings scans as shallow."""
    doc = "a = " + json.dumps(text) + "  # " + text.replace("\n", " ") + "\nb = [[1], [2]]\n"
    assert inputs.nesting_depth(doc, toml=True) == 2
    assert inputs.nesting_depth(json.dumps({"a": text, "b": [[1]]}), toml=False) == 3


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_json_inputs_refuse_nan(tmp_path, literal):
    path = tmp_path / "c.json"
    path.write_text(f'{{"params": {{"swap_in_launch_us": {literal}}}}}')
    with pytest.raises(HisparseError, match="NaN"):
        inputs.read_json(path)


def test_json_inputs_refuse_a_key_given_twice(tmp_path, capsys):
    """json keeps the last of two equal keys silently (TOML refuses them): a calibration JSON with
    a second ``link_bw`` of 1 B/s planned with it. Every JSON input goes through parse_json."""
    from tests.fuzzing import assert_clean_error, run_cli

    text = (Path("simulator/presets/calibration/h200.json")).read_text()
    at = text.index('"link_bw"')
    end = text.index(",", at)
    path = tmp_path / "cal.json"
    path.write_text(text[:end + 1] + ' "link_bw": 1.0,' + text[end + 1:])
    assert json.loads(path.read_text())["gpu"]["link_bw"] == 1.0  # what json alone would use
    code, _, err = run_cli(["plan", "--calibration", str(path), "--concurrency", "1", "--no-search", "--quiet"],
                           capsys)
    assert_clean_error(code, err, str(path), "'link_bw' is given twice")
    with pytest.raises(HisparseError, match="'a' is given twice"):
        inputs.parse_json('[{"b": 1}, {"a": 1, "a": 1}]', "x")
    assert inputs.parse_json('[{"a": 1}, {"a": 2}]', "x") == [{"a": 1}, {"a": 2}]  # other objects: fine


@pytest.mark.parametrize("value", ["0", "-5", "ten", "1.5x"])
def test_a_malformed_limit_is_named(monkeypatch, value):
    monkeypatch.setenv("HISPARSE_MAX_INPUT_BYTES", value)
    with pytest.raises(HisparseError, match="HISPARSE_MAX_INPUT_BYTES"):
        inputs.max_input_bytes()


@pytest.mark.parametrize("limit", ["100000000000", str(2**63 - 1)])
def test_a_raised_input_budget_reads_small_files_as_before(tmp_path, monkeypatch, limit):
    """The budget is a ceiling, not an amount to allocate: read(limit + 1) asked for it up front, so
    HISPARSE_MAX_INPUT_BYTES=1e11 failed every small read as "out of memory" and 2**63 - 1 with an OverflowError
    traceback."""
    from simulator.inputs import read_bytes

    monkeypatch.setenv("HISPARSE_MAX_INPUT_BYTES", limit)
    path = tmp_path / "p.toml"
    path.write_text("gpu_hour = 1\n")
    assert read_bytes(path) == b"gpu_hour = 1\n"
    big = tmp_path / "big.bin"
    big.write_bytes(b"x" * (3 * (1 << 24) + 5))  # several pieces
    assert len(read_bytes(big)) == 3 * (1 << 24) + 5
    monkeypatch.setenv("HISPARSE_MAX_INPUT_BYTES", str(1 << 24))
    with pytest.raises(Exception, match="HISPARSE_MAX_INPUT_BYTES"):
        read_bytes(big)
