"""IndexShare in traces: the generator copies anchors into shared layers, `trace fit` finds the rule,
replay counts misses per group. Small cases, computed by hand."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from simulator.cli import main
from simulator.layer_groups import anchor_map, detect_shared, infer_rule
from simulator.replay import ReplayConfig, replay
from simulator.trace.generator import GeneratorKnobs, generate, knobs_dict, knobs_from_dict

KN = GeneratorKnobs(local_window=8, retention=0.5)  # low retention: anchors differ from step to step


def _streams(knobs, layers=8):
    return list(generate(knobs, steps=12, layers=layers, requests=2, k=64, ctx0=600, seed=3))


def test_anchor_map_matches_the_glm52_schedule_and_the_rule_is_recovered():
    a = anchor_map(78, 4, 3)
    assert [i for i in range(78) if a[i] == i] == [0, 1, 2, *range(6, 78, 4)]
    assert infer_rule(a) == (4, 3) and infer_rule(anchor_map(10)) == (1, 0)
    assert infer_rule((0, 0, 2, 2, 2, 5)) == (3, 0)  # layer 0 has no anchor before it: its own
    assert infer_rule((0, 0, 0, 3, 4, 4, 4, 4)) is None  # gaps 3 then 1: no freq/offset pattern


def test_shared_layers_repeat_their_anchor_and_anchors_are_drawn():
    streams = _streams(replace(KN, share_freq=4, share_offset=3))
    by = {(s.request, s.layer): s.indices for s in streams}
    for r in (0, 1):
        for layer, anchor in enumerate(anchor_map(8, 4, 3)):  # anchors 0, 1, 2, 6
            assert np.array_equal(by[r, layer], by[r, anchor])
        assert not np.array_equal(by[r, 1], by[r, 0]) and not np.array_equal(by[r, 6], by[r, 2])
        assert detect_shared([s for s in streams if s.request == r]) == anchor_map(8, 4, 3)


def test_share_knobs_stay_out_of_old_knobs_files_and_round_trip():
    assert "share_freq" not in knobs_dict(KN)
    d = knobs_dict(replace(KN, share_freq=4, share_offset=3))
    assert d["share_freq"] == 4 and knobs_from_dict(d, "<t>").share_offset == 3
    # off, the draw is the old one, bit for bit
    assert all(np.array_equal(a.indices, b.indices) for a, b in zip(_streams(KN), _streams(replace(KN, share_freq=1)), strict=True))


def test_replay_counts_misses_per_group_equal_to_their_anchors():
    """Each shared layer replays its anchor's stream through its own buffer from the same start, so
    its misses are its anchor's: shared total = sum over shared layers of their anchor's misses."""
    streams = _streams(replace(KN, share_freq=4, share_offset=3))
    cfg = ReplayConfig(policy="lru", buffer=96)
    res = replay(streams, cfg, per_step=True, k=64)
    per = {(m.request, m.layer): int(m.misses.sum()) for m in res.streams}
    amap = anchor_map(8, 4, 3)
    groups = {g["group"]: g for g in res.group_records(amap)}
    anchors = [i for i in range(8) if amap[i] == i]
    assert groups["anchor"]["misses"] == sum(per[r, i] for r in (0, 1) for i in anchors)
    assert groups["shared"]["misses"] == sum(per[r, amap[i]] for r in (0, 1) for i in range(8) if amap[i] != i)
    assert groups["anchor"]["layers"] == 4 and groups["shared"]["layers"] == 4
    assert groups["anchor"]["misses"] + groups["shared"]["misses"] == res.records[0]["misses"]


def test_cli_gen_and_replay_groups(tmp_path, capsys):
    out = tmp_path / "s.hst"
    assert main(["trace", "gen", "--preset", "bursty", "--layers", "6", "--steps", "20", "--requests", "1",
                 "--topk", "128", "--ctx0", "1500", "--index-share", "4:3", "--out", str(out), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["replay", str(out), "--buffer", "192", "--json", "--quiet"]) == 0  # the trace's own rule
    rep = json.loads(capsys.readouterr().out)
    assert isinstance(rep, list) and len(rep) == 1  # a list of records, as for any trace (--help)
    g = {x["group"]: x for x in rep[0]["groups"]}
    assert g["anchor"]["misses"] + g["shared"]["misses"] == rep[0]["misses"]
    assert g["anchor"]["layers"] == 3 and g["shared"]["layers"] == 3  # anchors 0, 1, 2; shared 3, 4, 5
    # layers 3-5 copy layer 2, one of the three anchors: 3 x its misses
    assert main(["replay", str(out), "--buffer", "192", "--out", str(tmp_path / "m.csv"), "--quiet"]) == 0
    import pandas as pd

    per = pd.read_csv(tmp_path / "m.csv").groupby("layer")["misses"].sum()
    assert g["shared"]["misses"] == 3 * per[2] and g["anchor"]["misses"] == per[0] + per[1] + per[2]
    assert main(["replay", str(out), "--index-share", "x", "--quiet"]) == 2
    assert "--index-share" in capsys.readouterr().err


def test_trace_fit_finds_the_rule(tmp_path, capsys):
    from simulator.analysis.fit import fit_knobs
    from simulator.trace import open_trace

    out = tmp_path / "f.hst"
    assert main(["trace", "gen", "--preset", "bursty", "--layers", "8", "--steps", "24", "--requests", "1",
                 "--topk", "128", "--ctx0", "1500", "--index-share", "4:3", "--out", str(out), "--quiet"]) == 0
    fit = fit_knobs(open_trace(str(out)), layers=2, requests=1, rounds=1, iters=2)
    assert (fit.knobs.share_freq, fit.knobs.share_offset) == (4, 3)
    assert "IndexShare: 4 anchor and 4 shared layers of 8" in fit.comment
    assert fit.target["layer_overlap_mean"] < 0.99  # measured on anchors, not on copies


@pytest.mark.parametrize("freq, offset", [(2, 0), (3, 1), (4, 3)])
def test_detect_shared_on_generated_traces(freq, offset):
    streams = [s for s in _streams(replace(KN, share_freq=freq, share_offset=offset), layers=10) if s.request == 0]
    assert infer_rule(detect_shared(streams)) == (freq, offset) or detect_shared(streams) == anchor_map(10, freq, offset)


def test_targets_shape_carries_the_structure_into_the_fit(tmp_path):
    """A targets file measured on GLM-5.2 names its IndexShare rule in [shape]; the fit starts from
    knobs that draw shared layers as copies, and the fitted knobs file keeps them."""
    from simulator.analysis.fit_targets import start_knobs
    from simulator.analysis.targets import load_targets

    path = tmp_path / "t.toml"
    path.write_text('[shape]\nmodel = "glm-5.2"\nlayers = 8\ntopk = 64\nctx0 = 900\nsteps = 20\n'
                    'index_topk_freq = 4\nindex_skip_topk_offset = 3\n\n[fit]\nstart = "bursty"\n\n'
                    '[[target]]\nname = "o"\nstatistic = "step_overlap"\nvalue = 0.5\ntolerance = 0.1\nsource = "test"\n')
    t = load_targets(str(path))
    assert (t.shape.index_topk_freq, t.shape.index_skip_topk_offset) == (4, 3)
    kn = start_knobs(t)
    assert (kn.share_freq, kn.share_offset) == (4, 3)
    bad = tmp_path / "b.toml"
    bad.write_text(path.read_text().replace("index_topk_freq = 4", "index_topk_freq = 0"))
    with pytest.raises(Exception, match="index_topk_freq must be an integer >= 1"):
        load_targets(str(bad))


def test_serving_miss_profile_takes_each_shared_layer_from_its_anchor(tmp_path, monkeypatch):
    """A trace without IndexShare (every layer drawn) standing in for an IndexShare model: each layer's
    share is its anchor's stream's, so the profile is the group-size-weighted mean of the anchors'."""
    from simulator.serving.misses import miss_profiles

    monkeypatch.setenv("HISPARSE_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "plain.hst"
    assert main(["trace", "gen", "--preset", "bursty", "--layers", "8", "--steps", "30", "--requests", "1",
                 "--topk", "128", "--ctx0", "1500", "--out", str(out), "--quiet"]) == 0
    amap = anchor_map(8, 4, 3)
    res = replay(__import__("simulator.trace", fromlist=["open_trace"]).open_trace(str(out)),
                 ReplayConfig(policy="lru", buffer=256), per_step=True)
    per = {m.layer: m.misses / 128 for m in res.streams}
    want = np.mean([per[amap[i]] for i in range(8)], axis=0)
    got = miss_profiles(str(out), top_k=128, buffer=256, anchor_of=amap)
    assert np.allclose(got.shares[0], want) and "IndexShare: each of the 4 shared layers" in got.notes[0]
    plain = miss_profiles(str(out), top_k=128, buffer=256)
    assert np.allclose(plain.shares[0], np.mean([per[i] for i in range(8)], axis=0)) and not plain.notes
    again = miss_profiles(str(out), top_k=128, buffer=256, anchor_of=amap)  # from the cache, notes kept
    assert np.allclose(again.shares[0], want) and again.notes == got.notes
    other = miss_profiles(str(out), top_k=128, buffer=256, anchor_of=anchor_map(12, 4, 3))
    assert "not the model's 12" in other.notes[0]
