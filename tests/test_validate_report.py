"""``hisparse plan --validate SET --report page.html``: the validation as one self-contained page,
checked in headless chromium: offline, no console error, the scatter (band, y = x, one trace per
set) and the error bars drawn as SVG, and the tables showing the JSON's numbers (issue #29 item 7)."""

from __future__ import annotations

import json
import shutil

import pytest

from simulator.cli import main
from simulator.report.page import fmt
from simulator.report.validate_html import POINTS, SUMMARY, render_validation, summary_rows
from tests.browser import needs_chromium, open_page, plotted, table_cells

SET = "cookbook-glm52-h200-balanced"  # the fastest shipped set (~2 s), values from 5 ms to 2,400 tok/s/GPU


@pytest.fixture(scope="module")
def validated(tmp_path_factory):
    out = tmp_path_factory.mktemp("validate")
    page = out / "validation.html"
    assert main(["plan", "--validate", SET, "--quiet", "--out", str(out / "v"), "--report", str(page)]) == 0
    return page, json.loads((out / "v" / "validation.json").read_text())


def test_page_is_self_contained_and_carries_the_validation_json(validated):
    page, report = validated
    text = page.read_text()
    assert "<script src" not in text and "<link" not in text and text.count("<script") == 3
    assert set(report["sets"]) == {SET}


@pytest.mark.slow  # ~6 s on the shared 2-core machine: loading plotly.js (4.8 MB) dominates
@needs_chromium
def test_validation_page_in_a_headless_browser(validated):
    page_file, report = validated
    predicted = [r for r in report["rows"] if r["predicted"] is not None]
    with open_page(page_file, "#plot-error .main-svg") as (page, errors, remote):
        assert errors == [] and remote == []
        assert json.loads(page.locator("#validation-data").text_content()) == report
        # the band, the y = x line and one trace per set, drawn as SVG; one bar per predicted point
        assert page.locator("#plot-scatter svg.main-svg .scatterlayer .trace").count() == 3
        assert page.locator("#plot-scatter .scatterlayer .trace path.point").count() == len(predicted)
        assert page.locator("#plot-error .barlayer .point").count() == len(predicted)
        traces = plotted(page, "plot-scatter")
        assert [t["name"] for t in traces] == ["+-15% band", "y = x", SET]
        assert traces[2]["x"] == [r["measured"] for r in predicted]
        assert traces[2]["y"] == [r["predicted"] for r in predicted]
        assert all(r["set"] in t and r["label"] in t and r["metric"] in t
                   for r, t in zip(predicted, traces[2]["text"], strict=True))
        # 5 ms to 2,400 tok/s: log axes; the band is 15% either side of y = x
        assert page.evaluate("document.getElementById('plot-scatter').layout.xaxis.type") == "log"
        xs, ys = traces[0]["x"], traces[0]["y"]
        assert ys[0] == pytest.approx(xs[0] * 0.85) and ys[2] == pytest.approx(xs[2] * 1.15)
        # the tables are the JSON: the medians per set and overall, every point of the set
        spec = {k: f for k, _, f in SUMMARY}
        cells = table_cells(page, "summary")
        assert [c["set"] for c in cells] == [SET, "all"]
        for row, cell in zip(summary_rows(report), cells, strict=True):
            assert all(text == fmt(row.get(k), spec[k]) for k, text in cell.items())
        assert page.locator("#all-median").inner_text() == f"{report['all']['median_abs_error']:.1%}"
        spec = {k: f for k, _, f in POINTS}
        cells = table_cells(page, "set-0")
        assert len(cells) == len(report["rows"])
        for row, cell in zip(report["rows"], cells, strict=True):
            assert all(text == fmt(row.get(k), spec[k]) for k, text in cell.items())


def test_a_point_the_model_does_not_predict_shows_blank_and_is_marked(validated):
    _, report = validated
    rep = json.loads(json.dumps(report))
    rep["rows"][0]["predicted"] = rep["rows"][0]["error"] = None
    rep["rows"][0]["note"] = "not predicted: a reason"
    text = render_validation(rep)
    assert text.count("class=failed") == 1 and "not predicted: a reason" in text


def test_report_with_validate_is_an_output_checked_before_any_work(tmp_path, capsys):
    from simulator.serving.published import load_published

    own = tmp_path / "set.html"  # a published set file named like a page: --report must not overwrite it
    shutil.copy(load_published(SET).where, own)
    before = own.read_bytes()
    assert main(["plan", "--validate", str(own), "--quiet", "--report", str(own)]) == 2
    err = capsys.readouterr().err
    assert "--report" in err and "Traceback" not in err and own.read_bytes() == before
    (tmp_path / "d.html").mkdir()
    assert main(["plan", "--validate", SET, "--quiet", "--report", str(tmp_path / "d.html")]) == 2
    assert "--report" in capsys.readouterr().err
    assert main(["plan", "--validate", SET, "--quiet", "--report", str(tmp_path / "v.txt")]) == 2
    assert ".html" in capsys.readouterr().err and not (tmp_path / "v.txt").exists()
    # the plan's options stay refused with --validate, --report no longer among them
    assert main(["plan", "--validate", SET, "--concurrency", "4", "--report", str(tmp_path / "v.html")]) == 2
    err = capsys.readouterr().err
    assert "--concurrency does not apply" in err and not (tmp_path / "v.html").exists()
