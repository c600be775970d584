"""``--backend`` of ``hisparse replay``: what the GPU backend refuses, with exit status 2 (runs
anywhere; the GPU answers themselves are in tests/test_sharded_lru_gpu.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulator.cli import main
from simulator.errors import HisparseError
from simulator.replay import ReplayConfig, replay
from simulator.replay.gpu import supports

ROOT = Path(__file__).resolve().parent.parent
TRACE = str(ROOT / "traces" / "synthetic-dsa-like.hst")


@pytest.mark.parametrize("extra", [["--policy", "fifo"], ["--semantics", "sequential"],
                                   ["--policy", "salru", "--mtp-steps", "2"]])
def test_gpu_backend_refuses_what_it_does_not_replay(extra, capsys):
    assert main(["replay", TRACE, "--backend", "gpu", "--quiet", *extra]) == 2
    err = capsys.readouterr().err
    assert "--backend gpu replays batched lru and salru" in err and "Traceback" not in err


def test_supported_configs():
    assert supports(ReplayConfig("lru", 4096)) and supports(ReplayConfig("salru", 4096, ways=64))
    assert not supports(ReplayConfig("lru", 4096, semantics="sequential"))
    assert not supports(ReplayConfig("sglang-clock", 4096))


def test_unknown_backend_named():
    with pytest.raises(HisparseError, match="unknown replay backend 'tpu'"):
        replay([], ReplayConfig(), backend="tpu")


def test_gpu_backend_without_cupy_names_what_is_missing(capsys):
    """Where CuPy is absent (CI), asking for the GPU is exit status 2 with the reason."""
    import importlib.util

    if importlib.util.find_spec("cupy") is not None:
        pytest.skip("CuPy is installed here: tests/test_sharded_lru_gpu.py covers the GPU backend")
    assert main(["replay", TRACE, "--backend", "gpu", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "--backend gpu needs CuPy" in err and "Traceback" not in err
