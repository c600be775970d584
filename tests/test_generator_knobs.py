"""The generator's later knobs (sink_probs, recall_*): each does what it says, and
while they are off the presets draw exactly what they drew before (committed traces)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from simulator.analysis.fit import structure
from simulator.trace import open_trace
from simulator.trace.generator import (
    LATER_KNOBS,
    PRESETS,
    GeneratorKnobs,
    generate,
    knobs_dict,
    knobs_to_toml,
    load_knobs,
)
from simulator.trace.stats import first_depth, reuse_gaps, step_overlap

TRACES = Path(__file__).resolve().parents[1] / "traces"
BASE = GeneratorKnobs(sinks=2, local_window=16, retention=0.5, burst_prob=0.0, run_mean=1.2,
                      passage_len=64, zipf_alpha=1.0, layer_corr=0.0)


def _draw(knobs, *, steps=160, layers=2, requests=1, k=64, ctx0=2048, seed=5):
    return list(generate(knobs, steps=steps, layers=layers, requests=requests, k=k, ctx0=ctx0, seed=seed))


def test_committed_synthetic_trace_reproduces():
    """The first stream of a committed synthetic trace, drawn again: same positions, and the
    traces' recorded knobs are the presets' (no later knob in the metadata)."""
    for preset in ("dsa-like", "high-locality", "bursty"):  # dsa-like: the old name of high-overlap
        source = open_trace(TRACES / f"synthetic-{preset}.hst").meta.source
        assert source["knobs"] == knobs_dict(PRESETS[preset])
        assert not set(LATER_KNOBS) & set(source["knobs"])
    trace = open_trace(TRACES / "synthetic-dsa-like.hst")
    # request 0, layer 0 is drawn first: the same random numbers as the committed 2 x 4 streams
    (ours,) = generate(PRESETS["dsa-like"], steps=512, layers=1, requests=1, k=2048, ctx0=32768, seed=0)
    theirs = trace.read((0, 0))
    np.testing.assert_array_equal(ours.indices, theirs.indices)
    np.testing.assert_array_equal(ours.ctx_len, theirs.ctx_len)


def test_sink_probs_select_each_sink_that_often():
    streams = _draw(replace(BASE, sinks=3, sink_probs=(0.8, 0.0, 0.3), passage_len=16, zipf_alpha=3.0))
    freq = np.mean([np.isin([0, 1, 2], s.step(t)) for s in streams for t in range(s.steps)], axis=0)
    assert freq == pytest.approx([0.8, 0.0, 0.3], abs=0.08)  # new entries never land on sinks
    always = _draw(BASE)
    assert all(np.isin([0, 1], s.step(t)).all() for s in always for t in range(s.steps))


def test_recall_reuses_entries_at_the_gaps_asked_for():
    near = _draw(replace(BASE, recall_prob=0.95, recall_gap=3.0, recall_spread=0.3))
    far = _draw(replace(BASE, recall_prob=0.95, recall_gap=24.0, recall_spread=0.3))
    none = _draw(BASE)
    g_near, first_near = reuse_gaps(near, sink=2, local=16)
    g_far, _ = reuse_gaps(far, sink=2, local=16)
    g_none, first_none = reuse_gaps(none, sink=2, local=16)
    assert 2 <= np.median(g_near) <= 4
    assert 16 <= np.median(g_far) <= 32
    assert first_near < first_none / 3  # recalls replace first-time selections
    # reuse at short gaps: fewer LRU misses at a small buffer than far reuse or passages alone
    m = [structure(s, 64, (96,))["lru_96"] for s in (near, far, none)]
    assert m[0] < 0.7 * min(m[1], m[2])
    # overlap is retention's: recalled entries were not selected at the previous step
    ov = [np.concatenate([step_overlap(s, 64) for s in x]).mean() for x in (near, none)]
    assert ov[0] == pytest.approx(ov[1], abs=0.05)


def test_pop_recent_draws_new_entries_from_recent_text():
    knobs = replace(BASE, passage_len=128, zipf_alpha=3.0, recall_prob=0.5)
    recent = first_depth(_draw(replace(knobs, pop_recent=True)), sink=2, local=16)
    flat = first_depth(_draw(replace(knobs, pop_recent=True, zipf_alpha=0.0)), sink=2, local=16)
    assert recent < 0.3 and 0.4 < flat < 0.6  # uniform: half the context back on average
    # by rank at random: each request's popular passages lie anywhere
    shuffled = [first_depth(_draw(knobs, seed=s), sink=2, local=16) for s in range(4)]
    assert max(shuffled) - min(shuffled) > 0.05 and min(shuffled) > recent + 0.1


def test_later_knobs_deterministic_checked_and_round_trip(tmp_path):
    knobs = replace(BASE, sink_probs=(0.6, 1.0), recall_prob=0.9, recall_gap=5.5, recall_spread=1.2,
                    pop_recent=True)
    a, b = _draw(knobs, steps=40), _draw(knobs, steps=40)
    c = _draw(knobs, steps=40, seed=6)
    assert all((x.indices == y.indices).all() for x, y in zip(a, b, strict=True))
    assert any((x.indices != y.indices).any() for x, y in zip(a, c, strict=True))
    path = tmp_path / "k.toml"
    path.write_text(knobs_to_toml(knobs))
    assert load_knobs(str(path)) == knobs
    assert set(LATER_KNOBS) <= set(knobs_dict(knobs))
    assert not set(LATER_KNOBS) & set(knobs_dict(BASE))  # off: old files unchanged
    for bad in ({"sink_probs": (0.5, 1.5)}, {"sink_probs": (0.5,)}, {"recall_prob": -0.1}, {"recall_gap": 0.5},
                {"recall_spread": -1.0}):
        with pytest.raises(Exception, match="knob"):
            replace(BASE, **bad).check()
