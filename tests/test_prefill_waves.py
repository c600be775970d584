"""How a run's prompt chunks fall across DP ranks (RunResult.extend_pass_share, extending_ranks_mean).

Under DP attention a pass in which any rank runs a prompt chunk is an extend pass for every rank.
With identical requests dispatched round robin, fixed lengths and token-id prompts (reaching the ranks
at once, no tokenizer in front: tests/test_frontend.py has the text case) the simulated ranks stay in
lockstep, so every rank refills in the same passes (prefill in waves: all dp ranks extending); with
lengths that differ, completions spread and refills happen one or two ranks at a time, each stalling
the others' decode for a whole pass."""

from __future__ import annotations

import dataclasses

import pytest

from simulator.serving.model import simulate
from simulator.serving.scenario import load_scenario

pytestmark = pytest.mark.usefixtures("private_cache")


def _run(jitter: float, deployment: str = "8xh200-colocated-dp8"):
    sc = load_scenario(model="glm-5.1-fp8", deployment=deployment)
    w = dataclasses.replace(sc.workload, input_tokens=4096, output_tokens=64, requests_per_client=3,
                            length_jitter=jitter, tokenize_prompt=True)
    return sc, simulate(sc.replace(workload=w), "baseline", concurrency=32, seed=0)


def test_fixed_lengths_refill_in_waves_jittered_ones_spread_out():
    sc, waves = _run(0.0)
    _, spread = _run(0.2)
    assert sc.deployment.dp == 8
    assert waves.extending_ranks_mean == pytest.approx(8.0)  # every extend pass: all 8 ranks at once
    assert 1.0 <= spread.extending_ranks_mean < 4.0
    assert 0.0 < waves.extend_pass_share < spread.extend_pass_share <= 1.0
    # spread-out refills stall every rank once per chunk: longer TPOT, fewer tokens per second
    assert spread.tpot_p50_ms > 1.5 * waves.tpot_p50_ms
    assert spread.makespan_tok_s_deployment < waves.makespan_tok_s_deployment


def test_tp_attention_has_one_scheduler():
    sc, r = _run(0.0, deployment="8xh200-tp8")
    assert sc.deployment.dp == 1
    assert r.extending_ranks_mean == pytest.approx(1.0)
    assert 0.0 < r.extend_pass_share < 1.0
