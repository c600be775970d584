"""QA pass on ``hisparse replay`` and ``hisparse mrc``: hand-computed misses on tiny traces, seeds,
and the defects it found (the mrc table, --vs baselines, huge sizes, short plots, option errors)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from simulator.cli import main
from simulator.trace.format import write_trace
from simulator.trace.stream import Stream, TraceMeta

# docs/replay-engine.md's example: k = 1, --ctx0 3, steps [0], [], [3], [0] (ctx_len 3, 4, 5, 6).
DOC_STEPS = [[0], [-1], [3], [0]]
# Misses by hand (the newest token, ctx_len - 1, is reserved; ctx_len <= buffer is the fast path,
# which leaves the buffer holding [0, buffer), 0 oldest):
# - 1 slot: [0] at step 0, 0 hits; 3 evicts 0 (miss); 0 evicts 3 (miss): 2 for lru, fifo, opt.
# - 2 slots: [0, 1] at step 0, 0 hits; lru evicts 1 for 3 and hits 0 (1); fifo evicts 0 for 3
#   (0 is first in) and misses 0 again (2); opt evicts 1 (never read again) (1).
# - 3 slots: step 0 fast; [0, 1, 2] from step 1; lru evicts 0 for 3, then 1 for 0 (2); opt evicts
#   1 or 2 for 3 and hits 0 (1).
# - 4 slots and more: fast until step 2 (ctx 5): [0..3] holds 3 and 0: nothing misses.
# none: every read but the newest (3); static-prefix: pins [0, b): 3 misses below 4 slots (1).
DOC_MISSES = {
    1: {"lru": 2, "fifo": 2, "opt": 2, "none": 3, "static-prefix": 1},
    2: {"lru": 1, "fifo": 2, "opt": 1, "none": 3, "static-prefix": 1},
    3: {"lru": 2, "fifo": 2, "opt": 1, "none": 3, "static-prefix": 1},
    4: {"lru": 0, "fifo": 0, "opt": 0, "none": 3, "static-prefix": 0},
    50: {"lru": 0, "fifo": 0, "opt": 0, "none": 3, "static-prefix": 0},
}


@pytest.fixture(scope="module")
def doc_traces(tmp_path_factory):
    """The docs' example as a .npy array and as a .hst file (the C and numba paths read both)."""
    folder = tmp_path_factory.mktemp("doc")
    rows = np.array(DOC_STEPS, dtype=np.int32)
    np.save(folder / "doc.npy", rows)
    write_trace(folder / "doc.hst", TraceMeta(k=1), [Stream(0, 0, np.arange(3, 7, dtype=np.int64), rows)])
    return str(folder / "doc.npy"), str(folder / "doc.hst")


def _json(capsys, argv: list[str]):
    assert main(argv) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("native", ["1", "0"])
def test_replay_misses_equal_the_hand_count_on_the_docs_example(doc_traces, capsys, monkeypatch, native):
    monkeypatch.setenv("HISPARSE_NATIVE", native)
    policies = "lru,fifo,opt,none,static-prefix"
    for path in doc_traces:
        ctx0 = ["--ctx0", "3"] if path.endswith(".npy") else []
        rows = _json(capsys, ["replay", path, *ctx0, "--policy", policies, "--buffer", "1,2,3,4,50", "--json",
                              "--quiet"])
        got = {(r["buffer"], r["policy"]): r["misses"] for r in rows}
        assert got == {(b, p): m for b, per in DOC_MISSES.items() for p, m in per.items()}, path
        assert {r["accesses"] for r in rows} == {3}


def test_mrc_per_size_curve_equals_the_hand_count(doc_traces, capsys):
    npy, _ = doc_traces
    out = _json(capsys, ["mrc", npy, "--ctx0", "3", "--policy", "lru,opt", "--min-buffer", "1", "--max-buffer", "4",
                         "--step", "1", "--json", "--quiet"])
    got = {(r["policy"], r["buffer"]): r["misses"] for r in out["curve"]}
    assert got == {(p, b): DOC_MISSES[b][p] for p in ("lru", "opt") for b in (1, 2, 3, 4)}


def test_random_policy_is_reproducible_for_a_seed_and_moves_with_it(tmp_path, capsys):
    # 8 positions read 3 at a time through 5 slots: the victims the seed draws decide the misses
    rng = np.random.default_rng(0)
    rows = np.stack([rng.permutation(8)[:3] for _ in range(200)]).astype(np.int32)
    np.save(tmp_path / "random.npy", rows)
    base = ["replay", str(tmp_path / "random.npy"), "--ctx0", "9", "--policy", "random", "--buffer", "5", "--json",
            "--quiet"]
    runs = {(seed, workers): _json(capsys, [*base, "--seed", str(seed), "--workers", str(workers)])[0]["misses"]
            for seed in range(4) for workers in (1, 2)}
    assert all(runs[s, 1] == runs[s, 2] for s in range(4))
    assert len({runs[s, 1] for s in range(4)}) > 1


def _long_trace(path, k: int = 4, steps: int = 80, ctx0: int = 140) -> str:
    """One stream whose every ctx_len is above the sizes the tests ask for (every size per-size)."""
    rng = np.random.default_rng(1)
    rows = np.stack([rng.choice(ctx0 + t - 1, size=k, replace=False) for t in range(steps)]).astype(np.int32)
    write_trace(path, TraceMeta(k=k), [Stream(0, 0, ctx0 + np.arange(steps, dtype=np.int64), rows)])
    return str(path)


def test_mrc_table_prints_every_size_of_a_per_size_curve(tmp_path, capsys):
    # 75 rows (> 60): the table thinned every curve to sizes lo + i x step, which dropped lru's last
    # size (131) and all but every third of salru's shard sizes (4, 8, ..., 128)
    trace = _long_trace(tmp_path / "long.hst")
    argv = ["mrc", trace, "--policy", "salru,lru", "--ways", "4", "--min-buffer", "4", "--max-buffer", "131",
            "--step", "3", "--quiet"]
    curve = _json(capsys, [*argv, "--json"])["curve"]
    assert len(curve) > 60
    assert main(argv) == 0
    table = [line.split() for line in capsys.readouterr().out.splitlines() if not line.startswith(("#", "policy"))]
    assert sorted((p, int(b)) for p, b, *_ in table) == sorted((r["policy"], r["buffer"]) for r in curve)


def test_mrc_table_thins_a_one_pass_curve_to_the_grid_and_its_last_size(tmp_path, capsys):
    trace = _long_trace(tmp_path / "long.hst")
    argv = ["mrc", trace, "--policy", "opt", "--min-buffer", "4", "--max-buffer", "131", "--step", "10", "--quiet"]
    assert len(_json(capsys, [*argv, "--json"])["curve"]) == 128  # one pass: every size
    assert main(argv) == 0
    shown = [int(line.split()[1]) for line in capsys.readouterr().out.splitlines()
             if line.split()[0] == "opt"]
    assert shown == [*range(4, 131, 10), 131]


def test_mrc_vs_baseline_is_replayed_at_the_other_curves_sizes(tmp_path, capsys):
    # salru's sizes are whole shards (4, 8, ...), lru's grid 4, 7, 10, ...: most salru rows had
    # hit_penalty and miss_x null
    trace = _long_trace(tmp_path / "long.hst")
    out = _json(capsys, ["mrc", trace, "--policy", "salru", "--vs", "lru", "--ways", "4", "--min-buffer", "4",
                         "--max-buffer", "40", "--step", "3", "--json", "--quiet"])
    salru = [r for r in out["curve"] if r["policy"] == "salru"]
    lru = {r["buffer"]: r for r in out["curve"] if r["policy"] == "lru"}
    assert [r["buffer"] for r in salru] == list(range(4, 41, 4))
    replayed = {r["buffer"]: r for r in _json(capsys, ["replay", trace, "--buffer", "8,16,40", "--json", "--quiet"])}
    for r in salru:
        assert r["hit_penalty"] == pytest.approx(r["miss_ratio"] - lru[r["buffer"]]["miss_ratio"])
        assert r["miss_x"] is None or r["miss_x"] == pytest.approx(r["misses"] / lru[r["buffer"]]["misses"])
        if r["buffer"] in replayed:  # the added sizes are the baseline's own replay at that size
            assert lru[r["buffer"]]["misses"] == replayed[r["buffer"]]["misses"]
    assert set(range(4, 41, 3)) <= set(lru)  # its own grid is kept


def test_mrc_refuses_a_huge_smallest_size_past_the_context_like_replay(doc_traces, capsys):
    npy, _ = doc_traces
    huge = str(2**21)
    for argv, option in ((["mrc", npy, "--ctx0", "3", "--min-buffer", huge, "--max-buffer", huge], "--min-buffer"),
                         (["replay", npy, "--ctx0", "3", "--buffer", huge], "--buffer")):
        assert main([*argv, "--quiet"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"hisparse: error: {option} {huge}: larger than the trace's largest context (6)")
        assert "Traceback" not in err


def test_replay_plot_of_a_trace_shorter_than_the_window_draws_its_steps(doc_traces, tmp_path, capsys):
    import pandas as pd

    from simulator.replay.plots import plot_rolling_misses

    npy, _ = doc_traces
    out, png = tmp_path / "steps.csv", tmp_path / "misses.png"
    assert main(["replay", npy, "--ctx0", "3", "--buffer", "2", "--policy", "lru,none", "--out", str(out),
                 "--plot", str(png), "--quiet"]) == 0
    assert "--window 100 is not shorter than the trace's 3 plotted step(s)" in capsys.readouterr().err
    assert png.read_bytes()[:4] == b"\x89PNG"
    fig = plot_rolling_misses(pd.read_csv(out), None, window=100)
    try:
        for ax in fig.axes:
            (line,) = ax.lines  # one policy per panel: steps 1..3 (step 0 is the cold start), not one point
            assert list(line.get_xdata()) == [1, 2, 3]
        assert "1-step rolling mean" in fig.axes[0].get_ylabel()
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)


def test_a_long_enough_trace_keeps_the_window_it_was_given(tmp_path, capsys):
    trace = _long_trace(tmp_path / "long.hst")
    assert main(["replay", trace, "--buffer", "8", "--plot", str(tmp_path / "p.png"), "--window", "10",
                 "--quiet"]) == 0
    assert "--window" not in capsys.readouterr().err


@pytest.mark.parametrize("extra, says", [
    (["--policy", "sglang-clock", "--mtp-steps", "2", "--semantics", "sequential"],
     "--policy sglang-clock, --mtp-steps 2, --semantics sequential: "),
    (["--policy", "salru", "--buffer", "6"], "--policy salru, --buffer 6, --ways 32: "),
])
def test_a_config_the_engine_refuses_names_the_options(doc_traces, capsys, extra, says):
    npy, _ = doc_traces
    assert main(["replay", npy, "--ctx0", "3", "--quiet", *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"hisparse: error: {says}") and err.count("\n") == 1
