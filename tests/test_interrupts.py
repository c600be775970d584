"""Interrupted runs leave nothing behind: SIGTERM and Ctrl-C remove the temp file and print one
"interrupted" line; after SIGKILL, the next write of the same output removes the stale temp file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from simulator.fileio import atomic_output, stale_temps

ROOT = Path(__file__).resolve().parents[1]
# minutes of work, within the trace gen budget (HISPARSE_MAX_TRACE_ENTRIES, 2**32 entries: 2.6e9 here)
LONG_GEN = ["trace", "gen", "--steps", "20000", "--topk", "256", "--ctx0", "4096", "--layers", "64",
            "--requests", "8", "--quiet", "--out"]


def _temps(folder: Path, name: str) -> list[Path]:
    return sorted(folder.glob(f".{name}.*.tmp"))


def _start_and_wait_for_temp(out: Path) -> subprocess.Popen:
    # Ctrl-C reaches a foreground command with SIGINT at its default; a job started in the background
    # of a shell inherits it ignored (and Python then keeps ignoring it), so the test sets the default.
    proc = subprocess.Popen([sys.executable, "-m", "simulator.cli", *LONG_GEN, str(out)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while not _temps(out.parent, out.name):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"no temp file appeared (exit {proc.returncode}): {proc.communicate()}")
        time.sleep(0.1)
    return proc


@pytest.mark.parametrize("sig, status", [(signal.SIGTERM, 143), (signal.SIGINT, 130)], ids=["SIGTERM", "SIGINT"])
def test_signal_removes_the_temp_file_and_says_interrupted(tmp_path, sig, status):
    out = tmp_path / "x.hst"
    proc = _start_and_wait_for_temp(out)
    proc.send_signal(sig)
    try:
        _, err = proc.communicate(timeout=120)
    finally:  # a child that ignored the signal must not run on for its minutes after the test
        proc.kill()
    assert proc.returncode == status, err
    assert err.strip() == "hisparse: interrupted"
    assert not out.exists() and not _temps(tmp_path, out.name)


def test_after_sigkill_the_next_run_removes_the_stale_temp_file(tmp_path):
    out = tmp_path / "x.hst"
    proc = _start_and_wait_for_temp(out)
    proc.kill()
    proc.wait(timeout=60)
    stale = _temps(tmp_path, out.name)
    assert len(stale) == 1 and stale_temps(out) == stale
    from simulator.cli import main

    assert main(["trace", "gen", "--steps", "4", "--topk", "8", "--ctx0", "64", "--layers", "1",
                 "--requests", "1", "--quiet", "--out", str(out)]) == 0
    assert out.exists() and not _temps(tmp_path, out.name)


def test_only_temp_files_of_gone_writers_of_the_same_target_are_removed(tmp_path):
    target = tmp_path / "r.csv"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    gone = tmp_path / f".r.csv.{dead}.abc123.tmp"
    mine = tmp_path / f".r.csv.{os.getpid()}.live99.tmp"  # a writer still running
    other = tmp_path / f".s.csv.{dead}.abc123.tmp"  # another target's
    unrelated = tmp_path / ".r.csv.notes.tmp"
    for p in (gone, mine, other, unrelated):
        p.write_text("x")
    with atomic_output(target) as fh:
        fh.write(b"a,b\n")
    assert target.read_bytes() == b"a,b\n"
    assert not gone.exists() and mine.exists() and other.exists() and unrelated.exists()


def test_a_failed_write_leaves_nothing(tmp_path):
    target = tmp_path / "t.csv"
    with pytest.raises(RuntimeError), atomic_output(target) as fh:
        fh.write(b"half")
        raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("stage", ["build_parser", "parse_args"])
def test_ctrl_c_while_the_options_are_read_is_one_line(monkeypatch, capsys, stage):
    """Ctrl-C in the first ~0.1 s, while the parser is built or reads the options, printed a
    KeyboardInterrupt traceback (status -2): those ran outside main's handler."""
    import simulator.cli as cli

    def interrupt(*_a, **_k):
        raise KeyboardInterrupt

    real = cli.build_parser

    def parser_that_is_interrupted(*a, **k):
        parser = real(*a, **k)
        parser.parse_args = interrupt
        return parser

    monkeypatch.setattr(cli, "build_parser", interrupt if stage == "build_parser" else parser_that_is_interrupted)
    assert cli.main(["trace", "info", "x.hst"]) == 130
    assert capsys.readouterr().err == "hisparse: interrupted\n"
