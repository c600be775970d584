"""The serving cost model prices a decode step with the measured step terms: op by op from the
calibration JSON, under layer_work's per-GPU shapes for the deployment's layout, and other GPUs
scale the H200's terms by datasheet ratios."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from simulator.calibration.model_shapes import DEEPSEEK_V3_2, GLM_5_1
from simulator.costmodel.ops import Layout, attention_ops, moe_ops, step_ops
from simulator.costmodel.passes import CostModel, cuda_graph_batch
from simulator.costmodel.pricing import layout_for, measured_terms, terms_for
from simulator.costmodel.terms import StepTerms
from simulator.errors import HisparseError
from simulator.serving import presets as P
from simulator.serving.scenario import load_scenario
from tests.helpers import decode_pass, prefill_pass

H200_JSON = P.PRESET_DIR / "calibration" / "h200.json"


def _cost(**kw) -> CostModel:
    sc = load_scenario(**kw)
    return sc.cost_model()


def _shape_rows(ops):
    return [(o.name, o.kind, o.dtype, o.m, o.k, o.n, o.groups) for o in ops]


def test_blog_layout_is_layer_works_default_and_gives_the_calibrated_shapes():
    """tp 8, dp 8, DP attention: attention on one GPU with all heads, the MLP side over 8 ranks'
    tokens, dense/shared/lm_head over 8 GPUs, each routed expert split over 8 (SGLang's fused MoE
    without EP flags); with EP, 32 whole experts per GPU, the layout the step terms were timed at.
    The serving model's GLM-5.1 preset gives the same per-GPU GEMM shapes as the calibration's
    config values."""
    sc = load_scenario(calibration="none")
    lay = layout_for(sc.deployment, sc.model)
    assert lay == Layout.of(8, 8, "tp")
    assert (lay.attention_tp, lay.attention_dp, lay.mlp_tp, lay.expert_parallel, lay.moe_tp) == (1, 8, 8, 1, 8)
    ep = load_scenario(deployment="8xh200-colocated-dp8-ep8", calibration="none")
    # expert_parallel 8: the timed layout; under DeepEP the shared expert whole on every GPU (DeepseekV2MoE tp_size=1)
    assert layout_for(ep.deployment, ep.model) == Layout(shared_replicated=True)
    up = next(o for o in moe_ops(sc.model, 8, lay) if o.name == "routed_gate_up")
    assert (up.k, up.n, up.groups) == (6144, 2 * 2048 // 8, 256)  # model_shapes 3b: rows x 6144 x 512
    up_ep = next(o for o in moe_ops(ep.model, 8, Layout()) if o.name == "routed_gate_up")
    assert up.bytes == pytest.approx(up_ep.bytes, rel=0.01)  # the same weight bytes per GPU either way
    for batch in (1, 8, 60):
        ours = [(n, _shape_rows(ops)) for n, ops in step_ops(sc.model, batch, batch * 40000.0, lay)]
        calib = [(n, _shape_rows(ops)) for n, ops in step_ops(GLM_5_1, batch, batch * 40000.0, Layout.of(8, 8, "tp"))]
        assert ours == calib
    q_b = next(o for o in attention_ops(sc.model, 4, 0.0, lay, 1152) if o.name == "q_b_proj")
    assert (q_b.m, q_b.k, q_b.n) == (4, 2048, 64 * 256)  # every head on the one GPU (model_shapes 3b)
    ds = load_scenario(model="deepseek-v3.2-fp8", calibration="none").model
    assert _shape_rows(moe_ops(ds, 8, lay)) == _shape_rows(moe_ops(DEEPSEEK_V3_2, 8, Layout.of(8, 8, "tp")))


def test_tp_attention_layout_splits_heads_and_has_one_scheduler():
    sc = load_scenario(deployment="8xh200-tp8", calibration="none")
    lay = layout_for(sc.deployment, sc.model)
    assert (lay.attention_tp, lay.attention_dp, lay.mlp_tp, lay.moe_tp) == (8, 1, 8, 8)
    q_b = next(o for o in attention_ops(sc.model, 16, 0.0, lay, 1152) if o.name == "q_b_proj")
    assert q_b.n == 64 // 8 * 256
    # the MLP side sees the one scheduler's tokens, not 8 ranks' (layer_work multiplies by attention_dp)
    gate = next(o for o in moe_ops(sc.model, 16, lay) if o.name == "router_gate")
    assert gate.m == 16


def test_one_op_priced_by_hand_from_the_json():
    """The fused q_a/kv_a projection at 8 requests: launch + max(bytes / bandwidth, FLOPs / rate)
    with the FP8 GEMM term read straight from h200.json; the cost model uses exactly that."""
    cal = json.loads(H200_JSON.read_text())
    fit = cal["step_terms"]["rates"]["gemm"]["fp8"]
    c = _cost()
    op = next(o for o in attention_ops(c.m, 8, 0.0, c.layout, c.m.kv_row_bytes) if o.name == "qkv_a_proj")
    weight = 6144 * (2048 + 512 + 64)  # fp8: one byte per weight
    act = 2 * 8 * (6144 + 2048 + 512 + 64)  # bf16 in and out
    by_hand = fit["launch_us"] * 1e-6 + max((weight + act) / (fit["gbps"] * 1e9), 2 * 8 * weight / (fit["tflops"] * 1e12))
    assert c.op_time(op) == pytest.approx(by_hand, rel=1e-12)
    # the indexer: its own measured term (32 heads for GLM), every context token's key read once
    idx = cal["step_terms"]["indexer"]["fp8_h32"]
    ctx = 8 * 40000.0
    want = idx["launch_us"] * 1e-6 + ctx * 132 / (idx["gbps"] * 1e9) + idx["select_ns_per_token"] * 1e-9 * ctx / 8
    assert float(c.indexer(ctx, 8)) == pytest.approx(want, rel=1e-12)
    # sparse attention: the fitted launch + roofline / efficiency for bf16 rows
    att = cal["fit"]["attention"]["bf16"]
    roof = max(8 * 2048 * 1152 / 4.266e12, 2 * 8 * 64 * 2048 * (512 + 64 + 512) / 7.69e14)
    assert c.attention(8, ctx) == pytest.approx(att["attention_launch_us"] * 1e-6 + roof / att["attention_efficiency"])


def test_decode_step_is_the_sum_of_its_ops_plus_comm():
    c = _cost()
    batch, ctx = 7, 7 * 36000.0
    padded = cuda_graph_batch(batch)
    assert padded == 8
    ops = c.fixed_ops(padded, 8 * batch)
    by_ops = sum(n * c.op_time(o) for n, o in ops) + c.m.layers * (float(c.indexer(ctx, batch)) + c.decode_attention(batch, ctx))
    step = decode_pass(c, batch, ctx)
    assert float(step.compute_s[0]) == pytest.approx(by_ops)
    comm = c.m.layers * c.comm_layer(batch, 8 * batch, padded)
    assert float(step.comm_s[0]) == pytest.approx(comm) and comm > 0
    assert float(step.total_s[0]) == pytest.approx(by_ops + comm)
    assert float(step.swap_s[0]) == float(step.backup_s[0]) == 0.0  # the baseline: no host tier
    # every op kind of a layer is there (the indexer and attention priced apart)
    kinds = {o.kind for _, o in ops}
    assert kinds == {"gemm", "batched_gemm", "grouped_gemm_tp_up", "grouped_gemm_tp_down", "elementwise"}  # TP MoE
    names = {o.name for _, o in ops}
    assert {"routed_gate_up", "routed_down", "shared_gate_up", "dense_gate_up", "lm_head", "sampler"} <= names


def test_step_grows_with_batch_and_context_and_routed_experts_follow_real_tokens():
    c = _cost()
    steps = [float(decode_pass(c, b, b * 40000.0).total_s[0]) for b in (1, 2, 8, 32)]
    assert steps == sorted(steps) and len(set(steps)) == 4
    short, long = (float(decode_pass(c, 4, 4 * n).total_s[0]) for n in (8000.0, 160000.0))
    assert long > short  # the indexer scans every context token
    # one request on one rank of eight: the MoE sees one real token, not eight padded ones
    one = {o.name: o for _, o in c.fixed_ops(1, 1.0)}
    assert one["routed_gate_up"].weight_groups == pytest.approx(256 * (1 - (1 - 8 / 256) ** 1))


def test_other_gpus_scale_the_h200_terms_by_datasheet_ratios():
    h200 = P.load("gpus", "h200")
    ref = terms_for(h200)
    assert not ref.scaled  # the H200 against its own datasheet
    h100 = terms_for(P.load("gpus", "h100"))
    hr, fr = 3.35e12 / 4.8e12, 9.89e14 / 9.89e14  # datasheets: H100 SXM, H200 SXM (dense BF16 the same)
    assert h100.hbm_ratio == pytest.approx(hr) and h100.flops_ratio == pytest.approx(fr)
    g, g0 = h100.terms.rates[("gemm", "fp8")], ref.terms.rates[("gemm", "fp8")]
    assert g.bw == pytest.approx(g0.bw * hr) and g.flops_rate == pytest.approx(g0.flops_rate * fr)
    assert g.launch_s == g0.launch_s
    assert h100.terms.indexer["fp8_h32"].bw == pytest.approx(ref.terms.indexer["fp8_h32"].bw * hr)
    assert h100.hbm_bw == pytest.approx(ref.hbm_bw * hr)
    assert "scaled to h100" in h100.source and "x 0.698" in h100.source
    # a slower GPU takes longer for the same step
    sc = load_scenario(gpu="h100", calibration="none")
    slow = sc.cost_model()
    assert float(decode_pass(slow, 8, 8 * 4e4).compute_s[0]) > float(decode_pass(_cost(), 8, 8 * 4e4).compute_s[0])


def test_a_calibration_with_step_terms_prices_its_own_gpu(tmp_path):
    cal = json.loads(H200_JSON.read_text())
    cal["step_terms"]["rates"]["fused_moe_tp_down"]["fp8"]["gbps"] /= 2  # the blog's TP fused MoE
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(cal))
    sc = load_scenario(calibration=str(path))
    assert sc.terms.source.startswith("measured on this GPU") and str(path) in sc.terms.source
    mine = sc.cost_model()
    base = _cost()
    op = next(o for _, o in base.fixed_ops(8, 64) if o.name == "routed_down")
    assert mine.op_time(op) > base.op_time(op)


def test_no_unsourced_or_removed_terms_remain():
    params = P.load("calibration", "uncalibrated")
    assert params.unsourced == ()
    names = {f.name for f in dataclasses.fields(params)}
    for gone in ("per_layer_overhead_us", "hbm_efficiency", "matmul_efficiency", "prefill_efficiency"):
        assert gone not in names
    text = (P.PRESET_DIR / "calibration" / "uncalibrated.toml").read_text()
    assert "per_layer_overhead" not in text


def test_prefill_chunk_is_compute_bound_and_quadratic_in_the_indexer():
    c = _cost()
    first, later = prefill_pass(c, 8192, 0), prefill_pass(c, 8192, 65536)
    assert later > first > 0
    # twice the tokens: close to twice the time (compute-bound), far more than one decode step
    double = prefill_pass(c, 16384, 0)
    assert 1.6 < double / first < 2.4
    assert first > 10 * float(decode_pass(c, 8, 8 * 4e4).total_s[0])
    assert math.isfinite(first) and np.isfinite(prefill_pass(c, 1, 0, hisparse=True))


def test_step_report_groups_add_up_to_the_step():
    c = _cost()
    rep = c.step_report(8, 36864.0)
    step = decode_pass(c, 8, 8 * 36864.0)
    assert rep["total"] == pytest.approx(float(step.total_s[0]) * 1e3)
    assert sum(v for k, v in rep.items() if k != "total") == pytest.approx(rep["total"])
    assert rep["collectives"] == pytest.approx(float(step.comm_s[0]) * 1e3)
    assert max((v, k) for k, v in rep.items() if k != "total")[1] == "routed experts"


def test_tp_moe_routed_experts_use_their_own_measured_term_and_ep_keeps_its_own():
    """The blog's TP fused MoE prices its slices with the Triton fused-MoE terms (fused_moe_tp_*,
    the kernel SGLang runs), from weight bytes; tp_moe_kernel 'torch_scaled_grouped_mm' selects the
    older grouped_gemm_tp_* terms; a calibration without the chosen kernel's term falls back along
    fused -> scaled_grouped_mm -> whole experts; the EP deployment keeps the grouped_gemm term."""
    cal = json.loads(H200_JSON.read_text())
    tp_cost = _cost()
    ops = {o.name: o for _, o in tp_cost.fixed_ops(8, 64)}
    down, up = ops["routed_down"], ops["routed_gate_up"]

    def by_hand(kind, op):
        r = cal["step_terms"]["rates"][kind]["fp8"]
        t = r["launch_us"] * 1e-6 + op.k * op.n * op.weight_groups / (r["gbps"] * 1e9)
        return max(t, r["launch_us"] * 1e-6 + op.flops / (r["tflops"] * 1e12)) if r.get("tflops") else t

    assert down.kind == "grouped_gemm_tp_down" and up.kind == "grouped_gemm_tp_up"
    assert tp_cost.t.tp_moe_kernel == "triton_fused_moe"
    assert tp_cost.op_time(down) == pytest.approx(by_hand("fused_moe_tp_down", down))
    assert tp_cost.op_time(up) == pytest.approx(by_hand("fused_moe_tp_up", up))
    old = dataclasses.replace(tp_cost.t, tp_moe_kernel="torch_scaled_grouped_mm")
    assert old.op_time(down) == pytest.approx(by_hand("grouped_gemm_tp_down", down))
    # measured: the Triton kernel streams the K-sliced down weights far faster than _scaled_grouped_mm
    assert old.op_time(down) > 2 * tp_cost.op_time(down)
    with pytest.raises(ValueError, match="tp_moe_kernel"):
        dataclasses.replace(tp_cost.t, tp_moe_kernel="cutlass")
    ep = load_scenario(deployment="8xh200-colocated-dp8-ep8")
    ep_cost = ep.cost_model()
    ep_down = next(o for _, o in ep_cost.fixed_ops(8, 64) if o.name == "routed_down")
    g = cal["step_terms"]["rates"]["grouped_gemm"]["fp8"]
    assert ep_down.kind == "grouped_gemm"
    assert ep_cost.op_time(ep_down) == pytest.approx(g["launch_us"] * 1e-6 + ep_down.bytes / (g["gbps"] * 1e9))
    for kind in ("fused_moe_tp_up", "fused_moe_tp_down"):
        del cal["step_terms"]["rates"][kind]
    no_fused = StepTerms.from_calibration(cal)
    assert no_fused.op_time(down) == pytest.approx(by_hand("grouped_gemm_tp_down", down))
    for kind in ("grouped_gemm_tp_up", "grouped_gemm_tp_down"):
        del cal["step_terms"]["rates"][kind]
    neither = StepTerms.from_calibration(cal)
    assert neither.op_time(down) == pytest.approx(g["launch_us"] * 1e-6 + down.bytes / (g["gbps"] * 1e9))
    cal["step_terms"]["tp_moe_kernel"] = "cutlass"
    with pytest.raises(HisparseError, match="tp_moe_kernel"):
        measured_terms(cal, "mine.json")


def test_flashmla_sparse_prefill_pads_the_heads_of_attention_tp():
    """SGLang's nsa_backend._forward_flashmla_sparse pads q to a multiple of 64 heads on Hopper (128 on
    Blackwell): GLM's 64 heads over TP8 are 8 per GPU, computed as 64, so a prompt's sparse attention
    costs 8x its real FLOPs; under DP attention (64 heads per rank) nothing is padded."""
    from simulator.costmodel.prompt_chunk import FLASHMLA_SPARSE_PREFILL as F

    tp = load_scenario(model="glm-5.2-fp8", deployment="8xh200-tp8-glm52-low-latency")
    c = tp.cost_model()
    assert [c.flashmla_heads(h) for h in (8, 16, 64, 65, 128)] == [64, 64, 64, 128, 128]
    m = tp.model
    want = m.layers * F.time(c.g, 8192, 12288, 64)  # 64 padded heads, not 8: the measured 64-head kernel
    assert c.prefill_attention(8192, 4096) == pytest.approx(want)
    assert F.time(c.g, 8192, 12288, 8) == F.time(c.g, 8192, 12288, 64) < F.time(c.g, 8192, 12288, 65)
    dp = load_scenario(model="glm-5.2-fp8", deployment="8xh200-dp8-ep8-glm52-balanced")
    cd = dp.cost_model()
    assert cd.prefill_attention(8192, 4096) == pytest.approx(want)  # 64 real heads on one GPU: the same
    b200 = load_scenario(model="deepseek-v4-pro", deployment="8xb200-tp8-dsv4-pro-low-latency")
    cb = b200.cost_model()
    assert cb.flashmla_heads(128 // 8) == 128  # Blackwell: 16 heads padded to 128


def test_flashmla_sparse_prefill_runs_every_top_k_slot():
    """SGLang calls FlashMLA's sparse prefill without topk_length (dsa_backend._forward_flashmla_sparse), so
    the kernel loops over topk / 64 blocks for every query, the -1 slots of early positions included: a
    first chunk past the dense threshold costs top-k rows per query, not its mean position's. A chunk
    ending at most 2,048 tokens runs dense MHA (set_dsa_prefill_impl) unless HiSparse is on."""
    from simulator.costmodel.passes import DENSE_PREFILL_MAX_KV_LEN, sparse_prefill_runs_dense
    from simulator.costmodel.prompt_chunk import FLASHMLA_SPARSE_PREFILL as F

    sc = load_scenario(model="deepseek-v3.2-fp8-kvfp8", deployment="8xh200-dp8-ep8-dsv32-pr30514")
    c, m = sc.cost_model(), sc.model
    assert DENSE_PREFILL_MAX_KV_LEN == 2048
    # every slot of the top-k: the measured kernel's full time, whatever the positions (was 3,500 x 1,750 rows)
    assert c.prefill_attention(3500, 0) == pytest.approx(m.layers * F.time(c.g, 3500, 3500, 128))
    assert c.prefill_attention(4096, 28672) == pytest.approx(m.layers * 4017.1e-6)  # the measured 128-head point
    assert sparse_prefill_runs_dense(2048, False) and not sparse_prefill_runs_dense(2049, False)
    assert not sparse_prefill_runs_dense(1024, True)
    full = m.layers * F.time(c.g, 1024, 1024, 128)
    assert c.prefill_attention(1024, 0) == pytest.approx(full * 512 / 2048)  # dense: the mean position's rows
    assert c.prefill_attention(1024, 0, hisparse=True) == pytest.approx(full)
