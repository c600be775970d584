"""PD-disaggregated decode: the preset pairs its own HiSparse config, and TTFT / TPOT are
bench_serving's (TTFT from the request's send to the first token the client sees, which a PD decode
server streams when it admits the request; TPOT = (latency - TTFT) / (output_len - 1)), checked on a
case computed by hand from the cost model's step times."""

from __future__ import annotations

import dataclasses

import pytest

from simulator.costmodel import Pass, RankWork
from simulator.serving.model import InstanceSim, prefill_seconds_per_token
from simulator.serving.scenario import load_scenario
from simulator.serving.specs import Attention
from simulator.serving.state import System


def test_pd_preset_pairs_its_own_hisparse_config():
    sc = load_scenario(deployment="2xh20-pd-decode")
    hs = sc.hisparse
    assert (hs.top_k, hs.device_buffer_size, hs.host_to_device_ratio) == (2048, 6144, 10)
    assert "blog-h20-pd" in hs.where
    # a config given on the command line still wins, and colocated presets keep the 8xH200 one
    assert load_scenario(deployment="2xh20-pd-decode", hisparse="blog-8xh200").hisparse.device_buffer_size == 4096
    assert load_scenario().hisparse.host_to_device_ratio == 8


def _tiny_pd(prefill_tok_s: float, n_in: int, n_out: int):
    """One scheduler (TP attention), one running request at most, fixed lengths, a given prefill rate."""
    sc = load_scenario(deployment="2xh20-pd-decode")
    d = dataclasses.replace(sc.deployment, dp=1, attention=Attention.TP, max_running_requests=1,
                            prefill_tok_s=prefill_tok_s)
    w = dataclasses.replace(sc.workload, input_tokens=n_in, output_tokens=n_out, requests_per_client=1,
                            length_jitter=0.0)
    return sc.replace(deployment=d, workload=w)


def test_admission_wait_is_ttft_not_decode_time():
    n_in, n_out, rate = 1000, 21, 10_000.0
    sc = _tiny_pd(rate, n_in, n_out)
    sim = InstanceSim(sc, System.BASELINE, concurrency=2)
    res = sim.run()
    # by hand: one prefill server at 10,000 tokens/s: A's prompt is done at 0.1 s, B's at 0.2 s.
    # A is admitted at once (its first token reaches the client at 0.1 s) and decodes n_out - 1 steps
    # of batch 1 at contexts n_in + 1 .. n_in + n_out - 1; B waits (max_running_requests 1) until A
    # finishes, is admitted then, and decodes the same steps.
    cost = sc.cost_model()
    steps = [float(cost.pass_time(Pass((RankWork(1, float(n_in + g)),))).total_s[0]) for g in range(1, n_out)]
    s = sum(steps)
    a_first = n_in / rate
    a_finish = a_first + s
    assert a_finish > 2 * n_in / rate  # B has been waiting for a running slot
    b_first = a_finish
    b_finish = b_first + s
    a, b = sorted(sim.finished, key=lambda r: r.rid)
    assert a.first_token == pytest.approx(a_first, rel=1e-9)
    assert b.first_token == pytest.approx(b_first, rel=1e-9)
    assert b.finish == pytest.approx(b_finish, rel=1e-9)
    tpot = s / (n_out - 1)  # both requests: (latency - ttft) / (output_len - 1)
    assert res.tpot_p50_ms == pytest.approx(tpot * 1e3, rel=1e-9)
    assert res.tpot_p99_ms == pytest.approx(tpot * 1e3, rel=1e-9)
    assert res.ttft_mean_s == pytest.approx((a_first + b_first) / 2, rel=1e-9)
    # TPOT stays within the per-gap ITL range: no admission wait inside it
    assert res.tpot_p99_ms <= res.itl_p99_ms * (1 + 1e-9)


def test_one_prompt_alone_prefills_faster_than_a_full_prefill_instance():
    """A derived prefill side: a prompt alone on a DP-attention prefill instance is priced with the
    other ranks idle, so concurrency 1 is not charged a full instance's per-rank share."""
    sc = load_scenario(deployment="2xh20-pd-decode")
    per = prefill_seconds_per_token(sc)
    assert len(per) == sc.deployment.ranks_per_instance
    assert all(x < y for x, y in zip(per, per[1:], strict=False))
    res = InstanceSim(sc, System.BASELINE, concurrency=1).run()
    assert res.ttft_p50_s == pytest.approx(per[0] * sc.workload.input_tokens, rel=1e-6)
    assert res.ttft_p50_s < per[-1] * sc.workload.input_tokens / 2
