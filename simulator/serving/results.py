"""What one simulated load point reports, and the statistics behind it (bench_serving's
definitions: TPOT per request as (finish - first token) / (outputs - 1), TTFT from arrival to the
first token, ITL per token gap, weighted by the requests that waited for it)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class RunResult:
    """One simulated load point. Deployment figures cover every GPU; per-GPU ones say so."""

    system: str
    concurrency: int  # closed loop; 0 for open loop
    rate_per_s: float  # open loop arrival rate, requests/s for the deployment; 0 for closed loop
    steady_tok_s_deployment: float  # output tokens/s while the running set is steady
    steady_tok_s_per_gpu: float
    makespan_tok_s_deployment: float  # output tokens / time from first arrival to last finish
    steady_window_s: float  # length of the steady window (0: no steady window, steady = makespan figure)
    tpot_p50_ms: float
    tpot_p99_ms: float
    itl_p50_ms: float
    itl_p99_ms: float
    ttft_p50_s: float
    ttft_p99_s: float
    running_deployment: float  # mean running requests
    # the admission's steady-state estimate at the nominal lengths, outputs evenly staggered (memory and cap;
    # the ``overloaded`` rule): bunched finishes let the run pass it (peak_running_deployment)
    max_running_deployment: int
    served_req_s_deployment: float  # completed requests/s
    overloaded: bool  # open loop: arrivals faster than the deployment serves them
    hbm_static_gb_per_gpu: float  # weights + the KV pool SGLang allocates at start-up
    kv_used_gb_per_gpu: float  # peak device KV in use
    host_used_gb_per_gpu: float  # peak pinned host KV in use
    step_ms_mean: float
    swap_share: float  # share of decode time in swap-in
    comm_share: float  # share of decode time in collectives
    miss_share: float  # mean share of top-k missed per request step
    requests: int
    sim_time_s: float
    retractions: int = 0  # requests SGLang's retract_decode sent back to the queue (deployment)
    reprefill_tokens: float = 0.0  # prompt + generated tokens prefilled again after retractions (deployment)
    peak_running_deployment: int = 0  # most requests decoding at once (the fullest moment)
    tpot_mean_ms: float = math.nan  # bench_serving's mean TPOT over requests
    itl_mean_ms: float = math.nan  # mean inter-token gap, weighted by the requests that waited for it
    ttft_mean_s: float = math.nan
    total_tok_s_per_gpu: float = 0.0  # input + output tokens / duration / GPUs (the cookbooks' tok/s/GPU)
    gpus: int = 0  # GPUs of the deployment
    residency: str = ""  # HiSparse: the residency policy (serving/residency.py); "" baseline
    resident_share: float = 0.0  # dynamic residency: share of request-steps whose whole KV was on the device
    demotions: int = 0  # dynamic residency: requests demoted to swap mode (or first spilled), deployment
    demoted_tokens: float = 0.0  # dynamic residency: KV positions given back to the host, deployment
    demotion_copy_ms: float = 0.0  # dynamic residency: the demotions' copy time, one instance (the ranks wait)
    kv_transfer_ms: float = 0.0  # pd-decode across nodes: mean prefill-to-decode KV transfer per request
    kv_transfer_exposed_ms: float = 0.0  # of it, what the prefill did not hide (added to TTFT)
    # passes with a prompt chunk on some rank (the others decode one step in them or idle): share of the
    # simulated time, and how many of the instance's ranks ran a chunk in such a pass on average (under
    # DP attention, dp when every rank refills at once: prefill in waves; near 1: spread out)
    extend_pass_share: float = 0.0
    extending_ranks_mean: float = 0.0


def steady_rate(blocks: list[tuple[float, float, float]], t0: float, t1: float) -> float:
    """Output tokens/s of the decode passes ``blocks`` ((start, end, tokens), each pass's tokens
    spread evenly over it) within the window [t0, t1]."""
    tokens = 0.0
    for s, e, n in blocks:
        if e <= t0 or s >= t1 or e <= s:
            continue
        tokens += n * (min(e, t1) - max(s, t0)) / (e - s)
    return tokens / (t1 - t0)


def pct(a: np.ndarray, q: float) -> float:
    return float(np.percentile(a, q)) if a.size else math.nan


def wpct(values: np.ndarray, weights: np.ndarray, *qs: float) -> tuple[float, ...]:
    """Weighted percentiles (each step's gap counted once per request that waited for it), one
    sort for all of ``qs``."""
    if not values.size:
        return tuple(math.nan for _ in qs)
    order = np.argsort(values)
    cw = np.cumsum(weights[order])
    ranked = values[order]
    return tuple(float(ranked[min(int(np.searchsorted(cw, q / 100 * cw[-1])), values.size - 1)]) for q in qs)


def mean(a: np.ndarray) -> float:
    return float(a.mean()) if a.size else math.nan


def wmean(values: np.ndarray, weights: np.ndarray) -> float:
    return float(np.average(values, weights=weights)) if values.size else math.nan
