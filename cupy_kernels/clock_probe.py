"""The SM clock and board power while one kernel runs without pause, read with ``nvidia-smi``.

Why: two kernels that take the same cycles per tile can still differ in time if one draws more
power and the GPU runs it at a lower clock. Event timing cannot tell these apart; the clock the
board held while each kernel ran, sampled by ``nvidia-smi --loop-ms`` during a sustained run, can:
cycles per call = time per call x clock. No clock is set or locked (the settings stay as found).
"""

from __future__ import annotations

import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

FIELDS = ("clocks.sm", "power.draw", "temperature.gpu", "clocks_event_reasons.active")
INTERVAL_MS = 20
SETTLE = 0.25  # the first quarter of the samples is dropped: the clock is still ramping from the idle state


class Sample(NamedTuple):
    sm_mhz: float
    power_w: float
    temp_c: float
    reasons: int  # the clock-event (throttle) reason bits nvidia-smi reports, 0 when none


class Sustained(NamedTuple):
    """One kernel run back to back for a while: its time per call and the board's state meanwhile."""

    calls: int
    us_per_call: float
    sm_mhz: float  # median over the settled samples
    power_w: float
    temp_c: float
    reasons: int  # every reason bit seen in the settled samples
    samples: int

    @property
    def kcycles_per_call(self) -> float:
        return self.us_per_call * self.sm_mhz * 1e-3


def parse_samples(text: str) -> list[Sample]:
    """The rows of ``nvidia-smi --query-gpu=<FIELDS> --format=csv,noheader,nounits`` output; rows
    with a field it could not read (``[N/A]``, a cut-off last line) are skipped."""
    out = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != len(FIELDS):
            continue
        try:
            reasons = int(parts[3], 16) if parts[3].lower().startswith("0x") else int(parts[3])
            out.append(Sample(float(parts[0]), float(parts[1]), float(parts[2]), reasons))
        except ValueError:
            continue
    return out


def summarise(samples: Sequence[Sample], calls: int, seconds: float) -> Sustained:
    """The settled samples' medians (every reason bit OR-ed) with the run's time per call."""
    settled = list(samples[int(len(samples) * SETTLE):])
    if not settled:
        raise ValueError(f"no clock samples in {seconds:.2f} s (nvidia-smi printed no readable row)")
    reasons = 0
    for s in settled:
        reasons |= s.reasons
    return Sustained(calls, seconds / calls * 1e6, statistics.median(s.sm_mhz for s in settled),
                     statistics.median(s.power_w for s in settled), statistics.median(s.temp_c for s in settled),
                     reasons, len(settled))


def sustained(launch: Callable[[], None], sync: Callable[[], None], seconds: float, *, calls_per_launch: int = 1,
              batch: int = 20, device: int = 0, interval_ms: int = INTERVAL_MS) -> Sustained:
    """Queue ``launch`` ``batch`` times, wait (``sync``), repeat until ``seconds`` have passed, while
    ``nvidia-smi`` samples GPU ``device`` every ``interval_ms``. ``calls_per_launch``: kernel calls in
    one ``launch`` (a graph of several), so the time is per call."""
    if seconds <= 0:
        raise ValueError(f"seconds must be > 0, got {seconds}")
    launch()  # warm: the first launch may build or load code
    sync()
    cmd = ["nvidia-smi", f"--query-gpu={','.join(FIELDS)}", "--format=csv,noheader,nounits",
           f"--loop-ms={interval_ms}", f"--id={device}"]
    probe = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        n = 0
        t0 = time.perf_counter()
        while True:
            for _ in range(batch):
                launch()
            sync()
            n += batch
            elapsed = time.perf_counter() - t0
            if elapsed >= seconds:
                break
    finally:
        probe.terminate()
        text, _ = probe.communicate(timeout=10)
    return summarise(parse_samples(text), n * calls_per_launch, elapsed)
