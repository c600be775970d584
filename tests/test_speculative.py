"""Speculative decoding (serving/speculative.py): each effect computed by hand on a small case -- a
verify pass's time, the draft passes, tokens per step and TPOT, the misses deduped across the
verify positions of one swap commit -- and the options' errors."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from simulator.costmodel import CostModel, Pass, RankWork
from simulator.errors import HisparseError
from simulator.replay import ReplayConfig, replay
from simulator.serving.memory import plan_memory
from simulator.serving.model import InstanceSim, simulate
from simulator.serving.scenario import load_scenario
from simulator.serving.speculative import SpeculativeSpec, parse_speculative
from simulator.trace.stream import Stream
from tests.fuzzing import assert_clean_error, run_cli

pytestmark = pytest.mark.usefixtures("private_cache")


def _cost(spec, deployment="8xh200-tp8"):
    sc = load_scenario(deployment=deployment)
    return sc, sc.cost_model(spec=spec)


# -- the spec -------------------------------------------------------------------------------------
def test_acceptance_distributions_by_hand():
    me = parse_speculative("eagle:5-1-6", 3.5, "match-expected")
    assert me.pmf().tolist() == [0, 0, 0.5, 0.5, 0, 0]  # floor 3 and ceil 4, weights 0.5 / 0.5
    # multinomial at 1-1-2, mean 2: round(clamp(N(2, 1), 1, 2)) is 2 when x > 1.5: P = Phi(0.5)
    mn = parse_speculative("eagle:1-1-2", 2.0)
    phi = 0.5 * (1 + math.erf(0.5 / math.sqrt(2)))
    assert mn.pmf() == pytest.approx([1 - phi, phi])
    assert mn.mean_accept == pytest.approx(1 + phi)  # 1.69, not the 2 asked for
    # symmetric clamp: the mean stays 3.5
    assert parse_speculative("eagle:5-1-6", 3.5).mean_accept == pytest.approx(3.5)
    d = parse_speculative("mtp:2-1-3", accept_probs=(0.2, 0.3, 0.5))
    assert d.accept_len == pytest.approx(0.2 + 0.6 + 1.5)
    rng1, rng2 = np.random.default_rng(5), np.random.default_rng(5)
    assert d.draw(rng1, 50).tolist() == d.draw(rng2, 50).tolist()  # seeded


@pytest.mark.parametrize("kw, message", [
    (dict(num_steps=5, num_draft_tokens=4, accept_len=2), "num_draft_tokens"),
    (dict(num_steps=2, eagle_topk=4, num_draft_tokens=3, accept_len=2), "eagle_topk"),
    (dict(num_steps=1, num_draft_tokens=2, accept_len=3), "accept_len"),
    (dict(num_steps=1, num_draft_tokens=2, accept_method="distribution", accept_probs=(0.5, 0.6)), "accept_probs"),
])
def test_bad_specs(kw, message):
    with pytest.raises(HisparseError, match=message):
        SpeculativeSpec(**kw)


# -- pass_time ------------------------------------------------------------------------------------
def test_verify_pass_by_hand():
    """A verify pass of 8 requests x 2 positions runs the target's GEMMs, MoE, collectives and
    attention on 16 query rows (its CUDA graph holds 8 x 2 = cuda_graph_batch(16) rows): the same as
    a plain decode of 16 requests whose contexts sum to twice as much, except the indexer, which
    reads each request's keys once and selects per query row."""
    spec = parse_speculative("eagle:1-1-2", 2.0)
    _, c = _cost(spec)
    ctx = 8 * 9000.0
    verify = c.pass_time(Pass((RankWork(8, ctx),), verify=2, accepted=2.0)).parts
    plain = c.pass_time(Pass((RankWork(16, 2 * ctx),))).parts
    for group, sec in plain.items():
        if group not in ("lightning indexer", "sparse attention"):
            assert verify[group][0] == pytest.approx(sec[0], rel=1e-12), group
    t = c._indexer_term()
    by_hand = t.launch_s + ctx * 132 / t.bw + t.select_s_per_token * math.ceil(16 / t.sms) * ctx / 8
    assert verify["lightning indexer"][0] == pytest.approx(c.m.indexer_layers * by_hand)
    # the attention reads each position's own top-k: twice one position's rows; under SGLang's fa3 decode
    # backend (BF16 KV on Hopper) FA3's measured verify time, whose positions share rows in L2 (costmodel/fa3_decode.py)
    assert c.fa3_decode
    from simulator.costmodel.fa3_decode import FA3_SPARSE_DECODE as F

    heads = c.m.attention_heads // c.d.attn_tp
    floor = F.floor_us(heads) * 1e-6
    one = c.decode_attention(16, 2 * ctx)  # 16 rows as a plain decode
    assert plain["sparse attention"][0] == pytest.approx(c.m.layers * one)
    assert verify["sparse attention"][0] == pytest.approx(c.m.layers * (floor + (one - floor) * F.verify_factor))


def test_draft_passes_by_hand():
    """5-1-6: one draft extend over 6 tokens per request plus 4 one-token passes of the one-layer
    draft; the draft's routed experts are one MoE layer's share of the target's at the same tokens."""
    spec = parse_speculative("eagle:5-1-6", 3.5)
    _, c = _cost(spec)
    ranks = (RankWork(4, 4 * 8000.0),)
    step = c.pass_time(Pass(ranks, verify=6, drafts=True))
    d = c.draft
    assert d.m.layers == 1 and d.m.dense_layers == 0 and d.m.indexer_layers == 1
    extend = d.pass_time(Pass(ranks, verify=6)).total_s[0]
    one = d.pass_time(Pass(ranks)).total_s[0]
    assert step.parts["draft passes (MTP layer)"][0] == pytest.approx(extend + 4 * one)
    target = c.pass_time(Pass(ranks)).parts["routed experts"][0]
    assert d.pass_time(Pass(ranks)).parts["routed experts"][0] == pytest.approx(target / c.m.moe_layers)
    no_drafts = c.pass_time(Pass(ranks, verify=6))
    assert step.total_s[0] == pytest.approx(no_drafts.total_s[0] + extend + 4 * one)


def test_glm52_draft_reuses_its_first_decode_steps_topk_by_hand():
    """GLM-5.2 (config.json index_share_for_mtp_iteration): of the 4 one-token draft passes of 5-1-6, the
    first runs the MTP layer's indexer and the other 3 reuse its top-k (SGLang PR #29654), so each of those
    3 costs the one-token pass less the indexer's scoring and its projections, computed op by op here."""
    from simulator.costmodel.ops import INDEXER_OPS

    spec = parse_speculative("eagle:5-1-6", 3.5, "match-expected")
    sc = load_scenario(model="glm-5.2-fp8", deployment="8xh200-tp8-glm52-low-latency")
    assert sc.model.mtp_index_share
    c = sc.cost_model(spec=spec)
    ranks = (RankWork(1, 8704.0),)
    d = c.draft
    extend = d.pass_time(Pass(ranks, verify=6)).total_s[0]
    one = d.pass_time(Pass(ranks)).total_s[0]
    idx_ops = sum(n * d.op_time(o) for n, o in d.attention_side_ops(1) if o.name in INDEXER_OPS)
    reuse = one - idx_ops - d.indexer_all(8704.0, 1)
    assert idx_ops > 0 and reuse < one
    got = c.pass_time(Pass(ranks, verify=6, drafts=True)).parts["draft passes (MTP layer)"][0]
    assert got == pytest.approx(extend + one + 3 * reuse, rel=1e-9)
    assert d.pass_time(Pass(ranks, skip_indexer=True)).total_s[0] == pytest.approx(reuse, rel=1e-9)
    # GLM-5.1 has no such key: every draft pass runs the indexer; and the verify pass never skips it
    off = dataclasses.replace(sc.model, mtp_index_share=False)
    c_off = CostModel(off, sc.gpu, sc.deployment, sc.params, sc.terms, spec=spec)
    assert c_off.pass_time(Pass(ranks, verify=6, drafts=True)).parts["draft passes (MTP layer)"][0] == \
        pytest.approx(extend + 4 * one, rel=1e-9)


def test_the_draft_topk_reuse_reaches_the_simulated_tpot():
    """The same one-request run of GLM-5.2 with and without the draft's top-k reuse: the TPOT falls by
    the 3 indexer passes saved per step over the tokens each step keeps."""
    spec = parse_speculative("eagle:5-1-6", 3.0, "match-expected")
    sc = load_scenario(model="glm-5.2-fp8", deployment="8xh200-tp8-glm52-low-latency", speculative=spec)
    sc = sc.replace(workload=dataclasses.replace(sc.workload, input_tokens=4000, output_tokens=31,
                                                 requests_per_client=1, length_jitter=0.0))
    on = simulate(sc, "baseline", concurrency=1)
    off = simulate(sc.replace(model=dataclasses.replace(sc.model, mtp_index_share=False)), "baseline", concurrency=1)
    assert on.tpot_mean_ms < off.tpot_mean_ms
    c = sc.cost_model(spec=spec)
    d = c.draft
    ranks = (RankWork(1, 4001.0),)
    saved = d.pass_time(Pass(ranks)).total_s[0] - d.pass_time(Pass(ranks, skip_indexer=True)).total_s[0]
    assert (off.tpot_mean_ms - on.tpot_mean_ms) == pytest.approx(3 * saved / 3 * 1e3, rel=0.05)


# -- the serving model ----------------------------------------------------------------------------
def test_tokens_per_step_and_tpot_by_hand():
    """One request, TP8, accept length fixed at 3 (match-expected of an integer): 31 output tokens
    are the prefill's first and 10 steps of 3; TPOT = the 10 steps' time / 30, each step a verify
    over 6 positions plus the draft passes at the context the previous steps reached."""
    spec = parse_speculative("eagle:5-1-6", 3.0, "match-expected")
    sc = load_scenario(deployment="8xh200-tp8", speculative=spec)
    sc = sc.replace(workload=dataclasses.replace(sc.workload, input_tokens=4000, output_tokens=31,
                                                 requests_per_client=1, length_jitter=0.0))
    r = simulate(sc, "baseline", concurrency=1)
    c = sc.cost_model(spec=spec)
    steps = [float(c.pass_time(Pass((RankWork(1, 4000 + 1 + 3 * i),), verify=6, accepted=3.0, drafts=True))
                   .total_s[0]) for i in range(10)]
    assert r.tpot_mean_ms == pytest.approx(sum(steps) / 30 * 1e3, rel=1e-9)
    assert r.step_ms_mean == pytest.approx(np.mean(steps) * 1e3, rel=1e-9)
    # the same run without speculative decoding: 30 one-token steps
    plain = simulate(sc.replace(speculative=None), "baseline", concurrency=1)
    assert plain.tpot_mean_ms > r.tpot_mean_ms


def test_multinomial_steps_keep_their_draws():
    """Seeded: two runs agree, and the tokens each rank keeps are its draws (capped at the output)."""
    spec = parse_speculative("eagle:3-1-4", 2.5)
    sc = load_scenario(deployment="8xh200-tp8", speculative=spec)
    sc = sc.replace(workload=dataclasses.replace(sc.workload, input_tokens=2000, output_tokens=200,
                                                 requests_per_client=2, length_jitter=0.0))
    a = simulate(sc, "baseline", concurrency=3, seed=3)
    b = simulate(sc, "baseline", concurrency=3, seed=3)
    assert a.tpot_mean_ms == b.tpot_mean_ms and a.requests == 6
    sim = InstanceSim(sc, "baseline", concurrency=1, seed=0)
    k = sim.ranks[0]
    want = sim._accepts(k, 10).copy()
    assert sim._take(k, 4).tolist() == want[:4].tolist()
    assert sim._accepts(k, 6).tolist() == want[4:].tolist()


def test_speculative_caps_running_at_48_and_checks_draft_memory():
    spec = parse_speculative("eagle:5-1-6", 3.5)
    sc = load_scenario(deployment="8xh200-tp8-glm52-low-latency", model="glm-5.2-fp8")
    assert plan_memory(sc.model, sc.gpu, sc.deployment, None, spec=spec).max_running == 48
    assert plan_memory(sc.model, sc.gpu, sc.deployment, None).max_running > 48
    # the draft's weights are resident when the KV budget is measured (SGLang PR #28855): a static fraction that
    # leaves the target a pool but not the draft's weights as well has no room for a pool
    from simulator.serving.memory import draft_resident_bytes, weights_per_gpu

    w, d = weights_per_gpu(sc.model, sc.deployment), draft_resident_bytes(sc.model, sc.deployment, spec)
    tight = dataclasses.replace(sc.deployment, mem_fraction_static=(w + d / 2) / sc.gpu.free_before_load)
    plan_memory(sc.model, sc.gpu, tight, None)  # without speculative decoding it fits
    with pytest.raises(HisparseError, match="and the draft model"):
        plan_memory(sc.model, sc.gpu, tight, None, spec=spec)


# -- HiSparse: misses deduped across the verify positions ------------------------------------------
def test_multi_step_commit_dedupes_misses_by_hand():
    """Empty buffer of 8 slots, k 3, two trace steps per commit (a verify over 2 positions).
    Commit 1 (steps 0, 1): {10, 11, 12} and {11, 12, 13}: 4 unique misses, not 6; counted at their
    first step: 3, 1. Commit 2 (steps 2, 3): {20, 21, 10} and {21, 22, 13}: 10 and 13 are resident
    (4 + 3 <= 8: nothing evicted), misses 20, 21, 22: 2, 1."""
    idx = np.array([[10, 11, 12], [11, 12, 13], [20, 21, 10], [21, 22, 13]], dtype=np.int32)
    s = Stream(0, 0, np.array([100, 101, 102, 103], dtype=np.int64), idx)
    cfg = ReplayConfig(policy="sglang-clock", buffer=8, initial="empty", mtp_steps=2)
    misses = replay(s, cfg, per_step=True, k=3).streams[0].misses
    assert misses.tolist() == [3, 1, 2, 1]
    # a speculative step that moves over 2 trace steps is charged each commit's union
    assert np.add.reduceat(misses, [0, 2]).tolist() == [4, 3]


def test_serving_charges_the_union_per_step():
    """The serving model charges a step keeping a tokens the trace steps it moves over: over a
    request the charged shares are the profile's own (nothing counted twice or lost)."""
    from simulator.serving.misses import MissProfiles

    spec = parse_speculative("eagle:3-1-4", 2.0, "match-expected")
    sc = load_scenario(speculative=spec)
    sc = sc.replace(workload=dataclasses.replace(sc.workload, input_tokens=6000, output_tokens=41,
                                                 requests_per_client=1, length_jitter=0.0))
    shares = np.linspace(0.05, 0.4, 60)
    prof = MissProfiles((shares,), "hand-made", (), 2048, 4096, 6000)
    r = simulate(sc, "hisparse", concurrency=1, profiles=prof)
    # 40 decode tokens in 20 steps of 2: the charged misses are the first 40 trace steps' shares
    assert r.miss_share * 20 == pytest.approx(shares[:40].sum(), rel=1e-9)


# -- the CLI --------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv, names", [
    (["plan", "--speculative", "eagle:5-6"], ["--speculative", "eagle:5-6"]),
    (["plan", "--accept-len", "2"], ["--accept-len", "--speculative"]),
    (["plan", "--speculative", "eagle:1-1-2"], ["--accept-len"]),
    (["plan", "--speculative", "eagle:1-1-2", "--accept-len", "4"], ["accept_len"]),
    (["plan", "--validate", "all", "--speculative", "eagle:1-1-2"], ["--speculative"]),
])
def test_cli_errors(argv, names, capsys):
    code, _, err = run_cli(argv, capsys)
    assert_clean_error(code, err, *names)


@pytest.mark.parametrize("body, says", [
    ('accept_probs = [0.5, "a"]', "accept_probs = [0.5, 'a'] must be a list of numbers"),
    ("accept_probs = 0.5", "accept_probs = 0.5 must be a list of numbers"),
    ("accept_probs = [[0.5], 0.5]", "must be a list of numbers"),
    ("accept_probs = {a = 1}", "must be a list of numbers"),
    ("accept_len = [2]", "accept_len = [2] must be a number"),
    ("accept_len = true", "accept_len = True must be a number"),
    ("", "give the acceptance: accept_len (SGLANG_SIMULATE_ACC_LEN) or accept_probs"),  # ran at accept_len 1
])
def test_a_speculative_file_with_a_bad_acceptance_is_one_line(tmp_path, capsys, body, says):
    """A --speculative TOML file whose acceptance is mistyped (a float() / tuple() traceback, exit 1) or missing (it
    ran at accept_len 1, where the command line refuses the same): exit 2 naming the file and key."""
    path = tmp_path / "s.toml"
    path.write_text(f'[speculative]\nspeculative = "eagle:1-1-2"\n{body}\n')
    code, _, err = run_cli(["plan", "--speculative", str(path), "--concurrency", "1", "--no-search"], capsys)
    assert_clean_error(code, err, str(path), says)


def test_a_speculative_file_that_is_a_folder_or_a_fifo_is_named(tmp_path, capsys):
    """--speculative X.toml on a folder or a FIFO said "no such file": it says what it is, as the other options do."""
    import os

    (tmp_path / "d.toml").mkdir()
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "f.toml").symlink_to(tmp_path / "fifo")
    for name, says in (("d.toml", "is a folder; give a file"), ("f.toml", "is a named pipe (FIFO)")):
        code, _, err = run_cli(["plan", "--speculative", str(tmp_path / name), "--concurrency", "1"], capsys)
        assert_clean_error(code, err, name, says)


def test_accept_method_option_applies_to_a_speculative_file(tmp_path):
    """--accept-method beside a --speculative file sets how its accept_len is drawn (it was dropped: the file's
    multinomial default stood); beside a file giving accept_probs it is refused."""
    path = tmp_path / "s.toml"
    path.write_text('[speculative]\nspeculative = "eagle:1-1-2"\naccept_len = 2\n')
    assert parse_speculative(str(path)).accept_method.value == "multinomial"
    assert parse_speculative(str(path), method="match-expected").accept_method.value == "match-expected"
    path.write_text('[speculative]\nspeculative = "eagle:1-1-2"\naccept_probs = [0.5, 0.5]\n')
    with pytest.raises(HisparseError, match="gives accept_probs"):
        parse_speculative(str(path), method="match-expected")


@pytest.mark.slow
def test_plan_answers_does_mtp_pay_off(tmp_path, capsys):
    code, out, err = run_cli(["plan", "--deployment", "8xh200-tp8", "--concurrency", "1,4", "--speculative",
                              "eagle:5-1-6", "--accept-len", "3.5", "--compare-speculative", "--no-search", "--quiet",
                              "--json"], capsys)
    assert code == 0, err
    import json

    rep = json.loads(out)
    specs = {r["speculative"] for r in rep["rows"]}
    assert specs == {"off", "eagle 5-1-6"}
    base = rep["speculative_whatif"]["systems"]["baseline"]
    assert base["verdict"] in ("pays off", "loses", "tie")
    assert [p["load"] for p in base["points"]] == [1, 4]
    on = {r["concurrency"]: r for r in rep["rows"] if r["system"] == "baseline" and r["speculative"] != "off"}
    off = {r["concurrency"]: r for r in rep["rows"] if r["system"] == "baseline" and r["speculative"] == "off"}
    assert base["points"][0]["throughput_ratio"] == pytest.approx(
        on[1]["steady_tok_s_deployment"] / off[1]["steady_tok_s_deployment"])


def test_a_speculative_file(tmp_path):
    f = tmp_path / "spec.toml"
    f.write_text('[speculative]\nspeculative = "eagle:5-1-6"\naccept_len = 3.5\naccept_method = "match-expected"\n')
    s = parse_speculative(str(f))
    assert (s.num_steps, s.num_draft_tokens, s.accept_len, s.accept_method.value) == (5, 6, 3.5, "match-expected")
    assert parse_speculative(str(f), 2.5).accept_len == 2.5  # the option replaces the file's acceptance
    f.write_text('[speculative]\nspeculative = "eagle:5-1-6"\naccept_len = 3.5\nbogus = 1\n')
    with pytest.raises(HisparseError, match="bogus"):
        parse_speculative(str(f))


def test_whatif_verdict_by_hand():
    """Rows of one system with and without speculative decoding: per-load throughput ratios, the best
    under the targets and the verdict against the model's error band."""
    from simulator.serving.spec_whatif import compare, summary_lines

    def row(spec, conc, tok, tpot):
        return {"system": "baseline", "speculative": spec, "concurrency": conc, "rate_per_s": 0.0,
                "device_buffer_size": None, "host_to_device_ratio": None, "steady_tok_s_deployment": tok,
                "tpot_p99_ms": tpot, "ttft_p99_s": 1.0, "overloaded": False, "searched": False}

    rows = [row("off", 1, 100, 20), row("off", 8, 500, 60), row("eagle 1-1-2", 1, 180, 12),
            row("eagle 1-1-2", 8, 520, 130)]
    out = compare(rows, slo_tpot_ms=100, slo_ttft_s=None, band=0.1)["systems"]["baseline"]
    assert [p["throughput_ratio"] for p in out["points"]] == pytest.approx([1.8, 1.04])
    # under TPOT 100 ms: with it only concurrency 1 passes (180), without it concurrency 8 (500)
    assert out["best_on"]["concurrency"] == 1 and out["best_off"]["concurrency"] == 8
    assert out["gain"] == pytest.approx(180 / 500) and out["verdict"] == "loses"
    assert compare(rows, slo_tpot_ms=200, slo_ttft_s=None, band=0.1)["systems"]["baseline"]["verdict"] == "tie"
    assert "LOSES" in summary_lines({"band": 0.1, "systems": {"baseline": out}})[0]


def test_equal_acceptance_probabilities_are_a_distribution(capsys):
    """--accept-probs 0.5,0.5 (accept 1 or 2 tokens, evenly) was refused: '0.5 is given twice'."""
    from simulator.cli import build_parser

    args = build_parser().parse_args(["plan", "--speculative", "eagle:1-1-2", "--accept-probs", "0.5,0.5"])
    assert args.accept_probs == [0.5, 0.5]
    assert parse_speculative("eagle:1-1-2", accept_probs=tuple(args.accept_probs)).accept_probs == (0.5, 0.5)


def _passes_of_a_text_burst(monkeypatch, unmixed: bool | None) -> list:
    """The passes priced while eight clients' text prompts reach an 8-rank DP-attention instance one
    tokenized prompt at a time (DP0 prefills alone first, then decodes while the others prefill), with
    EAGLE 1-1-2; ``unmixed`` None keeps the model's rule, a bool forces it."""
    spec = parse_speculative("eagle:1-1-2", 2.0)
    sc = load_scenario(model="glm-5.1-fp8", deployment="8xh200-colocated-dp8", speculative=spec)
    w = dataclasses.replace(sc.workload, input_tokens=4096, output_tokens=16, requests_per_client=1,
                            length_jitter=0.0, tokenize_prompt=False)
    sim = InstanceSim(sc.replace(workload=w), "baseline", concurrency=8, seed=0)
    if unmixed is not None:
        monkeypatch.setattr(InstanceSim, "_spec_unmixed", property(lambda self: unmixed))
    seen = []
    price = sim.cost.pass_time
    monkeypatch.setattr(sim.cost, "pass_time", lambda p: seen.append(p) or price(p))
    sim.run()
    assert len(sim.finished) == 8
    return seen


def test_speculative_dp_attention_never_mixes_prefill_and_decode(monkeypatch):
    """SGLang's get_next_batch_to_run with speculative decoding and DP attention: when any rank has a
    prefill batch the others run an idle batch, so no pass has one rank extending and another decoding.
    The same burst with mixing allowed (plain DP attention's rule) has such a pass."""
    def mixed(passes):
        return [p for p in passes if any(r.chunks for r in p.ranks) and any(r.decode for r in p.ranks)]

    assert not mixed(_passes_of_a_text_burst(monkeypatch, None))
    assert mixed(_passes_of_a_text_burst(monkeypatch, False))
