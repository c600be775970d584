"""SGLang's TokenizerManager in the serving model (simulator/serving/frontend.py): text prompts are
tokenized one at a time, so a burst reaches the DP ranks at the tokenizer's pace; token-id prompts
(bench_serving --tokenize-prompt) reach them at once, the model's behaviour before the term."""

from __future__ import annotations

import dataclasses

import pytest

from simulator.serving import frontend
from simulator.serving import model as serving_model
from simulator.serving.model import InstanceSim, simulate
from simulator.serving.scenario import load_scenario

pytestmark = pytest.mark.usefixtures("private_cache")


def test_tokenize_seconds_follows_the_measured_points():
    for n, s in zip(frontend.MEASURED_TOKENS, frontend.MEASURED_S, strict=True):
        assert frontend.tokenize_seconds(n) == pytest.approx(s)
    assert frontend.tokenize_seconds(0) == 0.0
    grid = [frontend.tokenize_seconds(n) for n in range(0, 70000, 997)]
    assert all(b > a for a, b in zip(grid[:-1], grid[1:], strict=True))  # longer prompts take longer
    last = frontend.MEASURED_TOKENS[-1]
    assert frontend.tokenize_seconds(2 * last) == pytest.approx(2 * frontend.MEASURED_S[-1])
    with pytest.raises(ValueError, match="tokens"):
        frontend.tokenize_seconds(-1)


def _burst(tokenize_prompt: bool) -> InstanceSim:
    """Eight clients, one 4,096-token prompt each, on the 8-rank DP-attention instance."""
    sc = load_scenario(model="glm-5.1-fp8", deployment="8xh200-colocated-dp8")
    w = dataclasses.replace(sc.workload, input_tokens=4096, output_tokens=16, requests_per_client=1,
                            length_jitter=0.0, tokenize_prompt=tokenize_prompt)
    sim = InstanceSim(sc.replace(workload=w), "baseline", concurrency=8, seed=0)
    sim.run()
    return sim


def test_a_text_burst_reaches_the_ranks_one_tokenized_prompt_at_a_time():
    text, ids = _burst(False), _burst(True)
    # the eighth prompt reaches its rank after all eight were tokenized, one after another
    assert text.last_arrival == pytest.approx(8 * frontend.tokenize_seconds(4096))
    assert ids.last_arrival == 0.0
    # token ids: the eight ranks prefill in one pass; text: DP0 prefills alone while the others'
    # prompts are still being tokenized, and they prefill in the next pass (SGLang PR #23588)
    assert (ids.extend_passes, ids.extending_ranks) == (1, 8)
    assert (text.extend_passes, text.extending_ranks) == (2, 8)
    firsts = sorted(r.first_token for r in text.finished)
    assert firsts[0] < firsts[1] == firsts[-1]


def test_zero_pace_is_the_token_id_run(monkeypatch):
    sc = load_scenario(model="glm-5.1-fp8", deployment="8xh200-colocated-dp8")
    w = dataclasses.replace(sc.workload, input_tokens=4096, output_tokens=64, requests_per_client=3)
    ids = simulate(sc.replace(workload=dataclasses.replace(w, tokenize_prompt=True)), "baseline", concurrency=32)
    monkeypatch.setattr(serving_model, "tokenize_seconds", lambda tokens: 0.0)
    zero = simulate(sc.replace(workload=w), "baseline", concurrency=32)
    assert zero == ids
    monkeypatch.undo()
    paced = simulate(sc.replace(workload=w), "baseline", concurrency=32)
    assert paced.extending_ranks_mean < ids.extending_ranks_mean == pytest.approx(8.0)


def test_pd_decode_has_no_tokenizer_in_front():
    sc = load_scenario(model="glm-5.1-fp8", deployment="2xh20-pd-decode")
    sim = InstanceSim(sc, "baseline", concurrency=4, seed=0)
    assert sim.tokenizer is None


def test_arrivals_behind_a_waiting_request_leave_the_decode_block_running(monkeypatch):
    """Paced arrivals into deep queues do not cut decode blocks; cutting them anyway gives the same run.
    The high-throughput cookbook layout at 192 clients, two prompts each: the second wave's prompts
    reach queues that wait on KV room (radix cache on: new_token_ratio admission) while the ranks
    decode (8 such arrivals here)."""
    sc = load_scenario(model="glm-5.2-fp8", deployment="8xh200-dp8-ep8-glm52-high-throughput")
    w = dataclasses.replace(sc.workload, input_tokens=8192, output_tokens=1024, requests_per_client=2,
                            length_jitter=0.0)
    scw = sc.replace(workload=w)
    skipped = simulate(scw, "baseline", concurrency=192)
    monkeypatch.setattr(InstanceSim, "_arrival_wakes", lambda self, rank: True)
    every = simulate(scw, "baseline", concurrency=192)
    for f in dataclasses.fields(skipped):
        a, b = getattr(skipped, f.name), getattr(every, f.name)
        assert a == (pytest.approx(b, rel=1e-9) if isinstance(a, float) else b), f.name
