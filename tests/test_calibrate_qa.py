"""``hisparse calibrate --refit`` and ``hisparse validate --repredict`` without a GPU (QA pass): a
refit from a step table cut short wrote a calibration missing terms with status 0, and a plan on it
failed with a KeyError traceback; the README's ``validate --repredict --out calibration`` failed on
a checkout, whose calibration/ holds the runs but not the fit (the package holds it)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from simulator.errors import HisparseError
from simulator.serving.presets import PRESET_DIR
from tests.fuzzing import assert_clean_error, run_cli

SHIPPED = Path(__file__).resolve().parents[1] / "calibration"
PACKAGED = PRESET_DIR / "calibration" / "h200.json"


def _runs(tmp_path: Path) -> Path:
    """A copy of the checkout's calibration/ folder: the raw CSVs and the stored validation runs."""
    out = tmp_path / "cal"
    out.mkdir()
    for p in SHIPPED.iterdir():
        if p.suffix in (".csv", ".json"):
            shutil.copy(p, out / p.name)
    assert not (out / "h200.json").exists()
    return out


def _numbers(node, path=""):
    """Every number of a JSON tree by its path (floats compared to 1e-9)."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _numbers(v, f"{path}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _numbers(v, f"{path}[{i}]")
    elif isinstance(node, (int, float)) and not isinstance(node, bool):
        yield path, node


def test_a_refit_from_the_shipped_csvs_gives_the_packaged_fit(tmp_path, capsys):
    out = _runs(tmp_path)
    code, _, err = run_cli(["calibrate", "--refit", "--out", str(out)], capsys)
    assert code == 0, err
    mine = dict(_numbers(json.loads((out / "h200.json").read_text())))
    packaged = dict(_numbers(json.loads(PACKAGED.read_text())))
    assert set(packaged) <= set(mine)
    for key, value in packaged.items():
        assert mine[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key


def test_a_refit_from_a_cut_short_step_table_writes_nothing(tmp_path, capsys):
    """gemm-h200.csv cut to its first two rows: rc 0 and a file without the BF16, grouped and batched
    GEMM terms (its FP8 term a 2-point fit at 1e9 GB/s)."""
    out = _runs(tmp_path)
    gemm = out / "gemm-h200.csv"
    gemm.write_text("".join(gemm.read_text().splitlines(True)[:3]))
    code, _, err = run_cli(["calibrate", "--refit", "--out", str(out)], capsys)
    assert_clean_error(code, err, str(out), "gemm-h200.csv", "gemm bf16", "grouped_gemm fp8", "cut short")
    assert not (out / "h200.json").exists()


def test_a_plan_on_a_calibration_missing_a_gemm_term_is_one_line(tmp_path, capsys):
    """It ran into KeyError('batched_gemm', 'bf16') inside the simulation: a traceback, rc 1."""
    data = json.loads(PACKAGED.read_text())
    del data["step_terms"]["rates"]["gemm"]["bf16"]
    path = tmp_path / "cut.json"
    path.write_text(json.dumps(data))
    code, _, err = run_cli(["plan", "--calibration", str(path), "--concurrency", "8", "--no-search"], capsys)
    assert_clean_error(code, err, str(path), "gemm bf16")


def test_a_missing_term_is_a_user_error_not_a_key_error():
    from simulator.costmodel.calibration_file import read_calibration
    from simulator.costmodel.terms import StepTerms

    terms = StepTerms.from_calibration(read_calibration(PACKAGED).groups())
    with pytest.raises(HisparseError, match="no batched_gemm fp16 term"):
        terms.rate("batched_gemm", "fp16")


def test_repredict_on_the_checkouts_runs_uses_the_packaged_fit(tmp_path, capsys):
    """The README's `validate --repredict --out calibration` said "run hisparse calibrate first"."""
    out = _runs(tmp_path)
    stored = {n: json.loads((out / n).read_text()) for n in ("validation-h200.json", "validation-layer-h200.json")}
    code, _, err = run_cli(["validate", "--repredict", "--out", str(out)], capsys)
    assert code == 0, err
    for name, before in stored.items():
        after = json.loads((out / name).read_text())
        assert after["calibration"] == str(PACKAGED)  # says which fit it checked
        assert after["step_time_median_abs_err"] == pytest.approx(before["step_time_median_abs_err"], rel=1e-6)
    assert not (out / "h200.json").exists()  # nothing written beside the runs but their reports
    assert json.loads(PACKAGED.read_text())  # the package's file untouched and readable
