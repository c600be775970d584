"""A UTF-8 byte-order mark before a TOML or JSON file's text (simulator/inputs.py): Windows editors
save "UTF-8 with BOM"; tomllib refused such a grid or preset as "Invalid statement at line 1, column 1"."""

from __future__ import annotations

import json

import pytest

from simulator import inputs
from simulator.errors import HisparseError
from simulator.serving import presets as P
from tests.fuzzing import run_cli

BOM = b"\xef\xbb\xbf"
GRID = b'kind = "replay"\n[fixed]\ntrace = "t.hst"\n[grid]\nbuffer = [2048, 4096]\n'


def test_a_toml_file_with_a_bom_reads_as_without(tmp_path):
    plain, marked = tmp_path / "plain.toml", tmp_path / "marked.toml"
    plain.write_bytes(GRID)
    marked.write_bytes(BOM + GRID)
    assert inputs.read_toml(marked) == inputs.read_toml(plain) == {
        "kind": "replay", "fixed": {"trace": "t.hst"}, "grid": {"buffer": [2048, 4096]}}


def test_a_json_file_with_a_bom_reads_as_without(tmp_path):
    path = tmp_path / "cal.json"
    path.write_bytes(BOM + json.dumps({"a": [1, 2.5]}).encode())
    assert inputs.read_json(path) == {"a": [1, 2.5]}


def test_only_one_leading_bom_is_dropped(tmp_path):
    """A BOM anywhere else is a character of the text, which TOML does not allow there."""
    for data in (BOM + BOM + GRID, GRID + BOM + b"x = 1\n"):
        path = tmp_path / "odd.toml"
        path.write_bytes(data)
        with pytest.raises(HisparseError, match="not valid TOML"):
            inputs.read_toml(path)


def test_a_bad_byte_after_a_bom_is_named_at_its_offset_in_the_file(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_bytes(BOM + b"a = 1\n\xff\n")
    with pytest.raises(HisparseError, match=r"not a UTF-8 text .* at byte 9\)"):
        inputs.read_toml(path)


def test_a_gpu_preset_with_a_bom_loads_and_copies(tmp_path, capsys):
    src = P.PRESET_DIR / "gpus" / "b200.toml"
    marked = tmp_path / "gpu.toml"
    marked.write_bytes(BOM + src.read_bytes())
    assert P.load("gpus", str(marked)) == P.load("gpus", str(src))
    out = tmp_path / "copy.toml"
    code, _, err = run_cli(["presets", "new", "gpu", "--from", str(marked), "--out", str(out)], capsys)
    assert code == 0, err
    assert P.load("gpus", str(out)) == P.load("gpus", str(src))  # the [interconnect] table copied too
