"""Per-kernel floors off the H200 (#25 item 3): the H200's fitted intercepts scaled by the SM boost clock
ratio, H200 / target, where both clocks are vendor figures (``GpuSpec.sm_boost_mhz``), kept where not."""

from __future__ import annotations

import dataclasses

import pytest

from simulator.costmodel import Pass
from simulator.costmodel.pricing import floor_ratio, reference_terms, scaled_terms
from simulator.serving import presets as P
from simulator.serving.scenario import load_scenario


def test_scaled_multiplies_every_floor_and_nothing_else():
    ref = reference_terms().terms
    s = ref.scaled(1.0, 1.0, floor=0.5)
    assert s.graph_launch_s == pytest.approx(0.5 * ref.graph_launch_s)
    for key, r in ref.rates.items():
        assert s.rates[key].launch_s == pytest.approx(0.5 * r.launch_s)
        assert (s.rates[key].bw, s.rates[key].flops_rate) == (r.bw, r.flops_rate)
    for key, t in ref.indexer.items():
        assert s.indexer[key].launch_s == pytest.approx(0.5 * t.launch_s)
        assert (s.indexer[key].bw, s.indexer[key].select_s_per_token) == (t.bw, t.select_s_per_token)
    for key, (launch, eff) in ref.attention.items():
        assert s.attention[key] == pytest.approx((0.5 * launch, eff))
    assert s.swap_in == ref.swap_in  # HiSparse's swap-in is priced from its own published/fitted params


def test_the_clock_ratio_comes_from_the_presets():
    h200 = P.load("gpus", "h200")
    rtx, b200, h20 = (P.load("gpus", n) for n in ("rtx-pro-6000", "b200", "h20"))
    assert h200.sm_boost_mhz == 1980.0  # 66.9 TFLOP/s FP32 / (2 x 16,896)
    r, why = floor_ratio(h200, rtx)
    assert r == pytest.approx(1980.0 / 2597.0) and "SM boost clock ratio" in why
    assert floor_ratio(h200, b200)[0] == 1.0  # Blackwell B200 boosts to the same 1,980 MHz
    r, why = floor_ratio(h200, h20)
    assert r == 1.0 and "INFERRED" in why  # no vendor clock for the H20: kept, and said so
    t = scaled_terms(reference_terms(), h200, rtx)
    ref = reference_terms().terms
    assert t.floor_ratio == pytest.approx(1980.0 / 2597.0) and t.scaled
    assert t.terms.rates[("gemm", "fp8")].launch_s == pytest.approx(ref.rates[("gemm", "fp8")].launch_s * 1980 / 2597)
    assert "kernel floors x 0.762" in t.source


def _step(sc, batch: int = 1, ctx: float = 34000.0) -> float:
    c = sc.cost_model()
    return float(c.pass_time(Pass.uniform(batch, ctx, sc.deployment.ranks_per_instance)).total_s[0])


def test_a_faster_clock_shortens_the_latency_bound_step_by_its_floors():
    """The held-out SM120 deployment at one request: the step with the derived floors lies between the
    step with the H200's floors and the step with none, at the clock ratio's place (the floors enter every
    kernel term as a sum; the step's other parts do not move)."""
    base = load_scenario(model="glm-5.1-nvfp4", deployment="8xrtx-pro-6000-tp8-pd-decode", calibration="none")
    at = {}
    for mhz in (2597.0, 1980.0, 1e12):  # the datasheet clock; the H200's (floors kept); ~infinite (floors ~0)
        gpu = dataclasses.replace(base.gpu, sm_boost_mhz=mhz)
        sc = dataclasses.replace(base, gpu=gpu, terms=None)
        at[mhz] = _step(sc)
    kept, none, derived = at[1980.0], at[1e12], at[2597.0]
    assert none < derived < kept
    r = 1980.0 / 2597.0
    assert derived == pytest.approx(none + r * (kept - none), rel=1e-3)
    assert (kept - none) / kept > 0.4  # the floors are most of a one-request step here (docs/validation.md)


def test_set_gpu_clock_reaches_the_plan_terms():
    sc = load_scenario(model="glm-5.1-nvfp4", deployment="8xrtx-pro-6000-tp8-pd-decode",
                       overrides=["gpu.sm_boost_mhz=1980"])
    assert sc.gpu.sm_boost_mhz == 1980.0
    assert sc.terms.floor_ratio == 1.0
    default = load_scenario(model="glm-5.1-nvfp4", deployment="8xrtx-pro-6000-tp8-pd-decode")
    assert default.terms.floor_ratio == pytest.approx(1980.0 / 2597.0)
    assert _step(default) < _step(sc)
