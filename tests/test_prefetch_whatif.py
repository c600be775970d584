"""--compare-prefetch: the IndexShare prefetch what-if (serving/prefetch_whatif.py), by hand on a small case."""

from __future__ import annotations

import json

import pytest

from simulator.cli import main
from simulator.serving import prefetch_whatif as PW

WL = """name = "8k1k-small"
input_tokens = 8192
output_tokens = 256
length_jitter = 0.0
arrival = "closed"
rate_per_s = 0.0
requests_per_client = 1
"""


def _row(system, pf, conc, tok, tpot):
    return {"system": system, "prefetch": pf, "device_buffer_size": 4096, "host_to_device_ratio": 8.0,
            "concurrency": conc, "rate_per_s": 0.0, "steady_tok_s_deployment": tok, "tpot_p99_ms": tpot,
            "ttft_p99_s": 1.0, "overloaded": False, "searched": False}


def test_compare_ratios_and_verdict_by_hand():
    rows = [_row("baseline", "", 1, 50.0, 20.0),
            _row("hisparse", "on", 1, 60.0, 16.0), _row("hisparse", "on", 16, 480.0, 33.0),
            _row("hisparse", "off", 1, 55.0, 18.0), _row("hisparse", "off", 16, 400.0, 40.0)]
    cmp = PW.compare(rows, slo_tpot_ms=100.0, slo_ttft_s=None)
    s = cmp["systems"]["hisparse"]
    assert "baseline" not in cmp["systems"]
    assert [p["load"] for p in s["points"]] == [1, 16]
    assert s["points"][0]["throughput_ratio"] == pytest.approx(60 / 55)
    assert s["points"][1]["tpot_p99_ratio"] == pytest.approx(33 / 40)
    assert s["gain"] == pytest.approx(480 / 400) and s["verdict"] == "pays off"  # 1.2 > 1 + 10%
    # within the band: a tie
    rows[4] = _row("hisparse", "off", 16, 450.0, 35.0)
    assert PW.compare(rows, 100.0, None)["systems"]["hisparse"]["verdict"] == "tie"  # 480 / 450 = 1.067
    # only without it under the targets
    tight = PW.compare(rows, slo_tpot_ms=17.0, slo_ttft_s=None)
    t = tight["systems"]["hisparse"]
    assert t["best_off"] is None and t["verdict"] == "pays off"
    assert "PAYS OFF" in PW.summary_lines(tight)[0] and "only with it" in PW.summary_lines(tight)[0]


def test_compare_prefetch_plan_small_case(tmp_path, capsys):
    wl = tmp_path / "w.toml"
    wl.write_text(WL)
    assert main(["plan", "--model", "glm-5.2-fp8", "--deployment", "8xh200-tp8-glm52-low-latency",
                 "--workload", str(wl), "--concurrency", "1", "--no-search", "--compare-prefetch",
                 "--json", "--quiet"]) == 0
    rep = json.loads(capsys.readouterr().out)
    rows = rep["rows"]
    assert sorted((r["system"], r["prefetch"]) for r in rows) == [("baseline", ""), ("hisparse", "off"),
                                                                     ("hisparse", "on")]
    on, off = (next(r for r in rows if r.get("prefetch") == v) for v in ("on", "off"))
    s = rep["prefetch_whatif"]["systems"]["hisparse"]
    assert s["points"][0]["tpot_p99_ratio"] == pytest.approx(on["tpot_p99_ms"] / off["tpot_p99_ms"])
    # by hand: at one request the TPOT the prefetch saves is what the cost model says it hides per step
    hidden = next(p for p in rep["indexshare_prefetch"]["points"] if p["requests_per_scheduler"] == 1)["hidden_ms"]
    saved = off["tpot_p50_ms"] - on["tpot_p50_ms"]
    assert hidden > 0.2 and saved == pytest.approx(hidden, rel=0.25)
    assert rep["recommendation"]["choice"].get("prefetch") != "off"  # the plan as given is what is launched


@pytest.mark.parametrize("extra, msg", [
    (["--model", "deepseek-v3.2-fp8"], "no IndexShare shared layers"),
    (["--model", "glm-5.2-fp8", "--set", "hisparse.prefetch=false"], "prefetch = false"),
    (["--model", "glm-5.2-fp8", "--speculative", "eagle:1-1-2", "--accept-len", "2", "--compare-speculative"],
     "one what-if at a time"),
])
def test_compare_prefetch_refuses(extra, msg, capsys):
    assert main(["plan", "--concurrency", "1", "--no-search", "--compare-prefetch", "--quiet", *extra]) == 2
    err = capsys.readouterr().err
    assert msg in err and "Traceback" not in err


def test_compare_prefetch_in_report_and_plot(tmp_path, capsys):
    wl = tmp_path / "w.toml"
    wl.write_text(WL)
    page, out = tmp_path / "plan.html", tmp_path / "out"
    assert main(["plan", "--model", "glm-5.2-fp8", "--deployment", "8xh200-tp8-glm52-low-latency",
                 "--workload", str(wl), "--concurrency", "1", "--no-search", "--compare-prefetch",
                 "--quiet", "--report", str(page), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    line = next(x for x in text.splitlines() if x.startswith("does IndexShare prefetch pay off (hisparse)"))
    assert "IndexShare prefetch off" in text and "IndexShare prefetch on" in text  # one table each
    html = page.read_text()
    assert "id='prefetch-whatif-0'" in html and line.split(";")[0] in html
    assert "<th class=''>IndexShare prefetch</th>" in html
    assert (out / "throughput.png").stat().st_size > 0
    assert json.loads((out / "plan.json").read_text())["prefetch_whatif"]["systems"]["hisparse"]["points"]
