"""The held-out SM120 set (sgl-project/sglang PR #33075): its deployment reproduces the pool the
sources log (238,720 slots, 54 running), by hand, and the model runs its points."""

from __future__ import annotations

import pytest

from simulator.serving import presets as P
from simulator.serving.memory import plan_memory
from simulator.serving.published import load_published, summary, validate

pytestmark = pytest.mark.usefixtures("private_cache")


def _plans():
    m, g = P.load("models", "glm-5.1-nvfp4"), P.load("gpus", "rtx-pro-6000")
    d, h = P.load("deployments", "8xrtx-pro-6000-tp8-pd-decode"), P.load("hisparse", "pr33075-sm120")
    return plan_memory(m, g, d, None), plan_memory(m, g, d, h), m


def test_the_deployment_holds_the_logged_pool_for_both_systems():
    base, hs, m = _plans()
    assert base.pool_tokens == hs.pool_tokens == 238720  # PR #36331's max_total_num_tokens
    # by hand: PR #33075's baseline "saturates its KV pool at only running-req = 6 (~87% GPU-token usage)"
    per_request = 32768 + 2048
    assert base.pool_tokens // per_request == 6 and 6 * per_request / base.pool_tokens == pytest.approx(0.875, abs=0.001)
    # HiSparse: a hot buffer is device_buffer_size + one page; 54 of them fit (57), the running cap is 54
    assert hs.pool_tokens // (4096 + 64) == 57 and hs.max_running == base.max_running == 54
    # the x10 logical pool's indexer keys come out of the slack (pre-#31992 profile), host pool 10 x
    assert hs.cell_bytes == m.layers * (656 + 10 * 132) and hs.host_tokens == 10 * 238720


def test_the_set_is_sourced_and_held_out():
    ps = load_published("pr33075-rtx-pro-6000")
    assert "PR #33075" in ps.source and "ASSUMED" in ps.uncertainty
    assert {p.system.value for p in ps.points} == {"baseline", "hisparse"}
    measured = {(p.system.value, p.concurrency[0], p.metric.value): p.measured for p in ps.points}
    assert measured[("hisparse", 54, "steady_tok_s")] == 643.6 and measured[("baseline", 54, "running")] == 6


def test_the_model_runs_the_running_points(tmp_path):
    ps = load_published("pr33075-rtx-pro-6000")
    import dataclasses

    few = dataclasses.replace(ps, points=tuple(p for p in ps.points if p.metric.value == "running"))
    rows = validate(few)
    got = {r["system"]: r["predicted"] for r in rows}
    assert got["hisparse"] == pytest.approx(54, abs=0.5)  # the hot buffers and cap hold all 54 clients
    assert 6 <= got["baseline"] < 7  # the pool holds 6 requests of 34,816 tokens (a 7th joins as one ends)
    assert summary(rows)["points"] == 2
