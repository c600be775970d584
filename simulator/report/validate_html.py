"""``hisparse plan --validate SET|all --report validation.html``: the validation as one
self-contained page (``page.py``): measured against predicted per point (the y = x line and the
+-15% band, the band ``plot_validation`` draws: the issue's median target, docs/validation.md),
the signed error per point, the median and largest |error| per set and over all sets (as
``published.summary`` computes them: estimates apart), and per set a table of every point with
its note. The page is drawn from the embedded JSON, the same object ``--validate --json`` prints."""

from __future__ import annotations

import html

from .page import JS_ESC, document, kv_table, rows_table, write_page

BAND = 0.15  # the band of serving.plots.plot_validation (the target: median |error| <= 15%)

POINTS = (("label", "label", "s"), ("metric", "metric", "s"), ("kind", "kind", "s"), ("at_concurrency", "conc", "d"),
          ("measured", "measured", ".4g"), ("predicted", "predicted", ".4g"), ("error", "error", "+.1%"),
          ("note", "note", "s"))
SUMMARY = (("set", "set", "s"), ("points", "measured points", "d"), ("predicted", "predicted", "d"),
           ("estimates", "estimates", "d"), ("median_abs_error", "median |error|", ".1%"),
           ("max_abs_error", "max |error|", ".1%"))


def summary_rows(report: dict) -> list[dict]:
    """One row per set, then ``all``: the medians and maxima of the report."""
    return [{"set": name} | info for name, info in report["sets"].items()] + [{"set": "all"} | report["all"]]


_SCRIPT = """
(function () {
  %ESC%
  var rep = JSON.parse(document.getElementById('validation-data').textContent);
  var band = Number(document.getElementById('plot-scatter').dataset.band);
  var pts = rep.rows.filter(function (r) { return r.predicted !== null && r.measured > 0 && r.predicted > 0; });
  var sets = Object.keys(rep.sets), traces = [];
  var palette = ['#1f77b4', '#ff7f0e', '#2ca02c', '#d62728', '#9467bd', '#8c564b', '#e377c2', '#7f7f7f', '#bcbd22', '#17becf'];
  var color = function (s) { return palette[sets.indexOf(s) % palette.length]; };
  var vals = pts.map(function (r) { return r.measured; }).concat(pts.map(function (r) { return r.predicted; }));
  var lo = Math.min.apply(null, vals) / 1.5, hi = Math.max.apply(null, vals) * 1.5;
  var log = hi / lo > 10;  // log axes where the values span decades
  traces.push({type: 'scatter', mode: 'lines', name: '+-' + Math.round(band * 100) + '% band', hoverinfo: 'skip',
    x: [lo, hi, hi, lo, lo], y: [lo * (1 - band), hi * (1 - band), hi * (1 + band), lo * (1 + band), lo * (1 - band)],
    fill: 'toself', fillcolor: 'rgba(0,128,0,0.12)', line: {width: 0}});
  traces.push({type: 'scatter', mode: 'lines', name: 'y = x', x: [lo, hi], y: [lo, hi], hoverinfo: 'skip',
    line: {dash: 'dash', color: '#555'}});
  function hover(r) { return esc(r.set) + '<br>' + esc(r.label) + '<br>' + r.metric + (r.kind !== 'measurement' ? ' (' + r.kind + ')' : ''); }
  sets.forEach(function (s) {
    var g = pts.filter(function (r) { return r.set === s; });
    if (!g.length) { return; }
    traces.push({type: 'scatter', mode: 'markers', name: esc(s), x: g.map(function (r) { return r.measured; }),
      y: g.map(function (r) { return r.predicted; }), text: g.map(hover),
      hovertemplate: '%{text}<br>measured %{x:.4g}<br>predicted %{y:.4g}<extra></extra>',
      marker: {size: 9, color: color(s), symbol: g.map(function (r) { return r.kind === 'measurement' ? 'circle' : 'x'; })}});
  });
  var kind = log ? 'log' : 'linear';
  var cfg = {responsive: true, displaylogo: false};
  Plotly.newPlot('plot-scatter', traces, {title: {text: 'measured against predicted (each in its own unit)'},
    xaxis: {title: {text: 'measured'}, type: kind}, yaxis: {title: {text: 'predicted'}, type: kind}}, cfg);
  var bars = sets.map(function (s) {
    var g = pts.filter(function (r) { return r.set === s && r.error !== null; });
    // one bar per point: its place is its row (labels need not be unique: two points of one label shared one bar)
    return {type: 'bar', name: esc(s), x: g.map(function (r) { return 'point ' + rep.rows.indexOf(r); }),
      y: g.map(function (r) { return r.error; }), text: g.map(hover), textposition: 'none', marker: {color: color(s)},
      hovertemplate: '%{text}<br>error %{y:+.1%}<extra></extra>'};
  }).filter(function (t) { return t.x.length; });
  function hline(y) { return {type: 'line', xref: 'paper', x0: 0, x1: 1, y0: y, y1: y, line: {dash: 'dash', color: '#080'}}; }
  Plotly.newPlot('plot-error', bars, {title: {text: 'error per point: (predicted - measured) / measured'},
    xaxis: {showticklabels: false}, yaxis: {title: {text: 'error'}, tickformat: '+.0%'},
    shapes: [hline(band), hline(-band)]}, cfg);
})();
""".replace("%ESC%", JS_ESC)


def render_validation(report: dict) -> str:
    """The page for a validation report (``hisparse plan --validate ... --json``'s object)."""
    names = list(report["sets"])
    a = report["all"]
    med = "n/a" if a["median_abs_error"] is None else f"{a['median_abs_error']:.1%}"
    mx = "n/a" if a["max_abs_error"] is None else f"{a['max_abs_error']:.1%}"
    what = ", ".join(names) if len(names) <= 2 else f"{len(names)} published sets"
    parts = [f"<h1>hisparse plan --validate: {html.escape(what)}</h1>",
             f"<p id='overall'>All sets: median |error| <span id='all-median'>{med}</span>, max |error| "
             f"<span id='all-max'>{mx}</span> over {a['predicted']} of {a['points']} measured points"
             + (f", {a['estimates']} estimate(s) apart" if a["estimates"] else "")
             + ". No model term is fitted to these runs.</p>",
             f"<div id='plot-scatter' class='plot' data-band='{BAND}'></div><div id='plot-error' class='plot'></div>",
             "<h2>Per set</h2>", rows_table("summary", summary_rows(report), SUMMARY, left=("set",))]
    for i, name in enumerate(names):
        info = report["sets"][name]
        rows = [r for r in report["rows"] if r["set"] == name]
        parts.append(f"<h2 id='set-{i}-name'>{html.escape(name)}</h2>")
        parts.append(kv_table([("source", info["source"]), ("uncertainty", info.get("uncertainty") or ""),
                               ("file", str(info["file"]))]))
        parts.append(rows_table(f"set-{i}", rows, POINTS, left=("label", "metric", "kind", "note"),
                                row_class=lambda r: "" if r["predicted"] is not None else "failed"))
    return document(f"hisparse plan --validate: {what}", "".join(parts), data_id="validation-data", data=report,
                    script=_SCRIPT)


def write_validation_report(report: dict, path: str) -> None:
    write_page(render_validation(report), path)
