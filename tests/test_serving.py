"""The serving model: presets, costs, the SimPy model, the planner and `hisparse plan`."""

from __future__ import annotations

import dataclasses
import json
import math
import re

import numpy as np
import pytest

from simulator.cli import main
from simulator.costmodel.passes import CostModel
from simulator.errors import HisparseError
from simulator.serving import presets as P
from simulator.serving.frontend import tokenize_seconds
from simulator.serving.misses import MissProfiles, miss_profiles
from simulator.serving.model import RankSim, System, simulate
from simulator.serving.planner import PlanInputs, recommend, run_plan
from simulator.serving.scenario import load_scenario
from tests.helpers import decode_pass, prefill_rank_side

pytestmark = pytest.mark.usefixtures("private_cache")


def _scenario(**workload):
    sc = load_scenario(calibration="uncalibrated")
    if workload:
        sc = sc.replace(workload=dataclasses.replace(sc.workload, **workload))
    return sc


def test_auto_calibration_is_the_packaged_h200_fit():
    sc = load_scenario()
    assert sc.calibration.endswith("simulator/presets/calibration/h200.json") and sc.params.calibrated
    fitted = json.loads(open(sc.calibration).read())
    assert sc.params.swap_in_launch_us == fitted["params"]["swap_in_launch_us"]
    assert sc.gpu.link_bw == fitted["gpu"]["link_bw"]
    assert any(n.startswith("link_bw ") and "h200.toml" in n for n in sc.notes)  # the replacement is stated
    assert not load_scenario(gpu="h100").params.calibrated  # no H100 fit: the defaults


def test_a_custom_gpu_file_keeps_its_figures(tmp_path):
    text = (P.PRESET_DIR / "gpus" / "h200.toml").read_text()
    mine = tmp_path / "my-gpu.toml"
    mine.write_text(text.replace('calibration = "h200"', "").replace("link_bw = 55.0e9", "link_bw = 20.0e9"))
    sc = load_scenario(gpu=str(mine))
    assert sc.gpu.link_bw == 20.0e9 and not sc.params.calibrated and not sc.notes
    # naming a calibration applies it, and says which figures it replaced
    mine.write_text(text.replace("link_bw = 55.0e9", "link_bw = 20.0e9"))
    sc = load_scenario(gpu=str(mine))
    assert sc.params.calibrated and any("GPU file" in n and "2e+10" in n for n in sc.notes)
    mine.write_text(text.replace('calibration = "h200"', 'calibration = "nope"'))
    with pytest.raises(HisparseError, match=r"my-gpu.toml: calibration = 'nope': no such packaged calibration"):
        load_scenario(gpu=str(mine))


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
    with pytest.raises(HisparseError, match="h.toml: host_to_device_ratio = -2.0 must be >= 1"):
        P.load("hisparse", str(path))
    with pytest.raises(HisparseError, match="unknown gpu preset 'h999'"):
        P.load("gpus", "h999")
    with pytest.raises(HisparseError, match="8xh200-colocated-dp8.toml: mem_fraction_static = 1.5 must be"):
        P.load("deployments", "8xh200-colocated-dp8", mem_fraction_static=1.5)
    with pytest.raises(HisparseError, match="layers = 0 must be >= 1"):
        P.load("models", "glm-5.1-fp8", layers=0)
    with pytest.raises(HisparseError, match="gpus = 0 must be >= 1"):
        P.load("deployments", "8xh200-colocated-dp8", gpus=0)
    with pytest.raises(HisparseError, match="hbm_bytes = 0.0 must be > 0"):
        P.load("gpus", "h200", hbm_bytes=0)
    with pytest.raises(HisparseError, match="attention = 'sp': must be one of dp, tp"):
        P.load("deployments", "8xh200-colocated-dp8", attention="sp")
    with pytest.raises(HisparseError, match=r"tp \(8\) must be a multiple of dp \(3\)"):
        P.load("deployments", "8xh200-colocated-dp8", dp=3)


def test_model_parameter_counts_match_the_checkpoints():
    """Derived from the config shapes: GLM-5.1's main model 743.9 B parameters, 40.8 B active;
    DeepSeek-V3.2's 671.9 B (model-shapes notes, which match the published checkpoint totals)."""
    glm, ds = P.load("models", "glm-5.1-fp8"), P.load("models", "deepseek-v3.2-fp8")
    assert glm.total_params / 1e9 == pytest.approx(743.9, abs=0.05)
    assert glm.active_params / 1e9 == pytest.approx(40.83, abs=0.01)
    assert ds.total_params / 1e9 == pytest.approx(671.9, abs=0.05)
    assert glm.attention_params == 165_019_648 and glm.indexer_params == 9_371_648
    assert ds.expert_params == 44_040_192


def test_cost_model_shapes():
    sc = _scenario()
    c = CostModel(sc.model, sc.gpu, sc.deployment, sc.params)
    assert c.experts_touched(0) == 0 and 0.99 < c.experts_touched(512) <= 1
    steps = [float(decode_pass(c, b, b * 40000).total_s[0]) for b in (1, 4, 16, 32)]
    assert steps == sorted(steps)
    base = decode_pass(c, 8, 8 * 40000)
    with_swap = decode_pass(c, 8, 8 * 40000, missed_rows=10_000.0)
    assert float(with_swap.total_s[0]) > float(base.total_s[0])
    launch = sc.model.layers * sc.params.swap_in_launch_us * 1e-6
    row = sc.model.kv_row_bytes
    assert float(with_swap.swap_s[0]) == pytest.approx(launch + 10_000 * row / sc.gpu.swap_bw(row))
    # DP attention: one all-gather and one reduce-scatter per layer of every rank's batch, padded to
    # the CUDA-graph size (8 requests per rank: 8 rows each)
    ic, msg = sc.gpu.interconnect, 8 * 8 * sc.model.hidden_size * 2
    want = sc.model.layers * (ic.time_s("all_gather", 8, msg) + ic.time_s("reduce_scatter", 8, msg))
    assert float(base.comm_s[0]) == pytest.approx(want)
    padded = decode_pass(c, 9, 9 * 40000)  # 9 per rank: the graph for 12
    msg = 8 * 12 * sc.model.hidden_size * 2
    assert float(padded.comm_s[0]) == pytest.approx(
        sc.model.layers * (ic.time_s("all_gather", 8, msg) + ic.time_s("reduce_scatter", 8, msg)))


def test_tp_attention_all_reduces_twice_per_layer():
    sc = load_scenario(deployment="8xh200-tp8", calibration="uncalibrated")
    c = CostModel(sc.model, sc.gpu, sc.deployment, sc.params)
    msg = 16 * sc.model.hidden_size * 2
    assert c.comm_layer(16, 16) == pytest.approx(2 * sc.gpu.interconnect.time_s("all_reduce", 8, msg))
    # heads split over the eight GPUs: the attention FLOPs are 64 / 8 heads' (the latent rows, replicated,
    # are read in full on every GPU, so a memory-bound step gains nothing)
    assert c.attention_roofline(256, row_bytes=1) == pytest.approx(c.attention_roofline(256, heads=64, row_bytes=1) / 8)
    assert c.attention_roofline(16) == CostModel(sc.model, sc.gpu, _scenario().deployment, sc.params).attention_roofline(16)


def test_single_request_timeline_is_the_cost_model():
    """One closed-loop client, one request: TTFT is the TokenizerManager's time on the text prompt
    (``frontend.tokenize_seconds``) and the prefill chunks (one rank prefilling: its attention side,
    the MLP on its chunk, the collectives), TPOT the decode steps' costs."""
    sc = _scenario(input_tokens=20000, output_tokens=50, requests_per_client=1)
    r = simulate(sc, System.BASELINE, concurrency=1)
    c = sc.cost_model()
    chunks, done = [], 0
    while done < 20000:
        n = min(8192, 20000 - done)
        chunks.append(prefill_rank_side(c, n, done) + c.mlp_time(n, head_rows=1)
                      + sc.model.layers * c.comm_layer(n, n))
        done += n
    ttft = tokenize_seconds(20000) + sum(chunks)
    steps = decode_pass(c, 1, 20001 + np.arange(49), active=1).total_s
    assert r.ttft_p50_s == pytest.approx(ttft)
    assert r.tpot_p50_ms == pytest.approx(steps.sum() / 49 * 1e3)
    assert r.makespan_tok_s_deployment == pytest.approx(50 / (ttft + steps.sum()))


def test_running_never_exceeds_memory_or_the_cap():
    sc = _scenario(output_tokens=256, requests_per_client=2)
    sim = RankSim(sc, System.BASELINE, concurrency=256)
    r = sim.run()
    assert r.running_deployment <= r.max_running_deployment + 1e-9
    assert sim.peak_device <= sim.plan.pool_tokens
    assert r.overloaded  # 256 clients, 40-odd requests at once: the rest wait to start
    cap = dataclasses.replace(sc.deployment, max_running_requests=16)  # 2 per DP rank
    r = simulate(sc.replace(deployment=cap), System.BASELINE, concurrency=64)
    assert r.max_running_deployment == 16 and r.running_deployment <= 16 + 1e-9


def test_misses_raise_hisparse_step_time():
    sc = _scenario(input_tokens=8192, output_tokens=300, requests_per_client=1)
    low = MissProfiles((np.full(100, 0.01),), "test")
    high = MissProfiles((np.full(100, 0.30),), "test")
    a = simulate(sc, System.HISPARSE, concurrency=8, profiles=low)
    b = simulate(sc, System.HISPARSE, concurrency=8, profiles=high)
    assert b.step_ms_mean > a.step_ms_mean
    assert a.miss_share == pytest.approx(0.01) and b.miss_share == pytest.approx(0.30)


def test_short_contexts_take_the_fast_path():
    """A context within device_buffer_size never swaps in (SGLang's seq_len <= buffer fast path)."""
    sc = _scenario(input_tokens=1000, output_tokens=200, requests_per_client=1)
    r = simulate(sc, System.HISPARSE, concurrency=4, profiles=MissProfiles((np.full(300, 0.5),), "test"))
    assert r.miss_share == 0.0 and r.swap_share == pytest.approx(
        sc.model.layers * sc.params.swap_in_launch_us * 1e-3 / r.step_ms_mean, rel=0.05)


def test_profiles_tile_and_cache(tmp_path):
    p = MissProfiles((np.arange(10.0),), "t")
    assert [p.share(0, s) for s in (0, 9, 10, 14, 15)] == [0.0, 9.0, 5.0, 9.0, 5.0]
    np.testing.assert_array_equal(p.shares_from(0, 8, 5), [8, 9, 5, 6, 7])
    first = miss_profiles(None, top_k=2048, buffer=4096)
    assert len(list((tmp_path / "cache").glob("misses-*.npz"))) == 1
    again = miss_profiles(None, top_k=2048, buffer=4096)
    for a, b in zip(first.shares, again.shares, strict=True):
        np.testing.assert_array_equal(a, b)
    assert again.context_tokens == first.context_tokens > 0
    assert first.shares[0][0] > 0.5 > first.mean_share()  # warm-up after prefill, then few misses


def test_profiles_scale_the_buffer_to_the_trace_k_and_say_so(tmp_path):
    from simulator.replay import ReplayConfig, replay_stream
    from simulator.trace import open_trace

    src = "traces/synthetic-bursty.hst"
    prof = miss_profiles(src, top_k=8192, buffer=16384)  # ratio 2 -> buffer 4096 for the trace's k 2048
    layer0 = [open_trace(src).read((0, layer)) for layer in range(4)]
    mean = np.mean([replay_stream(x, ReplayConfig(buffer=4096)) / 2048 for x in layer0], axis=0)
    np.testing.assert_allclose(prof.shares[0], mean)
    notes = prof.mapping_notes(top_k=8192, buffer=16384, output_tokens=8192, input_tokens=32768)
    assert any("trace k 2048 differs from the model's top_k 8192: replayed with buffer 4096" in n for n in notes)
    assert any("reuse the trace's second half" in n for n in notes)


@pytest.mark.slow  # a full plan of the published scenario
def test_published_scenario_shape():
    """Default scenario: the baseline plateaus once its pools are full; HiSparse costs a little at
    the lowest concurrency (its extra I/O). Under SGLang's admission as read (bench_serving's
    ignore_eos look-ahead against HiSparse's available_size = min(logical, device) free, retried
    every round under HiSparse) the baseline holds whole contexts, HiSparse's device slots (current
    SGLang: the cell counts the indexer for the x8 logical pool) hold over three times as many
    requests in hot buffers, and it serves over 1.5x the baseline at 256 clients (the blog's
    release, with a larger device pool: 3x; README, validation)."""
    from simulator.serving.memory import plan_memory
    from simulator.serving.scenario import load_scenario

    rows = run_plan(PlanInputs(concurrency=(1, 64, 256)))
    t = {(r["system"], r["concurrency"]): r["steady_tok_s_deployment"] for r in rows}
    m = {(r["system"], r["concurrency"]): r["max_running_deployment"] for r in rows}
    sc = load_scenario()
    base = plan_memory(sc.model, sc.gpu, sc.deployment, None)
    hs = plan_memory(sc.model, sc.gpu, sc.deployment, sc.hisparse)
    assert t["baseline", 256] / t["baseline", 64] < 1.1
    assert m["baseline", 256] == 8 * (base.pool_tokens // (32768 + 8192))  # ignore_eos: whole contexts
    # hot buffers next to one prompt in flight bound it from above
    assert 3 * m["baseline", 256] <= m["hisparse", 256] <= 8 * ((hs.pool_tokens - 32768) // hs.buffer_slots)
    assert 1.5 * t["baseline", 256] < t["hisparse", 256] < 3 * t["baseline", 256]
    assert t["hisparse", 1] < t["baseline", 1]
    rec = recommend(rows, 100.0)
    # 64 clients overload the baseline's slots, not HiSparse's: HiSparse at 64 is the best that holds
    assert not rec["choice"]["overloaded"] and (rec["choice"]["system"], rec["choice"]["concurrency"]) == ("hisparse", 64)


def test_recommendation_respects_ttft_and_load():
    rows = run_plan(PlanInputs(concurrency=(1, 8, 32)))
    loose = recommend(rows, 100.0)
    # an SLO between the rows' TTFTs (the model's, not a fixed number): only the quicker rows qualify
    ttfts = sorted({r["ttft_p99_s"] for r in rows})
    slo = 0.5 * (ttfts[0] + ttfts[1])
    tight = recommend(rows, 100.0, slo_ttft_s=slo)
    assert tight["choice"]["ttft_p99_s"] <= slo < loose["choice"]["ttft_p99_s"]
    assert recommend(rows, 1e-3)["choice"] is None


@pytest.mark.slow  # several full plans of the published scenario
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
    assert len([r for r in rows if not r["searched"]]) == 2 + 2 * 2  # the swept points, then the search's
    for row in rows:
        for key in ("system", "concurrency", "steady_tok_s_deployment", "makespan_tok_s_deployment",
                    "steady_tok_s_per_gpu", "tpot_p50_ms", "tpot_p99_ms", "ttft_p50_s", "running_deployment"):
            assert key in row
        assert row["system"] in ("baseline", "hisparse")
        assert not math.isnan(row["tpot_p99_ms"])
    assert {r["device_buffer_size"] for r in rows if r["system"] == "hisparse"} == {4096, 6144}
    assert [k["device_buffer_size"] for k in report["misses"]] == [4096, 6144]
    assert report["scenario"]["unsourced_terms"] == []  # every term has its source now
    assert report["scenario"]["step_terms"]["source"].startswith("measured on this GPU")
    assert not report["scenario"]["step_terms"]["scaled_from_h200"]
    names = sorted(p.name for p in out.iterdir())
    hs = ["hisparse-config.json"] if report["recommendation"]["choice"]["system"] == "hisparse" else []
    assert names == sorted(["launch.sh", "plan.csv", "plan.json", "throughput.png", *hs])
    # whole numbers stay whole in the CSV where baseline rows leave gaps (it wrote 4096.0)
    import csv

    with open(out / "plan.csv", newline="") as fh:
        buffers = {r["device_buffer_size"] for r in csv.DictReader(fh) if r["system"] == "hisparse"}
    assert buffers == {"4096", "6144"}


def test_plan_cli_text_and_errors(tmp_path, capsys):
    assert main(["plan", "--concurrency", "2", "--quiet", "--calibration", "uncalibrated"]) == 0
    text = capsys.readouterr().out
    assert "== baseline" in text and "recommendation" in text and "UNCALIBRATED" in text
    assert "UNSOURCED" not in text
    assert "cost model: step kernels H200 measurements" in text and "bandwidths x 1.000" in text
    assert "lru miss ratio" in text and "glm51-longbench" in text  # the trace and its miss ratio
    assert "memory per GPU (SGLang's accounting)" in text
    assert main(["plan", "--concurrency", "2", "--quiet"]) == 0  # auto: the packaged H200 calibration
    assert "calibration" in capsys.readouterr().out
    assert main(["plan", "--model", "nope", "--quiet"]) == 2
    assert "unknown model preset 'nope'" in capsys.readouterr().err
    assert main(["plan", "--sweep-buffer", "1000", "--quiet"]) == 2
    assert "device_buffer_size 1000 < top_k 2048" in capsys.readouterr().err
    assert main(["plan", "--sweep-host-ratio", "0", "--quiet"]) == 2  # refused while parsing (> 0)
    assert "argument --sweep-host-ratio: expected a positive number" in capsys.readouterr().err
    assert main(["plan", "--sweep-host-ratio", "0.5", "--quiet"]) == 2  # the scenario's own rule (>= 1)
    assert "--sweep-host-ratio 0.5 must be >= 1" in capsys.readouterr().err
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert main(["plan", "--out", str(afile), "--quiet"]) == 2
    assert "is a file; give a folder" in capsys.readouterr().err and afile.read_text() == "x"
    assert main(["plan", "--slo-tpot-ms", "0"]) == 2
    assert "expected a positive number" in capsys.readouterr().err


def test_plan_help_lists_presets(capsys):
    assert main(["plan", "--help"]) == 0
    text = re.sub(r"-\s+", "-", " ".join(capsys.readouterr().out.split()))  # argparse wraps at hyphens
    for name in ("glm-5.1-fp8", "2xh20-pd-decode", "8xh200-tp8", "rtx-pro-6000", "blog-h20-pd", "paper-glm51-8xh200"):
        assert name in text


def test_a_calibration_json_that_is_broken_is_one_clear_error(tmp_path, capsys):
    bad = tmp_path / "cal.json"
    bad.write_text("{not json")
    assert main(["plan", "--calibration", str(bad), "--quiet"]) == 2
    assert f"{bad}: not valid JSON" in capsys.readouterr().err
    assert main(["plan", "--calibration", str(tmp_path / "missing.json"), "--quiet"]) == 2
    assert "missing.json: no such file" in capsys.readouterr().err


@pytest.mark.slow  # regenerates the 78-layer glm51-longbench trace, twice
def test_default_trace_is_regenerated_identically_when_absent(monkeypatch):
    """The bundled default trace is the generator's output: without the file, the same misses."""
    from simulator.serving import misses

    bundled = miss_profiles(None, top_k=2048, buffer=4096, use_cache=False)
    monkeypatch.setattr(misses, "_default_trace_path", lambda: None)
    generated = miss_profiles(None, top_k=2048, buffer=4096, use_cache=False)
    assert generated.source == "generated glm51-longbench"
    for a, b in zip(bundled.shares, generated.shares, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.slow  # full plans at several arrival rates
def test_open_loop_rates(tmp_path, capsys):
    out = tmp_path / "open"
    assert main(["plan", "--workload", "8k-in-1k-out-open", "--rate", "0.5,64", "--quiet", "--json",
                 "--out", str(out)]) == 0
    report = json.loads(capsys.readouterr().out)
    found = [r for r in report["rows"] if r["searched"]]
    assert 0 < len(found) <= 2 * report["search"]["max_points_per_system"]  # bisected rates, a few
    assert all(0.5 < r["rate_per_s"] < 64 and r["concurrency"] == 0 for r in found)
    rows = [r for r in report["rows"] if not r["searched"]]
    assert [(r["system"], r["rate_per_s"], r["concurrency"]) for r in rows] == [
        ("baseline", 0.5, 0), ("baseline", 64.0, 0), ("hisparse", 0.5, 0), ("hisparse", 64.0, 0)]
    base = [r for r in rows if r["system"] == "baseline"]
    assert base[1]["makespan_tok_s_deployment"] > base[0]["makespan_tok_s_deployment"]  # more load, more tokens
    assert not base[0]["overloaded"] and base[1]["overloaded"]  # 64 requests/s is more than it serves
    assert (out / "throughput.png").exists()
    assert main(["plan", "--rate", "0", "--quiet"]) == 2
    assert "--rate" in (err := capsys.readouterr().err) and "positive" in err


def test_the_packaged_calibration_is_the_one_copy():
    """One calibration file per GPU, in the package (typed, versioned); the checkout's calibration/
    folder holds the raw CSVs and logs it was fitted from, not a second copy."""
    from pathlib import Path

    from simulator.costmodel.calibration_file import VERSION, read_calibration

    assert not (Path(__file__).resolve().parents[1] / "calibration" / "h200.json").exists()
    cal = read_calibration(P.PRESET_DIR / "calibration" / "h200.json")
    assert cal.version == VERSION and cal.step_terms and cal.params["calibrated"]


def test_a_prompt_chunk_on_one_rank_stalls_every_ranks_decode():
    """DP attention runs every forward pass collectively (SGLang prepare_mlp_sync_batch): while one
    rank prefills a chunk, a rank that decodes gets one token per pass, and the pass lasts as long
    as the chunk. Two clients with different output lengths desynchronise: the second client's
    first request decodes on rank 1 while the first client's next request prefills on rank 2."""
    sc = _scenario(input_tokens=8192, output_tokens=64, requests_per_client=2)
    sim = RankSim(sc, System.BASELINE, concurrency=2)
    sim.w = dataclasses.replace(sim.w, length_jitter=0.5)
    sim.run()
    c = sim.cost
    chunk = prefill_rank_side(c, 8192, 0)
    step = float(decode_pass(c, 1, 8192 + 64, active=2).total_s[0])
    gaps = np.concatenate(sim.itl)
    stalled = gaps[gaps > chunk]
    assert stalled.size >= 1  # a decode gap as long as another rank's prompt chunk
    assert np.all(gaps > 0.5 * step)
    # each stalled gap is one mixed pass: the chunk's attention side, the MLP on every rank's tokens
    want = chunk + c.mlp_time(8192 + 1, head_rows=2) + sc.model.layers * c.comm_layer(8193, 8193)
    assert stalled.min() == pytest.approx(want, rel=1e-6)


# -- SLO-first recommendation (issue #29 item 1) ----------------------------------------------------
def _row(system, c, tok, tpot=50.0, ttft=10.0, over=False, searched=False):
    return {"system": system, "concurrency": c, "rate_per_s": 0.0, "steady_tok_s_deployment": tok,
            "tpot_p99_ms": tpot, "ttft_p99_s": ttft, "overloaded": over, "searched": searched,
            "device_buffer_size": None if system == "baseline" else 4096,
            "host_to_device_ratio": None if system == "baseline" else 8.0}


def test_recommendation_reports_ties_within_the_model_error_band_and_edges():
    from simulator.serving.slo import MODEL_ERROR_BAND

    rows = [_row("baseline", 8, 100.0), _row("baseline", 16, 1000.0, ttft=99.0),
            _row("hisparse", 8, 100.0 * (1 + MODEL_ERROR_BAND / 2)), _row("hisparse", 16, 2000.0, tpot=500.0)]
    rec = recommend(rows, 100.0, 30.0)
    assert rec["tie"] and rec["choice"]["system"] == "baseline" and rec["tie_band"] == MODEL_ERROR_BAND
    assert rec["edge"] == {"baseline": False, "hisparse": False} and not rec["choice_at_edge"]
    # outside the band: no tie, the faster one; its best at the highest load searched: flagged
    rows = [_row("baseline", 8, 100.0), _row("hisparse", 8, 100.0), _row("hisparse", 16, 300.0)]
    rec = recommend(rows, 100.0, 30.0)
    assert not rec["tie"] and rec["choice"]["system"] == "hisparse" and rec["choice_at_edge"]
    assert rec["edge"] == {"baseline": True, "hisparse": True}


def test_a_ties_reason_names_the_radix_cache_only_where_the_deployment_keeps_it():
    """The blog's deployment passes --disable-radix-cache: a tie there must not claim the baseline
    keeps prefix reuse that HiSparse gives up."""
    rows = [_row("baseline", 8, 100.0), _row("hisparse", 8, 100.0)]
    kept = recommend(rows, 100.0, 30.0, baseline_radix_cache=True)
    off = recommend(rows, 100.0, 30.0)
    assert kept["tie"] and off["tie"]
    assert "radix cache" in kept["tie_reason"] and "radix" not in off["tie_reason"]
    assert "pinned host pool" in off["tie_reason"]


def test_the_default_plans_tie_says_why_for_its_own_deployment(capsys):
    from simulator.cli import main

    assert main(["plan", "--quiet", "--no-search", "--concurrency", "8"]) in (0, None)
    out = capsys.readouterr().out
    tie = [ln for ln in out.splitlines() if ln.startswith("TIE:")]
    # the default deployment disables the radix cache (the blog's flags), so no tie may cite it
    assert tie and all("radix" not in ln for ln in tie)
    assert "--disable-radix-cache" in out


def test_search_bisects_between_swept_points_to_its_tolerance():
    from simulator.serving.planner import run_plan_full, search_steps
    from simulator.serving.slo import SEARCH_REL_TOL

    inp = PlanInputs(concurrency=(16, 32), slo_tpot_ms=100.0, slo_ttft_s=30.0)
    plan = run_plan_full(inp, search=True)
    rows = plan.rows()
    found = [r for r in rows if r["searched"]]
    assert found and all(16 < r["concurrency"] < 32 for r in found)
    assert len(found) <= 2 * search_steps(16, 32, closed=True)
    rec = recommend(rows, 100.0, 30.0)
    for system in ("baseline", "hisparse"):
        best = rec[system]
        assert best["ttft_p99_s"] <= 30.0 and best["tpot_p99_ms"] <= 100.0
        # the next load tried above it fails, and lies within the tolerance
        above = [r for r in rows if r["system"] == system and r["concurrency"] > best["concurrency"]]
        nxt = min(above, key=lambda r: r["concurrency"])
        assert nxt["ttft_p99_s"] > 30.0 or nxt["overloaded"]
        assert nxt["concurrency"] - best["concurrency"] <= max(1, best["concurrency"] * SEARCH_REL_TOL)


def test_default_plan_meets_its_own_default_slos(capsys):
    from simulator.serving.slo import DEFAULT_SLO_TPOT_MS, DEFAULT_SLO_TTFT_S

    assert main(["plan", "--json", "--quiet"]) == 0
    report = json.loads(capsys.readouterr().out)
    rec = report["recommendation"]
    assert (rec["slo_tpot_ms"], rec["slo_ttft_s"]) == (DEFAULT_SLO_TPOT_MS, DEFAULT_SLO_TTFT_S)
    choice = rec["choice"]
    assert choice is not None and not choice["overloaded"]
    assert choice["tpot_p99_ms"] <= DEFAULT_SLO_TPOT_MS and choice["ttft_p99_s"] <= DEFAULT_SLO_TTFT_S
    searched = [r for r in report["rows"] if r["searched"]]
    assert 0 < len(searched) <= 8  # the bisection adds only a few points to the 18 swept
    assert isinstance(rec["tie"], bool) and "choice_at_edge" in rec


def test_a_pick_at_the_edge_of_the_searched_range_is_flagged(capsys):
    assert main(["plan", "--concurrency", "1,2", "--slo-ttft-s", "none", "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "no TTFT target" in text and "[EDGE: the highest load searched" in text
    assert "[at the EDGE of the searched range]" in text
    assert main(["plan", "--concurrency", "1,2", "--slo-ttft-s", "none", "--no-search", "--json", "--quiet"]) == 0
    report = json.loads(capsys.readouterr().out)
    rec = report["recommendation"]
    assert rec["slo_ttft_s"] is None and rec["choice_at_edge"] and rec["choice"]["concurrency"] == 2
    assert not report["search"]["enabled"] and not any(r["searched"] for r in report["rows"])
