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


def test_the_generator_reports_every_drawn_step_and_draws_the_same_streams():
    """trace gen's bar counted whole streams: one long stream showed 0/1 for minutes. The generator
    now reports steps as it draws them (IndexShare's shared layers all at once), which changes no draw."""
    import dataclasses

    import numpy as np

    from simulator.trace.generator import PRESETS, STEP_REPORT, generate

    knobs, _ = PRESETS["dsv32"].for_k(64)
    shape = dict(steps=2 * STEP_REPORT + 5, layers=3, requests=2, k=64, ctx0=400, seed=3)
    calls: list[int] = []
    with_bar = list(generate(knobs, **shape, on_steps=calls.append))
    plain = list(generate(knobs, **shape))
    assert sum(calls) == 2 * 3 * shape["steps"] and max(calls) <= shape["steps"]
    assert all(np.array_equal(a.indices, b.indices) for a, b in zip(with_bar, plain, strict=True))
    shared = dataclasses.replace(knobs, share_freq=2)
    calls.clear()
    list(generate(shared, **shape, on_steps=calls.append))
    assert sum(calls) == 2 * 3 * shape["steps"]


def test_counter_takes_several_steps_at_once(monkeypatch):
    err = _Terminal()
    monkeypatch.setattr(sys, "stderr", err)
    tick = counter(100, unit="step")
    tick(64)
    assert "64/100" in err.getvalue()
    tick(64)  # past the total: clipped
    assert "100/100" in err.getvalue() and "128/100" not in err.getvalue()


def test_status_keeps_a_line_current_and_erases_it(monkeypatch):
    """The plan's search (forked workers, one per system) has no steps to count: a line with the
    elapsed time stands for it on a terminal, and nothing off one."""
    import time

    from simulator.progress import status

    err = _Terminal()
    monkeypatch.setattr(sys, "stderr", err)
    with status("search", every_s=0.05):
        time.sleep(0.3)
    drawn = err.getvalue()
    assert drawn.count("search: 00:0") >= 3  # drawn at once and refreshed while the block ran
    quiet = io.StringIO()
    monkeypatch.setattr(sys, "stderr", quiet)
    with status("search"):
        pass
    assert quiet.getvalue() == ""


def test_a_plans_bar_total_is_the_points_it_simulates():
    """The bar's total counted the baseline's points where the baseline cannot run (no request fits its
    pool): the bar then never reached its end."""
    from simulator.serving.planner import Prepared

    assert Prepared(None, ((4, 0.0), (8, 0.0)), (None, None)).swept_points == 6
    assert Prepared(None, ((4, 0.0), (8, 0.0)), (None, None), baseline=False).swept_points == 4
