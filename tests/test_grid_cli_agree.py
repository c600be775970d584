"""Issue #28, class 9: a sweep grid's check is the command's own. For any value of a grid key,
the grid is refused before any point runs exactly when ``hisparse replay`` / ``hisparse plan``
with that value as its option refuses it before any work (a buffer of 1e9 past the trace's
contexts, a host ratio of 0.5, a buffer below top-k, a model file with ``layers = true``)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from simulator.commands import sweep as sweep_cmd
from simulator.errors import HisparseError
from simulator.sweep.grid import load_grid
from simulator.trace import TraceMeta, write_trace
from tests.fuzzing import fuzz_settings, run_cli
from tests.helpers import Reached, random_stream, reached


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("agree") / "t.hst"
    write_trace(path, TraceMeta(k=16, source={"kind": "test"}),
                [random_stream(np.random.default_rng(0), steps=20, k=16, ctx0=40)])
    return str(path)


def _cli_accepts(argv, capsys) -> bool:
    try:
        code, _, err = run_cli(argv, capsys)
    except Reached:
        return True
    assert code == 2 and "Traceback" not in err, (code, err)
    return False


def _grid_accepts(path, text: str) -> bool:
    path.write_text(text)
    try:
        sweep_cmd.check_values(load_grid(path), str(path))
    except HisparseError as exc:
        assert str(path) in str(exc) and "\n" not in str(exc)
        return False
    return True


def _toml(v) -> str:
    return json.dumps(v) if isinstance(v, str) else repr(v)


REPLAY_VALUES = st.one_of(
    st.tuples(st.just("buffer"), st.one_of(st.integers(1, 64), st.integers(2**20 - 2, 2**20 + 2),
                                           st.integers(1, 2**40), st.just(10**9))),
    st.tuples(st.just("seed"), st.integers(-2, 2**64)),
    st.tuples(st.just("policy"), st.sampled_from(["lru", "opt", "fifo", "none", "static-prefix", "belady", ""])),
    st.tuples(st.just("semantics"), st.sampled_from(["batched", "sequential", "other"])),
    st.tuples(st.just("initial"), st.sampled_from(["prefix", "empty", "full"])))


@fuzz_settings(40)
@given(kv=REPLAY_VALUES)
def test_replay_grid_agrees_with_replay(tmp_path_factory, capsys, monkeypatch, trace, kv):
    key, value = kv
    import simulator.replay.api as api

    monkeypatch.setattr(api, "replay", reached)
    cli = _cli_accepts(["replay", trace, f"--{key}", str(value)], capsys)
    path = tmp_path_factory.mktemp("g") / "grid.toml"
    grid = _grid_accepts(path, f'kind = "replay"\n[fixed]\ntrace = {_toml(trace)}\n[grid]\n{key} = [{_toml(value)}]\n')
    assert cli == grid, (key, value, cli, grid)


PLAN_OPTIONS = {"device_buffer_size": "--sweep-buffer", "host_to_device_ratio": "--sweep-host-ratio",
                "concurrency": "--concurrency", "rate": "--rate", "slo_tpot_ms": "--slo-tpot-ms"}
PLAN_VALUES = st.one_of(
    st.tuples(st.just("device_buffer_size"), st.one_of(st.integers(1, 4096), st.just(2**31), st.just(10**9))),
    st.tuples(st.just("host_to_device_ratio"), st.one_of(st.floats(-1, 16), st.just(0.5), st.just(1.0))),
    st.tuples(st.just("concurrency"), st.one_of(st.integers(-1, 512), st.just(10**12))),
    st.tuples(st.just("rate"), st.one_of(st.floats(-1, 100), st.just(0.0))),
    st.tuples(st.just("slo_tpot_ms"), st.floats(-1, 1000)))


@fuzz_settings(25)
@given(kv=PLAN_VALUES)
def test_plan_grid_agrees_with_plan(tmp_path_factory, capsys, monkeypatch, kv):
    key, value = kv
    import simulator.serving.planner as planner

    monkeypatch.setattr(planner, "run_plan_full", reached)
    cli = _cli_accepts(["plan", PLAN_OPTIONS[key], str(value)], capsys)
    path = tmp_path_factory.mktemp("g") / "grid.toml"
    grid = _grid_accepts(path, f'kind = "plan"\n[grid]\n{key} = [{_toml(value)}]\n')
    assert cli == grid, (key, value, cli, grid)


@pytest.mark.parametrize("key, replace", [("layers", "true"), ("layers", "0"), ("top_k", "2.5")])
def test_a_bad_model_file_fails_the_grid_as_it_fails_plan(tmp_path, capsys, monkeypatch, key, replace):
    """The example: ``layers = true`` in a model file passed the grid (only its path was looked
    up) and failed every point."""
    import re

    import simulator.serving.planner as planner
    from simulator.serving.presets import PRESET_DIR

    text = (PRESET_DIR / "models" / "glm-5.1-fp8.toml").read_text()
    model = tmp_path / "model.toml"
    model.write_text(re.sub(rf"(?m)^{key} = .*$", f"{key} = {replace}", text))
    monkeypatch.setattr(planner, "run_plan_full", reached)
    assert not _cli_accepts(["plan", "--model", str(model)], capsys)
    assert not _grid_accepts(tmp_path / "grid.toml", f'kind = "plan"\n[fixed]\nmodel = {_toml(str(model))}\n'
                                                      "[grid]\nseed = [1, 2]\n")


def test_the_grid_checks_run_before_any_point(tmp_path, monkeypatch, capsys, trace):
    """The examples, end to end: each is refused by ``hisparse sweep`` with exit 2 and no point run."""
    import simulator.sweep.points as points
    import simulator.sweep.runner as runner

    # runner binds run_point at its import: patch both names, or a runner first imported here kept the
    # stand-in for every later test of the session (test_sweep.py's sweeps then raised Reached)
    monkeypatch.setattr(points, "run_point", reached)
    monkeypatch.setattr(runner, "run_point", reached)
    cases = [f'kind = "replay"\n[fixed]\ntrace = {_toml(trace)}\n[grid]\nbuffer = [16, 1000000000]\n',
             f'kind = "replay"\n[fixed]\ntrace = {_toml(trace)}\n[grid]\nbuffer = [8, 16]\n',
             'kind = "plan"\n[grid]\nhost_to_device_ratio = [0.5, 2.0]\n',
             'kind = "plan"\n[grid]\ndevice_buffer_size = [1024, 4096]\n']
    for i, text in enumerate(cases):
        path = tmp_path / f"g{i}.toml"
        path.write_text(text)
        code, _, err = run_cli(["sweep", str(path), "--out", str(tmp_path / f"out{i}"), "--no-ray"], capsys)
        assert code == 2 and str(path) in err, (text, err)
        assert not (tmp_path / f"out{i}").exists()
