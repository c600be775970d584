"""The planner's errors read right for a plan point of a sweep grid as for ``hisparse plan``: what a
plan counts, which swept value is wrong and what sets it there, and huge byte counts written short."""

from __future__ import annotations

import re

import pytest

from simulator.errors import HisparseError
from simulator.serving import memory, planner
from simulator.serving.planner import PlanInputs, prepare
from tests.fuzzing import assert_clean_error, run_cli

FIXED = '[fixed]\nmodel = "glm-5.1-fp8"\ndeployment = "8xh200-colocated-dp8"\nworkload = "32k-in-8k-out"\n'


def _sweep(tmp_path, capsys, grid: str) -> tuple[int, str]:
    path = tmp_path / "grid.toml"
    path.write_text(f'kind = "plan"\n{FIXED}[grid]\nconcurrency = [64]\n{grid}')
    code, _, err = run_cli(["sweep", str(path), "--no-ray", "--out", str(tmp_path / "out")], capsys)
    return code, err


def test_a_one_point_grid_says_what_its_plan_counts(tmp_path, capsys, monkeypatch):
    """It said "plan of 2 points" for one load point: the 2 were the systems."""
    monkeypatch.setenv("HISPARSE_MAX_SIM_STEPS", "1")
    code, err = _sweep(tmp_path, capsys, "")
    assert_clean_error(code, err, "plan of 1 load point x (baseline + 1 HiSparse knob set)",
                       "HISPARSE_MAX_SIM_STEPS")
    assert "2 points" not in err


def test_the_count_names_only_the_systems_that_run():
    two = planner._runs([(1, 0.0), (2, 0.0)], True, ["a", "b", "c"])
    assert two == "2 load points x (baseline + 3 HiSparse knob sets)"
    assert planner._runs([(1, 0.0)], False, ["a"]) == "1 load point x (1 HiSparse knob set)"


def test_a_swept_buffer_below_top_k_names_the_grid_key_in_a_sweep(tmp_path, capsys):
    code, err = _sweep(tmp_path, capsys, "device_buffer_size = [100]\n")
    assert_clean_error(code, err, "device_buffer_size 100", "device_buffer_size in a sweep grid", "--sweep-buffer",
                       "< top_k 2048")
    assert "--sweep-host-ratio" not in err and "--residency" not in err  # only the value that is wrong


def test_a_swept_buffer_below_top_k_names_the_option_in_a_plan():
    with pytest.raises(HisparseError) as exc:
        prepare(PlanInputs(buffers=(100,)))
    msg = str(exc.value)
    assert "with device_buffer_size 100 (hisparse plan --sweep-buffer, or device_buffer_size in a sweep grid)" in msg
    assert "--sweep-buffer/--sweep-host-ratio/--residency" not in msg


def test_a_swept_host_ratio_below_one_names_the_grid_key(tmp_path, capsys):
    code, err = _sweep(tmp_path, capsys, "host_to_device_ratio = [0.5]\n")
    assert_clean_error(code, err, "0.5 must be >= 1", "host_to_device_ratio key")


@pytest.mark.parametrize("ratio", [1e20, 1e300])
def test_a_huge_host_ratio_prints_its_bytes_short(ratio):
    with pytest.raises(HisparseError) as exc:
        prepare(PlanInputs(host_ratios=(ratio,)))
    msg = str(exc.value)
    assert "one token slot takes" in msg and "host_to_device_ratio" in msg
    assert not re.search(r"\d{16}", msg), msg  # was a 300-digit integer of bytes
    assert re.search(r"takes \d\.\d+e\+\d+ B", msg), msg
    assert f"host_to_device_ratio {ratio:g} (hisparse plan --sweep-host-ratio" in msg  # the swept value, named


def test_a_huge_host_ratio_in_a_sweep_grid(tmp_path, capsys):
    code, err = _sweep(tmp_path, capsys, "host_to_device_ratio = [1e300]\n")
    assert_clean_error(code, err, "host_to_device_ratio in a sweep grid", "1e+300")
    assert not re.search(r"\d{16}", err), err


def test_readable_counts():
    assert memory.readable(89856) == "89856"
    assert memory.readable(999_999_999_999) == "999999999999"
    assert memory.readable(1.0296e303) == "1.03e+303"
    assert memory.readable(10**40) == "1e+40"
