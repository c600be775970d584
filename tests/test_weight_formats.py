"""Weight formats per tensor class: an NVFP4 checkpoint's routed experts are read at their own
size by the memory model and by every decode step, and multiplied at the GPU's FP4 rate where it
has one."""

from __future__ import annotations

import dataclasses

import pytest

from simulator.costmodel import CostModel
from simulator.costmodel.ops import dtype_of
from simulator.costmodel.pricing import layout_for
from simulator.errors import HisparseError
from simulator.serving import presets as P
from simulator.serving.memory import plan_memory, weights_per_gpu
from simulator.serving.scenario import load_scenario
from tests.helpers import decode_pass

NVFP4 = 0.5 + 1 / 16  # e2m1 values + one FP8 scale per 16


def _nvfp4(model):
    return dataclasses.replace(model, routed_expert_bytes_per_param=NVFP4)


def test_formats_follow_bytes_per_param():
    assert [dtype_of(b) for b in (0.53125, NVFP4, 1.000244, 2.0)] == ["fp4", "fp4", "fp8", "bf16"]
    m = P.load("models", "glm-5.1-fp8")
    assert m.bytes_per_param("routed_expert") == m.weight_bytes_per_param  # 0: the checkpoint's default
    assert sum(m.class_params().values()) + m.moe_layers * m.router_params == m.total_params


def test_nvfp4_experts_shrink_the_weights_by_their_bytes():
    sc = load_scenario(calibration="uncalibrated")
    m, d = sc.model, sc.deployment
    fp4 = _nvfp4(m)
    routed = m.moe_layers * m.experts * m.expert_params
    assert m.weight_bytes - fp4.weight_bytes == pytest.approx(routed * (m.weight_bytes_per_param - NVFP4))
    assert weights_per_gpu(m, d) - weights_per_gpu(fp4, d) == pytest.approx(
        routed * (m.weight_bytes_per_param - NVFP4) / d.tp)


def test_every_decode_step_reads_the_experts_at_their_size():
    sc = load_scenario(calibration="uncalibrated")
    fp8 = sc.cost_model()
    fp4 = CostModel(_nvfp4(sc.model), sc.gpu, sc.deployment, sc.params, sc.terms)
    assert fp4.layout.routed_dtype == "fp4" and fp4.layout.routed_bytes == NVFP4
    ops8 = {o.name: o for _, o in fp8.fixed_ops(8, 64.0)}
    ops4 = {o.name: o for _, o in fp4.fixed_ops(8, 64.0)}
    for name in ("routed_gate_up", "routed_down"):
        assert ops4[name].dtype == "fp4"
        assert ops4[name].weight_bytes == pytest.approx(ops8[name].weight_bytes * NVFP4)
    assert ops4["shared_gate_up"].dtype == "fp8"  # only the routed experts change format
    s8, s4 = (float(decode_pass(c, 8, 8 * 40000.0).parts["routed experts"][0]) for c in (fp8, fp4))
    assert s4 < s8  # the bandwidth-bound experts read fewer bytes


def test_fp4_is_priced_at_the_gpus_fp4_rate_where_it_has_one():
    b200 = load_scenario(gpu="b200", calibration="none")
    h200 = load_scenario(calibration="uncalibrated")
    assert b200.gpu.fp4_flops == 9.0e15 and h200.gpu.fp4_flops == 0.0
    for sc, ratio in ((b200, 9.0e15 / b200.gpu.fp8_flops), (h200, 1.0)):
        t = sc.terms.terms
        for (kind, dt), r in t.rates.items():
            if dt == "fp8" and (kind, "fp4") in t.rates:
                assert t.rates[(kind, "fp4")].flops_rate == pytest.approx(r.flops_rate * ratio)
                assert t.rates[(kind, "fp4")].bw == r.bw and t.rates[(kind, "fp4")].launch_s == r.launch_s
        assert "FP4" in sc.terms.fp4


def test_a_dense_class_in_another_format_is_refused_with_the_file():
    sc = load_scenario(calibration="uncalibrated")
    odd = dataclasses.replace(sc.model, dense_bytes_per_param=2.0)
    with pytest.raises(HisparseError, match=r"glm-5.1-fp8.toml: dense_bytes_per_param 2.0 is another format"):
        layout_for(sc.deployment, odd)


def test_an_nvfp4_model_moves_the_plan():
    """The smaller experts reach the simulation: more KV room per GPU and a shorter step."""
    from simulator.serving.model import System, simulate

    sc = load_scenario(calibration="uncalibrated")
    sc = sc.replace(workload=dataclasses.replace(sc.workload, output_tokens=64, requests_per_client=1))
    fp8 = simulate(sc, System.BASELINE, concurrency=8)
    fp4 = simulate(sc.replace(model=_nvfp4(sc.model)), System.BASELINE, concurrency=8)
    assert fp4.itl_p50_ms < fp8.itl_p50_ms
    pools = [plan_memory(m, sc.gpu, sc.deployment, None).pool_tokens for m in (sc.model, _nvfp4(sc.model))]
    assert pools[1] > pools[0]
