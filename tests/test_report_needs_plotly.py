"""``--report`` without plotly is refused before any work (it ran the whole plan, 17 s, then said so)."""

from __future__ import annotations

import importlib.util

import pytest

from tests.fuzzing import assert_clean_error, run_cli
from tests.helpers import Reached, reached


@pytest.fixture()
def no_plotly(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "plotly" else real(name, *a))

    import simulator.commands.plan as plan_cmd
    import simulator.commands.plan_search as plan_search
    import simulator.serving.planner as planner

    monkeypatch.setattr(planner, "run_plan_full", reached)
    monkeypatch.setattr(planner, "prepare", reached)
    monkeypatch.setattr(plan_cmd, "run_validate", reached)
    monkeypatch.setattr(plan_search, "run_search_cmd", reached)


@pytest.mark.parametrize("extra", [[], ["--search"], ["--validate", "all"]])
def test_plan_report_without_plotly_is_refused_before_the_work(no_plotly, tmp_path, capsys, extra):
    page = tmp_path / "p.html"
    code, _, err = run_cli(["plan", "--report", str(page), *extra], capsys)
    assert_clean_error(code, err, "--report needs the plotly package", "hisparse-sim[report]")
    assert not page.exists()


def test_plan_without_report_does_not_need_plotly(no_plotly, capsys):
    with pytest.raises(Reached):
        run_cli(["plan", "--concurrency", "8"], capsys)
