"""``hisparse sweep GRID.toml --report page.html``: the results as one self-contained page,
checked in headless chromium: offline, no console error, plots by the grid's kind drawn as SVG
from the JSON, every row of results.parquet in the table, the failed points with their error."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from simulator.cli import main
from simulator.report.page import fmt
from simulator.report.sweep_html import columns
from simulator.trace import TraceMeta, write_trace
from tests.browser import needs_chromium, open_page, plotted, table_cells
from tests.helpers import random_stream

PLAN_GRID = """kind = "plan"
[fixed]
model = "glm-5.1-fp8"
deployment = "8xh200-colocated-dp8"
workload = "32k-in-8k-out"
[grid]
concurrency = [1, 8]
device_buffer_size = [4096, 8192]
"""


@pytest.fixture(scope="module")
def plan_sweep(tmp_path_factory):
    """A 4-point plan grid run in this process, one point made to fail (a real failure path: the
    point's error is recorded and the sweep goes on)."""
    from simulator.sweep import points

    tmp = tmp_path_factory.mktemp("sweep")
    grid = tmp / "grid.toml"
    grid.write_text(PLAN_GRID)
    real = points._plan

    def plan(p):
        if p["concurrency"] == 8 and p["device_buffer_size"] == 8192:
            raise RuntimeError("made to fail by the test")
        return real(p)

    mp = pytest.MonkeyPatch()
    mp.setattr(points, "_plan", plan)
    try:
        rc = main(["sweep", str(grid), "--no-ray", "--quiet", "--out", str(tmp / "out"), "--report", str(tmp / "s.html")])
    finally:
        mp.undo()
    assert rc == 1  # a failed point, no --keep-going
    return tmp / "s.html", pd.read_parquet(tmp / "out" / "results.parquet")


def _data(page_file):
    text = page_file.read_text()
    start = text.index("<script type='application/json' id='sweep-data'>") + len("<script type='application/json' id='sweep-data'>")
    return json.loads(text[start:text.index("</script>", start)].replace("<\\/", "</"))


def test_plan_page_holds_every_row_of_the_results(plan_sweep):
    page_file, table = plan_sweep
    data = _data(page_file)
    assert data["kind"] == "plan" and data["axes"] == ["concurrency", "device_buffer_size"]
    assert data["columns"] == list(table.columns) and len(data["rows"]) == len(table) == 4
    for row, (_, rec) in zip(data["rows"], table.iterrows(), strict=True):
        for c in table.columns:
            v = rec[c]
            assert row[c] is None if (isinstance(v, float) and np.isnan(v)) else row[c] == v
    failed = [r for r in data["rows"] if r["error"]]
    assert len(failed) == 1 and "made to fail by the test" in failed[0]["error"]


@pytest.mark.slow  # ~6 s on the shared 2-core machine: loading plotly.js (4.8 MB) dominates
@needs_chromium
def test_plan_sweep_page_in_a_headless_browser(plan_sweep):
    page_file, table = plan_sweep
    data = _data(page_file)
    ok = table[table["error"] == ""]
    with open_page(page_file, "#plot-tpot .main-svg") as (page, errors, remote):
        assert errors == [] and remote == []
        for plot, metric in (("plot-throughput", "steady_tok_s_deployment"), ("plot-tpot", "tpot_p99_ms")):
            # one baseline line (it ignores the buffer: its repeats dropped), one HiSparse line per buffer
            assert page.locator(f"#{plot} svg.main-svg .scatterlayer .trace").count() == 3
            traces = {t["name"]: t for t in plotted(page, plot)}
            assert set(traces) == {"baseline", "hisparse, device_buffer_size 4096", "hisparse, device_buffer_size 8192"}
            base = ok.drop_duplicates("concurrency").sort_values("concurrency")
            assert traces["baseline"]["x"] == base["concurrency"].tolist()
            assert traces["baseline"]["y"] == base[f"baseline_{metric}"].tolist()
            for buf in (4096, 8192):
                g = ok[ok["device_buffer_size"] == buf].sort_values("concurrency")
                t = traces[f"hisparse, device_buffer_size {buf}"]
                assert t["x"] == g["concurrency"].tolist() and t["y"] == g[f"hisparse_{metric}"].tolist()
        assert page.locator("#failed li").count() == 1
        assert "made to fail by the test" in page.locator("#failed li").inner_text()
        assert page.locator("#results tr.failed").count() == 1
        spec = {k: f for k, _, f in columns(data)}
        cells = table_cells(page, "results")
        assert len(cells) == len(data["rows"])
        for row, cell in zip(data["rows"], cells, strict=True):
            assert set(cell) == set(data["columns"])
            assert all(text == fmt(row.get(k), spec[k]) for k, text in cell.items())


@pytest.fixture(scope="module")
def replay_sweep(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("replay")
    trace = tmp / "t.hst"
    rng = np.random.default_rng(0)
    write_trace(trace, TraceMeta(k=16, source={"kind": "test"}),
                [random_stream(rng, steps=30, k=16, ctx0=60, request=r) for r in range(2)])
    grid = tmp / "grid.toml"
    grid.write_text(f'kind = "replay"\n[fixed]\ntrace = "{trace}"\n[grid]\npolicy = ["lru", "fifo"]\n'
                    'buffer = [16, 24, 32]\n')
    assert main(["sweep", str(grid), "--no-ray", "--quiet", "--out", str(tmp / "out"),
                 "--report", str(tmp / "r.html")]) == 0
    return tmp / "r.html", pd.read_parquet(tmp / "out" / "results.parquet")


@pytest.mark.slow  # ~6 s on the shared 2-core machine: loading plotly.js (4.8 MB) dominates
@needs_chromium
def test_replay_sweep_page_plots_miss_ratio_against_buffer_per_policy(replay_sweep):
    page_file, table = replay_sweep
    with open_page(page_file, "#plot-miss .main-svg") as (page, errors, remote):
        assert errors == [] and remote == []
        assert page.locator("#plot-miss svg.main-svg .scatterlayer .trace").count() == 2
        traces = {t["name"]: t for t in plotted(page, "plot-miss")}
        assert set(traces) == {"lru", "fifo"}
        for policy, t in traces.items():
            g = table[table["policy"] == policy].sort_values("buffer")
            assert t["x"] == g["buffer"].tolist() and t["y"] == g["miss_ratio"].tolist()
        assert len(table_cells(page, "results")) == len(table) == 6
        assert page.locator("#failed li").count() == 0


def test_sweep_report_is_an_output_checked_before_any_work(tmp_path, capsys):
    grid = tmp_path / "grid.html"  # a grid file named like a page: --report must not overwrite it
    grid.write_text(PLAN_GRID)
    out = tmp_path / "out"
    assert main(["sweep", str(grid), "--no-ray", "--quiet", "--out", str(out), "--report", str(grid)]) == 2
    err = capsys.readouterr().err
    assert "--report" in err and "Traceback" not in err and grid.read_text() == PLAN_GRID and not out.exists()
    (tmp_path / "d.html").mkdir()
    assert main(["sweep", str(grid), "--no-ray", "--quiet", "--out", str(out), "--report", str(tmp_path / "d.html")]) == 2
    assert "--report" in capsys.readouterr().err and not out.exists()
    assert main(["sweep", str(grid), "--no-ray", "--quiet", "--out", str(out), "--report", str(tmp_path / "r.png")]) == 2
    assert ".html" in capsys.readouterr().err and not out.exists()
