"""I/O QA: errors name the paths the user gave, and long runs show they are running.

- A write error inside a folder output (``plan --out DIR`` on a full disk) named the staging folder the user never
  gave (``.DIR.<pid>.<random>.tmp/throughput.png``); it names ``DIR/throughput.png``.
- ``trace fit TRACE`` ran for minutes (a 1024-step trace: ~90 s) with nothing on the terminal; it counts its
  draws on a terminal (and stays silent with --quiet or off a terminal).
"""

from __future__ import annotations

import contextlib
import errno
import sys

import pytest

from simulator.cli import main
from simulator.fileio import OutputError, atomic_output, folder_output, output_set


def _full_disk_write(path) -> None:
    with atomic_output(path) as fh:
        fh.write(b"x")
        raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize("name", ["throughput.png", "sub/plan.csv"])
@pytest.mark.parametrize("in_set", [False, True])
def test_a_write_error_in_a_folder_output_names_the_output_folder(tmp_path, name, in_set):
    out = tmp_path / "o"
    outer = output_set() if in_set else contextlib.nullcontext()
    with pytest.raises(OutputError) as err, outer, folder_output(out, [name.split("/")[0] + "/" if "/" in name
                                                                       else name]) as staging:
        (staging / name).parent.mkdir(parents=True, exist_ok=True)
        _full_disk_write(staging / name)
    message = str(err.value)
    assert message == f"{out / name}: cannot write (No space left on device)"
    assert ".tmp" not in message
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_a_write_error_outside_a_folder_output_names_the_file(tmp_path):
    with pytest.raises(OutputError, match=rf"^{tmp_path / 'a.csv'}: cannot write \(No space left on device\)$"):
        _full_disk_write(tmp_path / "a.csv")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("terminal,quiet,shown", [(True, False, True), (True, True, False), (False, False, False)])
def test_trace_fit_counts_its_draws_at_a_terminal(tmp_path, trace, capsys, monkeypatch, terminal, quiet, shown):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: terminal)
    out = tmp_path / "k.toml"
    assert main(["trace", "fit", trace, "--out", str(out), *(["--quiet"] if quiet else [])]) == 0
    err = capsys.readouterr().err
    assert ("draws" in err) == shown, err
    if shown:  # the counter went past the first draw
        counts = [int(part.split()[-1]) for part in err.replace("\r", "\n").split(" draws") if part.strip()
                  and part.split()[-1].isdigit()]
        assert counts and max(counts) > 1, err
    assert out.is_file()
