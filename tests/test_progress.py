"""Progress bars (simulator/progress.py): drawn only on a terminal, and a callback counter that shows
its bar before the first step and counts each step when it is done."""

from __future__ import annotations

import io
import sys

from simulator.progress import counter, progress


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_counter_draws_at_once_and_counts_each_call(monkeypatch):
    err = _Terminal()
    monkeypatch.setattr(sys, "stderr", err)
    tick = counter(3, desc="points", unit="pt")
    assert "0/3" in err.getvalue()  # before any point: the old iter(progress(...)) drew nothing here
    tick()
    assert "1/3" in err.getvalue()  # the first point counted when it is done, not at the second call
    tick()
    tick()
    tick()  # past the total (a plan's re-run after its prefetch): ignored
    assert "3/3" in err.getvalue() and "4/3" not in err.getvalue()


def test_counter_and_progress_are_silent_off_a_terminal_or_quiet(monkeypatch):
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    counter(5)()
    assert list(progress([1, 2])) == [1, 2]
    monkeypatch.setattr(sys, "stderr", _Terminal())
    counter(5, quiet=True)()
    counter(0)()
    assert err.getvalue() == "" and sys.stderr.getvalue() == ""
