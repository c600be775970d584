"""``hisparse plan --report``: one self-contained HTML page, checked in a real headless browser
(Debian's chromium driven by Playwright): it loads offline, logs no error, draws its plots, and
shows the numbers of the plan's JSON (issue #29 item 7)."""

from __future__ import annotations

import json

import pytest

from simulator.cli import main
from tests.browser import needs_chromium, open_page


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    out = tmp_path_factory.mktemp("plan")
    page = out / "plan.html"
    assert main(["plan", "--concurrency", "16,64", "--quiet", "--out", str(out), "--report", str(page),
                 "--price-gpu-hour", "3.5"]) == 0
    return page, json.loads((out / "plan.json").read_text())


def test_report_is_one_self_contained_file(planned):
    page, report = planned
    text = page.read_text()
    assert "<script src" not in text and "<link" not in text  # nothing fetched: plotly.js is inline
    assert text.count("<script") == 3  # plotly.js, the data, the drawing code
    assert report["launch"]["choice"]["command"].replace("'", "&#x27;").replace('"', "&quot;") in text


def test_report_refuses_a_wrong_suffix(tmp_path, capsys):
    assert main(["plan", "--concurrency", "1", "--quiet", "--report", str(tmp_path / "r.txt")]) == 2
    assert "--report" in capsys.readouterr().err and not (tmp_path / "r.txt").exists()
    # --validate takes --report for its own page (tests/test_validate_report.py)


@needs_chromium
def test_report_in_a_headless_browser(planned):
    from simulator.report.html import COLUMNS, fmt

    page_file, report = planned
    with open_page(page_file, "#plot-ttft .main-svg") as (page, errors, remote):
        assert errors == [] and remote == []
        for plot in ("plot-throughput", "plot-tpot", "plot-ttft"):
            # one trace per system and knob set, plus the recommendation's marker, drawn as SVG
            assert page.locator(f"#{plot} svg.main-svg .scatterlayer .trace").count() == 3
            assert page.locator(f"#{plot} .scatterlayer .trace path.point").count() >= 3
        # the target lines are drawn
        assert page.locator("#plot-tpot .shapelayer path").count() >= 1
        assert page.locator("#plot-ttft .shapelayer path").count() >= 1
        # the page's data is the plan's JSON, and what it plots and tabulates is that data
        shown = json.loads(page.locator("#plan-data").text_content())
        assert shown == report
        plotted = page.evaluate("document.getElementById('plot-throughput').data.map(t => [t.name, t.x, t.y])")
        base = sorted((r["concurrency"], r["steady_tok_s_deployment"]) for r in report["rows"] if r["system"] == "baseline")
        name, xs, ys = plotted[0]
        assert name == "baseline" and list(zip(xs, ys, strict=True)) == base
        choice = report["recommendation"]["choice"]
        assert plotted[-1][1:] == [[choice["concurrency"]], [choice["steady_tok_s_deployment"]]]
        assert page.locator("#rec-tok").inner_text() == f"{choice['steady_tok_s_deployment']:.1f}"
        assert page.locator("#rec-cost").inner_text() == f"{choice['usd_per_m_output_tokens']:.3f}"
        assert page.locator("#launch").inner_text() == report["launch"]["choice"]["command"]
        cells = page.evaluate("""Array.from(document.querySelectorAll('#points tr[data-row]')).map(tr =>
            Object.fromEntries(Array.from(tr.querySelectorAll('td')).map(td => [td.dataset.key, td.textContent])))""")
        assert len(cells) == len(report["rows"])
        spec = {k: f for k, _, f in COLUMNS}
        for row, cell in zip(report["rows"], cells, strict=True):
            assert cell and all(text == fmt(row.get(k), spec[k]) for k, text in cell.items())
        assert page.locator("#points tr.choice").count() == 1

