"""The serving model: presets, memory, costs, the SimPy model, the planner and `hisparse plan`."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from simulator.cli import main
from simulator.errors import HisparseError
from simulator.serving import presets as P
from simulator.serving.costs import CostModel
from simulator.serving.memory import RESERVED_PAGE, plan_memory
from simulator.serving.misses import MissProfiles, miss_profiles
from simulator.serving.model import simulate
from simulator.serving.planner import PlanInputs, recommend, run_plan


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HISPARSE_CACHE", str(tmp_path / "cache"))


def test_auto_calibration_uses_the_committed_h200_fit():
    from simulator.serving.planner import PlanInputs, load_inputs

    cfg = load_inputs(PlanInputs())
    assert cfg["calibration"].endswith("calibration/h200.json") and cfg["params"].calibrated
    fitted = json.loads(open(cfg["calibration"]).read())
    assert cfg["params"].swap_in_launch_us == fitted["params"]["swap_in_launch_us"]
    assert cfg["gpu"].link_bw == fitted["gpu"]["link_bw"]
    assert not load_inputs(PlanInputs(gpu="h100"))["params"].calibrated  # no H100 fit: the defaults


def _defaults():
    dep = P.load("deployments", "8xh200-colocated-dp8")
    return dict(model=P.load("models", "glm-5.1-fp8"), gpu=P.load("gpus", dep.gpu), dep=dep,
                workload=P.load("workloads", "32k-in-8k-out"), params=P.load("calibration", "uncalibrated"))


@pytest.mark.parametrize("kind", sorted(P.KINDS))
def test_every_shipped_preset_loads(kind):
    names = P.preset_names(kind)
    assert names
    for name in names:
        P.load(kind, name)


@pytest.mark.parametrize("text, message", [
    ("name = 'x'\nlayers = 1\nbogus = 3\n", r"unknown key\(s\) bogus"),
    ("name = 'x'\n", r"missing key\(s\) layers"),
    ("not toml ===", "not valid TOML"),
])
def test_bad_model_files(tmp_path, text, message):
    path = tmp_path / "m.toml"
    path.write_text(text)
    with pytest.raises(HisparseError, match=message) as err:
        P.load("models", str(path))
    assert str(path) in str(err.value)


def test_bad_values_and_names(tmp_path):
    path = tmp_path / "h.toml"
    path.write_text("top_k = 2048\ndevice_buffer_size = 1024\nhost_to_device_ratio = 2\n")
    with pytest.raises(HisparseError, match="device_buffer_size 1024 < top_k 2048"):
        P.load("hisparse", str(path))
    path.write_text("top_k = 2048\ndevice_buffer_size = 4096\nhost_to_device_ratio = -2\n")
    with pytest.raises(HisparseError, match="host_to_device_ratio = -2.0 must be >= 0"):
        P.load("hisparse", str(path))
    with pytest.raises(HisparseError, match="unknown gpu preset 'h999'"):
        P.load("gpus", "h999")
    with pytest.raises(HisparseError, match="mem_fraction = 1.5 must be in"):
        P.load("deployments", "8xh200-colocated-dp8", mem_fraction=1.5)


def test_memory_model_by_hand():
    d = _defaults()
    m, g, dep = d["model"], d["gpu"], d["dep"]
    hs = P.load("hisparse", "blog-8xh200")
    ctx, prompt = 32768 + 8192, 32768
    pool = g.hbm_bytes * dep.mem_fraction - m.weight_bytes / dep.tp - dep.activation_reserve_bytes
    base = plan_memory(m, g, dep, None, ctx, prompt)
    per_req = ctx * 78 * (1152 + 132)
    assert base.device_bytes_per_request == per_req
    assert base.max_running_per_gpu == int(pool // per_req)
    hi = plan_memory(m, g, dep, hs, ctx, prompt)
    assert hi.device_bytes_per_request == (4096 + RESERVED_PAGE) * 78 * 1152 + ctx * 78 * 132
    assert hi.staging_bytes == prompt * 78 * 1152
    assert hi.max_running_per_gpu == int((pool - hi.staging_bytes) // hi.device_bytes_per_request)
    assert hi.host_bytes_per_request == ctx * 78 * 1152
    assert hi.max_running_per_gpu > 3 * base.max_running_per_gpu


def test_cost_model_shapes():
    d = _defaults()
    c = CostModel(d["model"], d["gpu"], d["dep"], d["params"])
    assert c.experts_touched(0) == 0 and 0.99 < c.experts_touched(512) <= 1
    steps = [float(c.decode_steps(b, 8 * b, b * 40000).total_s) for b in (1, 4, 16, 32)]
    assert steps == sorted(steps)
    base = float(c.decode_steps(8, 64, 8 * 40000).total_s)
    with_swap = c.decode_steps(8, 64, 8 * 40000, missed_rows=10_000.0)
    assert float(with_swap.total_s) > base
    launch = d["model"].layers * d["params"].swap_in_launch_us * 1e-6
    row = d["model"].kv_row_bytes
    assert float(with_swap.swap_s) == pytest.approx(launch + 10_000 * row / d["gpu"].swap_bw(row))


def test_single_request_timeline_is_the_cost_model():
    """One closed-loop client, one request: TTFT is the prefill chunks, TPOT the step costs."""
    d = _defaults()
    w = dataclasses.replace(d["workload"], input_tokens=20000, output_tokens=50, requests_per_client=1)
    r = simulate("baseline", 1, hisparse=None, profiles=None, **(d | {"workload": w}))
    c = CostModel(d["model"], d["gpu"], d["dep"], d["params"])
    chunks, done = [], 0
    while done < 20000:
        n = min(8192, 20000 - done)
        chunks.append(c.prefill_chunk(n, done, False))
        done += n
    ttft = sum(chunks)
    steps = c.decode_steps(1, 1, 20001 + np.arange(49)).total_s
    assert r.ttft_p50_ms == pytest.approx(ttft * 1e3)
    assert r.tpot_p50_ms == pytest.approx(steps.sum() / 49 * 1e3)
    assert r.throughput_tok_s == pytest.approx(50 / (ttft + steps.sum()))


def test_running_never_exceeds_memory():
    d = _defaults()
    w = dataclasses.replace(d["workload"], output_tokens=256, requests_per_client=2)
    r = simulate("baseline", 256, hisparse=None, profiles=None, **(d | {"workload": w}))
    assert r.running <= r.max_running + 1e-9
    assert r.hbm_used_gb * 1e9 <= d["gpu"].hbm_bytes * d["dep"].mem_fraction


def test_misses_raise_hisparse_step_time():
    d = _defaults()
    hs = P.load("hisparse", "blog-8xh200")
    w = dataclasses.replace(d["workload"], input_tokens=8192, output_tokens=300, requests_per_client=1)
    low = MissProfiles((np.full(100, 0.01),), "test")
    high = MissProfiles((np.full(100, 0.30),), "test")
    a = simulate("hisparse", 8, hisparse=hs, profiles=low, **(d | {"workload": w}))
    b = simulate("hisparse", 8, hisparse=hs, profiles=high, **(d | {"workload": w}))
    assert b.step_ms_mean > a.step_ms_mean
    assert a.miss_share == pytest.approx(0.01) and b.miss_share == pytest.approx(0.30)


def test_profiles_tile_and_cache(tmp_path):
    p = MissProfiles((np.arange(10.0),), "t")
    assert [p.share(0, s) for s in (0, 9, 10, 14, 15)] == [0.0, 9.0, 5.0, 9.0, 5.0]
    np.testing.assert_array_equal(p.shares_from(0, 8, 5), [8, 9, 5, 6, 7])
    first = miss_profiles(None, top_k=2048, buffer=4096)
    assert len(list((tmp_path / "cache").glob("misses-*.npz"))) == 1
    again = miss_profiles(None, top_k=2048, buffer=4096)
    for a, b in zip(first.shares, again.shares, strict=True):
        np.testing.assert_array_equal(a, b)
    assert first.shares[0][0] > 0.5 > first.mean_share()  # warm-up after prefill, then few misses


def test_profiles_scale_the_buffer_to_the_trace_k(tmp_path):
    from simulator.replay import ReplayConfig, replay_stream
    from simulator.trace import open_trace

    src = "traces/synthetic-bursty.hst"
    prof = miss_profiles(src, top_k=8192, buffer=16384)  # ratio 2 -> buffer 4096 for the trace's k 2048
    s = open_trace(src).read((0, 0))
    want = replay_stream(s, ReplayConfig(buffer=4096)) / 2048
    layer0 = [open_trace(src).read((0, layer)) for layer in range(4)]
    mean = np.mean([replay_stream(x, ReplayConfig(buffer=4096)) / 2048 for x in layer0], axis=0)
    np.testing.assert_allclose(prof.shares[0], mean)
    assert want.shape == prof.shares[0].shape


def test_published_scenario_fidelity():
    """Default scenario: the baseline plateaus once HBM is full, HiSparse keeps scaling to >= 3x
    at 256, and costs a little at the lowest concurrency (its extra I/O)."""
    rows = run_plan(PlanInputs(concurrency=(1, 64, 256)))
    t = {(r["system"], r["concurrency"]): r["throughput_tok_s"] for r in rows}
    assert t["baseline", 256] / t["baseline", 64] < 1.3
    assert t["hisparse", 256] >= 3 * t["baseline", 256]
    assert t["hisparse", 1] < t["baseline", 1]
    rec = recommend(rows, 100.0)
    assert rec["choice"]["system"] == "hisparse" and rec["hisparse_over_baseline"] >= 3


def test_plan_is_deterministic_and_seeded():
    w = "8k-in-1k-out-open"
    a = run_plan(PlanInputs(workload=w, concurrency=(4,), seed=1))
    b = run_plan(PlanInputs(workload=w, concurrency=(4,), seed=1))
    c = run_plan(PlanInputs(workload=w, concurrency=(4,), seed=2))
    assert a == b and a != c


def test_plan_cli_json_and_files(tmp_path, capsys):
    out = tmp_path / "plan"
    assert main(["plan", "--concurrency", "1,32", "--sweep-buffer", "4096,6144", "--json", "--quiet",
                 "--out", str(out)]) == 0
    report = json.loads(capsys.readouterr().out)
    rows = report["rows"]
    assert len(rows) == 2 + 2 * 2
    for row in rows:
        for key in ("system", "concurrency", "throughput_tok_s", "tpot_p50_ms", "tpot_p99_ms", "ttft_p50_ms",
                    "running"):
            assert key in row
        assert row["system"] in ("baseline", "hisparse")
        assert not math.isnan(row["tpot_p99_ms"])
    assert {r["device_buffer_size"] for r in rows if r["system"] == "hisparse"} == {4096, 6144}
    assert sorted(p.name for p in out.iterdir()) == ["plan.csv", "plan.json", "throughput.png"]


def test_plan_cli_text_and_errors(capsys):
    assert main(["plan", "--concurrency", "2", "--quiet", "--calibration", "uncalibrated"]) == 0
    text = capsys.readouterr().out
    assert "== baseline" in text and "recommendation" in text and "UNCALIBRATED" in text
    assert main(["plan", "--concurrency", "2", "--quiet"]) == 0  # auto: the committed H200 calibration
    assert "calibrated (" in capsys.readouterr().out
    assert main(["plan", "--model", "nope", "--quiet"]) == 2
    assert "unknown model preset 'nope'" in capsys.readouterr().err
    assert main(["plan", "--sweep-buffer", "1000", "--quiet"]) == 2
    assert "device_buffer_size 1000 < top_k 2048" in capsys.readouterr().err


def test_default_trace_is_regenerated_identically_when_absent(monkeypatch):
    """The bundled default trace is the generator's output: without the file, the same misses."""
    from simulator.serving import misses

    bundled = miss_profiles(None, top_k=2048, buffer=4096, use_cache=False)
    monkeypatch.setattr(misses, "_default_trace_path", lambda: None)
    generated = miss_profiles(None, top_k=2048, buffer=4096, use_cache=False)
    assert generated.source == "generated dsa-like"
    for a, b in zip(bundled.shares, generated.shares, strict=True):
        np.testing.assert_array_equal(a, b)


def test_open_loop_rates(tmp_path, capsys):
    out = tmp_path / "open"
    assert main(["plan", "--workload", "8k-in-1k-out-open", "--rate", "1,8", "--quiet", "--json",
                 "--out", str(out)]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [(r["system"], r["rate_per_s"], r["concurrency"]) for r in rows] == [
        ("baseline", 1.0, 0), ("baseline", 8.0, 0), ("hisparse", 1.0, 0), ("hisparse", 8.0, 0)]
    base = [r for r in rows if r["system"] == "baseline"]
    assert base[1]["throughput_tok_s"] > base[0]["throughput_tok_s"]  # more load, more tokens
    assert (out / "throughput.png").exists()
    assert main(["plan", "--rate", "0", "--quiet"]) == 2
    assert "--rate" in (err := capsys.readouterr().err) and "positive" in err
