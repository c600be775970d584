"""One price for every pass: the simulation's decode gaps are ``CostModel.pass_time``, every
overlap knob reaches the plan, and a term added to the table reaches it too."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from simulator.costmodel import Category, CostModel, Pass, RankWork, pass_terms
from simulator.serving.misses import MissProfiles
from simulator.serving.model import InstanceSim, System, simulate
from simulator.serving.planner import PlanInputs, run_plan, run_plan_full
from simulator.serving.scenario import load_scenario
from tests.helpers import decode_pass

SHARE = 0.1  # a constant miss share, so every decode step's swap-in is known by hand


def _scenario(**workload):
    sc = load_scenario(calibration="uncalibrated")
    # token-id prompts (bench_serving --tokenize-prompt): every rank's request arrives at once, so the ranks
    # prefill in the same passes and decode in lockstep (text prompts: tests/test_frontend.py)
    w = dict(input_tokens=20000, output_tokens=40, requests_per_client=1, tokenize_prompt=True)
    w.update(workload)
    return sc.replace(workload=dataclasses.replace(sc.workload, **w))


def _profiles(n: int = 8, steps: int = 64) -> MissProfiles:
    return MissProfiles(tuple(np.full(steps, SHARE) for _ in range(n)), source="constant")


def _cost(sc) -> CostModel:
    return sc.cost_model()


def test_simulated_decode_gaps_are_pass_time_for_a_fixed_batch():
    """Eight clients, one request on each DP rank, all prefilled in the same passes: every decode
    gap is the pass of one request per rank at its context, with its misses swapped in."""
    sc = _scenario()
    sim = InstanceSim(sc, System.HISPARSE, concurrency=8, profiles=_profiles())
    sim.run()
    ranks = len(sim.ranks)
    groups = [sim.itl[i:i + ranks] for i in range(0, len(sim.itl), ranks)]
    assert all(np.array_equal(g[0], other) for g in groups for other in g)  # the ranks in lockstep
    gaps = np.concatenate([g[0] for g in groups])
    steps = sc.workload.output_tokens - 1
    ctx = sc.workload.input_tokens + 1 + np.arange(steps)
    missed = np.full(steps, SHARE * sc.model.top_k * sc.model.layers)
    want = decode_pass(_cost(sc), 1, ctx, missed_rows=missed)
    assert gaps.shape == (steps,)
    np.testing.assert_allclose(gaps, want.total_s, rtol=1e-12)
    assert np.all(want.swap_s > 0) and np.all(want.compute_s > 0) and np.all(want.comm_s > 0)


def test_pass_parts_add_up_and_the_slowest_rank_paces_the_pass():
    c = _cost(_scenario())
    busy, idle = RankWork(16, 16 * 40000.0, 1e4), RankWork(2, 2 * 1000.0, 0.0)
    one = c.pass_time(Pass((busy,) + (idle,) * 7, hisparse=True))
    alone = c.pass_time(Pass((busy,) + (RankWork(),) * 7, hisparse=True))
    assert float(one.total_s[0]) == pytest.approx(sum(float(v[0]) for v in one.parts.values()))
    # the light ranks change only the instance-wide terms (their tokens join the MLP and collectives)
    assert one.parts["swap-in"][0] == alone.parts["swap-in"][0]
    assert one.parts["lightning indexer"][0] == alone.parts["lightning indexer"][0]
    assert one.parts["routed experts"][0] > alone.parts["routed experts"][0]
    cats = {one.category[k] for k in one.parts}
    assert cats == {Category.COMPUTE, Category.COMM, Category.SWAP, Category.BACKUP}


@pytest.mark.parametrize("knob", ["swap_in_overlap", "backup_overlap"])
def test_every_overlap_knob_moves_the_simulated_decode(knob):
    sc = _scenario()
    itl = []
    for value in (0.0, 1.0):
        s = sc.replace(params=dataclasses.replace(sc.params, **{knob: value}))
        itl.append(simulate(s, System.HISPARSE, concurrency=8, profiles=_profiles()).itl_p50_ms)
    assert itl[0] > itl[1], f"{knob}: hiding the copy must shorten the step ({itl})"


def test_the_backup_knob_reaches_the_plan():
    """The issue's check: ``hisparse plan`` with ``backup_overlap`` 1.0 and then 0.0 gave the same
    ITL to the microsecond at concurrency 8; the decode backup is now a term of every pass."""
    base = load_scenario()
    itl = []
    for value in (1.0, 0.0):
        sc = base.replace(params=dataclasses.replace(base.params, backup_overlap=value))
        rows = run_plan_full(PlanInputs(concurrency=(8,)), scenario=sc).rows()
        itl.append(next(r["itl_p50_ms"] for r in rows if r["system"] == "hisparse"))
    assert itl[1] > itl[0]


def test_a_term_added_to_the_table_reaches_the_plan(monkeypatch):
    """One entry in ``pass_terms.PASS_TERMS`` is all a new mechanism's price needs: the plan's
    ITL moves by it, every pass."""
    inp = PlanInputs(concurrency=(2,), calibration="uncalibrated")
    before = {r["system"]: r for r in run_plan(inp)}
    extra = pass_terms.PassTerm("dummy", pass_terms.Scope.INSTANCE, Category.COMPUTE,
                                lambda c, s, w: {"dummy": 1e-3},
                                lambda c: (pass_terms.Provenance.INFERRED, "a test's dummy"))
    monkeypatch.setattr(pass_terms, "PASS_TERMS", [*pass_terms.PASS_TERMS, extra])
    after = {r["system"]: r for r in run_plan(inp)}
    for system in ("baseline", "hisparse"):
        assert after[system]["itl_p50_ms"] == pytest.approx(before[system]["itl_p50_ms"] + 1.0, abs=1e-6)


@pytest.mark.parametrize("gpu", ["h200", "h100", "h20", "b200", "rtx-pro-6000"])  # gh200: 4 per node, no 8-GPU TP
def test_every_term_says_how_it_is_priced_on_each_gpu(gpu):
    """The plan names, per term, whether this GPU's price was measured, derived from another GPU's
    measurements by datasheet ratios, published, or inferred; with its source."""
    from simulator.costmodel.pass_terms import PASS_TERMS, Provenance

    sc = load_scenario(gpu=gpu)
    rows = {r["term"]: r for r in _cost(sc).term_sources()}
    from simulator.costmodel.passes import FLOORS_TERM

    assert set(rows) == {t.name for t in PASS_TERMS} | {FLOORS_TERM}
    assert all(r["priced"] in set(Provenance) and r["source"] for r in rows.values())
    kernels = rows["MLP side"]["priced"]
    assert kernels == ("measured" if gpu == "h200" else "derived")
    assert (f"scaled to {gpu}" in rows["MLP side"]["source"]) == (gpu != "h200")
    # the fixed per-launch parts: measured on the H200; elsewhere the H200's scaled by the SM clock ratio
    # where the vendor's clock is published, kept (and said so) where it is not (the H20)
    floors = rows[FLOORS_TERM]
    assert floors["priced"] == {"h200": "measured", "h20": "inferred"}.get(gpu, "derived")
    assert "us per GEMM kind" in floors["source"]
    assert ("SM boost clock ratio" in floors["source"]) == (gpu not in ("h200", "h20"))
    assert ("INFERRED" in floors["source"]) == (gpu == "h20")


def test_the_indexer_is_replicated_under_tp_attention():
    """SGLang builds the lightning indexer's projections as ReplicatedLinear (nsa_indexer.py): under
    TP attention every GPU scores all its heads for every token, so the indexer does not shrink with
    attention TP, while MLA's heads do."""
    from simulator.costmodel.ops import attention_ops

    tp = load_scenario(deployment="8xh200-tp8", calibration="uncalibrated")
    dp = load_scenario(calibration="uncalibrated")
    c_tp, c_dp = _cost(tp), _cost(dp)
    ops_tp = {o.name: o for o in attention_ops(tp.model, 8, 8 * 40000.0, c_tp.layout, tp.model.kv_row_bytes)}
    ops_dp = {o.name: o for o in attention_ops(dp.model, 8, 8 * 40000.0, c_dp.layout, dp.model.kv_row_bytes)}
    assert ops_tp["indexer_score_topk"].n == ops_dp["indexer_score_topk"].n == tp.model.indexer_heads
    assert ops_tp["indexer_wq_b"].n == ops_dp["indexer_wq_b"].n
    assert ops_tp["q_b_proj"].n * 8 == ops_dp["q_b_proj"].n  # MLA's heads split over 8
    assert float(c_tp.indexer(8 * 40000.0, 8)) == pytest.approx(float(c_dp.indexer(8 * 40000.0, 8)))


# -- the prefill indexer's materialised logits (SGLang dsa_indexer._get_topk_ragged) ----------------------

def _dsv32_prefill() -> CostModel:
    """DeepSeek-V3.2 on the held-out prefill set's deployment (8xH200 DP8, chunk 4,096 per rank)."""
    return _cost(load_scenario(model="deepseek-v3.2-fp8-kvfp8", deployment="8xh200-dp8-ep8-dsv32-pr30514"))


def test_causal_rows_counts_each_querys_keys_above_the_cut():
    from simulator.costmodel.ops import causal_rows

    for tokens, prior, cut in [(7, 0, 0), (7, 3, 0), (9, 0, 4), (9, 5, 4), (5, 10, 30), (4096, 0, 2048)]:
        lengths = np.arange(prior + 1, prior + tokens + 1)
        assert causal_rows(tokens, prior, cut) == lengths[lengths > cut].sum()


def test_the_top_k_reads_every_score_of_a_row_longer_than_top_k_twice():
    """fast_topk_cuda_tl: a histogram pass and a classifying pass over the row's scores; a row of at most
    top-k keys takes them all unread. DeepSeek-V4's C4 rows hold a key per 4 tokens."""
    from simulator.costmodel.ops import prefill_topk_read_op

    assert prefill_topk_read_op(2048, 0, 2048).bytes == 0.0  # every row <= top-k
    rows = np.arange(2049, 4097)  # rows 2049 .. 4096 keys long
    assert prefill_topk_read_op(4096, 0, 2048).bytes == 4 * 2 * rows.sum()
    c4 = prefill_topk_read_op(4096, 4096, 512, tokens_per_key=4)  # every row > 4 x 512 tokens
    assert c4.bytes == pytest.approx(4 * 2 * np.arange(4097, 8193).sum() / 4)


def test_the_prefill_indexer_prices_the_logits_top_k_and_it_scales_with_the_prior_context():
    """The term is in prefill_indexer: the indexer layers' scoring GEMM plus each layer's top-k read of the
    materialised scores; doubling a chunk's prior context (long rows) about doubles the bytes read."""
    from simulator.costmodel.prompt_chunk import MQA_LOGITS

    c = _dsv32_prefill()
    ew = c.t.rates[("elementwise", "bf16")]
    m = c.m
    n, prior = 4096, 65536
    score = MQA_LOGITS.time(c.g, n, prior, m.indexer_heads, m.indexer_head_dim)  # DeepGEMM's, measured
    at = 65536 - 4096  # the measured 64-head, 4,096-token chunk ending at 65,536, at the same FLOP rate per chunk
    assert score == pytest.approx(4394.3e-6 * MQA_LOGITS.flops(n, prior, 64) / MQA_LOGITS.flops(4096, at, 64), rel=0.02)
    read = ew.time(8 * np.arange(prior + 1, prior + n + 1).sum())
    assert c.prefill_topk_read(n, prior) == pytest.approx(read, rel=1e-12)
    assert c.prefill_indexer(n, prior) == pytest.approx(m.indexer_layers * (score + read), rel=1e-12)
    ratio = (c.prefill_topk_read(n, 2 * prior) - ew.launch_s) / (c.prefill_topk_read(n, prior) - ew.launch_s)
    assert ratio == pytest.approx((2 * prior + n / 2 + 0.5) / (prior + n / 2 + 0.5))
    assert 1.9 < ratio < 2.0


def test_the_scoring_is_deepgemms_measured_kernel_and_deepseek_v4_keeps_the_gemm_term():
    """A DSA model's prompt-chunk scoring is DeepGEMM's fp8_mqa_logits as timed (the logits write inside it):
    lifting the FP8 GEMM term's FLOP roof moves nothing. DeepSeek-V4's paged scoring of compressed keys, not
    measured, stays the FP8 GEMM term: its key reads and 4 B of logits per pair at the term's bandwidth."""
    def lifted(c):
        gemm = dataclasses.replace(c.t.rates[("gemm", "fp8")], flops_rate=float("inf"))
        c.t = dataclasses.replace(c.t, rates={**c.t.rates, ("gemm", "fp8"): gemm})
        return gemm

    c = _dsv32_prefill()
    before = c.prefill_indexer(4096, 20000)
    lifted(c)
    assert c.prefill_indexer(4096, 20000) == before
    v4 = _cost(load_scenario(model="deepseek-v4-flash", deployment="4xh200-tp4-dsv4-flash-low-latency"))
    gemm = lifted(v4)
    n, prior = 4096, 20000
    pairs = n * (prior + n / 2)
    score = gemm.launch_s + ((prior + n) * v4.m.indexer_row_bytes + 4 * pairs) / 4 / gemm.bw
    assert v4.prefill_indexer(n, prior) == pytest.approx(v4.m.indexer_layers * (score + v4.prefill_topk_read(n, prior)))


def test_the_logits_term_of_a_160k_prompt_on_dsv32_is_the_derived_size():
    """docs/validation.md: a 160K prompt's top-k reads over DeepSeek-V3.2's 61 indexer layers, 8 B per
    causal pair of rows longer than 2,048 keys, ~6.2 TB at the measured elementwise bandwidth: ~1.9 s."""
    c = _dsv32_prefill()
    chunk, total = c.d.prefill_chunk_tokens, 160_000
    reads = sum(c.prefill_topk_read(min(chunk, total - p), p) for p in range(0, total, chunk)) * c.m.indexer_layers
    lengths = np.arange(2049, total + 1, dtype=np.float64)
    ew = c.t.rates[("elementwise", "bf16")]
    launches = -(-total // chunk) * ew.launch_s
    assert reads == pytest.approx(c.m.indexer_layers * (8 * lengths.sum() / ew.bw + launches), rel=1e-9)
    assert 1.5 < reads < 2.2


def test_deepseek_v4_reads_its_c4_layers_compressed_scores():
    """DeepSeek-V4 (dsv4/indexer.py): the C4 layers score a compressed key per 4 tokens and topk_transform_512
    reads the rows longer than top-k (512) compressed keys; only those layers run an indexer."""
    c = _cost(load_scenario(model="deepseek-v4-flash", deployment="4xh200-tp4-dsv4-flash-low-latency"))
    ew = c.t.rates[("elementwise", "bf16")]
    assert c.m.arch == "dsv4" and c.m.top_k == 512 and 0 < c.m.indexer_layers < c.m.layers
    assert c.prefill_topk_read(2048, 0) == pytest.approx(ew.launch_s)  # rows <= 4 x 512 tokens: nothing read
    lengths = np.arange(30001, 34097, dtype=np.float64)
    assert c.prefill_topk_read(4096, 30000) == pytest.approx(ew.time(8 * lengths.sum() / 4))
    without = c.prefill_indexer(4096, 30000) - c.m.indexer_layers * c.prefill_topk_read(4096, 30000)
    assert 0 < without < c.prefill_indexer(4096, 30000)


def test_the_top_k_term_reaches_the_validated_ttft(monkeypatch, tmp_path):
    """The term reaches what the planner reports: PR #30514's 160K one-request TTFT, validated with the
    top-k read priced and with it zeroed, differs by the term summed over the prompt's chunks and the
    indexer layers (derived ~1.9 s), nothing else moving."""
    import dataclasses

    from simulator.serving.published import load_published, validate

    monkeypatch.setenv("HISPARSE_CACHE", str(tmp_path / "cache"))
    ps = load_published("pr30514-dsv32-h200-prefill")
    point = max(ps.points, key=lambda p: p.measured)
    one = dataclasses.replace(ps, points=(point,))
    priced = validate(one)[0]["predicted"]
    monkeypatch.setattr(CostModel, "prefill_topk_read", lambda self, tokens, prior_ctx: 0.0)
    zeroed = validate(one)[0]["predicted"]
    monkeypatch.undo()
    c = _dsv32_prefill()
    chunk, total = c.d.prefill_chunk_tokens, point.input_tokens
    assert total == 160_000
    term = c.m.indexer_layers * sum(c.prefill_topk_read(min(chunk, total - p), p) for p in range(0, total, chunk))
    assert 1.5 < priced - zeroed < 2.3
    assert priced - zeroed == pytest.approx(term, rel=0.05)
