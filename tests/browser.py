"""Open a report page in Debian's headless chromium through Playwright, offline: every request
that is not a file:// one is refused and recorded, console errors and page errors are recorded."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None)
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--no-first-run"]
# A guard against a page that never renders, not a speed check: the plot appears in ~4 s on a
# loaded 2-core machine (plotly.js is 4.8 MB); Playwright's default of 30 s is too near under load.
GUARD_MS = 120_000
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")


@contextlib.contextmanager
def open_page(path: Path, wait_for: str) -> Iterator[tuple[object, list[str], list[str]]]:
    """(page, console/page errors, remote URLs asked for), once ``wait_for`` is in the page."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw, tempfile.TemporaryDirectory() as profile:
        ctx = pw.chromium.launch_persistent_context(profile, executable_path=CHROMIUM, headless=True, args=ARGS,
                                                    timeout=GUARD_MS)
        try:
            ctx.set_default_timeout(GUARD_MS)
            page = ctx.new_page()
            errors: list[str] = []
            remote: list[str] = []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))

            def only_local(route):
                if route.request.url.startswith("file://"):
                    route.continue_()
                else:
                    remote.append(route.request.url)
                    route.abort()

            page.route("**/*", only_local)
            page.goto(Path(path).as_uri())
            page.wait_for_selector(wait_for)
            yield page, errors, remote
        finally:
            ctx.close()


def table_cells(page, table_id: str) -> list[dict[str, str]]:
    """The rows of a report table as {data-key: text}."""
    return page.evaluate(f"""Array.from(document.querySelectorAll('#{table_id} tr[data-row]')).map(tr =>
        Object.fromEntries(Array.from(tr.querySelectorAll('td')).map(td => [td.dataset.key, td.textContent])))""")


def plotted(page, plot_id: str) -> list[dict]:
    """The traces plotly holds for a plot: name, x, y, text."""
    return page.evaluate(f"document.getElementById('{plot_id}').data.map(t => ({{name: t.name, x: t.x, y: t.y, "
                         f"text: t.text === undefined ? null : t.text}}))")
