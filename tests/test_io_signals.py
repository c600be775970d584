"""Issue #28, class 4: signals.

- A trace truncated while it is read: the readers read, never map (a mapped file that shrinks
  faults with SIGBUS on the next page), so any cut is a TraceError naming the file.
- A folder output is replaced as a whole or not at all (``fileio.folder_output``): interrupted
  at any point before its commit the folder is as it was; a signal during the commit waits for it.
- SIGTERM to a Ray sweep exits 143 with "hisparse: interrupted" (slow: starts a local Ray).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from simulator import fileio
from simulator.errors import TraceError
from simulator.fileio import folder_output
from simulator.trace import TraceMeta, open_trace, write_trace
from tests.fuzzing import fuzz_settings
from tests.helpers import random_stream

ROOT = Path(__file__).resolve().parents[1]


def _write(path: Path, compression: str = "stored", streams: int = 3) -> None:
    rng = np.random.default_rng(1)
    write_trace(path, TraceMeta(k=32, source={"kind": "test"}),
                [random_stream(rng, steps=300, k=32, ctx0=100, layer=j) for j in range(streams)],
                compression=compression)


@pytest.fixture(scope="module")
def hst(tmp_path_factory):
    path = tmp_path_factory.mktemp("sig") / "t.hst"
    _write(path)
    return path


@fuzz_settings(ci_examples=30)
@given(cut=st.floats(0.0, 0.999), compression=st.sampled_from(["stored", "zlib"]),
       coded=st.booleans())
def test_a_trace_cut_short_while_open_is_a_trace_error(tmp_path_factory, hst, cut, compression, coded):
    """Open (index read), then truncate the file under the reader, then read every stream: a cut
    into the chunks is a TraceError naming the file; one past them (into the index, already
    read) leaves every stream readable."""
    import struct

    path = tmp_path_factory.mktemp("cut") / "t.hst"
    _write(path, compression)
    reader = open_trace(path)
    size = path.stat().st_size
    index_offset = struct.unpack("<Q", path.read_bytes()[-20:-12])[0]  # the footer's u64
    os.truncate(path, int(size * cut))

    def read_all():
        for key in reader.keys:
            chunks = reader.coded_chunks(key) if coded else None
            if chunks is not None:
                for c in chunks:
                    bytes(c.payload)  # every byte touched: a mapping would fault here
            reader.read(key)

    if int(size * cut) >= index_offset:
        read_all()
    else:
        with pytest.raises(TraceError) as err:
            read_all()
        assert str(path) in str(err.value)
    reader.close()


def test_truncation_under_a_reading_process_never_faults(tmp_path):
    """In a child process (a SIGBUS would kill it, status -7): open, cut, replay via the coded
    fast path; the child must exit 0 having seen a TraceError."""
    path = tmp_path / "t.hst"
    _write(path, streams=6)
    code = (f"import os, sys\nfrom simulator.trace import open_trace\nfrom simulator.errors import TraceError\n"
            f"r = open_trace({str(path)!r})\nos.truncate({str(path)!r}, 200)\n"
            "from simulator.replay.api import replay\nfrom simulator.replay.config import expand_configs\n"
            "try:\n    replay(r, expand_configs(['lru'], [64]), workers=1, progress=False)\n"
            "except TraceError as exc:\n    print('TraceError', exc)\n    sys.exit(0)\nsys.exit(3)\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    assert "TraceError" in proc.stdout and str(path) in proc.stdout


def test_npy_traces_are_read_not_mapped(tmp_path):
    path = tmp_path / "t.npy"
    np.save(path, np.tile(np.arange(8, dtype=np.int32), (8, 1)))
    trace = open_trace(path, ctx0=64)
    os.truncate(path, 0)
    stream = next(iter(trace))
    assert int(stream.indices.sum()) == 8 * sum(range(8))  # in memory: the cut file is not touched


# -- folder outputs, whole or not at all -----------------------------------------------------------
DECLARED = ("plan.csv", "plan.json", "throughput.png")


def _state(folder: Path) -> dict:
    return {p.name: p.read_bytes() for p in folder.iterdir()} if folder.exists() else {}


def _temps(parent: Path) -> list[Path]:
    return [p for p in parent.iterdir() if p.name.endswith(".tmp")]


@fuzz_settings(ci_examples=40)
@given(old=st.dictionaries(st.sampled_from([*DECLARED, "notes.txt", "model.toml"]), st.binary(max_size=8), max_size=5),
       exists=st.booleans(), written=st.lists(st.sampled_from(DECLARED), unique=True, max_size=3),
       stop_after=st.one_of(st.none(), st.integers(0, 2)))
def test_a_folder_output_is_replaced_as_a_whole_or_not_at_all(tmp_path_factory, old, exists, written, stop_after):
    parent = tmp_path_factory.mktemp("fo")
    out = parent / "OUT"
    if exists:
        out.mkdir()
        for name, data in old.items():
            (out / name).write_bytes(data)
    before = _state(out)
    interrupted = stop_after is not None and stop_after < len(written)
    try:
        with folder_output(out, DECLARED) as staged:
            for i, name in enumerate(written):
                if interrupted and i == stop_after:
                    raise KeyboardInterrupt
                (staged / name).write_bytes(b"new " + name.encode())
    except KeyboardInterrupt:
        assert interrupted
        assert _state(out) == before  # as it was (absent if it was absent)
        assert out.exists() == exists
    else:
        assert not interrupted
        after = _state(out)
        others = {k: v for k, v in before.items() if k not in DECLARED}
        assert after == others | {name: b"new " + name.encode() for name in written}
    assert _temps(parent) == []


def test_a_signal_during_the_commit_waits_for_it(tmp_path, monkeypatch):
    """SIGTERM sent while the new files are renamed in is delivered after the last rename."""
    out = tmp_path / "OUT"
    out.mkdir()
    for name in DECLARED:
        (out / name).write_text("old")

    class Term(BaseException):
        pass

    def on_term(signum, frame):
        raise Term

    previous = signal.signal(signal.SIGTERM, on_term)
    real_replace, calls = os.replace, []

    def replace_and_signal(src, dst):
        calls.append(dst)
        if len(calls) == 1:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
        real_replace(src, dst)

    monkeypatch.setattr(fileio.os, "replace", replace_and_signal)
    try:
        with pytest.raises(Term), folder_output(out, DECLARED) as staged:
            for name in DECLARED:
                (staged / name).write_text("new")
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert len(calls) == 3 and _state(out) == dict.fromkeys(DECLARED, b"new")
    assert _temps(tmp_path) == []


def test_an_output_set_commits_all_or_none(tmp_path):
    """output_set: a table, a plot and a folder staged together; an interrupt before the end leaves every one as it
    was (mrc stopped between its table and its plot left the new table beside the old plot; plan between its --out
    folder and its --report), a clean end commits all of them."""
    from simulator.fileio import atomic_output, output_set

    table, plot, out = tmp_path / "c.csv", tmp_path / "c.png", tmp_path / "OUT"
    out.mkdir()
    for path, text in ((table, "old table"), (plot, "old plot"), (out / "plan.json", "old json")):
        path.write_text(text)

    def write(stop_after: int) -> None:
        with output_set():
            with atomic_output(table) as fh:
                fh.write(b"new table")
            if stop_after == 1:
                raise KeyboardInterrupt
            with folder_output(out, ("plan.json",)) as staged:
                (staged / "plan.json").write_text("new json")
            if stop_after == 2:
                raise KeyboardInterrupt
            with atomic_output(plot) as fh:
                fh.write(b"new plot")

    for stop_after in (1, 2):
        with pytest.raises(KeyboardInterrupt):
            write(stop_after)
        assert (table.read_text(), plot.read_text(), (out / "plan.json").read_text()) == ("old table", "old plot",
                                                                                           "old json")
        assert _temps(tmp_path) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["OUT", "c.csv", "c.png"]
    write(3)
    assert (table.read_text(), plot.read_text(), (out / "plan.json").read_text()) == ("new table", "new plot",
                                                                                       "new json")
    assert _temps(tmp_path) == []


def test_mrc_interrupted_between_its_table_and_its_plot_leaves_both(tmp_path, monkeypatch, capsys):
    """The real mrc writer, interrupted while drawing its plot: the table it had written stays staged and goes."""
    import simulator.replay.plots as rplots
    from simulator.cli import main

    table, plot = tmp_path / "c.csv", tmp_path / "c.png"
    table.write_text("old table")
    plot.write_text("old plot")

    def stop(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(rplots, "plot_miss_ratio_curves", stop)
    code = main(["mrc", "traces/synthetic-high-locality.hst", "--policy", "lru", "--max-buffer", "4096", "--quiet",
                 "--out", str(table), "--plot", str(plot)])
    assert code == 130 and table.read_text() == "old table" and plot.read_text() == "old plot"
    assert _temps(tmp_path) == []


@pytest.mark.parametrize("stop", ["KeyboardInterrupt", "SIGTERM"])
def test_plan_out_interrupted_leaves_the_earlier_run(tmp_path, monkeypatch, capsys, stop):
    """plan's writer (its real code) interrupted after plan.csv and plan.json are staged."""
    import simulator.serving.plots as plots
    from simulator.commands import plan
    from simulator.interrupts import Terminated

    out = tmp_path / "OUT"
    out.mkdir()
    for name in (*DECLARED, "notes.txt"):
        (out / name).write_text(f"earlier {name}")
    before = _state(out)

    def plot_then_stop(df, path, recommendation=None):
        Path(path).write_bytes(b"png")
        raise Terminated if stop == "SIGTERM" else KeyboardInterrupt

    monkeypatch.setattr(plots, "plot_throughput", plot_then_stop)
    with pytest.raises(KeyboardInterrupt):
        plan._write_outputs(str(out), [{"concurrency": 1, "system": "baseline"}], {"rows": [], "launch": {"choice": None}}, {})
    assert _state(out) == before and _temps(tmp_path) == []
    monkeypatch.setattr(plots, "plot_throughput", lambda df, path, recommendation=None: Path(path).write_bytes(b"png"))
    plan._write_outputs(str(out), [{"concurrency": 1, "system": "baseline"}], {"rows": [], "launch": {"choice": None}}, {})
    after = _state(out)
    assert after["notes.txt"] == b"earlier notes.txt" and after["throughput.png"] == b"png"
    assert after["plan.csv"].startswith(b"concurrency,system") and b"rows" in after["plan.json"]


@pytest.mark.slow
def test_sigterm_to_a_ray_sweep_says_interrupted_and_exits_143(tmp_path):
    """A local Ray instance: SIGTERM once a point is written (ray.init's own handler would exit 1).

    The grid must still be running when the signal lands: points take 5-10 ms, so 200 x 2 points
    ended ~4 s after the first part, and a test process held off the CPU that long saw exit 0.
    4,500 x 2 points (under HISPARSE_MAX_POINTS) run ~45 s past the first part on an idle 2-core
    machine, longer under load; the signal is sent within ~0.2 s of the first part."""
    trace = tmp_path / "t.hst"
    _write(trace, streams=4)
    buffers = ", ".join(str(b) for b in range(32, 32 + 4500))
    grid = tmp_path / "g.toml"
    grid.write_text(f'kind = "replay"\n[fixed]\ntrace = "{trace}"\n[grid]\nbuffer = [{buffers}]\n'
                    'policy = ["lru", "opt"]\n')
    out = tmp_path / "o"
    proc = subprocess.Popen([sys.executable, "-m", "simulator.cli", "sweep", str(grid), "--workers", "1",
                             "--quiet", "--out", str(out)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 240
    while not (out / "parts").exists() or not any((out / "parts").iterdir()):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"no part appeared (exit {proc.returncode}): {proc.communicate()}")
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=120)
    finally:  # a sweep that lost the signal must not run on for its minutes after the test
        proc.kill()
    assert proc.returncode == 143, err[-3000:]
    assert err.strip().splitlines()[-1] == "hisparse: interrupted"
    assert not [p for p in (out / "parts").iterdir() if p.name.endswith(".tmp")]


class _Ref:
    def __init__(self, value):
        self.value = value


class _RayDroppingSignals:
    """Ray's driver-side API as the sweep uses it, run in this process; its ``wait`` polls for
    signals the way Ray's compiled ``check_signals`` does, catching the handler's
    KeyboardInterrupt, and SIGTERM arrives during the third poll."""

    def __init__(self):
        self.waits = 0

    def is_initialized(self):
        return True

    def cluster_resources(self):
        return {"CPU": 1}

    def remote(self, **options):
        def wrap(fn):
            return type("Remote", (), {"remote": staticmethod(lambda *a: _Ref(fn(*a)))})
        return wrap

    def wait(self, refs, num_returns=1):
        self.waits += 1
        try:
            if self.waits == 3:
                os.kill(os.getpid(), signal.SIGTERM)  # the handler runs here and raises Terminated...
        except KeyboardInterrupt:
            pass  # ...which the poll turns into a status and drops
        return refs[:num_returns], refs[num_returns:]

    def get(self, ref):
        return ref.value


def test_sigterm_that_ray_wait_swallows_still_stops_the_sweep(tmp_path, monkeypatch, capsys):
    """The interrupt is lost inside ray.wait's signal poll: the sweep stops at the next point
    anyway (exit 143, "interrupted"), not after running the whole grid."""
    from simulator.cli import main

    fake = _RayDroppingSignals()
    monkeypatch.setitem(sys.modules, "ray", fake)
    trace = tmp_path / "t.hst"
    _write(trace, streams=1)
    grid = tmp_path / "g.toml"
    grid.write_text(f'kind = "replay"\n[fixed]\ntrace = "{trace}"\n[grid]\nbuffer = [{", ".join(map(str, range(32, 52)))}]\n')
    out = tmp_path / "o"
    assert main(["sweep", str(grid), "--workers", "1", "--quiet", "--out", str(out)]) == 143
    assert capsys.readouterr().err.strip().splitlines()[-1] == "hisparse: interrupted"
    assert fake.waits == 3 and len(list((out / "parts").iterdir())) == 2
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_validate_repredict_interrupted_leaves_the_earlier_pair(tmp_path, monkeypatch, capsys):
    """validate writes its report and plot as one pair: Ctrl-C after the plot is staged (before
    the commit) leaves the earlier report and plot as they were, and says interrupted."""
    import shutil

    import simulator.calibration.report as report
    from tests.fuzzing import run_cli

    shutil.copy(ROOT / "simulator" / "presets" / "calibration" / "h200.json", tmp_path / "h200.json")
    for name in ("validation-h200.json", "validation-h200.png"):
        shutil.copy(ROOT / "calibration" / name, tmp_path / name)
    before = _state(tmp_path)

    def plot_then_stop(rep, path):
        Path(path).write_bytes(b"png")
        raise KeyboardInterrupt

    monkeypatch.setattr(report, "plot_validation", plot_then_stop)
    code, _, err = run_cli(["validate", "--repredict", "--loop", "kernels", "--out", str(tmp_path)], capsys)
    assert code == 130 and err.strip().endswith("hisparse: interrupted")
    assert _state(tmp_path) == before and _temps(tmp_path) == []


def test_comm_refit_interrupted_leaves_the_earlier_pair(tmp_path, monkeypatch):
    """calibrate --comm-refit writes its calibration JSON and its plot as one set: an interrupt
    while the plot is drawn leaves the folder as the earlier run left it."""
    import shutil

    import simulator.calibration.report as report
    from tests.test_comm import synthetic_csv

    out = tmp_path / "cal"
    out.mkdir()
    shutil.copy(ROOT / "simulator" / "presets" / "calibration" / "h200.json", out / "h200.json")
    (out / "comm-h200.png").write_bytes(b"the earlier plot")
    csv = synthetic_csv(tmp_path / "comm-h200.csv")
    before = _state(out)

    def plot_then_stop(df, fits, path):
        Path(path).write_bytes(b"png")
        raise KeyboardInterrupt

    monkeypatch.setattr(report, "plot_comm", plot_then_stop)
    from simulator.cli import main

    assert main(["calibrate", "--comm-refit", str(csv), "--out", str(out)]) == 130
    assert _state(out) == before and not [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp")]
