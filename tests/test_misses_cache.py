"""The cache of replayed misses (``serving.misses``): a damaged file is replayed again, not a traceback."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from simulator.cli import main
from simulator.serving.misses import miss_profiles


@pytest.fixture
def small_trace(tmp_path, monkeypatch):
    monkeypatch.setenv("HISPARSE_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "t.hst"
    assert main(["trace", "gen", "--preset", "bursty", "--layers", "2", "--steps", "20", "--requests", "1",
                 "--topk", "256", "--ctx0", "1200", "--out", str(out), "--quiet"]) == 0
    return out


@pytest.mark.parametrize("damage", [b"", b"garbage", b"PK\x03\x04 truncated zip", "pickle", "range"])
def test_a_damaged_cache_file_is_replayed_again_and_replaced(small_trace, tmp_path, damage, capsys):
    """A truncated, foreign, pickled or out-of-range cache file gave a zipfile / pickle traceback on every
    later plan; now a note, the same answer as a fresh replay, and a good file in its place."""
    fresh = miss_profiles(str(small_trace), top_k=256, buffer=512)
    (cached,) = (tmp_path / "cache").glob("misses-*.npz")
    if damage == "pickle":
        np.savez(cached, ctx0=np.int64(1200), r0=np.array([object()], dtype=object))
    elif damage == "range":
        np.savez(cached, ctx0=np.int64(1200), r0=np.array([0.5, 7.0]))
    else:
        cached.write_bytes(damage)
    capsys.readouterr()
    again = miss_profiles(str(small_trace), top_k=256, buffer=512)
    assert "unreadable" in capsys.readouterr().err
    assert len(again.shares) == len(fresh.shares)
    assert all(np.array_equal(a, b) for a, b in zip(again.shares, fresh.shares, strict=True))
    third = miss_profiles(str(small_trace), top_k=256, buffer=512)  # the replaced file reads cleanly
    assert "unreadable" not in capsys.readouterr().err
    assert all(np.array_equal(a, b) for a, b in zip(third.shares, fresh.shares, strict=True))


def test_a_damaged_cached_trace_is_drawn_again(tmp_path, monkeypatch, capsys):
    """A cached generated trace cut short stopped every later plan of its scenario with the reader's
    error until removed by hand; now it is drawn again in its place, with a note, and the plan runs."""
    from simulator.serving.presets import load
    from simulator.serving.trace_choice import choose_trace

    monkeypatch.setenv("HISPARSE_CACHE", str(tmp_path / "cache"))
    model = load("models", "glm-5.1-fp8")
    workload = dataclasses.replace(load("workloads", "32k-in-8k-out"), input_tokens=2048, output_tokens=3)
    first = choose_trace(model, workload, None)
    assert first.generated and first.trace
    whole = open(first.trace, "rb").read()
    with open(first.trace, "r+b") as fh:
        fh.truncate(len(whole) // 3)
    capsys.readouterr()
    again = choose_trace(model, workload, None)
    assert "unreadable" in capsys.readouterr().err and again.generated and again.trace == first.trace
    assert open(again.trace, "rb").read() == whole  # the same seed draws the same bytes
    assert not choose_trace(model, workload, None).generated  # and the new file is used as it is
    assert "unreadable" not in capsys.readouterr().err


def test_a_cache_that_cannot_take_a_replay_is_a_note(small_trace, monkeypatch, capsys):
    """A read-only or full HISPARSE_CACHE failed the plan after the replay's work, naming the cache
    file; the replay is only not kept: a note, and the same answer."""
    import errno

    import simulator.fileio as fileio

    fresh = miss_profiles(str(small_trace), top_k=256, buffer=640, use_cache=False)

    def read_only(path, *a, **k):
        raise OSError(errno.EROFS, "Read-only file system", str(path))

    monkeypatch.setattr(fileio, "atomic_output", read_only)
    capsys.readouterr()
    got = miss_profiles(str(small_trace), top_k=256, buffer=640)
    err = capsys.readouterr().err
    assert "the replay is not cached" in err and "Read-only file system" in err and "HISPARSE_CACHE" in err
    assert all(np.array_equal(a, b) for a, b in zip(got.shares, fresh.shares, strict=True))


def test_a_cache_that_cannot_take_a_generated_trace_is_refused_before_the_draw(tmp_path, monkeypatch):
    """A generated trace is read back from the cache, so it must be kept: a cache it cannot go to was
    found only after the whole draw; now before it, naming HISPARSE_CACHE and --trace."""
    import os

    import simulator.serving.trace_choice as tc
    from simulator.errors import HisparseError
    from simulator.serving.presets import load

    monkeypatch.setenv("HISPARSE_CACHE", str(tmp_path / "cache"))
    model = load("models", "glm-5.1-fp8")
    workload = dataclasses.replace(load("workloads", "32k-in-8k-out"), input_tokens=2048, output_tokens=3)
    cache = str(tmp_path / "cache")
    real = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, **k: False if str(path).startswith(cache) else real(path, mode))
    drawn = []
    monkeypatch.setattr("simulator.trace.generator.generate", lambda *a, **k: drawn.append(1) or iter(()))
    with pytest.raises(HisparseError, match=r"cannot keep the generated trace there \(not writable\).*HISPARSE_CACHE"):
        tc.choose_trace(model, workload, None)
    assert not drawn


def test_trace_accesses_is_read_once_per_file_and_again_when_it_changes(tmp_path, monkeypatch):
    """The plan's work budget asks for the trace's accesses at every sweep point (~1 ms to open the
    index each time): kept per (file, size, mtime), so a rewritten trace is read again."""
    import simulator.trace as trace_pkg
    from simulator.serving import misses

    out = tmp_path / "t.hst"

    def gen(steps: int) -> None:
        assert main(["trace", "gen", "--preset", "bursty", "--layers", "2", "--steps", str(steps), "--requests", "1",
                     "--topk", "64", "--ctx0", "300", "--out", str(out), "--quiet"]) == 0

    gen(20)
    opened = []
    real = trace_pkg.open_trace
    monkeypatch.setattr(trace_pkg, "open_trace", lambda p: opened.append(p) or real(p))
    first = misses.trace_accesses(str(out))
    assert first == 2 * 20 * 64 and misses.trace_accesses(str(out)) == first and len(opened) == 1
    gen(30)
    assert misses.trace_accesses(str(out)) == 2 * 30 * 64 and len(opened) == 2
