"""``hisparse replay`` and ``hisparse mrc`` from the command line."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from simulator.cli import main

TRACE = "traces/synthetic-dsa-like.hst"


@pytest.fixture(scope="module")
def small_trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("t") / "small.hst"
    assert main(["trace", "gen", "--steps", "120", "--layers", "2", "--requests", "2", "--topk", "128",
                 "--ctx0", "2000", "--quiet", "--out", str(path)]) == 0
    return str(path)


def test_replay_json_records(small_trace, capsys):
    assert main(["replay", small_trace, "--policy", "lru,opt", "--buffer", "128,256", "--json", "--quiet"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 4
    for row in rows:
        assert set(row) == {"policy", "buffer", "semantics", "streams", "steps", "accesses", "misses", "miss_ratio"}
        assert row["streams"] == 4 and row["steps"] == 480 and row["semantics"] == "batched"
        assert row["miss_ratio"] == pytest.approx(row["misses"] / row["accesses"])
    by = {(r["policy"], r["buffer"]): r["misses"] for r in rows}
    assert by["opt", 256] <= by["lru", 256] <= by["lru", 128]


def test_replay_per_step_parquet_and_plot(small_trace, tmp_path, capsys):
    out, png = tmp_path / "steps.parquet", tmp_path / "misses.png"
    assert main(["replay", small_trace, "--policy", "lru,fifo", "--buffer", "256", "--out", str(out),
                 "--plot", str(png), "--quiet"]) == 0
    df = pd.read_parquet(out)
    assert list(df.columns) == ["request", "layer", "step", "ctx_len", "policy", "buffer", "misses"]
    assert len(df) == 2 * 4 * 120
    summary = capsys.readouterr().out
    assert str(df[df.policy == "lru"].misses.sum()) in summary
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_replay_bad_options(small_trace, capsys):
    assert main(["replay", small_trace, "--policy", "nope"]) == 2
    assert "unknown policy 'nope'" in capsys.readouterr().err
    assert main(["replay", small_trace, "--buffer", "64"]) == 2
    assert "smaller than k = 128" in capsys.readouterr().err
    assert main(["replay", small_trace, "--out", "x.txt"]) == 2
    assert ".parquet or .csv" in capsys.readouterr().err


def test_replay_npy_input(tmp_path, capsys):
    import numpy as np

    from simulator.trace import open_trace

    s = open_trace(TRACE).read((0, 0))
    path = tmp_path / "one.npy"
    np.save(path, s.indices)
    assert main(["replay", str(path), "--ctx0", str(int(s.ctx_len[0])), "--json", "--quiet"]) == 0
    from_npy = json.loads(capsys.readouterr().out)[0]["misses"]
    from simulator.replay import ReplayConfig, replay_stream

    assert from_npy == replay_stream(s, ReplayConfig()).sum()


def test_mrc_cli_json_csv_plot(small_trace, tmp_path, capsys):
    csv, png = tmp_path / "mrc.csv", tmp_path / "mrc.png"
    assert main(["mrc", small_trace, "--policy", "lru,opt", "--max-buffer", "384", "--step", "64", "--json",
                 "--out", str(csv), "--plot", str(png)]) == 0
    out = json.loads(capsys.readouterr().out)
    from simulator import native

    one_pass = native.available()  # OPT's stack depths are in C; without it, OPT replays size by size
    assert out["methods"] == {"lru": "per-size", "opt": "one-pass" if one_pass else "per-size"}
    curve = pd.read_csv(csv)
    grid = [128, 192, 256, 320, 384]
    lru = curve[curve.policy == "lru"].set_index("buffer").misses
    opt = curve[curve.policy == "opt"].set_index("buffer").misses
    assert sorted(lru.index) == grid
    assert sorted(opt.index) == (list(range(128, 385)) if one_pass else grid)
    assert (opt[grid] <= lru[grid]).all()
    assert png.stat().st_size > 1000
    assert main(["mrc", small_trace, "--semantics", "sequential", "--initial", "empty", "--max-buffer", "300",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["methods"] == {"lru": "one-pass"} and len(out["curve"]) == 300 - 128 + 1


def test_a_command_builds_only_its_own_parsers_and_they_are_the_full_ones():
    """`hisparse replay ...` skips the other commands' imports (start-up is part of the replay
    speed target): COMMANDS names every command, and each command's parser built alone prints
    the same help as in the whole command line."""
    import argparse

    from simulator.cli import COMMANDS, build_parser

    def commands(parser):
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        return sub.choices

    full = commands(build_parser())
    assert list(full) == list(COMMANDS)
    for name in COMMANDS:
        alone = commands(build_parser(name))
        assert set(alone) == {other for other, add in COMMANDS.items() if add is COMMANDS[name]}
        assert alone[name].format_help() == full[name].format_help(), name


def test_mrc_steps_salru_in_whole_shards(capsys):
    """--step 10 from 128 to 200 with --ways 32: salru's sizes were dropped to 128 alone; its grid
    is whole shards, said on stderr."""
    argv = ["mrc", "traces/smollm2-gpl3-k128.hst", "--policy", "salru,lru", "--min-buffer", "128",
            "--max-buffer", "200", "--step", "10", "--quiet", "--json"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    curve = json.loads(captured.out)["curve"]
    assert [r["buffer"] for r in curve if r["policy"] == "salru"] == [128, 160, 192]
    assert [r["buffer"] for r in curve if r["policy"] == "lru"] == [*range(128, 200, 10), 200]
    assert "salru: sizes in whole shards of --ways 32: 128 to 192 in steps of 32" in captured.err
    assert main([*argv[:4], "--min-buffer", "130", "--max-buffer", "150", "--quiet"]) == 2
    assert "no size from 130 to 150 is a whole number of shards of --ways 32" in capsys.readouterr().err


@pytest.mark.parametrize("extra, says", [
    (["--ways", "7"], "# --ways 7 is unused: it applies to salru"),
    (["--seed", "5"], "# --seed 5 is unused: it applies to random"),
    (["--window", "9"], "# --window 9 is unused: it applies to --plot"),
    (["--recover"], "# --recover is unused: it applies to .hst traces"),
    (["--mtp-steps", "2"], "# --mtp-steps 2 is unused"),
])
def test_an_option_given_that_nothing_uses_gets_a_note(tmp_path, capsys, extra, says):
    path = tmp_path / "t.npy"
    np.save(path, np.array([[0, 1, 2], [0, 1, 3], [0, 1, 2]]))
    assert main(["replay", str(path), "--ctx0", "10", "--buffer", "3", "--quiet", *extra]) == 0
    assert says in capsys.readouterr().err
    # the default, or an option that applies: no note
    used = {"--ways": ["--policy", "salru", "--buffer", "7"], "--seed": ["--policy", "random"],
            "--window": ["--plot", str(tmp_path / "p.png")], "--recover": None, "--mtp-steps": None}[extra[0]]
    assert main(["replay", str(path), "--ctx0", "10", "--buffer", "3", "--quiet"]) == 0
    assert "unused" not in capsys.readouterr().err
    if used:
        assert main(["replay", str(path), "--ctx0", "10", "--buffer", "3", "--quiet", *extra, *used]) == 0
        assert "unused" not in capsys.readouterr().err


def test_replay_json_is_a_list_of_records_for_an_indexshare_trace_too(tmp_path, capsys):
    out = tmp_path / "is.hst"
    assert main(["trace", "gen", "--steps", "8", "--layers", "8", "--requests", "1", "--topk", "16", "--ctx0", "256",
                 "--index-share", "4:3", "--out", str(out), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["replay", str(out), "--buffer", "16,32", "--policy", "lru,fifo", "--quiet", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert isinstance(rows, list) and [(r["policy"], r["buffer"]) for r in rows] == \
        [("lru", 16), ("lru", 32), ("fifo", 16), ("fifo", 32)]
    for r in rows:
        assert [g["group"] for g in r["groups"]] == ["anchor", "shared"]
        assert sum(g["misses"] for g in r["groups"]) == r["misses"]
        assert sum(g["accesses"] for g in r["groups"]) == r["accesses"]
    assert main(["replay", str(out), "--buffer", "16", "--index-share", "1:0", "--quiet", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)  # every layer an anchor: one group, the same list shape
    assert [g["group"] for g in row["groups"]] == ["anchor"] and row["groups"][0]["misses"] == row["misses"]
