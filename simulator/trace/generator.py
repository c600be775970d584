"""Synthetic top-k traces with the structure real ones have (BRIEF section 4).

Each step selects k positions out of a context that grows one token per step:
- ``sinks`` first positions and the last ``local_window`` positions (the newest included) always;
- a share ``retention`` of the rest of the previous step's set is kept (preferring, by
  ``layer_corr``, the entries the layer above selects at this step) (``burst_retention`` on
  burst steps, which come with probability ``burst_prob``: a change of topic);
- the remainder is new: with probability ``layer_corr`` an entry of the layer above at the same
  step; with probability ``recall_prob`` an entry selected before and dropped since (recalled:
  its gap, steps since it was last selected, is log-normal with median ``recall_gap`` and log
  spread ``recall_spread``, at least 2; the entry last selected nearest that gap, at or before
  it; ``recall_draws`` (at most 1024) candidates per recall are drawn with replacement, so 2 re-select ~86%
  of a step's worth of candidates and 8 nearly all); otherwise contiguous runs (mean length ``run_mean``) inside passages of ``passage_len``
  tokens chosen by Zipf(``zipf_alpha``) popularity (ranked at random per request, or with
  ``pop_recent`` by recency: real models' first-time selections lean to recent text).
- ``above_fresh``: draw the entries taken from the layer above among those not chosen yet
  (without it, a draw that lands on a kept entry is lost, so fewer than ``layer_corr`` of the
  new entries come from above: the old behaviour, kept for the committed traces);
- ``sink_probs`` (if given, one per sink position): sink position i is selected with
  probability ``sink_probs[i]`` at each step, independently (real models select the first token
  in most steps, not all, and its neighbours rarely).
- ``profile`` (optional): knobs that vary with layer depth, as breakpoints ``(depth, value)`` per
  knob, depth = layer / (layers - 1) in [0, 1], linear between breakpoints and constant beyond
  them (two breakpoints at nearly one depth make a step). Real DSA layers differ: layer 0 keeps
  almost nothing from one step to the next while middle layers keep 35-50% (BRIEF section 4).
- ``share_freq`` / ``share_offset`` (IndexShare, GLM-5.2: ``index_topk_freq`` 4, ``index_skip_topk_offset``
  3): only the anchor layers (``simulator.layer_groups.anchor_map``) draw their selections; a shared
  layer's stream is its anchor's, entry for entry (it attends with the anchor's top-k), and the next
  anchor correlates with the layer above it as before (a shared layer: its anchor's rows).
New knobs default to the old behaviour (sink_probs empty, recall_prob 0, no profile): the
presets draw the same random numbers as before, so their traces are byte-identical.
While the context holds at most k tokens, every position is selected (DSA's behaviour).
Steps are stored sorted. The same knobs and seed give the same streams, bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..bundled import data_path
from ..errors import HisparseError
from .stream import Stream

MAX_RECALL_DRAWS = 1024.0  # recall_draws above this re-select no more and only cost memory


@dataclass(frozen=True)
class GeneratorKnobs:
    sinks: int = 4
    local_window: int = 64
    retention: float = 0.965
    burst_prob: float = 0.03
    burst_retention: float = 0.5
    run_mean: float = 16.0
    passage_len: int = 256
    zipf_alpha: float = 1.1
    layer_corr: float = 0.5
    recall_prob: float = 0.0
    recall_gap: float = 8.0
    recall_spread: float = 1.0
    sink_probs: tuple[float, ...] = ()
    pop_recent: bool = False
    above_fresh: bool = False
    recall_draws: float = 2.0
    profile: tuple[tuple[str, tuple[tuple[float, float], ...]], ...] = ()
    share_freq: int = 1
    share_offset: int = 0

    def at_layer(self, layer: int, layers: int) -> GeneratorKnobs:
        """The knobs of one layer: the profile's values at its depth, the others unchanged."""
        return self.at_depth(layer / (layers - 1) if layers > 1 else 0.0)

    def at_depth(self, depth: float) -> GeneratorKnobs:
        """The knobs at ``depth`` (0: the first layer, 1: the last) of the profile, the others unchanged."""
        if not self.profile:
            return self
        change: dict[str, Any] = {"profile": ()}
        for name, points in self.profile:
            xs, ys = zip(*points, strict=True)
            value = float(np.interp(depth, xs, ys))
            change[name] = int(round(value)) if isinstance(getattr(self, name), int) else value
        return replace(self, **change)

    def check(self) -> None:
        """Raise HisparseError naming the first knob out of range (a profile's breakpoints
        too: the ranges are intervals, so values between breakpoints are in range as well)."""
        self._check_profile()
        base = replace(self, profile=())
        base._check_own()  # the flat knobs first: a profile's check would otherwise take their error as its own
        for name, points in self.profile:
            cast = type(getattr(self, name))
            for _, value in points:
                try:
                    replace(base, **{name: cast(round(value)) if cast is int else value})._check_own()
                except HisparseError as exc:
                    raise HisparseError(f"profile {name}: {exc}") from None

    def _check_profile(self) -> None:
        known = {f.name for f in fields(GeneratorKnobs)} - {"profile", "sink_probs", "pop_recent", "share_freq",
                                                            "share_offset"}
        for name, points in self.profile:
            if name not in known:
                raise HisparseError(f"profile knob {name!r} is not a numeric knob (known: {', '.join(sorted(known))})")
            depths = [d for d, _ in points]
            if not points or any(not 0.0 <= d <= 1.0 for d in depths) or depths != sorted(depths):
                raise HisparseError(f"profile {name}: breakpoints need depths in [0, 1], ascending; got {depths}")

    def for_k(self, k: int) -> tuple[GeneratorKnobs, list[str]]:
        """The knobs as ``generate`` applies them at top-k ``k`` (sinks at most k - 1, the local
        window at most what is left: the newest token always fits), and a note per knob that
        changed. A trace records these, what it was generated with, not what was asked for."""
        sinks = min(self.sinks, k - 1)
        local = min(self.local_window, k - sinks)
        notes = []
        if sinks != self.sinks:
            notes.append(f"knob sinks = {self.sinks} is more than k - 1 = {k - 1}: generated and recorded as {sinks}")
        if local != self.local_window:
            notes.append(f"knob local_window = {self.local_window} leaves no room in k = {k} after {sinks} sinks: "
                         f"generated and recorded as {local}")
        probs = self.sink_probs[:sinks] if self.sink_probs else ()
        return replace(self, sinks=sinks, local_window=local, sink_probs=probs), notes

    def _check_own(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            values = v if f.name == "sink_probs" else (v,) if isinstance(v, float) else ()
            if any(not math.isfinite(x) for x in values):
                raise HisparseError(f"knob {f.name} = {v} must be a finite number")
        for name in ("retention", "burst_prob", "burst_retention", "layer_corr", "recall_prob"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise HisparseError(f"knob {name} = {v} must lie in [0, 1]")
        for name in ("sinks", "local_window"):
            if getattr(self, name) < 0:
                raise HisparseError(f"knob {name} = {getattr(self, name)} must be >= 0")
        if self.local_window < 1:
            raise HisparseError("knob local_window must be >= 1 (the newest token is always selected)")
        if self.run_mean < 1 or self.passage_len < 1 or self.zipf_alpha < 0:
            raise HisparseError("knobs run_mean and passage_len must be >= 1 and zipf_alpha >= 0")
        if self.sink_probs and (len(self.sink_probs) != self.sinks
                                or not all(0.0 <= p <= 1.0 for p in self.sink_probs)):
            raise HisparseError(f"knob sink_probs needs {self.sinks} (sinks) values in [0, 1]")
        if self.share_freq < 1 or self.share_offset < 0:
            raise HisparseError("knobs share_freq must be >= 1 and share_offset >= 0 (IndexShare's "
                                "index_topk_freq / index_skip_topk_offset)")
        if self.recall_gap < 1 or self.recall_spread < 0 or self.recall_draws < 1:
            raise HisparseError("knobs recall_gap and recall_draws must be >= 1 and recall_spread >= 0")
        if self.recall_draws > MAX_RECALL_DRAWS:  # each recall draws this many candidates: 1e12 ran out of memory
            raise HisparseError(f"knob recall_draws = {self.recall_draws} must be <= {MAX_RECALL_DRAWS} (candidates "
                                "per recall; 8 already re-select nearly every candidate)")


PRESETS: dict[str, GeneratorKnobs] = {
    # ~95% adjacent-step overlap, some bursts, moderate layer correlation. Formerly "dsa-like":
    # no DSA measurement supports it (real DeepSeek-V3.2 keeps 35-50% in its middle layers,
    # BRIEF section 4); kept for the committed traces and tests that use it.
    "high-overlap": GeneratorKnobs(),
    # Very stable selections: adjacent-step overlap >= 0.9 by a margin.
    "high-locality": GeneratorKnobs(local_window=128, retention=0.98, burst_prob=0.005,
                                    burst_retention=0.8, run_mean=32.0, layer_corr=0.7),
    # Frequent topic changes: low-overlap steps come often.
    "bursty": GeneratorKnobs(retention=0.85, burst_prob=0.12, burst_retention=0.15,
                             run_mean=8.0, layer_corr=0.3),
}


# Old names still found in committed traces' provenance (and used by older callers).
PRESET_ALIASES = {"dsa-like": "high-overlap"}
PRESETS.update({alias: PRESETS[name] for alias, name in PRESET_ALIASES.items()})
# Presets fitted to published DSA statistics: knobs files next to their targets (traces/presets/).
PRESETS_DIR = data_path("traces/presets")
FITTED_PRESETS = ("glm51-longbench", "dsv32")


def preset_names() -> list[str]:
    """Every preset `--preset` takes (aliases left out)."""
    return list(FITTED_PRESETS) + [n for n in PRESETS if n not in PRESET_ALIASES and n not in FITTED_PRESETS]


def load_knobs(spec: str) -> GeneratorKnobs:
    """A preset name, or a TOML file of knobs (missing knobs take the high-overlap defaults)."""
    if spec in PRESETS:
        return PRESETS[spec]
    if spec in FITTED_PRESETS:
        raise HisparseError(f"preset {spec!r}: its knobs file {PRESETS_DIR / (spec + '.toml')} is missing")
    path = Path(spec)
    if not path.exists():
        raise HisparseError(f"unknown preset {spec!r} (presets: {', '.join(preset_names())}; "
                            "or give a knobs .toml file)")
    from ..inputs import read_toml

    data = read_toml(path, what="knobs file")
    if "knobs" in data:  # a [knobs] table: nothing else belongs beside it ([knobz], a stray key were ignored)
        other = sorted(set(data) - {"knobs"})
        if other:
            raise HisparseError(f"{path}: unknown key(s) or table(s) {', '.join(other)} beside [knobs] "
                                "(a knobs file is one [knobs] table, with [knobs.profile] inside it)")
    return knobs_from_dict(data.get("knobs", data), path)


def knobs_from_dict(data: dict[str, Any], path: Path | str) -> GeneratorKnobs:
    """Knobs from a parsed ``[knobs]`` table (``path`` names it in errors); missing knobs take
    the defaults."""
    if not isinstance(data, dict):
        raise HisparseError(f"{path}: knobs must be a table ([knobs] with name = value lines), got {data!r}")
    data = dict(data)
    if isinstance(data.get("profile"), dict):
        try:
            data["profile"] = tuple((name, tuple((float(d), float(v)) for d, v in points))
                                    for name, points in data["profile"].items())
        except (TypeError, ValueError) as exc:
            raise HisparseError(f"{path}: profile: each knob needs [[depth, value], ...] ({exc})") from None
    known = {f.name: f.type for f in fields(GeneratorKnobs)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise HisparseError(f"{path}: unknown knob(s) {', '.join(unknown)} (known: {', '.join(known)})")
    defaults = GeneratorKnobs()
    values = {}
    for k, v in data.items():
        try:
            values[k] = _cast(getattr(defaults, k), v)
        except (TypeError, ValueError, OverflowError) as exc:
            raise HisparseError(f"{path}: knob {k}: needs {exc}") from None
    knobs = replace(defaults, **values)
    try:
        knobs.check()
    except HisparseError as exc:
        raise HisparseError(f"{path}: {exc}") from None
    return knobs


def _register_fitted_presets() -> None:
    """The fitted presets join PRESETS from their knobs files (read once, at import)."""
    for name in FITTED_PRESETS:
        path = PRESETS_DIR / f"{name}.toml"
        if path.exists():
            PRESETS[name] = load_knobs(str(path))


# Knobs added after the first traces were written: left out of a trace's metadata and of a
# knobs file while all are at their default (off) values, so older outputs stay byte-identical.
LATER_KNOBS = ("sink_probs", "recall_prob", "recall_gap", "recall_spread", "pop_recent", "above_fresh", "recall_draws", "profile")
SHARE_KNOBS = ("share_freq", "share_offset")  # left out while IndexShare is off (share_freq 1)


def knobs_dict(knobs: GeneratorKnobs) -> dict[str, Any]:
    """The knobs as a dict; the later knobs only when one of them is not at its default."""
    out = asdict(knobs)
    default = GeneratorKnobs()
    if all(out[name] == getattr(default, name) for name in LATER_KNOBS):
        for name in LATER_KNOBS:
            del out[name]
    if knobs.share_freq == 1:
        for name in SHARE_KNOBS:
            del out[name]
    return out


def _cast(default, value):
    """A knob value from TOML as the type of its default (lists of floats for tuples)."""
    if isinstance(value, tuple) and value and isinstance(value[0], tuple):  # a profile, already parsed
        return value
    number = (int, float)
    if isinstance(default, tuple):
        if not isinstance(value, list | tuple) or not all(isinstance(x, number) and not isinstance(x, bool)
                                                          for x in value):
            raise TypeError(f"a list of numbers, got {value!r}")
        return tuple(float(x) for x in value)
    # bool(3) and int(1.5) would pass silently as True and 1: the TOML type must match
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise TypeError(f"true or false, got {value!r}")
        return value
    if isinstance(value, bool) or not isinstance(value, number):
        raise TypeError(f"a number, got {value!r}")
    if isinstance(default, int) and not float(value).is_integer():
        raise TypeError(f"an integer, got {value!r}")
    return type(default)(value)


def knobs_to_toml(knobs: GeneratorKnobs, comment: str = "") -> str:
    """TOML text for a knobs file (readable by load_knobs)."""
    lines = [f"# {c}" for c in comment.splitlines()] + ["[knobs]"]
    for name, value in knobs_dict(knobs).items():
        if name == "profile":
            continue
        if isinstance(value, bool):
            lines.append(f"{name} = {str(value).lower()}")
        else:
            lines.append(f"{name} = {list(value)!r}" if isinstance(value, tuple) else f"{name} = {value!r}")
    if knobs.profile:
        lines += ["", "# knobs by layer depth (layer / (layers - 1)): [depth, value] breakpoints, linear between",
                  "[knobs.profile]"]
        for name, points in knobs.profile:
            lines.append(f"{name} = [" + ", ".join(f"[{d!r}, {round(v, 6)!r}]" for d, v in points) + "]")
    return "\n".join(lines) + "\n"


class _Popularity:
    """Zipf popularity over passages of the context: ranks a random permutation fixed per
    request, or (``pop_recent``) by recency, the passage of the newest tokens first."""

    def __init__(self, knobs: GeneratorKnobs, max_ctx: int, rng: np.random.Generator) -> None:
        n = max_ctx // knobs.passage_len + 1
        ranks = np.arange(1, n + 1)
        with np.errstate(over="ignore", under="ignore"):  # a large zipf_alpha: weight 0 past rank 1, meant so
            weights = 1.0 / ranks ** knobs.zipf_alpha
        self.recent = knobs.pop_recent
        order = None if self.recent else rng.permutation(n)
        self.weights = weights if order is None else weights[order]
        self.ranks = ranks if order is None else ranks[order]  # for the fallback of _probabilities
        self.alpha = knobs.zipf_alpha
        self.passage_len = knobs.passage_len

    def _probabilities(self, n_passages: int) -> np.ndarray:
        """The draw probability of each of the first ``n_passages`` passages."""
        w = self.weights[:n_passages][::-1] if self.recent else self.weights[:n_passages]
        total = w.sum()
        if total > 0:
            return w / total
        # every weight in reach underflowed (zipf_alpha of hundreds; 0/0 gave NaN probabilities,
        # a ValueError traceback): the same Zipf law relative to the best rank in reach
        r = self.ranks[:n_passages][::-1] if self.recent else self.ranks[:n_passages]
        with np.errstate(over="ignore", under="ignore"):
            p = np.exp(-self.alpha * (np.log(r) - np.log(r.min())))
        return p / p.sum()

    def draw_runs(self, rng: np.random.Generator, lo: int, hi: int, count: int, run_mean: float) -> np.ndarray:
        """Positions of about ``count`` entries in contiguous runs inside [lo, hi)."""
        n_passages = max(1, -(-hi // self.passage_len))
        n_runs = max(1, int(np.ceil(count / run_mean)) + 2)
        passage = rng.choice(n_passages, size=n_runs, p=self._probabilities(n_passages))
        starts = passage * self.passage_len + rng.integers(0, self.passage_len, size=n_runs)
        # a run's positions at or past hi are dropped below: cut every run there (the same
        # positions; a run_mean of 1e9 drew runs of billions of positions, 1e300 overflowed)
        lengths = np.minimum(rng.geometric(1.0 / run_mean, size=n_runs), hi)
        pos = np.repeat(starts - np.cumsum(np.r_[0, lengths[:-1]]), lengths) + np.arange(lengths.sum())
        return pos[(pos >= lo) & (pos < hi)]


def _fill(rng, chosen: np.ndarray, candidates: np.ndarray, need: int) -> np.ndarray:
    """The first ``need`` distinct candidates not already chosen, in draw order."""
    if need <= 0 or candidates.size == 0:
        return candidates[:0]
    taken = np.zeros(int(max(candidates.max(), chosen.max(initial=-1))) + 1, dtype=bool)
    taken[chosen] = True  # the same as ~np.isin(candidates, chosen), without sorting
    fresh = candidates[~taken[candidates]]
    _, first = np.unique(fresh, return_index=True)
    return fresh[np.sort(first)][:need]


class _History:
    """When each position was last selected (-1: never), the current step, and the rows of the
    steps so far (sorted), per stream."""

    def __init__(self, max_ctx: int, steps: int) -> None:
        self.last = np.full(max_ctx, -1, dtype=np.int16 if steps < 2**15 - 1 else np.int64)
        self.t = 0
        self.rows: list[np.ndarray] = []
        self.count = np.zeros(steps + 1, dtype=np.int64)  # positions whose last selection is step v

    def select(self, row: np.ndarray) -> None:
        """Record step t's row (sorted)."""
        old = self.last[row]
        vals, n = np.unique(old[old >= 0], return_counts=True)
        self.count[vals] -= n
        self.count[self.t] += row.size
        self.last[row] = self.t
        self.rows.append(row)


def _recall(rng, knobs: GeneratorKnobs, hist: _History, lo: int, hi: int, ctx: int, count: int) -> np.ndarray:
    """About ``count`` positions in [lo, hi) selected before and not at the previous step, each
    last selected nearest (at or before) a log-normal gap before now: for a wanted step v, the
    latest step g <= v that is still some position's last selection, and a uniform pick among
    the positions last selected at g (ascending; the same picks as indexing a stable sort of
    the positions by last selection, without sorting the context every step)."""
    with np.errstate(over="ignore"):  # an infinite gap reaches back to step 0, as a huge one does
        gaps = np.maximum(2.0, np.rint(knobs.recall_gap * np.exp(knobs.recall_spread * rng.standard_normal(count))))
    u = rng.random(count)
    want = np.maximum(hist.t - gaps, -1).astype(np.int64)
    # positions per last step within [lo, hi): the stream's counts less the few outside
    outside = np.r_[hist.last[:lo], hist.last[hi:ctx]].astype(np.int64)
    vals, n = np.unique(outside[outside >= 0], return_counts=True)
    counts = {}
    g = np.full(count, -1, dtype=np.int64)
    for v in np.unique(want):
        step = int(v)
        while step >= 0:  # the latest step at or before v that is still someone's last
            if step not in counts:
                i = np.searchsorted(vals, step)
                counts[step] = int(hist.count[step]) - (int(n[i]) if i < vals.size and vals[i] == step else 0)
            if counts[step] > 0:
                break
            step -= 1
        g[want == v] = step
    ok = g >= 0
    g, u = g[ok], u[ok]
    keys = np.array(sorted(counts), dtype=np.int64)
    counts_g = np.array([counts[int(x)] for x in keys], dtype=np.int64)[np.searchsorted(keys, g)]
    pick = (u * counts_g).astype(np.int64)
    out = np.empty(g.size, dtype=np.int64)
    for step in np.unique(g):
        row = hist.rows[step]
        row = row[(row >= lo) & (row < hi)]
        group = row[hist.last[row] == step]  # ascending: rows are sorted
        sel = g == step
        out[sel] = group[pick[sel]]
    return out


def _step(rng, knobs: GeneratorKnobs, pop: _Popularity, k: int, ctx: int, prev: np.ndarray,
          above: np.ndarray | None, hist: _History | None = None) -> np.ndarray:
    if ctx <= k:
        return np.arange(ctx, dtype=np.int64)
    sinks = min(knobs.sinks, k - 1)  # small k: the newest token still fits
    local = min(knobs.local_window, k - sinks)
    lo, hi = sinks, ctx - local
    if knobs.sink_probs:
        sink_pos = np.flatnonzero(rng.random(sinks) < np.asarray(knobs.sink_probs[:sinks]))
    else:
        sink_pos = np.arange(lo)
    must = np.r_[sink_pos, np.arange(hi, ctx)]
    free = prev[(prev >= lo) & (prev < hi)]
    retain = knobs.burst_retention if rng.random() < knobs.burst_prob else knobs.retention
    n_keep = min(int(round(retain * free.size)), k - must.size)
    # Keep a random share of the previous set; with layer correlation, prefer the entries the
    # layer above selects now (adjacent layers agree without losing temporal overlap).
    score = rng.random(free.size)
    if above is not None:
        score += knobs.layer_corr * np.isin(free, above)
    kept = free[np.argpartition(-score, n_keep - 1)[:n_keep]] if 0 < n_keep < free.size else free[:n_keep]
    chosen = np.r_[must, kept]
    need = k - chosen.size
    if above is not None and knobs.layer_corr > 0:
        pool = above[(above >= lo) & (above < hi)]
        if knobs.above_fresh:  # draw among the entries not yet chosen: layer_corr of the new ones
            pool = pool[~np.isin(pool, chosen)]
        take = rng.permutation(pool)[: rng.binomial(need, knobs.layer_corr)]
        chosen = np.r_[chosen, _fill(rng, chosen, take, need)]
    if knobs.recall_prob > 0 and hist is not None and hist.t >= 2:
        need = k - chosen.size
        n_recall = rng.binomial(need, knobs.recall_prob)
        if n_recall:
            back = _recall(rng, knobs, hist, lo, hi, ctx, max(1, int(round(knobs.recall_draws * n_recall))))
            chosen = np.r_[chosen, _fill(rng, chosen, back, n_recall)]
    while chosen.size < k:
        need = k - chosen.size
        draws = pop.draw_runs(rng, lo, hi, need * 2, knobs.run_mean)
        extra = _fill(rng, chosen, draws, need)
        if extra.size == 0:  # runs keep landing on chosen entries: top up uniformly
            spare = np.setdiff1d(np.arange(lo, hi), chosen)
            extra = rng.choice(spare, size=min(need, spare.size), replace=False)
        chosen = np.r_[chosen, extra]
    return np.sort(chosen)


# Peak memory of drawing one stream, per position of its context (the popularity weights, the
# last-selection history, the draw's taken mask and their temporaries): measured with
# /usr/bin/time -f %M on `trace gen --topk 8 --steps 2 --layers 1 --requests 1`, 0.34 GB at
# --ctx0 1e7 and 1.92 GB at 1e8 (17.6 B per position above the 0.16 GB of the interpreter).
BYTES_PER_POSITION = 18
MAX_POSITION = 2**31 - 1  # positions are int32 in a trace (simulator/trace/format.py)


def check_shape(*, steps: int, layers: int, requests: int, k: int, ctx0: int, where: str = "") -> None:
    """A generated trace's shape, before any draw: each dimension positive, the last step's
    positions within int32, its context within the memory the machine has (``--ctx0 2147483647``
    grew to tens of GB and was killed by the kernel, a temp file left behind). ``where``: the
    targets file whose [shape] gave it (its keys named bare), else the options (``--ctx0``)."""
    pre, dash = (f"{where}: [shape] ", "") if where else ("", "--")
    for name, v in (("steps", steps), ("layers", layers), ("requests", requests), ("topk", k), ("ctx0", ctx0)):
        if v < 1:
            raise HisparseError(f"{pre}{dash}{name} must be >= 1, got {v}")
    last = ctx0 + steps - 1  # the last step's ctx_len: positions 0 .. last - 1
    if last - 1 > MAX_POSITION:
        raise HisparseError(f"{pre}{dash}ctx0 {ctx0} with {dash}steps {steps}: the last step's context of {last} tokens has "
                            f"positions past {MAX_POSITION} (int32, the width of a trace's positions)")
    from ..limits import available_memory

    available, need = available_memory(), BYTES_PER_POSITION * (last + 1)
    if available is not None and need > available:
        raise HisparseError(f"{pre}{dash}ctx0 {ctx0} with {dash}steps {steps}: drawing a {last}-token context needs "
                            f"about {need / 2**30:.1f} GiB; {available / 2**30:.1f} GiB are available (a smaller "
                            f"{dash}ctx0)")


def generate(knobs: GeneratorKnobs, *, steps: int, layers: int, requests: int, k: int, ctx0: int,
             seed: int, where: str = "", on_steps: Callable[[int], None] | None = None) -> Iterator[Stream]:
    """Streams request by request, layer by layer (layer l follows layer l-1); the knobs and the
    shape are checked when it is called, before the first draw (``where``: ``check_shape``'s).
    ``on_steps(n)``: called as steps are drawn (every ``STEP_REPORT`` steps, and a shared layer's all
    at once), for a progress bar that moves within one long stream."""
    knobs.check()
    check_shape(steps=steps, layers=layers, requests=requests, k=k, ctx0=ctx0, where=where)
    return _generate(knobs, steps=steps, layers=layers, requests=requests, k=k, ctx0=ctx0, seed=seed,
                     on_steps=on_steps)


STEP_REPORT = 64  # steps drawn between two on_steps calls (a step of k 2048 draws in ~0.1-1 ms)


def _generate(knobs: GeneratorKnobs, *, steps: int, layers: int, requests: int, k: int, ctx0: int,
              seed: int, on_steps: Callable[[int], None] | None = None) -> Iterator[Stream]:
    layer_knobs = [knobs.at_layer(layer, layers) for layer in range(layers)]
    from ..layer_groups import anchor_map

    anchors = anchor_map(layers, knobs.share_freq, knobs.share_offset)
    ctx_len = ctx0 + np.arange(steps, dtype=np.int64)
    for request in range(requests):
        rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(request,)))
        pops: dict[tuple, _Popularity] = {}
        above_rows: list[np.ndarray] | None = None
        anchor_indices: np.ndarray | None = None
        for layer in range(layers):
            if anchors[layer] != layer and anchor_indices is not None:  # IndexShare: the anchor's top-k
                if on_steps:
                    on_steps(steps)
                yield Stream(request, layer, ctx_len.copy(), anchor_indices.copy())
                continue
            kn = layer_knobs[layer]
            key = (kn.passage_len, kn.zipf_alpha, kn.pop_recent)
            if key not in pops:  # one popularity per request (per distinct popularity knobs)
                pops[key] = _Popularity(kn, int(ctx_len[-1]) + 1, rng)
            pop = pops[key]
            rows: list[np.ndarray] = []
            prev = np.zeros(0, dtype=np.int64)
            hist = _History(int(ctx_len[-1]) + 1, steps) if kn.recall_prob > 0 else None
            for t in range(steps):
                above = above_rows[t] if above_rows is not None else None
                if hist is not None:
                    hist.t = t
                prev = _step(rng, kn, pop, k, int(ctx_len[t]), prev, above, hist)
                if hist is not None:
                    hist.select(prev)
                rows.append(prev)
                if on_steps and (t + 1) % STEP_REPORT == 0:
                    on_steps(STEP_REPORT)
            if on_steps and steps % STEP_REPORT:
                on_steps(steps % STEP_REPORT)
            indices = np.full((steps, min(k, int(ctx_len[-1]))), -1, dtype=np.int32)
            for t, row in enumerate(rows):
                indices[t, : row.size] = row
            above_rows = rows
            anchor_indices = indices
            yield Stream(request, layer, ctx_len.copy(), indices)


_register_fitted_presets()
