"""The layer's work from its shapes: parameter counts and FLOPs match the models' published
configs (derivations in the docstrings), and the parallel layout cuts them as SGLang's DP
attention + expert parallel layout does."""

from __future__ import annotations

import pytest

from simulator.calibration.model_shapes import Shapes
from simulator.costmodel.ops import (
    Layout,
    attention_ops,
    dense_mlp_ops,
    layer_ops,
    moe_ops,
    routed_rows,
    step_ops,
    weight_params,
)

# zai-org/GLM-5.1 config.json (num_hidden_layers, first_k_dense_replace, hidden_size, q_lora_rank,
# kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim, intermediate_size,
# moe_intermediate_size, n_shared_experts, vocab_size, num_attention_heads, index_n_heads,
# index_head_dim, index_topk, n_routed_experts, num_experts_per_tok)
GLM = Shapes("glm-5.1", 78, 3, 6144, 2048, 512, 192, 64, 256, 12288, 2048, 1, 154880, 64, 32, 128, 2048, 256, 8)
# deepseek-ai/DeepSeek-V3.2-Exp inference/config_671B_v3.2.json (same fields, its names)
DSV32 = Shapes("deepseek-v3.2", 61, 3, 7168, 1536, 512, 128, 64, 128, 18432, 2048, 1, 129280, 128, 64, 128, 2048, 256, 8)
ONE_GPU = Layout(attention_tp=1, attention_dp=1, mlp_tp=1, expert_parallel=1)

# parameters per layer, from the configs (q_a + q_b + kv_a + kv_b + o_proj; wq_b + wk +
# weights_proj; 3 d inter; 8 + 1 experts of 3 d moe_inter + the router gate E d)
COUNTS = {GLM: dict(attention=165_019_648, indexer=9_371_648, dense=226_492_416, moe_active=341_311_488),
          DSV32: dict(attention=187_105_280, indexer=13_959_168, dense=396_361_728, moe_active=398_196_736)}


def _names(ops, *names):
    return [o for o in ops if o.name in names]


@pytest.mark.parametrize("m", [GLM, DSV32], ids=["glm-5.1", "deepseek-v3.2"])
def test_weight_counts_match_the_configs(m):
    want = COUNTS[m]
    att = attention_ops(m, 1, 4096.0, ONE_GPU, 1152)
    idx = _names(att, "indexer_wq_b", "indexer_wk", "indexer_weights_proj")
    assert weight_params(idx) == want["indexer"]
    assert weight_params(att) - weight_params(idx) == want["attention"]
    assert weight_params(dense_mlp_ops(m, 1, ONE_GPU)) == want["dense"]
    # one token touches exactly 8 routed experts
    assert weight_params(moe_ops(m, 1, ONE_GPU)) == pytest.approx(want["moe_active"])


@pytest.mark.parametrize("m", [GLM, DSV32], ids=["glm-5.1", "deepseek-v3.2"])
def test_gemm_flops_are_twice_the_active_params_per_token(m):
    want = COUNTS[m]
    ops = layer_ops(m, 1, 4096.0, ONE_GPU)
    gemm = [o for o in ops if o.kind in ("gemm", "batched_gemm", "grouped_gemm")]
    active = want["attention"] + want["indexer"] + want["moe_active"]
    assert sum(o.flops for o in gemm) == pytest.approx(2 * active)


def test_indexer_and_attention_work():
    ops = attention_ops(GLM, 4, 4 * 50_000.0, Layout(), 656)
    (idx,) = _names(ops, "indexer_score_topk")
    assert idx.tokens == 200_000 and idx.m == 4
    assert idx.bytes == pytest.approx(200_000 * (132 + 8))  # key rows + the scores written and read
    assert idx.flops == 2 * 200_000 * 32 * 128
    (att,) = _names(ops, "sparse_attention")
    assert att.dtype == "fp8" and att.bytes == 4 * 2048 * 656
    assert att.flops == 2 * 4 * 64 * 2048 * (576 + 512)
    short = _names(attention_ops(GLM, 2, 2 * 1000.0, Layout(), 1152), "sparse_attention")[0]
    assert short.bytes == 2 * 1000 * 1152  # fewer than top_k tokens: all of them


def test_dp_attention_and_expert_parallel_layout():
    lay = Layout()  # DP 8 attention, MLP TP 8, EP 8
    att = attention_ops(GLM, 16, 16 * 8192.0, lay, 1152)
    assert _names(att, "o_proj")[0].m == 16 and _names(att, "o_proj")[0].k == 64 * 256  # whole heads per rank
    moe = moe_ops(GLM, 16, lay)
    rows, touched = routed_rows(16, GLM, lay)
    assert rows == 16 * 8 * 8 / 8  # every rank's tokens, 1/8 of the experts
    assert 0 < touched <= 32 and touched == pytest.approx(32 * (1 - (1 - 8 / 256) ** 128))
    (up,) = _names(moe, "routed_gate_up")
    assert up.kind == "grouped_gemm" and up.groups == 32 and up.weight_groups == touched
    assert up.flops == pytest.approx(2 * rows * 6144 * 4096)
    (shared,) = _names(moe, "shared_gate_up")
    assert shared.m == 128 and shared.n == 2 * 2048 // 8
    dense = dense_mlp_ops(GLM, 16, lay)
    assert dense[0].n == 2 * 12288 // 8 and dense[0].m == 128
    # more tokens touch more experts, never more than this GPU's
    assert routed_rows(64, GLM, lay)[1] > touched and routed_rows(4096, GLM, lay)[1] == pytest.approx(32)


def test_step_counts_layers_and_the_head():
    parts = step_ops(GLM, 8, 8 * 30_000.0)
    assert [n for n, _ in parts] == [3, 75, 1]
    head = parts[-1][1]
    assert _names(head, "lm_head")[0].n == 154880 // 8
    assert layer_ops(GLM, 0, 0.0) == []


def test_layout_rejects_bad_values():
    with pytest.raises(ValueError, match="expert_parallel"):
        Layout(expert_parallel=0)
    with pytest.raises(ValueError, match="weight_dtype"):
        Layout(weight_dtype="int4")


def test_moe_tensor_parallel_layout_reads_the_same_expert_bytes():
    ep, tp = Layout(expert_parallel=8, moe_tp=1), Layout(expert_parallel=1, moe_tp=8)
    for batch in (1, 16, 128):
        a, b = moe_ops(GLM, batch, ep), moe_ops(GLM, batch, tp)
        routed = ("routed_gate_up", "routed_down")
        # 1/8 of the experts whole, or 1/8 of every expert: the same weights per GPU on average
        assert weight_params(_names(b, *routed)) == pytest.approx(weight_params(_names(a, *routed)))
        assert sum(o.flops for o in _names(b, *routed)) == pytest.approx(sum(o.flops for o in _names(a, *routed)))
        (up,) = _names(b, "routed_gate_up")
        assert up.groups == 256 and up.n == 2 * 2048 // 8
        # each slice its own measured kind; the EP layout keeps the whole-expert one
        assert [o.kind for o in _names(b, *routed)] == ["grouped_gemm_tp_up", "grouped_gemm_tp_down"]
        assert {o.kind for o in _names(a, *routed)} == {"grouped_gemm"}
        assert sum(o.weight_bytes for o in _names(b, *routed)) == pytest.approx(weight_params(_names(b, *routed)))


def test_layout_of_sglang_flags():
    assert Layout.of(8, 8, "ep") == Layout()
    lay = Layout.of(8, 8, "tp")
    assert (lay.expert_parallel, lay.moe_tp, lay.attention_tp) == (1, 8, 1)
    assert Layout.of(8, 1).attention_tp == 8
    with pytest.raises(ValueError, match="multiple"):
        Layout.of(8, 3)


def test_calibration_shapes_are_the_model_presets_and_the_configs():
    """The calibration reads its shapes from the model presets (one table); both equal the configs."""
    from simulator.calibration.model_shapes import DEEPSEEK_V3_2, GLM_5_1

    for config, shapes in ((GLM, GLM_5_1), (DSV32, DEEPSEEK_V3_2)):
        assert shapes == config  # every field, the name keying the CSV rows included


def test_shared_expert_split_over_the_mlp_gpus_or_whole_under_deepep():
    """The shared expert (one, moe_intermediate 2048): split over the MLP's 8 GPUs on all 8 ranks'
    tokens under either MoE layout (it is not a routed expert: the TP-MoE layout's moe_tp does not cut
    it again), or under DeepEP whole on every GPU on the rank's own tokens (SGLang DeepseekV2MoE builds
    it with tp_size=1 when the a2a backend is DeepEP)."""
    def shared(layout, batch=4):
        up, down = _names(moe_ops(GLM, batch, layout), "shared_gate_up", "shared_down")
        return (up.m, up.k, up.n), (down.m, down.k, down.n), up.weight_bytes + down.weight_bytes

    full = 3 * 6144 * 2048  # FP8 bytes of the whole shared expert
    for lay in (Layout(), Layout.of(8, 8, "tp")):
        assert shared(lay) == ((32, 6144, 512), (32, 256, 6144), full / 8)
    assert shared(Layout(shared_replicated=True)) == ((4, 6144, 4096), (4, 2048, 6144), full)
