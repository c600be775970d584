"""``hisparse plan`` inputs that ran for many minutes with no refusal and no progress (QA pass):
the work budget (``limits.plan_steps``, ``planner.prepare``) counted one wave of decode per rank,
so 1,000,000 clients (hours) or 30,000 tiny requests per client passed it; and it counted neither a
swept buffer's trace replay (2,000 buffers: minutes of replays before the first point) nor the
bisection's points. Each is now refused up front, naming the budget, and what fits still runs."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from simulator import limits
from simulator.serving.presets import PRESET_DIR
from tests.fuzzing import assert_clean_error, run_cli
from tests.helpers import Reached

TRACE = str(Path(__file__).resolve().parents[1] / "traces" / "glm51-longbench.hst")


def _plan(argv: list[str], capsys) -> tuple[bool, int, str]:
    """(reached the simulation, exit status, stderr); a refusal comes before any work."""
    t0 = time.perf_counter()
    try:
        code, _, err = run_cli(["plan", *argv], capsys)
    except Reached:
        return True, 0, ""
    assert time.perf_counter() - t0 < 30
    return False, code, err


def _workload(tmp_path: Path, **values: int) -> str:
    text = (PRESET_DIR / "workloads" / "32k-in-8k-out.toml").read_text()
    for key, value in values.items():
        text = re.sub(rf"(?m)^{key} = .*$", f"{key} = {value}", text)
    path = tmp_path / "w.toml"
    path.write_text(text)
    return str(path)


def test_a_million_clients_is_refused_up_front(capsys, no_simulation):
    """It passed the budget (~5 million steps) and simulated for hours: 4 million requests."""
    reached, code, err = _plan(["--concurrency", "1000000", "--no-search"], capsys)
    assert not reached
    assert_clean_error(code, err, "HISPARSE_MAX_SIM_STEPS", "requests_per_client 4", "1 load point")


def test_the_estimate_grows_with_the_requests_not_one_wave():
    """10,000 clients take ~20x the time of 500 (measured: a request costs the same at any load)."""
    kw = dict(ranks=8, instances=1, rate=0.0, requests_per_client=4, input_tokens=32768, output_tokens=8192,
              length_jitter=0.0, prefill_chunk_tokens=8192)
    small, large = limits.plan_steps(concurrency=500, **kw), limits.plan_steps(concurrency=10_000, **kw)
    assert large > 10 * small
    # the simulated instance's clients: 2 instances of a TP8 deployment halve them
    assert limits.plan_steps(concurrency=10_000, **kw | {"instances": 2, "ranks": 1}) < \
        limits.plan_steps(concurrency=10_000, **kw | {"ranks": 1})


def test_tiny_requests_many_per_client_are_refused(tmp_path, capsys, no_simulation):
    """1 in / 2 out, 30,000 requests per client: 15 million requests, ~0.7 million steps before."""
    w = _workload(tmp_path, input_tokens=1, output_tokens=2, requests_per_client=30000)
    reached, code, err = _plan(["--workload", w, "--no-search"], capsys)
    assert not reached
    assert_clean_error(code, err, w, "requests_per_client 30000", "HISPARSE_MAX_SIM_STEPS")


def test_many_swept_buffers_count_their_trace_replays(tmp_path, capsys, no_simulation):
    """2,000 buffers over a 20-million-access trace at one cheap point: every replay ran (~4 minutes)
    before the first point, the progress bar at 0."""
    w = _workload(tmp_path, input_tokens=1, output_tokens=2)
    buffers = ",".join(str(4096 + 16 * i) for i in range(2000))
    reached, code, err = _plan(["--workload", w, "--trace", TRACE, "--concurrency", "1", "--no-search",
                                "--sweep-buffer", buffers], capsys)
    assert not reached
    assert_clean_error(code, err, "2000 trace replays", "HISPARSE_MAX_SIM_STEPS")
    reached, _, err = _plan(["--workload", w, "--trace", TRACE, "--concurrency", "1", "--no-search",
                             "--sweep-buffer", buffers.split(",", 20)[0]], capsys)  # one buffer: runs
    assert reached, err


def test_the_search_points_count_unless_no_search(capsys, no_simulation):
    """The bisection adds up to 4 points a system below the top swept load (no progress shown for
    them): counted, and --no-search, named in the error, takes them out."""
    reached, code, err = _plan(["--concurrency", "1,6000"], capsys)
    assert not reached
    assert_clean_error(code, err, "--no-search", "HISPARSE_MAX_SIM_STEPS")
    reached, _, err = _plan(["--concurrency", "1,6000", "--no-search"], capsys)
    assert reached, err


def test_the_default_plan_and_a_raised_budget_still_run(capsys, no_simulation, monkeypatch):
    assert _plan([], capsys)[0]
    monkeypatch.setenv("HISPARSE_MAX_SIM_STEPS", str(10**10))
    assert _plan(["--concurrency", "1000000", "--no-search"], capsys)[0]


def test_a_huge_search_is_refused_up_front(capsys, monkeypatch):
    """200 buffers x 50 ratios x every policy: no budget, hours of replays and ladders."""
    import simulator.serving.search as search

    def replayed(*a, **k):
        raise Reached

    monkeypatch.setattr(search, "_parallel", replayed)
    monkeypatch.setattr(search, "miss_profiles", replayed)
    buffers = ",".join(str(2048 + 64 * i) for i in range(200))
    ratios = ",".join(str(1 + i) for i in range(50))
    reached, code, err = _plan(["--search", "--search-buffer", buffers, "--search-host-ratio", ratios,
                                "--search-policy", "all"], capsys)
    assert not reached
    assert_clean_error(code, err, "--search-buffer (200)", "--search-host-ratio (50)", "HISPARSE_MAX_POINTS")
    assert _plan(["--search"], capsys)[0]  # the default search reaches its replays


def _steps_of(argv: list[str], capsys, monkeypatch) -> int:
    """The plan's own work estimate, read from its refusal under a budget of 1."""
    monkeypatch.setenv("HISPARSE_MAX_SIM_STEPS", "1")
    code, _, err = run_cli(["plan", *argv], capsys)
    assert code == 2, err
    return int(re.search(r"about ([\d,]+) scheduler steps", err).group(1).replace(",", ""))


@pytest.mark.parametrize("whatif", ["--compare-speculative", "--compare-prefetch"])
def test_a_plan_and_its_whatif_share_one_budget(whatif, capsys, monkeypatch, no_simulation):
    """Each of the two plans a what-if runs was checked alone, so together they could run up to twice the
    budget; the sum is now checked before either runs."""
    common = ["--concurrency", "1,4", "--no-search", "--quiet"]
    if whatif == "--compare-speculative":
        main = [*common, "--deployment", "8xh200-tp8", "--speculative", "eagle:1-1-2", "--accept-len", "2"]
        other = [*common, "--deployment", "8xh200-tp8"]
    else:
        main = [*common, "--model", "glm-5.2-fp8"]
        other = [*main, "--set", "hisparse.prefetch=false"]
    both = _steps_of(main, capsys, monkeypatch) + _steps_of(other, capsys, monkeypatch)
    monkeypatch.setenv("HISPARSE_MAX_SIM_STEPS", str(both - 1))  # each alone fits, together they do not
    code, _, err = run_cli(["plan", *main, whatif], capsys)
    assert_clean_error(code, err, whatif, "HISPARSE_MAX_SIM_STEPS")
    monkeypatch.setenv("HISPARSE_MAX_SIM_STEPS", str(both))
    with pytest.raises(Reached):
        run_cli(["plan", *main, whatif], capsys)


def test_open_arrival_without_a_rate_says_rate_needs_no_open_arrival(capsys):
    """--rate with --set workload.arrival=open: the file has no rate_per_s, so the workload is refused;
    the message used to say "(or give --rate)" although --rate was given."""
    code, _, err = run_cli(["plan", "--rate", "0.5,2", "--set", "workload.arrival=open", "--quiet"], capsys)
    assert code == 2 and "needs rate_per_s > 0" in err and "or give --rate" not in err
    assert "--rate needs no arrival" in err
