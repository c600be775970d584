"""Fit the synthetic generator's knobs to a (real) trace.

Read off the trace: ``sinks`` and ``sink_probs`` (how often each of the first 16 positions is
selected), ``run_mean`` (contiguous runs among each step's arrivals), the burst knobs (the low
tail of per-step retention) and ``recall_prob`` (the share of arrivals selected before).
Calibrated by simulation (bisection on one figure at a time, a fixed seed, ``requests`` x
``layers`` streams of the real trace's shape; common random numbers): ``local_window`` to the
local share, ``retention`` to the mean adjacent-step overlap, ``layer_corr`` to the
adjacent-layer overlap and ``zipf_alpha`` (popularity by recency, ``pop_recent``) to how far
back first-time selections reach, on quick draws (the first steps, no replays); then
reuse against LRU's and OPT's miss ratios at buffers of 1.5k, 2k and 4k: for each candidate
``recall_spread`` (the curve's slope) and ``recall_prob`` (first-time loads), ``recall_gap`` is
bisected to the curve's level (mean log miss ratio) and the candidate nearest the whole curve
(squared log ratios) is kept.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..errors import HisparseError
from ..replay import ReplayConfig, replay_stream
from ..trace.generator import GeneratorKnobs, generate
from ..trace.sources import TraceSource
from ..trace.stats import (
    LOCAL_TOKENS,
    SINK_TOKENS,
    first_depth,
    layer_overlap,
    region_shares,
    reuse_gaps,
    step_overlap,
)
from ..trace.stream import Stream

COMPARE_FACTORS = (1.5, 2.0, 4.0)  # buffers in multiples of k: LRU and OPT matched at all three
QUICK_STEPS = 192  # steps of the quick draws that calibrate shares and overlaps


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
        for policy in ("lru", "opt"):
            for b in buffers:
                misses = sum(int(replay_stream(s, ReplayConfig(policy=policy, buffer=int(b)), k).sum())
                             for s in streams)
                out[f"{policy}_{b}"] = misses / acc
    return out


def _gap_figures(streams: list[Stream]) -> dict[str, float]:
    gaps, first = reuse_gaps(streams)
    n = gaps.size + first
    return {"gap_median": float(np.median(gaps)) if gaps.size else 1.0,
            "gap_logstd": float(np.log(gaps).std()) if gaps.size else 0.0,
            "first_share": first / n if n else 0.0}


def _direct(streams: list[Stream], k: int) -> GeneratorKnobs:
    """Knobs read off the trace without simulation."""
    steps = sum(s.steps for s in streams)
    local_n = sum(region_shares(s)[1] for s in streams) / steps
    # sinks: the first SINK_TOKENS positions, each selected as often as in the trace
    freq = np.zeros(SINK_TOKENS)
    for s in streams:
        freq += np.bincount(s.indices[(s.indices >= 0) & (s.indices < SINK_TOKENS)], minlength=SINK_TOKENS)
    freq = np.clip(freq / steps, 0.0, 1.0)
    sinks = SINK_TOKENS
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
    gap = _gap_figures(streams)
    return GeneratorKnobs(
        sinks=sinks, local_window=local,
        retention=float(np.clip(r[~burst].mean() if (~burst).any() else r.mean(), 0.0, 1.0)),
        burst_prob=float(burst.mean()),
        burst_retention=float(np.clip(r[burst].mean(), 0.0, 1.0)) if burst.any() else 0.5,
        run_mean=max(1.0, arrivals / runs) if runs else 16.0,
        sink_probs=tuple(round(float(f), 4) for f in freq), pop_recent=True,
        recall_prob=float(np.clip(1.0 - gap["first_share"], 0.0, 0.99)),
        recall_gap=max(1.0, gap["gap_median"]), recall_spread=gap["gap_logstd"])


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


# Synthetic draws per round and bisection step of ``fit_knobs`` (five tuned knobs and the spreads
# tried for the recall gap): the work budget's estimate.
DRAWS_PER_ROUND_ITER = 8


def fit_knobs(trace: TraceSource, *, seed: int = 0, layers: int = 2, requests: int = 2, rounds: int = 2,
              iters: int = 6, on_eval: Callable[[], None] | None = None) -> FitResult:
    """Fit knobs to ``trace`` (its first request's streams); see the module docstring.

    Each calibration run draws ``requests`` x ``layers`` streams with the same seed (common
    random numbers: a knob's effect is not hidden by a new draw)."""
    k = trace.meta.k
    streams = [s for s in trace if s.steps > 1]
    if not streams:
        raise HisparseError(f"{trace.path}: no stream with two or more steps to fit")
    first = streams[0].request
    streams = sorted((s for s in streams if s.request == first), key=lambda s: s.layer)
    # IndexShare: layers that repeat the layer before them are shared; the knobs describe the anchors
    # (the fit measures and draws those) and carry the rule that places the copies (share_freq/offset)
    from ..layer_groups import detect_shared, infer_rule

    anchor_of = detect_shared(streams)
    n_shared = sum(1 for i, a in enumerate(anchor_of) if a != i)
    rule = infer_rule(anchor_of) if n_shared else None
    if n_shared:
        streams = [s for i, s in enumerate(streams) if anchor_of[i] == i]
    steps = min(s.steps for s in streams)
    ctx0 = int(streams[0].ctx_len[0])
    if ctx0 <= k:
        raise HisparseError(f"{trace.path}: context {ctx0} <= k = {k} at step 0: nothing to fit")
    layers = max(2, min(layers, len(streams)))
    from .. import limits

    limits.check(rounds * iters * DRAWS_PER_ROUND_ITER * requests * layers * steps * k, "HISPARSE_MAX_TRACE_ENTRIES",
                 f"trace fit of {trace.path} (--rounds {rounds} x --iters {iters} x ~{DRAWS_PER_ROUND_ITER} draws of "
                 f"--requests {requests} x --layers {layers} x {steps} steps x k {k})", unit="top-k entries to draw",
                 hint="fewer --rounds, --iters, --requests or --layers")
    buffers = tuple(int(round(f * k)) for f in COMPARE_FACTORS)
    target = structure(streams, k, buffers)
    target["first_depth"] = first_depth(streams)
    miss_names = [f"{p}_{b}" for p in ("lru", "opt") for b in buffers]
    target["miss_level"] = _miss_level(target, miss_names)
    knobs = _direct(streams, k)
    count = [0]
    cache: dict[tuple[GeneratorKnobs, bool], dict[str, float]] = {}
    quick_steps = min(steps, QUICK_STEPS)

    def measure(kn: GeneratorKnobs, full: bool = True) -> dict[str, float]:
        """Figures of a synthetic draw; not ``full``: the first steps only, no replays
        (enough for the shares and overlaps, several times faster)."""
        if (kn, full) not in cache:
            count[0] += 1
            if on_eval:
                on_eval()
            syn = list(generate(kn, steps=steps if full else quick_steps, layers=layers,
                                requests=requests, k=k, ctx0=ctx0, seed=seed))
            fig = structure(syn, k, buffers if full else ())
            fig["first_depth"] = first_depth(syn)
            if full:
                fig["miss_level"] = _miss_level(fig, miss_names)
            cache[kn, full] = fig
        return cache[kn, full]

    def miss_error(fig: dict[str, float]) -> float:
        """Squared log-ratio distance of the miss-ratio curves (LRU and OPT at 1.5k, 2k, 4k)."""
        return float(sum(np.log((fig[n] + 1e-4) / (target[n] + 1e-4)) ** 2 for n in miss_names))

    def pick(cands: list[GeneratorKnobs]) -> GeneratorKnobs:
        return min(cands, key=lambda c: miss_error(measure(c)))

    def tune(kn: GeneratorKnobs, knob: str, figure: str, lo: float, hi: float, increasing: bool,
             log2: bool = False) -> GeneratorKnobs:
        cast = type(getattr(kn, knob))  # int knobs are rounded; log2: search the exponent
        full = figure.startswith(("lru_", "opt_", "miss_"))

        def value(x: float):
            x = 2.0 ** x if log2 else x
            return cast(round(x)) if cast is int else x

        best = _bisect(lambda x: measure(replace(kn, **{knob: value(x)}), full)[figure],
                       target[figure], lo, hi, increasing, iters)
        return replace(kn, **{knob: value(best)})

    def structure_knobs(kn: GeneratorKnobs) -> GeneratorKnobs:
        kn = tune(kn, "local_window", "local_share", 1, LOCAL_TOKENS, True)
        kn = tune(kn, "retention", "overlap_mean", 0.0, 1.0, True)
        if np.isfinite(target["layer_overlap_mean"]):
            kn = tune(kn, "layer_corr", "layer_overlap_mean", 0.0, 1.0, True)
        # popularity by recency: how far back first-time selections reach
        return tune(kn, "zipf_alpha", "first_depth", 0.0, 3.0, False)

    def reuse(kn: GeneratorKnobs, **change) -> GeneratorKnobs:
        """``change`` applied, then recall_gap set to the miss-ratio level."""
        return tune(replace(kn, **change), "recall_gap", "miss_level", 0.0, 7.0, True, log2=True)

    # Shares and overlaps first (quick draws), then reuse against the miss-ratio curves: for
    # each candidate spread of the recall gaps (the curve's slope over buffer sizes) and share
    # of recalls among new entries (first-time loads: OPT's floor), recall_gap is set to the
    # curve's level; the candidate nearest the whole curve wins.
    for r in range(rounds):
        knobs = structure_knobs(knobs)
        s = knobs.recall_spread
        spreads = (0.6, 1.0, 1.4, 1.8, 2.2, 2.6) if r == 0 else (max(0.0, s - 0.2), s, s + 0.2)
        knobs = pick([reuse(knobs, recall_spread=float(v)) for v in spreads])
        if r == rounds - 1:
            fresh = 1.0 - knobs.recall_prob
            knobs = pick([knobs] + [reuse(knobs, recall_prob=float(np.clip(1.0 - fresh * f, 0.0, 1.0)))
                                    for f in (0.6, 1.6)])
    knobs.check()
    fitted = measure(knobs)
    shape = {"k": k, "steps": steps, "ctx0": ctx0, "layers": layers, "requests": requests}
    src = trace.meta.source or {}
    share = ""
    if n_shared:
        share = (f"\nIndexShare: {len(anchor_of) - n_shared} anchor and {n_shared} shared layers of {len(anchor_of)} "
                 f"(shared layers repeat the layer before them); fitted on the anchors; "
                 + (f"rule index_topk_freq {rule[0]}, index_skip_topk_offset {rule[1]}" if rule else
                    "no freq/offset rule gives this pattern: the knobs draw every layer"))
        if rule:
            knobs = replace(knobs, share_freq=rule[0], share_offset=rule[1])
    comment = (f"knobs fitted by `hisparse trace fit` to {trace.path.name} "
               f"(model {src.get('model', '?')}, k {k}, ctx0 {ctx0}, steps {steps}; seed {seed})\n"
               + "real vs fitted: " + ", ".join(f"{name} {target[name]:.4f}/{fitted[name]:.4f}"
                                                for name in target if np.isfinite(target[name])) + share)
    return FitResult(knobs, target, fitted, shape, comment, count[0])


def _miss_level(fig: dict[str, float], names: list[str]) -> float:
    """Mean log miss ratio: one number that moves with the whole curve."""
    return float(np.mean([np.log(fig[n] + 1e-4) for n in names]))


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
