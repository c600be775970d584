"""`hisparse plan --validate`: the shipped published sets load, every point gets a prediction or a
stated reason, and the table, median and max error come out as text and JSON."""

from __future__ import annotations

import json
import statistics

import pytest

from simulator.cli import main
from simulator.errors import HisparseError
from simulator.serving.published import load_published, published_names, summary, validate

pytestmark = pytest.mark.usefixtures("private_cache")


def test_shipped_sets_carry_their_sources():
    assert {"paper-glm51-8xh200", "issue-30985-baseline"} <= set(published_names())
    for name in published_names():
        ps = load_published(name)
        assert ps.source and ps.points
    paper = load_published("paper-glm51-8xh200")
    measured = {p.label: p.measured for p in paper.points}
    assert measured["32K/8K, baseline peak"] == 624 and measured["32K/8K, HiSparse peak"] == 1919
    assert [p.measured for p in load_published("issue-30985-baseline").points] == [
        252.33, 439.91, 435.43, 431.55, 437.30, 442.72]


def test_validation_rows_and_summary():
    rows = validate(load_published("issue-30985-baseline"))
    assert len(rows) == 6
    for r in rows:
        assert r["error"] == pytest.approx(r["predicted"] / r["measured"] - 1)
    s = summary(rows)
    assert s["median_abs_error"] == pytest.approx(statistics.median(abs(r["error"]) for r in rows))
    assert s["max_abs_error"] == max(abs(r["error"]) for r in rows)


@pytest.mark.slow  # every published point, twice
def test_validate_cli_text_and_json(tmp_path, capsys):
    assert main(["plan", "--validate", "issue-30985-baseline", "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "== issue-30985-baseline" in text and "median |error|" in text and "252.3" in text
    out = tmp_path / "v"
    assert main(["plan", "--validate", "issue-30985-baseline", "--quiet", "--json", "--out", str(out)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["sets"]["issue-30985-baseline"]["points"] == 6 and len(report["rows"]) == 6
    assert sorted(p.name for p in out.iterdir()) == ["validation.csv", "validation.json", "validation.png"]
    assert (out / "validation.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_point_the_model_cannot_run_is_reported_not_fatal(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text("""name = "mine"
source = "test"
[scenario]
deployment = "8xh200-colocated-dp8"
[[point]]
label = "too long"
system = "baseline"
metric = "makespan_tok_s"
concurrency = 1
input_tokens = 900000
output_tokens = 10
measured = 1.0
[[point]]
label = "fine"
system = "baseline"
metric = "max_running"
concurrency = 1
input_tokens = 4096
output_tokens = 16
requests_per_client = 1
measured = 100.0
""")
    rows = validate(load_published(str(path)))
    assert rows[0]["predicted"] != rows[0]["predicted"] and "MODEL CANNOT RUN IT" in rows[0]["note"]
    # the whole reason, without the files it names first (a message with ': ' inside it is not cut)
    reason = rows[0]["note"].split("MODEL CANNOT RUN IT: ")[1]
    assert reason.startswith("requests of up to 900010 tokens") and "context_length" in reason
    assert "mine.toml" not in reason
    assert rows[1]["predicted"] > 0
    assert summary(rows)["predicted"] == 1


def test_an_estimate_is_reported_but_kept_out_of_the_median():
    """The paper's '~60 at saturation (~240 GB)' reads in two of three secondary sources as a capacity
    estimate from aggregate HBM, not a measured running count: the set marks it kind = "estimate"."""
    paper = load_published("paper-glm51-8xh200")
    kinds = {p.label: p.kind for p in paper.points}
    assert kinds["32K/8K full KV in HBM: requests at saturation"] == "estimate"
    assert sum(k == "estimate" for k in kinds.values()) == 1
    assert kinds["32K/8K full KV in HBM: decode throughput at saturation"] == "measurement"
    rows = [{"error": 0.1, "kind": "measurement"}, {"error": -0.3, "kind": "measurement"},
            {"error": 5.0, "kind": "estimate"}]
    s = summary(rows)
    assert (s["points"], s["predicted"], s["estimates"]) == (2, 2, 1)
    assert s["median_abs_error"] == pytest.approx(0.2) and s["max_abs_error"] == pytest.approx(0.3)


@pytest.mark.parametrize("text, message", [
    ('name = "x"\n', "source missing"),
    ('name = "x"\nsource = "s"\n[[point]]\nlabel = "a"\nsystem = "baseline"\nmetric = "steady_tok_s"\n'
     'concurrency = 1\ninput_tokens = 1\noutput_tokens = 1\nmeasured = 1\nkind = "guess"\n',
     "kind = 'guess' must be one of measurement, estimate"),
    ('name = "x"\nsource = "s"\n', r"no \[\[point\]\] tables"),
    ('name = "x"\nsource = "s"\n[[point]]\nlabel = "a"\n', r"point 1: missing key\(s\)"),
    ('name = "x"\nsource = "s"\n[[point]]\nlabel = "a"\nsystem = "b"\nmetric = "steady_tok_s"\nconcurrency = 1\n'
     'input_tokens = 1\noutput_tokens = 1\nmeasured = 1\n', "system = 'b' must be one of baseline, hisparse"),
    ('name = "x"\nsource = "s"\n[[point]]\nlabel = "a"\nsystem = "baseline"\nmetric = "tok_s"\nconcurrency = 1\n'
     'input_tokens = 1\noutput_tokens = 1\nmeasured = 1\n', "metric = 'tok_s' must be one of makespan_tok_s, steady_tok_s"),
    # inf ran (a -100% error) or failed in the plot; [] predicted NaN at concurrency 0 (exit 0)
    ('name = "x"\nsource = "s"\n[[point]]\nlabel = "a"\nsystem = "baseline"\nmetric = "steady_tok_s"\n'
     'concurrency = 1\ninput_tokens = 1\noutput_tokens = 1\nmeasured = inf\n', "measured = inf must be a positive finite"),
    ('name = "x"\nsource = "s"\n[[point]]\nlabel = "a"\nsystem = "baseline"\nmetric = "steady_tok_s"\n'
     'concurrency = []\ninput_tokens = 1\noutput_tokens = 1\nmeasured = 1\n', r"concurrency = \[\]: give one load point"),
    ('name = "x"\nsource = "s"\n[[point]]\nlabel = "a"\nsystem = "baseline"\nmetric = "steady_tok_s"\n'
     'concurrency = 0\ninput_tokens = 1\noutput_tokens = 1\nmeasured = 1\n', r"concurrency\[0\] = 0 must be"),
    ('name = "x"\nsource = "s"\nbogus = 1\n', r"unknown key\(s\) bogus"),
])
def test_bad_published_files(tmp_path, text, message):
    path = tmp_path / "p.toml"
    path.write_text(text)
    with pytest.raises(HisparseError, match=message) as err:
        load_published(str(path))
    assert str(path) in str(err.value)
    with pytest.raises(HisparseError, match="unknown published set 'nope'"):
        load_published("nope")


@pytest.mark.slow  # every published point, on another trace and calibration
def test_validate_takes_another_trace_and_calibration(capsys):
    # the HiSparse points differ: the packaged H200 fit's swap-in launch vs the published 28 us (the
    # step kernels are the H200's measured terms either way: scaled by 1.0 when uncalibrated)
    assert main(["plan", "--validate", "paper-glm51-8xh200", "--quiet", "--json", "--calibration", "none"]) == 0
    uncal = json.loads(capsys.readouterr().out)["rows"]
    assert main(["plan", "--validate", "paper-glm51-8xh200", "--quiet", "--json"]) == 0
    cal = json.loads(capsys.readouterr().out)["rows"]
    hi = [i for i, r in enumerate(cal) if "HiSparse" in r["label"] and r["predicted"] is not None]  # null: cannot run
    assert hi and all(uncal[i]["predicted"] != cal[i]["predicted"] for i in hi)


def _strict_json(text: str):
    """json.loads that refuses NaN and Infinity (not JSON; strict parsers reject them)."""
    def refuse(name):
        raise ValueError(f"{name} in the JSON")

    return json.loads(text, parse_constant=refuse)


def test_a_refusal_inside_the_simulation_keeps_its_whole_reason():
    """The paper's 160K points: the pool and admission refusals read in full (they hold ': ' and
    '(...; ...)' that a split on the last ': ' cut to a fragment)."""
    import dataclasses

    ps = load_published("paper-glm51-8xh200")
    ps = dataclasses.replace(ps, points=tuple(p for p in ps.points if p.label.startswith("160K")))
    reasons = [r["note"].split("MODEL CANNOT RUN IT: ")[1] for r in validate(ps)]
    assert reasons[0].startswith("one request of 163840 + 8192 tokens needs 172032 KV slots on the GPU")
    assert reasons[1].startswith("SGLang never admits a request of 163840 + 8192 tokens")
    assert not any(".toml" in r for r in reasons)


def test_validate_json_has_null_not_nan_for_a_point_the_model_cannot_run(tmp_path, capsys):
    path = tmp_path / "mine.toml"
    path.write_text("""name = "mine"
source = "test"
[[point]]
label = "too long"
system = "baseline"
metric = "makespan_tok_s"
concurrency = 1
input_tokens = 900000
output_tokens = 10
measured = 1.0
""")
    out = tmp_path / "v"
    assert main(["plan", "--validate", str(path), "--quiet", "--json", "--out", str(out)]) == 0
    for report in (_strict_json(capsys.readouterr().out), _strict_json((out / "validation.json").read_text())):
        (row,) = report["rows"]
        assert row["predicted"] is None and row["error"] is None and "MODEL CANNOT RUN IT" in row["note"]
        assert report["all"]["median_abs_error"] is None and report["all"]["predicted"] == 0
    # the text table still says n/a and why
    assert main(["plan", "--validate", str(path), "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "n/a" in text and "MODEL CANNOT RUN IT" in text


def test_json_safe_replaces_every_non_finite_number():
    import numpy as np

    from simulator.commands.common import json_safe

    value = {"a": float("nan"), "b": [1.0, float("inf"), np.float32("nan"), np.float64(2.5)], "c": (np.int64(3), "x"),
             "d": {"e": -float("inf"), "f": None, "g": True}}
    safe = json_safe(value)
    assert _strict_json(json.dumps(safe, default=lambda v: v.item())) == {
        "a": None, "b": [1.0, None, None, 2.5], "c": [3, "x"], "d": {"e": None, "f": None, "g": True}}


def test_plan_json_is_strict_and_the_miss_line_says_which_steps(tmp_path, capsys):
    from simulator.serving.misses import miss_profiles

    out = tmp_path / "p"
    assert main(["plan", "--concurrency", "1", "--quiet", "--json", "--out", str(out)]) == 0
    report = _strict_json(capsys.readouterr().out)
    _strict_json((out / "plan.json").read_text())
    (knob,) = report["misses"]
    trace = report["scenario"]["trace"]["file"]  # the trace chosen for the question (serving.trace_choice)
    prof = miss_profiles(trace, top_k=2048, buffer=knob["device_buffer_size"], policy="lru")
    assert knob["trace_steps"] == prof.steps and knob["steady_from"] == 16
    assert knob["miss_ratio"] == pytest.approx(statistics.mean(float(f.mean()) for f in prof.shares))
    assert knob["steady_miss_ratio"] == pytest.approx(statistics.mean(float(f[16:].mean()) for f in prof.shares))
    assert knob["steady_miss_ratio"] != pytest.approx(knob["miss_ratio"], abs=1e-4)  # the cold start counts
    assert main(["plan", "--concurrency", "1", "--quiet"]) == 0
    line = next(s for s in capsys.readouterr().out.splitlines() if s.startswith("trace:"))
    assert (f"{knob['miss_ratio']:.1%} over all {prof.steps} steps incl. the cold start; "
            f"{knob['steady_miss_ratio']:.1%} from step 16") in line


def test_a_missing_preset_of_a_sets_scenario_names_the_set_and_key(tmp_path, capsys):
    """It printed '/nonexistent/x.toml: no such file', naming neither the set file nor its [scenario] key."""
    from simulator.serving import presets as P

    src = P.resolve("published", "cookbook-glm52-h200-balanced").read_text()
    path = tmp_path / "v.toml"
    path.write_text(src.replace('model = "glm-5.2-fp8"', 'model = "/nonexistent/x.toml"'))
    assert main(["plan", "--validate", str(path), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"{path}: [scenario] model = '/nonexistent/x.toml': /nonexistent/x.toml: no such file" in err


def _paper_copy(tmp_path, after: str, line: str):
    """The shipped paper set with ``line`` inserted after the first line starting with ``after``."""
    src = load_published("paper-glm51-8xh200").where
    lines = open(src).read().splitlines()
    i = next(i for i, text in enumerate(lines) if text.startswith(after))
    path = tmp_path / "set.toml"
    path.write_text("\n".join(lines[: i + 1] + [line] + lines[i + 1:]) + "\n")
    return path


@pytest.mark.parametrize("after, line, names", [
    ("hisparse = ", "gpu = 5", ("[scenario] gpu = 5", "a non-empty string")),  # a TypeError traceback
    ("hisparse = ", "workload = \"\"", ("[scenario] workload = ''",)),
    ("uncertainty = ", "", ()),  # the copy itself loads (the control)
    ("label = \"4K input, baseline peak\"", "note2 = 1", ("point 1", "unknown key(s) note2")),
])
def test_a_set_files_scenario_values_are_type_checked(tmp_path, capsys, after, line, names):
    from tests.fuzzing import assert_clean_error, run_cli

    path = _paper_copy(tmp_path, after, line)
    if not names:
        assert load_published(str(path)).scenario["hisparse"] == "blog-8xh200"
        return
    out = tmp_path / "v"
    code, _, err = run_cli(["plan", "--validate", str(path), "--quiet", "--out", str(out)], capsys)
    assert_clean_error(code, err, str(path), *names)
    assert not out.exists()  # nothing written


@pytest.mark.parametrize("old, new, names", [
    ('uncertainty = "', "uncertainty = 42\nx_ = \"", ("uncertainty = 42", "must be a string")),
    ('label = "4K input, baseline peak"', "label = [1, 2]", ("point 1", "label = [1, 2]", "string")),
    ("concurrency = [16, 32, 64, 128, 256]", "concurrency = [8, 8]", ("point 1", "concurrency = [8, 8]", "8 given twice")),
    ("measured = 2288.0", "measured = 5e-324", ("point 1", "measured = 5e-324", "from 1e-06 to 1e+09")),
    ("measured = 2288.0", "measured = 1e300", ("point 1", "measured = 1e+300", "from 1e-06 to 1e+09")),
])
def test_a_set_files_silently_accepted_values_are_refused(tmp_path, capsys, old, new, names):
    """label = [1, 2], uncertainty = 42 and a repeated load ran; measured = 5e-324 printed an inf% error."""
    from simulator.serving.published import MEASURED_RANGE

    text = open(load_published("paper-glm51-8xh200").where).read()
    assert old in text
    path = tmp_path / "set.toml"
    path.write_text(text.replace(old, new, 1).replace("x_ = \"", "# \""))
    with pytest.raises(HisparseError) as err:
        load_published(str(path))
    message = str(err.value)
    assert message.startswith(str(path)) and "\n" not in message
    for name in names:
        assert name in message, (name, message)
    lo, hi = MEASURED_RANGE
    assert 0 < lo and hi < float("inf") and 2288.0 / lo < 1e300  # a sane error for any sane prediction


def test_no_measured_point_prints_na_and_why_not_nan(tmp_path, capsys):
    """It printed 'median |error| nan%, max |error| nan% over 0 of 0 measured points'."""
    point = ('[[point]]\nlabel = "{label}"\nsystem = "baseline"\nmetric = "max_running"\nconcurrency = 1\n'
             'input_tokens = {n}\noutput_tokens = 16\nrequests_per_client = 1\nmeasured = 100.0\n{kind}\n')
    estimates = tmp_path / "estimates.toml"
    estimates.write_text('name = "est"\nsource = "test"\n' + point.format(label="e", n=4096, kind='kind = "estimate"'))
    refused = tmp_path / "refused.toml"
    refused.write_text('name = "ref"\nsource = "test"\n' + point.format(label="r", n=900000, kind=""))
    for path, why in ((estimates, "no measured point, estimates only"),
                      (refused, "the model cannot run any of the 1 measured point(s)")):
        assert main(["plan", "--validate", str(path), "--quiet"]) == 0
        text = capsys.readouterr().out
        assert "nan" not in text and f"median |error| n/a, max |error| n/a: {why}" in text
        assert text.count(why) == 2  # the set's line and the all-sets line
        assert main(["plan", "--validate", str(path), "--quiet", "--json"]) == 0
        report = _strict_json(capsys.readouterr().out)
        for s in (report["all"], *report["sets"].values()):
            assert s["median_abs_error"] is None and s["max_abs_error"] is None and s["no_error_why"] == why
    rows = [{"error": 0.1, "kind": "measurement"}, {"error": float("nan"), "kind": "measurement"}]
    s = summary(rows)
    assert s["no_error_why"] is None and s["median_abs_error"] == pytest.approx(0.1)


def test_validate_refuses_no_search(capsys):
    """--no-search ran under --validate (a search option, which the help says it refuses)."""
    from tests.fuzzing import assert_clean_error, run_cli

    code, out, err = run_cli(["plan", "--validate", "paper-glm51-8xh200", "--no-search", "--quiet"], capsys)
    assert_clean_error(code, err, "--no-search", "does not apply")
    assert out == ""
