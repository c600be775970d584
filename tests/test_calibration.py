"""Calibration's CPU parts: the fits recover known parameters, a calibration JSON feeds the cost
model, and the validation prediction is the serving model's own kernel terms."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from simulator.calibration.fitting import fit_attention, fit_swap_in, linear_fit, relative_errors
from simulator.calibration.measure import draw_step
from simulator.calibration.validate import predicted_step_s
from simulator.costmodel.passes import CostModel
from simulator.errors import HisparseError
from simulator.serving import presets as P
from tests.helpers import decode_pass


def test_linear_fit_recovers_a_line():
    x = np.linspace(0, 10, 20)
    a, b, r2 = linear_fit(x, 3 + 2 * x)
    assert (a, b) == (pytest.approx(3), pytest.approx(2)) and r2 == pytest.approx(1)


def test_fit_swap_in_recovers_launch_and_bandwidth():
    rng = np.random.default_rng(0)
    rows = []
    for row, bw in ((656, 40e9), (1152, 50e9)):
        for batch in (1, 8, 64):
            for miss in (10, 300, 1500):
                n = batch * miss
                us = (12e-6 + batch * 2e-6 + n * row / bw) * 1e6 * (1 + rng.normal(0, 0.002))
                rows.append(dict(row_bytes=row, batch=batch, rows=n, us=us))
    fit = fit_swap_in(pd.DataFrame(rows), link_bw=55e9)
    assert fit["swap_in_launch_us"] == pytest.approx(12, rel=0.2)
    assert fit["swap_in_per_request_us"] == pytest.approx(2, rel=0.2)
    assert fit["gather_efficiency"] == pytest.approx(40 / 55, rel=0.02)
    assert fit["gather_efficiency_large_rows"] == pytest.approx(50 / 55, rel=0.02)


def test_fit_attention_recovers_efficiency():
    roof = np.array([5.0, 20, 46, 90, 180])
    fit = fit_attention(pd.DataFrame({"roofline_us": roof, "us": 8 + roof / 0.4}))
    assert fit["attention_launch_us"] == pytest.approx(8)
    assert fit["attention_efficiency"] == pytest.approx(0.4)


def test_calibration_json_feeds_the_cost_model(tmp_path):
    path = tmp_path / "h200.json"
    path.write_text(json.dumps({"params": {"calibrated": True, "swap_in_launch_us": 15.0,
                                           "attention_efficiency": 0.5, "attention_launch_us": 6.0},
                                "gpu": {"link_bw": 50e9, "gather_efficiency": 0.7}, "source": "test"}))
    params = P.load("calibration", str(path))
    assert params.calibrated and params.swap_in_launch_us == 15.0
    # the attention fit is read from the calibration's `fit` group (step_costs.py), not from params
    assert not hasattr(params, "attention_launch_us")
    assert params.backup_overlap == P.load("calibration", "uncalibrated").backup_overlap  # inherited
    gpu = P.load("gpus", "h200", **P.calibration_gpu(path))
    assert gpu.link_bw == 50e9 and gpu.swap_bw(656) == pytest.approx(35e9)
    path.write_text("{}")
    with pytest.raises(HisparseError, match="no 'params' object"):
        P.load("calibration", str(path))


def test_validation_prediction_is_the_models_kernel_terms():
    dep = P.load("deployments", "8xh200-colocated-dp8")
    cost = CostModel(P.load("models", "glm-5.1-fp8"), P.load("gpus", "h200"), dep, P.load("calibration", "uncalibrated"))
    misses = np.array([100.0, 0.0, 5000.0])
    want = sum(cost.swap_in_layer(m, 16) + cost.attention(16) for m in misses)
    assert predicted_step_s(cost, misses, 16) == pytest.approx(float(want))
    # the serving model's decode step holds the same terms, times the model's layers
    step = decode_pass(cost, 16, 16 * 40000.0, missed_rows=78 * 100.0)
    assert float(step.swap_s[0]) == pytest.approx(78 * float(cost.swap_in_layer(100.0, 16)))


def test_draw_step_has_exactly_the_asked_misses():
    rng = np.random.default_rng(0)
    slot_pos = np.stack([rng.choice(30000, 4096, replace=False) for _ in range(3)])
    step = draw_step(rng, slot_pos, 300, ctx=32768)
    assert step.shape == (3, 2048)
    for r in range(3):
        row = step[r]
        assert np.unique(row).size == 2048 and 32767 in row
        assert (~np.isin(row[row != 32767], slot_pos[r])).sum() == 300


def test_relative_errors():
    assert relative_errors([1.1, 0.8], [1.0, 1.0]).tolist() == pytest.approx([0.1, 0.2])


def test_committed_fit_and_validation_rebuild_on_the_cpu(tmp_path, capsys):
    """--refit and --repredict recompute the committed H200 files from their raw data, no GPU."""
    import shutil

    from simulator.cli import main

    for name in ("swap_in-h200.csv", "attention-h200.csv", "validation-h200.json",
                 "gemm-h200.csv", "elementwise-h200.csv", "indexer-h200.csv", "graph-h200.csv",
                 "validation-layer-h200.json", "grouped_tp-h200.csv", "fused_moe_tp-h200.csv"):
        shutil.copy(f"calibration/{name}", tmp_path / name)
    committed = json.loads(open("simulator/presets/calibration/h200.json").read())
    # without a previous run in --out the refit builds on the packaged file, and writes into --out
    assert main(["calibrate", "--refit", "--out", str(tmp_path)]) == 0
    first = json.loads((tmp_path / "h200.json").read_text())
    assert first["source"] == committed["source"] and first["version"] == committed["version"]  # the packaged run's
    other = committed | {"other_group": {"kept": "as another command wrote it"}}
    (tmp_path / "h200.json").write_text(json.dumps(other))
    assert main(["calibrate", "--refit", "--out", str(tmp_path)]) == 0
    refit = json.loads((tmp_path / "h200.json").read_text())
    assert refit["other_group"] == {"kept": "as another command wrote it"}  # e.g. calibrate --comm's section
    for key, value in committed["params"].items():
        assert refit["params"][key] == pytest.approx(value), key
    for kind, per in committed["step_terms"]["rates"].items():
        for dtype, fit in per.items():
            for key in ("launch_us", "gbps"):
                assert refit["step_terms"]["rates"][kind][dtype][key] == pytest.approx(fit[key]), (kind, dtype, key)
    for name, fit in committed["step_terms"]["indexer"].items():
        assert refit["step_terms"]["indexer"][name] == pytest.approx(fit), name
    assert refit["step_terms"]["graph_launch_us"] == pytest.approx(committed["step_terms"]["graph_launch_us"])
    for name in ("validation-h200.json", "validation-layer-h200.json"):
        validation = json.loads(open(f"calibration/{name}").read())
        assert main(["validate", "--repredict", "--out", str(tmp_path)]) == 0
        again = json.loads((tmp_path / name).read_text())
        assert again["step_time_median_abs_err"] == pytest.approx(validation["step_time_median_abs_err"])
        assert again["misses_exact"] and again["step_time_median_abs_err"] <= 0.10
        assert again["step_time_p90_abs_err"] <= 0.20
    assert (tmp_path / "validation-h200.png").stat().st_size > 1000
    assert (tmp_path / "validation-layer-h200.png").stat().st_size > 1000
    capsys.readouterr()


def test_layer_validation_prediction_is_layer_work_priced_by_the_terms():
    """The layer loop's prediction is layer_work's ops priced by the committed step terms plus
    each layer's swap-in: recomputed here op by op."""
    from simulator.calibration.layer_loop import predicted_step_s
    from simulator.calibration.model_shapes import GLM_5_1
    from simulator.costmodel.ops import Layout, layer_ops
    from simulator.costmodel.terms import StepTerms

    terms = StepTerms.from_calibration(json.loads(open("simulator/presets/calibration/h200.json").read()))
    cfg = {"requests": 8, "dense": 1, "row_bytes": 656}
    misses = [300.0, 1200.0]
    # a stored run without its own record measured the absorbed bmm as bmm_fp8 (the committed runs)
    # and did not run the q concatenation before FlashMLA (an op since branch acc25c)
    want = sum(terms.ops_time(layer_ops(GLM_5_1, 8, 8 * 20000.0, Layout(), dense=i < 1, kv_row_bytes=656,
                                        absorbed="fp8", q_concat=False))
               + terms.swap_in_time(m, 8, 656) for i, m in enumerate(misses))
    assert predicted_step_s(terms, cfg, 20000, misses) == pytest.approx(want)
    # a run that records SGLang's BF16 torch.bmm and the q concatenation is priced with them
    bf = terms.with_bf16()
    want16 = sum(bf.ops_time(layer_ops(GLM_5_1, 8, 8 * 20000.0, Layout(), dense=i < 1, kv_row_bytes=656))
                 + bf.swap_in_time(m, 8, 656) for i, m in enumerate(misses))
    new_run = cfg | {"absorbed_dtype": "bf16", "q_concat": True}
    assert predicted_step_s(bf, new_run, 20000, misses) == pytest.approx(want16)
    assert want16 != pytest.approx(want)
    assert predicted_step_s(bf, new_run, 20000, misses) > predicted_step_s(bf, new_run | {"q_concat": False}, 20000,
                                                                          misses)
    # more context costs more (the indexer reads every key), more misses cost more
    assert predicted_step_s(terms, cfg, 80000, misses) > predicted_step_s(terms, cfg, 20000, misses)
    assert predicted_step_s(terms, cfg, 20000, [3000.0, 3000.0]) > predicted_step_s(terms, cfg, 20000, misses)


def test_tp_moe_term_refits_from_its_committed_csv():
    """The TP fused-MoE slices' term (``calibrate --terms moe-tp``) from the committed CSV alone:
    one fit per slice on weight bytes, close on its points; the EP controls timed beside it agree
    with the step run's whole-expert fit; a table naming an unknown op is refused."""
    from simulator.calibration.fitting import fit_step_terms

    tables = {n: pd.read_csv(f"calibration/{n}-h200.csv") for n in ("gemm", "elementwise", "indexer", "graph",
                                                                     "grouped_tp")}
    st = fit_step_terms(*(tables[n] for n in ("gemm", "elementwise", "indexer", "graph", "grouped_tp")))
    committed = json.loads(open("simulator/presets/calibration/h200.json").read())["step_terms"]
    for kind in ("grouped_gemm_tp_up", "grouped_gemm_tp_down"):
        fit = st["rates"][kind]["fp8"]
        assert fit["bytes"] == "weights" and fit["points"] == 20
        assert fit == pytest.approx(committed["rates"][kind]["fp8"])
        assert fit["median_rel_err"] < 0.05 and fit["max_rel_err"] < 0.10
    # the K-sliced down projection is the slow one (measured), gate_up near the whole experts' rate
    assert st["rates"]["grouped_gemm_tp_down"]["fp8"]["gbps"] < 0.5 * st["rates"]["grouped_gemm_tp_up"]["fp8"]["gbps"]
    assert abs(st["tp_moe_ep_controls"]["fp8"]["median_rel_err"]) < 0.05
    bad = tables["grouped_tp"].assign(name="routed_other")
    with pytest.raises(ValueError, match="routed_other"):
        fit_step_terms(tables["gemm"], tables["elementwise"], tables["indexer"], tables["graph"], bad)


def test_fused_moe_term_refits_from_its_committed_csv():
    """The TP slices' Triton fused-MoE terms (``calibrate --terms fused-moe-tp``) from the committed
    CSV: one fit per slice over the fastest tile config per node-token count, as committed; the
    same run's torch._scaled_grouped_mm rows reproduce the moe-tp table's timings (a control of the
    setup); the committed fit prices the TP ops by default; a table naming an unknown op is refused."""
    from simulator.calibration.fitting import fit_fused_moe_tp

    df = pd.read_csv("calibration/fused_moe_tp-h200.csv")
    committed = json.loads(open("simulator/presets/calibration/h200.json").read())["step_terms"]
    rates, summary = fit_fused_moe_tp(df)
    tokens = sorted(set(df["node_tokens"]))
    for name, kind in (("routed_gate_up", "fused_moe_tp_up"), ("routed_down", "fused_moe_tp_down")):
        fit = rates[kind]["fp8"]
        assert fit == pytest.approx(committed["rates"][kind]["fp8"])
        assert fit["bytes"] == "weights" and fit["points"] == len(tokens)
        assert fit["median_rel_err"] < 0.10 and fit["max_rel_err"] < 0.30
        best = df[(df["name"] == name) & df["best"]]
        tri = df[(df["name"] == name) & (df["impl"] == "triton_fused_moe")]
        assert list(best["us"]) == list(tri.groupby("node_tokens")["us"].min().loc[best["node_tokens"]])
        assert [p["node_tokens"] for p in summary[name]["points"]] == tokens
    assert committed["tp_moe_kernel"] == "triton_fused_moe"
    old = pd.read_csv("calibration/grouped_tp-h200.csv")
    old = old[(old["layout"] == "tp") & (old["model"] == "glm-5.1")].set_index(["name", "node_tokens"])["us"]
    sg = df[df["impl"] == "torch._scaled_grouped_mm"].set_index(["name", "node_tokens"])["us"]
    both = old.index.intersection(sg.index)
    assert len(both) >= 10
    assert float(np.median(np.abs(sg[both] / old[both] - 1))) < 0.05  # same tool, same shapes, another run
    with pytest.raises(ValueError, match="routed_other"):
        fit_fused_moe_tp(df.assign(name="routed_other"))
    with pytest.raises(ValueError, match="missing columns"):
        fit_fused_moe_tp(df.drop(columns=["best"]))


def test_refit_with_a_broken_fused_moe_csv_is_a_clear_error(tmp_path, capsys):
    """--refit on a fused_moe_tp CSV missing a column: exit 2 naming the CSVs and the column, the
    calibration JSON left as it was."""
    import shutil

    from simulator.cli import main

    for name in ("swap_in-h200.csv", "attention-h200.csv", "gemm-h200.csv", "elementwise-h200.csv",
                 "indexer-h200.csv", "graph-h200.csv", "grouped_tp-h200.csv"):
        shutil.copy(f"calibration/{name}", tmp_path / name)
    pd.read_csv("calibration/fused_moe_tp-h200.csv").drop(columns=["weight_bytes"]).to_csv(
        tmp_path / "fused_moe_tp-h200.csv", index=False)
    shutil.copy("simulator/presets/calibration/h200.json", tmp_path / "h200.json")
    before = (tmp_path / "h200.json").read_bytes()
    assert main(["calibrate", "--refit", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "fused_moe_tp-h200.csv" in err and "weight_bytes" in err and "Traceback" not in err
    assert (tmp_path / "h200.json").read_bytes() == before


_TABLES = ("swap_in", "attention", "gemm", "elementwise", "indexer", "graph", "grouped_tp", "fused_moe_tp")


def _header_only(df):
    return df.iloc[:0]


def _cell(col, row, value):
    def edit(df):
        df = df.astype({col: object})
        df.iloc[row, df.columns.get_loc(col)] = value
        return df
    return edit


# (table, edit, what the error says): each crashed the refit with a traceback, or (a header alone)
# exited 0 writing a calibration that later crashed hisparse plan or priced graph nodes at 0 us
BROKEN_TABLES = [
    ("swap_in", lambda df: pd.DataFrame({"a": [1], "b": [2]}), "columns 'batch', 'rows', 'row_bytes', 'us' missing"),
    ("swap_in", _header_only, "swap_in-h200.csv: no data rows"),
    ("swap_in", _cell("us", 1, "abc"), "column 'us', data row 2: 'abc' is not a positive number of microseconds"),
    ("attention", _cell("roofline_us", 0, float("nan")), "column 'roofline_us', data row 1: 'nan' is not a positive"),
    ("attention", _header_only, "attention-h200.csv: no data rows"),
    ("gemm", _header_only, "gemm-h200.csv: no data rows"),
    ("gemm", _cell("bytes", 3, "inf"), "column 'bytes', data row 4: 'inf' is not a finite number"),
    ("indexer", _header_only, "indexer-h200.csv: no data rows"),
    ("graph", _header_only, "graph-h200.csv: no data rows"),
    ("graph", lambda df: df.iloc[:1], "graph, column 'kernels': 1 distinct value(s), the fit needs at least 2"),
    ("elementwise", _cell("us", 0, -3.0), "column 'us', data row 1: '-3.0' is not a positive number"),
]


@pytest.mark.parametrize("table, edit, says", BROKEN_TABLES,
                         ids=[f"{t}-{i}" for i, (t, _, _) in enumerate(BROKEN_TABLES)])
def test_refit_of_a_broken_table_is_one_line_and_writes_nothing(tmp_path, capsys, table, edit, says):
    """--refit on a table cut short or edited by hand: exit 2, one line naming the file (or the fit) and what is
    wrong, every file in --out as it was."""
    import shutil

    from simulator.cli import main

    for name in _TABLES:
        shutil.copy(f"calibration/{name}-h200.csv", tmp_path / f"{name}-h200.csv")
    edit(pd.read_csv(f"calibration/{table}-h200.csv")).to_csv(tmp_path / f"{table}-h200.csv", index=False)
    shutil.copy("simulator/presets/calibration/h200.json", tmp_path / "h200.json")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert main(["calibrate", "--refit", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and says in err and "Traceback" not in err, err
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_refit_of_the_committed_tables_still_runs(tmp_path):
    """The table checks pass what hisparse calibrate wrote (the committed H200 run)."""
    import shutil

    from simulator.cli import main

    for name in _TABLES:
        shutil.copy(f"calibration/{name}-h200.csv", tmp_path / f"{name}-h200.csv")
    shutil.copy("simulator/presets/calibration/h200.json", tmp_path / "h200.json")
    assert main(["calibrate", "--refit", "--out", str(tmp_path)]) == 0
    assert json.loads((tmp_path / "h200.json").read_text())["step_terms"]["graph_launch_us"] > 0


def test_loop_helpers_fill_host_rows_and_order_topk_by_step():
    """The two GPU validation loops' shared set-up, on numpy: every host byte written from one
    seeded block (never zero), and the top-k arranged [step, layer, request, k]."""
    from simulator.calibration.validate import fill_host_rows, topk_by_step
    from simulator.trace.generator import PRESETS, generate

    class FakeHotBuffer:
        def __init__(self, layers, size):
            self.rows = [np.zeros(size, np.uint8) for _ in range(layers)]

        def host_rows(self, layer):
            return self.rows[layer]

    size = (1 << 24) + 1000  # more than one block: the block repeats
    hb = FakeHotBuffer(2, size)
    fill_host_rows(hb, 2, np.random.default_rng(5))
    block = np.random.default_rng(5).integers(0, 0x3F, 1 << 24, dtype=np.uint8)
    for rows in hb.rows:
        assert np.array_equal(rows[: 1 << 24], block) and np.array_equal(rows[1 << 24:], block[:1000])
    streams = list(generate(PRESETS["high-overlap"], steps=5, layers=3, requests=2, k=64, ctx0=500, seed=1))
    idx = topk_by_step(streams, 3)
    assert idx.shape == (5, 3, 2, 64) and idx.flags.c_contiguous
    for s in streams:
        assert np.array_equal(idx[:, s.layer, s.request], s.indices)


def test_loop_engine_misses_are_the_replay_engines():
    """The misses the GPU loops hold the swap-in kernel to: HiSparse's batched LRU per stream."""
    from simulator.calibration.validate import engine_misses
    from simulator.replay import ReplayConfig
    from simulator.replay.api import replay_stream
    from simulator.trace.generator import PRESETS, generate

    streams = list(generate(PRESETS["high-overlap"], steps=6, layers=2, requests=3, k=64, ctx0=400, seed=3))
    got = engine_misses(streams, (6, 2, 3), 96)
    assert got.sum() > 0
    for s in streams:
        assert np.array_equal(got[:, s.layer, s.request], replay_stream(s, ReplayConfig(policy="lru", buffer=96)))


def test_kernel_loop_repredict_prices_with_the_calibration_being_checked():
    """repredict must keep the CostModel's own terms: a calibration whose attention terms differ
    from the packaged one's gives different predictions (it once fell back to the packaged file)."""
    import dataclasses

    from simulator.calibration.validate import repredict
    from simulator.costmodel.passes import CostModel
    from simulator.costmodel.pricing import terms_for
    from simulator.serving import presets as P

    cal = P.load_calibration("simulator/presets/calibration/h200.json")
    gpu = P.load_gpu("h200", "simulator/presets/calibration/h200.json")
    model = P.load("models", "glm-5.1-fp8")
    dep = P.load("deployments", "8xh200-colocated-dp8")
    terms = terms_for(gpu, cal.terms, cal.label)
    slow = dataclasses.replace(terms, terms=dataclasses.replace(
        terms.terms, attention={k: (launch + 100e-6, eff / 2) for k, (launch, eff) in terms.terms.attention.items()}))
    result = {"layers": 4, "heads": 64, "row_bytes": 1152, "requests": 8, "misses_per_layer": [[10.0, 20.0, 5.0, 0.0]]}
    base = repredict(CostModel(model, gpu, dep, cal.params, terms), result)["predicted_s"][0]
    slower = repredict(CostModel(model, gpu, dep, cal.params, slow), result)["predicted_s"][0]
    assert slower > base + 4 * 100e-6  # four layers, each at least the added launch cost


def test_a_retired_calibration_key_says_what_replaced_it(tmp_path):
    """prefill_attention_efficiency (0.83, a README figure) gave way to FlashMLA's measured table: a file that
    still sets it is refused with the reason, not as an unknown key, and the CLI exits 2."""
    import subprocess
    import sys

    src = P.resolve("calibration", "uncalibrated").read_text()
    path = tmp_path / "old.toml"
    path.write_text(src + "prefill_attention_efficiency = 0.83\n")
    with pytest.raises(HisparseError, match=r"old.toml: prefill_attention_efficiency is no longer read: .*prompt_chunk"):
        P.load("calibration", str(path))
    run = subprocess.run([sys.executable, "-m", "simulator.cli", "plan", "--calibration", str(path), "--quiet",
                          "--no-search", "--concurrency", "1"], capture_output=True, text=True)
    assert run.returncode == 2 and "no longer read" in run.stderr and "Traceback" not in run.stderr
