"""``hisparse plan --search --report page.html``: the search as one self-contained page (plotly.js
inlined as for the plan report): the frontier plot (every point, the Pareto line, the TPOT target,
the best configuration), the ranked table, the frontier, the configurations that cannot run and
why, and the best configuration's launch command, all drawn from the search's JSON."""

from __future__ import annotations

import html

from .page import JS_ESC, document, input_name, kv_table, rows_table, write_page

RANKED = (("rank", "#", "d"), ("deployment", "deployment", "s"), ("system", "system", "s"),
          ("device_buffer_size", "buffer", "d"), ("host_to_device_ratio", "ratio", "g"), ("policy", "policy", "s"),
          ("concurrency", "conc", "d"), ("tok_s_per_gpu", "tok/s/GPU", ".1f"), ("tok_s_per_user", "tok/s/user", ".1f"),
          ("tpot_p99_ms", "TPOT p99 ms", ".1f"), ("ttft_p99_s", "TTFT p99 s", ".2f"), ("band", "band +-", ".2f"),
          ("band_set", "band from", "s"))
FRONTIER = (("config", "configuration", "s"), ("concurrency", "conc", "d"), ("tok_s_per_user", "tok/s/user", ".1f"),
            ("tok_s_per_gpu", "tok/s/GPU", ".1f"), ("tpot_p99_ms", "TPOT p99 ms", ".1f"), ("ttft_p99_s", "TTFT p99 s", ".2f"),
            ("band", "band +-", ".2f"))


def _rows(table_id: str, rows: list[dict], cols) -> str:
    return rows_table(table_id, rows, cols)


_SCRIPT = """
(function () {
  %ESC%
  var rep = JSON.parse(document.getElementById('search-data').textContent);
  var ttft = rep.targets.slo_ttft_s, traces = [];
  ['baseline', 'hisparse'].forEach(function (sys) {
    var pts = rep.points.filter(function (p) { return p.system === sys && p.tok_s_per_user > 0 &&
      (ttft === null || p.ttft_p99_s <= ttft); });
    traces.push({type: 'scatter', mode: 'markers', name: sys, x: pts.map(function (p) { return p.tok_s_per_user; }),
      y: pts.map(function (p) { return p.steady_tok_s_per_gpu; }), text: pts.map(function (p) {
        return esc(p.config) + ' @ ' + p.concurrency; }), marker: {size: 7, opacity: 0.6}});
  });
  traces.push({type: 'scatter', mode: 'lines+markers', name: 'Pareto frontier', line: {shape: 'hv', color: '#000'},
    error_y: {type: 'data', array: rep.frontier.map(function (p) { return p.band === null ? 0 : p.band * p.tok_s_per_gpu; })},
    x: rep.frontier.map(function (p) { return p.tok_s_per_user; }), y: rep.frontier.map(function (p) { return p.tok_s_per_gpu; }),
    text: rep.frontier.map(function (p) { return esc(p.config) + ' @ ' + p.concurrency; })});
  if (rep.best) {
    traces.push({type: 'scatter', mode: 'markers', name: 'best under the targets', x: [rep.best.tok_s_per_user],
      y: [rep.best.tok_s_per_gpu], marker: {symbol: 'star', size: 18, color: '#e0a000', line: {width: 1, color: '#000'}}});
  }
  var x = 1000 / rep.targets.slo_tpot_ms;
  Plotly.newPlot('plot-frontier', traces, {title: {text: 'tok/s/GPU against tok/s/user'},
    xaxis: {title: {text: 'output tokens/s per user'}}, yaxis: {title: {text: 'output tokens/s per GPU'}},
    shapes: [{type: 'line', yref: 'paper', y0: 0, y1: 1, x0: x, x1: x, line: {dash: 'dash', color: '#c00'},
              label: {text: 'TPOT target', font: {color: '#c00'}}}]}, {responsive: true, displaylogo: false});
})();
""".replace("%ESC%", JS_ESC)


def title(report: dict) -> str:
    """The page's title and heading (plain text): the model and workload searched, the --set overrides."""
    sc = report.get("scenario") or {}
    f = sc.get("files") or {}
    return ("hisparse plan --search" + (f": {input_name(f['model'])}, workload {input_name(f['workload'])}"
                                        if f.get("model") and f.get("workload") else "")
            + "".join(f", --set {o.removeprefix('--set ')}" for o in sc.get("overrides") or []))


def _scenario(report: dict) -> str:
    """What was searched: the files, the --set overrides, the targets, the trace (a page mailed alone
    said nothing of the model, workload or targets)."""
    sc = report.get("scenario") or {}
    t = report["targets"]
    rows = [(k, str(v)) for k, v in (sc.get("files") or {}).items()]
    rows += [("--set", o.removeprefix("--set ")) for o in sc.get("overrides") or []]  # held as "--set KEY=VALUE"
    rows.append(("targets", f"TPOT p99 <= {t['slo_tpot_ms']:g} ms"
                            + (f", TTFT p99 <= {t['slo_ttft_s']:g} s" if t.get("slo_ttft_s") else ", no TTFT target")))
    if (report.get("searched") or {}).get("trace"):
        rows.append(("trace", str(report["searched"]["trace"])))
    return kv_table(rows, table_id="scenario")


def render_search(report: dict) -> str:
    best = report["best"]
    head = (f"<p id='best'>Best under the targets: <b>{html.escape(best['config'])}</b> at concurrency "
            f"{best['concurrency']}: {best['tok_s_per_gpu']:.1f} tok/s/GPU, {best['tok_s_per_user']:.1f} tok/s/user.</p>"
            if best else "<p id='best'>No configuration meets the targets.</p>")
    lc = report.get("launch")
    launch = f"<pre id='launch'>{html.escape(lc['command'])}</pre>" if lc else "<p>No launch command.</p>"
    infeasible = "".join(f"<li>{html.escape(i['label'])} [{html.escape(i['stage'])}]: {html.escape(i['reason'])}</li>"
                         for i in report["infeasible"])
    t = report["timing"]
    name = title(report)
    body = (f"<h1>{html.escape(name)}</h1>{head}<div id='plot-frontier' class='plot'></div>"
            f"<h2>Ranked</h2>{_rows('ranked', report['ranked'], RANKED)}"
            f"<h2>Pareto frontier</h2>{_rows('frontier', report['frontier'], FRONTIER)}"
            f"<h2>Launch command (best)</h2>{launch}"
            f"<h2>Cannot run</h2><ul id='infeasible'>{infeasible}</ul>"
            f"<h2>Scenario</h2>{_scenario(report)}"
            f"<p>{t['simulated_points']} simulated points in {t['seconds']:.1f} s.</p>")
    return document(name, body, data_id="search-data", data=report, script=_SCRIPT)


def write_search_report(report: dict, path: str) -> None:
    write_page(render_search(report), path)
