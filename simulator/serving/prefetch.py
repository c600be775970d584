"""A plan's swept points simulated ahead, in parallel worker processes.

Every point of a plan is an independent, seeded simulation (``model.simulate``: a pure function of
its scenario, system, load, miss profiles and seed), so they may run in any order on any core.
``prefetch`` runs the planner once with ``simulate`` recording its calls instead of simulating
(the dry run decides nothing from the results), simulates the recorded points on ``jobs`` forked
workers, and keeps the results by value; the planner's real pass then reads them through
``simulate`` below, which falls back to simulating any point it was not given. The numbers are the
same as a serial run's, bit for bit: the same function on the same inputs (tests/test_prefetch.py).

``HISPARSE_JOBS`` sets the workers (default: the CPUs this process may use; 1 turns it off).
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import pickle
from collections.abc import Callable
from typing import Any

from . import model
from .misses import MissProfiles
from .results import RunResult
from .state import System

_results: dict[bytes, RunResult] = {}  # point key -> its result, filled by prefetch
_recording: list[tuple[tuple, dict]] | None = None  # the dry run's calls (None: not recording)
_tasks: list[tuple[tuple, dict]] = []  # what the forked workers simulate (inherited, never pickled)


def point_key(scenario: Any, system: System | str, *, concurrency: int = 0, rate_per_s: float = 0.0,
              profiles: MissProfiles | None = None, seed: int = 0) -> bytes | None:
    """A digest of everything a point's result depends on (None: the scenario does not pickle)."""
    h = hashlib.sha256()
    try:
        h.update(pickle.dumps((scenario, str(system), int(concurrency), float(rate_per_s), int(seed)), protocol=5))
    except Exception:  # noqa: BLE001 - an unpicklable scenario is simply not prefetched
        return None
    if profiles is not None:
        h.update(repr((profiles.source, profiles.trace_k, profiles.trace_buffer, profiles.context_tokens,
                       len(profiles.shares))).encode())
        for a in profiles.shares:
            h.update(str(a.dtype).encode() + str(a.shape).encode())
            h.update(a.tobytes())
    return h.digest()


def simulate(scenario: Any, system: System | str, *, concurrency: int = 0, rate_per_s: float = 0.0,
             profiles: MissProfiles | None = None, seed: int = 0) -> RunResult:
    """``model.simulate``, answered from the prefetched results when the point was prefetched."""
    kw = dict(concurrency=concurrency, rate_per_s=rate_per_s, profiles=profiles, seed=seed)
    if _recording is not None:
        _recording.append(((scenario, system), kw))
        return _PLACEHOLDER
    if _results:
        key = point_key(scenario, system, **kw)
        if key is not None and key in _results:
            return _results[key]
    return model.simulate(scenario, system, **kw)


_PLACEHOLDER: Any = object()  # what a recorded call returns (the dry run only collects the calls)


def jobs_from_env() -> int:
    """``HISPARSE_JOBS``, else the CPUs this process may run on."""
    raw = os.environ.get("HISPARSE_JOBS", "").strip()
    if raw:
        try:
            return max(1, int(raw))
        except ValueError:
            from ..errors import HisparseError

            raise HisparseError(f"HISPARSE_JOBS={raw!r}: must be a whole number of worker processes") from None
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def _cost(call: tuple[tuple, dict]) -> float:
    """A rough size of a point, to start the largest first (simulated requests, HiSparse's retries)."""
    (_, system), kw = call
    load = kw["concurrency"] or 16 * kw["rate_per_s"]
    return load * (2.0 if str(system) == System.HISPARSE.value else 1.0)


def _work(i: int) -> tuple[int, RunResult | None]:
    (scenario, system), kw = _tasks[i]
    try:
        return i, model.simulate(scenario, system, **kw)
    except Exception:  # noqa: BLE001 - the real pass simulates it again and reports its error in order
        return i, None


def prefetch(dry_run: Callable[[], Any], *, jobs: int | None = None, on_point: Callable[[], None] | None = None) -> int:
    """Record the points ``dry_run`` simulates and simulate them on ``jobs`` workers; returns how many
    were prefetched (0: one job, fewer than two points, or no fork on this platform)."""
    global _recording, _tasks
    jobs = jobs_from_env() if jobs is None else jobs
    if jobs <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        return 0
    _recording = []
    try:
        dry_run()
    finally:
        calls, _recording = _recording, None
    keyed = [(point_key(*c[0], **c[1]), c) for c in calls]
    todo = {k: c for k, c in keyed if k is not None and k not in _results}
    if len(todo) < 2:
        return 0
    keys = list(todo)
    _tasks = [todo[k] for k in keys]
    order = sorted(range(len(_tasks)), key=lambda i: -_cost(_tasks[i]))
    done = 0
    try:
        with multiprocessing.get_context("fork").Pool(min(jobs, len(_tasks))) as pool:
            for i, r in pool.imap_unordered(_work, order, chunksize=1):
                if r is not None:
                    _results[keys[i]] = r
                    done += 1
                if on_point:
                    on_point()
    finally:
        _tasks = []
    return done


def forget() -> None:
    """Drop the prefetched results (tests; a long-lived process planning many scenarios)."""
    _results.clear()
