"""The step terms' fits recover known parameters (CPU only), and the fitted terms price ops."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from simulator.calibration.fitting import fit_indexer, fit_roofline, fit_step_terms
from simulator.calibration.model_shapes import GLM_5_1
from simulator.costmodel.ops import Layout, layer_ops
from simulator.costmodel.terms import IndexerTerm, Rate, StepTerms


def _roof(b, f, launch=6e-6, bw=3e12, rate=600e12):
    return (launch + np.maximum(b / bw, f / rate)) * 1e6


def test_fit_roofline_recovers_both_regimes():
    rng = np.random.default_rng(0)
    b = np.geomspace(1e5, 1e9, 40)
    f = b * rng.choice([2.0, 20.0, 2000.0], 40)  # weight-bound and compute-bound shapes
    us = _roof(b, f) * (1 + rng.normal(0, 0.003, 40))
    fit = fit_roofline(b, f, us)
    assert fit["launch_us"] == pytest.approx(6, abs=1.0)
    assert fit["gbps"] == pytest.approx(3000, rel=0.02)
    assert fit["tflops"] == pytest.approx(600, rel=0.03)
    assert fit["median_rel_err"] < 0.01


def test_fit_roofline_without_compute_bound_points_has_no_rate():
    b = np.geomspace(1e4, 1e8, 12)
    fit = fit_roofline(b, np.zeros(12), _roof(b, 0 * b))
    assert fit["tflops"] is None and fit["gbps"] == pytest.approx(3000, rel=1e-3)


def test_fit_indexer_recovers_its_terms():
    term = IndexerTerm(launch_s=9e-6, bw=3.5e12, select_s_per_token=0.12e-9)
    rows = [dict(batch=b, ctx=c, us=term.time(b, b * c) * 1e6) for b in (1, 8, 32, 128, 200) for c in (8192, 65536, 163840)]
    fit = fit_indexer(pd.DataFrame(rows))
    assert fit["launch_us"] == pytest.approx(9, rel=1e-3)
    assert fit["gbps"] == pytest.approx(3500, rel=1e-3)
    assert fit["select_ns_per_token"] == pytest.approx(0.12, rel=1e-3)


def test_step_terms_price_every_op_of_a_layer():
    ops = layer_ops(GLM_5_1, 16, 16 * 30000.0, Layout(), kv_row_bytes=1152)
    gemm = pd.DataFrame([dict(kind=o.kind, dtype=o.dtype, bytes=o.bytes, flops=o.flops,
                              us=_roof(o.bytes, o.flops, bw=2.5e12 if o.dtype == "bf16" else 3e12))
                         for o in ops if o.kind.endswith("gemm")] * 3)
    ew = pd.DataFrame({"bytes": [1e4, 1e6, 1e8], "us": _roof(np.array([1e4, 1e6, 1e8]), 0, launch=2e-6)})
    idx = pd.DataFrame([dict(batch=b, ctx=c, heads=32, q_dtype="fp8", us=IndexerTerm(8e-6, 3e12, 1e-10).time(b, b * c) * 1e6)
                        for b in (1, 8, 64) for c in (8192, 65536)])
    graph = pd.DataFrame({"kernels": [8, 32, 128], "us": [3 + 1.5 * n for n in (8, 32, 128)]})
    st = fit_step_terms(gemm, ew, idx, graph)
    assert st["graph_launch_us"] == pytest.approx(1.5)
    cal = {"step_terms": st,
           "fit": {"attention": {"bf16": {"attention_launch_us": 13.5, "attention_efficiency": 0.43}},
                   "swap_in": {"per_row": {"1152": {"launch_us": 19.4, "per_request_us": 0.08, "gbps": 50.8}}}}}
    terms = StepTerms.from_calibration(cal)
    for o in ops:
        t = terms.op_time(o)
        assert t > 0, o.name
        if o.kind.endswith("gemm"):
            assert t * 1e6 == pytest.approx(_roof(o.bytes, o.flops, bw=2.5e12 if o.dtype == "bf16" else 3e12), rel=1e-3)
    assert terms.swap_in_time(1000, 16, 1152) == pytest.approx(19.4e-6 + 16 * 0.08e-6 + 1000 * 1152 / 50.8e9)
    with pytest.raises(KeyError, match="step_terms"):
        StepTerms.from_calibration({})


def test_rate_time_is_launch_plus_the_binding_limit():
    r = Rate(2e-6, 1e12, 1e14)
    assert r.time(1e6, 1e6) == pytest.approx(2e-6 + 1e-6)
    assert r.time(1e6, 1e9) == pytest.approx(2e-6 + 1e-5)


def test_step_time_sums_the_layer_ops_and_vectorises_over_steps():
    import json

    from simulator.costmodel.ops import step_ops
    from simulator.costmodel.terms import step_time

    # with the BF16 twin of the absorbed bmm, which the packaged calibration timed only as bmm_fp8
    terms = StepTerms.from_calibration(json.loads(open("simulator/presets/calibration/h200.json").read())).with_bf16()
    m = GLM_5_1
    ctx = np.array([8 * 20000.0, 8 * 90000.0])
    got = step_time(terms, m, 8, ctx, kv_row_bytes=656)
    for i, c in enumerate(ctx):
        want = sum(n * terms.ops_time(ops, indexer_heads=32) for n, ops in step_ops(m, 8, c, kv_row_bytes=656))
        assert got["total"][i] == pytest.approx(want, rel=1e-9)
    assert got["indexer"][1] > got["indexer"][0] and np.ndim(got["gemm"]) == 0
    no_att = step_time(terms, m, 8, ctx, kv_row_bytes=656, include_attention=False)
    assert "attention" not in no_att and no_att["total"][0] < got["total"][0]


def test_scaled_terms_follow_the_datasheet_ratios():
    import json

    from simulator.costmodel.terms import step_time

    terms = StepTerms.from_calibration(json.loads(open("simulator/presets/calibration/h200.json").read())).with_bf16()
    fast = terms.scaled(hbm=2.0, flops=2.0, link=2.0)
    r, f = terms.rates[("grouped_gemm", "fp8")], fast.rates[("grouped_gemm", "fp8")]
    assert f.launch_s == r.launch_s and f.bw == 2 * r.bw
    assert fast.swap_in_time(1000, 8, 656) < terms.swap_in_time(1000, 8, 656)
    a, b = step_time(terms, GLM_5_1, 32, 32 * 50000.0)["total"], step_time(fast, GLM_5_1, 32, 32 * 50000.0)["total"]
    assert b < a and b > a / 2  # launches do not scale
