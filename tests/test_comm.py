"""Communication terms: the harness on a real gloo process group of CPU processes, the fit on
synthetic timings with known latency and bandwidth, the calibration JSON's shape, bad CSVs and
the NVLink-multicast guard."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from simulator.calibration.comm import (
    COLLECTIVES,
    busbw_factor,
    fit_comm,
    read_comm_csv,
    read_metadata,
)
from simulator.calibration.comm_harness import (
    MULTICAST_OFF,
    Message,
    assert_multicast_off,
    disable_multicast,
    messages,
)
from simulator.cli import main
from simulator.errors import HisparseError
from simulator.serving import presets as P

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--backend", "gloo", "--device", "cpu", "--gpus", "2", "--hidden", "16", "--tokens", "1,3",
        "--repeats", "3", "--ops", "2", "--warmup", "1"]


def _env(multicast_off: bool = False) -> dict[str, str]:
    """The test's environment without the NVLS variables (the harness must set them itself), or
    with them (GPU runs keep them set from the start)."""
    env = {k: v for k, v in os.environ.items() if k not in MULTICAST_OFF}
    return env | {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"} | (MULTICAST_OFF if multicast_off else {})


def _gpus() -> int:
    try:
        import torch

        return torch.cuda.device_count()
    except Exception:
        return 0


def _check_harness_csv(path: Path, hidden: int, tokens: tuple[int, ...], timing: str = "wall",
                       backend: str = "gloo", counts: tuple[int, ...] = (2,)) -> None:
    df = read_comm_csv(path)  # the fit's own reader accepts it
    assert len(df) == 5 * len(tokens) * len(counts)  # all_to_all twice (dispatch fp8, combine bf16)
    assert set(df.collective) == set(COLLECTIVES) and set(df.n_gpus) == set(counts)
    for r in df.itertuples():
        msg = Message(r.collective, r.purpose, hidden, r.tokens_per_rank, r.row_bytes, r.copies)
        assert r.bytes == msg.nccl_bytes(r.n_gpus)
        assert r.time_us_p10 <= r.time_us <= r.time_us_p90 and r.time_us > 0
        assert r.algbw_gbps == pytest.approx(r.bytes / r.time_us * 1e-3)
        assert r.busbw_gbps == pytest.approx(r.algbw_gbps * busbw_factor(r.collective, r.n_gpus))
    assert set(df.timing) == {timing} and set(df.backend) == {backend}
    meta = read_metadata(path)
    assert (meta["device"] == "cpu") == (backend == "gloo") and "benchmarks/comm.py" in meta["command"]
    assert meta["env"] == " ".join(f"{k}={v}" for k, v in MULTICAST_OFF.items())  # as each rank saw it


def test_harness_spawns_a_gloo_group_and_writes_the_csv(tmp_path):
    run = subprocess.run([sys.executable, "benchmarks/comm.py", *TINY, "--out", str(tmp_path)], cwd=ROOT,
                         env=_env(), capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-2000:]
    _check_harness_csv(tmp_path / "comm.csv", 16, (1, 3))


@pytest.mark.slow  # torchrun and three ranks each importing torch (~15 s); the 2-rank spawn above stays
def test_harness_under_torchrun_with_a_subgroup(tmp_path):
    """3 ranks, GPU counts 2 and 3: rank 2 sits out the 2-rank group; 3 ranks split all_to_all unevenly."""
    args = [*TINY[:4], "--gpus", "2,3", *TINY[6:]]
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "3",
                          "benchmarks/comm.py", *args, "--out", str(tmp_path), "--csv-name", "t.csv"],
                         cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-2000:]
    _check_harness_csv(tmp_path / "t.csv", 16, (1, 3), counts=(2, 3))
    assert read_metadata(tmp_path / "t.csv")["command"].startswith("torchrun --nproc-per-node 3")


@pytest.mark.gpu
@pytest.mark.skipif(_gpus() < 2, reason="needs 2 GPUs (the gloo tests above are its CPU counterpart)")
def test_harness_on_two_gpus_through_nccl(tmp_path):
    """The same run through NCCL on 2 GPUs, timed as CUDA-graph replays."""
    args = ["--nproc", "2", "--gpus", "2", "--hidden", "6144", "--tokens", "1,64", "--repeats", "5", "--ops", "4"]
    run = subprocess.run([sys.executable, "benchmarks/comm.py", *args, "--out", str(tmp_path)], cwd=ROOT,
                         env=_env(multicast_off=True), capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    _check_harness_csv(tmp_path / "comm.csv", 6144, (1, 64), timing="graph", backend="nccl")


def test_harness_refuses_multicast_on(tmp_path):
    env = _env() | {"NCCL_NVLS_ENABLE": "1"}
    run = subprocess.run([sys.executable, "benchmarks/comm.py", *TINY, "--out", str(tmp_path)], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "NCCL_NVLS_ENABLE=1" in run.stderr and "Traceback" not in run.stderr
    assert not (tmp_path / "comm.csv").exists()


def test_multicast_guard():
    env: dict[str, str] = {}
    with pytest.raises(HisparseError, match="NCCL_NVLS_ENABLE=<unset>"):
        assert_multicast_off(env)
    disable_multicast(env)
    assert env == MULTICAST_OFF
    assert_multicast_off(env)
    env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "0"
    with pytest.raises(HisparseError, match="TORCH_SYMM_MEM_DISABLE_MULTICAST=0"):
        assert_multicast_off(env)
    with pytest.raises(HisparseError, match="must stay off"):
        disable_multicast(env)


def test_message_sizes_follow_nccl_tests():
    h, t, n = 7168, 32, 8
    by = {(m.collective, m.purpose): m for m in messages([h], [t], COLLECTIVES)}
    assert by["all_reduce", "tp_all_reduce"].nccl_bytes(n) == t * h * 2
    assert by["all_gather", "dp_gather"].nccl_bytes(n) == n * t * h * 2  # the gathered output
    assert by["reduce_scatter", "dp_scatter"].nccl_bytes(n) == n * t * h * 2  # the input
    assert by["all_to_all", "moe_dispatch"].nccl_bytes(n) == t * 8 * 7392  # one rank's send buffer:
    assert by["all_to_all", "moe_combine"].nccl_bytes(n) == t * 8 * h * 2  # fp8 + scales / bf16 rows
    assert by["all_to_all", "moe_dispatch"].row_bytes == 7168 + 56 * 4
    assert messages([6144], [1], ["all_to_all"])[0].row_bytes == 6336
    assert Message("all_to_all", "moe_combine", 10, 1, 20, 8).elements(3) == 159  # bytes, a multiple of the ranks
    assert busbw_factor("all_reduce", 8) == pytest.approx(1.75) and busbw_factor("all_to_all", 4) == 0.75


# ---- the fit -------------------------------------------------------------------------------

TRUE = {  # (latency us, busbw B/s) per collective and GPU count
    "all_reduce": {2: (9.0, 140e9), 4: (12.0, 170e9), 8: (16.0, 190e9)},
    "all_gather": {2: (7.0, 150e9), 4: (9.0, 160e9), 8: (12.0, 175e9)},
    "reduce_scatter": {2: (7.5, 145e9), 4: (9.5, 155e9), 8: (12.5, 170e9)},
    "all_to_all": {2: (10.0, 120e9), 4: (14.0, 130e9), 8: (20.0, 140e9)},
}


def synthetic_csv(path: Path, seed: int = 0, noise: float = 0.01) -> Path:
    """Timings t = latency + factor x bytes / busbw with 1% multiplicative noise, header lines on top."""
    rng = np.random.default_rng(seed)
    rows = []
    for coll, per_n in TRUE.items():
        for n, (lat, bw) in per_n.items():
            for h in (6144, 7168):
                for t in (1, 2, 4, 8, 16, 32, 64, 128, 256):
                    size = t * h * 2 * (n if coll in ("all_gather", "reduce_scatter") else 1)
                    us = (lat + busbw_factor(coll, n) * size / bw * 1e6) * (1 + rng.normal(0, noise))
                    rows.append(dict(collective=coll, n_gpus=n, bytes=size, time_us=us))
    path.write_text("# command: synthetic\n# device: 8 x test GPU\n" + pd.DataFrame(rows).to_csv(index=False))
    return path


def test_fit_recovers_latency_and_busbw(tmp_path):
    fits = fit_comm(read_comm_csv(synthetic_csv(tmp_path / "s.csv")))
    assert len(fits) == 12
    for r in fits.itertuples():
        lat, bw = TRUE[r.collective][r.n_gpus]
        assert r.latency_us == pytest.approx(lat, rel=0.05), (r.collective, r.n_gpus)
        assert r.busbw == pytest.approx(bw, rel=0.03), (r.collective, r.n_gpus)
        assert r.r2 > 0.99 and r.points == 18 and r.max_rel_err < 0.05


def test_fit_of_exact_timings_is_exact():
    sizes = np.array([1e4, 1e5, 1e6, 1e7])
    df = pd.DataFrame(dict(collective="all_reduce", n_gpus=4, bytes=sizes, time_us=5 + 1.5 * sizes / 100e9 * 1e6))
    r = fit_comm(df).iloc[0]
    assert r.latency_us == pytest.approx(5) and r.busbw == pytest.approx(100e9) and r.max_rel_err < 1e-9


def _calibration(tmp_path: Path) -> Path:
    out = tmp_path / "cal"
    out.mkdir()
    (out / "h200.json").write_text((ROOT / "simulator" / "presets" / "calibration" / "h200.json").read_text())
    return out


def test_comm_refit_writes_the_comm_section(tmp_path, capsys):
    out = _calibration(tmp_path)
    before = json.loads((out / "h200.json").read_text())
    csv = synthetic_csv(tmp_path / "comm-h200.csv")
    assert main(["calibrate", "--comm-refit", str(csv), "--out", str(out)]) == 0
    assert "all_to_all" in capsys.readouterr().out
    assert (out / "comm-h200.png").stat().st_size > 10_000  # measured against fit, one panel per collective
    report = json.loads((out / "h200.json").read_text())
    assert {k: v for k, v in report.items() if k != "comm"} == before  # the kernel terms stay
    comm = report["comm"]
    assert set(comm) == {"source", "command", *COLLECTIVES}
    assert comm["command"] == "synthetic" and "comm-h200.csv" in comm["source"] and "8 x test GPU" in comm["source"]
    for coll in COLLECTIVES:
        entry = comm[coll]
        assert set(entry) == {"latency_us", "busbw", "r2", "points", "max_rel_err"}
        for key in entry:
            assert set(entry[key]) == {"2", "4", "8"}
        assert entry["busbw"]["8"] == pytest.approx(TRUE[coll][8][1], rel=0.03)  # B/s
        assert entry["latency_us"]["2"] == pytest.approx(TRUE[coll][2][0], rel=0.05)
    params = P.load("calibration", str(out / "h200.json"))  # the serving loader still reads the file
    assert params.calibrated


BAD = [
    ("collective,n_gpus,bytes\nall_reduce,2,100\n", "column 'time_us' missing"),
    ("collective,n_gpus,bytes,time_us\nall_reduce,2,abc,5\nall_reduce,2,200,6\n",
     "column 'bytes', data row 1: 'abc' is not an integer >= 1"),
    ("collective,n_gpus,bytes,time_us\nall_reduce,1,100,5\nall_reduce,1,200,6\n", "column 'n_gpus', data row 1"),
    ("collective,n_gpus,bytes,time_us\nall_reduce,2,100,5\nbroadcast,2,200,6\n",
     "column 'collective', data row 2: 'broadcast' is not one of"),
    ("collective,n_gpus,bytes,time_us\nall_reduce,2,100,5\nall_reduce,2,200,-1\n", "column 'time_us', data row 2"),
    ("collective,n_gpus,bytes,time_us\nall_reduce,2,100,5\nall_reduce,2,100,6\n",
     "all_reduce on 2 GPUs has 1 message size in column 'bytes'"),
    ("collective,n_gpus,bytes,time_us\nall_reduce,2,100,9\nall_reduce,2,1000,5\n",
     "column 'time_us' does not grow with 'bytes'"),
    ("collective,n_gpus,bytes,time_us\nall_gather,4,1000,1\nall_gather,4,2000,3\nall_gather,4,3000,5\n",
     "all_gather on 4 GPUs: the fit of column 'time_us' gives a negative latency"),
    # flat timings fit a size term of ~1e-19 us/B: ~1e24 B/s was written as a measured busbw
    ("collective,n_gpus,bytes,time_us\nall_reduce,8,2048,3\nall_reduce,8,4096,3\nall_reduce,8,1048576,3\n",
     "column 'time_us' does not grow with 'bytes'"),
    ("", "not a CSV with a header row"),
    ("collective,n_gpus,bytes,time_us\n", "no data rows"),
    # the spread columns the report draws as error bars (matplotlib refused a negative bar: a traceback)
    ("collective,n_gpus,bytes,time_us,time_us_p10,time_us_p90\nall_reduce,2,1000,11,10,12\n"
     "all_reduce,2,100000,20,21,22\nall_reduce,2,1000000,110,100,120\n",
     "column 'time_us_p10', data row 2: '21' is not a positive number at most the row's time_us (20)"),
    ("collective,n_gpus,bytes,time_us,time_us_p10,time_us_p90\nall_reduce,2,1000,11,10,12\n"
     "all_reduce,2,100000,20,19,abc\n", "column 'time_us_p90', data row 2: 'abc' is not a positive number at least"),
]


@pytest.mark.parametrize("text,problem", BAD)
def test_bad_csv_is_one_line_naming_file_and_column(tmp_path, capsys, text, problem):
    out = _calibration(tmp_path)
    before = (out / "h200.json").read_bytes()
    csv = tmp_path / "bad.csv"
    csv.write_text(text)
    assert main(["calibrate", "--comm-refit", str(csv), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and str(csv) in err and problem in err, err
    assert (out / "h200.json").read_bytes() == before  # nothing half-written


def test_refit_of_a_csv_without_header_lines_names_its_own_command(tmp_path):
    out = _calibration(tmp_path)
    csv = synthetic_csv(tmp_path / "c.csv")
    csv.write_text("".join(line for line in csv.read_text().splitlines(True) if not line.startswith("#")))
    assert main(["calibrate", "--comm-refit", str(csv), "--out", str(out)]) == 0
    comm = json.loads((out / "h200.json").read_text())["comm"]
    assert comm["command"] == f"hisparse calibrate --comm-refit {csv} --gpu h200 --out {out}"


def test_missing_csv_and_conflicting_options(tmp_path, capsys):
    out = _calibration(tmp_path)
    assert main(["calibrate", "--comm-refit", str(tmp_path / "none.csv"), "--out", str(out)]) == 2
    assert "none.csv: no such file" in capsys.readouterr().err
    assert main(["calibrate", "--comm", "--comm-refit", "x.csv", "--out", str(out)]) == 2
    assert "give one" in capsys.readouterr().err


def test_comm_refit_of_a_folder_is_one_line(tmp_path, capsys):
    out = _calibration(tmp_path)
    before = (out / "h200.json").read_bytes()
    assert main(["calibrate", "--comm-refit", str(tmp_path), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "is a folder" in err and str(tmp_path) in err, err
    assert (out / "h200.json").read_bytes() == before


def test_a_failed_refit_leaves_no_new_folder_and_a_good_one_makes_it(tmp_path, capsys):
    """calibrate --comm-refit BAD.csv / --refit made --out (empty) before finding the input bad."""
    bad = tmp_path / "bad.csv"
    bad.write_text("")
    assert main(["calibrate", "--comm-refit", str(bad), "--out", str(tmp_path / "new")]) == 2
    assert main(["calibrate", "--refit", "--out", str(tmp_path / "new2")]) == 2
    err = capsys.readouterr().err
    assert "bad.csv" in err and "missing" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.csv"]
    csv = synthetic_csv(tmp_path / "comm-h200.csv")
    assert main(["calibrate", "--comm-refit", str(csv), "--out", str(tmp_path / "made" / "cal")]) == 0
    assert sorted(p.name for p in (tmp_path / "made" / "cal").iterdir()) == ["comm-h200.png", "h200.json"]


def test_comm_refit_into_an_empty_folder_builds_on_the_packaged_calibration(tmp_path, capsys):
    """A folder without h200.json got a file holding comm alone, which plan and validate refused (no kernel
    terms); it now starts from the packaged h200.json, as calibrate --refit does."""
    out = tmp_path / "empty"
    out.mkdir()
    csv = synthetic_csv(tmp_path / "comm-h200.csv")
    assert main(["calibrate", "--comm-refit", str(csv), "--out", str(out)]) == 0
    packaged = json.loads((ROOT / "simulator" / "presets" / "calibration" / "h200.json").read_text())
    report = json.loads((out / "h200.json").read_text())
    assert {k: v for k, v in report.items() if k != "comm"} == {k: v for k, v in packaged.items() if k != "comm"}
    assert set(report["comm"]) == {"source", "command", *COLLECTIVES}
    assert P.load("calibration", str(out / "h200.json")).calibrated  # the planner reads it
