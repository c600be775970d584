"""`hisparse replay`'s start-up: what the command imports is most of a short replay's time.

On a .npy stream or a short .hst the process is almost all start-up (BENCHMARKS.md, the floor of
``benchmarks/replay_speed.py``), so the modules the replay command loads are held here to a set:
none of the heavy libraries, none of the other commands' modules, no ``concurrent.futures``
(with ``logging``, ~6 ms), no JSON for a printed table. A new top-level import on the path fails
this test instead of slowing every replay silently.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from simulator import native
from simulator.thread_pool import Cancelled, ThreadPool
from simulator.trace import TraceMeta, write_trace
from tests.helpers import random_stream

ROOT = Path(__file__).parent.parent

# Never on the replay command's path (the modules and every submodule of them).
HEAVY = ("numpy", "numba", "pandas", "simpy", "matplotlib", "scipy", "cupy", "concurrent", "logging",
         "simulator.serving", "simulator.costmodel", "simulator.sweep", "simulator.calibration", "simulator.analysis",
         "simulator.record", "simulator.commands.plan", "simulator.commands.trace", "simulator.commands.sweep",
         "simulator.replay.engine", "simulator.replay.step", "simulator.replay.mrc", "simulator.trace.codec_jit")
# The package's modules a replay of a .npy stream may load, all of them.
NPY_MODULES = {
    "simulator", "simulator.cli", "simulator.commands", "simulator.commands.common", "simulator.commands.replay",
    "simulator.errors", "simulator.interrupts", "simulator.fileio", "simulator.inputs", "simulator.layer_groups", "simulator.limits",
    "simulator.native", "simulator.native._native", "simulator.replay", "simulator.replay.api",
    "simulator.replay.backend", "simulator.replay.config", "simulator.replay.policies", "simulator.trace",
    "simulator.trace.sources", "simulator.trace.stream"}
# ... and of a .hst trace (its reader, the metadata's JSON, the threads of the per-stream replays)
HST_MODULES = NPY_MODULES | {"simulator.trace.format", "simulator.trace.codec", "simulator.trace.problems",
                             "simulator.thread_pool", "json", "json.decoder", "json.encoder", "json.scanner", "_json"}


def _loaded(argv: list[str]) -> tuple[set[str], str]:
    """The modules a fresh interpreter loads to run ``hisparse`` with ``argv``, beyond its own start-up."""
    probe = ("import sys\nbefore = set(sys.modules)\nfrom simulator.cli import main\n"
             f"code = main({argv!r})\n"
             "sys.stdout.flush()\nprint('LOADED', ' '.join(sorted(set(sys.modules) - before)))\nsys.exit(code)")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    out, _, loaded = proc.stdout.rpartition("LOADED ")
    return set(loaded.split()), out


def _check(loaded: set[str], allowed: set[str]) -> None:
    heavy = sorted(m for m in loaded if any(m == h or m.startswith(h + ".") for h in HEAVY))
    assert not heavy, f"the replay command loaded {heavy}"
    ours = {m for m in loaded if m == "simulator" or m.startswith("simulator.")}
    assert ours <= allowed, f"new package modules on the replay path: {sorted(ours - allowed)}"
    assert "json" not in loaded or "json" in allowed


@pytest.fixture
def need_native():
    if not native.available():
        pytest.skip("HISPARSE_NATIVE=0: the reference path loads numba by design")


def test_replay_of_a_npy_loads_a_small_set(tmp_path, need_native):
    path = tmp_path / "s.npy"
    np.save(path, random_stream(np.random.default_rng(1), steps=40, k=16, ctx0=60).indices.astype(np.int32))
    for semantics in ("batched", "sequential"):
        loaded, out = _loaded(["replay", str(path), "--ctx0", "60", "--policy", "lru", "--buffer", "16,32",
                               "--semantics", semantics, "--quiet"])
        assert "miss_ratio" in out
        _check(loaded, NPY_MODULES)
        assert "json" not in loaded  # a printed table needs no JSON


def test_replay_of_a_hst_loads_a_small_set(tmp_path, need_native):
    path = tmp_path / "s.hst"
    write_trace(path, TraceMeta(k=16, source={"kind": "test"}),
                [random_stream(np.random.default_rng(2), steps=40, k=16, ctx0=60, layer=layer) for layer in range(3)])
    for extra in ([], ["--semantics", "sequential", "--initial", "empty", "--no-reserve-newest"]):
        for policy in ("lru", "opt", "lfu"):
            loaded, out = _loaded(["replay", str(path), "--policy", policy, "--buffer", "16,32", "--quiet", *extra])
            assert "miss_ratio" in out
            _check(loaded, HST_MODULES)


def test_replay_json_output_is_unchanged_by_the_lazy_json(tmp_path, need_native):
    path = tmp_path / "s.npy"
    np.save(path, random_stream(np.random.default_rng(3), steps=20, k=8, ctx0=30).indices.astype(np.int32))
    _, out = _loaded(["replay", str(path), "--ctx0", "30", "--buffer", "8", "--json", "--quiet"])
    records = json.loads(out)
    assert records[0]["policy"] == "lru" and records[0]["buffer"] == 8 and records[0]["accesses"] > 0


def test_thread_pool_runs_calls_in_order_on_its_threads_and_hands_errors_to_the_caller():
    names = []

    def work(i):
        names.append(threading.current_thread().name)
        if i == 5:
            raise ValueError("five")
        return i * i

    with ThreadPool(2, name="t") as pool:
        jobs = [pool.submit(work, i) for i in range(8)]
        assert [j.result() for j in jobs[:5]] == [0, 1, 4, 9, 16]
        with pytest.raises(ValueError, match="five"):
            jobs[5].result()
        assert [j.result() for j in jobs[6:]] == [36, 49]
    assert set(names) <= {"t-0", "t-1"} and threading.current_thread().name not in names
    with pytest.raises(RuntimeError):
        pool.submit(work, 0)
    with pytest.raises(ValueError):
        ThreadPool(0)


def test_thread_pool_left_by_an_error_drops_the_queued_calls_and_waits_for_the_running_one():
    started, release, ran = threading.Event(), threading.Event(), []

    def slow():
        started.set()
        release.wait(5)
        ran.append("slow")

    def later():
        ran.append("later")

    with pytest.raises(KeyError):
        with ThreadPool(1) as pool:
            pool.submit(slow)
            queued = pool.submit(later)
            assert started.wait(60)  # else the block is left before slow() runs: both calls dropped
            release.set()
            raise KeyError("stop")
    assert ran == ["slow"]  # the running call finished before the block was left; the queued one never ran
    with pytest.raises(Cancelled):
        queued.result()


def test_thread_pool_left_by_ctrl_c_returns_without_waiting_for_the_running_call():
    """Ctrl-C during a long compiled call (a native replay of one long stream, which never looks at
    signals) waited for it to end before `hisparse mrc` could say "interrupted": ~25 s."""
    started, release, ran = threading.Event(), threading.Event(), []

    def long_call():
        started.set()
        release.wait(30)
        ran.append("long")

    t0 = time.perf_counter()
    with pytest.raises(KeyboardInterrupt):
        with ThreadPool(1) as pool:
            pool.submit(long_call)
            queued = pool.submit(lambda: ran.append("later"))
            assert started.wait(60)
            raise KeyboardInterrupt
    assert time.perf_counter() - t0 < 5 and ran == []  # left at once; the running call still runs
    with pytest.raises(Cancelled):
        queued.result()
    release.set()
