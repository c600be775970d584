"""Issue #28, class 3: inputs and remote ends that block.

A FIFO as any input blocked in ``open()`` before any check; a device or socket never ends. One
check (``fileio.check_input``, from ``stat`` alone) runs before every ``open()``: the properties
put a FIFO, a device, a socket or a folder at every input of every command and require one
error line naming it, within a few seconds (a blocked ``open()`` is broken by a timer and fails
the test). ``sweep --address`` is parsed up front and must answer within a bound; the tests
contact only 127.0.0.1 ports that refuse, or that accept and say nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import threading
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from simulator.fileio import InputError, check_input
from simulator.sweep.address import parse_address, split_address
from tests.fuzzing import assert_clean_error, fuzz_settings, run_cli


class Blocked(BaseException):
    """Raised by the timer: the command blocked (the CLI catches no BaseException of this kind)."""


@contextlib.contextmanager
def deadline(seconds: float):
    def fire(signum, frame):
        raise Blocked(f"blocked for {seconds} s")

    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@pytest.fixture()
def specials(tmp_path):
    """A FIFO, a device, a socket and a folder, each under a name an input could have."""
    made = {}
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    made["fifo"] = fifo
    made["device"] = "/dev/zero"
    sock_path = tmp_path / "sock"
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(sock_path))
    made["socket"] = sock_path
    made["folder"] = tmp_path / "folder"
    made["folder"].mkdir()
    yield made
    sock.close()


# Every input of every command; X is where the special goes, T a good trace, D a scratch folder.
INPUTS = [
    ["trace", "info", "X"], ["trace", "validate", "X"], ["replay", "X", "--quiet"], ["mrc", "X", "--quiet"],
    ["trace", "convert", "X", "--out", "D/c.hst"], ["trace", "compare", "X"],
    ["trace", "export", "X", "--format", "oracle-general", "--out", "D/e.bin"],
    ["trace", "fit", "X", "--quiet", "--out", "D/k.toml"], ["trace", "compare", "T", "--targets", "X"],
    ["trace", "gen", "--knobs", "X", "--out", "D/g.hst"],
    *[["plan", option, "X", "--concurrency", "1", "--quiet"]
      for option in ("--model", "--gpu", "--deployment", "--workload", "--hisparse-config", "--calibration", "--trace")],
    ["plan", "--validate", "X", "--quiet"],
    ["sweep", "X", "--no-ray", "--quiet", "--out", "D/s"],
    ["calibrate", "--comm-refit", "X", "--out", "D/cal"],
    ["trace", "record", "--model", "smollm2-135m", "--text", "X", "--prompt-tokens", "8", "--steps", "2",
     "--topk", "4", "--out", "D/r.hst"],
]


@pytest.mark.parametrize("template", INPUTS, ids=[" ".join(t[:3]) for t in INPUTS])
def test_a_special_file_as_any_input_is_refused_without_blocking(tmp_path, specials, trace, capsys, template):
    @fuzz_settings(ci_examples=4)
    @given(st.sampled_from(["fifo", "device", "socket", "folder"]))
    def prop(kind):
        path = str(specials[kind])
        argv = [path if a == "X" else trace if a == "T" else a.replace("D/", f"{tmp_path}/") for a in template]
        with deadline(30):
            code, _, err = run_cli(argv, capsys)
        assert_clean_error(code, err, path)
        assert any(w in err for w in ("named pipe", "a device", "a socket", "folder", "not a regular file")), err

    prop()


@pytest.mark.parametrize("where", ["grid trace", "npy trace", "previous fit", "stored validation", "refit csv"])
def test_special_files_read_from_inside_other_inputs_or_folders(tmp_path, specials, trace, capsys, where):
    """Files no option names directly: a grid's trace, OUT/<gpu>.json of calibrate --refit."""
    fifo = specials["fifo"]
    if where == "grid trace":
        grid = tmp_path / "g.toml"
        grid.write_text(f'kind = "replay"\n[fixed]\ntrace = "{fifo}"\n')
        argv = ["sweep", str(grid), "--no-ray", "--quiet", "--out", str(tmp_path / "s")]
    elif where == "npy trace":
        npy = tmp_path / "f.npy"
        os.mkfifo(npy)
        fifo, argv = npy, ["trace", "info", str(npy)]
    else:
        out = tmp_path / "cal"
        out.mkdir()
        name = {"previous fit": "h200.json", "stored validation": "validation-h200.json",
                "refit csv": "attention-h200.csv"}[where]
        if where != "previous fit":
            (out / "h200.json").write_bytes(open("simulator/presets/calibration/h200.json", "rb").read())
        if where == "refit csv":
            (out / "swap_in-h200.csv").write_bytes(open("calibration/swap_in-h200.csv", "rb").read())
        fifo = out / name
        os.mkfifo(fifo)
        argv = ["validate", "--repredict", "--loop", "kernels", "--out", str(out)] if where == "stored validation" \
            else ["calibrate", "--refit", "--out", str(out)]
    with deadline(60):
        code, _, err = run_cli(argv, capsys)
    assert_clean_error(code, err, str(fifo), "named pipe")


@fuzz_settings(ci_examples=40)
@given(st.sampled_from(["/dev/stdin", "/dev/null", "/dev/zero", "/dev/tty", "/proc/self/mem", "/", "/nonexistent/x",
                        "", "a\0b", "/proc/self/status"]))
def test_check_input_never_opens_and_allows_only_regular_files(path):
    """From stat alone: a regular file passes, /dev/stdin only where a stream is taken by design."""
    for special_ok in (False, True):
        try:
            with deadline(10):
                check_input(path, option="--x", special_ok=special_ok)
        except InputError as exc:
            assert str(exc).startswith("--x") or path in ("", "a\0b")
            continue
        assert os.path.isfile(path) or (special_ok and path == "/dev/stdin")


# -- sweep --address --------------------------------------------------------------------------
@fuzz_settings(ci_examples=80)
@given(st.one_of(st.text(max_size=40), st.sampled_from([
    "auto", "local", "127.0.0.1:6379", "ray://127.0.0.1", "ray://[::1]:10001", "[::1]:6379", "h:0", "h:65536",
    "h", "::1:5", "a..b:1", "http://a:1", "", ":1", "h:1:2", "-bad-:1", "host_name:1", "h:٣", "ray://", "h:-1"])))
def test_malformed_addresses_are_refused_while_parsing(text):
    try:
        value = parse_address(text)
    except argparse.ArgumentTypeError as exc:
        assert "got" in str(exc)
        return
    parsed = split_address(value)
    assert parsed is None and value in ("auto", "local") or (1 <= parsed.port <= 65535 and parsed.host)


def _grid(tmp_path, trace):
    grid = tmp_path / "g.toml"
    grid.write_text(f'kind = "replay"\n[fixed]\ntrace = "{trace}"\nbuffer = 16\n')
    return str(grid)


@pytest.mark.parametrize("address", ["127.0.0.1", "127.0.0.1:0", "tcp://127.0.0.1:5", "127.0.0.1:99999", "[::1]"])
def test_malformed_address_on_the_command_line(tmp_path, trace, capsys, address):
    code, _, err = run_cli(["sweep", _grid(tmp_path, trace), "--address", address, "--out", str(tmp_path / "o")], capsys)
    assert_clean_error(code, err, "--address")
    assert not (tmp_path / "o").exists()


@contextlib.contextmanager
def _refusing_port():
    """A loopback port bound but not listening: a connection to it is refused, and no other
    process can take the port while the test uses it (a port freed and then reused could listen)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


@contextlib.contextmanager
def _listener(reply: bytes | None):
    """A loopback server that accepts and then says nothing (``reply`` None) or ``reply``."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    stop = threading.Event()
    conns = []

    def serve():
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            conns.append(conn)
            if reply is not None:
                conn.sendall(reply)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join(2)
        for c in conns:
            c.close()
        server.close()


@pytest.mark.parametrize("end", ["refuses", "silent", "not ray"])
def test_a_remote_ray_that_does_not_answer_is_one_line_within_the_bound(tmp_path, trace, capsys, monkeypatch, end):
    # The silent end is waited out (2 s). The others answer at once; their bound is wider, since
    # the listener's thread must be scheduled to accept and reply before it runs out.
    monkeypatch.setenv("HISPARSE_RAY_TIMEOUT", "2" if end == "silent" else "20")
    with contextlib.ExitStack() as stack:
        port = stack.enter_context(_refusing_port() if end == "refuses" else
                                   _listener(None if end == "silent" else b"HTTP/1.1 400 Bad Request\r\n\r\n"))
        start = time.monotonic()
        with deadline(60):
            code, _, err = run_cli(["sweep", _grid(tmp_path, trace), "--address", f"127.0.0.1:{port}", "--quiet",
                                    "--out", str(tmp_path / "o")], capsys)
        took = time.monotonic() - start
    assert_clean_error(code, err, f"--address 127.0.0.1:{port}",
                       {"refuses": "cannot connect", "silent": "no answer within 2 s", "not ray": "does not answer"}[end])
    assert took < 30, took
    assert not (tmp_path / "o").exists()


def test_dev_stdin_is_read_from_descriptor_0_where_a_stream_is_taken(tmp_path):
    """/dev/stdin, where allowed by design (record --text), is read without a new open(): a
    finished pipe's writer is gone, and reopening it would block."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    code = ("from simulator.fileio import read_bytes, InputError\n"
            "print(read_bytes('/dev/stdin', option='--text', special_ok=True))\n"
            "try:\n    read_bytes('/dev/stdin', option='--model')\nexcept InputError as exc:\n    print(exc)\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=root, input=b"some words", capture_output=True,
                          timeout=60)
    lines = proc.stdout.decode().splitlines()
    assert proc.returncode == 0, proc.stderr
    assert lines[0] == "b'some words'"
    assert lines[1].startswith("--model /dev/stdin: is ") and "not a regular file" in lines[1]
