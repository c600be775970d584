"""``hisparse.swap_in_copy``: the plan-then-copy design adds its measured fixed cost to every
swap-in launch, nothing else; a bad name is a clear error."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from simulator.costmodel import CostModel
from simulator.errors import HisparseError
from simulator.serving import presets as P
from simulator.serving.swap_designs import SWAP_IN_COPY, swap_in_extra_us


def _cost(extra_us: float) -> CostModel:
    return CostModel(P.load("models", "glm-5.1-fp8"), P.load("gpus", "h200"),
                     P.load("deployments", "8xh200-colocated-dp8"), P.load("calibration", "uncalibrated"),
                     swap_in_extra_us=extra_us)


def test_plan_copy_adds_its_fixed_cost_per_launch():
    hs = P.load("hisparse", "blog-8xh200")
    assert swap_in_extra_us(hs) == 0.0 and swap_in_extra_us(None) == 0.0
    plan = dataclasses.replace(hs, swap_in_copy="plan")
    extra = swap_in_extra_us(plan)
    assert extra == pytest.approx(SWAP_IN_COPY["plan"]) and extra > 0
    rows = np.array([0.0, 400.0, 41_000.0])
    fused, planned = _cost(0.0), _cost(extra)
    diff = planned.swap_in_layer(rows, batch=100) - fused.swap_in_layer(rows, batch=100)
    np.testing.assert_allclose(diff, extra * 1e-6)  # the same rows cost, one fixed cost more
    whole = planned.swap_in(rows, batch=100) - fused.swap_in(rows, batch=100)
    n = fused.m.hisparse_layers
    np.testing.assert_allclose(whole, extra * 1e-6 * n * (1 - fused.p.swap_in_overlap))


def test_unknown_design_is_refused():
    hs = P.load("hisparse", "blog-8xh200")
    with pytest.raises(HisparseError, match="swap_in_copy = 'wide': must be one of fused, plan"):
        dataclasses.replace(hs, swap_in_copy="wide").check()
