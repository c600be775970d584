"""What the plan's `max run` column is (an admission estimate, not a hard cap), and the planner
reference's tie band read from the one constant the tool prints."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from simulator.cli import main
from simulator.serving.admission import ceil_page
from simulator.serving.misses import scenario_profiles
from simulator.serving.model import InstanceSim, System
from simulator.serving.planner import PlanInputs


def test_max_run_is_the_admission_estimate_and_the_peak_stays_within_the_pools():
    """--concurrency 512 showed peak_running_deployment 128 against max_running_deployment 112. Not a model bug:
    112 is 8 x the PrefillAdder's steady state at evenly staggered outputs (14 per scheduler); the closed loop's
    finishes bunch, so SGLang's look-ahead admits 16 per scheduler, which the pools hold (no retraction), and
    never more than they hold."""
    sc = PlanInputs().scenario()
    sc = sc.replace(workload=dataclasses.replace(sc.workload, requests_per_client=2))
    sim = InstanceSim(sc, System.HISPARSE, concurrency=128, profiles=scenario_profiles(sc, sc.hisparse, "prefix"))
    r = sim.run()
    p, d, w = sim.plan, sc.deployment, sc.workload
    assert r.max_running_deployment == sim.adder.running_limit() * d.ranks  # the estimate, per scheduler x ranks
    hard = min(p.max_running, p.host_tokens // ceil_page(w.input_tokens + w.output_tokens, d.page_size),
               p.pool_tokens // p.buffer_slots) * d.ranks
    assert r.max_running_deployment < r.peak_running_deployment <= hard
    assert r.retractions == 0


def test_the_legend_says_max_run_is_an_estimate(capsys):
    assert main(["plan", "--concurrency", "1", "--no-search", "--quiet"]) == 0
    legend = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("columns:"))
    assert "max run = the admission's steady-state estimate" in legend and "not a hard cap" in legend
    assert "running and max run" not in legend


def test_the_reference_states_the_tie_band_the_tool_prints(capsys):
    """docs/planner-reference.md said 8% while the tool printed 7%: the doc quotes MODEL_ERROR_BAND as printed."""
    from simulator.serving.slo import _TIE_POINTS, MODEL_ERROR_BAND

    doc = (Path(__file__).resolve().parents[1] / "docs" / "planner-reference.md").read_text()
    m = re.search(r"validation\.md\), (\d+)% over its (\d+) measured points", doc)
    assert m, "the tie band sentence moved"
    assert (f"{m[1]}%", int(m[2])) == (f"{MODEL_ERROR_BAND:.0%}", _TIE_POINTS)
    assert "MODEL_ERROR_BAND" in doc and "bands.json" in doc


def test_the_search_help_says_the_ranking_rule(capsys):
    from tests.fuzzing import run_cli

    code, out, _ = run_cli(["plan", "--help"], capsys)
    text = " ".join(out.split())
    assert code == 0
    assert "highest tok/s/GPU at a load meeting the targets" in text and "at the highest load meeting" not in text
