"""Issue #28, class 8: OS errors as one line naming the file, never a traceback.

Disk full (ENOSPC, simulated by a file object that fails after N bytes, at a write or at the
final flush) in every writer; names too long for the file system (ENAMETOOLONG) as outputs and
inputs; ``/proc/self/mem`` (a regular file whose read fails with EIO) as any input; bytes that are
not UTF-8 in every text input; a missing optional extra naming the pip command.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from simulator import fileio
from simulator.trace import TraceMeta, write_trace
from simulator.trace import format as hst_format
from tests.fuzzing import assert_clean_error, fuzz_settings, run_cli
from tests.helpers import random_stream
from tests.test_outputs import DIR_WRITERS, FILE_WRITERS

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("os") / "t.hst"
    write_trace(path, TraceMeta(k=16, source={"kind": "test"}),
                [random_stream(np.random.default_rng(0), steps=40, k=16, ctx0=40, layer=j) for j in range(2)])
    return str(path)


class FullDisk:
    """A binary file that takes ``room`` bytes, then fails with ENOSPC (at ``write`` or, as a
    buffered file does, at ``flush``/``close``)."""

    def __init__(self, handle, room: int, at: str) -> None:
        self._handle, self._room, self._at, self._taken = handle, room, at, 0

    def _full(self) -> OSError:
        return OSError(errno.ENOSPC, "No space left on device")

    def write(self, data) -> int:
        self._taken += len(data)
        if self._at == "write" and self._taken > self._room:
            raise self._full()
        return self._handle.write(data)

    def flush(self) -> None:
        if self._at == "flush" and self._taken > self._room:
            raise self._full()
        self._handle.flush()

    def close(self) -> None:
        try:
            self.flush()
        finally:
            self._handle.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __getattr__(self, name):
        return getattr(self._handle, name)


def _fill_disk(monkeypatch, room: int, at: str) -> None:
    real = fileio.temp_beside

    def full_temp(path):
        handle, tmp = real(path)
        return FullDisk(handle, room, at), tmp

    monkeypatch.setattr(fileio, "temp_beside", full_temp)
    monkeypatch.setattr(hst_format, "temp_beside", full_temp)


WRITERS = [
    ["trace", "gen", "--steps", "20", "--topk", "8", "--ctx0", "64", "--layers", "2", "--requests", "1", "--quiet",
     "--out", "OUT.hst"],
    ["trace", "convert", "T", "--out", "OUT.hst"],
    ["trace", "convert", "T", "--compression", "stored", "--out", "OUT.hst"],
    ["trace", "export", "T", "--format", "oracle-general", "--out", "OUT.bin"],
    ["replay", "T", "--buffer", "16", "--quiet", "--out", "OUT.csv"],
    ["mrc", "T", "--quiet", "--max-buffer", "24", "--out", "OUT.parquet"],
]


@pytest.mark.parametrize("template", WRITERS, ids=[" ".join(t[:2]) + " " + t[-1] for t in WRITERS])
def test_disk_full_is_one_line_and_leaves_nothing(tmp_path, trace, capsys, monkeypatch, template):
    @fuzz_settings(ci_examples=8)
    @given(room=st.one_of(st.integers(0, 64), st.integers(64, 4000)), at=st.sampled_from(["write", "flush"]))
    def prop(room, at):
        folder = tmp_path / f"r{room}-{at}"
        folder.mkdir(exist_ok=True)
        out = folder / template[-1]
        argv = [trace if a == "T" else str(out) if a == template[-1] else a for a in template]
        with monkeypatch.context() as m:
            _fill_disk(m, room, at)
            code, _, err = run_cli(argv, capsys)
        if code == 0:  # everything fitted in the room left
            assert out.exists()
            return
        assert_clean_error(code, err, str(out), "No space left on device")
        assert list(folder.iterdir()) == []  # no output, no temp file

    prop()


def test_disk_full_on_a_device_is_one_line(trace, capsys):
    code, _, err = run_cli(["trace", "export", trace, "--format", "oracle-general", "--out", "/dev/full"], capsys)
    assert_clean_error(code, err, "/dev/full", "No space left on device")


def test_an_hst_written_through_a_link_to_a_full_device_is_one_line(tmp_path, trace, capsys):
    """trace convert / record onto a symlink to /dev/full replaced the link with a regular file and reported
    success (the .hst writer renamed its temp file over it); it writes in place, as every other writer does."""
    link = tmp_path / "full.hst"
    link.symlink_to("/dev/full")
    code, _, err = run_cli(["trace", "convert", trace, "--out", str(link)], capsys)
    assert_clean_error(code, err, str(link), "No space left on device")
    assert link.is_symlink() and os.readlink(link) == "/dev/full"


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs Linux's /dev/full")
@pytest.mark.parametrize("argv", [["trace", "info", "TRACE"], ["trace", "info", "TRACE", "--json"], ["--help"],
                                  ["--version"], ["sweep", "--help"], ["trace", "gen", "--help"]])
def test_standard_output_on_a_full_disk_is_named(trace, argv):
    """``hisparse ... > /dev/full``: one line naming standard output, status 2, no traceback (the message said
    only "No space left on device"); the help and version text too (argparse swallowed that write error: exit 0)."""
    argv = [trace if a == "TRACE" else a for a in argv]
    with open("/dev/full", "w") as full:
        run = subprocess.run([sys.executable, "-m", "simulator.cli", *argv], stdout=full, stderr=subprocess.PIPE,
                             text=True, cwd=ROOT)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert run.stderr.strip() == "hisparse: error: standard output: No space left on device"


# -- names too long ----------------------------------------------------------------------------
@pytest.mark.parametrize("template, name", FILE_WRITERS, ids=[" ".join(t[:2]) for t, _ in FILE_WRITERS])
def test_an_output_name_too_long_is_one_line(tmp_path, trace, capsys, template, name):
    text = tmp_path / "text.txt"
    text.write_text("words " * 20)

    @fuzz_settings(ci_examples=3)
    @given(st.integers(256, 400), st.booleans())
    def prop(length, in_folder):
        long = "a" * (length - len(name)) + name
        out = str(tmp_path / long / name) if in_folder else str(tmp_path / long)
        argv = [out if a == "OUT" else a.format(trace=trace, text=text) for a in template]
        code, _, err = run_cli(argv, capsys)
        assert_clean_error(code, err, template[template.index("OUT") - 1], "File name too long")

    prop()


@pytest.mark.parametrize("template", DIR_WRITERS, ids=[t[0] for t in DIR_WRITERS])
def test_a_folder_name_too_long_is_one_line(tmp_path, trace, capsys, template):
    grid = tmp_path / "grid.toml"
    grid.write_text(f'kind = "replay"\n[fixed]\ntrace = "{trace}"\n')
    out = str(tmp_path / ("d" * 300))
    code, _, err = run_cli([out if a == "OUT" else a.format(grid=grid) for a in template], capsys)
    assert_clean_error(code, err, "--out", "File name too long")


@pytest.mark.parametrize("argv", [["trace", "info"], ["replay"], ["trace", "gen", "--out", "g.hst", "--knobs"],
                                  ["plan", "--model"], ["sweep"], ["plan", "--trace"]])
def test_an_input_name_too_long_is_one_line(tmp_path, capsys, monkeypatch, argv):
    monkeypatch.chdir(tmp_path)
    long = "b" * 300 + ".toml"
    code, _, err = run_cli([*argv, long], capsys)
    assert_clean_error(code, err, long[:40])


# -- /proc/self/mem: a regular file whose reads fail ------------------------------------------------
MEM_INPUTS = [
    ["trace", "info", "X"], ["replay", "X", "--quiet"], ["trace", "convert", "X", "--out", "D/c.hst"],
    ["trace", "gen", "--knobs", "X", "--out", "D/g.hst"], ["trace", "compare", "T", "--targets", "X"],
    *[["plan", option, "X", "--concurrency", "1", "--quiet"]
      for option in ("--model", "--gpu", "--deployment", "--workload", "--hisparse-config", "--calibration", "--trace")],
    ["plan", "--validate", "X", "--quiet"], ["sweep", "X", "--no-ray", "--quiet", "--out", "D/s"],
    ["calibrate", "--comm-refit", "X", "--out", "D/cal"],
]


@pytest.mark.parametrize("template", MEM_INPUTS, ids=[" ".join(t[:3]) for t in MEM_INPUTS])
def test_proc_self_mem_as_any_input_is_one_line(tmp_path, trace, capsys, template):
    argv = [("/proc/self/mem" if a == "X" else trace if a == "T" else a.replace("D/", f"{tmp_path}/")) for a in template]
    code, _, err = run_cli(argv, capsys)
    assert_clean_error(code, err, "/proc/self/mem")


# -- bytes that are not UTF-8 -----------------------------------------------------------------------
def _not_utf8():
    def bad(data: bytes) -> bool:
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            return True
        return False

    return st.binary(min_size=1, max_size=64).map(lambda b: b + b"\xff").filter(bad)


TEXT_INPUTS = [
    (["plan", "--model", "X", "--concurrency", "1", "--quiet"], "m.toml"),
    (["plan", "--calibration", "X", "--concurrency", "1", "--quiet"], "cal.json"),
    (["plan", "--calibration", "X", "--concurrency", "1", "--quiet"], "cal.toml"),
    (["plan", "--validate", "X", "--quiet"], "set.toml"),
    (["sweep", "X", "--no-ray", "--quiet", "--out", "D/s"], "grid.toml"),
    (["trace", "gen", "--knobs", "X", "--out", "D/g.hst"], "k.toml"),
    (["trace", "compare", "T", "--targets", "X"], "targets.toml"),
    (["calibrate", "--refit", "--out", "D"], "h200.json"),
    (["validate", "--repredict", "--loop", "kernels", "--out", "D"], "validation-h200.json"),
]


@pytest.mark.parametrize("template, name", TEXT_INPUTS, ids=[f"{' '.join(t[:2])} {n}" for t, n in TEXT_INPUTS])
def test_binary_content_in_a_text_input_is_one_line(tmp_path, trace, capsys, template, name):
    if name == "validation-h200.json":
        shutil.copy("simulator/presets/calibration/h200.json", tmp_path / "h200.json")

    @fuzz_settings(ci_examples=5)
    @given(_not_utf8())
    def prop(data):
        assume(data)
        path = tmp_path / name
        path.write_bytes(data)
        argv = [str(path) if a == "X" else trace if a == "T" else str(tmp_path) if a == "D"
                else a.replace("D/", f"{tmp_path}/") for a in template]
        code, _, err = run_cli(argv, capsys)
        assert_clean_error(code, err, str(path))
        assert path.read_bytes() == data

    prop()


# -- missing optional extras --------------------------------------------------------------------------
@pytest.mark.parametrize("module, argv, extra", [
    ("torch", ["trace", "record", "--model", "smollm2-135m", "--text", "T", "--prompt-tokens", "8", "--steps", "2",
               "--topk", "4", "--out", "D/r.hst"], "record"),
    ("ray", ["sweep", "G", "--quiet", "--out", "D/s"], "sweep"),
])
def test_a_missing_extra_names_the_pip_command(tmp_path, trace, capsys, monkeypatch, module, argv, extra):
    grid = tmp_path / "g.toml"
    grid.write_text(f'kind = "replay"\n[fixed]\ntrace = "{trace}"\nbuffer = 16\n')
    monkeypatch.setitem(sys.modules, module, None)  # import -> ImportError
    argv = [trace if a == "T" else str(grid) if a == "G" else a.replace("D/", f"{tmp_path}/") for a in argv]
    code, _, err = run_cli(argv, capsys)
    assert_clean_error(code, err, module, f"pip install 'hisparse-sim[{extra}]'")
    assert not (tmp_path / "r.hst").exists() and not (tmp_path / "s").exists()


def test_named_stdout_names_write_errors_and_keeps_a_closed_reader_apart():
    from simulator.cli import _NamedStdout

    class Failing:
        encoding = "utf-8"

        def __init__(self, exc):
            self.exc = exc

        def write(self, text):
            raise self.exc

        def flush(self):
            raise self.exc

    full = _NamedStdout(Failing(OSError(errno.ENOSPC, "No space left on device")))
    with pytest.raises(OSError, match="standard output") as info:
        full.write("x")
    assert info.value.errno == errno.ENOSPC and info.value.filename == "standard output"
    with pytest.raises(OSError, match="standard output"):
        full.flush()
    with pytest.raises(BrokenPipeError):  # main's own branch: the reader left, status 0
        _NamedStdout(Failing(BrokenPipeError(errno.EPIPE, "Broken pipe"))).write("x")
    assert full.encoding == "utf-8"  # everything else is the stream's
