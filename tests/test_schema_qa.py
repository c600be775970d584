"""``hisparse presets new`` and ``presets --schema`` (serving/schema.py): a copy written into another
folder still names the files its source named, and the schema says how each kind's files are made."""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path

import pytest

from simulator.errors import HisparseError
from simulator.serving import presets as P
from simulator.serving import schema as S
from tests.fuzzing import assert_clean_error, run_cli

H200 = P.PRESET_DIR / "gpus" / "h200.toml"
H200_CAL = P.PRESET_DIR / "calibration" / "h200.json"


def _gpu_with_calibration(folder: Path, value: str, name: str = "gpu.toml") -> Path:
    """The shipped H200 preset with ``calibration = value``, written into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    text = H200.read_text()
    assert 'calibration = "h200"' in text
    path = folder / name
    path.write_text(text.replace('calibration = "h200"', f"calibration = {json.dumps(value)}", 1))
    return path


@pytest.fixture
def beside(tmp_path, monkeypatch) -> Path:
    """a/gpu.toml naming a/cal.json as ``calibration = "cal.json"``; the tests run from tmp_path."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "cal.json").write_bytes(H200_CAL.read_bytes())
    _gpu_with_calibration(tmp_path / "a", "cal.json")
    return tmp_path


def _written_calibration(path: str | Path) -> str:
    return tomllib.loads(Path(path).read_text())["calibration"]


def test_a_copy_elsewhere_still_names_the_calibration_beside_its_source(beside, capsys):
    code, out, err = run_cli(["presets", "new", "gpu", "--from", "a/gpu.toml", "--out", "b/gpu.toml"], capsys)
    assert code == 0, err
    assert _written_calibration("b/gpu.toml") == "../a/cal.json"  # relative: the two folders allow it
    # what hisparse plan --gpu b/gpu.toml reads: the same file (was "no such file b/cal.json")
    assert P.calibration_file("b/gpu.toml").samefile(beside / "a" / "cal.json")
    assert os.path.samefile(P.calibration_file("a/gpu.toml"), P.calibration_file("b/gpu.toml"))


def test_a_copy_in_a_folder_below_and_back(beside, capsys):
    (beside / "c" / "d").mkdir(parents=True)
    assert run_cli(["presets", "new", "gpu", "--from", "a/gpu.toml", "--out", "c/d/g.toml"], capsys)[0] == 0
    assert P.calibration_file("c/d/g.toml").samefile(beside / "a" / "cal.json")
    # and a copy of the copy, back beside the calibration, names it as the original did
    assert run_cli(["presets", "new", "gpu", "--from", "c/d/g.toml", "--out", "a/again.toml"], capsys)[0] == 0
    assert _written_calibration("a/again.toml") == "cal.json"


def test_a_copy_into_the_same_folder_keeps_the_value(beside, capsys):
    assert run_cli(["presets", "new", "gpu", "--from", "a/gpu.toml", "--out", "a/copy.toml"], capsys)[0] == 0
    assert _written_calibration("a/copy.toml") == "cal.json"


def test_a_copy_through_a_linked_folder_names_the_same_file(beside, capsys):
    (beside / "real" / "deep").mkdir(parents=True)
    (beside / "link").symlink_to(beside / "real" / "deep", target_is_directory=True)
    # link/.. is real/, not the working folder: the path is made from the folders as they are on disk
    assert run_cli(["presets", "new", "gpu", "--from", "a/gpu.toml", "--out", "link/g.toml"], capsys)[0] == 0
    assert P.calibration_file("link/g.toml").samefile(beside / "a" / "cal.json")


def test_no_relative_path_between_the_folders_writes_an_absolute_one(beside, monkeypatch):
    def no_relpath(*_args, **_kw):  # Windows: another drive
        raise ValueError("path is on mount 'C:', start on mount 'D:'")

    monkeypatch.setattr(S.os.path, "relpath", no_relpath)
    S.write_new_preset("gpus", "a/gpu.toml", "b/gpu.toml")
    value = _written_calibration("b/gpu.toml")
    assert Path(value).is_absolute() and Path(value).samefile(beside / "a" / "cal.json")


def test_names_and_absolute_paths_are_copied_as_they_are(beside, capsys):
    assert run_cli(["presets", "new", "gpu", "--from", "h200", "--out", "b/h.toml"], capsys)[0] == 0
    assert _written_calibration("b/h.toml") == "h200"  # a packaged calibration's name, the same from anywhere
    absolute = (beside / "a" / "cal.json").as_posix()
    _gpu_with_calibration(beside / "a", absolute, "abs.toml")
    assert run_cli(["presets", "new", "gpu", "--from", "a/abs.toml", "--out", "b/abs.toml"], capsys)[0] == 0
    assert _written_calibration("b/abs.toml") == absolute


def test_the_check_compares_the_file_a_calibration_path_names(beside):
    """The unrewritten text (what presets new wrote before) names b/cal.json from b/: not the same
    calibration, whatever the strings say."""
    stale = S.new_preset("gpus", "a/gpu.toml")  # no out: the value as the source has it
    assert 'calibration = "cal.json"' in stale
    with pytest.raises(HisparseError, match="calibration"):
        S.check_loads("gpus", stale, "b/gpu.toml", source="a/gpu.toml")
    S.check_loads("gpus", stale, "a/other.toml", source="a/gpu.toml")  # from a/ it is the same file
    S.check_loads("gpus", S.new_preset("gpus", "a/gpu.toml", "b/gpu.toml"), "b/gpu.toml", source="a/gpu.toml")


def test_presets_show_still_prints_the_value_as_the_file_has_it(beside, capsys):
    code, out, err = run_cli(["presets", "show", "gpu", "a/gpu.toml"], capsys)
    assert code == 0, err
    assert tomllib.loads(out)["calibration"] == "cal.json"


def test_a_source_name_with_a_newline_writes_a_file_that_loads(beside, capsys):
    """The header comment names the source: a newline in its name broke the comment and the copy's
    check raised an AssertionError (a traceback)."""
    odd = beside / "a" / "x\ny.toml"
    odd.write_bytes((beside / "a" / "gpu.toml").read_bytes())
    code, _, err = run_cli(["presets", "new", "gpu", "--from", str(odd), "--out", "b/odd.toml"], capsys)
    assert code == 0 and "Traceback" not in err, err
    assert P.load("gpus", "b/odd.toml").name == P.load("gpus", str(odd)).name
    assert P.calibration_file("b/odd.toml").samefile(beside / "a" / "cal.json")


def test_the_only_file_relative_keys_are_the_ones_rewritten():
    """Every key new_preset rewrites is a string field of its kind (a renamed field would silently stop
    being rewritten)."""
    for kind, keys in S.FILE_RELATIVE_KEYS.items():
        names = {k.name: k for k in S.schema(kind)}
        for key in keys:
            assert names[key].type == "string"


# -- presets --schema calibration ------------------------------------------------------------------
def test_the_calibration_schema_says_how_calibration_files_are_made(capsys):
    code, out, err = run_cli(["presets", "--schema", "calibration"], capsys)
    assert code == 0, err
    assert "presets new calibration" not in out  # presets new refuses the kind
    assert "hisparse calibrate" in out and "hisparse presets show calibration NAME" in out
    # what it suggests works, and what it used to suggest does not
    assert run_cli(["presets", "show", "calibration", "uncalibrated"], capsys)[0] == 0
    code, _, err = run_cli(["presets", "new", "calibration", "--from", "uncalibrated", "--out", "x.toml"], capsys)
    assert_clean_error(code, err, "hisparse calibrate")


@pytest.mark.parametrize("kind", [k for k in P.KINDS if k != "calibration"])
def test_the_other_schemas_still_name_presets_new(kind, capsys):
    code, out, _ = run_cli(["presets", "--schema", kind], capsys)
    assert code == 0 and f"hisparse presets new {kind} --from NAME --out FILE" in out
