"""DeepEP normal dispatch's host wait (``costmodel/host_sync.py``): one measured GPU idle gap per MoE
layer in every extend pass under ``--moe-a2a-backend deepep``; none in decode passes (low-latency
kernels in a CUDA graph) and none without DeepEP."""

from __future__ import annotations

import pytest

from simulator.costmodel import CostModel, Pass, RankWork
from simulator.costmodel.host_sync import (
    DEEPEP_NORMAL_HOST_WAIT_FLOOR_S,
    DEEPEP_NORMAL_HOST_WAIT_S,
    deepep_host_wait_s,
)
from simulator.serving.scenario import load_scenario

pytestmark = pytest.mark.usefixtures("private_cache")


def _cost(deployment: str, model: str) -> CostModel:
    sc = load_scenario(model=model, deployment=deployment)
    return sc.cost_model()


def test_the_wait_is_one_measured_gap_per_moe_layer():
    assert deepep_host_wait_s(75) == pytest.approx(75 * 26.4e-6)
    assert deepep_host_wait_s(0) == 0.0
    assert DEEPEP_NORMAL_HOST_WAIT_FLOOR_S < DEEPEP_NORMAL_HOST_WAIT_S  # the allocations' share is the larger
    with pytest.raises(ValueError, match="moe_layers"):
        deepep_host_wait_s(-1)


def test_an_extend_pass_under_deepep_adds_the_wait_and_a_decode_pass_does_not():
    c = _cost("8xh200-dp8-ep8-glm52-high-throughput", "glm-5.2-fp8")
    extend = c.pass_time(Pass((RankWork(chunks=((1024, 0),)),) + (RankWork(),) * 7))
    parts = {k: float(v[0]) for k, v in extend.parts.items()}
    assert parts["DeepEP host wait"] == pytest.approx(c.m.moe_layers * DEEPEP_NORMAL_HOST_WAIT_S)
    decode = c.pass_time(Pass((RankWork(12, 12 * 9000.0),) * 8))
    assert "DeepEP host wait" not in decode.parts


def test_without_deepep_no_wait():
    c = _cost("8xh200-colocated-dp8-sglang-2026-04", "glm-5.1-fp8")  # fused MoE, TP-sharded
    extend = c.pass_time(Pass((RankWork(chunks=((8192, 0),)),) * 8))
    assert "DeepEP host wait" not in extend.parts


def test_the_plan_says_how_the_wait_is_priced():
    c = _cost("8xh200-dp8-ep8-glm52-high-throughput", "glm-5.2-fp8")
    from simulator.costmodel.pass_terms import PASS_TERMS, Provenance

    term = next(t for t in PASS_TERMS if t.name == "DeepEP host wait")
    kind, how = term.how(c)
    assert kind == Provenance.MEASURED and "moe_recv_counter" in how and "26.4 us" in how
