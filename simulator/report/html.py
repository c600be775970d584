"""``hisparse plan --report plan.html``: one self-contained HTML file, no network.

The page inlines plotly.js from the ``plotly`` package (``plotly.offline.get_plotlyjs()``, the
library the Python package bundles: one file, no CDN) and the plan's JSON report; the plots are
drawn from that JSON in the browser (throughput, TPOT p99 and TTFT p99 against the load, per system
and knob set, with the targets as lines and the recommendation marked), and the tables (the
recommendation, the scenario, the launch command, every point) are written here from the same
JSON, so the page shows exactly the numbers ``--json`` prints.
"""

from __future__ import annotations

import html
import json

from .page import document, fmt, input_name, kv_table, rows_table, write_page

__all__ = ["COLUMNS", "fmt", "render", "write_report"]

# the columns of the points table: (key, header, format)
COLUMNS = (("system", "system", "s"), ("nodes", "nodes", "d"), ("residency", "residency", "s"),
           ("speculative", "speculative", "s"), ("prefetch", "IndexShare prefetch", "s"),
           ("device_buffer_size", "buffer", "d"),
           ("host_to_device_ratio", "host ratio", "g"),
           ("concurrency", "conc", "d"), ("rate_per_s", "rate/s", "g"), ("steady_tok_s_deployment", "steady tok/s", ".1f"),
           ("steady_tok_s_per_gpu", "tok/s/GPU", ".1f"), ("tpot_p99_ms", "TPOT p99 ms", ".1f"),
           ("ttft_p99_s", "TTFT p99 s", ".2f"), ("max_running_deployment", "max run", "d"),
           ("overloaded", "over", "b"), ("searched", "found by search", "b"), ("usd_per_m_output_tokens", "$/M out", ".3f"),
           ("band", "band +-", ".2f"), ("band_set", "band from", "s"), ("ttft_band", "TTFT band +-", ".2f"))


def _is(row: dict | None, other: dict | None) -> bool:
    keys = ("system", "device_buffer_size", "host_to_device_ratio", "concurrency", "rate_per_s", "speculative",
            "residency", "nodes", "prefetch")
    return bool(row and other and all(row.get(k) == other.get(k) for k in keys))


def shown(key: str, rows: list[dict]) -> bool:
    """Whether the points table shows a column: one some row fills, but not a closed loop's rate
    (0 on every row) nor a residency that is the default swap on every row (blank for the baseline)."""
    if key == "rate_per_s":
        return any(not r.get("concurrency") for r in rows)
    if key == "residency":
        return any(r.get(key) not in (None, "", "swap") for r in rows)
    return any(r.get(key) is not None for r in rows)


def _points_table(report: dict) -> str:
    rows = report["rows"]
    cols = [c for c in COLUMNS if shown(c[0], rows)]
    choice = report["recommendation"]["choice"]
    return rows_table("points", rows, cols, left=("system",), row_class=lambda r: "choice" if _is(r, choice) else "")


def _recommendation(report: dict) -> str:
    rec = report["recommendation"]
    target = f"TPOT p99 &le; {rec['slo_tpot_ms']:g} ms" + (
        f", TTFT p99 &le; {rec['slo_ttft_s']:g} s" if rec["slo_ttft_s"] else ", no TTFT target")
    c = rec["choice"]
    if c is None:
        return f"<p id='recommendation'>No configuration meets {target} while serving its load.</p>" + "".join(_whatifs(report))
    load = f"concurrency {c['concurrency']}" if c["concurrency"] else f"{c['rate_per_s']:.4g} requests/s"
    knobs = "" if c["system"] == "baseline" else (
        f" (device_buffer_size {c['device_buffer_size']}, host_to_device_ratio {c['host_to_device_ratio']:g}"
        + (f", residency {c['residency']}" if c.get("residency") not in (None, "", "swap") else "") + ")")
    # what else tells the pick from its neighbours in the table (--speculative, --nodes)
    if c.get("speculative") not in (None, "", "off"):
        knobs += f", speculative {c['speculative']}"
    if c.get("nodes"):
        knobs += f", {c['nodes']} node(s)" + (f" ({c['gpus']} GPUs)" if c.get("gpus") else "")
    parts = [f"<p id='recommendation'>Under {target}: <b><span id='rec-system'>{c['system']}</span>{html.escape(knobs)} at "
             f"{load}</b>: <span id='rec-tok'>{c['steady_tok_s_deployment']:.1f}</span> tok/s steady, TPOT p99 "
             f"<span id='rec-tpot'>{c['tpot_p99_ms']:.1f}</span> ms, TTFT p99 <span id='rec-ttft'>{c['ttft_p99_s']:.2f}</span> s"]
    if c.get("usd_per_m_output_tokens") is not None:
        parts.append(f", <span id='rec-cost'>{c['usd_per_m_output_tokens']:.3f}</span> $/M output tokens")
    parts.append(".</p>")
    if rec.get("hisparse_over_baseline"):
        parts.append(f"<p>Best HiSparse / best baseline under the targets: {rec['hisparse_over_baseline']:.2f}x.</p>")
    if rec.get("tie"):
        parts.append(f"<p class='flag' id='tie'>TIE: the systems are within the model's error band "
                     f"({rec['tie_band']:.0%}: {html.escape(rec['tie_band_source'])}); the baseline is named.</p>")
    parts += _whatifs(report)
    if rec.get("choice_at_edge"):
        parts.append("<p class='flag' id='edge'>EDGE: the pick is the highest load searched; a higher load may "
                     "also meet the targets.</p>")
    return "".join(parts)


def _whatifs(report: dict) -> list[str]:
    """The what-if answers the plan printed (--compare-speculative, --compare-prefetch), one paragraph each."""
    from ..serving import prefetch_whatif, spec_whatif

    out = []
    for key, lines, pid in (("speculative_whatif", spec_whatif.summary_lines, "speculative-whatif"),
                            ("prefetch_whatif", prefetch_whatif.summary_lines, "prefetch-whatif")):
        if report.get(key):
            out += [f"<p class='whatif' id='{pid}-{i}'>{html.escape(line)}</p>" for i, line in enumerate(lines(report[key]))]
    return out


def _scenario(report: dict) -> str:
    sc = report["scenario"]
    f = sc["files"]
    lay = sc["layout"]
    rows = [("model", f["model"]), ("gpu", f["gpu"]), ("deployment", f["deployment"]), ("workload", f["workload"]),
            ("hisparse config", f["hisparse"]), ("calibration", str(sc["calibration"])),
            ("layout", f"{lay['gpus']} GPUs, {lay['instances']} instance(s), {lay['ranks']} scheduler(s), "
                       f"{lay['attention']} attention, {lay['mode']}, MoE {lay['moe']}")]
    rows += [("--set", o.removeprefix("--set ")) for o in sc.get("overrides", [])]  # held as "--set KEY=VALUE"
    if sc.get("trace"):
        rows += [("trace", sc["trace"]["how"] or str(sc["trace"]["file"]))]
    for system, b in (report.get("bands") or {}).items():
        if b:
            label = f"band {system.replace('_ttft', ' TTFT')}"
            rows += [(label, f"+-{b['band']:.0%} (largest {b['max']:.0%}): {b['how']}")]
    rows += [("note", n) for n in sc.get("notes", [])]
    if report.get("prices"):
        rows += [("prices", json.dumps(report["prices"]))]
    return kv_table(rows)


def _launch(report: dict) -> str:
    lc = report.get("launch", {}).get("choice")
    if not lc:
        return "<p>No recommended configuration: no launch command.</p>"
    out = [f"<pre id='launch'>{html.escape(lc['command'])}</pre>"]
    if lc["hisparse_config"]:
        out.append(f"<p>--hisparse-config:</p><pre id='hisparse-config'>{html.escape(json.dumps(lc['hisparse_config']))}</pre>")
    out += [f"<p>{html.escape(n)}</p>" for n in lc["notes"]]
    return "".join(out)


_SCRIPT = """
(function () {
  var report = JSON.parse(document.getElementById('plan-data').textContent);
  var rows = report.rows, rec = report.recommendation;
  var open = rows.length > 0 && rows.every(function (r) { return !r.concurrency; });
  var x = function (r) { return open ? r.rate_per_s : r.concurrency; };
  var xlabel = open ? 'arrival rate (requests/s)' : 'concurrency (clients)';
  var groups = {};
  rows.forEach(function (r) {
    var name = (r.system === 'baseline' ? 'baseline' :
      'hisparse (buffer ' + r.device_buffer_size + ', ratio ' + r.host_to_device_ratio + ')') +
      (r.speculative && r.speculative !== 'off' ? ', ' + r.speculative : '');
    if (r.residency && r.residency !== 'swap') { name += ', ' + r.residency; }  // --residency
    if (r.prefetch) { name += ', prefetch ' + r.prefetch; }  // --compare-prefetch
    if (r.nodes) { name += ', ' + r.nodes + ' node(s)'; }  // --nodes
    (groups[name] = groups[name] || []).push(r);
  });
  function traces(key) {
    var out = Object.keys(groups).map(function (name) {
      var g = groups[name].slice().sort(function (a, b) { return x(a) - x(b); });
      var banded = key !== 'ttft_p99_s';  // TTFT carries no band (no published TTFT)
      return {type: 'scatter', mode: 'lines+markers', name: name, x: g.map(x), y: g.map(function (r) { return r[key]; }),
              error_y: {type: 'data', visible: banded, array: g.map(function (r) { return r.band === null ? 0 : r.band * r[key]; })},
              marker: {symbol: g.map(function (r) { return r.searched ? 'diamond' : 'circle'; }), size: 8},
              text: g.map(function (r) { return (r.searched ? 'found by search' : 'swept') + (r.overloaded ? ', overloaded' : ''); })};
    });
    if (rec.choice) {
      out.push({type: 'scatter', mode: 'markers', name: 'recommendation', x: [x(rec.choice)], y: [rec.choice[key]],
                marker: {symbol: 'star', size: 18, color: '#e0a000', line: {width: 1, color: '#000'}}});
    }
    return out;
  }
  function hline(y, label) {
    return {type: 'line', xref: 'paper', x0: 0, x1: 1, y0: y, y1: y, line: {dash: 'dash', color: '#c00'},
            label: {text: label, textposition: 'end', font: {color: '#c00'}}};
  }
  var axis = {title: {text: xlabel}, type: open ? 'linear' : 'log'};
  var cfg = {responsive: true, displaylogo: false};
  Plotly.newPlot('plot-throughput', traces('steady_tok_s_deployment'),
    {title: {text: 'steady output throughput, whole deployment'}, xaxis: axis, yaxis: {title: {text: 'tokens/s'}}}, cfg);
  Plotly.newPlot('plot-tpot', traces('tpot_p99_ms'),
    {title: {text: 'TPOT p99'}, xaxis: axis, yaxis: {title: {text: 'ms'}},
     shapes: [hline(rec.slo_tpot_ms, 'target ' + rec.slo_tpot_ms + ' ms')]}, cfg);
  Plotly.newPlot('plot-ttft', traces('ttft_p99_s'),
    {title: {text: 'TTFT p99'}, xaxis: axis, yaxis: {title: {text: 's'}, type: 'log'},
     shapes: rec.slo_ttft_s ? [hline(rec.slo_ttft_s, 'target ' + rec.slo_ttft_s + ' s')] : []}, cfg);
})();
"""


def title(report: dict) -> str:
    """The page's title and heading (plain text): the model, deployment and workload as the command
    named them (a preset name or a file's stem), the --set overrides and the node counts."""
    f = report["scenario"]["files"]
    given = report.get("inputs") or {}

    def name(key: str) -> str:
        return input_name(given.get(key) or f[key])

    nodes = (report["recommendation"].get("nodes") or {}).get("nodes")
    return (f"hisparse plan: {name('model')} on {name('deployment')}"
            + (f" ({', '.join(map(str, nodes))} nodes)" if nodes else "") + f", workload {name('workload')}"
            + "".join(f", --set {o}" for o in given.get("overrides") or []))


def render(report: dict) -> str:
    """The page for a plan report (``hisparse plan --json``'s object)."""
    head = title(report)
    body = (f"<h1>{html.escape(head)}</h1><h2>Recommendation</h2>{_recommendation(report)}"
            f"<div id='plot-throughput' class='plot'></div><div id='plot-tpot' class='plot'></div>"
            f"<div id='plot-ttft' class='plot'></div>"
            f"<h2>Launch command</h2>{_launch(report)}<h2>Scenario</h2>{_scenario(report)}"
            f"<h2>Every point</h2>{_points_table(report)}")
    return document(head, body, data_id="plan-data", data=report, script=_SCRIPT)


def write_report(report: dict, path: str) -> None:
    write_page(render(report), path)
