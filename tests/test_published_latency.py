"""Published points of every kind: latencies (TPOT, ITL, TTFT: mean, median, p99), running counts
and per-GPU throughputs are read from the same simulated run as bench_serving defines them."""

from __future__ import annotations

import math

import pytest

from simulator.errors import HisparseError
from simulator.serving.model import System, simulate
from simulator.serving.published import Metric, load_published, validate
from simulator.serving.scenario import load_scenario

SET = """
name = "latency-test"
source = "a test's figures"
uncertainty = "made up"
[scenario]
model = "glm-5.1-fp8"
deployment = "8xh200-colocated-dp8"
hisparse = "blog-8xh200"
calibration = "uncalibrated"
"""


def _point(metric: str, measured: float, concurrency="8") -> str:
    return f"""
[[point]]
label = "{metric}"
system = "baseline"
metric = "{metric}"
concurrency = {concurrency}
input_tokens = 4096
output_tokens = 64
requests_per_client = 2
measured = {measured}
"""


def test_every_metric_is_the_simulated_runs_own_figure(tmp_path):
    path = tmp_path / "set.toml"
    path.write_text(SET + "".join(_point(m.value, 1.0) for m in Metric))
    rows = {r["metric"]: r for r in validate(load_published(str(path)))}
    sc = load_scenario(calibration="uncalibrated")
    import dataclasses

    w = dataclasses.replace(sc.workload, input_tokens=4096, output_tokens=64, requests_per_client=2, length_jitter=0.0)
    r = simulate(sc.replace(workload=w), System.BASELINE, concurrency=8)
    assert rows["tpot_mean_ms"]["predicted"] == pytest.approx(r.tpot_mean_ms)
    assert rows["ttft_p99_s"]["predicted"] == pytest.approx(r.ttft_p99_s)
    assert rows["itl_median_ms"]["predicted"] == pytest.approx(r.itl_p50_ms)
    assert rows["output_tok_s_per_gpu"]["predicted"] == pytest.approx(r.makespan_tok_s_deployment / 8)
    # (input + output) tokens over the run, per GPU: the cookbooks' tok/s/GPU
    assert rows["total_tok_s_per_gpu"]["predicted"] == pytest.approx(
        r.makespan_tok_s_deployment * (4096 + 64) / 64 / 8, rel=1e-9)
    assert all(math.isfinite(row["predicted"]) and row["predicted"] > 0 for row in rows.values())
    assert r.tpot_p50_ms <= r.tpot_p99_ms and r.ttft_mean_s > 0


def test_a_latency_needs_one_load_point(tmp_path):
    path = tmp_path / "set.toml"
    path.write_text(SET + _point("tpot_p99_ms", 50.0, concurrency="[8, 16]"))
    with pytest.raises(HisparseError, match=r"set.toml: point 1: metric tpot_p99_ms is read at one load point"):
        load_published(str(path))
