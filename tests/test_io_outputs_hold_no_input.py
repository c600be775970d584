"""Issue #28, classes 1 and 2: no output overwrites an input, and no option value becomes a path.

Class 1: a folder output declares the files it will hold (``Output.files``) and each is compared
with every input of the command, given or read (a preset name's file, the traces of a grid). The
properties put an input at each declared file, under several spellings, and check that the
command refuses in one line before any work with nothing changed, and that an input at any
other name in the folder is accepted.

Class 2: a value that names a file inside an output folder (``calibrate --gpu``) is a name
(``common.file_name``): no "/", "..", NUL, odd characters or excessive length.
"""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from simulator.cli import build_parser
from simulator.commands import common
from simulator.commands.common import check_io
from simulator.fileio import OutputError
from simulator.trace import TraceMeta, write_trace
from tests.fuzzing import assert_clean_error, fuzz_settings, run_cli
from tests.helpers import random_stream

PARSER = build_parser()
PRESETS = Path(common.__file__).resolve().parents[1] / "presets"


def _trace(path):
    write_trace(path, TraceMeta(k=16, source={"kind": "test"}),
                [random_stream(np.random.default_rng(0), steps=20, k=16, ctx0=40)])


def _snapshot(folder):
    return {p: (p.read_bytes() if p.is_file() else None) for p in sorted(folder.rglob("*"))}


# (argv with IN for the input and OUT for the folder, the files OUT declares). IN is put at
# OUT/<one of those files>; every one must be refused.
PLAN_FILES = ["plan.csv", "plan.json", "throughput.png"]
VALIDATE_FILES = ["validation.csv", "validation.json", "validation.png"]
CAL_FILES = ["h200.json", "comm-h200.png", "swap_in-h200.csv", "gemm-h200.csv", "comm-h200.csv"]
CASES = [
    *[(["plan", option, "IN", "--concurrency", "1", "--quiet", "--out", "OUT"], PLAN_FILES)
      for option in ("--model", "--gpu", "--deployment", "--workload", "--hisparse-config", "--calibration",
                     "--trace")],
    (["plan", "--validate", "IN", "--quiet", "--out", "OUT"], VALIDATE_FILES),
    (["plan", "--validate", "all", "--trace", "IN", "--quiet", "--out", "OUT"], VALIDATE_FILES),
    (["plan", "--validate", "all", "--calibration", "IN", "--quiet", "--out", "OUT"], VALIDATE_FILES),
    (["sweep", "IN", "--no-ray", "--quiet", "--out", "OUT"], ["results.parquet", "parts/p.parquet"]),
    (["calibrate", "--comm-refit", "IN", "--out", "OUT"], CAL_FILES),
]


def _place(tmp_path, out, name, spelling):
    """An input file at OUT/name, and how the command line spells its path."""
    target = out / name
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(b"kind = 1\n# an input the command must not overwrite\n")
    if spelling == "dotted":
        return str(out / "." / ".." / out.name / name)
    if spelling == "symlink":
        link = tmp_path / "link-to-input"
        os.symlink(target, link)
        return str(link)
    if spelling == "hardlink":
        link = tmp_path / "hardlink-to-input"
        os.link(target, link)
        return str(link)
    return str(target)


@pytest.mark.parametrize("template, files", CASES, ids=[" ".join(t[:2]) for t, _ in CASES])
def test_an_input_at_any_file_a_folder_output_holds_is_refused(tmp_path, capsys, template, files):
    @fuzz_settings(ci_examples=6)
    @given(name=st.sampled_from(files), spelling=st.sampled_from(["plain", "dotted", "symlink", "hardlink"]))
    def prop(name, spelling):
        case = tmp_path / f"case{len(list(tmp_path.iterdir()))}"
        out = case / "OUT"
        out.mkdir(parents=True)
        source = _place(case, out, name, spelling)
        argv = [source if a == "IN" else str(out) if a == "OUT" else a for a in template]
        before = _snapshot(case)
        code, _, err = run_cli(argv, capsys)
        assert_clean_error(code, err, "--out", "an input of this command")
        assert _snapshot(case) == before  # nothing written, the input unchanged

    prop()


def test_the_issue_examples(tmp_path, capsys):
    """`plan --model OUT/plan.json --out OUT` and a grid named OUT/results.parquet."""
    out = tmp_path / "OUT"
    out.mkdir()
    model = out / "plan.json"
    model.write_bytes((PRESETS / "models" / "glm-5.1-fp8.toml").read_bytes())
    before = model.read_bytes()
    code, _, err = run_cli(["plan", "--model", str(model), "--concurrency", "1", "--quiet", "--out", str(out)], capsys)
    assert_clean_error(code, err, "--out", str(model))
    assert model.read_bytes() == before
    grid = out / "results.parquet"
    grid.write_text('kind = "replay"\n[fixed]\ntrace = "t.hst"\n')
    code, _, err = run_cli(["sweep", str(grid), "--no-ray", "--quiet", "--out", str(out)], capsys)
    assert_clean_error(code, err, "--out", str(grid))
    assert grid.read_text().startswith('kind = "replay"')


@pytest.mark.parametrize("kind, key, names", [
    ("replay", "trace", ["results.parquet", "parts/x.parquet"]),
    ("plan", "trace", ["results.parquet", "parts/deep/x.hst"]),
    ("plan", "model", ["results.parquet"]),
    ("plan", "calibration", ["parts/cal.json"]),
])
def test_files_named_inside_a_grid_are_inputs_too(tmp_path, capsys, kind, key, names):
    for i, name in enumerate(names):
        out = tmp_path / f"OUT{i}"
        held = out / name
        held.parent.mkdir(parents=True)
        if key == "trace":
            _trace(held)
        else:
            held.write_text("x = 1\n")
        grid = tmp_path / f"grid{i}.toml"
        grid.write_text(f'kind = "{kind}"\n[fixed]\n{key} = "{held}"\n')
        before = _snapshot(tmp_path)
        code, _, err = run_cli(["sweep", str(grid), "--no-ray", "--quiet", "--out", str(out)], capsys)
        assert_clean_error(code, err, "--out", str(held))
        assert _snapshot(tmp_path) == before


# -- the check itself, both ways: refused exactly when an input is one of the declared files ----
# every plan mode declares every mode's files: a plan, a search or a validation removes the others'
PLAN_MODES_FILES = ["plan.csv", "plan.json", "throughput.png", "launch.sh", "hisparse-config.json", "search.csv",
                    "frontier.csv", "search.json", "frontier.png", *VALIDATE_FILES]
DECLARED = {
    "plan": (["plan", "--trace", "IN", "--out", "OUT"], PLAN_MODES_FILES),
    "validate": (["plan", "--validate", "all", "--trace", "IN", "--out", "OUT"], PLAN_MODES_FILES),
    "calibrate": (["calibrate", "--comm-refit", "IN", "--gpu", "b200", "--out", "OUT"],
                  ["b200.json", "comm-b200.csv", "attention-b200.csv", "fused_moe_tp-b200.csv", "comm-b200.png"]),
}
OTHER_NAMES = st.sampled_from(["notes.txt", "plan.csv.bak", "h200.json", "old-plan.json", "validation.csv",
                               "plan.csv", "b200.json", "results.parquet", "x-b200.csv"])


@pytest.mark.parametrize("command", list(DECLARED))
def test_check_io_refuses_exactly_the_declared_files(tmp_path, command):
    template, files = DECLARED[command]

    @fuzz_settings(ci_examples=25)
    @given(name=OTHER_NAMES)
    def prop(name):
        out = tmp_path / "OUT"
        out.mkdir(exist_ok=True)
        held = out / name
        held.write_text("input")
        try:
            args = PARSER.parse_args([str(held) if a == "IN" else str(out) if a == "OUT" else a for a in template])
            if name in files:
                with pytest.raises(OutputError, match="an input of this command"):
                    check_io(args)
            else:
                check_io(args)  # another name in the folder: nothing there is overwritten
        finally:
            held.unlink()

    prop()


# -- class 2: values that name files are names ----------------------------------------------------
def _is_safe_name(value: str) -> bool:
    """The rule, written out: portable characters, no leading dot or dash, no "..", bounded."""
    return bool(re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}", value)) and ".." not in value


@fuzz_settings(ci_examples=60)
@given(st.one_of(st.text(max_size=80), st.sampled_from(["../name", "..", ".", "a/b", "/etc/x", "x" * 65, "x" * 64,
                                                        "h200", "b200-sxm", "h200.v2", "-h", "a\0b", "~", "..h",
                                                        "h..", " h200", "ĥ200"])))
def test_file_name_values_are_names(value):
    try:
        got = common.file_name(value)
    except argparse.ArgumentTypeError as exc:
        assert "expected a name" in str(exc)
        assert not _is_safe_name(value)
        return
    assert got == value and _is_safe_name(value)
    assert "/" not in got and "\0" not in got and len(got) <= common.NAME_MAX_CHARS
    out = "/some/out"
    assert os.path.dirname(os.path.normpath(os.path.join(out, f"{got}.json"))) == out


@pytest.mark.parametrize("command", [
    ["calibrate", "--comm-refit", "IN", "--out", "OUT", "--gpu"],
    ["calibrate", "--refit", "--out", "OUT", "--gpu"],
    ["validate", "--repredict", "--out", "OUT", "--gpu"],
])
def test_gpu_values_that_are_paths_are_refused_before_any_work(tmp_path, capsys, command):
    """`calibrate --comm-refit --gpu ../name` wrote OUT/../name.json, outside --out."""
    (tmp_path / "in.csv").write_text("x\n")
    out = tmp_path / "OUT"

    @fuzz_settings(ci_examples=12)
    @given(st.sampled_from(["../name", "../../x", "sub/h200", "/tmp/h200", "..", "x" * 300, ""]))
    def prop(value):
        argv = [str(tmp_path / "in.csv") if a == "IN" else str(out) if a == "OUT" else a for a in command]
        before = _snapshot(tmp_path)
        code, _, err = run_cli([*argv, value], capsys)
        assert_clean_error(code, err, "--gpu", "expected a name")
        assert _snapshot(tmp_path) == before

    prop()


def test_record_checks_every_file_it_writes_against_its_inputs(tmp_path, capsys):
    """Several k: PATH-k{K}.hst, each with a .partial beside it; none may be the --text input."""
    for name in ("r-k4.hst", "r-k8.hst", "r-k4.hst.partial", "r-k4.hst.ckpt"):
        text = tmp_path / name
        text.write_text("words " * 40)
        code, _, err = run_cli(["trace", "record", "--model", "smollm2-135m", "--text", str(text),
                                "--prompt-tokens", "8", "--steps", "2", "--topk", "4,8",
                                "--out", str(tmp_path / "r.hst")], capsys)
        assert_clean_error(code, err, "--out", str(text), "is an input")
        assert text.read_text() == "words " * 40
        text.unlink()


def test_a_plan_into_a_search_or_validation_folder_leaves_only_its_own_files(tmp_path, capsys):
    """A plan, a search and a validation into one --out: each run leaves its own files and removes the other
    modes' (a plan run left search.json beside plan.json: two answers in one folder); a user's file stays."""
    from simulator.cli import main

    out = tmp_path / "o"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    (out / "search.json").write_text("{}")  # an earlier search's
    (out / "validation.csv").write_text("x")  # an earlier validation's
    assert main(["plan", "--concurrency", "1", "--no-search", "--quiet", "--out", str(out)]) == 0
    names = {p.name for p in out.iterdir()}
    assert {"plan.json", "plan.csv", "notes.txt"} <= names and not names & {"search.json", "validation.csv"}


def test_the_declared_plan_files_are_every_modes():
    from simulator.commands.plan import out_files

    assert sorted(out_files()) == sorted(PLAN_MODES_FILES)
