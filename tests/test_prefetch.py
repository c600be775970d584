"""The plan's points simulated ahead on forked workers (serving/prefetch.py) give the serial run's
numbers bit for bit, and a prefetched result is never served to a different point."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from simulator.cli import main
from simulator.serving import prefetch
from simulator.serving.misses import MissProfiles
from simulator.serving.planner import PlanInputs, prepare, run_plan_full, search_plan


def _plan_json(capsys, monkeypatch, jobs: str, *extra: str) -> dict:
    monkeypatch.setenv("HISPARSE_JOBS", jobs)
    assert main(["plan", "--concurrency", "1,2", "--json", "--quiet", *extra]) == 0
    return json.loads(capsys.readouterr().out)


def test_plan_on_two_workers_equals_the_serial_plan(capsys, monkeypatch):
    serial = _plan_json(capsys, monkeypatch, "1", "--no-search", "--sweep-buffer", "2048,4096")
    parallel = _plan_json(capsys, monkeypatch, "2", "--no-search", "--sweep-buffer", "2048,4096")
    assert parallel == serial
    assert not prefetch._results  # forgotten once the command is done


@pytest.mark.slow
def test_prefetch_and_search_prefetch_serve_every_point(monkeypatch):
    """Every swept and searched point comes from the workers; the plan equals the serial one."""
    inp = PlanInputs(concurrency=(2, 32))
    sc = inp.scenario()
    prep = prepare(inp, sc)
    serial = search_plan(run_plan_full(inp, prepared=prep), inp)
    calls = []
    real = prefetch.model.simulate
    try:
        assert prefetch.prefetch(lambda: run_plan_full(inp, prepared=prep), jobs=2) == 4
        plan = run_plan_full(inp, prepared=prep)
        found = prefetch.prefetch_search(lambda: search_plan(plan, inp), jobs=2)
        assert found == len(serial.results) - 4 > 0
        monkeypatch.setattr(prefetch.model, "simulate", lambda *a, **k: calls.append(a) or real(*a, **k))
        plan = search_plan(plan, inp)
    finally:
        prefetch.forget()
    assert calls == []  # the parent simulated nothing itself
    assert [dataclasses.asdict(r) for r, *_ in plan.results] == [dataclasses.asdict(r) for r, *_ in serial.results]


def test_point_key_tells_every_input_apart():
    sc = PlanInputs().scenario()
    prof = MissProfiles((np.array([0.1, 0.2]),), "t")
    base = prefetch.point_key(sc, "hisparse", concurrency=4, profiles=prof)
    assert base == prefetch.point_key(PlanInputs().scenario(), "hisparse", concurrency=4,
                                      profiles=MissProfiles((np.array([0.1, 0.2]),), "t"))
    others = [prefetch.point_key(sc, "baseline", concurrency=4, profiles=prof),
              prefetch.point_key(sc, "hisparse", concurrency=5, profiles=prof),
              prefetch.point_key(sc, "hisparse", rate_per_s=4.0, profiles=prof),
              prefetch.point_key(sc, "hisparse", concurrency=4, profiles=prof, seed=1),
              prefetch.point_key(sc, "hisparse", concurrency=4, profiles=MissProfiles((np.array([0.1, 0.25]),), "t")),
              prefetch.point_key(sc.replace(hisparse=dataclasses.replace(sc.hisparse, device_buffer_size=6144)),
                                 "hisparse", concurrency=4, profiles=prof)]
    assert len({base, *others}) == 1 + len(others)


def test_one_job_prefetches_nothing(monkeypatch):
    monkeypatch.setenv("HISPARSE_JOBS", "1")
    assert prefetch.prefetch(lambda: pytest.fail("no dry run with one job")) == 0


@pytest.mark.parametrize("value", ["two", "0", "-3"])  # 0 and -3 ran as 1, silently
def test_hisparse_jobs_must_be_a_number(monkeypatch, capsys, value):
    monkeypatch.setenv("HISPARSE_JOBS", value)
    assert main(["plan", "--concurrency", "1", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"HISPARSE_JOBS={value!r}" in err and "1 or more" in err and "Traceback" not in err


def test_worker_processes_beyond_four_per_cpu_are_refused(monkeypatch, capsys):
    """--jobs 100000 forked until the machine stalled (load 547): the search's --jobs and HISPARSE_JOBS are
    refused past 4 x the usable CPUs, naming the option and the machine's count; at the cap they run."""
    from simulator import limits

    monkeypatch.setattr(limits, "usable_cpus", lambda: 2)
    args = ["plan", "--quiet", "--search", "--search-buffer", "4096", "--search-host-ratio", "8",
            "--search-policy", "lru", "--search-top", "1"]
    assert main([*args, "--jobs", "9"]) == 2
    err = capsys.readouterr().err
    assert "--jobs 9: more worker processes than 4 x this machine's 2 CPU(s) (8)" in err and err.count("\n") == 1
    monkeypatch.setenv("HISPARSE_JOBS", "9")
    assert main(["plan", "--concurrency", "1", "--quiet"]) == 2
    assert "HISPARSE_JOBS=9: more worker processes" in capsys.readouterr().err
    limits.check_jobs(8, "--jobs 8")  # at the cap: no error


def test_hisparse_cache_that_cannot_be_made_is_named(monkeypatch, capsys):
    """HISPARSE_CACHE=/proc/nope failed at the first write, naming a cache file under it, not the variable."""
    monkeypatch.setenv("HISPARSE_CACHE", "/proc/nope")
    assert main(["plan", "--concurrency", "1", "--quiet", "--no-search"]) == 2
    err = capsys.readouterr().err
    assert "HISPARSE_CACHE=/proc/nope: cannot make the folder" in err and err.count("\n") == 1


def test_a_bad_limit_variable_is_the_environments_error_not_a_corrupt_trace(monkeypatch, capsys):
    """HISPARSE_MAX_NESTING=-5 read as '<trace>: corrupt environment variable ...'."""
    monkeypatch.setenv("HISPARSE_MAX_NESTING", "-5")
    assert main(["trace", "info", "traces/synthetic-high-locality.hst"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hisparse: error: environment variable HISPARSE_MAX_NESTING='-5'") and "corrupt" not in err


@pytest.mark.parametrize("where", ["file", "/dev/null"])
def test_hisparse_cache_that_is_a_file_is_named(tmp_path, monkeypatch, capsys, where):
    """HISPARSE_CACHE=/dev/null failed at the first cache write, naming a cache file, not the variable."""
    path = tmp_path / "c" if where == "file" else Path(where)
    if where == "file":
        path.write_text("")
    monkeypatch.setenv("HISPARSE_CACHE", str(path))
    assert main(["plan", "--concurrency", "1", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"HISPARSE_CACHE={path}: is a file, not a folder" in err and err.count("\n") == 1


def test_an_empty_hisparse_cache_is_the_default_not_the_working_folder(tmp_path, monkeypatch):
    """HISPARSE_CACHE= (empty) cached into the working folder (Path(''))."""
    from simulator.serving.misses import cache_dir

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("HISPARSE_CACHE", "")
    assert cache_dir() == tmp_path / ".cache" / "hisparse-sim"
