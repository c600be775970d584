"""The HTML reports as a user meets them: file names, --set values, trace paths and set labels that
hold markup; a plan over node counts or with a speculative what-if; a sweep whose every point
failed; a published set whose labels repeat. The browser checks (headless chromium, tests/browser.py)
are in the slow tier: `python -m pytest -m slow tests/test_report_qa.py`."""

from __future__ import annotations

import contextlib
import io
import json
import re

import numpy as np
import pandas as pd
import pytest

from simulator.cli import main
from simulator.report.page import data_json
from tests.browser import needs_chromium, open_page, plotted
from tests.helpers import WORKLOAD_8K1K

# a folder name that breaks a page whose JSON only had "</" escaped: "<!--" then "<script" put the
# HTML parser in the script's double-escaped state, and the data element ran on over the drawing code
MARKUP = "x<!--<script>alert(1)&'q\""


def _json_out(argv: list[str]) -> dict:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(argv) == 0
    return json.loads(buf.getvalue())


def _page_data(text: str, data_id: str) -> dict:
    tag = f"<script type='application/json' id='{data_id}'>"
    start = text.index(tag) + len(tag)
    return json.loads(text[start:text.index("</script>", start)])


def test_embedded_json_holds_no_markup_and_reads_back():
    obj = {"path": f"/tmp/{MARKUP}/w.toml", "note": "a </script> b <!-- c --> d & e > f", "n": [1, 2.5, None]}
    text = data_json(obj)
    assert not set("<>&") & set(text)
    assert json.loads(text) == obj


@pytest.fixture(scope="module")
def odd_plan(tmp_path_factory):
    """A plan whose workload file sits in a folder named with markup, with a --set whose value is markup."""
    tmp = tmp_path_factory.mktemp("odd")
    folder = tmp / MARKUP
    folder.mkdir()
    workload = folder / "my<b>&load.toml"
    workload.write_text(WORKLOAD_8K1K)
    page = tmp / "plan.html"
    report = _json_out(["plan", "--workload", str(workload), "--set", "workload.name=<img src=x onerror=alert(1)>",
                        "--set", "workload.output_tokens=512", "--concurrency", "4,16", "--no-search", "--quiet",
                        "--json", "--report", str(page)])
    return page, report


def test_plan_page_names_the_scenario_in_title_and_heading(odd_plan):
    page, report = odd_plan
    text = page.read_text()
    want = ("hisparse plan: glm-5.1-fp8 on 8xh200-colocated-dp8, workload my<b>&load, "
            "--set workload.name=<img src=x onerror=alert(1)>, --set workload.output_tokens=512")
    import html

    assert f"<title>{html.escape(want)}</title>" in text and f"<h1>{html.escape(want)}</h1>" in text
    assert _page_data(text, "plan-data") == report
    # the scenario's --set rows: the override once, not "--set | --set workload..."
    assert "<tr><th class='l'>--set</th><td class='l'>workload.output_tokens=512</td></tr>" in text
    body = text.split("<body>", 1)[1]
    assert "<img" not in body and "<!--" not in body  # only as text, escaped


@pytest.fixture(scope="module")
def nodes_plan(tmp_path_factory):
    page = tmp_path_factory.mktemp("nodes") / "nodes.html"
    report = _json_out(["plan", "--deployment", "8xh200-colocated-dp8-ep8", "--nodes", "1,2", "--cluster",
                        "2x8xh200-ib-ndr", "--set", "hisparse.host_to_device_ratio=4", "--concurrency", "16",
                        "--no-search", "--quiet", "--json", "--report", str(page)])
    return page, report


def test_nodes_plan_page_tells_the_node_counts_apart(nodes_plan):
    page, report = nodes_plan
    text = page.read_text()
    rows = report["rows"]
    assert {r["nodes"] for r in rows} == {1, 2}
    # every row's node count is in the table: without it the 1-node and 2-node rows read the same
    cells = re.findall(r"<td data-key='nodes'>(\d*)</td>", text)
    assert cells == [str(r["nodes"]) for r in rows]
    choice = report["recommendation"]["choice"]
    rec = re.search(r"<p id='recommendation'>(.*?)</p>", text).group(1)
    assert f"{choice['nodes']} node(s) ({choice['gpus']} GPUs)" in rec
    assert "<title>hisparse plan: glm-5.1-fp8 on 8xh200-colocated-dp8-ep8 (1, 2 nodes), workload 32k-in-8k-out" in text


def test_points_table_leaves_out_a_closed_loops_rate(odd_plan):
    _, report = odd_plan
    from simulator.report.html import render, shown

    rows = report["rows"]
    assert all(r["concurrency"] and r["rate_per_s"] == 0 for r in rows)
    assert "data-key='rate_per_s'" not in render(report)  # "0" on every row said nothing
    assert not shown("residency", rows)  # the default swap, blank for the baseline
    opened = [dict(r, concurrency=None, rate_per_s=0.5) for r in rows]
    assert shown("rate_per_s", opened) and shown("residency", [dict(rows[-1], residency="dynamic")])


@pytest.mark.slow  # ~7 s: loading plotly.js dominates
@needs_chromium
def test_plan_page_with_markup_in_its_inputs_draws_its_plots(odd_plan):
    page_file, report = odd_plan
    # waits for the table, not a plot: the broken page drew none (and the wait ran out after 120 s)
    with open_page(page_file, "#points") as (page, errors, remote):
        dialogs = []
        page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
        page.wait_for_load_state("load")  # every inline script has run: the plots are drawn or never will be
        assert errors == [] and remote == [] and dialogs == []
        assert json.loads(page.locator("#plan-data").text_content()) == report
        for plot in ("plot-throughput", "plot-tpot", "plot-ttft"):
            assert page.locator(f"#{plot} .scatterlayer .trace").count() == 3
        assert page.locator("img").count() == 0 and page.locator("script").count() == 3
        assert page.title() == page.locator("h1").inner_text()
        assert "workload my<b>&load" in page.title()


def _sweep(tmp, grid_text: str, *, fail=None) -> tuple:
    from simulator.sweep import points

    grid = tmp / "grid.toml"
    grid.write_text(grid_text)
    mp = pytest.MonkeyPatch()
    if fail is not None:
        real = {"plan": points._plan, "replay": points._replay}

        def failing(kind):
            def run(p):
                if fail(p):
                    raise RuntimeError("made to fail by the test")
                return real[kind](p)
            return run

        mp.setattr(points, "_plan", failing("plan"))
        mp.setattr(points, "_replay", failing("replay"))
    try:
        rc = main(["sweep", str(grid), "--no-ray", "--quiet", "--out", str(tmp / "out"), "--report",
                   str(tmp / "s.html")])
    finally:
        mp.undo()
    return rc, tmp / "s.html", pd.read_parquet(tmp / "out" / "results.parquet")


@pytest.fixture(scope="module")
def odd_traces(tmp_path_factory):
    from simulator.trace import TraceMeta, write_trace
    from tests.helpers import random_stream

    tmp = tmp_path_factory.mktemp("traces")
    rng = np.random.default_rng(1)
    names = ["tr<b>&/t.hst", "<!--<script>.hst", "<img src=x onerror=alert(1)>.hst"]
    (tmp / "tr<b>&").mkdir()
    for name in names:
        write_trace(tmp / name, TraceMeta(k=16, source={"kind": "test"}),
                    [random_stream(rng, steps=30, k=16, ctx0=60, request=r) for r in range(2)])
    return tmp, [str(tmp / n) for n in names]


@pytest.mark.slow  # ~7 s: loading plotly.js dominates
@needs_chromium
def test_sweep_page_over_traces_named_with_markup(odd_traces, tmp_path):
    _, traces = odd_traces
    grid = ('kind = "replay"\n[grid]\ntrace = ' + json.dumps(traces) + '\npolicy = ["lru", "fifo"]\n'
            'buffer = [16, 32]\n')
    rc, page_file, table = _sweep(tmp_path, grid)
    assert rc == 0 and len(table) == 12
    with open_page(page_file, "#results") as (page, errors, remote):
        page.wait_for_load_state("load")  # the plot is drawn by now or never (a broken page waited 120 s)
        assert errors == [] and remote == [] and page.locator("img").count() == 0
        assert page.locator("#plot-miss .scatterlayer .trace").count() == 6
        # the legend shows each trace path as it is (plotly read "<b>" as bold and dropped it)
        legend = page.evaluate("Array.from(document.querySelectorAll('#plot-miss .legendtext')).map(e => e.textContent)")
        assert sorted(legend) == sorted(f"{p}, trace {t}" for p in ("lru", "fifo") for t in traces)
        for t in plotted(page, "plot-miss"):
            assert t["y"] and all(y is not None for y in t["y"])
    assert f"<title>hisparse sweep: {tmp_path / 'grid.toml'}</title>" in page_file.read_text()


@pytest.mark.slow  # ~7 s: loading plotly.js dominates
@needs_chromium
def test_sweep_page_where_every_point_failed_says_so(odd_traces, tmp_path):
    _, traces = odd_traces
    grid = f'kind = "replay"\n[fixed]\ntrace = {json.dumps(traces[0])}\n[grid]\nbuffer = [16, 32]\n'
    rc, page_file, table = _sweep(tmp_path, grid, fail=lambda p: True)
    assert rc == 1 and (table["error"] != "").all()
    with open_page(page_file, "#results") as (page, errors, remote):
        page.wait_for_function("document.getElementById('plots').textContent.length > 0")
        assert errors == [] and remote == []
        assert page.locator("#plots").inner_text().startswith("no point ran: nothing to plot")
        assert page.locator("#plots svg").count() == 0  # no empty axes
        assert page.locator("#failed li").count() == 2 and page.locator("#results tr.failed").count() == 2


@pytest.fixture(scope="module")
def repeated_labels(tmp_path_factory):
    """A user's published set (a copy of a shipped one) whose labels repeat and whose name holds markup."""
    from simulator.serving.published import load_published

    tmp = tmp_path_factory.mktemp("set")
    src = load_published("cookbook-glm52-h200-balanced").where
    text = re.sub(r'(?m)^label = "[^"]*"', 'label = "c<i>64</i>"', open(src).read())
    text = re.sub(r'(?m)^name = "[^"]*"', 'name = "my<b>set&"', text, count=1)
    own = tmp / "set.toml"
    own.write_text(text)
    page = tmp / "v.html"
    report = _json_out(["plan", "--validate", str(own), "--quiet", "--json", "--report", str(page)])
    return page, report


@pytest.mark.slow  # ~7 s: loading plotly.js dominates
@needs_chromium
def test_validation_page_draws_one_bar_per_point_when_labels_repeat(repeated_labels):
    page_file, report = repeated_labels
    predicted = [r for r in report["rows"] if r["error"] is not None]
    assert len(predicted) >= 2 and len({r["label"] for r in predicted}) == 1
    with open_page(page_file, "#plot-error .main-svg") as (page, errors, remote):
        assert errors == [] and remote == []
        bars = plotted(page, "plot-error")
        xs = [x for t in bars for x in t["x"]]
        assert len(xs) == len(set(xs)) == len(predicted)  # one place each, not all on one category
        assert [y for t in bars for y in t["y"]] == [r["error"] for r in predicted]
        # plotly shows the set's name as it is
        legend = page.evaluate("Array.from(document.querySelectorAll('#plot-scatter .legendtext')).map(e => e.textContent)")
        assert "my<b>set&" in legend
    assert page_file.read_text().count("<title>hisparse plan --validate: my&lt;b&gt;set&amp;</title>") == 1


@pytest.fixture(scope="module")
def small_search(tmp_path_factory):
    page = tmp_path_factory.mktemp("search") / "s.html"
    report = _json_out(["plan", "--search", "--search-buffer", "4096", "--search-host-ratio", "8", "--search-policy",
                        "lru", "--set", "workload.output_tokens=4096", "--quiet", "--json", "--report", str(page)])
    return page, report


@pytest.mark.slow  # ~10 s: the search
def test_search_page_names_what_was_searched(small_search):
    page, report = small_search
    text = page.read_text()
    want = "hisparse plan --search: glm-5.1-fp8, workload 32k-in-8k-out, --set workload.output_tokens=4096"
    assert f"<title>{want}</title>" in text and f"<h1>{want}</h1>" in text
    scenario = re.search(r"<table id='scenario'>(.*?)</table>", text).group(1)
    assert "TPOT p99 &lt;= 100 ms, TTFT p99 &lt;= 30 s" in scenario
    assert "<th class='l'>--set</th><td class='l'>workload.output_tokens=4096</td>" in scenario
    assert report["scenario"]["files"]["model"] in scenario
    assert _page_data(text, "search-data") == report
