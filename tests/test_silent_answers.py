"""Issue #28, class 10: inputs that gave a silently wrong answer are refused up front naming the
file and key, recorded as they were used, or written as strict JSON. Each property generates
members of the class; the issue's examples are among them."""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from simulator.errors import HisparseError
from simulator.serving.presets import PRESET_DIR
from tests.fuzzing import assert_clean_error, fuzz_settings, run_cli
from tests.helpers import Reached


def _preset(kind: str, name: str) -> str:
    return (PRESET_DIR / kind / f"{name}.toml").read_text()


def _with(text: str, key: str, value: str) -> str:
    if re.search(rf"(?m)^{key} = ", text):
        return re.sub(rf"(?m)^{key} = .*$", f"{key} = {value}", text)
    return re.sub(r"(?m)^(name = .*)$", rf"\1\n{key} = {value}", text, count=1)


def _accepts(argv, capsys) -> tuple[bool, str]:
    try:
        code, _, err = run_cli(argv, capsys)
    except Reached:
        return True, ""
    assert code == 2 and "Traceback" not in err, err
    return False, err


# -- a simulated clock past its resolution: TPOT 0.0 ms --------------------------------------------
@fuzz_settings(25)
@given(exp=st.floats(-300, 3))
def test_open_loop_rates_too_slow_to_simulate_are_refused(capsys, no_simulation, exp):
    rate = 10.0 ** exp
    ok, err = _accepts(["plan", "--rate", repr(rate)], capsys)
    arrivals = 4 * 16 * 8  # requests_per_client x 16 x ranks of the default deployment
    assert ok == (arrivals / rate <= 1e9), (rate, err)
    if not ok:
        assert "--rate" in err and "simulated clock" in err


@fuzz_settings(15)
@given(exp=st.floats(-300, -3))
def test_pd_prefill_rates_too_slow_to_simulate_are_refused(tmp_path_factory, capsys, no_simulation, exp):
    path = tmp_path_factory.mktemp("pd") / "pd.toml"
    path.write_text(_with(_preset("deployments", "2xh20-pd-decode"), "prefill_tok_s", repr(10.0 ** exp)))
    ok, err = _accepts(["plan", "--deployment", str(path), "--concurrency", "64"], capsys)
    assert not ok
    assert str(path) in err and "prefill_tok_s" in err


def test_an_open_loop_workload_file_rate_is_named(tmp_path, capsys, no_simulation):
    text = _with(_with(_preset("workloads", "32k-in-8k-out"), "arrival", '"open"'), "rate_per_s", "1e-300")
    path = tmp_path / "w.toml"
    path.write_text(text)
    ok, err = _accepts(["plan", "--workload", str(path)], capsys)
    assert not ok and str(path) in err and "rate_per_s" in err


# -- the model's context length --------------------------------------------------------------------
@fuzz_settings(20)
@given(context=st.integers(1, 80_000))
def test_requests_longer_than_the_models_context_are_refused(tmp_path_factory, capsys, no_simulation, context):
    path = tmp_path_factory.mktemp("ctx") / "m.toml"
    path.write_text(_with(_preset("models", "glm-5.1-fp8"), "context_length", str(context)))
    ok, err = _accepts(["plan", "--model", str(path)], capsys)
    assert ok == (context >= 32768 + 8192), (context, err)
    if not ok:
        assert str(path) in err and "32k-in-8k-out" in err and "context_length" in err


# -- tensor parallelism past one NVLink domain -----------------------------------------------------
@fuzz_settings(10)
@given(tp=st.sampled_from([16, 32, 64]), domain=st.sampled_from([0, 8, 16, 64]))
def test_tp_beyond_the_nvlink_domain_is_refused(tmp_path_factory, capsys, no_simulation, tp, domain):
    folder = tmp_path_factory.mktemp("tp")
    gpu = folder / "gpu.toml"
    gpu.write_text(_with(_preset("gpus", "h200"), "nvlink_domain_gpus", str(domain)))
    dep = folder / "dep.toml"
    text = _preset("deployments", "8xh200-colocated-dp8")
    for key in ("gpus", "tp", "dp"):
        text = _with(text, key, str(tp))
    dep.write_text(text)
    ok, err = _accepts(["plan", "--deployment", str(dep), "--gpu", str(gpu)], capsys)
    spans = (domain or 8) >= tp
    if not spans:
        assert not ok and str(dep) in err and "tp = " in err and "NVLink" in err
    else:
        assert "NVLink" not in err


# -- calibration CSVs: integers that wrap ----------------------------------------------------------
@fuzz_settings(25)
@given(n=st.one_of(st.integers(2**16 + 1, 2**70).map(float), st.just(1e30), st.floats(1e17, 1e300)))
def test_comm_csv_gpu_counts_past_the_range_are_refused(tmp_path_factory, n):
    from simulator.calibration.comm import read_comm_csv

    path = tmp_path_factory.mktemp("csv") / "c.csv"
    pd.DataFrame([{"collective": "all_reduce", "n_gpus": repr(n), "bytes": 1024, "time_us": 10.0},
                  {"collective": "all_reduce", "n_gpus": 8, "bytes": 2048, "time_us": 12.0}]).to_csv(path, index=False)
    with pytest.raises(HisparseError, match="n_gpus"):
        read_comm_csv(path)


# -- recorded as generated -------------------------------------------------------------------------
@fuzz_settings(10)
@given(sinks=st.integers(32, 10**12), topk=st.sampled_from([16, 32]))
def test_generated_traces_record_the_knobs_they_were_generated_with(tmp_path_factory, capsys, sinks, topk):
    folder = tmp_path_factory.mktemp("gen")
    knobs = folder / "k.toml"
    knobs.write_text(f"[knobs]\nsinks = {sinks}\n")
    out = folder / "t.hst"
    with pytest.warns(UserWarning, match="recorded as"):
        code, _, err = run_cli(["trace", "gen", "--knobs", str(knobs), "--steps", "3", "--layers", "1", "--requests",
                                "1", "--topk", str(topk), "--ctx0", "100", "--out", str(out), "--quiet"], capsys)
    assert code == 0, err
    from simulator.trace import open_trace

    recorded = open_trace(out).meta.source["knobs"]
    assert recorded["sinks"] == topk - 1 and recorded["local_window"] >= 1


@fuzz_settings(20)
@given(knob=st.sampled_from(["zipf_alpha", "run_mean", "retention", "recall_gap", "recall_spread", "recall_draws"]),
       value=st.sampled_from(["inf", "-inf", "nan"]))
def test_non_finite_knobs_are_refused(tmp_path_factory, capsys, knob, value):
    folder = tmp_path_factory.mktemp("kn")
    knobs = folder / "k.toml"
    knobs.write_text(f"[knobs]\n{knob} = {value}\n")
    code, _, err = run_cli(["trace", "gen", "--knobs", str(knobs), "--out", str(folder / "t.hst")], capsys)
    assert_clean_error(code, err, str(knobs), knob)
    assert not (folder / "t.hst").exists()


@fuzz_settings(20)
@given(first=st.integers(0, 2**31), steps=st.integers(1, 30), chunk=st.integers(1, 8))
def test_a_stream_written_from_step_s_reads_back_from_step_s(tmp_path_factory, first, steps, chunk):
    """TraceWriter.write from step 100 came back labelled from 0."""
    from simulator.replay import ReplayConfig, replay
    from simulator.trace import TraceWriter, open_trace

    path = tmp_path_factory.mktemp("fs") / "t.hst"
    with TraceWriter(path, k=4, source={"kind": "test"}, chunk_steps=chunk) as w:
        for t in range(steps):
            w.write(request=0, layer=0, step=first + t, ctx_len=10 + t, indices=[t % 10, 9 + t])
    trace = open_trace(path)
    stream = trace.read((0, 0))
    assert stream.first_step == first and stream.steps == steps
    per_step = replay(trace, ReplayConfig(buffer=4), per_step=True, workers=1).per_step
    assert per_step["step"].tolist() == list(range(first, first + steps))
    copy = path.with_name("copy.hst")  # convert's path: write_stream keeps the numbering
    with TraceWriter(copy, k=4, source={"kind": "test"}) as w:
        w.write_stream(stream)
    assert open_trace(copy).read((0, 0)).first_step == first


# -- strict JSON out -------------------------------------------------------------------------------
json_with_nan = st.recursive(st.floats() | st.integers() | st.text(max_size=3) | st.none(),
                             lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner,
                                                                                         max_size=3), max_leaves=10)


def _strict(text: str):
    def refuse(name):
        raise ValueError(name)

    return json.loads(text, parse_constant=refuse)


@fuzz_settings(60)
@given(value=json_with_nan)
def test_json_output_is_strict(capsys, value):
    from simulator.commands.common import print_json
    from simulator.inputs import dumps_json

    print_json(value)
    _strict(capsys.readouterr().out)
    _strict(dumps_json(value))
    _strict(dumps_json({"a": np.float64("nan"), "b": [np.float32("inf")], "c": np.array([[1.0, np.nan]])}))
    print_json({"a": np.array([np.inf, 2.0]), "n": np.int64(3)})
    assert _strict(capsys.readouterr().out) == {"a": [None, 2.0], "n": 3}


# -- the cause named -------------------------------------------------------------------------------
@fuzz_settings(10)
@given(exp=st.integers(6, 100))
def test_a_huge_host_ratio_is_blamed_not_the_weights(capsys, no_simulation, exp):
    ok, err = _accepts(["plan", "--sweep-host-ratio", f"1e{exp}"], capsys)
    assert not ok and "host_to_device_ratio" in err and "weights take" not in err


@fuzz_settings(10)
@given(page=st.integers(2**18, 2**40))
def test_a_huge_page_size_is_blamed_not_the_weights(tmp_path_factory, capsys, no_simulation, page):
    path = tmp_path_factory.mktemp("pg") / "d.toml"
    path.write_text(_with(_preset("deployments", "8xh200-colocated-dp8"), "page_size", str(page)))
    ok, err = _accepts(["plan", "--deployment", str(path)], capsys)
    assert not ok and "page_size" in err and "weights take" not in err


def test_a_corrupt_chunk_header_is_not_out_of_memory(tmp_path, capsys):
    """A version-1 file (no chunk-header checksum) whose header claims a 2**31 x 2**31 chunk."""
    from tests.hst_craft import Chunk, craft

    path = craft(tmp_path / "v.hst", b'{"k": 8, "source": {}}',
                 [Chunk(steps=2**31, width=2**31, accesses=1, payload=b"x")], version=2)
    code, _, err = run_cli(["trace", "validate", str(path)], capsys)
    assert_clean_error(code, err, str(path))
    assert "out of memory" not in err


@pytest.mark.parametrize("how", ["set", "file"])
def test_a_closed_loop_workload_with_a_rate_is_refused(tmp_path, capsys, no_simulation, how):
    """rate_per_s > 0 on a closed-loop workload was ignored: the plan ran closed loop at the
    concurrencies, the rate nowhere in its answer."""
    if how == "set":
        argv, where = ["--set", "workload.rate_per_s=1"], "--set workload.rate_per_s=1"
    else:
        path = tmp_path / "w.toml"
        path.write_text(_with(_preset("workloads", "32k-in-8k-out"), "rate_per_s", "1.5"))
        argv, where = ["--workload", str(path)], str(path)
    ok, err = _accepts(["plan", *argv, "--concurrency", "4"], capsys)
    assert not ok and where in err and "rate_per_s = " in err and "closed loop" in err
    if how == "set":
        ok, _ = _accepts(["plan", *argv, "--set", "workload.arrival=open"], capsys)
    else:  # a file is checked on its own, before --set applies
        path.write_text(_with(path.read_text(), "arrival", '"open"'))
        ok, _ = _accepts(["plan", *argv], capsys)
    assert ok  # the same rate on an open-loop workload plans
