"""DeepGEMM's published FP8 GEMM rates at prefill shapes (``published_kernels.DEEPGEMM_PREFILL``) bound the
fitted FP8 GEMM terms on Hopper: the README row nearest in (N, K), scaled by the GPU's dense FP8 rate; decode
shapes and Blackwell GPUs keep the fitted terms."""

from __future__ import annotations

import pytest

from simulator.costmodel import CostModel, Pass, RankWork
from simulator.costmodel.ops import gemm
from simulator.costmodel.passes import DEEPGEMM_KINDS
from simulator.costmodel.published_kernels import DEEPGEMM_PREFILL, H800_DENSE_FP8_FLOPS
from simulator.serving.scenario import load_scenario

pytestmark = pytest.mark.usefixtures("private_cache")


def _cost(deployment: str, model: str = "glm-5.2-fp8", gpu: str | None = None) -> CostModel:
    sc = load_scenario(model=model, deployment=deployment, **({"gpu": gpu} if gpu else {}))
    return sc.cost_model()


@pytest.mark.parametrize("n, k, grouped, want", [
    (16384, 2048, False, 1212e12),  # GLM q_b -> DeepSeek-V3's q_b row (24576 x 1536)
    (2624, 6144, False, 1127e12),  # fused q_a + kv_a -> 2112 x 7168
    (6144, 16384, False, 1520e12),  # o_proj -> 7168 x 16384
    (4096, 6144, False, 1410e12),  # shared expert gate_up -> 4096 x 7168
    (6144, 2048, False, 1168e12),  # shared expert down -> 7168 x 2048
    (4096, 6144, True, 1346e12),  # routed gate_up, contiguous layout
    (6144, 2048, True, 1214e12),  # routed down, contiguous layout
])
def test_the_nearest_published_row_by_hand(n, k, grouped, want):
    assert DEEPGEMM_PREFILL.rate(n, k, grouped=grouped, fp8_flops=H800_DENSE_FP8_FLOPS) == pytest.approx(want)
    # another GPU: scaled by its dense FP8 rate over the H800's 1,979 TFLOP/s
    assert DEEPGEMM_PREFILL.rate(n, k, grouped=grouped, fp8_flops=H800_DENSE_FP8_FLOPS / 2) == pytest.approx(want / 2)


def test_the_published_rate_bounds_a_prefill_gemm_on_the_h200():
    c = _cost("8xh200-dp8-ep8-glm52-balanced")
    assert c.deepgemm_fp8 and c._fp8_peak == pytest.approx(2 * 989.5e12, rel=0.01)
    q_b = gemm("q_b_proj", 4096, 2048, 16384, "fp8")
    fitted = c.t.op_time(q_b)
    launch = c.t.rates[("gemm", "fp8")].launch_s
    by_hand = launch + q_b.flops / (1212e12 * c._fp8_peak / H800_DENSE_FP8_FLOPS)
    assert by_hand > fitted  # the fit (1,536 TFLOP/s at decode shapes) is faster than DeepGEMM publishes
    assert c.op_time(q_b) == pytest.approx(by_hand)
    # at a decode shape the fitted (memory-bound) term stands
    small = gemm("q_b_proj", 16, 2048, 16384, "fp8")
    assert c.op_time(small) == pytest.approx(c.t.op_time(small))
    # BF16 GEMMs (cuBLAS) and the TP fused-MoE slices (SGLang's Triton kernel, measured) are not DeepGEMM's
    assert "gemm" in DEEPGEMM_KINDS and "grouped_gemm" in DEEPGEMM_KINDS
    head = gemm("lm_head", 4096, 6144, 19360, "bf16")
    assert c.op_time(head) == pytest.approx(c.t.op_time(head))


def test_the_routed_experts_of_a_deepep_extend_pass_take_the_contiguous_figure():
    c = _cost("8xh200-dp8-ep8-glm52-balanced")
    ops = {o.name: (n, o) for n, o in c.mlp_side_ops(8 * 4096.0, aligned=True)}
    n, up = ops["routed_gate_up"]
    launch = c.t.rates[("gemm", "fp8")].launch_s
    scale = c._fp8_peak / H800_DENSE_FP8_FLOPS
    assert c.op_time(up) == pytest.approx(max(c.t.op_time(up), launch + up.flops / (1346e12 * scale)))
    assert c.op_time(up) > c.t.op_time(up)
    _, down = ops["routed_down"]
    assert c.op_time(down) == pytest.approx(launch + down.flops / (1214e12 * scale))


def test_the_bound_lengthens_extend_passes_not_decode_passes(monkeypatch):
    c = _cost("8xh200-dp8-ep8-glm52-balanced")
    extend = Pass((RankWork(chunks=((4096, 0),)),) * 8)
    decode = Pass.uniform(12, 8700.0, 8)
    with_bound = float(c.pass_time(extend).total_s[0]), float(c.pass_time(decode).total_s[0])
    monkeypatch.setattr(CostModel, "deepgemm_fp8", property(lambda self: False))
    off = _cost("8xh200-dp8-ep8-glm52-balanced")
    without = float(off.pass_time(extend).total_s[0]), float(off.pass_time(decode).total_s[0])
    assert with_bound[0] > without[0] * 1.03  # GLM-5.2's 4,096-token chunks on eight ranks: +5%
    assert with_bound[1] == pytest.approx(without[1])


def test_blackwell_keeps_the_fitted_terms():
    c = _cost("8xb200-tp8-dsv4-pro-low-latency", model="deepseek-v4-pro")
    assert not c.deepgemm_fp8
    q_b = gemm("q_b_proj", 4096, 2048, 16384, "fp8")
    assert c.op_time(q_b) == pytest.approx(c.t.op_time(q_b))
