"""CPU check of benchmarks/swap_in_warm.py's options (the timing itself needs a GPU): bad counts
exit 2 with a one-line message, no traceback, before any GPU work."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("argv", [["--iters", "0"], ["--batches", "1", "0"]])
def test_bad_counts_exit_2_without_a_traceback(argv, tmp_path):
    out = tmp_path / "warm.csv"
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "swap_in_warm.py"), *argv, "--out", str(out)],
                       capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr and "--iters and --batches must be >= 1" in p.stderr
    assert not out.exists()
