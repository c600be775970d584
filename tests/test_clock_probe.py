"""The clock probe (cupy_kernels/clock_probe.py): nvidia-smi's rows parsed, the settled samples
summarised, and a sustained run against a stand-in nvidia-smi on PATH (no GPU needed)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from cupy_kernels import clock_probe as cpb


def test_parse_skips_unreadable_rows():
    text = "1755, 512.30, 61, 0x0000000000000000\n[N/A], 500.0, 60, 0x0\n1980, 300.5, 55, 0x4\n1700, 6"
    assert cpb.parse_samples(text) == [cpb.Sample(1755.0, 512.3, 61.0, 0), cpb.Sample(1980.0, 300.5, 55.0, 4)]


def test_summarise_drops_the_ramp_and_ors_the_reasons():
    ramp = [cpb.Sample(345.0, 80.0, 40.0, 0x1)] * 2  # idle clock at the start: dropped
    held = [cpb.Sample(1755.0, 600.0, 60.0, 0x0), cpb.Sample(1740.0, 620.0, 61.0, 0x4),
            cpb.Sample(1770.0, 610.0, 62.0, 0x20), cpb.Sample(1755.0, 615.0, 62.0, 0x0),
            cpb.Sample(1755.0, 605.0, 61.0, 0x0), cpb.Sample(1760.0, 612.0, 61.0, 0x0)]
    st = cpb.summarise(ramp + held, calls=1000, seconds=0.1)
    assert st.samples == 6 and st.sm_mhz == 1755.0 and st.power_w == pytest.approx(611.0)
    assert st.reasons == 0x24 and st.us_per_call == pytest.approx(100.0)
    assert st.kcycles_per_call == pytest.approx(175.5)
    with pytest.raises(ValueError, match="no clock samples"):
        cpb.summarise([], calls=1, seconds=1.0)


def _fake_smi(folder: Path, mhz: int) -> None:
    exe = folder / "nvidia-smi"
    exe.write_text(f"#!{sys.executable}\nimport sys, time\nargs = sys.argv[1:]\n"
                   "assert any(a.startswith('--query-gpu=clocks.sm,') for a in args), args\n"
                   f"while True:\n    print('{mhz}, 650.0, 70, 0x0', flush=True)\n    time.sleep(0.005)\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)


def test_sustained_runs_the_launches_and_reads_the_probe(tmp_path, monkeypatch):
    _fake_smi(tmp_path, 1830)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    launched, synced = [], []
    st = cpb.sustained(lambda: launched.append(1), lambda: synced.append(1), 0.3, calls_per_launch=4, batch=5)
    assert st.sm_mhz == 1830.0 and st.power_w == 650.0 and st.samples >= 1
    assert st.calls == (len(launched) - 1) * 4  # the warm-up launch is not counted
    assert (len(launched) - 1) % 5 == 0 and len(synced) == 1 + (len(launched) - 1) // 5
    with pytest.raises(ValueError, match="seconds must be > 0"):
        cpb.sustained(lambda: None, lambda: None, 0)


def test_sustained_without_nvidia_smi_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises((OSError, subprocess.SubprocessError)):
        cpb.sustained(lambda: None, lambda: None, 0.05)
