"""``hisparse presets show KIND NAME``: a preset as it resolves (every key, defaults written out), as
TOML or JSON, with one-line errors for a bad kind, name or option."""

from __future__ import annotations

import dataclasses
import json
import tomllib
from pathlib import Path

import pytest

from simulator.serving import presets as P
from tests.fuzzing import assert_clean_error, run_cli

# one shipped preset of every kind (the calibration twice: a TOML parameter set and a calibration JSON)
SHOWN = [("gpu", "h200"), ("models", "glm-5.1-fp8"), ("deployment", "8xh200-colocated-dp8"),
         ("workload", "32k-in-8k-out"), ("hisparse", "sglang-default"), ("cluster", "2x8xh200-roce"),
         ("calibration", "uncalibrated"), ("calibration", "h200")]


def _fields(kind: str) -> set[str]:
    return {f.name for f in dataclasses.fields(P.KINDS[kind])} - {"where"}


def _spec_values(spec) -> dict:
    return {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec) if f.name not in ("where", "interconnect")}


@pytest.mark.parametrize("kind, name", SHOWN)
def test_show_prints_every_key_and_loads_back_to_the_preset(kind, name, capsys):
    from simulator.serving.schema import kind_of

    code, out, err = run_cli(["presets", "show", kind, name], capsys)
    assert code == 0, err
    data = tomllib.loads(out)
    kind = kind_of(kind)
    assert set(data) >= _fields(kind)  # every key, the ones the file leaves out included
    shown = P.build(P.KINDS[kind], data, "<shown>")
    assert _spec_values(shown) == _spec_values(P.load(kind, name))
    code, js, err = run_cli(["presets", "show", kind, name, "--json"], capsys)
    assert code == 0, err
    obj = json.loads(js)
    extra = set(obj) - set(data)
    assert {k: obj[k] for k in data} == json.loads(json.dumps(data))  # the same keys and values as the TOML
    assert extra == ({"gpu"} if name == "h200" and kind == "calibration" else set())


def test_show_writes_out_the_defaults_of_a_users_file(tmp_path, capsys):
    """A file that leaves keys to their defaults shows them, with the file's own values kept."""
    full = tomllib.loads(Path("simulator/presets/workloads/32k-in-8k-out.toml").read_text())
    required = {f.name for f in dataclasses.fields(P.KINDS["workloads"])
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    mine = {k: v for k, v in full.items() if k in required}
    mine["input_tokens"] = full["input_tokens"] + 1000
    assert len(mine) < len(_fields("workloads"))  # the file leaves some keys out
    path = tmp_path / "mine workload ü.toml"
    path.write_text("\n".join(f"{k} = {json.dumps(v)}" for k, v in mine.items()) + "\n")
    code, out, err = run_cli(["presets", "show", "workload", str(path), "--json"], capsys)
    assert code == 0, err
    obj = json.loads(out)
    assert set(obj) == _fields("workloads") and obj["input_tokens"] == mine["input_tokens"]
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # nothing written beside it


def test_show_calibration_json_carries_its_measured_gpu_figures(capsys):
    raw = json.loads(Path("simulator/presets/calibration/h200.json").read_text())
    code, out, _ = run_cli(["presets", "show", "calibration", "h200", "--json"], capsys)
    obj = json.loads(out)
    assert obj["gpu"] == raw["gpu"]
    fitted = {k: v for k, v in raw["params"].items() if k in obj}
    assert fitted and all(obj[k] == v for k, v in fitted.items())  # the fitted terms over the uncalibrated ones


@pytest.mark.parametrize("argv, names", [
    (["presets", "show"], ["presets show", "KIND", "NAME"]),
    (["presets", "show", "gpu"], ["presets show", "NAME"]),
    (["presets", "show", "gpus-x", "h200"], ["unknown preset kind", "gpus-x"]),
    (["presets", "show", "gpu", "h201"], ["unknown gpu preset", "h201", "h200"]),
    (["presets", "show", "gpu", "missing.toml"], ["missing.toml", "no such file"]),
    (["presets", "show", "gpu", "h200", "--out", "x.toml"], ["presets show", "--out"]),
    (["presets", "show", "gpu", "h200", "--from", "h100"], ["presets show", "--from"]),
    (["presets", "show", "gpu", "h200", "--schema", "gpu"], ["presets show", "--schema"]),
    (["presets", "show", "model", "h200"], ["unknown model preset", "h200", "or give a .toml file"]),
    (["presets", "show", "calibration", "h201"], ["unknown calibration preset", "or give a .toml or calibration .json"]),
    (["presets", "new", "gpu", "h200", "--out", "x.toml"], ["presets new", "--from h200"]),
])
def test_show_errors_are_one_line(argv, names, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(argv, capsys)
    assert_clean_error(code, err, *names)
    assert out == "" and not list(tmp_path.iterdir())


def test_show_of_a_file_of_another_kind_is_refused(tmp_path, capsys):
    path = tmp_path / "gpu.toml"
    path.write_text(Path("simulator/presets/gpus/h200.toml").read_text())
    code, out, err = run_cli(["presets", "show", "workload", str(path)], capsys)
    assert_clean_error(code, err, str(path))
    assert out == ""


def test_help_documents_show(capsys):
    code, out, _ = run_cli(["presets", "--help"], capsys)
    assert code == 0 and "presets show KIND NAME" in out and "show" in out.split("positional arguments")[1]


@pytest.mark.parametrize("kind, source", [("gpu", "simulator/presets/gpus/h200.toml"),
                                          ("calibration", "simulator/presets/calibration/h200.json")])
def test_show_of_a_file_named_with_a_newline_prints_a_header_that_parses(kind, source, tmp_path, capsys):
    """A newline in the file's name went into the header comment as it was: an AssertionError traceback."""
    path = tmp_path / f"x\ny{Path(source).suffix}"
    path.write_bytes(Path(source).read_bytes())
    code, out, err = run_cli(["presets", "show", kind, str(path)], capsys)
    assert code == 0, err
    assert "x\\ny" in out.splitlines()[0]
    tomllib.loads(out)  # the whole text, header included, is TOML
