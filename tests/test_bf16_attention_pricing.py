"""The absorbed ``w_kc`` / ``w_vc`` projections run as a cuBLAS BF16 ``torch.bmm`` for every MLA
checkpoint (BF16 attention as in NVIDIA's NVFP4 GLM checkpoints, and block-FP8 ``kv_b_proj``, which
SGLang's ``post_load_weights`` dequantises to BF16 on CUDA; ``bmm_fp8`` only for an FP8 ``w_kc``),
priced by the measured cuBLAS BF16 GEMM term; and the GLM-5.1 NVFP4 preset's weights."""

from __future__ import annotations

import dataclasses
import math

import pytest

from simulator.costmodel import CostModel
from simulator.costmodel.ops import Op
from simulator.costmodel.pricing import terms_for
from simulator.costmodel.terms import BF16_TWINS, Rate, StepTerms
from simulator.serving import presets as P
from simulator.serving.memory import weights_per_gpu
from simulator.serving.scenario import load_scenario


def _terms(rates):
    return StepTerms(rates, {}, 1e-6, {}, {})


def test_the_bf16_batched_gemm_takes_the_cublas_bf16_gemm_term():
    gemm = Rate(8e-6, 4e12, 700e12)
    bmm8 = Rate(20e-6, 8e12)
    t = _terms({("gemm", "bf16"): gemm, ("batched_gemm", "fp8"): bmm8}).with_bf16()
    assert BF16_TWINS == {"batched_gemm": "gemm"}
    assert t.rates[("batched_gemm", "bf16")] == gemm and t.rates[("batched_gemm", "fp8")] == bmm8
    # by hand: 8 heads x (192 x 512) bf16 weights at batch 1: launch + weight bytes / 4 TB/s
    op = Op("w_kc_absorbed", "batched_gemm", "bf16", 2.0 * 8 * 192 * 512, 8 * 192 * 512 * 2.0 + 8 * (192 + 512) * 2.0,
            m=1, k=192, n=512)
    assert t.op_time(op) == pytest.approx(8e-6 + op.bytes / 4e12)


def test_a_measured_bf16_term_is_kept_and_no_gemm_term_means_no_twin():
    own = Rate(5e-6, 3e12)
    t = _terms({("gemm", "bf16"): Rate(8e-6, 4e12), ("batched_gemm", "bf16"): own}).with_bf16()
    assert t.rates[("batched_gemm", "bf16")] == own
    bare = _terms({("batched_gemm", "fp8"): Rate(20e-6, 8e12)})
    assert bare.with_bf16() is bare


def test_the_nvfp4_preset_prices_its_absorbed_bmm_through_cublas_and_says_so():
    sc = load_scenario(model="glm-5.1-nvfp4", deployment="8xh200-tp8", calibration="h200")
    assert sc.model.bytes_per_param("attention") == 2.0 and sc.model.bytes_per_param("routed_expert") == 0.5625
    gt = terms_for(sc.gpu) if sc.terms is None else sc.terms
    assert "cuBLAS BF16 GEMM" in gt.bf16
    c = sc.cost_model()
    ops = {o.name: (n, o) for n, o in c.fixed_ops(1, 32768.0)}
    n, op = ops["w_kc_absorbed"]
    assert op.dtype == "bf16"
    gemm = c.terms.terms.rates[("gemm", "bf16")]
    assert c.op_time(op) == pytest.approx(gemm.launch_s + max(op.bytes / gemm.bw, op.flops / gemm.flops_rate))
    # the block-FP8 checkpoint's bmm is the same BF16 torch.bmm (its kv_b_proj dequantised at load), not bmm_fp8
    fp8 = load_scenario(model="glm-5.1-fp8", deployment="8xh200-tp8", calibration="h200")
    c8 = fp8.cost_model()
    op8 = {o.name: o for _, o in c8.fixed_ops(1, 32768.0)}["w_kc_absorbed"]
    assert op8.dtype == "bf16" and c8.op_time(op8) == pytest.approx(gemm.time(op8.bytes, op8.flops))


def test_the_nvfp4_preset_weighs_what_the_checkpoints_do():
    m = P.load("models", "glm-5.1-nvfp4")
    # CortexLM's GLM-5.1 NVFP4 (ModelOpt, routed experts NVFP4): "~441 GB" on disk; InferenceX PR #2335:
    # nvidia/GLM-5.2-NVFP4 433 GB, 56 GB per GPU under TP8 (GLM-5.2 has fewer indexer weights)
    assert m.weight_bytes / 1e9 == pytest.approx(441, rel=0.03)
    d = P.load("deployments", "8xrtx-pro-6000-tp8-pd-decode")
    assert weights_per_gpu(m, d) / 1e9 == pytest.approx(56, rel=0.05)
    assert not math.isclose(m.weight_bytes, P.load("models", "glm-5.1-fp8-kvfp8").weight_bytes)


def test_the_twin_reaches_the_pass_time_the_plan_prices():
    import dataclasses

    from tests.helpers import decode_pass

    sc = load_scenario(model="glm-5.1-nvfp4", deployment="8xh200-tp8", calibration="h200")
    c = sc.cost_model()
    st = c.terms.terms
    slower = dataclasses.replace(st, rates={**st.rates, ("batched_gemm", "bf16"): st.rates[("batched_gemm", "fp8")]})
    c2 = CostModel(sc.model, sc.gpu, sc.deployment, sc.params, dataclasses.replace(c.terms, terms=slower))
    a, b = (float(decode_pass(x, 4, 4 * 34816.0).parts["absorbed bmm"][0]) for x in (c, c2))
    per = sc.model.layers * 2  # w_kc and w_vc per layer
    gemm, bmm8 = st.rates[("gemm", "bf16")], st.rates[("batched_gemm", "fp8")]
    assert b - a == pytest.approx(per * (bmm8.launch_s - gemm.launch_s), rel=0.05)  # launch-bound at batch 4
    ta, tb = (float(decode_pass(x, 4, 4 * 34816.0).total_s[0]) for x in (c, c2))
    assert tb - ta == pytest.approx(b - a, rel=1e-6)


def test_the_fp8_checkpoint_absorbed_bmm_by_hand_and_without_fp8_quantisation():
    """GLM-5.2-FP8 at TP8 (8 heads per GPU), a verify pass of 1 request x 6 positions: each layer's w_kc is
    [8 heads, 6, 192] x [192, 512] and w_vc [8, 6, 512] x [512, 256] in BF16, priced as the cuBLAS BF16
    GEMM term over their bytes; the per-tensor FP8 quantisations that feed bmm_fp8 are gone."""
    from tests.helpers import decode_pass

    sc = load_scenario(model="glm-5.2-fp8", deployment="8xh200-tp8-glm52-low-latency", calibration="h200")
    c = sc.cost_model()
    names = {o.name for _, o in c.attention_side_ops(6)}
    assert "quant_q_nope" not in names and "quant_attn_out" not in names
    gemm = c.terms.terms.rates[("gemm", "bf16")]
    h, rows = 64 // 8, 6
    kc = 192 * 512 * 2.0 * h + 2.0 * rows * (192 + 512) * h
    vc = 512 * 256 * 2.0 * h + 2.0 * rows * (512 + 256) * h
    by_hand = 78 * (gemm.time(kc, 2.0 * rows * 192 * 512 * h) + gemm.time(vc, 2.0 * rows * 512 * 256 * h))
    assert c.attention_fixed(6)["absorbed bmm"] == pytest.approx(by_hand, rel=1e-9)
    # the pass the plan prices moves by exactly the bmm's change when the twin's price changes
    st = c.terms.terms
    dear = dataclasses.replace(st, rates={**st.rates, ("batched_gemm", "bf16"): Rate(gemm.launch_s + 10e-6, gemm.bw,
                                                                                      gemm.flops_rate)})
    c2 = CostModel(sc.model, sc.gpu, sc.deployment, sc.params, dataclasses.replace(c.terms, terms=dear))
    a, b = (float(decode_pass(x, 1, 8704.0).total_s[0]) for x in (c, c2))
    assert b - a == pytest.approx(78 * 2 * 10e-6, rel=1e-6)
