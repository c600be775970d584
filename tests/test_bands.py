"""Validation error bands (issue #29 item 6): the nearest published sets, pooled when equally near,
said which and what matches; the bundled bands file is the current validation's."""

from __future__ import annotations

import json
import statistics

import pytest

from simulator.serving.bands import BANDS_FILE, band_for, compute_bands, family, load_bands

TABLE = {
    "a": {"model": "glm-5.1-fp8", "family": "glm-5.1", "gpu": "h200", "deployment": "x", "mode": "colocated",
          "attention": "dp", "systems": {"baseline": {"median_abs_error": 0.1, "max_abs_error": 0.3, "points": 3,
                                                      "abs_errors": [0.05, 0.1, 0.3]}}},
    "b": {"model": "glm-5.1-fp8", "family": "glm-5.1", "gpu": "h200", "deployment": "y", "mode": "colocated",
          "attention": "dp", "systems": {"baseline": {"median_abs_error": 0.7, "max_abs_error": 0.8, "points": 2,
                                                      "abs_errors": [0.6, 0.8]},
                                         "hisparse": {"median_abs_error": 0.2, "max_abs_error": 0.2, "points": 1,
                                                      "abs_errors": [0.2]}}},
    "c": {"model": "deepseek-v3.2-fp8", "family": "deepseek-v3.2", "gpu": "h20-141g", "deployment": "z",
          "mode": "pd-decode", "attention": "dp",
          "systems": {"hisparse": {"median_abs_error": 0.4, "max_abs_error": 0.5, "points": 2, "abs_errors": [0.3, 0.5]}}},
}


def test_family_drops_the_formats():
    assert family("glm-5.1-fp8-kvfp8") == family("glm-5.1-fp8") == "glm-5.1"
    assert family("deepseek-v3.2-fp8") == "deepseek-v3.2"


def test_equally_near_sets_are_pooled():
    b = band_for("glm-5.1-fp8", "h200", "colocated", "dp", "baseline", TABLE)
    assert b["band"] == statistics.median([0.05, 0.1, 0.3, 0.6, 0.8]) and b["max"] == 0.8 and b["points"] == 5
    assert b["set"] == "a + b" and b["differs"] == []


def test_the_nearest_set_wins_and_the_differences_are_said():
    h = band_for("glm-5.1-fp8-kvfp8", "h200", "colocated", "dp", "hisparse", TABLE)
    assert (h["set"], h["band"]) == ("b", 0.2)  # only b measured HiSparse on this setup
    pd = band_for("deepseek-v3.2-fp8", "h20-141g", "pd-decode", "dp", "hisparse", TABLE)
    assert pd["set"] == "c" and pd["differs"] == []
    far = band_for("deepseek-v3.2-fp8", "b200", "colocated", "tp", "baseline", TABLE)
    assert far["set"] == "c" and "GPU" in far["differs"] and "may understate" in far["how"]


def test_ttft_has_its_own_band_from_the_sets_that_measured_it():
    """TTFT errs as a queueing figure, not a rate: its band pools only TTFT points, and a set
    without TTFT points gives none (so a throughput-only table has no TTFT band at all)."""
    table = {k: dict(v) for k, v in TABLE.items()}
    assert band_for("glm-5.1-fp8", "h200", "colocated", "dp", "baseline", table, group="ttft") is None
    table["b"]["ttft"] = {"baseline": {"median_abs_error": 0.42, "max_abs_error": 0.42, "points": 1,
                                       "abs_errors": [0.42]}}
    t = band_for("glm-5.1-fp8", "h200", "colocated", "dp", "baseline", table, group="ttft")
    assert (t["set"], t["band"], t["points"]) == ("b", 0.42, 1)
    rate = band_for("glm-5.1-fp8", "h200", "colocated", "dp", "baseline", table)
    assert rate["points"] == 5  # the TTFT point is not among the rate band's


def test_compute_bands_splits_ttft_points_from_the_rest():
    from types import SimpleNamespace

    s = SimpleNamespace(name="paper", scenario={"deployment": "8xh200-colocated-dp8"})
    rows = [{"set": "paper", "system": "baseline", "metric": m, "error": e}
            for m, e in (("steady_tok_s", 0.1), ("tpot_mean_ms", -0.3), ("ttft_mean_s", -0.5), ("max_running", 0.9))]
    out = compute_bands([s], rows)["paper"]
    assert out["systems"]["baseline"]["abs_errors"] == [0.1, 0.3]
    assert out["ttft"]["baseline"]["abs_errors"] == [0.5]


def test_a_broken_bands_file_is_one_clear_error(tmp_path):
    from simulator.errors import HisparseError

    bad = tmp_path / "bands.json"
    bad.write_text("{")
    with pytest.raises(HisparseError, match="python -m simulator.serving.bands"):
        load_bands(bad)


@pytest.mark.slow
def test_the_bundled_bands_are_the_current_validation():
    """Re-run every shipped published set and compare with the file (rewrite it with
    ``python -m simulator.serving.bands`` after a change to the model)."""
    from simulator.serving.published import load_published, published_names, validate

    sets = [load_published(n) for n in published_names()]
    rows = [r for s in sets for r in validate(s)]
    fresh = json.loads(json.dumps(compute_bands(sets, rows)))
    assert fresh == load_bands(BANDS_FILE)  # deterministic (seed 0): equal to the digit


def test_the_tie_band_is_the_paper_sets_median_from_the_bands_file(tmp_path):
    """The recommendation's tie band follows the validation: the median |error| of the set that
    measured both systems, over both systems' points (an odd and an even count by hand)."""
    import json
    import statistics

    from simulator.serving import slo
    from simulator.serving.bands import load_bands

    systems = load_bands()[slo.TIE_SET]["systems"]
    errs = [e for s in systems.values() for e in s["abs_errors"]]
    assert slo.MODEL_ERROR_BAND == statistics.median(errs)
    assert f"{slo.MODEL_ERROR_BAND:.0%}" in slo.MODEL_ERROR_SOURCE
    for base, hisp, want in (([0.01, 0.30], [0.05], 0.05), ([0.01, 0.30], [0.05, 0.2], (0.05 + 0.2) / 2)):
        f = tmp_path / "bands.json"
        f.write_text(json.dumps({"sets": {slo.TIE_SET: {"systems": {"baseline": {"abs_errors": base},
                                                                      "hisparse": {"abs_errors": hisp}}}}}))
        assert slo._tie_band(f) == (want, len(base) + len(hisp))


@pytest.mark.parametrize("args, code, words", [(["--help"], 0, "rewrite the error bands"),
                                               (["--all"], 2, "unrecognized arguments: --all")])
def test_bands_module_takes_no_arguments_and_leaves_the_file(args, code, words):
    """`python -m simulator.serving.bands --help` explains; a stray argument exits 2; neither re-runs
    the validation or rewrites the bands file (it used to ignore its arguments and rewrite it)."""
    import subprocess
    import sys

    before = BANDS_FILE.stat().st_mtime_ns
    run = subprocess.run([sys.executable, "-m", "simulator.serving.bands", *args], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == code
    assert words in run.stdout + run.stderr and "Traceback" not in run.stderr and "wrote" not in run.stderr
    assert BANDS_FILE.stat().st_mtime_ns == before
