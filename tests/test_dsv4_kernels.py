"""DeepSeek-V4's decode-pass mechanisms SGLang adds beyond the DSA models' (LMSYS day-0 blog, SGLang
``models/deepseek_v4.py``): Lightning TopK for the C4 indexer's select, and the attention preparation on
parallel CUDA streams at small batch. Each checked by hand on small cases."""

import math

import numpy as np
import pytest

from simulator.costmodel import Pass, RankWork, dsv4_ops
from simulator.costmodel.published_kernels import LIGHTNING_TOPK
from simulator.serving.scenario import load_scenario
from simulator.serving.speculative import from_table

SPEC = {"speculative": "eagle:3-1-4", "accept_len": 2.5, "accept_method": "match-expected"}


def _cost(deployment="4xh200-tp4-dsv4-flash-low-latency", model="deepseek-v4-flash", gpu=None):
    spec = from_table(SPEC, "t")
    sc = load_scenario(model=model, deployment=deployment, gpu=gpu, speculative=spec)
    return sc.cost_model(spec=spec)


def test_lightning_topk_by_hand():
    """15 us for the 262,144 candidates of a 1M context, one query row (the blog's figure); linear in the
    candidates; one cluster of 8 CTAs per row, rows in waves of SMs / 8 (16 on a 132-SM H200)."""
    assert LIGHTNING_TOPK.time(1, 262_144, 132) == pytest.approx(15e-6)
    assert LIGHTNING_TOPK.time(1, 225_500, 132) == pytest.approx(15e-6 * 225_500 / 262_144)
    assert LIGHTNING_TOPK.time(16, 262_144, 132) == pytest.approx(15e-6)  # 16 clusters x 8 = 128 CTAs: one wave
    assert LIGHTNING_TOPK.time(17, 262_144, 132) == pytest.approx(30e-6)  # a second wave
    assert LIGHTNING_TOPK.time(0, 262_144, 132) == 0.0


def test_c4_indexer_selects_by_lightning_topk():
    """A C4 layer's indexer: the fitted scoring (launch + one compressed key per 4 tokens read once)
    plus Lightning TopK over those keys per query row; at 900K (225,000 candidates, 4 verify rows) the
    select is ~13 us where the DSA models' fitted exact top-k (0.531 ns per candidate) gives ~120 us."""
    c = _cost()
    t = c._indexer_term()
    ctx, rows = 900_000.0, 4
    keys = ctx / 4
    want = t.launch_s + keys * 132 / t.bw + 15e-6 * keys / 262_144
    assert c.c4_indexer(ctx, 1, rows) == pytest.approx(want)
    dsa_select = t.select_s_per_token * math.ceil(rows / t.sms) * keys
    assert dsa_select > 100e-6 and c.c4_indexer(ctx, 1, rows) < c.indexer(keys, 1, rows) - 100e-6
    # every C4 layer of the step
    assert c.indexer_all(ctx, 1, rows) == pytest.approx(c.m.kind_counts["c4"] * want)


def _ops(c, rows, kind):
    return {o.name: c.op_time(o) for o in dsv4_ops.layer_ops(c.m, rows, c.layout, kind)}


def test_stream_overlap_by_hand_on_one_request():
    """One request verifying 4 positions (4 rows, under the Hopper limit of 64): per layer the
    preparation takes its longest stream -- main q_a + q_a_norm + q_b + q_norm_rope; KV projection and
    store; the compressor; the C4 indexer's max(compressor, q_a ... indexer q_b + rope/quant, weights
    projection) then its scoring and top-k -- instead of their sum."""
    c = _cost()
    ctx = 6144.0
    w = RankWork(1, np.asarray(ctx), None)
    p = Pass((w,), verify=4, accepted=2.5, drafts=False)
    want = 0.0
    for kind, n in c.m.kind_counts.items():
        t = _ops(c, 4, kind)
        main = t["dsv4_q_a"] + t["q_a_norm"] + t["dsv4_q_b"] + t["q_norm_rope"]
        kv = t["dsv4_kv_proj"] + t["kv_norm_rope_store"]
        comp = t.get("dsv4_compressor", 0.0)
        serial, longest = main + kv + comp, max(main, kv, comp)
        if kind == "c4":
            score = c.c4_indexer(ctx, 1, 4)
            q = t["dsv4_q_a"] + t["q_a_norm"] + t["dsv4_indexer_q_b"] + t["indexer_q_rope_quant"]
            pre = max(t["dsv4_indexer_compressor"], q, t["dsv4_indexer_weights_proj"])
            serial += (t["dsv4_indexer_compressor"] + t["dsv4_indexer_q_b"] + t["indexer_q_rope_quant"]
                       + t["dsv4_indexer_weights_proj"] + score)
            longest = max(longest, pre + score)
        want += n * (serial - longest)
    parts = c.pass_time(p).parts
    assert float(parts["multi-stream overlap"][0]) == pytest.approx(-want)
    assert 1.0e-3 < want < 1.6e-3  # Flash, TP4 H200: ~1.3 ms of an ~11 ms verify pass
    # the serial sum less the overlap is the pass's total
    serial_total = sum(float(v[0]) for k, v in parts.items() if k != "multi-stream overlap")
    assert float(c.pass_time(p).total_s[0]) == pytest.approx(serial_total - want)


def test_stream_overlap_only_in_small_graph_batches():
    """Above 64 tokens per layer (Hopper) or 128 (Blackwell), and in extend passes, the preparation runs
    serially; models other than DeepSeek-V4 have no such term."""
    c = _cost()
    def hidden(batch, verify=4, cost=c):
        return float(np.sum(cost.pass_time(Pass((RankWork(batch, np.asarray(batch * 6144.0), None),),
                                                verify=verify)).parts.get("multi-stream overlap", 0.0)))
    assert hidden(16) < 0  # 16 x 4 = 64 rows: at the limit
    assert hidden(17) == 0.0  # 17 pads to the 24-request graph: 96 rows
    extend = c.pass_time(Pass((RankWork(chunks=((64, 0),)),))).parts
    assert "multi-stream overlap" not in extend
    b200 = _cost(deployment="8xb200-tp8-dsv4-pro-low-latency", model="deepseek-v4-pro")
    assert hidden(24, cost=b200) < 0  # 96 rows: under Blackwell's 128
    assert hidden(40, cost=b200) == 0.0  # 160 rows
    glm = load_scenario(model="glm-5.2-fp8", deployment="8xh200-tp8-glm52-low-latency")
    cg = glm.cost_model()
    assert "multi-stream overlap" not in cg.pass_time(Pass((RankWork(1, np.asarray(8192.0), None),))).parts


def test_the_dsv4_sets_move():
    """The plan moves: the LMSYS Flash set's one-request verify pass at 902K loses ~3.6 ms (the select
    ~2.2, the streams ~1.3) against the DSA select priced serially."""
    c = _cost()
    p = Pass((RankWork(1, np.asarray(902_000.0), None),), verify=4, accepted=2.5, drafts=True)
    now = float(c.pass_time(p).total_s[0])
    t = c._indexer_term()
    keys = 902_000.0 / 4
    old_select = c.m.kind_counts["c4"] * (t.select_s_per_token * keys - LIGHTNING_TOPK.time(4, keys, t.sms))
    hidden = -float(c.pass_time(p).parts["multi-stream overlap"][0])
    assert old_select == pytest.approx(2.25e-3, rel=0.05)
    assert 10e-3 < now < 11.5e-3 and 1.0e-3 < hidden < 1.6e-3
