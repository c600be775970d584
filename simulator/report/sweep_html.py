"""``hisparse sweep GRID.toml --report sweep.html``: a sweep's results as one self-contained page
(``page.py``): every row of OUT/results.parquet (its columns, as stored) in one table, the failed
points with their error, and plots chosen by the grid's kind, drawn in the browser from the
embedded JSON: a replay grid's miss ratio against the buffer, one line per policy (and per value
of any other varied key); a plan grid's steady throughput and TPOT p99 against the load, one line
per system and knob set (the baseline's lines leave out the HiSparse knobs, which it ignores)."""

from __future__ import annotations

import html
import math
from typing import Any

from .page import JS_ESC, document, kv_table, rows_table, write_page

# keys that are the x axis or the outputs, never part of a line's name
_LOAD = ("concurrency", "rate")
HISPARSE_KNOBS = ("device_buffer_size", "host_to_device_ratio", "hisparse")


def _value(v: Any) -> Any:
    """A parquet cell as JSON: numpy scalars as Python, NaN (a failed point's outputs) as None."""
    if hasattr(v, "item") and getattr(v, "ndim", 1) == 0:
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def sweep_data(table, *, kind: str, axes: tuple[str, ...], grid: str, results: str) -> dict:
    """The page's JSON: the grid, its varied keys, the columns and every row of the results."""
    cols = [str(c) for c in table.columns]
    rows = [{c: _value(v) for c, v in zip(cols, rec, strict=True)} for rec in table.itertuples(index=False, name=None)]
    return {"grid": grid, "results": results, "kind": kind, "axes": list(axes), "columns": cols, "rows": rows}


def _spec(values: list) -> str:
    present = [v for v in values if v is not None]
    if present and all(isinstance(v, bool) for v in present):
        return "b"
    if present and all(isinstance(v, int) and not isinstance(v, bool) for v in present):
        return "d"
    if present and all(isinstance(v, int | float) and not isinstance(v, bool) for v in present):
        return ".6g"
    return "s"


def columns(data: dict) -> list[tuple[str, str, str]]:
    """The results table's columns: (key, header, format), the format from the column's values."""
    return [(c, c, _spec([r.get(c) for r in data["rows"]])) for c in data["columns"]]


_SCRIPT = """
(function () {
  %ESC%
  var d = JSON.parse(document.getElementById('sweep-data').textContent);
  var ok = d.rows.filter(function (r) { return !r.error; });
  if (!ok.length) {  // every point failed: say so, not empty axes
    document.getElementById('plots').textContent = 'no point ran: nothing to plot (the failed points are listed below)';
    return;
  }
  var cfg = {responsive: true, displaylogo: false};
  function lines(rows, x, y, skip, prefix) {
    var keys = d.axes.filter(function (k) { return skip.indexOf(k) < 0 && k !== x; });
    var groups = {}, seen = {};
    rows.forEach(function (r) {
      if (r[x] === null || r[x] === undefined || r[y] === null || r[y] === undefined) { return; }
      var name = prefix(r) + keys.map(function (k) { return k + ' ' + r[k]; }).join(', ');
      var at = name + '|' + r[x];
      if (seen[at]) { return; }  // the baseline repeats over the HiSparse knobs it ignores
      seen[at] = true;
      (groups[name] = groups[name] || []).push(r);
    });
    return Object.keys(groups).map(function (name) {
      var g = groups[name].slice().sort(function (a, b) { return a[x] - b[x]; });
      return {type: 'scatter', mode: 'lines+markers', name: esc(name || y), x: g.map(function (r) { return r[x]; }),
              y: g.map(function (r) { return r[y]; }), text: g.map(function (r) { return 'point ' + r.point; })};
    });
  }
  function xaxis(x, rows) {
    var v = rows.map(function (r) { return r[x]; }).filter(function (a) { return a > 0; });
    var log = v.length && Math.max.apply(null, v) / Math.min.apply(null, v) >= 8;
    return {title: {text: x}, type: log ? 'log' : 'linear'};
  }
  if (d.kind === 'replay') {
    if (d.columns.indexOf('buffer') < 0) { document.getElementById('plots').textContent = 'no buffer column: nothing to plot'; return; }
    var t = lines(ok, 'buffer', 'miss_ratio', ['policy'], function (r) { return (r.policy || 'default policy') + ', '; });
    t.forEach(function (tr) { tr.name = tr.name.replace(/, $/, ''); });
    Plotly.newPlot('plot-miss', t, {title: {text: 'miss ratio against the buffer, per policy'}, xaxis: xaxis('buffer', ok),
      yaxis: {title: {text: 'miss ratio'}}}, cfg);
    return;
  }
  var x = d.columns.indexOf('concurrency') >= 0 ? 'concurrency' : 'rate';
  ['steady_tok_s_deployment', 'tpot_p99_ms'].forEach(function (m, i) {
    var base = lines(ok, x, 'baseline_' + m, ['rate', 'concurrency'].concat(%KNOBS%), function () { return 'baseline, '; });
    var hs = lines(ok, x, 'hisparse_' + m, ['rate', 'concurrency'], function () { return 'hisparse, '; });
    var t = base.concat(hs);
    t.forEach(function (tr) { tr.name = tr.name.replace(/, $/, ''); });
    var slo = ok.map(function (r) { return r.slo_tpot_ms; }).filter(function (v) { return v !== null && v !== undefined; });
    var one = slo.length === ok.length && slo.every(function (v) { return v === slo[0]; });  // the grid's one target
    var shapes = i && one ? [{type: 'line', xref: 'paper', x0: 0, x1: 1, y0: slo[0], y1: slo[0],
      line: {dash: 'dash', color: '#c00'}, label: {text: 'target ' + slo[0] + ' ms', textposition: 'end', font: {color: '#c00'}}}] : [];
    Plotly.newPlot(i ? 'plot-tpot' : 'plot-throughput', t, {title: {text: i ? 'TPOT p99' : 'steady output throughput, whole deployment'},
      xaxis: xaxis(x, ok), yaxis: {title: {text: i ? 'ms' : 'tokens/s'}}, shapes: shapes}, cfg);
  });
})();
""".replace("%KNOBS%", str(list(HISPARSE_KNOBS))).replace("%ESC%", JS_ESC)


def render_sweep(data: dict) -> str:
    """The page for a sweep's results (``sweep_data``'s object)."""
    rows = data["rows"]
    failed = [r for r in rows if r.get("error")]
    plots = ("<div id='plot-miss' class='plot'></div>" if data["kind"] == "replay" else
             "<div id='plot-throughput' class='plot'></div><div id='plot-tpot' class='plot'></div>")
    fails = "".join(f"<li data-point='{html.escape(str(r['point']))}'>point {html.escape(str(r['point']))} ("
                    + html.escape(", ".join(f"{k}={r.get(k)}" for k in data["axes"])) + f"): {html.escape(str(r['error']))}</li>"
                    for r in failed)
    body = (f"<h1>hisparse sweep: {html.escape(data['grid'])}</h1>"
            + kv_table([("grid", data["grid"]), ("kind", data["kind"]), ("varied", ", ".join(data["axes"]) or "(none)"),
                        ("results", data["results"]),
                        ("points", f"{len(rows)} ({len(failed)} failed)")], table_id="about")
            + f"<div id='plots'>{plots}</div>"
            + f"<h2>Failed points</h2><ul id='failed'>{fails}</ul>" + ("" if failed else "<p>None.</p>")
            + "<h2>Every point</h2>"
            + rows_table("results", rows, columns(data), left=[c for c, _, f in columns(data) if f == "s"],
                         row_class=lambda r: "failed" if r.get("error") else ""))
    return document(f"hisparse sweep: {data['grid']}", body, data_id="sweep-data", data=data, script=_SCRIPT)


def write_sweep_report(data: dict, path: str) -> None:
    write_page(render_sweep(data), path)
