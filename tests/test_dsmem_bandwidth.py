"""CPU checks of benchmarks/dsmem_bandwidth.py's options (the timing itself needs a Hopper GPU)."""

from __future__ import annotations

import argparse

import pytest

from benchmarks import dsmem_bandwidth as db


def _args(**kw) -> argparse.Namespace:
    base = dict(modes=["both"], chunks=[1024], clusters=[1], round_bytes=db.TILE_HALF_BYTES, rounds=400, pings=100)
    return argparse.Namespace(**{**base, **kw})


def test_the_default_round_is_the_crossover_tile_half_in_whole_copies():
    assert db.TILE_HALF_BYTES == 36_864 and db.check(_args()) is None
    assert db.check(_args(chunks=[9216])) is None  # one copy per warp


@pytest.mark.parametrize("kw, says", [
    (dict(chunks=[1000]), "multiple of 16"), (dict(chunks=[2048 + 16]), "whole copies"),
    (dict(round_bytes=120_000), "two buffers"), (dict(round_bytes=116_208), "116,192"), (dict(rounds=2), "--rounds"),
    (dict(modes=["ping"], pings=0), "--pings must be >= 1"),
    (dict(modes=["sideways"]), "--modes"), (dict(clusters=[0]), "--clusters"),
])
def test_bad_options_are_named(kw, says):
    assert says in db.check(_args(**kw))


def test_bad_options_exit_2(capsys):
    assert db.main(["--chunks", "1000"]) == 2
    assert "--chunks 1000" in capsys.readouterr().err


def test_the_st_async_modes_take_the_tile_half_and_ignore_chunk_sizes():
    assert db.check(_args(modes=["st-async-lines", "st-async-halves"], chunks=[1000])) is not None  # chunks still checked
    assert db.check(_args(modes=["st-async-lines", "st-async-halves"])) is None  # 36,864 = 9 pairs of 128 x 16 B
    says = db.check(_args(modes=["st-async-halves"], round_bytes=36_864 - 2048, chunks=[16]))
    assert "--round-bytes 34816" in says and "4,096" in says


def test_the_ping_modes_are_modes_and_run_their_own_kernel():
    assert db.check(_args(modes=["ping", "ping-under-copies"])) is None
    assert set(db.PING) <= set(db.MODES) and not set(db.PING) & set(db.ST_ASYNC)
    src = db.SOURCE.read_text()
    assert "dsmem_ping(int pings, int copies" in src and "__launch_bounds__(160, 1)" in src
    assert db.THREADS + 32 == 160  # the ping thread is warp 4's lane 0, past the four copying warps
