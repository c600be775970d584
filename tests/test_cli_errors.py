"""The classes of bad command-line input, several members each: refused in one line that names
the option, exit 2, before any work (nothing is read, replayed or written)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.fuzzing import assert_clean_error, run_cli


@pytest.fixture()
def no_work_after_open(monkeypatch):
    """Fail the test if a command replays (it may read the trace to check its options)."""
    import simulator.replay as replay_pkg

    def forbidden(*a, **k):
        raise AssertionError("a replay started before the arguments were checked")

    # the command imports it from the package (a lazy attribute): patch there, the real one kept
    monkeypatch.setattr(replay_pkg, "miss_ratio_curve", forbidden)


@pytest.fixture()
def no_work(monkeypatch):
    """Fail the test if a command opens a trace or replays (the check must come first)."""
    import simulator.replay.api as api
    import simulator.replay.mrc  # noqa: F401 - bound to the real replay before the patch
    import simulator.trace as trace_pkg

    def forbidden(*a, **k):
        raise AssertionError("work started before the arguments were checked")

    monkeypatch.setattr(trace_pkg, "open_trace", forbidden)
    monkeypatch.setattr(api, "replay", forbidden)


@pytest.mark.parametrize("command", ["replay", "mrc"])
@pytest.mark.parametrize("value, says", [
    ("", "comma-separated list"), (",", "comma-separated list"), ("lru,,fifo", "empty item"),
    ("lru,lru", "lru is given twice"), ("fifo,lru,fifo", "fifo is given twice"), (" lru , lru", "twice"),
    ("LRU", "unknown policy 'LRU'"), ("lru,bogus", "unknown policy 'bogus'"), ("lru;fifo", "unknown policy"),
])
def test_policy_lists(trace, no_work, capsys, command, value, says):
    code, _, err = run_cli([command, trace, f"--policy={value}", "--quiet"], capsys)
    assert_clean_error(code, err, "--policy", says)


@pytest.mark.parametrize("argv, option, says", [
    (["replay", "T", "--vs", "nope"], "--vs", "unknown policy 'nope'"),  # was blamed on --policy
    (["mrc", "T", "--vs", "LRU"], "--vs", "unknown policy 'LRU'"),
    (["replay", "T", "--window", "0"], "--window", "positive integer"),
    (["replay", "T", "--window", "99999999999999999999"], "--window", "at most 2**63 - 1"),  # OverflowError
    (["trace", "info", "T", "--local", str(2**63)], "--local", "at most 2**63 - 1"),  # OverflowError
    (["replay", "T", "--window", "-100"], "--window", "positive integer"),
    (["replay", "T", "--workers", "0"], "--workers", "positive integer"),
    (["replay", "T", "--workers", "two"], "--workers", "expected an integer"),
    (["replay", "T", "--buffer", "0"], "--buffer", "buffer size from 1"),
    (["replay", "T", "--buffer", "4096,-1"], "--buffer", "buffer size from 1"),
    (["replay", "T", "--buffer", str(2**31)], "--buffer", "2147483646"),
    (["replay", "T", "--buffer", "2048,2048"], "--buffer", "given twice"),
    (["replay", "T", "--buffer", "1e3"], "--buffer", "expected an integer"),
    (["replay", "T", "--seed", "-1"], "--seed", "seed from 0"),
    (["replay", "T", "--seed", str(2**64)], "--seed", "seed from 0"),
    (["replay", "T", "--ctx0", "0"], "--ctx0", "positive integer"),
    (["mrc", "T", "--step", "0"], "--step", "positive integer"),
    (["mrc", "T", "--step", "-8"], "--step", "positive integer"),
    (["mrc", "T", "--min-buffer", "0"], "--min-buffer", "buffer size"),
    (["mrc", "T", "--max-buffer", "-3"], "--max-buffer", "buffer size"),
    (["mrc", "T", "--min-buffer", "64", "--max-buffer", "32"], "--max-buffer", "below --min-buffer"),
    (["trace", "info", "T", "--sink", "-1"], "--sink", "non-negative"),
    (["trace", "info", "T", "--local", "-128"], "--local", "non-negative"),
    (["trace", "export", "T", "--format", "oracle-general", "--out", "o.bin", "--request", "-1"], "--request",
     "non-negative"),
    (["trace", "gen", "--out", "g.hst", "--steps", "0"], "--steps", "positive integer"),
    (["trace", "gen", "--out", "g.hst", "--layers", "-2"], "--layers", "positive integer"),
    (["trace", "gen", "--out", "g.hst", "--topk", "0"], "--topk", "positive integer"),
    (["trace", "gen", "--out", "g.hst", "--topk", "4096", "--ctx0", "1000"], "--topk", "larger than the context"),
    (["trace", "gen", "--out", "g.hst", "--knobs", "missing.toml"], "--knobs", "no such file"),
    (["trace", "fit", "T", "--out", "k.toml", "--rounds", "0"], "--rounds", "positive integer"),
    (["trace", "record", "--model", "m", "--text", "t", "--prompt-tokens", "0", "--steps", "1", "--topk", "4",
      "--out", "r.hst"], "--prompt-tokens", "positive integer"),
    (["trace", "record", "--model", "m", "--text", "t", "--prompt-tokens", "8", "--steps", "1", "--topk", "4,4",
      "--out", "r.hst"], "--topk", "given twice"),
    (["sweep", "g.toml", "--workers", "0"], "--workers", "positive integer"),
    (["calibrate", "--iters", "0"], "--iters", "positive integer"),
    (["calibrate", "--pool-gib", "0"], "--pool-gib", "positive number"),
    (["calibrate", "--pool-gib", "nan"], "--pool-gib", "finite"),
    (["validate", "--steps", "-1"], "--steps", "positive integer"),
    (["plan", "--sweep-host-ratio", "0"], "--sweep-host-ratio", "positive number"),
    (["plan", "--sweep-host-ratio", "2,-4"], "--sweep-host-ratio", "positive number"),
    (["plan", "--concurrency", "0,8"], "--concurrency", "positive integer"),
    (["plan", "--rate", "inf"], "--rate", "finite"),
    (["plan", "--slo-tpot-ms", "0"], "--slo-tpot-ms", "positive number"),
    (["plan", "--slo-tpot-ms", "-50"], "--slo-tpot-ms", "positive number"),
])
def test_values_out_of_their_domain(trace, no_work, tmp_path, monkeypatch, capsys, argv, option, says):
    monkeypatch.chdir(tmp_path)
    argv = [trace if a == "T" else a for a in argv]
    code, _, err = run_cli(argv, capsys)
    assert_clean_error(code, err, option, says)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.hst"]  # nothing written


def test_out_of_memory_is_one_line(trace, monkeypatch, capsys):
    import simulator.replay.api as api

    def too_big(*a, **k):
        raise MemoryError

    monkeypatch.setattr(api, "replay", too_big)
    code, _, err = run_cli(["replay", trace, "--quiet"], capsys)
    assert_clean_error(code, err, "out of memory", "hisparse replay")


@pytest.mark.parametrize("command, offline", [("calibrate", "--refit"), ("validate", "--repredict")])
def test_gpu_commands_without_cupy_say_what_to_install(tmp_path, monkeypatch, capsys, command, offline):
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy -> ImportError
    out = tmp_path / "cal"
    code, _, err = run_cli([command, "--out", str(out)], capsys)
    assert_clean_error(code, err, "CuPy", "pip install", offline)
    assert not out.exists()  # before any work


@pytest.mark.parametrize("argv, option, offline", [
    (["calibrate", "--refit", "--iters", "5"], "--iters", "--refit"),
    (["calibrate", "--refit", "--terms", "step"], "--terms", "--refit"),
    (["calibrate", "--refit", "--seed", "3", "--pool-gib", "2"], "--pool-gib", "--refit"),
    (["calibrate", "--comm-refit", "c.csv", "--iters", "5"], "--iters", "--comm-refit"),
    (["validate", "--repredict", "--steps", "5"], "--steps", "--repredict"),
    (["validate", "--repredict", "--seed", "2"], "--seed", "--repredict"),
])
def test_measuring_options_without_a_measurement_are_refused(tmp_path, capsys, argv, option, offline):
    """``calibrate --refit --iters 5`` / ``validate --repredict --steps 5`` ran as without the option (rc 0,
    the same files): it only sets how the GPU run measures. Refused before anything is read or written."""
    out = tmp_path / "cal"
    code, printed, err = run_cli([*argv, "--out", str(out)], capsys)
    assert_clean_error(code, err, option, offline, "not apply")
    assert printed == "" and not out.exists()


@pytest.mark.parametrize("content, says", [
    ("{", "not valid JSON"),
    ("[]", "expected a JSON object"),
    ("{}", "missing key 'gpu.link_bw'"),
    ('{"gpu": {"link_bw": 1}}', "missing key 'gpu.hbm_bw'"),
    (b"\xff\xfe\x00junk", "not a UTF-8 text"),
])
def test_malformed_calibration_json_for_refit(tmp_path, capsys, content, says):
    for name in ("swap_in-h200.csv", "attention-h200.csv"):
        shutil.copy(f"calibration/{name}", tmp_path / name)
    target = tmp_path / "h200.json"
    if content is not None:
        target.write_bytes(content if isinstance(content, bytes) else content.encode())
    before = None if content is None else target.read_bytes()
    code, _, err = run_cli(["calibrate", "--refit", "--out", str(tmp_path)], capsys)
    assert_clean_error(code, err, "h200.json", says)
    assert (target.read_bytes() if target.exists() else None) == before


def test_refit_without_a_previous_run_for_a_gpu_with_no_packaged_calibration(tmp_path, capsys):
    """--refit builds on --out's calibration file, else on the GPU's packaged one; with neither it
    says which file is missing."""
    for name in ("swap_in-h200.csv", "attention-h200.csv"):
        shutil.copy(f"calibration/{name}", tmp_path / name.replace("h200", "mygpu"))
    code, _, err = run_cli(["calibrate", "--refit", "--gpu", "mygpu", "--out", str(tmp_path)], capsys)
    assert_clean_error(code, err, "mygpu.json", "missing")
    assert not (tmp_path / "mygpu.json").exists()


@pytest.mark.parametrize("content, says", [
    ("{", "not a readable JSON file"),
    ('{"configs": [{"layers": 4}]}', "configs[0]: malformed"),
    ('{"other": 1}', "missing key 'configs'"),
])
def test_malformed_validation_json_for_repredict(tmp_path, capsys, content, says):
    shutil.copy("simulator/presets/calibration/h200.json", tmp_path / "h200.json")
    (tmp_path / "validation-h200.json").write_text(content)
    code, _, err = run_cli(["validate", "--repredict", "--out", str(tmp_path)], capsys)
    assert_clean_error(code, err, "validation-h200.json", says)
    assert (tmp_path / "validation-h200.json").read_text() == content
    assert json.loads((tmp_path / "h200.json").read_text())  # the calibration is untouched


def _stored_validation(edit):
    def make(tmp_path):
        d = json.loads(open("calibration/validation-h200.json").read())
        edit(d)
        return json.dumps(d)
    return make


def _set_measured(value):
    def edit(d):
        d["configs"][0]["measured_s"] = value
    return edit


# a stored run whose configurations are empty or whose measured times are not a list of numbers (each was a
# numpy traceback from the summary)
@pytest.mark.parametrize("make, says", [
    (_stored_validation(lambda d: d.update(configs=[])), "'configs' holds no configuration"),
    (_stored_validation(_set_measured([])), "configs[0].measured_s: 0 values, expected a list of"),
    (_stored_validation(_set_measured(5)), "configs[0].measured_s: int, expected a list of"),
    (_stored_validation(lambda d: d["configs"][1]["measured_s"].__setitem__(3, "x")),
     "configs[1].measured_s[3]: 'x' is not a positive number of seconds"),
    (_stored_validation(lambda d: d["configs"][0]["measured_s"].__setitem__(0, -1.0)),
     "configs[0].measured_s[0]: -1.0 is not a positive number"),
], ids=["empty", "no-times", "not-a-list", "text", "negative"])
def test_stored_validation_with_bad_measurements_for_repredict(tmp_path, capsys, make, says):
    shutil.copy("simulator/presets/calibration/h200.json", tmp_path / "h200.json")
    content = make(tmp_path)
    (tmp_path / "validation-h200.json").write_text(content)
    code, _, err = run_cli(["validate", "--repredict", "--loop", "kernels", "--out", str(tmp_path)], capsys)
    assert_clean_error(code, err, "validation-h200.json", says)
    assert (tmp_path / "validation-h200.json").read_text() == content


def test_repredict_of_both_loops_rewrites_neither_when_one_file_is_bad(tmp_path, capsys):
    """--loop both: the layer file is checked before the kernels report is rewritten (the kernels pair was
    replaced, then the layer file failed)."""
    for name in ("validation-h200.json", "validation-h200.png", "validation-layer-h200.json"):
        shutil.copy(f"calibration/{name}", tmp_path / name)
    shutil.copy("simulator/presets/calibration/h200.json", tmp_path / "h200.json")
    layer = json.loads((tmp_path / "validation-layer-h200.json").read_text())
    layer["configs"] = []
    (tmp_path / "validation-layer-h200.json").write_text(json.dumps(layer))
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    code, _, err = run_cli(["validate", "--repredict", "--loop", "both", "--out", str(tmp_path)], capsys)
    assert_clean_error(code, err, "validation-layer-h200.json", "holds no configuration")
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_every_option_has_a_help_text_that_gives_its_default():
    """`--help` explains every option and says its default."""
    import argparse

    from simulator.cli import build_parser

    def walk(parser, prefix=()):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from walk(sub, (*prefix, name))
            elif not isinstance(action, argparse._HelpAction | argparse._VersionAction):
                yield " ".join(prefix), action

    missing = []
    for command, action in walk(build_parser()):
        name = action.option_strings[0] if action.option_strings else action.dest
        if action.help == argparse.SUPPRESS:
            continue
        if not action.help:
            missing.append(f"{command} {name}: no help")
        elif action.option_strings and action.default not in (None, False, True, [], argparse.SUPPRESS) \
                and "default" not in action.help:
            missing.append(f"{command} {name}: help does not give the default {action.default!r}")
    assert missing == []


@pytest.mark.parametrize("buffer", [str(2**21), str(2**31 - 2), f"16,{2**30}"])
def test_a_buffer_past_the_largest_context_is_refused_before_the_engine_allocates_it(trace, capsys, buffer):
    code, _, err = run_cli(["replay", trace, "--buffer", buffer, "--quiet"], capsys)
    assert_clean_error(code, err, "--buffer", "largest context (59)")


def test_mrc_stops_at_the_largest_context_and_bounds_per_size_replays(trace, capsys):
    code, out, err = run_cli(["mrc", trace, "--max-buffer", str(2**31 - 2), "--quiet", "--json"], capsys)
    assert code == 0 and "the curve stops at 59" in err
    curve = json.loads(out)["curve"]
    assert max(r["buffer"] for r in curve) == 59



def test_mrc_refuses_more_per_size_replays_than_it_allows(tmp_path, no_work_after_open, capsys):
    path = tmp_path / "long.npy"
    np.save(path, np.arange(16, dtype=np.int32)[None, :].repeat(3, axis=0))
    code, _, err = run_cli(["mrc", str(path), "--ctx0", "30000", "--policy", "lru,opt", "--step", "1",
                            "--max-buffer", "29999", "--quiet"], capsys)
    assert_clean_error(code, err, "--step 1", "29984 sizes", "at most 10000")


def test_a_replay_larger_than_memory_is_refused_before_it_starts(tmp_path, monkeypatch, capsys):
    """A position near 2**31 in a .npy array makes a 2**31-token context: the engine's per-position
    memory is checked against what the machine has, from the index or the array, before any work."""
    from simulator import limits

    monkeypatch.setattr(limits, "available_memory", lambda: 10 * 2**20)  # 10 MiB
    path = tmp_path / "far.npy"
    np.save(path, np.array([[0, 1, 999_999]], dtype=np.int64))  # ctx 1,000,000: 40 MB per worker
    for command in (["replay", str(path), "--buffer", "3"], ["mrc", str(path)]):
        code, _, err = run_cli([*command, "--quiet"], capsys)
        assert_clean_error(code, err, str(path), "contexts up to 1000000 tokens", "GiB are available")
    monkeypatch.setattr(limits, "available_memory", lambda: 2**30)
    assert run_cli(["replay", str(path), "--buffer", "3", "--quiet"], capsys)[0] == 0


def test_trace_commands_over_a_context_larger_than_memory_are_refused_before_they_start(tmp_path, monkeypatch, capsys):
    """trace convert, compare and fit walk a whole context (about 17-19 B a token measured at 50M tokens): a
    position near 2**31, or a large --ctx0, is refused against the memory available before any work (it grew
    to 23.5 GB and hung), naming the file, the context and what is needed; no output is left."""
    from simulator import limits

    monkeypatch.setattr(limits, "available_memory", lambda: 10 * 2**20)  # 10 MiB
    path = tmp_path / "far.npy"
    np.save(path, np.array([[999_999, 1], [0, 2]], dtype=np.int64))  # ctx 1,000,001 at the last step: 20 MB
    out = tmp_path / "out.hst"
    for command in (["convert", str(path), "--out", str(out)], ["compare", str(path)],
                    ["fit", str(path), "--out", str(tmp_path / "knobs.toml")]):
        code, _, err = run_cli(["trace", *command], capsys)
        assert_clean_error(code, err, str(path), f"trace {command[0]} over contexts up to 1,000,001 tokens",
                           "GiB are available")
    assert not out.exists() and not (tmp_path / "knobs.toml").exists()
    small = tmp_path / "near.npy"
    np.save(small, np.array([[0, 1], [2, 3]], dtype=np.int64))
    code, _, err = run_cli(["trace", "convert", str(small), "--ctx0", "2000000", "--out", str(out)], capsys)
    assert_clean_error(code, err, "contexts up to 2,000,001 tokens", "--ctx0")
    monkeypatch.setattr(limits, "available_memory", lambda: 2**30)
    assert run_cli(["trace", "convert", str(path), "--out", str(out)], capsys)[0] == 0 and out.exists()


def test_version_2_index_knows_the_largest_context(trace, tmp_path):
    from simulator.trace import open_trace
    from tests.hst_v1 import to_version_1

    t = open_trace(trace)
    assert t.max_ctx == max(int(s.ctx_len.max()) for s in t) == 59
    to_version_1(trace, tmp_path / "v1.hst")
    old = open_trace(tmp_path / "v1.hst")
    assert old.max_ctx is None and old.read((0, 0)).steps == t.read((0, 0)).steps  # version 1: not stored


def test_plan_and_sweep_refuse_a_trace_with_nothing_to_replay(tmp_path, capsys):
    pad = tmp_path / "pad.npy"
    np.save(pad, np.full((4, 8), -1, np.int32))
    code, _, err = run_cli(["plan", "--trace", str(pad), "--concurrency", "1", "--quiet"], capsys)
    assert_clean_error(code, err, str(pad), "no accesses")
    for kind in ("replay", "plan"):
        grid = tmp_path / f"{kind}.toml"
        grid.write_text(f'kind = "{kind}"\n[fixed]\ntrace = "{pad}"\n')
        code, _, err = run_cli(["sweep", str(grid), "--no-ray", "--quiet", "--out", str(tmp_path / kind)], capsys)
        assert_clean_error(code, err, str(grid), "no accesses")
        assert not (tmp_path / kind).exists()


@pytest.fixture()
def no_plan_work(monkeypatch):
    """Fail the test if plan loads its scenario or replays (the option check must come first)."""
    import simulator.serving.planner as planner
    import simulator.serving.published as published

    def forbidden(*a, **k):
        raise AssertionError("plan started work before its options were checked")

    monkeypatch.setattr(planner, "run_plan_full", forbidden)
    monkeypatch.setattr(planner.PlanInputs, "scenario", forbidden)
    monkeypatch.setattr(published, "validate", forbidden)


def test_plan_refuses_concurrency_with_rate(no_plan_work, capsys):
    # the planner sweeps rates instead of concurrencies: --concurrency would be dropped
    code, _, err = run_cli(["plan", "--concurrency", "4", "--rate", "1", "--quiet"], capsys)
    assert_clean_error(code, err, "--concurrency", "--rate", "not both")


def test_plan_refuses_concurrency_with_an_open_loop_workload(capsys):
    code, _, err = run_cli(["plan", "--workload", "8k-in-1k-out-open", "--concurrency", "4", "--quiet"], capsys)
    assert_clean_error(code, err, "--concurrency", "open loop", "--rate")


@pytest.mark.parametrize("extra, names", [
    (["--concurrency", "4"], ["--concurrency"]),
    (["--sweep-buffer", "2048"], ["--sweep-buffer"]),
    (["--sweep-host-ratio", "4"], ["--sweep-host-ratio"]),
    (["--rate", "1"], ["--rate"]),
    (["--slo-tpot-ms", "50"], ["--slo-tpot-ms"]),
    (["--slo-ttft-s", "5"], ["--slo-ttft-s"]),
    (["--model", "glm-5.1-fp8"], ["--model"]),  # the default's value, given: still refused
    (["--gpu", "h200"], ["--gpu"]),
    (["--deployment", "8xh200-colocated-dp8", "--workload", "32k-in-8k-out"], ["--deployment", "--workload"]),
    (["--hisparse-config", "blog-8xh200"], ["--hisparse-config"]),
])
def test_plan_validate_refuses_options_it_ignores(no_plan_work, capsys, extra, names):
    code, _, err = run_cli(["plan", "--validate", "all", *extra, "--quiet"], capsys)
    assert_clean_error(code, err, "--validate", "not apply", *names)


def test_plan_validate_names_a_folder(tmp_path, capsys):
    code, _, err = run_cli(["plan", "--validate", str(tmp_path), "--quiet"], capsys)
    assert_clean_error(code, err, str(tmp_path), "is a folder")


@pytest.mark.parametrize("value", ["3", '"sinks"', "[1, 2]", "true"])
def test_a_knobs_value_that_is_not_a_table_is_one_line(tmp_path, capsys, value):
    """``knobs = 3`` (not a ``[knobs]`` table) reached ``dict(3)``: a TypeError traceback."""
    knobs = tmp_path / "k.toml"
    knobs.write_text(f"knobs = {value}\n")
    code, _, err = run_cli(["trace", "gen", "--knobs", str(knobs), "--out", str(tmp_path / "g.hst")], capsys)
    assert_clean_error(code, err, str(knobs), "knobs must be a table")
    assert not (tmp_path / "g.hst").exists()


def test_a_published_point_too_large_to_simulate_is_refused_before_any_runs(tmp_path, monkeypatch, capsys):
    """``plan --validate FILE`` with ``concurrency = 100000000000`` simulated for hours: the set's
    points are held to HISPARSE_MAX_SIM_STEPS before the first one runs, as a plan's are."""
    import simulator.serving.published as published

    def forbidden(*a, **k):
        raise AssertionError("a published point was simulated before the work budget was checked")

    monkeypatch.setattr(published, "simulate", forbidden)
    text = (published.PUBLISHED_DIR / "issue-30985-baseline.toml").read_text()
    head, _, rest = text.partition("[[point]]")
    point = "[[point]]" + rest.split("[[point]]")[0]
    path = tmp_path / "set.toml"
    path.write_text(head + point + point.replace("concurrency = 8\n", "concurrency = 100000000000\n")
                    .replace('label = "concurrency 8', 'label = "huge'))
    code, _, err = run_cli(["plan", "--validate", str(path), "--quiet"], capsys)
    assert_clean_error(code, err, str(path), "'huge (80 prompts)'", "concurrency 100000000000",
                       "HISPARSE_MAX_SIM_STEPS")


@pytest.mark.parametrize("command", [["plan", "--concurrency", "1"], ["plan", "--validate", "all"],
                                     ["sweep", "GRID", "--no-ray"]])
def test_two_outputs_at_one_path_are_refused_before_any_work(tmp_path, trace, no_plan_work, capsys, command):
    """``plan --out D --report D`` wrote D's files, then failed on the page ('is a folder'): half
    the output written and exit 2. The outputs of one command are checked against each other."""
    grid = tmp_path / "g.toml"
    grid.write_text(f'kind = "replay"\n[fixed]\ntrace = "{trace}"\n[grid]\nbuffer = [16, 20]\n')
    same = tmp_path / "o.html"
    argv = [str(grid) if a == "GRID" else a for a in command]
    code, _, err = run_cli([*argv, "--quiet", "--out", str(same), "--report", str(same)], capsys)
    assert_clean_error(code, err, f"--report {same}", "also --out's folder")
    assert not same.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["g.toml", "t.hst"]


def test_a_generated_context_past_int32_or_memory_is_refused_before_any_draw(tmp_path, monkeypatch, capsys):
    """``trace gen --ctx0 2147483647`` grew to tens of GB and was killed by the kernel (a temp file
    left); its per-position arrays are held to int32 positions and to the memory available."""
    import simulator.limits as limits

    out = tmp_path / "g.hst"
    shape = ["--topk", "8", "--steps", "2", "--layers", "1", "--requests", "1", "--quiet", "--out", str(out)]
    code, _, err = run_cli(["trace", "gen", "--ctx0", str(2**31), *shape], capsys)
    assert_clean_error(code, err, "--ctx0 2147483648", "past 2147483647")
    monkeypatch.setattr(limits, "available_memory", lambda: 10 * 2**20)  # 10 MiB
    code, _, err = run_cli(["trace", "gen", "--ctx0", str(10**6), *shape], capsys)
    assert_clean_error(code, err, "--ctx0 1000000", "GiB are available")
    assert list(tmp_path.iterdir()) == []
    targets = tmp_path / "t.toml"  # trace fit --targets draws its [shape] through the same check
    targets.write_text((Path("traces/targets/dsv32.toml")).read_text().replace("ctx0 = 68665", "ctx0 = 1000000"))
    code, _, err = run_cli(["trace", "fit", "--targets", str(targets), "--quiet", "--out", str(tmp_path / "k.toml")],
                           capsys)
    assert_clean_error(code, err, f"{targets}: [shape] ctx0 1000000", "GiB are available")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.toml"]


@pytest.mark.parametrize("extra", [["--address", "127.0.0.1:6379"], ["--workers", "3"]])
def test_ray_options_with_no_ray_are_refused(tmp_path, trace, capsys, extra):
    """``sweep --no-ray --address HOST:PORT`` ran the points in this process, the cluster ignored."""
    grid = tmp_path / "g.toml"
    grid.write_text(f'kind = "replay"\n[fixed]\ntrace = "{trace}"\n[grid]\nbuffer = [16, 20]\n')
    code, _, err = run_cli(["sweep", str(grid), "--no-ray", *extra, "--quiet", "--out", str(tmp_path / "s")], capsys)
    assert_clean_error(code, err, extra[0], "not with --no-ray")
    assert not (tmp_path / "s").exists()


def test_workers_with_address_is_refused(tmp_path, trace, capsys):
    """``sweep --address HOST:PORT --workers 3``: --workers sizes only a local instance, and was ignored (the
    cluster's CPUs ran the points); refused before Ray is asked, nothing written."""
    grid = tmp_path / "g.toml"
    grid.write_text(f'kind = "replay"\n[fixed]\ntrace = "{trace}"\n[grid]\nbuffer = [16, 20]\n')
    code, _, err = run_cli(["sweep", str(grid), "--address", "127.0.0.1:1", "--workers", "3", "--quiet",
                            "--out", str(tmp_path / "s")], capsys)
    assert_clean_error(code, err, "--workers", "not with --address")
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("damage", [b"junk", b""])
def test_resume_over_an_unreadable_part_runs_its_point_again(tmp_path, trace, capsys, damage):
    """``sweep --resume`` over a truncated or emptied part was a pyarrow traceback."""
    import pandas as pd

    grid = tmp_path / "g.toml"
    grid.write_text(f'kind = "replay"\n[fixed]\ntrace = "{trace}"\n[grid]\nbuffer = [16, 20]\n')
    out = tmp_path / "s"
    argv = ["sweep", str(grid), "--no-ray", "--quiet", "--out", str(out)]
    assert run_cli(argv, capsys)[0] == 0
    before = pd.read_parquet(out / "results.parquet")
    part = sorted((out / "parts").iterdir())[0]
    part.write_bytes(damage)
    with pytest.warns(UserWarning, match="not a readable sweep part"):
        code, _, err = run_cli([*argv, "--resume"], capsys)
    assert code == 0 and "Traceback" not in err
    after = pd.read_parquet(out / "results.parquet")
    pd.testing.assert_frame_equal(after.drop(columns="seconds"), before.drop(columns="seconds"))  # timing differs


@pytest.mark.parametrize("argv, message", [
    (["plan", "--model", ""], "--model: an empty value (give one, or leave the option out)"),  # was ': not a file'
    # a required option cannot be left out (the hint said to)
    (["trace", "export", "T.hst", "--format", "oracle-general", "--out", ""], "--out: an empty value (give one)"),
    (["plan", "--gpu", ""], "--gpu: an empty value"),  # was read as not given
    (["plan", "--validate", ""], "--validate: an empty value"),  # ran a plan instead of a validation
    (["plan", "--calibration=", "--quiet"], "--calibration: an empty value"),
    (["replay", ""], "argument 2 of the command line is empty"),  # was '.: is a folder'
    (["trace", "info", ""], "argument 3 of the command line is empty"),
])
def test_an_empty_argument_is_named_not_read_as_a_folder_or_as_absent(argv, message, capsys):
    code, _, err = run_cli(argv, capsys)
    assert_clean_error(code, err, message)


@pytest.mark.parametrize("argv, prog, extra", [
    (["plan", "--bogus"], "hisparse plan", "--bogus"),
    (["plan", "extra"], "hisparse plan", "extra"),
    (["replay", "t.npy", "--zzz", "1"], "hisparse replay", "--zzz 1"),
    (["trace", "info", "a.hst", "b.hst"], "hisparse trace info", "b.hst"),
])
def test_an_unknown_argument_points_to_the_commands_own_help(no_work, capsys, argv, prog, extra):
    # argparse reports it from the top-level parser, whose help does not list the command's options
    code, out, err = run_cli(argv, capsys)
    assert_clean_error(code, err, f"{prog}: error: unrecognized arguments: {extra}", f"(see {prog} --help)")
    assert out == ""


def test_mrc_names_the_default_maximum_when_it_is_below_min_buffer(trace, capsys):
    """No --max-buffer given: the message says the default (4k) is what is below, and what to pass."""
    code, _, err = run_cli(["mrc", trace, "--min-buffer", "1000", "--quiet"], capsys)
    assert_clean_error(code, err, "default largest size (4k = 64)", "--min-buffer 1000", "pass --max-buffer")


@pytest.mark.parametrize("name", ["T5.NPY", "t5.Npy"])
def test_a_npy_suffix_in_any_case_is_read_as_an_array(tmp_path, capsys, name):
    path = tmp_path / name
    np.save(tmp_path / "t5.npy", np.array([[0, 1, 2], [0, 1, 3], [0, 1, 2]]))
    (tmp_path / "t5.npy").rename(path)
    code, out, err = run_cli(["replay", str(path), "--ctx0", "10", "--buffer", "3", "--json", "--quiet"], capsys)
    assert code == 0, err
    assert json.loads(out)[0]["misses"] == 2


def test_a_npy_array_under_another_name_is_called_one(tmp_path, capsys):
    path = tmp_path / "t5.dat"
    with open(path, "wb") as fh:
        np.save(fh, np.array([[0, 1, 2]]))
    code, _, err = run_cli(["replay", str(path), "--buffer", "3", "--quiet"], capsys)
    assert_clean_error(code, err, str(path), "a .npy array, not a hisparse trace", "name it .npy")


def test_an_npy_index_past_the_inferred_context_says_where_ctx_len_came_from(tmp_path, capsys):
    path = tmp_path / "s0.npy"
    np.save(path, np.array([[0, 1], [4, 2]]))
    code, _, err = run_cli(["replay", str(path), "--buffer", "3", "--quiet"], capsys)
    assert_clean_error(code, err, str(path), "step 1", "index 4 out of range for ctx_len 3",
                       "inferred from step 0: its largest index + 1 = 2", "--ctx0 sets it")
    code, _, err = run_cli(["replay", str(path), "--ctx0", "3", "--buffer", "3", "--quiet"], capsys)
    assert_clean_error(code, err, "index 4 out of range for ctx_len 4")
    assert "inferred" not in err  # --ctx0 given: nothing was inferred


def test_an_empty_preset_name_in_a_grid_says_so(tmp_path, capsys):
    # Path("") is the working folder: the message was "model = '': : not a file"
    grid = tmp_path / "g.toml"
    grid.write_text('kind = "plan"\n[fixed]\nmodel = ""\n[grid]\nconcurrency = [1, 2]\n')
    code, _, err = run_cli(["sweep", str(grid), "--no-ray", "--out", str(tmp_path / "o")], capsys)
    assert_clean_error(code, err, "g.toml", "empty model: give a preset name")
    assert not (tmp_path / "o").exists()
