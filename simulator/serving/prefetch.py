"""A plan's swept points simulated ahead, in parallel worker processes.

Every point of a plan is an independent, seeded simulation (``model.simulate``: a pure function of
its scenario, system, load, miss profiles and seed), so they may run in any order on any core.
``prefetch`` runs the planner once with ``simulate`` recording its calls instead of simulating
(the dry run decides nothing from the results), simulates the recorded points on ``jobs`` forked
workers, and keeps the results by value; the planner's real pass then reads them through
``simulate`` below, which falls back to simulating any point it was not given. The numbers are the
same as a serial run's, bit for bit: the same function on the same inputs (tests/test_prefetch.py).

The search between swept points (``planner.search_plan``) bisects each system's bracket in turn, a
chain of points each depending on the last; ``prefetch_search`` runs the chains side by side: one
forked worker per system replays the search with ``simulate`` simulating only its system's points
and answering the others' with a failing stand-in (their points then go unused), and the real
search that follows finds every point it asks for.

``HISPARSE_JOBS`` sets the workers (default: the CPUs this process may use; 1 turns it off).
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import pickle
import signal
from collections.abc import Callable
from typing import Any

from . import model
from .misses import MissProfiles
from .results import RunResult
from .state import System

_results: dict[bytes, RunResult] = {}  # point key -> its result, filled by prefetch
_only: str | None = None  # in a prefetch_search worker: the one system it simulates
_stand_in: RunResult | None = None  # what that worker answers for the other systems' points
_search: Callable[[], Any] | None = None  # the search prefetch_search's workers replay (inherited)
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
    if _only is not None and str(system) != _only and _stand_in is not None:
        return _stand_in
    if _results or _only is not None:
        key = point_key(scenario, system, **kw)
        if key is not None and key in _results:
            return _results[key]
        r = model.simulate(scenario, system, **kw)
        if key is not None and _only is not None:
            _results[key] = r
        return r
    return model.simulate(scenario, system, **kw)


_PLACEHOLDER: Any = object()  # what a recorded call returns (the dry run only collects the calls)


def jobs_from_env() -> int:
    """``HISPARSE_JOBS``, else the CPUs this process may run on."""
    raw = os.environ.get("HISPARSE_JOBS", "").strip()
    if raw:
        try:
            jobs = int(raw)
        except ValueError:
            jobs = 0
        if jobs < 1:  # 0 or -3 ran as 1, silently
            from ..errors import HisparseError

            raise HisparseError(f"HISPARSE_JOBS={raw!r}: must be a whole number of worker processes, 1 or more "
                                "(1 turns the workers off)")
        from ..limits import check_jobs

        check_jobs(jobs, f"HISPARSE_JOBS={raw}")
        return jobs
    from ..limits import usable_cpus

    return usable_cpus()


def _cost(call: tuple[tuple, dict]) -> float:
    """A rough size of a point, to start the largest first (simulated requests, HiSparse's retries)."""
    (_, system), kw = call
    load = kw["concurrency"] or 16 * kw["rate_per_s"]
    return load * (2.0 if str(system) == System.HISPARSE.value else 1.0)


def _worker_init() -> None:
    """A worker leaves interrupts to the parent (which stops the pool) and dies quietly when it is stopped."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _pool(n: int):
    # modules every simulation loads on first use (numpy.random for the seeded lengths, numpy.ma
    # through np.percentile -> np.unique): imported once here, before the fork, not in every worker
    import numpy.ma  # noqa: F401
    import numpy.random  # noqa: F401

    return multiprocessing.get_context("fork").Pool(n, initializer=_worker_init)


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
    _results.clear()  # results of an earlier plan in this process are never reused
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
        with _pool(min(jobs, len(_tasks))) as pool:
            for i, r in pool.imap_unordered(_work, order, chunksize=1):
                if r is not None:
                    _results[keys[i]] = r
                    done += 1
                if on_point:
                    on_point()
            pool.close()
            pool.join()
    finally:
        _tasks = []
    return done


def _search_one(system: str) -> dict[bytes, RunResult]:
    global _only
    before = set(_results)
    _only = system
    try:
        if _search is not None:
            _search()
    except Exception:  # noqa: BLE001 - the stand-ins may lead it anywhere; the real search decides
        pass
    finally:
        _only = None
    return {k: v for k, v in _results.items() if k not in before}


def prefetch_search(search: Callable[[], Any], systems: tuple[str, ...] = (System.BASELINE.value, System.HISPARSE.value),
                    *, jobs: int | None = None) -> int:
    """Run ``search`` once per system in forked workers at once, each simulating only its own
    system's points (the others answered by an overloaded stand-in, which fails every target);
    keep what they simulated. Returns the points prefetched."""
    global _search, _stand_in
    jobs = jobs_from_env() if jobs is None else jobs
    if jobs <= 1 or not _results or "fork" not in multiprocessing.get_all_start_methods():
        return 0
    import dataclasses
    import math

    template = next(iter(_results.values()))
    _stand_in = dataclasses.replace(template, overloaded=True, tpot_p99_ms=math.inf, ttft_p99_s=math.inf,
                                    steady_tok_s_deployment=0.0)
    _search = search
    got = 0
    try:
        with _pool(min(jobs, len(systems))) as pool:
            for found in pool.imap_unordered(_search_one, systems, chunksize=1):
                _results.update(found)
                got += len(found)
            pool.close()
            pool.join()
    finally:
        _search, _stand_in = None, None
    return got


def forget() -> None:
    """Drop the prefetched results (tests; a long-lived process planning many scenarios)."""
    _results.clear()
