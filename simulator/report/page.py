"""What every HTML report shares: the head (style, plotly.js inlined), the JSON the page is drawn
from, tables and the number formats the browser tests parse back, and the atomic write.

plotly.js comes from the ``plotly`` Python package (``plotly.offline.get_plotlyjs()``: the one
file the package bundles), inlined so that a page opens offline and can be mailed as one file.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

CSS = """
body { font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 1200px; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.6em; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0; }
td, th { border: 1px solid #ccc; padding: 2px 6px; text-align: right; }
th { background: #f3f3f3; } td.l, th.l { text-align: left; }
tr.choice td { background: #fff3c4; font-weight: bold; }
tr.failed td { background: #fde2e2; }
pre { background: #f6f6f6; padding: 0.6em; white-space: pre-wrap; word-break: break-all; }
.flag { color: #a40; font-weight: bold; } .plot { width: 100%; height: 420px; }
"""

# a table column: (key in the JSON row, header, format spec for ``fmt``)
Column = tuple[str, str, str]


def fmt(value: Any, spec: str) -> str:
    """A cell as the page shows it (the browser tests parse these back): ``b`` yes/blank, ``s``
    text, ``d`` integer, else a ``format`` spec (``.1f``, ``+.1%``); None or NaN is blank."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if spec == "b":
        return "yes" if value else ""
    if spec == "s":
        return str(value)
    if spec == "d":
        return str(int(value))
    return format(float(value), spec)


NO_PLOTLY = ("--report needs the plotly package (its bundled plotly.js is inlined): pip install "
             "'hisparse-sim[report]' (in a checkout: pip install -e '.[report]')")


def require_plotly() -> None:
    """Raise the error ``plotly_js`` would, before any work: a plan or sweep asked for a page ran to the
    end (17-24 s) and only then said plotly was missing, with no page and, for a sweep, no results.parquet."""
    import importlib.util

    if importlib.util.find_spec("plotly") is None:
        from ..errors import HisparseError

        raise HisparseError(NO_PLOTLY)


def plotly_js() -> str:
    """plotly.js as one string, or the error saying how to get it."""
    try:
        from plotly.offline import get_plotlyjs
    except ImportError:
        from ..errors import HisparseError

        raise HisparseError(NO_PLOTLY) from None
    return get_plotlyjs()


def kv_table(rows: Iterable[tuple[str, str]], table_id: str | None = None) -> str:
    """Two columns, a name and its value (the scenario, a set's source)."""
    ident = f" id='{table_id}'" if table_id else ""
    return f"<table{ident}>" + "".join(f"<tr><th class='l'>{html.escape(k)}</th><td class='l'>{html.escape(v)}</td></tr>"
                                       for k, v in rows) + "</table>"


def rows_table(table_id: str, rows: Sequence[dict], cols: Sequence[Column], *, left: Iterable[str] = (),
               row_class: Callable[[dict], str] | None = None) -> str:
    """One row per record: each cell carries ``data-key`` (its JSON key) and each row ``data-row``
    (its index), so a test can read the table back against the JSON. ``left``: text columns."""
    left = set(left)
    head = "".join(f"<th class='{'l' if k in left else ''}'>{html.escape(h)}</th>" for k, h, _ in cols)
    body = []
    for i, r in enumerate(rows):
        cls = row_class(r) if row_class else ""
        cells = "".join(f"<td data-key='{html.escape(k)}'{' class=l' if k in left else ''}>{html.escape(fmt(r.get(k), f))}</td>"
                        for k, _, f in cols)
        body.append(f"<tr data-row='{i}'{f' class={cls}' if cls else ''}>{cells}</tr>")
    return f"<table id='{table_id}'><tr>{head}</tr>{''.join(body)}</table>"


def data_json(obj: Any) -> str:
    """``obj`` as JSON safe inside a <script> element: no ``<``, ``>`` or ``&`` at all (each as its
    ``\\u`` escape, which ``JSON.parse`` reads back). Replacing ``</`` alone was not enough: a
    string holding ``<!--<script>`` (a preset path, a trace, a --set value) put the HTML parser in
    the script's "double escaped" state, the data element swallowed the drawing code and every plot
    stayed blank. NaN refused: json_safe first."""
    text = json.dumps(obj, default=str, allow_nan=False)
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


def input_name(where: str | None) -> str:
    """A scenario file as a heading names it: the preset name or the file's stem, without the
    ``with --set ...`` / ``(figures from ...)`` the scenario's descriptions append (``Path.stem``
    of the whole text cut the heading inside the first --set)."""
    from pathlib import Path

    text = str(where or "")
    for tail in (" with --set ", " (figures from "):
        text = text.split(tail)[0]
    return Path(text).stem if text.endswith((".toml", ".json")) else text


# JS: a user's text (a trace path, a set's label) as plotly shows it: plotly reads <b>, <br>, <a>
# and entities in trace names and hover text, so "tr<b>&/t.hst" was drawn as "tr&/t.hst" in bold
JS_ESC = ("function esc(s) { return String(s).replace(/&/g, '&amp;').replace(/</g, '&lt;')"
          ".replace(/>/g, '&gt;'); }")


def document(title: str, body: str, *, data_id: str, data: Any, script: str) -> str:
    """A whole page: three scripts (plotly.js, the data, the drawing code that reads the data).
    ``title``: plain text (escaped here), the same words as the page's heading."""
    return (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{CSS}</style><script>{plotly_js()}</script></head><body>{body}"
            f"<script type='application/json' id='{data_id}'>{data_json(data)}</script><script>{script}</script>"
            f"</body></html>\n")


def write_page(text: str, path: str) -> None:
    """The page at ``path``, whole or not at all (``fileio.atomic_output``)."""
    from ..fileio import atomic_output

    with atomic_output(path) as fh:
        fh.write(text.encode())
