"""``hisparse sweep`` QA: one file named two ways in a grid, and an output folder whose parts are not
files, each refused up front with one line."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import pytest

from simulator.sweep.grid import load_grid
from tests.fuzzing import assert_clean_error, run_cli

TRACE = "traces/synthetic-high-locality.hst"
SMALL = f'kind = "replay"\n[fixed]\ntrace = "{TRACE}"\n[grid]\npolicy = ["lru", "fifo"]\nbuffer = [2048, 4096]\n'


def _grid(tmp_path: Path, text: str, name: str = "grid.toml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("other", ["./" + TRACE, os.path.abspath(TRACE), "traces/../" + TRACE, "LINK"])
def test_one_trace_named_two_ways_is_refused_naming_both(tmp_path, capsys, other):
    """Before, each spelling ran as its own point: the same replay twice, both rows in results.parquet."""
    if other == "LINK":
        other = str(tmp_path / "link.hst")
        os.symlink(os.path.abspath(TRACE), other)
    grid = _grid(tmp_path, f'kind = "replay"\n[fixed]\nbuffer = 2048\n[grid]\ntrace = ["{TRACE}", "{other}"]\n')
    code, out, err = run_cli(["sweep", grid, "--out", str(tmp_path / "o"), "--no-ray", "--quiet"], capsys)
    assert_clean_error(code, err, grid, "trace", repr(TRACE), repr(other), "name the same file")
    assert out == "" and not (tmp_path / "o").exists()


def test_two_different_traces_still_make_two_points(tmp_path):
    grid = load_grid(_grid(tmp_path, f'kind = "replay"\n[grid]\ntrace = ["{TRACE}", '
                                     '"./traces/synthetic-dsa-like.hst"]\n'))
    assert [p["trace"] for p in grid.points] == [TRACE, "./traces/synthetic-dsa-like.hst"]


def test_a_plan_preset_and_its_file_are_one_input(tmp_path, capsys):
    """A preset name and the path of the file it resolves to (or two paths of one user file)."""
    from simulator.serving.presets import resolve

    shipped = str(resolve("gpus", "h200"))
    grid = _grid(tmp_path, f'kind = "plan"\n[grid]\ngpu = ["h200", "{shipped}"]\n')
    code, _, err = run_cli(["sweep", grid, "--out", str(tmp_path / "o"), "--no-ray", "--quiet"], capsys)
    assert_clean_error(code, err, grid, "gpu", "'h200'", shipped, "name the same file")
    mine = tmp_path / "my.toml"
    mine.write_text(Path(shipped).read_text())
    grid = _grid(tmp_path, f'kind = "plan"\n[grid]\ngpu = ["{mine}", "{tmp_path}/./my.toml"]\n', name="g2.toml")
    code, _, err = run_cli(["sweep", grid, "--out", str(tmp_path / "o"), "--no-ray", "--quiet"], capsys)
    assert_clean_error(code, err, grid, "gpu", "name the same file")
    # a copy is another file, and calibration words name none
    copy = tmp_path / "copy.toml"
    copy.write_text(mine.read_text())
    ok = load_grid(_grid(tmp_path, f'kind = "plan"\n[grid]\ngpu = ["{mine}", "{copy}"]\n'
                                   'calibration = ["auto", "none"]\n', name="ok.toml"))
    assert len(ok.points) == 4
    assert not (tmp_path / "o").exists()


def test_parts_that_is_a_file_is_refused_before_any_point(tmp_path, capsys):
    """Was the OS's "OUT/parts: Not a directory" (after the grid's checks, with no hint)."""
    out = tmp_path / "o"
    out.mkdir()
    (out / "parts").write_text("mine")
    code, _, err = run_cli(["sweep", _grid(tmp_path, SMALL), "--out", str(out), "--no-ray", "--quiet", "--resume"],
                           capsys)
    assert_clean_error(code, err, str(out / "parts"), "is a file")
    assert (out / "parts").read_text() == "mine" and not (out / "results.parquet").exists()


def test_a_part_that_is_a_folder_is_refused_on_resume(tmp_path, capsys):
    """Was a warning that the point would run again, then "Is a directory" from the failed unlink."""
    grid = _grid(tmp_path, SMALL)
    out = tmp_path / "o"
    code, _, err = run_cli(["sweep", grid, "--out", str(out), "--no-ray", "--quiet", "--max-points", "1"], capsys)
    assert code == 0, err
    (part,) = (out / "parts").iterdir()
    part.unlink()
    part.mkdir()
    (part / "keep").write_text("mine")
    code, _, err = run_cli(["sweep", grid, "--out", str(out), "--no-ray", "--quiet", "--resume"], capsys)
    assert_clean_error(code, err, str(part), "not a file")
    assert "warning" not in err and (part / "keep").read_text() == "mine"
    part.joinpath("keep").unlink()
    part.rmdir()
    code, _, err = run_cli(["sweep", grid, "--out", str(out), "--no-ray", "--quiet", "--resume"], capsys)
    assert code == 0, err
    assert len(pd.read_parquet(out / "results.parquet")) == 4


def test_a_misspelt_kind_is_named(tmp_path, capsys):
    """``Kind = "replay"`` was reported as a missing kind, the typo unnamed."""
    grid = _grid(tmp_path, f'Kind = "replay"\n[fixed]\ntrace = "{TRACE}"\n')
    code, _, err = run_cli(["sweep", grid, "--out", str(tmp_path / "o"), "--no-ray", "--quiet"], capsys)
    assert_clean_error(code, err, grid, "unknown section(s) Kind")


def test_help_says_each_file_once(capsys):
    code, out, _ = run_cli(["sweep", "--help"], capsys)
    assert code == 0 and "one file named two ways" in " ".join(out.split())


def test_a_plan_point_hisparse_cannot_run_keeps_the_baseline():
    """DeepSeek-V4-Pro at 32K on the colocated DP8 deployment: no request fits HiSparse's device pool
    (the plan leaves it out, saying why). The point used to fail with KeyError and lose the
    baseline's figures; now it keeps them and names the reason."""
    from simulator.sweep.points import run_point

    out = run_point("plan", {"model": "deepseek-v4-pro", "deployment": "8xh200-colocated-dp8",
                             "workload": "32k-in-8k-out", "concurrency": 8})
    assert out["error"] == ""
    assert out["baseline_steady_tok_s_deployment"] > 0 and "hisparse_steady_tok_s_deployment" not in out
    assert "needs 32768 KV slots" in out["hisparse_cannot_run"]
    assert out["hisparse_over_baseline"] != out["hisparse_over_baseline"]  # NaN: nothing to compare
