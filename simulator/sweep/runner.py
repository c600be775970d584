"""Run a sweep's points on Ray (a local instance, or a cluster at --address) or in this process,
writing each finished point to its own parquet part so a killed sweep resumes losing nothing."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pandas as pd

from ..errors import HisparseError
from ..fileio import atomic_output
from ..interrupts import raise_if_terminated
from .grid import Grid, point_id
from .points import run_point

RESULTS = "results.parquet"
LOCK = ".sweep.lock"  # held (flock) while a sweep writes the folder; left in place (unlinking it races a waiter)


def _part_path(out: Path, pid: str) -> Path:
    return out / "parts" / f"{pid}.parquet"


def _write_part(out: Path, grid: Grid, point: dict[str, Any], result: dict[str, Any]) -> None:
    row = {"point": point_id(point), "kind": grid.kind, **point, **result}
    with atomic_output(_part_path(out, row["point"])) as fh:
        pd.DataFrame([row]).to_parquet(fh, index=False)


def finished(out: Path, grid: Grid) -> set[str]:
    """Points with a successful part on disk. A part that does not read back as one (truncated,
    emptied, another program's file: a pyarrow traceback under --resume) is removed with a warning
    and its point runs again."""
    import warnings

    done = set()
    for p in grid.points:
        part = _part_path(out, point_id(p))
        if not part.exists():
            continue
        if not part.is_file():  # a folder read as a parquet dataset, then its unlink failed ("Is a directory")
            raise HisparseError(f"{part}: is not a file; a sweep part is one parquet file (remove it and run "
                                "again with --resume: its point runs again)")
        try:
            error = pd.read_parquet(part, columns=["error"])["error"].iloc[0]
        except (OSError, ValueError, KeyError, IndexError) as exc:  # pyarrow's ArrowInvalid is a ValueError
            warnings.warn(f"{part}: not a readable sweep part ({str(exc).splitlines()[0][:120]}); its point runs "
                          "again", stacklevel=1)
            part.unlink()
            continue
        if not error:
            done.add(point_id(p))
    return done


def _serial(kind: str, todo: list[dict]) -> Iterator[tuple[dict, dict]]:
    for p in todo:
        yield p, run_point(kind, p)


@contextlib.contextmanager
def _quiet_token_notice() -> Iterator[None]:
    """Starting a local instance, Ray (>= 2.5x) turns token authentication on (a token in
    ~/.ray/auth_token, made if missing) and logs a warning saying so on every start. The
    behaviour is right for a local instance; only the notice is dropped. (Setting RAY_AUTH_MODE
    from here instead is read too late: Ray caches its config at import, and its GCS then finds
    no token.)"""
    log = logging.getLogger("ray._private.authentication.authentication_token_setup")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


@contextlib.contextmanager
def _keep_sigterm() -> Iterator[None]:
    """``ray.init`` installs a SIGTERM handler that exits with status 1 (and Ray's shutdown then
    aborts): the command's own handler (SIGTERM as an interrupt: temp files removed, "hisparse:
    interrupted", 143) is put back once Ray has started."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    try:
        yield
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _init_ray(ray, address: str | None, workers: int) -> None:
    """Start a local Ray, or connect to ``address`` once it has answered within the bound
    (``sweep.address``); a refusal from Ray is one line naming the address."""
    with _keep_sigterm():
        if address:
            from .address import check_reachable

            check_reachable(address)
            try:
                ray.init(address=address, log_to_driver=False)
            except (ConnectionError, RuntimeError, ValueError, TimeoutError) as exc:
                raise HisparseError(f"--address {address}: Ray refused the connection "
                                    f"({type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else 'no detail'})") from None
            return
        with _quiet_token_notice():
            ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False,
                     runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(filter(None, [
                         str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")]))}})


def _on_ray(kind: str, todo: list[dict], address: str | None, workers: int) -> Iterator[tuple[dict, dict]]:
    from ..extras import require

    require("sweep", "hisparse sweep (without --no-ray)")
    import ray
    started_here = not ray.is_initialized()
    if started_here:
        _init_ray(ray, address, workers)
    remote = ray.remote(num_cpus=1, max_retries=0)(run_point)
    slots = max(1, int(ray.cluster_resources().get("CPU", workers))) * 2
    pending: dict[Any, dict] = {}
    queue = list(todo)
    try:
        while queue or pending:
            while queue and len(pending) < slots:
                p = queue.pop(0)
                pending[remote.remote(kind, p)] = p
            ready, _ = ray.wait(list(pending), num_returns=1)
            raise_if_terminated()  # a SIGTERM that ray.wait's own signal poll swallowed
            for ref in ready:
                p = pending.pop(ref)
                try:
                    result = ray.get(ref)
                except Exception as exc:  # a worker died: record it like any failing point
                    result = {"error": f"{type(exc).__name__}: {exc}", "seconds": float("nan")}
                raise_if_terminated()
                yield p, result
    finally:
        if started_here:
            ray.shutdown()


def run_sweep(grid: Grid, out: str | Path, *, address: str | None = None, workers: int = 2, resume: bool = False,
              use_ray: bool = True, max_points: int | None = None,
              progress: Callable[[int, int], Any] | None = None,
              after: Callable[[pd.DataFrame], None] | None = None) -> pd.DataFrame:
    """Run the grid's unfinished points; return the whole results table (also written to
    OUT/results.parquet). ``progress(total, already_done)`` returns a tqdm-like bar or None. ``after(table)``
    writes what else the command makes of the table (its --report), committed with OUT/results.parquet as one
    set (``fileio.output_set``): an interrupt between the two left the new table beside the old page."""
    out = Path(out)
    if (out / RESULTS).is_dir():  # found only when the table is written, after every point had run
        raise HisparseError(f"{out / RESULTS}: is a folder; the sweep writes its results table there (remove it, "
                            "or give another --out)")
    parts = out / "parts"
    if parts.exists() and not parts.is_dir():  # was "OUT/parts: Not a directory", from the OS
        raise HisparseError(f"{parts}: is a file; the sweep writes one file per point in that folder (remove it, "
                            "or give another --out)")
    with _sweep_lock(out):
        return _run_locked(grid, out, address=address, workers=workers, resume=resume, use_ray=use_ray,
                           max_points=max_points, progress=progress, after=after)


@contextlib.contextmanager
def _sweep_lock(out: Path) -> Iterator[None]:
    """One sweep at a time per folder: a second `hisparse sweep --out OUT` started while one runs would pass the
    'already holds results' check (no part written yet), run beside it and overwrite its results table, both
    reporting success. The folder is made here, after the grid's checks."""
    try:
        import fcntl
    except ImportError:  # no flock (not POSIX): unguarded, as before
        yield
        return
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    path = out / LOCK
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise HisparseError(f"{path}: cannot open the sweep's lock file ({exc.strerror})") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise HisparseError(f"{out}: another hisparse sweep is writing this folder; wait for it to finish, "
                                "or give another --out") from None
        try:
            yield
        finally:
            # a sweep that wrote nothing (Ray never answered) leaves no folder it made; unlinked while held, so a
            # sweep starting now makes a new one
            if created and os.listdir(out) == [LOCK]:
                os.unlink(path)
                os.rmdir(out)
    finally:
        os.close(fd)  # releases the lock


def _run_locked(grid: Grid, out: Path, *, address: str | None, workers: int, resume: bool, use_ray: bool,
                max_points: int | None, progress: Callable[[int, int], Any] | None,
                after: Callable[[pd.DataFrame], None] | None = None) -> pd.DataFrame:
    if (out / "parts").exists() and any((out / "parts").iterdir()) and not resume:
        raise HisparseError(f"{out} already holds sweep results: pass --resume to continue, or another --out")
    if resume:
        _check_same_grid(out, grid)
    done = finished(out, grid) if resume else set()
    todo = [p for p in grid.points if point_id(p) not in done]
    if max_points is not None:
        todo = todo[:max_points]
    bar = progress(len(grid.points), len(done)) if progress else None
    failures = 0
    runs = _on_ray(grid.kind, todo, address, workers) if use_ray and todo else _serial(grid.kind, todo)
    for p, result in runs:
        _write_part(out, grid, p, result)
        failures += bool(result.get("error"))
        if bar is not None:
            bar.update(1)
            bar.set_postfix(failed=failures)
    if bar is not None:
        bar.close()
    from ..fileio import output_set

    with output_set():  # the parts above are written as they finish (a killed sweep resumes); the table and
        table = collect(out, grid)  # what the command makes of it go in together
        if after is not None:
            after(table)
    return table


def _check_same_grid(out: Path, grid: Grid) -> None:
    """--resume continues a grid, or one extended with more points: a folder whose finished points are not all
    in this grid (another grid, another kind) is refused, since its results table is rewritten from this
    grid's points and would silently lose them."""
    parts = out / "parts"
    if not parts.is_dir():
        return
    ours = {point_id(p) for p in grid.points}
    theirs = sorted(f.stem for f in parts.glob("*.parquet") if f.stem not in ours)
    if theirs:
        raise HisparseError(f"{out} holds {len(theirs)} finished point(s) that this grid does not have (e.g. "
                            f"{_part_path(out, theirs[0])}): --resume continues the same grid or one extended with "
                            "more points; give another --out for a different grid")


def collect(out: Path, grid: Grid) -> pd.DataFrame:
    """Gather the parts in grid order into OUT/results.parquet."""
    parts = [_part_path(out, point_id(p)) for p in grid.points]
    frames = [pd.read_parquet(p) for p in parts if p.exists()]
    table = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    if "traceback" in table:
        table = table.drop(columns="traceback")
    with atomic_output(out / RESULTS) as fh:
        table.to_parquet(fh, index=False)
    return table
