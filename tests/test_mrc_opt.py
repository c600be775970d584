"""OPT miss-ratio curves in one pass: the stack depths equal per-size replays at every size.

The engine (simulator/replay/step.py with policies/opt.py) defines OPT; ``opt_stack.py`` is the
plain one-pass reference and ``native.opt_stack_hist`` its C twin. Each is held to per-size
replays: golden counts on a bundled trace, and random small streams under both semantics, both
initial buffers and the reserved newest slot on and off.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from simulator import native
from simulator.replay import ReplayConfig, replay
from simulator.replay.engine import replay_policy
from simulator.replay.mrc import miss_ratio_curve, one_pass_applies
from simulator.replay.opt_stack import misses_at, opt_stack_histogram
from simulator.trace import open_trace
from tests.fuzzing import fuzz_settings
from tests.helpers import random_stream

needs_c = pytest.mark.skipif(not native.available(), reason="HISPARSE_NATIVE=0 / not built: OPT's one pass is in C")

GEMMA = "traces/gemma3-argparse-k256.hst"  # 3 layers x 512 steps, k 256, every ctx_len >= 16384
SIZES = (256, 300, 512, 777, 1024)
# OPT misses of the whole trace at SIZES, from per-size replays (the C replay paths, themselves
# held bit for bit to the numba engine in tests/test_native.py), 2026-12-06.
GOLDEN = {
    ("batched", "prefix"): [195334, 155423, 97027, 68484, 52689],
    ("batched", "empty"): [195339, 155435, 97051, 68527, 52801],
    ("sequential", "prefix"): [137521, 124788, 89606, 64676, 50977],
    ("sequential", "empty"): [137533, 124800, 89632, 64731, 51088],
}


def _engine_misses(stream, sizes, *, reserve, prefix, batched):
    return [int(replay_policy("opt", stream.indices, stream.ctx_len, int(b), reserve=reserve, prefix=prefix,
                              batched=batched, seed=0).misses.sum()) for b in sizes]


def _c_hist(stream, *, reserve, prefix, batched, min_size, max_size):
    idx = np.ascontiguousarray(stream.indices, dtype=np.int32)
    hist = np.zeros(max_size + 1, dtype=np.int64)
    native._native.opt_stack_hist(idx, *idx.shape, np.ascontiguousarray(stream.ctx_len, dtype=np.int64), reserve,
                                  prefix, batched, min_size, max_size, hist)
    return hist


@needs_c
@pytest.mark.parametrize(("semantics", "initial"), list(GOLDEN))
def test_one_pass_opt_curve_on_a_bundled_trace_equals_per_size_replays(semantics, initial):
    src = open_trace(GEMMA)
    cfg = ReplayConfig(policy="opt", semantics=semantics, initial=initial)
    curve, method = miss_ratio_curve(src, cfg, range(256, 1025), k=256)
    assert method == "one-pass" and curve["buffer"].tolist() == list(range(256, 1025))
    by_size = curve.set_index("buffer")["misses"]
    assert [int(by_size[b]) for b in SIZES] == GOLDEN[(semantics, initial)]
    # every 61st size replayed size by size too
    sizes = list(range(256, 1025, 61))
    per_size = replay(src, [ReplayConfig(policy="opt", buffer=b, semantics=semantics, initial=initial)
                            for b in sizes]).records
    assert [int(by_size[b]) for b in sizes] == [r["misses"] for r in per_size]
    assert (np.diff(curve["misses"]) <= 0).all()  # inclusion: a larger buffer never misses more


def _small_stream(seed, k, steps, max_size, overlap, ragged):
    """A random stream whose every ctx_len is above ``max_size`` (no step takes the fast path), and its rng."""
    rng = np.random.default_rng(seed)
    return rng, random_stream(rng, steps=steps, k=k, ctx0=max_size + 1 + int(rng.integers(0, 8)), overlap=overlap,
                              ragged=ragged)


@given(seed=st.integers(0, 2**32 - 1), k=st.integers(1, 6), steps=st.integers(1, 14), extra=st.integers(0, 10),
       overlap=st.floats(0, 1), ragged=st.booleans())
@fuzz_settings(100)
def test_reference_stack_depths_equal_per_size_engine_replays(seed, k, steps, extra, overlap, ragged):
    max_size = k + extra
    _, s = _small_stream(seed, k, steps, max_size, overlap, ragged)
    for reserve, prefix, batched in itertools.product((False, True), repeat=3):
        sizes = np.arange(k if batched else 1, max_size + 1)
        hist = opt_stack_histogram(s.indices, s.ctx_len, reserve=reserve, prefix=prefix, batched=batched,
                                   max_size=max_size)
        assert list(misses_at(hist, sizes)) == _engine_misses(s, sizes, reserve=reserve, prefix=prefix,
                                                              batched=batched), (reserve, prefix, batched)


@needs_c
@given(seed=st.integers(0, 2**32 - 1), k=st.integers(1, 8), steps=st.integers(1, 24), extra=st.integers(0, 16),
       overlap=st.floats(0, 1), ragged=st.booleans())
@fuzz_settings(150)
def test_c_stack_depths_equal_the_reference(seed, k, steps, extra, overlap, ragged):
    """Bit for bit, with the depths above a random smallest size kept as one set (hist[min_size])."""
    max_size = k + extra
    rng, s = _small_stream(seed, k, steps, max_size, overlap, ragged)
    for reserve, prefix, batched in itertools.product((False, True), repeat=3):
        lo = int(rng.integers(k if batched else 1, max_size + 1))
        ref = opt_stack_histogram(s.indices, s.ctx_len, reserve=reserve, prefix=prefix, batched=batched,
                                  max_size=max_size, min_size=lo)
        got = _c_hist(s, reserve=reserve, prefix=prefix, batched=batched, min_size=lo, max_size=max_size)
        assert got.tolist() == ref.tolist(), (reserve, prefix, batched, lo)


@needs_c
def test_c_stack_depths_equal_per_size_replays_on_longer_streams():
    """Streams long and wide enough for deep stacks, the tail's tree and the core's heap to work."""
    rng = np.random.default_rng(7)
    for trial in range(6):
        k, lo, hi = 24, 24 + 8 * trial, 150
        s = random_stream(rng, steps=120, k=k, ctx0=hi + 50, overlap=0.3 + 0.1 * trial, ragged=trial % 2 == 1)
        for reserve, prefix, batched in itertools.product((False, True), repeat=3):
            sizes = np.arange(lo, hi + 1, 7)
            hist = _c_hist(s, reserve=reserve, prefix=prefix, batched=batched, min_size=lo, max_size=hi)
            assert list(misses_at(hist, sizes)) == _engine_misses(s, sizes, reserve=reserve, prefix=prefix,
                                                                  batched=batched), (trial, reserve, prefix, batched)


def test_one_pass_needs_every_context_above_the_largest_size():
    opt = ReplayConfig(policy="opt", semantics="sequential", initial="prefix")
    assert one_pass_applies(opt, 1000, 999) == native.available()
    assert not one_pass_applies(opt, 1000, 1000)  # the fast path at size 1000 resets that buffer
    assert not one_pass_applies(ReplayConfig(policy="lfu"), 1000, 10)


@needs_c
def test_fast_path_sizes_fall_back_to_per_size_replays():
    rng = np.random.default_rng(3)
    streams = [random_stream(rng, steps=30, k=8, ctx0=40)]
    cfg = ReplayConfig(policy="opt")
    curve, method = miss_ratio_curve(streams, cfg, [8, 16, 60], k=8)
    assert method == "per-size"
    assert curve["misses"].tolist() == _engine_misses(streams[0], [8, 16, 60], reserve=True, prefix=True,
                                                      batched=True)


@needs_c
def test_c_refuses_a_step_that_selects_a_position_twice_and_bad_sizes():
    idx = np.array([[3, 4], [5, 5]], dtype=np.int32)
    ctx = np.array([10, 11], dtype=np.int64)
    hist = np.zeros(5, dtype=np.int64)
    with pytest.raises(ValueError, match="step 1"):
        native._native.opt_stack_hist(idx, 2, 2, ctx, False, False, True, 2, 4, hist)
    with pytest.raises(ValueError, match="bad size"):
        native._native.opt_stack_hist(idx, 2, 2, ctx, False, False, True, 5, 4, hist)
    with pytest.raises(ValueError, match="more entries than the smallest size"):
        native._native.opt_stack_hist(np.array([[3, 4]], dtype=np.int32), 1, 2, ctx[:1], False, False, True, 1, 4,
                                      hist)


def test_mrc_command_reports_opt_one_pass(capsys):
    import json

    from simulator.cli import main

    assert main(["mrc", GEMMA, "--policy", "opt", "--max-buffer", "400", "--json", "--quiet"]) == 0
    out = json.loads(capsys.readouterr().out)
    want = "one-pass" if native.available() else "per-size"
    assert out["methods"] == {"opt": want}
    by_size = {r["buffer"]: r["misses"] for r in out["curve"]}
    assert by_size[256] == GOLDEN[("batched", "prefix")][0]
    assert len(by_size) == (400 - 256 + 1 if native.available() else len(range(256, 400, 32)) + 1)
    grid = [256, 288, 384, 400]  # sizes both methods print
    per_size = replay(open_trace(GEMMA), [ReplayConfig(policy="opt", buffer=b) for b in grid]).records
    assert [by_size[b] for b in grid] == [r["misses"] for r in per_size]


@pytest.mark.parametrize("extra", [["--policy", "opt,lru", "--vs", "lru"],
                                   ["--policy", "lru,opt", "--vs", "opt", "--semantics", "sequential", "--initial",
                                    "empty", "--max-buffer", "300"],
                                   ["--policy", "fifo", "--max-buffer", "512"]])
def test_mrc_table_is_pandas_layout_without_pandas(tmp_path, extra):
    """`hisparse mrc` prints its curve as pandas' to_string did, without importing pandas (a third
    of a second): the same rows, read back from --out, laid out by pandas itself, read the same."""
    import subprocess
    import sys
    from pathlib import Path

    import pandas as pd

    probe = ("import sys\nfrom simulator.cli import main\n"
             f"code = main(['mrc', {GEMMA!r}, '--quiet', *{extra!r}])\n"
             "sys.stdout.flush()\nprint('PANDAS', 'pandas' in sys.modules)\nsys.exit(code)")
    root = Path(__file__).parent.parent
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=root, check=True).stdout
    text, _, loaded = out.rpartition("PANDAS ")
    assert loaded.strip() == "False"
    csv = tmp_path / "curve.csv"
    subprocess.run([sys.executable, "-m", "simulator.cli", "mrc", GEMMA, "--quiet", *extra, "--out", str(csv)],
                   capture_output=True, text=True, cwd=root, check=True)
    table = pd.read_csv(csv)
    lines = text.rstrip("\n").split("\n")
    comments = [line for line in lines if line.startswith("# ")]
    assert comments and lines[:len(comments)] == comments
    step = 32  # the default grid step, k / 8
    # a long table thins each one-pass curve to the grid and its last size; a per-size curve is its grid
    per_size = [line[2:].split(": ")[0] for line in comments if line.endswith(": per-size")]
    shown = table if len(table) <= 60 else table[((table["buffer"] - 256) % step == 0)
                                                 | (table["buffer"] == table["buffer"].max())
                                                 | table["policy"].isin(per_size)]
    assert "\n".join(lines[len(comments):]) == shown.to_string(index=False, float_format=lambda v: f"{v:.4f}")


def test_curve_penalty_follows_pandas_division():
    """hit_penalty and miss_x as the pandas columns gave them: NaN without a baseline size, inf
    over a baseline with no misses, NaN for 0 / 0."""
    import pandas as pd

    from simulator.commands.replay import _add_curve_penalty

    rows = [{"policy": p, "buffer": b, "misses": m, "miss_ratio": m / 10}
            for p, b, m in [("a", 1, 0), ("a", 2, 4), ("b", 1, 3), ("b", 2, 0), ("b", 3, 1), ("a", 4, 0),
                            ("b", 4, 0)]]
    table = pd.DataFrame(rows)
    base = table[table["policy"] == "a"].set_index("buffer")
    want_pen = (table["miss_ratio"] - table["buffer"].map(base["miss_ratio"])).tolist()
    want_x = (table["misses"] / table["buffer"].map(base["misses"])).tolist()
    _add_curve_penalty(rows, "a")
    assert np.array_equal([r["hit_penalty"] for r in rows], want_pen, equal_nan=True)
    assert np.array_equal([r["miss_x"] for r in rows], want_x, equal_nan=True)
