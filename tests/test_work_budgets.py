"""Issue #28, class 5 for commands: each command's work is estimated from its inputs and checked
against a budget before any work (``simulator/limits.py``), the message naming the inputs, the
estimate, the limit and its environment variable; raising the variable lets the same input
through. Members generated: plan load lists and swept knobs, workload and deployment files,
grid shapes, trace gen shapes, trace fit rounds."""

from __future__ import annotations

import re
import time

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from simulator import limits
from simulator.serving.presets import PRESET_DIR
from simulator.trace import TraceMeta, write_trace
from tests.fuzzing import assert_clean_error, fuzz_settings, run_cli
from tests.helpers import Reached, random_stream, reached


def _run(argv, capsys) -> tuple[bool, int, str]:
    """(reached the work, exit status, stderr), timing the refusal."""
    t0 = time.perf_counter()
    try:
        code, _, err = run_cli(argv, capsys)
    except Reached:
        return True, 0, ""
    assert time.perf_counter() - t0 < 30  # refused up front, not after the work
    return False, code, err


def _point_steps(concurrency: list[int], rpc: int = 4, chunk: int = 8192) -> list[int]:
    return [limits.plan_steps(ranks=8, instances=1, concurrency=c, rate=0.0, requests_per_client=rpc,
                              input_tokens=32768, output_tokens=8192, length_jitter=0.0, prefill_chunk_tokens=chunk)
            for c in concurrency]


# accesses of the default scenario's trace (glm51-longbench, 78 layers x 128 steps x k 2048 of one request)
DEFAULT_TRACE_ACCESSES = 78 * 128 * 2048


def _default_steps(concurrency: list[int], rpc: int = 4, chunk: int = 8192, knobs: int = 1) -> int:
    """The plan's estimate (``planner.prepare`` with the search, as ``hisparse plan`` runs it): each point
    for the baseline and every knob set, the bisection's points below the highest swept load for the
    baseline and HiSparse when more than one load is swept, and one trace replay per swept buffer."""
    from simulator.serving.slo import MAX_SEARCH_STEPS

    each = _point_steps(concurrency, rpc, chunk)
    steps = sum(each) * (1 + knobs)
    if len(concurrency) > 1:
        steps += 2 * MAX_SEARCH_STEPS * max(each)
    return steps + limits.replay_steps(knobs, DEFAULT_TRACE_ACCESSES)


@fuzz_settings(20)
@given(n=st.integers(1, 12_000), knobs=st.integers(1, 3))
def test_plan_load_lists_within_the_budgets(capsys, no_simulation, n, knobs):
    """``plan --concurrency`` with n values (the example: 10,000) and swept buffers."""
    conc = list(range(1, n + 1))
    buffers = [4096 + 64 * i for i in range(knobs)]
    ok, code, err = _run(["plan", "--concurrency", ",".join(map(str, conc)),
                          "--sweep-buffer", ",".join(map(str, buffers))], capsys)
    points = n * (1 + knobs)
    steps = _default_steps(conc, knobs=knobs)
    assert ok == (points <= 10_000 and steps <= 10_000_000), (n, knobs, err)
    if not ok:
        assert_clean_error(code, err, "HISPARSE_MAX_POINTS" if points > 10_000 else "HISPARSE_MAX_SIM_STEPS")


@fuzz_settings(10)
@given(ratios=st.integers(50, 150), buffers=st.integers(50, 150))
def test_a_large_knob_sweep_is_refused(capsys, no_simulation, ratios, buffers):
    """The example: a 100 x 100 --sweep-buffer x --sweep-host-ratio."""
    ok, code, err = _run(["plan", "--sweep-buffer", ",".join(str(2048 + i) for i in range(buffers)),
                          "--sweep-host-ratio", ",".join(str(1 + i) for i in range(ratios))], capsys)
    assert not ok
    assert_clean_error(code, err, "HISPARSE_MAX_POINTS")


@fuzz_settings(20)
@given(rpc=st.one_of(st.integers(1, 200), st.just(10**9)), chunk=st.one_of(st.integers(1, 65536), st.just(1)))
def test_workload_and_deployment_files_within_the_budget(tmp_path_factory, capsys, no_simulation, rpc, chunk):
    """``requests_per_client = 1e9`` (workload) and ``prefill_chunk_tokens = 1`` (deployment)."""
    folder = tmp_path_factory.mktemp("w")
    w = folder / "w.toml"
    w.write_text(re.sub(r"(?m)^requests_per_client = .*$", f"requests_per_client = {rpc}",
                        (PRESET_DIR / "workloads" / "32k-in-8k-out.toml").read_text()))
    d = folder / "d.toml"
    d.write_text(re.sub(r"(?m)^prefill_chunk_tokens = .*$", f"prefill_chunk_tokens = {chunk}",
                        (PRESET_DIR / "deployments" / "8xh200-colocated-dp8.toml").read_text()))
    ok, code, err = _run(["plan", "--workload", str(w), "--deployment", str(d)], capsys)
    steps = _default_steps([1, 2, 4, 8, 16, 32, 64, 128, 256], rpc, chunk)
    assert ok == (steps <= 10_000_000), (rpc, chunk, err)
    if not ok:
        assert_clean_error(code, err, str(w), str(d), "HISPARSE_MAX_SIM_STEPS")


def test_raising_the_budget_lets_the_input_through(capsys, no_simulation, monkeypatch):
    argv = ["plan", "--concurrency", ",".join(map(str, range(1, 6001)))]
    assert not _run(argv, capsys)[0]
    monkeypatch.setenv("HISPARSE_MAX_POINTS", "100000")
    monkeypatch.setenv("HISPARSE_MAX_SIM_STEPS", str(10**12))
    assert _run(argv, capsys)[0]


@fuzz_settings(20)
@given(lengths=st.lists(st.integers(1, 400), min_size=2, max_size=5))
def test_grid_size_is_checked_before_the_product(tmp_path_factory, capsys, monkeypatch, lengths):
    """The example: a 1e8-point grid. Refused from its list lengths (the product never built)."""
    keys = ["seed", "slo_tpot_ms", "slo_ttft_s", "concurrency", "device_buffer_size"][:len(lengths)]
    start = {"seed": 0, "slo_tpot_ms": 1, "slo_ttft_s": 1, "concurrency": 1, "device_buffer_size": 2048}
    lines = []
    for key, n in zip(keys, lengths, strict=True):
        values = [start[key] + i for i in range(n)]
        shown = [f"{v}.0" for v in values] if key.startswith("slo") else map(str, values)
        lines.append(f"{key} = [{', '.join(shown)}]")
    path = tmp_path_factory.mktemp("g") / "grid.toml"
    path.write_text('kind = "plan"\n[grid]\n' + "\n".join(lines) + "\n")
    import simulator.commands.sweep as sweep_cmd

    monkeypatch.setattr(sweep_cmd, "check_values", reached)  # past the size check: the values' own checks
    ok, code, err = _run(["sweep", str(path), "--out", str(path.parent / "out"), "--no-ray"], capsys)
    assert ok == (int(np.prod(lengths)) <= 10_000), (lengths, err)
    if not ok:
        assert_clean_error(code, err, str(path), "HISPARSE_MAX_POINTS")


@fuzz_settings(20)
@given(requests=st.integers(1, 10**9), layers=st.integers(1, 200), steps=st.integers(1, 10**6),
       topk=st.sampled_from([16, 2048, 65536]))
def test_trace_gen_shapes_within_the_budget(tmp_path_factory, capsys, monkeypatch, requests, layers, steps, topk):
    import simulator.trace.generator as generator

    monkeypatch.setattr(generator, "generate", reached)
    out = tmp_path_factory.mktemp("gen") / "t.hst"
    ok, code, err = _run(["trace", "gen", "--preset", "high-overlap", "--requests", str(requests), "--layers",
                          str(layers), "--steps", str(steps), "--topk", str(topk), "--ctx0", str(2 * topk),
                          "--out", str(out)], capsys)
    assert ok == (requests * layers * steps * topk <= 2**32), err
    if not ok:
        assert_clean_error(code, err, "HISPARSE_MAX_TRACE_ENTRIES", "--requests")
    assert not out.exists()


@pytest.fixture(scope="module")
def small_trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("fit") / "t.hst"
    write_trace(path, TraceMeta(k=16, source={"kind": "test"}),
                [random_stream(np.random.default_rng(0), steps=20, k=16, ctx0=64, layer=layer) for layer in range(2)])
    return str(path)


@fuzz_settings(10)
@given(rounds=st.integers(10**6, 10**12))
def test_trace_fit_rounds_within_the_budget(tmp_path_factory, capsys, small_trace, rounds):
    """The example: ``trace fit --rounds 1e9``."""
    out = tmp_path_factory.mktemp("fo") / "k.toml"
    ok, code, err = _run(["trace", "fit", small_trace, "--rounds", str(rounds), "--out", str(out)], capsys)
    assert not ok
    assert_clean_error(code, err, small_trace, "--rounds", "HISPARSE_MAX_TRACE_ENTRIES")
    assert not out.exists()


@fuzz_settings(20)
@given(n=st.integers(1, 40), policies=st.sampled_from(["lru", "lru,fifo", "lru,fifo,opt"]),
       most=st.integers(1, 10**5))
def test_replay_configs_times_accesses_within_the_budget(capsys, monkeypatch, small_trace, n, policies, most):
    import simulator.replay.api as api
    from simulator.trace import open_trace

    monkeypatch.setattr(api, "replay", reached)
    monkeypatch.setenv("HISPARSE_MAX_REPLAY_ACCESSES", str(most))
    buffers = ",".join(str(16 + i) for i in range(n))
    ok, code, err = _run(["replay", small_trace, "--buffer", buffers, "--policy", policies], capsys)
    work = n * len(policies.split(",")) * open_trace(small_trace).accesses
    assert ok == (work <= most), (work, most, err)
    if not ok:
        assert_clean_error(code, err, small_trace, "HISPARSE_MAX_REPLAY_ACCESSES")
