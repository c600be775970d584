"""The kernels SGLang runs around DeepGEMM's contiguous GEMMs in a DeepEP extend pass (the rank's FP8
quantisation before the normal dispatch, ``ep_scatter``, the separate quantisation after ``silu_and_mul``) and
the q concatenation before every FlashMLA call, priced by hand from their bytes."""

from __future__ import annotations

import pytest

from simulator.costmodel import CostModel, Pass, RankWork
from simulator.costmodel.ops import (
    DEEPEP_NORMAL_EXPERT_ALIGNMENT,
    aligned_rows_per_expert,
    attention_ops,
    deepep_contiguous_ops,
    deepep_dispatch_quant,
)
from simulator.serving.scenario import load_scenario

pytestmark = pytest.mark.usefixtures("private_cache")


def _cost(deployment: str = "8xh200-dp8-ep8-glm52-high-throughput", model: str = "glm-5.2-fp8") -> CostModel:
    sc = load_scenario(model=model, deployment=deployment)
    return sc.cost_model()


def test_the_contiguous_path_kernels_by_hand():
    c = _cost()
    m, lay = c.m, c.layout
    ops = {o.name: o for o in deepep_contiguous_ops(m, 1024, lay)}
    assert set(ops) == {"ep_scatter", "routed_act_quant"}
    # eight ranks of 1,024 tokens, top-8 of 256 experts over 8 GPUs: 8,192 real rows per GPU, FP8 in and out
    assert ops["ep_scatter"].bytes == pytest.approx(8192 * 6144 * 2)
    aligned = 32 * aligned_rows_per_expert(8192, 8 / 256, DEEPEP_NORMAL_EXPERT_ALIGNMENT)
    assert aligned > 8192 * 1.2  # 256 rows per expert on average, padded to 128-row blocks
    # bf16 read (2 B) and FP8 written (1 B) per value of the aligned rows' 2,048-wide activation
    assert ops["routed_act_quant"].bytes == pytest.approx(aligned * 2048 * 3)
    assert deepep_dispatch_quant(m, 1024).bytes == pytest.approx(1024 * 6144 * 3)


def test_only_deepep_extend_passes_run_them():
    c = _cost()
    extend = Pass((RankWork(chunks=((1024, 0),)),) * 8)
    names = {o.name for _, o in c.mlp_side_ops(8192.0, aligned=c.deepep_contiguous(True))}
    assert {"ep_scatter", "routed_act_quant"} <= names
    decode_names = {o.name for _, o in c.mlp_side_ops(96.0, 96.0, masked=True)}
    assert not decode_names & {"ep_scatter", "routed_act_quant"}
    # the rank's quantisation: every MoE layer on its own tokens, inside the routed-expert group
    q = c.dispatch_quant(1024)
    assert q == pytest.approx(75 * c.op_time(deepep_dispatch_quant(c.m, 1024)))
    routed = float(c.pass_time(extend).parts["routed experts"][0])
    mlp = c.mlp_groups(8192.0, None, None, aligned=True)["routed experts"]
    assert routed == pytest.approx(mlp + q)
    # without DeepEP (the blog's TP-sharded fused MoE) none of them
    plain = _cost("8xh200-colocated-dp8-sglang-2026-04", "glm-5.1-fp8")
    assert not plain.deepep_contiguous(True)
    assert "ep_scatter" not in {o.name for _, o in plain.mlp_side_ops(8192.0)}


def test_q_concat_before_flashmla_by_hand():
    c = _cost()
    ops = {o.name: o for o in attention_ops(c.m, 1024, 0.0, c.layout, c.m.kv_row_bytes)}
    # 64 heads x (512 + 64) bf16 values read from q_nope_out and q_rope and written as q_all
    assert ops["q_concat"].bytes == pytest.approx(1024 * 64 * 576 * 2 * 2)
    assert ops["q_concat"].kind == "elementwise"
