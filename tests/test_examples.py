"""The example grid files in examples/ run as shipped (in-process: the points are the same on Ray)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pandas as pd
import pytest

from simulator.cli import main
from simulator.sweep.grid import load_grid

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.toml"))


def test_there_is_a_replay_grid_and_a_plan_grid():
    assert {load_grid(p).kind for p in EXAMPLES} == {"replay", "plan"}


def _run_grid(grid: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(ROOT)  # the files say: run from the repository root
    monkeypatch.setenv("HISPARSE_CACHE", str(tmp_path / "cache"))
    assert main(["sweep", str(grid), "--out", str(tmp_path / "out"), "--no-ray", "--quiet"]) == 0
    table = pd.read_parquet(tmp_path / "out" / "results.parquet")
    assert len(table) == len(load_grid(grid).points) and (table["error"] == "").all()
    if load_grid(grid).kind == "replay":
        assert (table["miss_ratio"] > 0).all()
        lru = table[table.policy == "lru"].set_index("buffer")["misses"]
        assert lru.is_monotonic_decreasing  # more slots, fewer misses
    else:
        assert (table["hisparse_steady_tok_s_deployment"] > 0).all() and (table["hisparse_over_baseline"] > 0).all()


@pytest.mark.slow  # every point: 12 plans (~35 s) and 12 replays with OPT (~18 s) on 2 cores
@pytest.mark.parametrize("grid", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_grid_runs(grid, tmp_path, monkeypatch, capsys):
    _run_grid(grid, tmp_path, monkeypatch)


@pytest.mark.parametrize("grid", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_grid_runs_on_fewer_points(grid, tmp_path, monkeypatch, capsys):
    """The shipped file with each [grid] list cut to its first value, the last list to its first
    two (the default tier's version of the test above: same [fixed] options and checks, a sweep of
    two points)."""
    text = grid.read_text()
    head, _, rest = text.partition("[grid]")
    data = tomllib.loads(rest)
    last = list(data)[-1]
    cut = "".join(f"{key} = {json.dumps(values[:2 if key == last else 1])}\n" for key, values in data.items())
    small = tmp_path / grid.name
    small.write_text(f"{head}[grid]\n{cut}")
    assert len(load_grid(small).points) < len(load_grid(grid).points)
    _run_grid(small, tmp_path, monkeypatch)
