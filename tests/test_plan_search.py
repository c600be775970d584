"""``hisparse plan --search`` (issue #29 item 2): the layouts it generates, the dominance pruning,
the ladder's next load, the Pareto frontier, the CLI's refusals, and one search end to end."""

from __future__ import annotations

import json

import pytest

from simulator.cli import main
from simulator.serving import search as S
from simulator.serving.scenario import load_scenario
from simulator.serving.specs import Attention, MoeLayout


def test_layouts_cover_tp_dp_attention_and_ep_and_refuse_past_the_nvlink_domain():
    sc = load_scenario()
    out = list(S.same_gpus_layouts(sc))
    deps = [d for d in out if not isinstance(d, S.Infeasible)]
    keys = {(d.tp, d.dp, d.attention, d.moe) for d in deps}
    assert len(keys) == len(deps)  # no layout twice
    assert (8, 8, Attention.DP, MoeLayout.TP) in keys and (8, 8, Attention.DP, MoeLayout.EP) in keys
    assert (8, 1, Attention.TP, MoeLayout.TP) in keys and (4, 2, Attention.DP, MoeLayout.EP) in keys
    dp4 = next(d for d in deps if (d.tp, d.dp, d.attention) == (8, 4, Attention.DP))
    assert dp4.prefill_chunk_tokens == sc.deployment.prefill_chunk_tokens * 8 // 4  # 65536 // dp, as SGLang divides
    assert all(d.gpus == sc.deployment.gpus for d in deps)


def _cfg(cap: int, miss: float) -> S.Config:
    sc = load_scenario()
    return S.Config(sc.deployment, "hisparse", sc.hisparse, capacity=cap, miss=miss)


def test_a_knob_set_holding_no_more_and_missing_no_less_is_dominated():
    a, b, c, d = _cfg(100, 0.10), _cfg(120, 0.10), _cfg(80, 0.05), _cfg(100, 0.20)
    dom = S._dominated([a, b, c, d])
    assert dom == {0: b, 3: b}  # a: fewer held, same misses; d: both worse; c is the only one missing 5%
    first, twin = _cfg(10, 0.1), _cfg(10, 0.1)
    assert S._dominated([first, twin]) == {1: first}  # equal sets: the first is kept


def test_the_ladder_steps_x4_or_to_the_projected_target():
    inp = S.SearchInputs(slo_tpot_ms=100, slo_ttft_s=30)
    assert S._next_load(8, {"tpot_p99_ms": 20.0, "ttft_p99_s": 2.0}, inp, 1000) == 32  # far from both targets
    # TTFT 20 s at 8 clients: 30 s projected at 12; 1.5 x that
    assert S._next_load(8, {"tpot_p99_ms": 20.0, "ttft_p99_s": 20.0}, inp, 1000) == 18
    assert S._next_load(8, {"tpot_p99_ms": 20.0, "ttft_p99_s": 2.0}, inp, 20) == 20  # never past what it holds
    assert S._next_load(8, {"tpot_p99_ms": 99.0, "ttft_p99_s": 29.9}, inp, 1000) == 13  # still one client more at least


def _result(points: list[dict]) -> S.SearchResult:
    sc = load_scenario()
    cfg = S.Config(sc.deployment, "baseline", None, points=points)
    return S.SearchResult(sc, S.SearchInputs(), (cfg,), (), (), 0.0, len(points))


def _p(user: float, gpu: float, ttft: float = 1.0, over: bool = False, c: int = 1) -> dict:
    return {"tok_s_per_user": user, "steady_tok_s_per_gpu": gpu, "ttft_p99_s": ttft, "overloaded": over,
            "config": "x", "concurrency": c, "tpot_p99_ms": 1e3 / user if user else 0.0}


def test_the_frontier_keeps_only_points_no_other_beats_on_both_axes():
    pts = [_p(40, 10), _p(30, 30), _p(35, 20), _p(30, 25), _p(20, 50), _p(25, 20), _p(10, 90, ttft=99.0),
           _p(15, 60, over=True)]
    fr = _result(pts).frontier()
    assert [(f["tok_s_per_user"], f["tok_s_per_gpu"]) for f in fr] == [(40, 10), (35, 20), (30, 30), (20, 50)]
    for a, b in zip(fr, fr[1:], strict=False):
        assert a["tok_s_per_user"] > b["tok_s_per_user"] and a["tok_s_per_gpu"] < b["tok_s_per_gpu"]


@pytest.mark.parametrize("args, message", [
    (["--search", "--concurrency", "8"], "--search picks its own loads"),
    (["--search", "--sweep-buffer", "4096"], "--search picks its own loads"),
    (["--search-top", "3"], "only with --search"),
    (["--search", "--search-policy", "nosuch"], "--search-policy nosuch: unknown policy"),
    (["--search", "--search-policy", "lru,lru"], "lru is given twice"),  # searched twice, before
    (["--search", "--search-policy", "lru,,fifo"], "give at least one policy"),  # the empty item was dropped
    (["--search", "--price-gpu-hour", "3"], "--search picks its own loads"),
])
def test_search_options_are_checked(capsys, args, message):
    assert main(["plan", "--quiet", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    import contextlib
    import io

    tmp = tmp_path_factory.mktemp("search")
    out, page = tmp / "s", tmp / "s.html"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["plan", "--search", "--search-buffer", "4096,8192", "--search-host-ratio", "4,8",
                     "--search-policy", "lru", "--json", "--quiet", "--out", str(out), "--report", str(page)]) == 0
    return json.loads(buf.getvalue()), out, page


@pytest.mark.slow
def test_search_end_to_end(searched, capsys):
    """A reduced search: a ranked table best first, the scenario's own layout found where the plan
    finds it, the infeasible layouts listed with SGLang's memory error, a Pareto frontier, files."""
    rep, out, page = searched
    ranked = rep["ranked"]
    assert ranked and [r["rank"] for r in ranked] == list(range(1, len(ranked) + 1))
    assert all(a["tok_s_per_gpu"] >= b["tok_s_per_gpu"] for a, b in zip(ranked, ranked[1:], strict=False))
    assert len({r["deployment"] for r in ranked}) >= 2 and {r["system"] for r in ranked} == {"baseline", "hisparse"}
    for r in ranked:
        assert r["tpot_p99_ms"] <= 100 and r["ttft_p99_s"] <= 30 and r["band"] is not None
    tp4 = [i for i in rep["infeasible"] if "tp4" in i["label"]]
    assert tp4 and all("no room for a KV pool" in i["reason"] for i in tp4)
    fr = rep["frontier"]
    assert len(fr) >= 2
    assert all(a["tok_s_per_user"] > b["tok_s_per_user"] and a["tok_s_per_gpu"] < b["tok_s_per_gpu"]
               for a, b in zip(fr, fr[1:], strict=False))
    # the scenario's own layout: the same answer as hisparse plan's bisection gives (same rule, same points)
    assert main(["plan", "--json", "--quiet"]) == 0
    plan = json.loads(capsys.readouterr().out)
    found = plan["recommendation"]["baseline"]["concurrency"]  # bisected between swept loads
    own = next(r for r in rep["points"] if r["config"].endswith("tp8-dp8-attn-moe-tp baseline")
               and r["concurrency"] == found)
    assert own["steady_tok_s_deployment"] == pytest.approx(plan["recommendation"]["baseline"]["steady_tok_s_deployment"])
    best = rep["best"]
    assert best == ranked[0]
    if best["moe"] == "ep":
        assert "--ep-size" in rep["launch"]["command"]
    for name in ("search.csv", "frontier.csv", "search.json", "frontier.png", "launch.sh"):
        assert (out / name).is_file()
    text = page.read_text()
    assert "<script src" not in text and text.count("<script") == 3 and "id='ranked'" in text
    assert f"{best['tok_s_per_gpu']:.1f}" in text


@pytest.mark.slow
def test_search_report_in_a_headless_browser(searched):
    """The search page loads offline with no console error, draws the frontier (every point, the
    Pareto line, the best) as SVG, and shows the JSON's numbers."""
    import shutil
    import tempfile

    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("chromium is not installed (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    from simulator.report.html import fmt
    from simulator.report.search_html import RANKED
    from tests.browser import GUARD_MS

    rep, _, page_file = searched
    args = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--no-first-run"]
    with sync_playwright() as pw, tempfile.TemporaryDirectory() as profile:
        ctx = pw.chromium.launch_persistent_context(profile, executable_path=chromium, headless=True, args=args,
                                                    timeout=GUARD_MS)
        try:
            ctx.set_default_timeout(GUARD_MS)
            page = ctx.new_page()
            errors, remote = [], []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.route("**/*", lambda r: r.continue_() if r.request.url.startswith("file://")
                       else (remote.append(r.request.url), r.abort()))
            page.goto(page_file.as_uri())
            page.wait_for_selector("#plot-frontier .main-svg")
            assert errors == [] and remote == []
            assert page.locator("#plot-frontier .scatterlayer .trace").count() == 4  # 2 systems, frontier, best
            assert json.loads(page.locator("#search-data").text_content()) == rep
            plotted = page.evaluate("document.getElementById('plot-frontier').data.map(t => [t.name, t.x, t.y])")
            fr = [p for p in plotted if p[0] == "Pareto frontier"][0]
            assert fr[1] == [p["tok_s_per_user"] for p in rep["frontier"]]
            assert fr[2] == [p["tok_s_per_gpu"] for p in rep["frontier"]]
            cells = page.evaluate("""Array.from(document.querySelectorAll('#ranked tr')).slice(1).map(tr =>
                Object.fromEntries(Array.from(tr.querySelectorAll('td')).map(td => [td.dataset.key, td.textContent])))""")
            spec = {k: f for k, _, f in RANKED}
            assert len(cells) == len(rep["ranked"])
            for row, cell in zip(rep["ranked"], cells, strict=True):
                assert all(text == fmt(row.get(k), spec[k]) for k, text in cell.items())
            assert page.locator("#launch").inner_text() == rep["launch"]["command"]
        finally:
            ctx.close()


def test_node_counts_join_through_the_generator_list():
    from simulator.serving import presets as P

    sc = load_scenario()
    cluster = P.load("clusters", "2x8xh200-ib-ndr")
    out = list(S.node_count_layouts([1, 2], cluster, ("wide", "replicas"))(sc))
    deps = [d for d in out if not isinstance(d, S.Infeasible)]
    wide2 = [d for d in deps if d.gpus == 16 and d.tp == 16]
    assert wide2 and wide2[0].dp == 16 and wide2[0].moe == MoeLayout.EP and wide2[0].cluster == cluster.name
    assert any(d.gpus == 16 and d.tp == 8 for d in deps)  # two replicas of the 8-GPU instance
    assert S.same_gpus_layouts in S.DEPLOYMENT_GENERATORS  # the hook: a list other generators join


@pytest.mark.slow
def test_search_over_node_counts_ranks_a_two_node_layout(capsys):
    assert main(["plan", "--search", "--nodes", "2", "--cluster", "2x8xh200-ib-ndr", "--search-buffer", "8192",
                 "--search-host-ratio", "4", "--search-policy", "lru", "--json", "--quiet"]) == 0
    rep = json.loads(capsys.readouterr().out)
    two = [r for r in rep["ranked"] if r["gpus"] == 16]
    assert two and all(r["tpot_p99_ms"] <= 100 and r["ttft_p99_s"] <= 30 for r in two)
    # a host pool the node cannot pin is listed, not fatal (ratio 8 on 16 GPUs: 2081 GB of 2000)
    assert any("16xh200" in i["label"] and "pinned memory" in i["reason"] for i in rep["infeasible"])
    if rep["best"]["gpus"] == 16:
        assert "--node-rank" in " ".join(rep["launch"]["notes"]) or "--nnodes" in rep["launch"]["command"]


def _pd_files(tmp_path):
    """A 4-node H200 cluster and an 8-GPU wide-EP PD decode deployment on it (8 prefill GPUs)."""
    from pathlib import Path

    presets = Path(__file__).resolve().parents[1] / "simulator" / "presets"
    cl = (presets / "clusters" / "2x8xh200-ib-ndr.toml").read_text()
    cl = cl.replace('name = "2x8xh200-ib-ndr"', 'name = "4x8xh200-ib-ndr"').replace("nodes = 2", "nodes = 4")
    (tmp_path / "c4.toml").write_text(cl)
    dep = (presets / "deployments" / "16x8xh200-pd-dp64-wide-ep.toml").read_text()
    keys = {"name": '"8xh200-pd-dp8"', "gpus": "8", "tp": "8", "dp": "8", "prefill_gpus": "8",
            "max_running_requests": "480", "cluster": f'"{tmp_path / "c4.toml"}"'}
    lines = []
    for line in dep.splitlines():
        key = line.split("=")[0].strip()
        lines.append(f"{key} = {keys.pop(key)}" if key in keys and "=" in line else line)
    assert not keys, keys
    dep = "\n".join(lines) + "\n"
    (tmp_path / "d.toml").write_text(dep)
    return tmp_path / "c4.toml", tmp_path / "d.toml"


def test_pd_split_generator_gives_every_split(tmp_path):
    from simulator.serving import presets as P
    from simulator.serving.planner import PlanInputs

    c4, d = _pd_files(tmp_path)
    sc = PlanInputs(deployment=str(d), hisparse="wide-ep-h200").scenario()
    cluster = P.load("clusters", str(c4))
    out = list(S.pd_split_layouts(4, cluster)(sc))
    assert [(x.gpus, x.prefill_gpus) for x in out] == [(24, 8), (16, 16), (8, 24)]  # p prefill nodes, 4 - p decode
    assert all(x.tp == x.dp == x.gpus for x in out)  # the wide-EP decode layout kept
    assert S.dep_label(out[1]).endswith("+ 16 prefill")
    colocated = PlanInputs().scenario()
    (bad,) = S.pd_split_layouts(4, cluster)(colocated)
    assert isinstance(bad, S.Infeasible) and "not pd-decode" in bad.reason
    (big,) = S.pd_split_layouts(5, cluster)(sc)
    assert isinstance(big, S.Infeasible) and "2 to 4 nodes" in big.reason


def test_pd_split_rows_count_both_sides_gpus(tmp_path):
    """A split's tok/s/GPU divides the decode side's output by the GPUs of both sides."""
    from simulator.serving import presets as P
    from simulator.serving.planner import PlanInputs

    c4, d = _pd_files(tmp_path)
    sc = PlanInputs(deployment=str(d), hisparse="wide-ep-h200").scenario()
    dep = next(iter(S.pd_split_layouts(4, P.load("clusters", str(c4)))(sc)))
    row = S._row(S.Config(dep, "baseline", None), sc, 2, 0)
    assert row["prefill_gpus"] == 8
    assert row["steady_tok_s_per_gpu"] == pytest.approx(row["steady_tok_s_deployment"] / (24 + 8))


def test_pd_split_option_errors(tmp_path, capsys):
    c4, d = _pd_files(tmp_path)
    assert main(["plan", "--pd-split", "4"]) == 2
    assert "only with --search" in capsys.readouterr().err
    assert main(["plan", "--search", "--pd-split", "4", "--quiet"]) == 2
    assert "names no cluster; give --cluster" in capsys.readouterr().err
    assert main(["plan", "--search", "--pd-split", "2", "--cluster", "2x8xh200-ib-ndr", "--quiet"]) == 2
    assert "need a pd-decode deployment" in capsys.readouterr().err
    assert main(["plan", "--search", "--deployment", str(d), "--hisparse-config", "wide-ep-h200",
                 "--pd-split", "9", "--quiet"]) == 2
    assert "2 to 4 nodes" in capsys.readouterr().err


@pytest.mark.slow
def test_search_over_pd_splits_ranks_them(tmp_path, capsys):
    c4, d = _pd_files(tmp_path)
    assert main(["plan", "--search", "--deployment", str(d), "--hisparse-config", "wide-ep-h200", "--pd-split", "4",
                 "--search-buffer", "4096", "--search-host-ratio", "3", "--search-policy", "lru",
                 "--search-top", "40", "--json", "--quiet"]) == 0
    rep = json.loads(capsys.readouterr().out)
    splits = {(r["gpus"], r["prefill_gpus"]) for r in rep["ranked"]}
    assert {(24, 8), (16, 16), (8, 24)} <= splits
    assert "prefill/decode split of 4 nodes" in rep["searched"]["nodes"]


@pytest.mark.parametrize("deployment", ["8xh200-dp8-ep8-glm52-balanced", "8xh200-colocated-dp8-ep8",
                                        "8xh200-dp8-ep8-dsv32-pr30514", "8xh200-dp8-ep8-glm52-high-throughput"])
def test_a_deepep_preset_searches_its_moe_tp_layouts_without_deepep(deployment):
    """The DeepEP presets aborted the search: its MoE-TP layouts kept moe_a2a_backend = "deepep", which needs
    moe = "ep". A TP layout drops to the default backend (none, as SGLang launches MoE-TP); EP keeps DeepEP."""
    from simulator.serving.launch import launch_command
    from simulator.serving.planner import PlanInputs
    from simulator.serving.specs import MoeA2ABackend

    sc = PlanInputs(deployment=deployment).scenario()
    assert sc.deployment.moe_a2a_backend == MoeA2ABackend.DEEPEP
    out = list(S.same_gpus_layouts(sc))
    assert not [i for i in out if isinstance(i, S.Infeasible) and "deepep" in i.reason]
    deps = [d for d in out if not isinstance(d, S.Infeasible)]
    assert {d.moe for d in deps} == {MoeLayout.TP, MoeLayout.EP}
    for d in deps:
        argv = launch_command(sc.model, d, None).argv
        assert d.a2a_backend == (MoeA2ABackend.DEEPEP if d.moe == MoeLayout.EP else MoeA2ABackend.NONE)
        assert ("--moe-a2a-backend" in argv) == (d.moe == MoeLayout.EP)


def test_a_layout_the_deployment_refuses_is_listed_not_fatal(monkeypatch):
    """Whatever a layout breaks in the deployment's own checks is an Infeasible with that reason (the search
    runs on), as a node count the cluster refuses is."""
    from simulator.serving.planner import PlanInputs
    from simulator.serving.specs import MoeA2ABackend

    monkeypatch.setattr(S, "_a2a_for", lambda base, moe: MoeA2ABackend.DEEPEP)  # the old behaviour
    out = list(S.same_gpus_layouts(PlanInputs(deployment="8xh200-colocated-dp8-ep8").scenario()))
    refused = [i for i in out if isinstance(i, S.Infeasible) and "needs moe = \"ep\"" in i.reason]
    assert refused and all(i.label.endswith("moe-tp") and i.stage == "layout" for i in refused)
    assert all(d.moe == MoeLayout.EP for d in out if not isinstance(d, S.Infeasible))


def test_the_search_launch_carries_the_speculative_flags_a_plan_prints():
    """--search --speculative simulated speculative decoding but its launch command had no --speculative-*
    flags: its rows had no `speculative` key, so launch_for read them as off."""
    from simulator.serving.launch import launch_for
    from simulator.serving.planner import PlanInputs
    from simulator.serving.spec_whatif import label
    from simulator.serving.speculative import parse_speculative

    spec = parse_speculative("eagle:1-1-2", 1.5, None, ())
    sc = PlanInputs(speculative=spec).scenario()
    cfg = S.Config(sc.deployment, "baseline", None)
    row = S._row(cfg, sc, 2, 0)
    assert row["speculative"] == label(spec)
    searched = launch_for(sc, S._summary(cfg, row)).as_dict()
    planned = launch_for(sc, {"system": "baseline", "speculative": label(spec)}).as_dict()  # a plan row's
    assert searched == planned
    flags = [a for f in spec.launch_flags() for a in f.split()]
    assert searched["argv"][-len(flags):] == flags and "--speculative-algorithm" in searched["command"]
    off = PlanInputs().scenario()
    plain = S._summary(S.Config(off.deployment, "baseline", None), S._row(S.Config(off.deployment, "baseline", None),
                                                                          off, 2, 0))
    assert plain["speculative"] == "off" and "--speculative" not in launch_for(off, plain).command


@pytest.mark.parametrize("args, names", [
    (["--search", "--compare-prefetch"], ("--compare-prefetch", "no what-if")),
    (["--search", "--speculative", "eagle:1-1-2", "--accept-len", "1.5", "--compare-speculative"],
     ("--compare-speculative", "no what-if")),
    (["--search", "--node-layout", "wide"], ("--node-layout", "ignored")),
    (["--search", "--cluster", "2x8xh200-ib-ndr"], ("--cluster", "ignored")),
    (["--search", "--pd-split", "2", "--node-layout", "wide", "--cluster", "2x8xh200-ib-ndr"], ("--node-layout",)),
    (["--search", "--search-host-ratio", "4,0.5"], ("--search-host-ratio 0.5", ">= 1")),
    (["--node-layout", "auto"], ("--node-layout", "--nodes")),  # a plain plan ignored `auto` too
    (["--cluster", "2x8xh200-ib-ndr", "--concurrency", "1"], ("--cluster", "--nodes")),
])
def test_options_a_search_or_plan_would_ignore_are_refused(capsys, args, names):
    """They ran with rc 0 and nothing said (the host ratio: every point 'cannot run'); now one line, exit 2,
    before any preset loads or point runs."""
    from tests.fuzzing import assert_clean_error, run_cli

    code, out, err = run_cli(["plan", "--quiet", *args], capsys)
    assert_clean_error(code, err, *names)
    assert out == ""


def test_search_inputs_refuse_a_host_ratio_below_one():
    with pytest.raises(S.HisparseError, match="--search-host-ratio 0.5 must be >= 1"):
        S.SearchInputs(host_ratios=(8.0, 0.5))


def test_the_ranking_takes_the_most_tok_s_per_gpu_and_the_header_says_so(capsys):
    """Config.best takes the passing point with the most tok/s/GPU (the plan's recommend rule), not the highest
    passing load; the header said 'at the highest load meeting the targets'."""
    from simulator.commands import plan_search

    pts = [_p(30, 100.0, c=32), _p(29, 99.0, c=34), _p(5, 150.0, ttft=99.0, c=64)]  # 64 fails the TTFT target
    for p in pts:
        p["tpot_p99_ms"], p["steady_tok_s_deployment"] = 50.0, 8 * p["steady_tok_s_per_gpu"]
    (row,) = _result(pts).ranked()
    assert row["concurrency"] == 32 and row["tok_s_per_gpu"] == 100.0
    assert "highest tok/s/GPU at a load meeting" in plan_search.RANKED_BY
    assert "highest load" not in plan_search.RANKED_BY
