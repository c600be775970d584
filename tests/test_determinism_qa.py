"""Determinism QA: every random thing takes a seed, and the same inputs give the same outputs.

The random policy draws from numba's Mersenne Twister, whose seed is 32 bits: ``--seed 4294967297``
replayed exactly as ``--seed 1`` (the high bits were dropped), so two seeds silently named the same
draws. Seeds are now refused past 2**32 - 1 wherever a replay takes one (the CLI, the API, a sweep
grid). The other tests pin outputs that must not move with the worker count or the hash seed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from simulator.errors import HisparseError
from simulator.replay import ReplayConfig, replay
from simulator.trace.format import write_trace
from simulator.trace.stream import Stream, TraceMeta
from tests.fuzzing import assert_clean_error, run_cli
from tests.helpers import random_stream

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def small_trace(tmp_path_factory) -> str:
    """Four streams (2 requests x 2 layers) of k = 16: small enough for every policy in milliseconds."""
    path = tmp_path_factory.mktemp("det") / "small.hst"
    rng = np.random.default_rng(7)
    streams = [random_stream(rng, steps=60, k=16, ctx0=80, request=r, layer=layer)
               for r in range(2) for layer in range(2)]
    write_trace(path, TraceMeta(k=16, source={"kind": "test"}), streams)
    return str(path)


@pytest.mark.parametrize("command", ["replay", "mrc"])
@pytest.mark.parametrize("seed", [2**32, 2**32 + 1, 2**63 - 1])
def test_a_seed_past_32_bits_is_refused_not_folded_onto_a_smaller_one(small_trace, capsys, command, seed):
    """Before: exit 0, and --seed 4294967297 gave the misses of --seed 1."""
    code, out, err = run_cli([command, small_trace, "--policy", "random", "--seed", str(seed), "--quiet"], capsys)
    assert_clean_error(code, err, "--seed", str(seed), "2**32 - 1")
    assert out == ""


def test_the_largest_seed_still_runs_and_the_seed_moves_the_draws():
    stream = Stream(0, 0, 80 + np.arange(60, dtype=np.int64),
                    random_stream(np.random.default_rng(1), steps=60, k=16, ctx0=80).indices)
    runs = {s: int(replay(stream, ReplayConfig(policy="random", buffer=20, seed=s), workers=1).records[0]["misses"])
            for s in (0, 1, 2, 3, 2**32 - 1)}
    assert len(set(runs.values())) > 1  # the seed reaches the generator


@pytest.mark.parametrize("seed", [-1, 2**32, 2**64, 1.5, "3"])
def test_the_replay_api_refuses_a_seed_the_generator_cannot_take(seed):
    """Before: ReplayConfig(seed=-1) replayed as seed 2**32 - 1, seed=2**32 as seed 0 (numba casts to uint32)."""
    with pytest.raises(HisparseError, match="seed"):
        ReplayConfig(policy="random", buffer=32, seed=seed)


def test_a_sweep_grid_seed_past_32_bits_is_refused_before_any_point(small_trace, tmp_path, capsys):
    grid = tmp_path / "g.toml"
    grid.write_text(f'kind = "replay"\n[fixed]\ntrace = "{small_trace}"\npolicy = "random"\nbuffer = 20\n'
                    "[grid]\nseed = [1, 4294967297]\n")
    out_dir = tmp_path / "out"
    code, out, err = run_cli(["sweep", str(grid), "--no-ray", "--quiet", "--out", str(out_dir)], capsys)
    assert_clean_error(code, err, str(grid), "seed", "4294967297", "2**32 - 1")
    assert not out_dir.exists()


def test_per_step_misses_do_not_move_with_the_worker_count(small_trace, tmp_path, capsys):
    """The threads finish streams in any order; the per-step table and the summary keep stream order."""
    outs = []
    for workers in (1, 3):
        csv = tmp_path / f"w{workers}.csv"
        code, out, err = run_cli(["replay", small_trace, "--policy", "random,sieve,arc,salru,opt", "--ways", "4",
                                  "--buffer", "20,24", "--seed", "9", "--workers", str(workers), "--json", "--quiet",
                                  "--out", str(csv)], capsys)
        assert code == 0, err
        outs.append((out, csv.read_bytes()))
    assert outs[0] == outs[1]


def test_outputs_do_not_move_with_the_hash_seed(tmp_path, capsys):
    """trace gen and a random-policy replay here and in a fresh process under another PYTHONHASHSEED:
    the same bytes (a set or dict order leaking into an output would show here)."""
    def argv(out: Path) -> list[list[str]]:
        return [["trace", "gen", "--preset", "bursty", "--steps", "8", "--layers", "2", "--requests", "1",
                 "--topk", "128", "--ctx0", "256", "--seed", "3", "--quiet", "--out", str(out / "g.hst")],
                ["replay", str(out / "g.hst"), "--policy", "random,lru", "--buffer", "160", "--seed", "5", "--quiet",
                 "--json", "--out", str(out / "m.csv")]]

    here, there = tmp_path / "here", tmp_path / "there"
    here.mkdir()
    there.mkdir()
    printed = []
    for args in argv(here):
        code, out, err = run_cli(args, capsys)
        assert code == 0, err
        printed.append(out)
    script = f"import sys; from simulator.cli import main\nfor a in {argv(there)!r}:\n    assert main(a) == 0\n"
    other = "2" if os.environ.get("PYTHONHASHSEED") == "1" else "1"
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, timeout=120,
                          env={**os.environ, "PYTHONHASHSEED": other})
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode() == "".join(printed)
    for name in ("g.hst", "m.csv"):
        assert (here / name).read_bytes() == (there / name).read_bytes(), name


def test_each_stream_of_a_random_replay_draws_its_own_victims():
    """The same stream content as (request, layer) 0/0, 0/1 and 5/3: one seed for every stream gave
    each the same draws, so identical content missed identically on every layer (a correlation no
    average over layers removes). Each stream now seeds from (seed, request, layer): the copies
    differ, each copy's misses stay the same whatever else is replayed beside it and in which order."""
    base = random_stream(np.random.default_rng(2), steps=60, k=16, ctx0=80)
    copies = [Stream(r, layer, base.ctx_len, base.indices) for r, layer in ((0, 0), (0, 1), (5, 3))]
    cfg = ReplayConfig(policy="random", buffer=20, seed=7)

    def misses(streams):
        res = replay(streams, cfg, workers=1, per_step=True)
        return {(s.request, s.layer): int(res.misses(request=s.request, layer=s.layer).sum()) for s in streams}

    together = misses(copies)
    assert len(set(together.values())) > 1
    assert misses(copies[::-1]) == together
    assert all(misses([s]) == {(s.request, s.layer): together[(s.request, s.layer)]} for s in copies)
