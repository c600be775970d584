"""Presets grounded in published DSA statistics: each preset, drawn again from its seed, meets
every target of its targets file, measured by the code `trace compare` uses; the targets fit
and the compare command do what they say."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from simulator.analysis.fit_targets import draw, fit_targets
from simulator.analysis.targets import Measure, load_targets, report
from simulator.cli import main
from simulator.trace import TraceMeta, open_trace, write_trace
from simulator.trace.generator import (
    GeneratorKnobs,
    generate,
    knobs_dict,
    knobs_to_toml,
    load_knobs,
)
from simulator.trace.stats import step_overlap

TRACES = Path(__file__).resolve().parents[1] / "traces"
# Reduced draws, to keep the test fast: glm51-longbench's 78 layers x 64 steps (48 past the
# warm-up) instead of the preset's 128; dsv32 at its own shape (61 layers x 48 steps).
TEST_STEPS = {"glm51-longbench": 64, "dsv32": None}


@pytest.mark.slow  # draws each preset's whole layer stack with the generator (minutes on 2 cores)
@pytest.mark.parametrize("preset", sorted(TEST_STEPS))
def test_preset_meets_every_published_target(preset):
    targets = load_targets(preset)
    rows = report(draw(load_knobs(preset), targets, TEST_STEPS[preset]), targets.targets)
    missed = [(r["name"], r["target"], r["measured"]) for r in rows if not r["met"]]
    assert not missed, missed
    assert {r["statistic"] for r in rows} >= {"first_step_miss"}
    assert all(r["source"] for r in rows)  # every target says where it was published


def test_bundled_glm51_trace_is_the_preset_and_meets_its_targets():
    """The plan's default trace: the preset's knobs and shape, and the published LRU curve."""
    trace = open_trace(TRACES / "glm51-longbench.hst")
    targets = load_targets("glm51-longbench")
    src = trace.meta.source
    assert src["preset"] == "glm51-longbench" and src["seed"] == targets.shape.seed
    assert json.loads(json.dumps(knobs_dict(load_knobs("glm51-longbench")))) == src["knobs"]
    assert len(trace) == targets.shape.layers and trace.meta.k == targets.shape.topk
    rows = report(Measure(iter(trace), trace.meta.k, targets.shape.warmup), targets.targets)
    assert all(r["met"] for r in rows), rows


def test_layer_profiles_follow_depth():
    kn = GeneratorKnobs(recall_prob=0.9, profile=(("retention", ((0.0, 0.0), (0.02, 0.0), (0.03, 0.8), (1.0, 0.4))),
                                                  ("local_window", ((0.0, 2.0), (1.0, 6.0)))))
    assert kn.at_layer(0, 11).retention == 0.0 and kn.at_layer(10, 11).retention == pytest.approx(0.4)
    assert kn.at_layer(5, 11).local_window == 4  # int knobs rounded
    assert kn.at_layer(5, 11) == kn.at_depth(0.5) and kn.at_depth(0.5).retention == pytest.approx(0.8 - 0.4 * 0.47 / 0.97)
    streams = list(generate(replace(kn, sinks=1, layer_corr=0.0, burst_prob=0.0), steps=40, layers=11,
                            requests=1, k=64, ctx0=3000, seed=2))
    ov = [step_overlap(s, 64)[5:].mean() for s in streams]
    assert ov[0] < 0.15 and ov[2] > 0.65 and ov[10] < ov[2] - 0.15


def test_profile_round_trips_and_bad_profiles_are_refused(tmp_path):
    kn = load_knobs("dsv32")
    path = tmp_path / "k.toml"
    path.write_text(knobs_to_toml(kn, comment="x"))
    assert load_knobs(str(path)) == kn
    path.write_text("[knobs.profile]\nretention = [[0.0, 1.5]]\n")
    with pytest.raises(Exception, match="retention"):
        load_knobs(str(path))
    path.write_text("[knobs.profile]\nretention = [[0.5, 0.1], [0.2, 0.3]]\n")
    with pytest.raises(Exception, match="ascending"):
        load_knobs(str(path))


TRUE = GeneratorKnobs(sinks=1, local_window=4, retention=0.55, burst_prob=0.0, run_mean=1.2, passage_len=64,
                      zipf_alpha=1.0, layer_corr=0.3, recall_prob=0.9, recall_gap=3.0, recall_spread=0.8,
                      pop_recent=True, above_fresh=True)
SHAPE = dict(steps=60, layers=3, requests=1, k=64, ctx0=3000, seed=4)


def _targets_file(tmp_path, fig: dict[str, float]) -> Path:
    text = f"""[shape]
model = "test"
layers = 3
topk = 64
ctx0 = 3000
steps = 60
seed = 4
warmup = 8

[[target]]
name = "overlap"
statistic = "step_overlap"
value = {fig['overlap']}
tolerance = 0.03
source = "a draw with known knobs"

[[target]]
name = "lru_2k"
statistic = "lru_miss"
buffer_ratio = 2.0
value = {fig['lru']}
tolerance = 0.10
relative = true
source = "a draw with known knobs"

[fit]
[fit.knobs]
{knobs_to_toml(replace(TRUE, retention=0.8, recall_gap=8.0)).split('[knobs]', 1)[1]}
[[fit.param]]
name = "retention"
knobs = ["retention"]
lo = 0.0
hi = 1.0

[[fit.param]]
name = "recall_gap"
knobs = ["recall_gap"]
lo = 2.0
hi = 16.0
"""
    path = tmp_path / "t.toml"
    path.write_text(text)
    return path


def test_fit_to_targets_recovers_known_statistics(tmp_path):
    """Targets measured on a draw with known knobs; the fit starts elsewhere and meets them."""
    m = Measure(generate(TRUE, **SHAPE), 64, warmup=8)
    fig = {"overlap": m.value("step_overlap"), "lru": m.value("lru_miss", None, 2.0)}
    targets = load_targets(str(_targets_file(tmp_path, fig)))
    start = report(draw(replace(TRUE, retention=0.8, recall_gap=8.0), targets), targets.targets)
    assert not all(r["met"] for r in start)  # the start misses: the fit has work to do
    fit = fit_targets(targets, iterations=6)
    assert all(r["met"] for r in fit.rows), fit.rows
    assert fit.knobs.retention == pytest.approx(TRUE.retention, abs=0.08)


def test_trace_fit_and_compare_commands(tmp_path, capsys):
    m = Measure(generate(TRUE, **SHAPE), 64, warmup=8)
    fig = {"overlap": m.value("step_overlap"), "lru": m.value("lru_miss", None, 2.0)}
    tfile = _targets_file(tmp_path, fig)
    out = tmp_path / "fitted.toml"
    assert main(["trace", "fit", "--targets", str(tfile), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "2/2 targets met" in text and out.exists()
    trace = tmp_path / "t.hst"
    write_trace(trace, TraceMeta(k=64, source={"kind": "test"}), generate(load_knobs(str(out)), **SHAPE))
    assert main(["trace", "compare", str(trace), "--targets", str(tfile), "--per-layer"]) == 0
    text = capsys.readouterr().out
    assert "2/2 met" in text and "layer" in text
    png = tmp_path / "c.png"
    assert main(["trace", "compare", str(trace), "--targets", str(tfile), "--json", "--plot", str(png)]) == 0
    data = json.loads(capsys.readouterr().out)
    rows = data["targets"]["t"]
    assert [r["name"] for r in rows] == ["overlap", "lru_2k"] and all(r["met"] for r in rows)
    assert set(data["per_layer"]["step_overlap"]) == {"0", "1", "2"}
    assert data["lru_curve"]["2.0"] == pytest.approx(rows[1]["measured"])
    assert png.stat().st_size > 1000
    # both shipped presets' targets by default: layers the trace lacks show as unmet
    assert main(["trace", "compare", str(trace)]) == 0
    text = capsys.readouterr().out
    assert "targets dsv32" in text and "targets glm51-longbench" in text


def test_bad_targets_files_name_the_file_and_target(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text('[shape]\nlayers = 2\n[[target]]\nname = "x"\nstatistic = "lru_miss"\nvalue = 0.1\ntolerance = 0.1\n')
    trace = tmp_path / "t.hst"
    write_trace(trace, TraceMeta(k=64, source={"kind": "test"}), generate(TRUE, **SHAPE))
    assert main(["trace", "compare", str(trace), "--targets", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "bad.toml" in err and "target 1 (x)" in err and "buffer_ratio" in err
    assert main(["trace", "fit", "--targets", str(tmp_path / "none.toml"), "--out", str(tmp_path / "o.toml")]) == 2
    assert "not found" in capsys.readouterr().err
    assert not (tmp_path / "o.toml").exists()
    # a misspelt [shap] failed later naming target 1's layers; a stray top-level key was ignored
    for text, stray in (('[shap]\nlayers = 2\n', "shap"), ('zzz = 1\n[shape]\nlayers = 2\n', "zzz")):
        bad.write_text(text + '[[target]]\nname = "x"\nstatistic = "step_overlap"\nvalue = 0.5\ntolerance = 0.1\n')
        assert main(["trace", "compare", str(trace), "--targets", str(bad)]) == 2
        err = capsys.readouterr().err
        assert f"bad.toml: unknown key(s) or table(s) {stray} (a targets file holds [shape], [[target]], [fit])" in err


def test_compare_refuses_what_it_cannot_measure(tmp_path, capsys):
    """An all-padding array printed overlap 0.0 as a met target, and a --warmup past the trace's
    end printed "steady state from step N" over figures measured from an earlier step."""
    import numpy as np

    pads = tmp_path / "pads.npy"
    np.save(pads, np.full((6, 4), -1, dtype=np.int32))
    assert main(["trace", "compare", str(pads)]) == 2
    err = capsys.readouterr().err
    assert "pads.npy" in err and "no accesses" in err and "Traceback" not in err
    trace = tmp_path / "t.hst"
    write_trace(trace, TraceMeta(k=64, source={"kind": "test"}), generate(TRUE, **SHAPE))
    steps = SHAPE["steps"]
    for warmup in (steps - 1, steps, 10**6):
        assert main(["trace", "compare", str(trace), "--warmup", str(warmup)]) == 2
        err = capsys.readouterr().err
        assert f"--warmup {warmup}" in err and f"{steps} steps" in err
    assert main(["trace", "compare", str(trace), "--warmup", str(steps - 2), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["warmup"] == steps - 2
    # a targets file's default warm-up longer than the trace: the figures' real warm-up is printed
    short = tmp_path / "short.hst"
    write_trace(short, TraceMeta(k=64, source={"kind": "test"}), generate(TRUE, **{**SHAPE, "steps": 5}))
    assert main(["trace", "compare", str(short), "--targets", "dsv32"]) == 0
    assert "steady state from step 3" in capsys.readouterr().out


_ONE_TARGET = ('[shape]\nlayers = 2\ntopk = 64\nctx0 = 2000\nsteps = 24\nwarmup = 4\n'
               '[[target]]\nname = "ov"\nstatistic = "step_overlap"\nvalue = 0.9\ntolerance = 0.05\n')
_FIT = '[fit]\nstart = "high-overlap"\n[[fit.param]]\nname = "r"\nknobs = ["retention"]\nlo = 0.1\nhi = 0.99\n'


@pytest.mark.parametrize("text,problem", [
    # wrong TOML types that were tracebacks (TypeError, ValueError, AttributeError, OverflowError)
    (_ONE_TARGET.replace("value = 0.9", 'value = "abc"'), "value must be a finite number"),
    (_ONE_TARGET.replace("tolerance = 0.05", 'tolerance = "x"'), "tolerance must be a finite number > 0"),
    (_ONE_TARGET + "layers = [\"a\", \"b\"]\n", "layers must be [first, last]"),
    (_ONE_TARGET.replace('"step_overlap"', '"lru_miss"') + 'buffer_ratio = "2"\n', "buffer_ratio must be a finite"),
    (_ONE_TARGET.replace('"step_overlap"', '"lru_miss"') + "buffer_ratio = 1e300\n", "buffer_ratio must be <="),
    ("shape = 5\n" + _ONE_TARGET.replace("[shape]\n", "[other]\n"), "shape must be a [shape] table"),
    ("target = 5\n", "target must be [[target]] tables"),
    ("target = [1, 2]\n", "target must be [[target]] tables"),
    # values that were accepted and silently wrong
    (_ONE_TARGET.replace("value = 0.9", "value = nan"), "value must be a finite number"),
    (_ONE_TARGET.replace("tolerance = 0.05", "tolerance = inf"), "tolerance must be a finite number > 0"),
    (_ONE_TARGET.replace("warmup = 4", "warmup = -5"), "[shape] warmup must be an integer >= 0"),
    (_ONE_TARGET.replace("layers = 2", "layers = 0"), "[shape] layers must be an integer >= 1"),
    (_ONE_TARGET.replace("steps = 24", "steps = 2.5"), "[shape] steps must be an integer >= 1"),
    (_ONE_TARGET + "relative = 1\n", "relative must be true or false"),
    # the [fit] table (trace fit --targets only)
    (_ONE_TARGET + '[fit]\nstart = "high-overlap"\nparam = 5\n', "param must be [[fit.param]] tables"),
    (_ONE_TARGET + '[fit]\nstart = "high-overlap"\nparam = [1]\n', "param must be [[fit.param]] tables"),
    (_ONE_TARGET + _FIT.replace('["retention"]', "[]"), "(at least one)"),
    (_ONE_TARGET + _FIT.replace('["retention"]', "[5]"), "(at least one)"),
    (_ONE_TARGET + _FIT.replace("hi = 0.99", "hi = inf"), "finite numbers lo and hi"),
    (_ONE_TARGET + _FIT.replace("hi = 0.99", "hi = 50.0"), "r: at 50 (hi) knob retention"),
    (_ONE_TARGET + _FIT.replace('["retention"]', '["pop_recent"]'), "knob 'pop_recent' is not a number"),
    (_ONE_TARGET + _FIT.replace('["retention"]', '["sink_probs"]'), "knob 'sink_probs' is not a number"),
    (_ONE_TARGET + _FIT + '[fit.initial]\nr = "x"\n', "[fit.initial] must map parameter names"),
    (_ONE_TARGET + _FIT + "[fit.initial]\nzz = 0.5\n", "[fit.initial] must map parameter names"),
    (_ONE_TARGET + _FIT.replace('start = "high-overlap"', 'start = "high-overlap"\nsteps = 0'),
     "[fit] steps must be an integer >= 1"),
    (_ONE_TARGET + _FIT.replace('start = "high-overlap"', 'start = "high-overlap"\nknobs = 5'),
     "[fit] knobs must be a [fit.knobs] table"),
    # a name given twice: the target weighed twice in the fit; the parameters' values collapsed into one
    (_ONE_TARGET + _ONE_TARGET.split("\n", 6)[6], "target 1 and 2 are both named 'ov'"),
    (_ONE_TARGET + _FIT + _FIT.split("\n", 2)[2], "name 'r' is given to an earlier [[fit.param]] too"),
])
def test_bad_targets_values_are_one_line_errors(tmp_path, capsys, text, problem):
    bad = tmp_path / "bad.toml"
    bad.write_text(text)
    before = bad.read_bytes()
    out = tmp_path / "o.toml"
    assert main(["trace", "fit", "--targets", str(bad), "--out", str(out), "--iterations", "1", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and str(bad) in err and problem in err, err
    assert not out.exists() and bad.read_bytes() == before
    if "[fit]" not in text:  # trace compare reads the same targets (not the [fit] table)
        trace = tmp_path / "t.hst"
        write_trace(trace, TraceMeta(k=64, source={"kind": "test"}), generate(TRUE, **SHAPE))
        assert main(["trace", "compare", str(trace), "--targets", str(bad)]) == 2
        assert problem in capsys.readouterr().err


def test_targets_given_as_a_folder_is_one_line(tmp_path, capsys):
    trace = tmp_path / "t.hst"
    write_trace(trace, TraceMeta(k=64, source={"kind": "test"}), generate(TRUE, **SHAPE))
    assert main(["trace", "compare", str(trace), "--targets", str(tmp_path)]) == 2
    assert "is a folder" in capsys.readouterr().err
    assert main(["trace", "fit", "--targets", str(tmp_path), "--out", str(tmp_path / "o.toml")]) == 2
    assert "is a folder" in capsys.readouterr().err


@pytest.mark.parametrize("mode,extra,named", [
    ("trace", ["--iterations", "3"], "--iterations"),
    ("targets", ["--compare"], "--compare"),
    ("targets", ["--seed", "4", "--layers", "3"], "--seed, --layers"),
    ("targets", ["--recover"], "--recover"),
    ("targets", ["--rounds", "5"], "--rounds"),
    ("targets", ["--ctx0", "64"], "--ctx0"),
])
def test_trace_fit_refuses_the_other_modes_options(tmp_path, capsys, mode, extra, named):
    """These were accepted and silently ignored (a --targets fit took its seed from [shape] and
    ran for minutes with --layers 3 having no effect)."""
    out = tmp_path / "o.toml"
    if mode == "trace":
        trace = tmp_path / "t.hst"
        write_trace(trace, TraceMeta(k=64, source={"kind": "test"}), generate(TRUE, **SHAPE))
        args = ["trace", "fit", str(trace)]
    else:
        args = ["trace", "fit", "--targets", "dsv32"]
    assert main([*args, *extra, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and named in err and "only to" in err, err
    assert not out.exists()


def test_trace_fit_never_writes_over_its_targets_file(tmp_path, capsys):
    """--out equal to --targets started the fit (minutes) and then replaced the targets file."""
    mine = tmp_path / "mine.toml"
    mine.write_text((TRACES / "targets" / "dsv32.toml").read_text())
    before = mine.read_bytes()
    assert main(["trace", "fit", "--targets", str(mine), "--out", str(mine)]) == 2
    assert "is an input of this command" in capsys.readouterr().err
    # a shipped name is the shipped file
    shipped = TRACES / "targets" / "dsv32.toml"
    shipped_before = shipped.read_bytes()
    assert main(["trace", "fit", "--targets", "dsv32", "--out", str(shipped)]) == 2
    assert "is an input of this command" in capsys.readouterr().err
    assert mine.read_bytes() == before and shipped.read_bytes() == shipped_before


def test_trace_fit_takes_ctx0_for_an_npy_array_as_the_other_trace_commands_do(tmp_path, capsys):
    """An array whose later steps select past step 0's largest index could be compared and replayed with
    --ctx0 but not fitted: trace fit had no --ctx0."""
    import numpy as np

    rows = np.array([[0, 1, 2, 3], [0, 1, 2, 9], [1, 2, 3, 10], [2, 3, 4, 11]] * 8)
    path = tmp_path / "a.npy"
    np.save(path, rows)
    out = tmp_path / "k.toml"
    assert main(["trace", "fit", str(path), "--out", str(out), "--quiet"]) == 2
    assert "index 9 out of range for ctx_len 5" in capsys.readouterr().err and not out.exists()
    assert main(["trace", "fit", str(path), "--ctx0", "64", "--out", str(out), "--quiet", "--rounds", "1",
                 "--iters", "1"]) == 0
    assert "[knobs]" in out.read_text()
