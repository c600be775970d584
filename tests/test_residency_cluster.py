"""Dynamic residency and deployments past one node (issue #26 items 4, 6 and 7's what-ifs): each
effect computed by hand on a small case."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from simulator.cli import main
from simulator.costmodel import Pass, RankWork
from simulator.costmodel.collectives import DEEPEP_LOW_LATENCY, deepep_time_s, expected_remote_nodes
from simulator.costmodel.passes import CostModel, dispatch_row_bytes
from simulator.serving import presets as P
from simulator.serving.cluster import deployment_for_nodes, kv_transfer, node_overrides
from simulator.serving.misses import miss_profiles, scenario_profiles
from simulator.serving.model import InstanceSim, System
from simulator.serving.pool import RankPool
from simulator.serving.residency import RESIDENCY_POLICIES, ResidencyManager
from simulator.serving.scenario import load_scenario
from simulator.serving.specs import KvTransfer
from simulator.serving.state import Rank, Request
from tests.fuzzing import run_cli

PAGE = 64
BUF = 256 + PAGE  # hot buffer slots (device_buffer_size 256 + the reserved page)


def _manager(policy: str, pool: RankPool, *, hbm_bw=4e12, link_bw=50e9, kv_bytes=1000, layers=2, row=500):
    return ResidencyManager(RESIDENCY_POLICIES[policy], PAGE, BUF, d2d_copy_s=lambda b: 2 * b / hbm_bw,
                            d2h_copy_s=lambda tokens: tokens * kv_bytes / link_bw,
                            hot_bytes=float(BUF * layers * row), pd=False)


def _running(k: Rank, res: ResidencyManager, rid: int, prompt: int, out: int = 1) -> Request:
    """A request whose prompt's pages the pool holds, placed as the model places it after prefill."""
    r = Request(rid, prompt, 100, profile=rid, arrival=0.0)
    r.generated = 1  # the prefill's token
    r.prefilled = r.target = prompt
    pages = -(-prompt // PAGE) * PAGE
    k.pool.free_device -= pages
    k.pool.free_host -= pages
    r.slots_device = r.slots_host = pages
    res.place(k, r)
    r.generated = out  # outputs so far (the retract order reads them); the test's pages stay the prompt's
    k.running.append(r)
    return r


def test_sglang_demotion_count_and_copy_cost_on_a_tiny_pool():
    # 2048 device slots; three 640-token prompts: the first two stay resident (1280 slots), the third
    # finds 768 free of its 640 -> resident too (1920 used, 128 free)
    pool = RankPool(PAGE, 2048, 8192, True)
    k = Rank(pool, 0.7)
    res = _manager("sglang-dynamic", pool)
    pool.reclaimable = lambda: res.rank_reclaimable(k)
    a, b, c = (_running(k, res, i, 640, out=o) for i, o in ((0, 5), (1, 3), (2, 9)))
    assert all(res.fully_resident(r) for r in (a, b, c)) and pool.free_device == 128
    # each resident request would free 640 - 320 = 320 slots; admission sees them as available
    assert pool.available() == min(128 + 3 * 320, 8192 - 1920)
    # a new prompt chunk of 512 tokens needs 512 slots: demote in retract order (fewest outputs first: b,
    # then a): 128 + 320 = 448 < 512, + 320 = 768 >= 512 -> two demotions
    res.reclaim(k, 512)
    assert res.demotions == 2 and not res.fully_resident(b) and not res.fully_resident(a) and res.fully_resident(c)
    assert pool.free_device == 128 + 2 * 320 and a.slots_device == b.slots_device == BUF
    assert b.buffer_since == b.generated - 1 and b.demotions == 1  # its hot buffer starts again
    # each demotion: one D2D copy of a hot buffer (320 slots x 2 layers x 500 B, read + write at 4e12 B/s)
    assert res.copy_s == pytest.approx(2 * (2 * 320 * 2 * 500 / 4e12))
    assert res.pending_s == res.copy_s
    assert [res.miss_scale(r) for r in (a, b, c)] == [1.0, 1.0, 0.0]


def test_vllm_spill_gives_back_pages_and_pays_the_write_back():
    pool = RankPool(PAGE, 2048, 8192, True)
    k = Rank(pool, 0.7)
    res = _manager("vllm-spill", pool)
    a = _running(k, res, 0, 1280, out=2)
    assert res.fully_resident(a) and pool.free_device == 768
    # need 1000 more: short 232 -> the first spill also takes a 320-slot hot buffer: spill ceil_page(232 + 320)
    # = 576 tokens, net 256 freed
    res.reclaim(k, 1000)
    assert a.resident_tokens == 1280 - 576 and a.hot and a.slots_device == 1280 - 576 + BUF
    assert pool.free_device == 768 + 576 - BUF == 1024
    assert res.spilled_tokens == 576 and res.demotions == 1
    assert res.copy_s == pytest.approx(576 * 1000 / 50e9)  # write-back of the spilled tokens' KV over the link
    assert res.miss_scale(a) == pytest.approx(1 - (1280 - 576) / a.context)


def test_swap_requests_and_resident_batches_price_no_swap_in():
    sc = load_scenario()
    cost = sc.cost_model()
    ctx = 8 * 36864.0
    missed = 8 * 0.13 * 2048 * sc.model.layers
    full = cost.pass_time(Pass((RankWork(8, ctx, missed),) * 8, True)).parts["swap-in"][0]
    one = cost.pass_time(Pass((RankWork(8, ctx, missed, swap_requests=1),) * 8, True)).parts["swap-in"][0]
    none = cost.pass_time(Pass((RankWork(8, ctx, 0.0, swap_requests=0),) * 8, True)).parts
    per_request = cost._pick_fp8(sc.params.swap_in_per_request_fp8_us, sc.params.swap_in_per_request_us)
    assert full - one == pytest.approx(7 * per_request * 1e-6 * sc.model.layers * (1 - sc.params.swap_in_overlap))
    assert "swap-in" not in none  # dual-path graphs: the resident batch runs without the swap-in


@pytest.fixture(scope="module")
def profiles():
    sc = load_scenario()
    return miss_profiles(sc.trace, top_k=2048, buffer=4096, policy="lru", initial="prefix")


def _sim(res: str, concurrency: int, profiles, **over) -> InstanceSim:
    sc = load_scenario(overrides=[f"hisparse.residency={res}", "workload.requests_per_client=1",
                                  "workload.output_tokens=512", *[f"{k}={v}" for k, v in over.items()]])
    sim = InstanceSim(sc, System.HISPARSE, concurrency=concurrency, profiles=profiles)
    sim.result = sim.run()
    return sim


def test_dynamic_residency_in_the_serving_model(profiles):
    low = {p: _sim(p, 8, profiles) for p in ("swap", "sglang-dynamic", "vllm-spill")}
    assert low["swap"].result.resident_share == 0 and low["swap"].res is None
    for p in ("sglang-dynamic", "vllm-spill"):  # one request per rank fits: every step resident, no swap-in
        r = low[p].result
        assert r.resident_share == 1.0 and r.demotions == 0 and r.miss_share == 0.0 and r.swap_share == 0.0
        assert r.tpot_p50_ms < low["swap"].result.tpot_p50_ms
        assert all(n == running for _, n, running in low[p].res.per_step)  # per step: all resident
    high = _sim("sglang-dynamic", 128, profiles)
    r = high.result
    assert 0 < r.resident_share < 1 and r.demotions > 0
    # the copy time is the demotions' (one hot buffer each) and scales with them
    per = 2 * high.plan.buffer_slots * high.m.layers * high.m.kv_row_bytes / high.sc.gpu.hbm_bw
    assert r.demotion_copy_ms == pytest.approx(high.res.demotions * per * 1e3)
    assert r.running_deployment >= _sim("swap", 128, profiles).result.running_deployment * 0.95  # no capacity lost


# -- across nodes -----------------------------------------------------------------------------------
def test_deepep_low_latency_reproduces_the_readme_and_scales_by_bytes():
    # README: 128 tokens per rank, hidden 7168, top-8, FP8 dispatch (7168 + 4 x 56 B), BF16 combine
    for p in DEEPEP_LOW_LATENCY:
        d = deepep_time_s("dispatch", "low_latency", p.ep, 128 * 8 * dispatch_row_bytes(7168))
        c = deepep_time_s("combine", "low_latency", p.ep, 128 * 8 * 7168 * 2)
        assert d * 1e6 == pytest.approx(p.dispatch_us, rel=0.04), p
        assert c * 1e6 == pytest.approx(p.combine_us, rel=0.04), p
    # half the NIC: twice the time; tiny messages: the floor
    assert deepep_time_s("dispatch", "low_latency", 16, 1e6, nic_bw=25e9) == pytest.approx(1e6 / (63e9 / 2))
    assert deepep_time_s("dispatch", "low_latency", 16, 10.0, floor_s=4e-6) == 4e-6
    assert expected_remote_nodes(2, 8) == pytest.approx(1 - 0.5 ** 8)


def test_deepep_internode_time_in_the_cost_model():
    sc = load_scenario(deployment="16x8xh200-pd-dp64-wide-ep", hisparse="wide-ep-h200")
    m, cl = sc.model, sc.cluster
    cost = CostModel(m, sc.gpu, sc.deployment, sc.params, sc.terms, cluster=cl)
    tokens = 64 * 16  # 16 decode requests per rank
    hidden, k = m.hidden_size, m.experts_per_token
    by_hand = (max(16 * k * (hidden + 4 * hidden // 128) / 43e9, 4e-6)  # EP64 low-latency dispatch, 43 GB/s
               + max(16 * k * hidden * 2 / 46e9, 4e-6))  # combine, 46 GB/s
    assert cost.comm_layer(16, tokens, padded=16) == pytest.approx(by_hand)
    # prefill passes: the normal kernels, a token once per remote node (8 nodes)
    remote = 7 * (1 - (7 / 8) ** k)
    prefill = 8192 * remote * ((hidden + 4 * hidden // 128) / 51e9 + hidden * 2 / 50e9)
    assert cost.comm_layer(8192, 64 * 8192) == pytest.approx(prefill)
    assert "DeepEP" in next(t["source"] for t in cost.term_sources() if t["term"] == "collectives")


def test_kv_transfer_time_and_its_overlap_by_hand():
    sc = load_scenario(deployment="16x8xh200-pd-dp64-wide-ep", hisparse="wide-ep-h200")
    m, cl = sc.model, sc.cluster
    tokens = 32768
    nbytes = tokens * (m.layers * (m.kv_row_bytes + m.indexer_row_bytes))
    whole = 2e-6 + nbytes / 50e9
    w = kv_transfer(m, tokens, 3.0, KvTransfer.WHOLE_REQUEST, cl)
    assert w.total_s == pytest.approx(whole) and w.exposed_s == w.total_s
    lw = kv_transfer(m, tokens, 3.0, KvTransfer.LAYER_WISE, cl)  # a 3 s prefill hides all but the last layer
    assert lw.exposed_s == pytest.approx(whole / m.layers)
    short = kv_transfer(m, tokens, 0.01, KvTransfer.LAYER_WISE, cl)  # a prefill shorter than the transfer
    assert short.exposed_s == pytest.approx(whole - 0.01 * (m.layers - 1) / m.layers)
    assert kv_transfer(m, tokens, 3.0, KvTransfer.NONE, cl).total_s == 0.0
    # HiSparse writes into pinned host memory: the slower of the NIC and the host link
    assert kv_transfer(m, tokens, 0.0, KvTransfer.WHOLE_REQUEST, cl, host_link_bw=25e9).total_s == pytest.approx(
        2e-6 + nbytes / 25e9)


def test_kv_transfer_adds_its_exposed_time_to_ttft(profiles):
    def ttft(mode: str) -> tuple[float, float]:
        sc = load_scenario(deployment="16x8xh200-pd-dp64-wide-ep", hisparse="wide-ep-h200",
                           overrides=[f"deployment.kv_transfer={mode}", "workload.requests_per_client=1",
                                      "workload.output_tokens=64"])
        sim = InstanceSim(sc, System.BASELINE, concurrency=1)
        r = sim.run()
        return r.ttft_p50_s, r.kv_transfer_exposed_ms
    base, _ = ttft("none")
    whole, exposed = ttft("whole-request")
    assert exposed > 0 and whole - base == pytest.approx(exposed / 1e3, rel=1e-6)
    layer, exposed_lw = ttft("layer-wise")
    assert exposed_lw < exposed and layer - base == pytest.approx(exposed_lw / 1e3, rel=1e-6)


def test_tp_across_nodes_is_refused_and_wide_ep_needs_a_cluster(tmp_path, capsys):
    text = (P.PRESET_DIR / "deployments" / "16x8xh200-pd-dp64-wide-ep.toml").read_text()
    tp_moe = tmp_path / "tp.toml"
    tp_moe.write_text(text.replace('moe = "ep"', 'moe = "tp"'))
    code, _, err = run_cli(["plan", "--deployment", str(tp_moe), "--hisparse-config", "wide-ep-h200"], capsys)
    assert code == 2 and "Traceback" not in err and "tensor parallelism stays inside a node" in err and str(tp_moe) in err
    no_cluster = tmp_path / "nc.toml"
    no_cluster.write_text(text.replace('cluster = "16x8xh200-ib-ndr"', ""))
    code, _, err = run_cli(["plan", "--deployment", str(no_cluster), "--hisparse-config", "wide-ep-h200"], capsys)
    assert code == 2 and "cluster preset" in err and "Traceback" not in err
    allowed = tmp_path / "cl.toml"
    allowed.write_text((P.PRESET_DIR / "clusters" / "16x8xh200-ib-ndr.toml").read_text().replace(
        "cross_node_tp = false", "cross_node_tp = true"))
    dep = tmp_path / "ok.toml"
    dep.write_text(text.replace('moe = "ep"', 'moe = "tp"').replace('"16x8xh200-ib-ndr"', json.dumps(str(allowed))))
    sc = load_scenario(deployment=str(dep), hisparse="wide-ep-h200")  # allowed: priced over the NIC ring
    cost = sc.cost_model()
    assert cost._collective("all_reduce", 64, 1e6) > sc.gpu.interconnect.time_s("all_reduce", 8, 1e6)


def test_deployment_for_nodes():
    d = P.load("deployments", "8xh200-colocated-dp8-ep8")
    cl = P.load("clusters", "2x8xh200-ib-ndr")
    wide = deployment_for_nodes(d, cl, 2)
    assert (wide.gpus, wide.tp, wide.dp, wide.moe.value, wide.cluster) == (16, 16, 16, "ep", cl.name)
    assert wide.max_running_requests == 960  # 60 per rank kept
    one = P.load("deployments", "8xh200-colocated-dp8")
    reps = deployment_for_nodes(one, cl, 2)
    # each replica is the same server: its own --max-running-requests 480, 60 per scheduler (was 960 and 120)
    assert (reps.gpus, reps.tp, reps.instances, reps.max_running_requests) == (16, 8, 2, one.max_running_requests)
    from simulator.serving.memory import plan_memory

    sc = load_scenario(deployment="8xh200-colocated-dp8")
    caps = [plan_memory(sc.model, sc.gpu, dep, None).max_running for dep in (one, reps)]
    assert caps[0] == caps[1] == one.max_running_requests // one.dp
    assert node_overrides(d, cl, 1) == ("deployment.cluster=2x8xh200-ib-ndr",)
    assert "deployment.tp=16" in node_overrides(d, cl, 2)
    pd = P.load("deployments", "16x8xh200-pd-dp64-wide-ep")
    half = deployment_for_nodes(pd, P.load("clusters", "16x8xh200-ib-ndr"), 4)
    assert (half.gpus, half.prefill_gpus) == (32, 32)


def test_plan_residency_whatif(capsys):
    code = main(["plan", "--residency", "swap,sglang-dynamic", "--concurrency", "2", "--no-search", "--json", "--quiet",
                 "--set", "workload.requests_per_client=1", "--set", "workload.output_tokens=256"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    summary = out["recommendation"]["residency"]
    assert summary["policies"] == ["swap", "sglang-dynamic"]
    rows = {r["residency"]: r for r in out["rows"] if r["system"] == "hisparse"}
    assert rows["sglang-dynamic"]["resident_share"] == 1.0 and rows["swap"]["resident_share"] == 0.0
    assert rows["sglang-dynamic"]["tpot_p50_ms"] < rows["swap"]["tpot_p50_ms"]
    code, _, err = run_cli(["plan", "--residency", "swap,bogus"], capsys)
    assert code == 2 and "bogus" in err and "sglang-dynamic" in err


def test_plan_nodes_needs_a_cluster(capsys):
    code, _, err = run_cli(["plan", "--nodes", "1,2"], capsys)
    assert code == 2 and "--cluster" in err and "Traceback" not in err
    code, _, err = run_cli(["plan", "--nodes", "1,3", "--cluster", "2x8xh200-ib-ndr"], capsys)
    assert code == 2 and "2 nodes" in err


def test_plan_nodes_whatif(capsys, tmp_path):
    code = main(["plan", "--deployment", "8xh200-colocated-dp8-ep8", "--nodes", "1,2", "--cluster", "2x8xh200-ib-ndr",
                 "--set", "hisparse.host_to_device_ratio=4", "--concurrency", "16", "--no-search", "--json", "--quiet",
                 "--set", "workload.requests_per_client=1", "--set", "workload.output_tokens=256",
                 "--out", str(tmp_path / "o")])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    nodes = out["recommendation"]["nodes"]
    assert nodes["nodes"] == [1, 2] and nodes["gpus"] == {"1": 8, "2": 16}
    assert {r["nodes"] for r in out["rows"]} == {1, 2}
    assert nodes["choice"] in (1, 2) and (tmp_path / "o" / "throughput.png").stat().st_size > 0
    assert not math.isnan(nodes["per_gpu"][str(nodes["choice"])])


def test_cluster_presets_load_and_name_their_sources():
    for name in P.preset_names("clusters"):
        cl = P.load("clusters", name)
        assert cl.gpus == cl.nodes * cl.gpus_per_node
        assert {"nic_bw", "nic_latency_us"} <= set(cl.sources)
    with pytest.raises(Exception, match="nic_bw"):
        P.build(P.KINDS["clusters"], {**dataclasses.asdict(P.load("clusters", "2x8xh200-roce")), "nic_bw": 0}, "<x>")


def test_node_layout_is_the_searchable_unit():
    from simulator.serving.cluster import NodeLayout

    pd = P.load("deployments", "16x8xh200-pd-dp64-wide-ep")
    cl = P.load("clusters", "16x8xh200-ib-ndr")
    spec = NodeLayout(nodes=6, prefill_nodes=2)
    d = spec.deployment(pd, cl)
    assert (d.gpus, d.tp, d.dp, d.prefill_gpus) == (48, 48, 48, 16)
    sc = load_scenario(deployment="16x8xh200-pd-dp64-wide-ep", hisparse="wide-ep-h200", overrides=spec.overrides(pd, cl))
    assert sc.deployment.gpus == 48 and sc.deployment.prefill_gpus == 16
    with pytest.raises(Exception, match="more than cluster"):
        load_scenario(deployment="16x8xh200-pd-dp64-wide-ep", hisparse="wide-ep-h200",
                      overrides=NodeLayout(nodes=12, prefill_nodes=8).overrides(pd, cl))


def test_a_request_placed_again_starts_in_swap_mode_unless_it_fits():
    pool = RankPool(PAGE, 1024, 8192, True)
    k = Rank(pool, 0.7)
    res = _manager("sglang-dynamic", pool)
    a = _running(k, res, 0, 640)
    assert res.fully_resident(a)
    pool.release(a)  # retracted: its slots freed; it comes back with a hot buffer only
    k.running.remove(a)
    a.slots_device = BUF  # it takes its buffer back; others fill the device but for 100 slots
    pool.free_device = 100
    res.place(k, a)
    assert not res.fully_resident(a) and res.miss_scale(a) == 1.0 and a.slots_device == BUF


@pytest.mark.parametrize("deployment", P.preset_names("deployments"))
def test_dynamic_residency_runs_on_every_shipped_deployment(deployment, profiles):
    hs = "wide-ep-h200" if "wide-ep" in deployment else "blog-8xh200"
    model = "glm-5.1-fp8"
    for dsv4 in ("deepseek-v4-flash", "deepseek-v4-pro"):  # the DeepSeek-V4 recipes' deployments: their own model
        if dsv4.replace("deepseek-v4", "dsv4") in deployment:
            model = hs = dsv4
    if "rtx-pro-6000" in deployment:  # PR #33075's SM120 decode side: GLM-5.1-FP8 does not fit 8 x 96 GB
        model, hs = "glm-5.1-nvfp4", "pr33075-sm120"
    for res in ("sglang-dynamic", "vllm-spill"):
        sc = load_scenario(model=model, deployment=deployment, hisparse=hs, overrides=[
            f"hisparse.residency={res}", "workload.requests_per_client=1", "workload.output_tokens=128"])
        own = profiles if model == "glm-5.1-fp8" else scenario_profiles(sc, sc.hisparse, "prefix")
        r = InstanceSim(sc, System.HISPARSE, concurrency=8, profiles=own).run()
        assert r.residency == res and 0.0 <= r.resident_share <= 1.0 and r.requests == 8
