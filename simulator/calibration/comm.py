"""Communication terms from measured collectives (CPU only: runs on a saved CSV).

Per collective and GPU count n, the time of one collective of ``bytes`` is modelled as

    t = latency + factor(collective, n) x bytes / busbw

with nccl-tests' conventions (NVIDIA/nccl-tests, doc/PERFORMANCE.md and src/*.cu): ``bytes`` is
the message size nccl-tests prints (all_reduce: the buffer; all_gather: the gathered output;
reduce_scatter: the input before the scatter; all_to_all: one rank's whole send buffer), and
busbw = algbw x factor with factor 2(n-1)/n for all_reduce and (n-1)/n for the others, so one
busbw figure is comparable across n and with published nccl-tests tables. The fit is least
squares on relative error: decode messages are small, and an absolute fit would let the few
large points decide the latency.

The result is the ``comm`` section of a calibration JSON:
``{"source", "command", "<collective>": {"latency_us": {"<n>": ..}, "busbw": {"<n>": B/s},
"r2": {..}, "points": {..}, "max_rel_err": {..}}}``.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..errors import HisparseError

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
REQUIRED_COLUMNS = ("collective", "n_gpus", "bytes", "time_us")
MAX_COMM_GPUS = 2**16


def busbw_factor(collective: str, n: int) -> float:
    """nccl-tests' bus-bandwidth factor: the share of ``bytes`` that crosses each rank's link."""
    if collective == "all_reduce":
        return 2.0 * (n - 1) / n
    if collective in COLLECTIVES:
        return (n - 1) / n
    raise ValueError(f"unknown collective {collective!r}")


def read_metadata(path: str | os.PathLike) -> dict[str, str]:
    """The ``# key: value`` lines the harness writes above the CSV header (command, device, ...)."""
    meta = {}
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if not line.startswith("#"):
                break
            key, sep, value = line[1:].partition(":")
            if sep:
                meta[key.strip()] = value.strip()
    return meta


def read_comm_csv(path: str | os.PathLike) -> pd.DataFrame:
    """Load a harness CSV and check the columns the fit reads; a bad file is a one-line error
    naming the file, the column and the data row."""
    p = str(path)
    if not os.path.exists(p):
        raise HisparseError(f"{p}: no such file")
    if os.path.isdir(p):
        raise HisparseError(f"{p}: is a folder; give the CSV file benchmarks/comm.py wrote")
    import io

    from ..inputs import read_bytes

    data = read_bytes(p, what="CSV file")  # within the input size budget (/dev/zero is refused)
    try:
        df = pd.read_csv(io.BytesIO(data), comment="#")
    except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError) as exc:
        raise HisparseError(f"{p}: not a CSV with a header row ({str(exc).splitlines()[0]})") from None
    except OSError as exc:
        raise HisparseError(f"{p}: cannot read ({exc.strerror or exc})") from None
    for col in REQUIRED_COLUMNS:
        if col not in df.columns:
            raise HisparseError(f"{p}: column '{col}' missing (columns: {', '.join(map(str, df.columns))})")
    if df.empty:
        raise HisparseError(f"{p}: no data rows")
    bad = ~df["collective"].isin(COLLECTIVES)
    if bad.any():
        i = int(np.flatnonzero(bad.to_numpy())[0])
        raise HisparseError(f"{p}: column 'collective', data row {i + 1}: '{df['collective'].iloc[i]}' "
                            f"is not one of {', '.join(COLLECTIVES)}")
    # integers stay exact in the float the CSV is parsed as and fit an int64 (n_gpus = 1e30 wrapped
    # to a negative GPU count); no collective spans more GPUs than MAX_COMM_GPUS
    for col, lowest, highest, integer in (("n_gpus", 2, MAX_COMM_GPUS, True), ("bytes", 1, 2**53, True),
                                          ("time_us", 0.0, None, False)):
        values = pd.to_numeric(df[col], errors="coerce").to_numpy(float)
        ok = np.isfinite(values) & ((values >= lowest) if integer else (values > lowest))
        if integer:
            ok &= np.isfinite(values) & (values == np.round(values)) & (values <= highest)
        if not ok.all():
            i = int(np.flatnonzero(~ok)[0])
            need = f"an integer >= {lowest} and <= {highest}" if integer else "a positive number"
            raise HisparseError(f"{p}: column '{col}', data row {i + 1}: '{df[col].iloc[i]}' is not {need}")
        df[col] = values.astype(int) if integer else values
    # the harness's spread columns (optional; the report draws them as error bars): p10 <= time <= p90
    for col, side in (("time_us_p10", -1), ("time_us_p90", 1)):
        if col not in df.columns:
            continue
        values = pd.to_numeric(df[col], errors="coerce").to_numpy(float)
        ok = np.isfinite(values) & (values > 0) & (side * (values - df["time_us"].to_numpy(float)) >= 0)
        if not ok.all():
            i = int(np.flatnonzero(~ok)[0])
            bound = "at most" if side < 0 else "at least"
            raise HisparseError(f"{p}: column '{col}', data row {i + 1}: '{df[col].iloc[i]}' is not a positive number "
                                f"{bound} the row's time_us ({df['time_us'].iloc[i]:g})")
        df[col] = values
    return df


def fit_line(bytes_: np.ndarray, time_us: np.ndarray, factor: float) -> tuple[float, float, float, float]:
    """t = latency + factor x bytes / busbw, least squares on relative error:
    (latency_us, busbw in B/s, R^2 of the times, largest relative error)."""
    x = factor * np.asarray(bytes_, float)
    y = np.asarray(time_us, float)
    A = np.c_[np.ones_like(x), x] / y[:, None]
    (a, b), *_ = np.linalg.lstsq(A, np.ones_like(y), rcond=None)
    pred = a + b * x
    ss = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float(((y - pred) ** 2).sum()) / ss if ss > 0 else 1.0
    # A size term below a millionth of the largest time is rounding, not a bandwidth: timings that
    # stay flat fit b ~ 1e-19 and would report ~1e24 B/s; treat them as not growing.
    busbw = 1e6 / b if b > 0 and b * x.max() > 1e-6 * y.max() else math.inf
    return float(a), float(busbw), r2, float(np.max(np.abs(pred - y) / y))


def fit_comm(df: pd.DataFrame, path: str = "CSV") -> pd.DataFrame:
    """One row per (collective, n_gpus): latency_us, busbw (B/s), r2, points, max_rel_err."""
    rows = []
    for (coll, n), g in df.groupby(["collective", "n_gpus"], sort=True):
        sizes = g["bytes"].nunique()
        if sizes < 2:
            raise HisparseError(f"{path}: {coll} on {n} GPUs has {sizes} message size in column 'bytes'; "
                                "the fit needs at least 2")
        lat, bw, r2, err = fit_line(g["bytes"].to_numpy(), g["time_us"].to_numpy(), busbw_factor(coll, n))
        if not math.isfinite(bw):
            raise HisparseError(f"{path}: {coll} on {n} GPUs: column 'time_us' does not grow with 'bytes'; "
                                "no bandwidth to fit")
        if lat < 0:  # the line does not describe these points; a negative time is no model term
            raise HisparseError(f"{path}: {coll} on {n} GPUs: the fit of column 'time_us' gives a negative "
                                f"latency ({lat:.2f} us); the timings are not latency + bytes / bandwidth")
        rows.append(dict(collective=coll, n_gpus=int(n), latency_us=lat, busbw=bw, r2=r2, points=len(g),
                         max_rel_err=err))
    rows.sort(key=lambda r: (COLLECTIVES.index(r["collective"]), r["n_gpus"]))
    return pd.DataFrame(rows)


def comm_section(fits: pd.DataFrame, source: str, command: str) -> dict[str, Any]:
    """The calibration JSON's ``comm`` object (GPU counts as string keys, busbw in B/s)."""
    section: dict[str, Any] = {"source": source, "command": command}
    for coll in COLLECTIVES:
        g = fits[fits.collective == coll]
        if g.empty:
            continue
        section[coll] = {key: {str(int(r.n_gpus)): (int(r[key]) if key == "points" else float(r[key]))
                               for _, r in g.iterrows()}
                         for key in ("latency_us", "busbw", "r2", "points", "max_rel_err")}
    return section


def source_line(meta: dict[str, str], csv_path: str) -> str:
    """Where the figures come from, from the CSV's own header lines."""
    parts = [f"measured by benchmarks/comm.py ({Path(csv_path).name})"]
    for key in ("device", "torch", "nccl", "timing", "date"):
        if meta.get(key):
            parts.append(f"{key} {meta[key]}")
    return ", ".join(parts) + "; fit t = latency + factor x bytes / busbw (nccl-tests conventions)"


def write_comm_section(json_path: str | os.PathLike, section: dict[str, Any],
                       out_path: str | os.PathLike | None = None) -> None:
    """Put ``section`` as ``comm`` into the calibration file at ``json_path``, keeping its other
    groups; written to ``out_path`` (default: the same file). A folder without ``<gpu>.json`` starts
    from the GPU's packaged calibration, as ``calibrate --refit`` does: a file holding ``comm`` alone
    was refused by ``plan`` and ``validate`` (no kernel terms)."""
    from ..costmodel.calibration_file import CalibrationFile, read_calibration, write_calibration
    from ..serving.presets import calibration_base

    p = str(json_path)
    base = calibration_base(p)
    cal = read_calibration(str(base)) if base is not None else CalibrationFile(source="hisparse calibrate --comm", where=p)
    write_calibration(cal.replace(comm=section), out_path or p)


def calibrate_comm(csv_path: str, json_path: str, command: str, plot_path: str | None = None) -> pd.DataFrame:
    """Fit a harness CSV and write the ``comm`` section (and a measured-against-fit plot): the
    fits table; nothing is written on a bad CSV. ``command`` is the measuring command when the
    CSV does not record one. The JSON and the plot go into their folder as one set (an interrupted
    run leaves the earlier pair as it was)."""
    from ..fileio import folder_output

    df = read_comm_csv(csv_path)
    fits = fit_comm(df, csv_path)
    meta = read_metadata(csv_path)
    section = comm_section(fits, source_line(meta, csv_path), meta.get("command") or command)
    folder = Path(json_path).parent
    names = [Path(json_path).name]
    if plot_path:
        if Path(plot_path).parent.resolve() != folder.resolve():
            raise HisparseError(f"{plot_path}: the comm plot goes beside {json_path}")
        names.append(Path(plot_path).name)
    with folder_output(folder, names) as staged:
        write_comm_section(json_path, section, staged / names[0])
        if plot_path:
            from .report import plot_comm

            plot_comm(df, fits, str(staged / names[1]))
    return fits


def format_fits(fits: pd.DataFrame) -> str:
    """A table a person reads: latency in us, busbw in GB/s."""
    lines = [f"{'collective':<15}{'GPUs':>5}{'latency us':>12}{'busbw GB/s':>12}{'R^2':>8}{'max err':>9}"]
    for _, r in fits.iterrows():
        lines.append(f"{r.collective:<15}{r.n_gpus:>5}{r.latency_us:>12.2f}{r.busbw / 1e9:>12.1f}"
                     f"{r.r2:>8.4f}{r.max_rel_err:>9.1%}")
    return "\n".join(lines)
