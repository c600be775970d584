"""CPU checks of the DeepGEMM decode-linear timing (benchmarks/deepgemm_decode_linears.py): its shapes are the FP8
linears of the shipped Hopper validation sets' decode passes, the float32 reference of a block-scaled FP8 product
with N not a multiple of 128, torch's padded rows, and the command's errors (exit 2, no traceback). The timing itself
needs a Hopper GPU and SGLang's DeepGEMM build."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from simulator.costmodel.ops import attention_ops, dense_mlp_ops, moe_ops, rank_moe_ops
from simulator.serving import presets as P
from simulator.serving.published import load_published
from simulator.serving.scenario import load_scenario
from simulator.serving.speculative import from_table
from tests.helpers import check_refuses_non_hopper_torch

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("deepgemm_decode_linears",
                                               ROOT / "benchmarks" / "deepgemm_decode_linears.py")
dl = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(dl)


def _hopper_decode_linears() -> set[tuple[int, int]]:
    """(N, K) of every FP8 dense linear in a decode pass of each shipped validation set on a Hopper GPU."""
    shapes = set()
    for name in P.preset_names("published"):
        ps = load_published(name)
        inputs = dict(ps.scenario)
        if "speculative" in inputs:
            inputs["speculative"] = from_table(inputs["speculative"], name)
        c = load_scenario(**inputs).cost_model()
        if not c.deepgemm_fp8:
            continue
        ops = attention_ops(c.m, 16, 16 * 8000.0, c.layout, 1152) + moe_ops(c.m, 16, c.layout)
        ops += rank_moe_ops(c.m, 16, c.layout) + dense_mlp_ops(c.m, 16, c.layout)
        shapes |= {(o.n, o.k) for o in ops if o.kind == "gemm" and o.dtype == "fp8"}
    return shapes


def test_the_shapes_are_every_fp8_linear_of_the_hopper_sets():
    assert set(dl.SHAPES) == _hopper_decode_linears()
    assert len(dl.SHAPES) == len(set(dl.SHAPES))


def test_reference_dequantises_rows_and_weight_blocks_past_a_partial_block():
    torch = pytest.importorskip("torch")
    n, k = 160, 256  # two 128-row weight blocks, the second partial
    a = torch.ones((1, k))
    a_sf = torch.tensor([[2.0, 0.5]])
    b = torch.ones((n, k))
    b_sf = torch.tensor([[1.0, 3.0], [10.0, 10.0]])  # block rows 0-127, then 128-159
    got = dl.reference(a, a_sf, b, b_sf)
    assert got.shape == (1, n)
    assert torch.allclose(got[0, :128], torch.full((128,), 128 * 2.0 * 1.0 + 128 * 0.5 * 3.0))
    assert torch.allclose(got[0, 128:], torch.full((32,), 128 * 2.0 * 10.0 + 128 * 0.5 * 10.0))


def test_torch_runs_rows_padded_to_16_as_the_calibration_does():
    from simulator.calibration.op_kernels import _pad16

    for m in (1, 4, 15, 16, 17, 64, 256):
        assert dl.pad16(m) == _pad16(m)


@pytest.mark.parametrize("args, words", [
    (["--rows", "0"], "--rows must each be >= 1"),
    (["--reps", "0"], "--reps and --max-copies must be >= 1"),
    (["--shapes", "6144by16384"], "--shapes: each must be NxK"),
    (["--shapes", "6144x100"], "K a multiple of 128"),
])
def test_cli_errors_exit_2_without_traceback(args, words):
    run = subprocess.run([sys.executable, "benchmarks/deepgemm_decode_linears.py", *args], cwd=ROOT,
                         capture_output=True, text=True)
    assert run.returncode == 2, run.stderr
    assert words in run.stderr and "Traceback" not in run.stderr


def test_no_gpu_or_torch_is_a_usage_error(monkeypatch):
    check_refuses_non_hopper_torch(monkeypatch, dl.hopper_deep_gemm, dl.UsageError)


def test_the_recorded_h100_run_backs_the_figures_benchmarks_md_quotes():
    """The H100 run in benchmarks/results: every shape and row count timed and checked, and the ratios
    BENCHMARKS.md quotes (why the model keeps its torch._scaled_mm stand-in for SGLang's DeepGEMM linears)."""
    pd = pytest.importorskip("pandas")
    d = pd.read_csv(ROOT / "benchmarks" / "results" / "deepgemm_decode_linears-h100.csv")
    assert set(zip(d.n, d.k, strict=True)) == set(dl.SHAPES) and sorted(set(d.m)) == [1, 4, 16, 64, 256]
    assert (d.rel_err <= dl.REL_TOL).all()
    dec = d[d.m <= 64]
    assert len(dec) == 108 and round(dec.ratio.median(), 2) == 1.06
    assert 0.85 < dec.ratio.min() and dec.ratio.max() < 1.5
    glm = {(2624, 6144), (16384, 2048), (4096, 2048), (128, 6144), (6144, 16384), (4096, 6144), (6144, 2048)}
    x = dec[[(n, k) in glm for n, k in zip(dec.n, dec.k, strict=True)]]
    summed = [x[x.m == m].deepgemm_us.sum() / x[x.m == m].scaled_mm_us.sum() for m in (1, 4, 16, 64)]
    assert [round(v, 2) for v in summed] == [1.08, 1.11, 1.06, 1.05]
    # the second run (seed 1, the same machine, a later call): the same median, the GLM sums 1.00-1.06x
    e = pd.read_csv(ROOT / "benchmarks" / "results" / "deepgemm_decode_linears-h100-seed1.csv")
    assert (e.rel_err <= dl.REL_TOL).all() and round(e[e.m <= 64].ratio.median(), 2) == 1.06
    y = e[(e.m <= 64).to_numpy() & np.array([(n, k) in glm for n, k in zip(e.n, e.k, strict=True)])]
    assert [round(y[y.m == m].deepgemm_us.sum() / y[y.m == m].scaled_mm_us.sum(), 2) for m in (1, 4, 16, 64)] \
        == [1.05, 1.06, 1.01, 1.0]
    both = d.merge(e, on=["n", "k", "m"], suffixes=("_0", "_1"))
    change = both.ratio_1 / both.ratio_0 - 1
    assert len(both) == 135 and change.abs().max() < 0.13


def test_rows_are_written_as_they_are_measured(tmp_path, capsys):
    """The benchmark streams its rows (benchmarks/csv_out.row_stream): each one is on disk, under the first row's
    header, before the next is timed, so a device call cut short by its time limit keeps what it measured."""
    from benchmarks.csv_out import row_stream

    out = tmp_path / "sub" / "rows.csv"
    with row_stream(out) as put:
        put({"device": "NVIDIA H100 80GB HBM3", "n": 128, "ratio": 1.19})
        assert out.read_text().splitlines() == ["device,n,ratio", "NVIDIA H100 80GB HBM3,128,1.19"]
        put({"device": "NVIDIA H100 80GB HBM3", "n": 512, "ratio": 1.31})
    assert out.read_text().splitlines()[-1] == "NVIDIA H100 80GB HBM3,512,1.31"
    assert capsys.readouterr().out.strip() == f"wrote {out}"
