"""The calibration file: one typed record, one reader, one writer; versions it cannot read and
groups of the wrong shape are refused naming the file and key; unknown groups are carried."""

from __future__ import annotations

import json

import pytest

from simulator.costmodel.calibration_file import (
    VERSION,
    CalibrationFile,
    read_calibration,
    write_calibration,
)
from simulator.errors import HisparseError
from simulator.serving import presets as P

PACKAGED = P.PRESET_DIR / "calibration" / "h200.json"


def test_the_packaged_file_round_trips_byte_for_byte(tmp_path):
    cal = read_calibration(PACKAGED)
    out = tmp_path / "h200.json"
    write_calibration(cal, out)
    assert out.read_bytes() == PACKAGED.read_bytes()


def test_a_version_1_file_reads_and_is_written_as_the_current_version(tmp_path):
    data = json.loads(PACKAGED.read_text())
    del data["version"]
    data["newer_group"] = {"kept": True}
    old = tmp_path / "old.json"
    old.write_text(json.dumps(data))
    cal = read_calibration(old)
    assert cal.version == VERSION and cal.extra == {"newer_group": {"kept": True}}
    write_calibration(cal.replace(comm={"source": "x"}), old)
    again = json.loads(old.read_text())
    assert again["version"] == VERSION and again["newer_group"] == {"kept": True} and again["comm"] == {"source": "x"}


@pytest.mark.parametrize("body, says", [
    ('{"version": 99}', "version = 99"),
    ('{"version": true}', "version = True"),
    ('{"gpu": []}', "'gpu' must be an object"),
    ('{"gpu": {"link_bw": "fast"}}', "gpu.link_bw = 'fast' must be a finite number"),
    ('{"source": 3}', "source must be a string"),
    ("[1]", "expected a JSON object"),
    ("{", "not valid JSON"),
])
def test_bad_files_name_the_file_and_key(tmp_path, body, says):
    path = tmp_path / "bad.json"
    path.write_text(body)
    with pytest.raises(HisparseError, match="bad.json: " + says.replace("(", r"\(").replace(")", r"\)")):
        read_calibration(path)


def test_a_non_finite_fit_is_never_written(tmp_path):
    out = tmp_path / "x.json"
    with pytest.raises(HisparseError, match="not finite"):
        write_calibration(CalibrationFile("t", params={"swap_in_launch_us": float("nan")}), out)
    assert not out.exists()
