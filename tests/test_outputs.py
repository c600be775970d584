"""Every command that writes checks its outputs before any work, through one mechanism
(``simulator.fileio.check_output``): an unwritable place, a folder where a file goes, a file
where a folder goes, or an output that is one of the inputs all end in one line and exit 2,
with nothing written and no input changed."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.trace import TraceMeta, write_trace
from tests.fuzzing import assert_clean_error, run_cli
from tests.helpers import random_stream


@pytest.fixture()
def inputs(tmp_path):
    trace = tmp_path / "in.hst"
    write_trace(trace, TraceMeta(k=16, source={"kind": "test"}),
                [random_stream(np.random.default_rng(0), steps=20, k=16, ctx0=40)])
    grid = tmp_path / "grid.toml"
    grid.write_text(f'kind = "replay"\n[fixed]\ntrace = "{trace}"\nbuffer = 16\n')
    text = tmp_path / "text.hst"  # a text input whose name a careless --out could repeat
    text.write_text("some words " * 50)
    return {"trace": str(trace), "grid": str(grid), "text": str(text)}


# (command line with OUT for the output, the output's kind, its file name)
FILE_WRITERS = [
    (["replay", "{trace}", "--buffer", "16", "--quiet", "--out", "OUT"], "r.csv"),
    (["replay", "{trace}", "--buffer", "16", "--quiet", "--plot", "OUT"], "r.png"),
    (["mrc", "{trace}", "--quiet", "--out", "OUT"], "m.parquet"),
    (["mrc", "{trace}", "--quiet", "--plot", "OUT"], "m.png"),
    (["trace", "gen", "--steps", "4", "--topk", "8", "--ctx0", "64", "--quiet", "--out", "OUT"], "g.hst"),
    (["trace", "convert", "{trace}", "--out", "OUT"], "c.hst"),
    (["trace", "export", "{trace}", "--format", "oracle-general", "--out", "OUT"], "e.bin"),
    (["trace", "fit", "{trace}", "--quiet", "--out", "OUT"], "k.toml"),
    (["trace", "record", "--model", "smollm2-135m", "--text", "{text}", "--prompt-tokens", "8", "--steps", "2",
      "--topk", "4", "--out", "OUT"], "x.hst"),
    (["plan", "--concurrency", "1", "--quiet", "--report", "OUT"], "p.html"),
    (["presets", "new", "gpu", "--from", "h200", "--out", "OUT"], "g.toml"),
]
DIR_WRITERS = [
    ["sweep", "{grid}", "--no-ray", "--quiet", "--out", "OUT"],
    ["calibrate", "--refit", "--out", "OUT"],
    ["validate", "--repredict", "--out", "OUT"],
    ["plan", "--concurrency", "1", "--quiet", "--out", "OUT"],
]


def _argv(template, inputs, out):
    return [out if a == "OUT" else a.format(**inputs) for a in template]


def _option(template):
    return template[template.index("OUT") - 1]


def _snapshot(folder):
    return {p: (p.read_bytes() if p.is_file() else None) for p in sorted(folder.rglob("*"))}


def _refused(argv, option, path, folder, capsys):
    before = _snapshot(folder)
    code, _, err = run_cli(argv, capsys)
    assert_clean_error(code, err, option, str(path))
    assert _snapshot(folder) == before  # nothing written, no input changed
    return err


@pytest.mark.parametrize("template, name", FILE_WRITERS, ids=[" ".join(t[:2]) + " " + _option(t) for t, _ in FILE_WRITERS])
@pytest.mark.parametrize("where", ["unwritable", "under a file", "is a folder"])
def test_file_output_that_cannot_be_written(tmp_path, inputs, capsys, template, name, where):
    if where == "unwritable":
        out = f"/proc/hisparse-test/{name}"
    elif where == "under a file":
        out = f"{inputs['grid']}/{name}"
    else:
        out = str(tmp_path / name)
        (tmp_path / name).mkdir()
    _refused(_argv(template, inputs, out), _option(template), out, tmp_path, capsys)


@pytest.mark.parametrize("template", DIR_WRITERS, ids=[t[0] for t in DIR_WRITERS])
@pytest.mark.parametrize("where", ["unwritable", "under a file", "is a file"])
def test_folder_output_that_cannot_be_written(tmp_path, inputs, capsys, template, where):
    out = {"unwritable": "/proc/hisparse-test", "under a file": f"{inputs['grid']}/sub",
           "is a file": inputs["grid"]}[where]
    _refused(_argv(template, inputs, out), "--out", out, tmp_path, capsys)


@pytest.mark.parametrize("template, key", [
    (["trace", "convert", "{trace}", "--out", "OUT"], "trace"),
    (["trace", "export", "{trace}", "--format", "oracle-general", "--out", "OUT"], "trace"),
    (["trace", "record", "--model", "smollm2-135m", "--text", "{text}", "--prompt-tokens", "8", "--steps", "2",
      "--topk", "4", "--out", "OUT"], "text"),
], ids=["convert", "export", "record"])
@pytest.mark.parametrize("spelling", ["same", "relative", "dotted", "symlink"])
def test_output_equal_to_an_input_is_refused(tmp_path, inputs, capsys, monkeypatch, template, key, spelling):
    import os

    path = inputs[key]
    if spelling == "relative":
        monkeypatch.chdir(tmp_path)
        out = os.path.basename(path)
    elif spelling == "dotted":
        out = str(tmp_path / "." / ".." / tmp_path.name / os.path.basename(path))
    elif spelling == "symlink":
        out = str(tmp_path / "link.hst")
        os.symlink(path, out)
    else:
        out = path
    assert "is an input" in _refused(_argv(template, inputs, out), "--out", out, tmp_path, capsys)


@pytest.mark.parametrize("template, bad", [
    (["replay", "{trace}", "--out", "OUT"], "r.txt"),
    (["replay", "{trace}", "--plot", "OUT"], "r.jpg"),
    (["trace", "convert", "{trace}", "--out", "OUT"], "c.npy"),
    (["trace", "gen", "--out", "OUT"], "g"),
    (["trace", "fit", "{trace}", "--out", "OUT"], "k.json"),
])
def test_output_suffix_checked_before_work(tmp_path, inputs, capsys, template, bad):
    out = str(tmp_path / bad)
    _refused(_argv(template, inputs, out), _option(template), out, tmp_path, capsys)


def test_write_failures_and_devices(inputs, capsys):
    """A device is written in place, never replaced by a rename; a write that fails (disk full)
    is one line naming the file."""
    import os
    import stat

    argv = ["trace", "export", inputs["trace"], "--format", "oracle-general", "--out"]
    code, _, err = run_cli([*argv, "/dev/full"], capsys)
    assert_clean_error(code, err, "/dev/full", "No space left on device")
    assert run_cli([*argv, "/dev/null"], capsys)[0] == 0
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode) and stat.S_ISCHR(os.stat("/dev/full").st_mode)
