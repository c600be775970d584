"""Fit the synthetic generator's knobs to a (real) trace.

Read off the trace: ``sinks`` (mean selected positions in the sink region), ``run_mean``
(contiguous runs among each step's arrivals) and the burst knobs (the low tail of per-step
retention). Calibrated by simulation (moment matching, two rounds, a fixed seed, ``requests``
x ``layers`` streams of the real trace's shape): ``local_window`` to the local share (entries
that just left the window linger by retention), ``retention`` to the mean adjacent-step
overlap, ``zipf_alpha`` and ``passage_len`` together (a grid, then a finer one: they shape
reuse, hence the miss-ratio curve, jointly) to LRU's miss ratios at buffers of 1.5k, 2k and
4k and OPT's at 2k, and ``layer_corr`` to the adjacent-layer overlap.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..errors import HisparseError
from .generator import GeneratorKnobs, generate
from .sources import TraceSource
from .stats import LOCAL_TOKENS, SINK_TOKENS, layer_overlap, region_shares, step_overlap
from .stream import Stream

MISS_BUFFER_FACTOR = 2.0  # OPT is matched at a buffer of 2k
COMPARE_FACTORS = (1.5, 2.0, 4.0)  # buffers in multiples of k: LRU matched at all three


@dataclass
class FitResult:
    knobs: GeneratorKnobs
    target: dict[str, float]
    fitted: dict[str, float]
    shape: dict[str, int]
    comment: str = ""
    evaluations: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def structure(streams: list[Stream], k: int, buffers: tuple[int, ...] = ()) -> dict[str, float]:
    """The figures the fit matches: overlap mean/p10, sink and local shares, adjacent-layer
    overlap, and LRU and OPT miss ratios at ``buffers`` (HiSparse's replay defaults)."""
    ov = np.concatenate([step_overlap(s, k) for s in streams])
    acc = sum(s.accesses for s in streams)
    sinks = sum(region_shares(s)[0] for s in streams)
    local = sum(region_shares(s)[1] for s in streams)
    lov = [layer_overlap(a, b, k) for a, b in zip(streams, streams[1:], strict=False)
           if a.request == b.request]
    out = {"overlap_mean": float(ov.mean()), "overlap_p10": float(np.percentile(ov, 10)),
           "sink_share": sinks / acc, "local_share": local / acc,
           "layer_overlap_mean": float(np.concatenate(lov).mean()) if lov else float("nan")}
    if buffers:
        from ..replay import ReplayConfig, replay_stream

        for policy in ("lru", "opt"):
            for b in buffers:
                misses = sum(int(replay_stream(s, ReplayConfig(policy=policy, buffer=int(b)), k).sum())
                             for s in streams)
                out[f"{policy}_{b}"] = misses / acc
    return out


def _direct(streams: list[Stream], k: int) -> GeneratorKnobs:
    """Knobs read off the trace without simulation."""
    steps = sum(s.steps for s in streams)
    sink_n = sum(region_shares(s)[0] for s in streams) / steps
    local_n = sum(region_shares(s)[1] for s in streams) / steps
    sinks = int(round(min(sink_n, SINK_TOKENS)))
    local = max(1, int(round(min(local_n, LOCAL_TOKENS))))
    runs = arrivals = 0
    kept: list[np.ndarray] = []
    for s in streams:
        for t in range(1, s.steps):
            prev, cur = s.step(t - 1), s.step(t)
            lo, hi = sinks, int(s.ctx_len[t]) - local
            free_prev = prev[(prev >= lo) & (prev < hi)]
            new = np.setdiff1d(cur[(cur >= lo) & (cur < hi)], prev)
            if new.size:
                arrivals += new.size
                runs += 1 + int(np.count_nonzero(np.diff(new) != 1))
            if free_prev.size:
                kept.append(np.array([np.isin(free_prev, cur).mean()]))
    r = np.concatenate(kept) if kept else np.array([0.9])
    cut = 0.6 * float(np.median(r))
    burst = r < cut
    return GeneratorKnobs(
        sinks=sinks, local_window=local,
        retention=float(np.clip(r[~burst].mean() if (~burst).any() else r.mean(), 0.0, 1.0)),
        burst_prob=float(burst.mean()),
        burst_retention=float(np.clip(r[burst].mean(), 0.0, 1.0)) if burst.any() else 0.5,
        run_mean=max(1.0, arrivals / runs) if runs else 16.0)


def _bisect(f: Callable[[float], float], target: float, lo: float, hi: float, increasing: bool,
            iters: int) -> float:
    """x in [lo, hi] with f(x) ~ target for a monotone f (a few evaluations)."""
    best, best_err = (lo + hi) / 2, float("inf")
    for _ in range(iters):
        mid = (lo + hi) / 2
        v = f(mid)
        err = abs(v - target)
        if err < best_err:
            best, best_err = mid, err
        if (v < target) == increasing:
            lo = mid
        else:
            hi = mid
    return best


def fit_knobs(trace: TraceSource, *, seed: int = 0, layers: int = 2, requests: int = 2, rounds: int = 2,
              iters: int = 6, on_eval: Callable[[], None] | None = None) -> FitResult:
    """Fit knobs to ``trace`` (its first request's streams); see the module docstring.

    Each calibration run draws ``requests`` requests: a request's passage popularity is one
    random draw, and whether its popular passages sit in the initially loaded prefix moves
    the miss ratios a lot, so one request is too noisy to calibrate against."""
    k = trace.meta.k
    streams = [s for s in trace if s.steps > 1]
    if not streams:
        raise HisparseError(f"{trace.path}: no stream with two or more steps to fit")
    first = streams[0].request
    streams = [s for s in streams if s.request == first]
    steps = min(s.steps for s in streams)
    ctx0 = int(streams[0].ctx_len[0])
    if ctx0 <= k:
        raise HisparseError(f"{trace.path}: context {ctx0} <= k = {k} at step 0: nothing to fit")
    layers = max(2, min(layers, len(streams)))
    buffer = int(MISS_BUFFER_FACTOR * k)
    buffers = tuple(int(round(f * k)) for f in COMPARE_FACTORS)
    target = structure(streams, k, buffers)
    miss_names = [f"lru_{b}" for b in buffers] + [f"opt_{buffer}"]
    knobs = _direct(streams, k)
    count = [0]

    def measure(kn: GeneratorKnobs, with_miss: bool = False) -> dict[str, float]:
        count[0] += 1
        if on_eval:
            on_eval()
        syn = list(generate(kn, steps=steps, layers=layers, requests=requests, k=k, ctx0=ctx0, seed=seed))
        return structure(syn, k, buffers if with_miss else ())

    def miss_error(fig: dict[str, float]) -> float:
        """Squared log-ratio distance of the miss-ratio curve (LRU at 1.5k, 2k, 4k; OPT at 2k)."""
        return float(sum(np.log((fig[n] + 1e-4) / (target[n] + 1e-4)) ** 2 for n in miss_names))

    def grid(kn: GeneratorKnobs, alphas, lengths) -> GeneratorKnobs:
        """Popularity (zipf_alpha x passage_len) whose miss-ratio curve is nearest the real one:
        the two knobs shape the curve together, so they are searched jointly."""
        best = None
        for a in alphas:
            for n in lengths:
                cand = replace(kn, zipf_alpha=float(max(0.0, a)), passage_len=int(max(1, n)))
                err = miss_error(measure(cand, True))
                if best is None or err < best[0]:
                    best = (err, cand)
        return best[1]

    def tune(kn: GeneratorKnobs, knob: str, figure: str, lo: float, hi: float, increasing: bool,
             log2: bool = False) -> GeneratorKnobs:
        cast = type(getattr(kn, knob))  # int knobs are rounded; log2: search the exponent

        def value(x: float):
            x = 2.0 ** x if log2 else x
            return cast(round(x)) if cast is int else x

        miss = figure.startswith(("lru_", "opt_"))
        best = _bisect(lambda x: measure(replace(kn, **{knob: value(x)}), miss)[figure],
                       target[figure], lo, hi, increasing, iters)
        return replace(kn, **{knob: value(best)})

    for r in range(rounds):
        knobs = tune(knobs, "local_window", "local_share", 1, LOCAL_TOKENS, True)
        knobs = tune(knobs, "retention", "overlap_mean", 0.0, 1.0, True)
        if r == 0:
            knobs = grid(knobs, (1.0, 1.5, 2.0, 2.5, 3.0, 3.5), (32, 64, 128, 256, 512))
        else:  # refine around the best
            a, n = knobs.zipf_alpha, knobs.passage_len
            knobs = grid(knobs, (a - 0.25, a, a + 0.25), (round(n / 1.4), n, round(n * 1.4)))
        if np.isfinite(target["layer_overlap_mean"]):
            knobs = tune(knobs, "layer_corr", "layer_overlap_mean", 0.0, 1.0, True)
    knobs = tune(knobs, "retention", "overlap_mean", 0.0, 1.0, True)
    knobs.check()
    fitted = measure(knobs, True)
    shape = {"k": k, "steps": steps, "ctx0": ctx0, "layers": layers, "requests": requests}
    src = trace.meta.source or {}
    comment = (f"knobs fitted by `hisparse trace fit` to {trace.path.name} "
               f"(model {src.get('model', '?')}, k {k}, ctx0 {ctx0}, steps {steps}; seed {seed})\n"
               + "real vs fitted: " + ", ".join(f"{name} {target[name]:.4f}/{fitted[name]:.4f}"
                                                for name in target))
    return FitResult(knobs, target, fitted, shape, comment, count[0])



def compare(trace: TraceSource, knobs: GeneratorKnobs, *, factors: tuple[float, ...] = COMPARE_FACTORS,
            seed: int = 1, layers: int = 2, requests: int = 4) -> dict[str, tuple[float, float]]:
    """Real against synthetic (``knobs``, the real trace's shape, ``requests`` x ``layers``, ``seed``):
    {figure: (real, synthetic)} for overlap, sink and local shares, LRU and OPT miss ratios
    at buffers ``factor * k`` (HiSparse replay defaults: batched, prompt-prefix start)."""
    k = trace.meta.k
    streams = [s for s in trace if s.steps > 1]
    first = streams[0].request
    streams = [s for s in streams if s.request == first]
    steps = min(s.steps for s in streams)
    buffers = tuple(int(round(f * k)) for f in factors)
    real = structure(streams, k, buffers)
    syn = list(generate(knobs, steps=steps, layers=min(layers, len(streams)), requests=requests, k=k,
                        ctx0=int(streams[0].ctx_len[0]), seed=seed))
    fake = structure(syn, k, buffers)
    return {name: (real[name], fake[name]) for name in real}
