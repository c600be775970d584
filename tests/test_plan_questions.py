"""Issue #29's "done when": each of a newcomer's questions has a one-command answer, and each test
runs that command and checks the answer is computed for the question (it differs from the default
scenario's), not the default reprinted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator.cli import main

# a short workload so that a generated trace (the question's model or context) is quick to make
SHORT = ["--set", "workload.output_tokens=33", "--set", "workload.requests_per_client=2"]


def _plan(capsys, *args) -> dict:
    assert main(["plan", "--json", "--quiet", "--no-search", *args]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    import os

    old = os.environ.get("HISPARSE_CACHE")
    os.environ["HISPARSE_CACHE"] = str(tmp_path_factory.mktemp("cache"))
    yield
    if old is None:
        os.environ.pop("HISPARSE_CACHE")
    else:
        os.environ["HISPARSE_CACHE"] = old


def test_default_plan_replays_the_bundled_trace_at_its_own_context(capsys):
    """'Which trace did it use?': the default's is GLM-5.1's preset at the 32K prompt, bundled."""
    rep = _plan(capsys, "--concurrency", "8")
    how = rep["scenario"]["trace"]["how"]
    assert "glm51-longbench" in how and "32768-token prompt" in how and "78 layers" in how and "bundled" in how
    assert rep["scenario"]["trace"]["file"].endswith(".hst") and "ctx32768" in rep["scenario"]["trace"]["file"]


@pytest.mark.slow
def test_my_model_is_deepseek_v32(capsys, cache):
    """'hisparse plan --model deepseek-v3.2-fp8': its own fitted preset (dsv32, 61 layers), not GLM's trace."""
    glm = _plan(capsys, "--concurrency", "4", "--set", "workload.input_tokens=8192", *SHORT)
    dsv = _plan(capsys, "--concurrency", "4", "--model", "deepseek-v3.2-fp8", "--set", "workload.input_tokens=8192",
                *SHORT)
    how = dsv["scenario"]["trace"]["how"]
    assert "dsv32" in how and "61 layers" in how and "8192-token prompt" in how and "32 decode steps" in how
    assert dsv["misses"][0]["miss_ratio"] != glm["misses"][0]["miss_ratio"]  # its own misses
    assert dsv["misses"][0]["trace"] != glm["misses"][0]["trace"]


@pytest.mark.slow
def test_my_context_length(capsys, cache):
    """'--set workload.input_tokens=65536': the trace is generated at that prompt, not the 32K one."""
    rep = _plan(capsys, "--concurrency", "4", "--set", "workload.input_tokens=65536", *SHORT)
    how = rep["scenario"]["trace"]["how"]
    assert "65536-token prompt" in how and ("generated into" in how or "cached in" in how)
    assert "ctx65536" in rep["scenario"]["trace"]["file"]
    # the plan's cached copy is reused the second time (no new generation)
    again = _plan(capsys, "--concurrency", "4", "--set", "workload.input_tokens=65536", *SHORT)
    assert "cached in" in again["scenario"]["trace"]["how"]


def test_pd_decode_question(capsys):
    """'--deployment 2xh20-pd-decode': its own HiSparse config, and TPOT without admission waits."""
    rep = _plan(capsys, "--deployment", "2xh20-pd-decode", "--concurrency", "1,64")
    assert rep["scenario"]["files"]["hisparse"].endswith("blog-h20-pd.toml")
    for r in rep["rows"]:
        assert r["tpot_p50_ms"] <= r["itl_p99_ms"] * 1.0001  # admission waits are TTFT, not decode time
    one = [r for r in rep["rows"] if r["concurrency"] == 1]
    assert all(r["ttft_p50_s"] < 30 for r in one)  # a prompt alone on the prefill side, not 1/8 of it


def test_what_host_ram(capsys):
    """'What host RAM does HiSparse need?': --sweep-host-ratio gives each ratio's pinned pool and its answer."""
    rep = _plan(capsys, "--concurrency", "16", "--sweep-host-ratio", "2,8")
    pools = {r["host_to_device_ratio"]: r["host_pool_gb_per_gpu"] for r in rep["rows"] if r["system"] == "hisparse"}
    assert pools[8.0] > pools[2.0] > 0


def test_my_own_gpu(capsys):
    """'--gpu b200': the plan is priced on that GPU (not the H200's numbers)."""
    h200 = _plan(capsys, "--concurrency", "16")
    b200 = _plan(capsys, "--concurrency", "16", "--gpu", "b200")
    assert b200["scenario"]["files"]["gpu"].endswith("b200.toml")
    assert b200["rows"][0]["steady_tok_s_deployment"] != h200["rows"][0]["steady_tok_s_deployment"]


def test_every_prediction_carries_a_band(capsys):
    """Bands: each row, and the recommendation, carry the nearest published sets' validation error."""
    rep = _plan(capsys, "--concurrency", "16")
    for r in rep["rows"]:
        assert r["band"] is not None and 0 < r["band"] < 1 and r["band_set"]
    b = rep["bands"]
    assert b["baseline"]["set"] != b["hisparse"]["set"] or b["baseline"]["band"] != b["hisparse"]["band"]
    assert "same model family, GPU, deployment kind, system" in b["hisparse"]["how"]
    pd = _plan(capsys, "--concurrency", "4", "--deployment", "2xh20-pd-decode")["bands"]["hisparse"]
    assert "GPU" in pd["differs"] and "deployment kind" in pd["differs"]  # no published H20 PD set: said so


def test_one_infeasible_piece_does_not_stop_the_plan(capsys):
    """'128K prompts': a colocated HiSparse pool cannot prefill one (its device slots), the baseline's
    can: the plan runs the baseline, and names what HiSparse lacks with its fix; nothing fits at all
    is one error naming each system."""
    from simulator.errors import HisparseError
    from simulator.serving.planner import PlanInputs, prepare

    prep = prepare(PlanInputs(concurrency=(1,), overrides=("workload.input_tokens=131072",)))
    assert prep.baseline and prep.knob_sets == ()
    (who, why), = prep.cannot_run
    assert who.startswith("hisparse") and "131072" in why and "fix: a lower host_to_device_ratio" in why
    with pytest.raises(HisparseError, match="no system can run this workload: baseline: .*; hisparse"):
        prepare(PlanInputs(concurrency=(1,), overrides=("workload.input_tokens=163840",)))
    trace = str(Path(__file__).resolve().parents[1] / "traces" / "glm51-longbench.hst")  # no trace generation
    assert main(["plan", "--concurrency", "1", "--no-search", "--set", "workload.input_tokens=131072", "--trace", trace,
                 "--json", "--quiet"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert {r["system"] for r in rep["rows"]} == {"baseline"}
    assert rep["cannot_run"][0]["system"].startswith("hisparse")


def _model_and_workload(tmp_path, layers: int | None = None):
    shipped = Path(__file__).resolve().parents[1] / "simulator" / "presets" / "models" / "glm-5.1-fp8.toml"
    lines = [(f"layers = {layers}" if layers and ln.split("#")[0].strip().startswith("layers ") else ln)
             for ln in shipped.read_text().splitlines()]
    model = tmp_path / "model.toml"
    model.write_text("\n".join(lines) + "\n")
    workload = tmp_path / "tiny.toml"
    workload.write_text('name = "tiny"\ninput_tokens = 4096\noutput_tokens = 16\nlength_jitter = 0.0\n'
                        'arrival = "closed"\nrate_per_s = 0.0\nrequests_per_client = 1\n')
    return model, workload


def test_a_model_too_deep_for_a_trace_is_refused_before_any_is_drawn(tmp_path, monkeypatch, capsys):
    """A model preset with an absurd layer count (found by the preset fuzzer: 207,849,514) made the
    plan draw a trace of trillions of entries and grow for many minutes: the model file's layers are now
    held to at most 10,000. 8,000 layers drew a trace for minutes with nothing shown, though its weights
    cannot fit: the plan now says so before it draws any trace. Both name the file, exit 2, and write
    nothing to the cache."""
    monkeypatch.setenv("HISPARSE_CACHE", str(tmp_path / "cache"))
    for layers, says in ((207849514, "layers"), (8000, "no room for a KV pool")):
        model, workload = _model_and_workload(tmp_path, layers)
        code = main(["plan", "--quiet", "--concurrency", "2", "--workload", str(workload), "--model", str(model)])
        err = capsys.readouterr().err.strip()
        assert code == 2, layers
        assert str(model) in err and says in err, err
        assert not list((tmp_path / "cache").rglob("*.hst"))


def test_a_trace_past_the_budget_is_refused_before_it_is_drawn(tmp_path, monkeypatch, capsys):
    """A model whose weights fit still has its trace held to the trace budget (as `trace gen`):
    here the budget lowered below the 78-layer trace the plan would draw."""
    monkeypatch.setenv("HISPARSE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HISPARSE_MAX_TRACE_ENTRIES", "1000000")
    model, workload = _model_and_workload(tmp_path)
    code = main(["plan", "--quiet", "--concurrency", "2", "--workload", str(workload), "--model", str(model)])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert str(model) in err and "HISPARSE_MAX_TRACE_ENTRIES" in err and "78 layers" in err, err
    assert not list((tmp_path / "cache").rglob("*.hst"))
