"""An extend pass under DP attention, priced as SGLang runs it: the DP gather and scatter in SUM_LEN
mode (two all-reduces of the instance's tokens), the dense layers' gather under DeepEP, and DeepEP's
router and whole shared expert on each rank's own tokens (the slowest rank's, not the average)."""

from __future__ import annotations

import math

import pytest

from simulator.costmodel import CostModel, Pass, RankWork
from simulator.costmodel.host_sync import deepep_host_wait_s
from simulator.costmodel.ops import RANK_MOE_OPS, rank_moe_ops
from simulator.serving.model import prefill_tok_s
from simulator.serving.scenario import load_scenario

pytestmark = pytest.mark.usefixtures("private_cache")


def _cost(deployment: str, model: str) -> CostModel:
    sc = load_scenario(model=model, deployment=deployment)
    return sc.cost_model()


def test_sum_len_gather_and_scatter_are_two_all_reduces_by_hand():
    # the blog's DP8 deployment, fused MoE TP-sharded: every layer gathers into the MLP and scatters back
    c = _cost("8xh200-colocated-dp8-sglang-2026-04", "glm-5.1-fp8")
    h = c.m.hidden_size
    tokens = 8 * 8192  # every rank extends an 8,192-token chunk: sum_len rows in the buffer
    msg = tokens * h * 2
    # all-reduce over 8 GPUs: 10.8 us + 2 x 7/8 x bytes / 370 GB/s (gpus/h200.toml), twice
    ar = 10.8e-6 + 2 * 7 / 8 * msg / 370e9
    assert c.comm_layer(8192, tokens, None, extend=True) == pytest.approx(2 * ar)
    # a decode pass (CUDA graph, MAX_LEN): all-gather and reduce-scatter of dp x the padded batch
    padded = 16
    gather = 8 * padded * h * 2
    want = (15.2e-6 + 7 / 8 * gather / 370e9) + (13.6e-6 + 7 / 8 * gather / 370e9)
    assert c.comm_layer(16, 8 * 13, padded) == pytest.approx(want)
    # the pass: every layer's two all-reduces
    p = Pass((RankWork(chunks=((8192, 0),)),) * 8)
    assert float(c.pass_time(p).comm_s[0]) == pytest.approx(c.m.layers * 2 * ar)


def test_dense_layers_gather_under_deepep():
    # GLM-5.2 with DeepEP: 75 MoE layers dispatch/combine, the 3 dense layers' TP-sharded MLP gathers (FULL)
    c = _cost("8xh200-dp8-ep8-glm52-balanced", "glm-5.2-fp8")
    assert (c.m.dense_layers, c.m.moe_layers) == (3, 75)
    tokens = 8 * 4096
    moe = c.comm_layer(4096, tokens, None, extend=True)
    dense = c.comm_layer(4096, tokens, None, extend=True, dense=True)
    ic, h = c.g.interconnect, c.m.hidden_size
    assert dense == pytest.approx(2 * ic.time_s("all_reduce", 8, tokens * h * 2))
    p = Pass((RankWork(chunks=((4096, 0),)),) * 8)
    # and every MoE layer's DeepEP normal-dispatch host wait (costmodel/host_sync.py)
    assert float(c.pass_time(p).comm_s[0]) == pytest.approx(75 * moe + 3 * dense + deepep_host_wait_s(75))


def test_deepep_shared_expert_runs_on_the_slowest_ranks_own_tokens():
    c = _cost("8xh200-dp8-ep8-glm52-high-throughput", "glm-5.2-fp8")
    assert c.layout.shared_replicated
    # one rank extends 1,024 tokens, the others are idle: the shared expert and router run on its 1,024
    one = Pass((RankWork(chunks=((1024, 0),)),) + (RankWork(),) * 7)
    ops = rank_moe_ops(c.m, 1024, c.layout)
    assert {o.name for o in ops} == RANK_MOE_OPS
    # shapes by hand: the shared expert whole (gate/up 6144 -> 2 x 2048, down 2048 -> 6144), router 6144 -> 256
    shapes = {o.name: (o.m, o.k, o.n) for o in ops if o.k}
    assert shapes == {"router_gate": (1024, 6144, 256), "shared_gate_up": (1024, 6144, 4096),
                      "shared_down": (1024, 2048, 6144)}
    by_hand = 75 * sum(c.op_time(o) for o in ops)
    parts = c.pass_time(one).parts
    assert float(parts["shared expert, router, dense MLP"][0]) == pytest.approx(
        by_hand + sum(n * c.op_time(o) for n, o in c.mlp_side_ops(1024.0) if o.name in ("dense_gate_up", "silu_mul_quant", "dense_down")))
    # the same 8,192 tokens spread over the eight ranks: each rank's share is an eighth
    spread = Pass((RankWork(chunks=((1024, 0),)),) * 8)
    rank_spread = 75 * sum(c.op_time(o) for o in rank_moe_ops(c.m, 1024, c.layout))
    assert rank_spread == pytest.approx(by_hand)  # per rank the same rows: the rank term does not grow with dp
    assert float(c.pass_time(spread).total_s[0]) > float(c.pass_time(one).total_s[0])


def test_the_extend_pricing_moves_the_prefill_rate_and_the_plan():
    # the prefill side's rate (prefill_tok_s) reads the same passes: the SUM_LEN all-reduces slow it
    sc = load_scenario(model="glm-5.1-fp8", deployment="8xh200-colocated-dp8-sglang-2026-04",
                       workload="32k-in-8k-out")
    rate = prefill_tok_s(sc)
    c = sc.cost_model()
    n, chunk = sc.workload.input_tokens, sc.deployment.prefill_chunk_tokens
    t = 0.0
    for done in range(0, n, chunk):
        p = Pass((RankWork(chunks=((min(chunk, n - done), done),)),) * 8)
        t += float(c.pass_time(p).total_s[0])
    assert rate == pytest.approx(n / t * sc.deployment.ranks)
    # against the gather priced as an all-gather + reduce-scatter (the older formula) the rate is lower
    ic, h = c.g.interconnect, c.m.hidden_size
    old = 0.0
    for done in range(0, n, chunk):
        k = min(chunk, n - done)
        msg = 8 * k * h * 2
        new_comm = 2 * ic.time_s("all_reduce", 8, msg)
        old_comm = ic.time_s("all_gather", 8, msg) + ic.time_s("reduce_scatter", 8, msg)
        p = Pass((RankWork(chunks=((k, done),)),) * 8)
        old += float(c.pass_time(p).total_s[0]) - c.m.layers * (new_comm - old_comm)
    assert n / old * sc.deployment.ranks > rate * 1.05


def test_tp_attention_passes_do_not_move():
    # the TP8 low-latency layout all-reduces after attention and after the MLP in every pass, as before
    c = _cost("8xh200-tp8-glm52-low-latency", "glm-5.2-fp8")
    assert c.d.attention.value == "tp"
    tokens = 8192
    ar = c.g.interconnect.time_s("all_reduce", 8, tokens * c.m.hidden_size * 2)
    assert c.comm_layer(tokens, tokens, None, extend=True) == pytest.approx(2 * ar)


def test_deepep_normal_dispatch_aligns_each_experts_rows_to_128():
    """SGLang's DeepEP normal dispatch (extend passes) asks DeepEP for ``expert_alignment=128`` and DeepGEMM's
    contiguous GEMM multiplies every aligned row: E[ceil(X / 128) * 128] per local expert, X ~ Binomial."""
    from simulator.costmodel.ops import aligned_rows_per_expert

    # by hand: 2 tokens, p 1/2, alignment 2 -> X = 0, 1, 2 with 1/4, 1/2, 1/4 -> 0, 2, 2 rows
    assert aligned_rows_per_expert(2, 0.5, 2) == pytest.approx(1.5)
    assert aligned_rows_per_expert(8192, 8 / 256, 1) == pytest.approx(256.0)
    # mean 256, sd ~16: about half the experts land on 256 rows, half on 384
    assert 300.0 < aligned_rows_per_expert(8192, 8 / 256, 128) < 336.0
    assert aligned_rows_per_expert(1108, 8 / 256, 128) == pytest.approx(128.0, abs=1e-6)  # ~35 rows each: one block
    assert aligned_rows_per_expert(0, 8 / 256, 128) == 0.0


def test_the_alignment_prices_only_deepep_extend_passes():
    import numpy as np

    from simulator.costmodel.ops import aligned_rows_per_expert

    sc = load_scenario(model="glm-5.2-fp8", deployment="8xh200-dp8-ep8-glm52-high-throughput")
    c = sc.cost_model()
    chunk = sc.deployment.prefill_chunk_tokens  # 8192 // dp 8
    tokens = 8.0 * chunk
    plain = {o.name: o for _, o in c.mlp_side_ops(tokens, aligned=False) if o.name.startswith("routed")}
    padded = {o.name: o for _, o in c.mlp_side_ops(tokens, aligned=True) if o.name.startswith("routed")}
    m = sc.model
    expected = tokens * m.experts_per_token / 8  # rows this GPU's 32 experts receive on average
    aligned = m.experts // 8 * aligned_rows_per_expert(int(tokens), m.experts_per_token / m.experts, 128)
    assert padded["routed_gate_up"].flops / plain["routed_gate_up"].flops == pytest.approx(aligned / expected)
    assert aligned / expected > 1.2  # 256 rows per expert on average, padded to 256 or 384
    assert padded["routed_down"].weight_bytes == plain["routed_down"].weight_bytes  # the same experts' weights
    assert c.deepep_contiguous(True) and not c.deepep_masked(True)
    assert not c.deepep_contiguous(False)  # decode: the low-latency kernels and the masked GEMM
    extend = Pass(tuple(RankWork(chunks=((chunk, 0),)) for _ in range(8)))
    with_align = float(np.ravel(c.pass_time(extend).parts["routed experts"])[0])
    c2 = sc.cost_model()
    c2.deepep_contiguous = lambda extend: False  # type: ignore[method-assign]
    assert with_align > float(np.ravel(c2.pass_time(extend).parts["routed experts"])[0])
    # a deployment without DeepEP keeps its extend pass's rows as routed
    tp = load_scenario(model="glm-5.1-fp8", deployment="8xh200-colocated-dp8")
    assert not tp.cost_model().deepep_contiguous(True)


def test_one_rank_extending_sends_its_whole_chunk_over_its_own_links():
    """Each rank dispatches its own tokens and takes their results back (DeepEP's Buffer.dispatch sends the
    caller's x): with one rank extending a 4,096-token chunk and seven idle, that rank's send and receive
    hold all 4,096 tokens' copies, 8x the even share DeepEP's figure is quoted on. Everything else alike."""
    c = _cost("8xh200-dp8-ep8-dsv32-pr30514", "deepseek-v3.2-fp8-kvfp8")
    ic, h = c.g.interconnect, c.m.hidden_size
    copies = c.a2a_copies_per_token(True)
    assert copies == pytest.approx(8 * (1 - math.comb(224, 8) / math.comb(256, 8)))  # ranks holding one of its top-8

    def a2a(rank_tokens: float) -> float:
        rows = rank_tokens * copies
        return (ic.received_time_s("all_to_all", 8, rows * (h + h // 128 * 4))
                + ic.received_time_s("all_to_all", 8, rows * h * 2))

    assert c.a2a_rank_tokens(4096, 4096 / 8, True) == 4096
    assert c.comm_layer(4096, 4096, None, extend=True) == pytest.approx(a2a(4096))
    assert c.a2a_rank_tokens(512, 4096 / 8, True) == 512  # every rank extends 512: the even share
    assert c.comm_layer(512, 4096, None, extend=True) == pytest.approx(a2a(512))
    # decode passes pad every rank to the same graph batch: the even share, whatever the biggest rank holds
    assert c.a2a_rank_tokens(64, 64 / 8, False) == 8
    one = Pass((RankWork(chunks=((4096, 0),)),) + (RankWork(),) * 7)
    even = Pass((RankWork(chunks=((512, 0),)),) * 8)
    extra = float(c.pass_time(one).parts["collectives"][0]) - float(c.pass_time(even).parts["collectives"][0])
    assert extra == pytest.approx(c.m.moe_layers * (a2a(4096) - a2a(512)), rel=1e-6)


def test_across_nodes_one_rank_extending_also_sends_its_whole_chunk():
    """The internode DeepEP path (EP over 8 nodes) takes the busiest rank's tokens the same way."""
    sc = load_scenario(deployment="16x8xh200-pd-dp64-wide-ep", hisparse="wide-ep-h200")
    c = sc.cost_model()
    assert c._internode_ep
    one, even = c.comm_layer(8192, 8192, None, extend=True), c.comm_layer(128, 8192, None, extend=True)
    assert one > even
    # decode passes keep the even share: the padded batch sets every rank's tokens
    assert c.comm_layer(8192, 64 * 16, 16) == pytest.approx(c.comm_layer(16, 64 * 16, 16))
