"""Shared pytest fixtures, the GPU skip rule and the two test tiers.

Tiers: ``python -m pytest`` runs the default tier (``-m 'not slow'`` in pyproject.toml, the
``ci`` hypothesis profile: fewer examples per property); ``HYPOTHESIS_PROFILE=slow python -m
pytest -m slow`` runs the slow tier: the tests marked ``slow`` and, at their full example counts
(``tests/fuzzing.py``), every property test and every test of the ``test_fuzz_*`` files (their
properties are defined inside the tests). ``HYPOTHESIS_PROFILE=slow python -m pytest -m ''`` runs
everything at full strength.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings

from tests.fuzzing import PROFILE, examples_for

# Defaults of a property test that names no count of its own; fuzz_settings sets each one's.
for _name in ("ci", "slow"):
    settings.register_profile(_name, max_examples=examples_for(100) if _name == PROFILE else 100, deadline=None,
                              derandomize=True, database=None,
                              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
settings.load_profile(PROFILE)


@pytest.fixture()
def no_simulation(monkeypatch):
    """``hisparse plan`` stops with ``tests.helpers.Reached`` where it would start simulating."""
    import simulator.serving.planner as planner
    from tests.helpers import reached

    monkeypatch.setattr(planner, "run_plan_full", reached)


@pytest.fixture()
def private_cache(tmp_path, monkeypatch):
    """A fresh HISPARSE_CACHE for the test: generated traces, replays and plans land in its tmp_path,
    never in the user's cache (a module asks for it with ``pytestmark = pytest.mark.usefixtures(
    "private_cache")``)."""
    monkeypatch.setenv("HISPARSE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture()
def trace(tmp_path):
    """A small valid trace file (one stream, k 16, 20 steps) for the CLI's error tests."""
    import numpy as np

    from simulator.trace import TraceMeta, write_trace
    from tests.helpers import random_stream

    path = tmp_path / "t.hst"
    write_trace(path, TraceMeta(k=16, source={"kind": "test"}),
                [random_stream(np.random.default_rng(0), steps=20, k=16, ctx0=40)])
    return str(path)


def _have_gpu() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


@pytest.hookimpl(tryfirst=True)  # before -m deselects
def pytest_collection_modifyitems(config, items):
    if PROFILE == "slow":  # every property test at its full count belongs to the slow tier
        for item in items:
            if item.path.name.startswith("test_fuzz_") \
                    or getattr(getattr(item, "obj", None), "is_hypothesis_test", False):
                item.add_marker(pytest.mark.slow)
    if _have_gpu():
        return
    skip = pytest.mark.skip(reason="no NVIDIA GPU / CuPy on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
