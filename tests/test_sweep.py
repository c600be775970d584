"""``hisparse sweep``: grids, a local Ray instance with 2 workers, failures, resume."""

from __future__ import annotations

import pandas as pd
import pytest

from simulator.cli import main
from simulator.errors import HisparseError
from simulator.replay import ReplayConfig, replay_stream
from simulator.sweep.grid import load_grid
from simulator.trace import open_trace

TRACE = "traces/synthetic-high-locality.hst"
GRID = f"""kind = "replay"
[fixed]
trace = "{TRACE}"
[grid]
policy = ["lru", "fifo"]
buffer = [1024, 2048, 4096]
"""


def _corrupt_copy(tmp_path) -> str:
    """TRACE with one payload byte of its last chunk flipped: it opens (index and headers hold),
    so a sweep's up-front checks pass it, and every replay of it fails on the checksum."""
    from simulator.trace.format import TraceReader

    with TraceReader(TRACE) as r:
        last = max((c for key in r.keys for c, _ in r.chunks(key)), key=lambda c: c.offset)
        at = last.offset + r._chunk_struct.size + 5
    data = bytearray(open(TRACE, "rb").read())
    data[at] ^= 0xFF
    path = tmp_path / "corrupt.hst"
    path.write_bytes(bytes(data))
    return str(path)


def _failing_grid(tmp_path) -> str:
    """Six points, two of which fail while running (buffers below k are refused before any
    point runs, as hisparse replay refuses them: issue #28 class 9): fifo on a corrupt trace."""
    bad = _corrupt_copy(tmp_path)
    return _grid(tmp_path, f'kind = "replay"\n[grid]\ntrace = ["{TRACE}", "{bad}"]\npolicy = ["lru", "fifo"]\n'
                           "buffer = [2048, 4096]\n", name="failing.toml")


def _grid(tmp_path, text=GRID, name="grid.toml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _table(out) -> pd.DataFrame:
    df = pd.read_parquet(out / "results.parquet")
    return df.drop(columns=["seconds"]).sort_values("point").reset_index(drop=True)


@pytest.mark.slow  # starts a local Ray instance
def test_ray_sweep_resume_and_failures(tmp_path, capfd):
    grid = _failing_grid(tmp_path)
    full, part = tmp_path / "full", tmp_path / "part"
    assert main(["sweep", grid, "--out", str(full), "--workers", "2", "--quiet", "--keep-going"]) == 0
    printed, err = capfd.readouterr()
    assert "8 of 8 points" in printed and "(4 failed)" in printed
    assert "Token authentication" not in err  # silenced for the local instance
    assert err.count("failed: ") == 4 and "corrupt.hst" in err  # each failure listed
    table = _table(full)
    assert len(table) == 8
    bad = table[table.trace.str.endswith("corrupt.hst")]
    assert len(bad) == 4 and (bad.error.str.contains("checksum mismatch")).all()  # failing points recorded
    good = table[table.trace == TRACE]
    assert (good.error == "").all()
    trace = open_trace(TRACE)
    for _, row in good.iterrows():
        cfg = ReplayConfig(policy=row.policy, buffer=int(row.buffer))
        assert row.misses == sum(int(replay_stream(s, cfg).sum()) for s in trace)
    # an interrupted sweep (3 points), then --resume: the same table as the uninterrupted run
    assert main(["sweep", grid, "--out", str(part), "--workers", "2", "--quiet", "--max-points", "3",
                 "--keep-going"]) == 0
    assert len(pd.read_parquet(part / "results.parquet")) == 3
    assert main(["sweep", grid, "--out", str(part), "--quiet"]) == 2
    assert "--resume" in capfd.readouterr().err
    # without --keep-going, failed points make the exit status 1
    assert main(["sweep", grid, "--out", str(part), "--workers", "2", "--quiet", "--resume"]) == 1
    pd.testing.assert_frame_equal(_table(part), table)


def test_every_point_failing_exits_1_and_lists_them(tmp_path, capsys):
    bad = _corrupt_copy(tmp_path)
    grid = _grid(tmp_path, f'kind = "replay"\n[fixed]\ntrace = "{bad}"\n[grid]\nbuffer = [2048, 3072, 4096]\n')
    assert main(["sweep", grid, "--out", str(tmp_path / "o"), "--no-ray", "--quiet"]) == 1
    out, err = capsys.readouterr()
    assert "(3 failed)" in out
    assert [line.count("checksum mismatch") for line in err.splitlines()] == [1, 1, 1]
    assert main(["sweep", grid, "--out", str(tmp_path / "o2"), "--no-ray", "--quiet", "--keep-going"]) == 0


@pytest.mark.parametrize("entry, message", [
    ("buffer = [0, 4096]", "buffer = 0: expected a buffer size"),
    ("buffer = [-5]", "buffer = -5"),
    ('policy = ["lru", "lur"]', "unknown policy 'lur'"),
    ('policy = [""]', "give at least one policy"),
    ('semantics = ["batch"]', "semantics = 'batch': expected one of batched, sequential"),
    ('initial = ["full"]', "initial = 'full'"),
])
def test_bad_grid_values_fail_before_any_point(tmp_path, capsys, entry, message):
    grid = _grid(tmp_path, f'kind = "replay"\n[fixed]\ntrace = "{TRACE}"\n[grid]\n{entry}\n')
    assert main(["sweep", grid, "--out", str(tmp_path / "o"), "--no-ray", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert message in err and grid in err, err
    assert not (tmp_path / "o").exists()  # nothing ran


def test_a_missing_trace_fails_before_any_point(tmp_path, capsys):
    grid = _grid(tmp_path, 'kind = "replay"\n[grid]\ntrace = ["traces/synthetic-dsa-like.hst", "nope.hst"]\n')
    assert main(["sweep", grid, "--out", str(tmp_path / "o"), "--no-ray", "--quiet"]) == 2
    assert "trace = 'nope.hst': no such file" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("entry, message", [
    ("concurrency = [0]", "concurrency = 0: expected a positive integer"),
    ("rate = [-1.0]", "rate = -1.0: expected a positive number"),
    ("host_to_device_ratio = [0.0]", "host_to_device_ratio = 0.0"),
    ("slo_tpot_ms = [0]", "slo_tpot_ms = 0"),
    ("device_buffer_size = [0]", "device_buffer_size = 0"),
])
def test_bad_plan_grid_values(tmp_path, capsys, entry, message):
    grid = _grid(tmp_path, f'kind = "plan"\n[grid]\n{entry}\n')
    assert main(["sweep", grid, "--out", str(tmp_path / "o"), "--no-ray", "--quiet"]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.slow  # a grid of full plans
def test_plan_sweep_in_process(tmp_path):
    grid = _grid(tmp_path, """kind = "plan"
[fixed]
workload = "32k-in-8k-out"
[grid]
concurrency = [1, 256]
device_buffer_size = [4096, 8192]
""")
    assert main(["sweep", grid, "--out", str(tmp_path / "o"), "--no-ray", "--quiet"]) == 0
    df = pd.read_parquet(tmp_path / "o" / "results.parquet")
    assert len(df) == 4 and (df.error == "").all()
    at256 = df[df.concurrency == 256].set_index("device_buffer_size")
    # bigger buffers, fewer requests: SGLang's admission charges every running request's remaining
    # output to HiSparse's device slots (available_size = min(logical, device)); in steady state
    # 14 hot buffers of 4,160 or 7 of 8,256 per rank beside a 32K prompt in flight (96,896 device slots)
    assert at256.hisparse_max_running_deployment[4096] == 8 * 14
    assert at256.hisparse_max_running_deployment[8192] == 8 * 7
    assert set(df.columns) >= {"point", "concurrency", "device_buffer_size", "baseline_steady_tok_s_deployment",
                               "hisparse_steady_tok_s_deployment", "hisparse_tpot_p99_ms"}


@pytest.mark.parametrize("text, message", [
    ('kind = "replay"\n[grid]\npolicy = ["lru"]\n', "missing option 'trace'"),
    ('kind = "replays"\n', 'kind must be "replay" or "plan"'),
    ('[grid]\nbuffer = [4096]\n', r'missing kind \(a top-level line kind = "replay"'),
    ('kind = "replay"\n[fixed]\ntrace = "t"\nbufer = 3\n', "bufer: not a replay option"),
    ('kind = "replay"\n[fixed]\ntrace = "t"\n[grid]\nbuffer = ["big"]\n', "buffer = 'big': expected int"),
    ('kind = "replay"\n[fixed]\ntrace = "t"\n[grid]\nbuffer = []\n', "buffer: empty list"),
    # a repeated value ran the same point twice and wrote two rows for it
    ('kind = "replay"\n[fixed]\ntrace = "t"\n[grid]\npolicy = ["lru", "lru"]\n', "policy: 'lru' given twice"),
    ('kind = "plan"\n[grid]\nhost_to_device_ratio = [4, 4.0]\n', "host_to_device_ratio: 4.0 given twice"),
    # a key in both tables: [grid] silently replaced [fixed]
    ('kind = "replay"\n[fixed]\ntrace = "t"\nbuffer = 4096\n[grid]\nbuffer = [2048]\n',
     "buffer is in both .fixed. and .grid."),
    ('kind = "plan"\n[grid]\nconcurrency = [1]\nrate = [2.0]\n', "concurrency or rate, not both"),
    ("kind = = 1", "not valid TOML"),
    ('kind = "replay"\nfixed = 3\n', "fixed must be a table"),
    ('kind = "replay"\ngrid = [1, 2]\n', "grid must be a table"),
    ('kind = "replay"\n[fixed]\ntrace = "t"\n[grid]\nbuffer = [[16, 32]]\n', "expected int"),
    ('kind = "replay"\n[fixed]\ntrace = "t"\n[grid.buffer]\na = 1\n', "expected int"),
])
def test_bad_grid_files(tmp_path, text, message):
    path = _grid(tmp_path, text)
    with pytest.raises(HisparseError, match=message) as err:
        load_grid(path)
    assert path in str(err.value)


def test_grid_that_is_a_folder(tmp_path):
    with pytest.raises(HisparseError, match="is a folder; give a file"):
        load_grid(tmp_path)


def test_grid_expansion():
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        grid = load_grid(_grid(Path(d)))
    assert grid.kind == "replay" and grid.axes == ("buffer", "policy") and len(grid.points) == 6
    assert {(p["policy"], p["buffer"]) for p in grid.points} == {(a, b) for a in ("lru", "fifo")
                                                                 for b in (1024, 2048, 4096)}


@pytest.mark.parametrize("entry, message", [
    ('model = ["glm-5.1-fp8", "nope"]', "model = 'nope': unknown model preset 'nope' (presets: "),
    ('gpu = ["nope"]', "gpu = 'nope': unknown gpu preset"),
    ('deployment = ["nope"]', "deployment = 'nope': unknown deployment preset"),
    ('workload = ["nope"]', "workload = 'nope': unknown workload preset"),
    ('hisparse = ["nope"]', "hisparse = 'nope': unknown hisparse preset"),
    ('calibration = ["auto", "nope"]', "calibration = 'nope': unknown calibration preset"),
    ('model = ["mine.toml"]', "model = 'mine.toml': mine.toml: no such file"),
])
def test_plan_grid_presets_fail_before_any_point(tmp_path, capsys, entry, message):
    grid = _grid(tmp_path, f'kind = "plan"\n[fixed]\nconcurrency = 1\n[grid]\n{entry}\n')
    assert main(["sweep", grid, "--out", str(tmp_path / "o"), "--no-ray", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert message in err and grid in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "o").exists()  # nothing ran


def test_plan_grid_preset_names_come_from_the_presets(tmp_path, capsys):
    from simulator.serving.presets import preset_names

    grid = _grid(tmp_path, 'kind = "plan"\n[grid]\nworkload = ["nope"]\n')
    assert main(["sweep", grid, "--out", str(tmp_path / "o"), "--no-ray", "--quiet"]) == 2
    assert ", ".join(preset_names("workloads")) in capsys.readouterr().err


def test_resume_with_another_grid_is_refused_and_an_extended_grid_continues(tmp_path, capsys):
    """--resume with a different grid rewrote results.parquet from that grid's points: the earlier grid's rows
    vanished (exit 0). Now a folder holding points this grid lacks is refused (exit 2, nothing rewritten); a grid
    that keeps every finished point and adds more resumes and runs only the new ones."""
    out = tmp_path / "o"
    small = _grid(tmp_path, f'kind = "replay"\n[fixed]\ntrace = "{TRACE}"\n[grid]\npolicy = ["lru"]\n'
                            "buffer = [2048, 4096]\n", name="small.toml")
    assert main(["sweep", small, "--no-ray", "--out", str(out), "--quiet"]) == 0
    before = (out / "results.parquet").read_bytes()
    other = _grid(tmp_path, f'kind = "replay"\n[fixed]\ntrace = "{TRACE}"\n[grid]\npolicy = ["fifo"]\n'
                            "buffer = [2048]\n", name="other.toml")
    capsys.readouterr()
    assert main(["sweep", other, "--no-ray", "--out", str(out), "--resume", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "holds 2 finished point(s) that this grid does not have" in err and "another --out" in err
    assert (out / "results.parquet").read_bytes() == before
    wider = _grid(tmp_path, f'kind = "replay"\n[fixed]\ntrace = "{TRACE}"\n[grid]\npolicy = ["lru", "fifo"]\n'
                            "buffer = [2048, 4096]\n", name="wider.toml")
    assert main(["sweep", wider, "--no-ray", "--out", str(out), "--resume", "--quiet"]) == 0
    table = pd.read_parquet(out / "results.parquet")
    assert len(table) == 4 and set(table.policy) == {"lru", "fifo"}


SMALL = GRID.replace("buffer = [1024, 2048, 4096]", "buffer = [2048, 4096]")  # 4 points, each >= k


def test_a_second_sweep_into_a_folder_being_written_is_refused(tmp_path, capsys):
    """Two sweeps into one --out at once: the second is refused (exit 2) while the first holds the folder. Before,
    both passed the 'already holds results' check (no part written yet), both exited 0, and the last results
    table written held only one grid's rows."""
    import fcntl
    import os

    from simulator.sweep.runner import LOCK

    out = tmp_path / "o"
    out.mkdir()
    fd = os.open(out / LOCK, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a sweep running in another process
        assert main(["sweep", _grid(tmp_path, SMALL), "--out", str(out), "--no-ray", "--quiet"]) == 2
        err = capsys.readouterr().err
        assert "another hisparse sweep is writing this folder" in err and str(out) in err
        assert not (out / "parts").exists() and not (out / "results.parquet").exists()
    finally:
        os.close(fd)
    # once it has finished, the same command runs
    assert main(["sweep", _grid(tmp_path, SMALL), "--out", str(out), "--no-ray", "--quiet"]) == 0
    assert len(pd.read_parquet(out / "results.parquet")) == 4


def test_a_results_table_that_is_a_folder_is_refused_before_any_point(tmp_path, capsys):
    """OUT/results.parquet a folder: refused up front, not after every point has run."""
    out = tmp_path / "o"
    (out / "results.parquet").mkdir(parents=True)
    assert main(["sweep", _grid(tmp_path, SMALL), "--out", str(out), "--no-ray", "--quiet"]) == 2
    assert "results.parquet: is a folder" in capsys.readouterr().err
    assert not (out / "parts").exists()


@pytest.mark.parametrize("entry, users", [("seed = [1, 2]", "random"), ("ways = [16, 32]", "salru")])
def test_an_axis_no_point_uses_is_refused(tmp_path, capsys, entry, users):
    """seed / ways change only random / salru: a list of them on an lru grid ran each point once per value, the
    same result recorded twice (rc 0); hisparse replay notes such an option unused."""
    from tests.fuzzing import assert_clean_error, run_cli

    grid = _grid(tmp_path, f'kind = "replay"\n[fixed]\ntrace = "{TRACE}"\n[grid]\npolicy = ["lru", "fifo"]\n{entry}\n')
    code, out, err = run_cli(["sweep", grid, "--out", str(tmp_path / "o"), "--no-ray", "--quiet"], capsys)
    assert_clean_error(code, err, grid, entry.split()[0], users, "no point of the grid replays")
    assert out == "" and not (tmp_path / "o").exists()
    # where the policy is in the grid the axis is its own, and a single unused value is run with a warning
    ok = _grid(tmp_path, f'kind = "replay"\n[fixed]\ntrace = "{TRACE}"\nbuffer = 2048\n[grid]\n'
                         f'policy = ["lru", "{users}"]\n{entry}\n', name="ok.toml")
    assert main(["sweep", ok, "--out", str(tmp_path / "ok"), "--no-ray", "--quiet"]) == 0
    one = _grid(tmp_path, f'kind = "replay"\n[fixed]\ntrace = "{TRACE}"\n{entry.split(",")[0]}]\n[grid]\n'
                          'buffer = [2048, 4096]\n', name="one.toml")
    with pytest.warns(UserWarning, match=f"{entry.split()[0]} = .* is unused"):
        assert main(["sweep", one, "--out", str(tmp_path / "one"), "--no-ray", "--quiet"]) == 0
