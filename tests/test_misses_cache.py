"""The cache of replayed misses (``serving.misses``): a damaged file is replayed again, not a traceback."""

from __future__ import annotations

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
